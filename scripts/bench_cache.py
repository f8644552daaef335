"""The decoded-sample cache: epoch 2 ÷ epoch 1, and the memory it takes (issue 15).

In one run, page cache warm: 4,000 packed JPEGs (200-400 px, the other benchmarks'
generator), ``Loader(batch 64, workers = cores, shuffle, persistent workers,
decode + RandomResizedCrop(224) + flip)`` for three epochs, without a cache and
with ``DecodedCacheOptions(max_bytes=--cache-gb)`` large enough to hold the set.
Printed per epoch: images/s; then epoch 2 ÷ epoch 1 with the cache (target >= 3x)
and cached epoch 2 ÷ uncached epoch 2.

Memory, sampled every 200 ms: the peak private memory (RssAnon) of the loader's
process tree, and the growth of the machine's shared memory (``Shmem`` of
``/proc/meminfo``: the slot ring and the cache live there). Target: with the
cache, private memory stays what it is without, and the shared growth stays within
the cache bound plus the ring.

Usage: ``python -m scripts.bench_cache [--count 4000] [--cache-gb 3]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["main"]


def shmem_kb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    """Peak RssAnon of this process tree and peak Shmem growth, every 200 ms (KiB)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.base = shmem_kb()
        self.anon = self.shmem = 0
        self.done = threading.Event()

    def run(self) -> None:
        from scripts.bench import tree_rss_anon_kb

        while not self.done.wait(0.2):
            self.anon = max(self.anon, tree_rss_anon_kb(os.getpid()))
            self.shmem = max(self.shmem, shmem_kb() - self.base)


def run(path: Path, cache_bytes: int | None, epochs: int) -> tuple[list[float], dict, Sampler]:
    import reader
    from reader.transforms import RandomHorizontalFlip, RandomResizedCrop

    opts = reader.DecodedCacheOptions(max_bytes=cache_bytes) if cache_bytes else None
    mem = Sampler()
    mem.start()
    rates = []
    with reader.Loader(path, 64, num_workers=os.cpu_count() or 1, shuffle=True, seed=0,
                       transform=[RandomResizedCrop(224), RandomHorizontalFlip()],
                       persistent_workers=True, decoded_cache=opts) as lo:
        for _ in range(epochs):
            t = time.perf_counter()
            n = 0
            for b in lo:
                n += len(b["label"])
            rates.append(n / (time.perf_counter() - t))
        stats = lo.decoded_cache.stats() if lo.decoded_cache is not None else {}
        ring = lo.ring.nbytes if lo.ring is not None else 0
    mem.done.set()
    mem.join()
    stats["ring_bytes"] = ring
    return rates, stats, mem


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "shardpack-bench")
    p.add_argument("--count", type=int, default=4000)
    p.add_argument("--cache-gb", type=float, default=3.0)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args(argv)
    from scripts.bench_pack import packed_dataset

    path = packed_dataset(args.data, args.count)
    bound = int(args.cache_gb * (1 << 30))
    print(f"{args.count} JPEGs, batch 64, {os.cpu_count()} workers, decode + RRC 224 + flip, "
          f"page cache warm; cache bound {bound / 2**30:.1f} GiB")
    plain, _, mem0 = run(path, None, args.epochs)
    cached, stats, mem1 = run(path, bound, args.epochs)
    print(f"{'':22}" + "".join(f"{'epoch ' + str(e + 1):>12}" for e in range(args.epochs)))
    print(f"{'no cache, img/s':22}" + "".join(f"{r:12,.0f}" for r in plain))
    print(f"{'decoded cache, img/s':22}" + "".join(f"{r:12,.0f}" for r in cached))
    print(f"cached: epoch 2 ÷ epoch 1 = {cached[1] / cached[0]:.2f}x (target >= 3x); "
          f"cached epoch 2 ÷ uncached epoch 2 = {cached[1] / plain[1]:.2f}x; cached epoch 1 ÷ "
          f"uncached epoch 1 = {cached[0] / plain[0]:.2f} (whole decodes + copies into the cache)")
    print(f"cache: {stats['records']:,} records, {stats['bytes'] / 2**20:,.0f} MiB of "
          f"{stats['max_bytes'] / 2**20:,.0f} MiB; ring {stats['ring_bytes'] / 2**20:,.0f} MiB")
    print(f"private memory (RssAnon, loader tree, peak): {mem0.anon / 1024:,.0f} MiB without, "
          f"{mem1.anon / 1024:,.0f} MiB with the cache")
    print(f"shared memory growth (Shmem, peak): {mem0.shmem / 1024:,.0f} MiB without, "
          f"{mem1.shmem / 1024:,.0f} MiB with; bound + ring = "
          f"{(stats['max_bytes'] + stats['ring_bytes']) / 2**20:,.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
