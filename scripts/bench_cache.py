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

The bound of the first epoch: a cached first epoch decodes every image whole and
writes its pixels into memory no process has touched yet, so beyond the uncached
path's work it pays the kernel for every new page. The script measures, on one core,
the uncached path's CPU per image, the miss path's CPU per image into memory already
populated, and the kernel's cost of populating a page of a fresh shared mapping (a
page fault and the page zeroed: 0.3-1 µs on bare metal, several on some virtual
machines), and prints the first epoch's bound: uncached ÷ (miss path + pages per
image x the page cost). Then it checks that the cache does not change pixels: the
first ``--compare`` batches of a cached and an uncached loader side by side.

Usage: ``python -m scripts.bench_cache [--count 4000] [--cache-gb 3]``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from scripts import harness as h

__all__ = ["main"]


def run(path: Path, cache_bytes: int | None, epochs: int) -> tuple[list[float], dict, dict]:
    """Images/s per epoch, the cache's stats, and the peaks (KiB) of this process tree's
    RssAnon (``anon``) and of the machine's Shmem growth (``shmem``)."""
    import reader

    opts = reader.DecodedCacheOptions(max_bytes=cache_bytes) if cache_bytes else None
    base = h.shmem_kb()
    mem = h.Peak(anon=lambda: h.tree_rss_anon_kb(os.getpid()), shmem=lambda: h.shmem_kb() - base)
    mem.start()
    rates = []
    with reader.Loader(path, 64, num_workers=h.CORES, shuffle=True, seed=0,
                       transform=h.rrc_flip(), persistent_workers=True,
                       decoded_cache=opts) as lo:
        for _ in range(epochs):
            rates.append(h.per_second(lambda: sum(len(b["label"]) for b in lo)))
        stats = lo.decoded_cache.stats() if lo.decoded_cache is not None else {}
        ring = lo.ring.nbytes if lo.ring is not None else 0
    peak = mem.stop()
    stats["ring_bytes"] = ring
    return rates, stats, peak


def page_cost_us(mib: int = 256) -> float:
    """CPU µs to populate one page of a fresh shared anonymous mapping (the cache's kind)."""
    import mmap

    import numpy as np

    m = mmap.mmap(-1, mib << 20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    a = np.frombuffer(m, np.uint8)
    t = time.process_time()
    a[:: mmap.PAGESIZE] = 1
    cost = (time.process_time() - t) / ((mib << 20) // mmap.PAGESIZE) * 1e6
    del a
    m.close()
    return cost


def first_epoch_bound(path: Path, count: int = 600) -> dict:
    """One core's CPU per image: the uncached path, the miss path into populated memory,
    and the page population the miss path adds (see the module docstring)."""
    import mmap

    import numpy as np

    import reader
    from reader.transforms.imaging import make_pipeline

    ds = reader.open_dataset(path)
    blobs = [bytes(ds[i]["image"]) for i in range(min(count, len(ds)))]
    dec = make_pipeline(h.rrc_flip()).decoder()
    out = np.empty((224, 224, 3), np.uint8)
    rng = np.random.default_rng(0)

    def per_image(fn) -> float:
        t = time.process_time()
        for b in blobs:
            fn(b)
        return (time.process_time() - t) / len(blobs) * 1e6

    per_image(lambda b: dec.decode_timed(b, out, rng))  # warm
    fused = per_image(lambda b: dec.decode_timed(b, out, rng))
    sizes = []

    def miss(b):
        image, h, w, scale = dec.decode_for_cache(b, None)
        sizes.append(image.nbytes)
        dec.from_cache(b, image, h, w, scale, out, rng)

    miss_us = per_image(miss)
    pages = float(np.mean([-(-n // mmap.PAGESIZE) for n in sizes]))
    page = page_cost_us()
    return {"fused_us": fused, "miss_us": miss_us, "pages": pages, "page_us": page,
            "bound": fused / (miss_us + pages * page)}


def compare(path: Path, bound: int, batches: int) -> tuple[int, int, float]:
    """Images equal between a cached and an uncached loader's first ``batches`` batches
    of epochs 1 and 2 (the same seed), of all compared, and the largest mean |diff|."""
    import numpy as np

    import reader

    def loader(cache):
        return reader.Loader(path, 64, num_workers=1, shuffle=True, seed=0,
                             transform=h.rrc_flip(), persistent_workers=True,
                             decoded_cache=cache)

    equal = total = 0
    worst = 0.0
    with loader(None) as a, loader(reader.DecodedCacheOptions(max_bytes=bound)) as b:
        for _ in range(2):
            for _, x, y in zip(range(batches), a, b, strict=False):
                d = np.abs(x["image"].astype(np.int16) - y["image"].astype(np.int16))
                per = d.reshape(len(d), -1).mean(axis=1)
                equal += int((per == 0).sum())
                total += len(per)
                worst = max(worst, float(per.max()))
    return equal, total, worst


def main(argv=None) -> int:
    p = h.parser(__doc__)
    h.add_data(p)
    p.add_argument("--count", type=int, default=4000)
    p.add_argument("--cache-gb", type=float, default=3.0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--compare", type=int, default=8, help="batches compared (0: none)")
    args = p.parse_args(argv)
    path = h.packed_dataset(args.data, args.count)
    bound = int(args.cache_gb * (1 << 30))
    print(f"{args.count} JPEGs, batch 64, {h.CORES} workers, decode + RRC 224 + flip, "
          f"page cache warm; cache bound {bound / 2**30:.1f} GiB")
    b = first_epoch_bound(path)
    print(f"one core, per image: uncached {b['fused_us']:,.0f} µs; miss path into populated "
          f"memory {b['miss_us']:,.0f} µs; {b['pages']:.0f} new pages x {b['page_us']:.2f} µs "
          f"= {b['pages'] * b['page_us']:,.0f} µs; first-epoch bound "
          f"{b['fused_us']:,.0f} ÷ {b['miss_us'] + b['pages'] * b['page_us']:,.0f} = "
          f"{b['bound']:.2f}")
    plain, _, mem0 = run(path, None, args.epochs)
    cached, stats, mem1 = run(path, bound, args.epochs)
    h.Table(h.Col("", 22), *(h.Col(f"epoch {e + 1}", 12, ">") for e in range(args.epochs)),
            sep="").print([("no cache, img/s", *(f"{r:,.0f}" for r in plain)),
                           ("decoded cache, img/s", *(f"{r:,.0f}" for r in cached))])
    print(f"cached: epoch 2 ÷ epoch 1 = {cached[1] / cached[0]:.2f}x (target >= 3x); "
          f"cached epoch 2 ÷ uncached epoch 2 = {cached[1] / plain[1]:.2f}x; cached epoch 1 ÷ "
          f"uncached epoch 1 = {cached[0] / plain[0]:.2f} (bound {b['bound']:.2f}: "
          f"{cached[0] / plain[0] / b['bound']:.2f} of it)")
    print(f"cache: {stats['records']:,} records, {stats['bytes'] / 2**20:,.0f} MiB of "
          f"{stats['max_bytes'] / 2**20:,.0f} MiB; ring {stats['ring_bytes'] / 2**20:,.0f} MiB")
    print(f"private memory (RssAnon, loader tree, peak): {mem0['anon'] / 1024:,.0f} MiB without, "
          f"{mem1['anon'] / 1024:,.0f} MiB with the cache")
    print(f"shared memory growth (Shmem, peak): {mem0['shmem'] / 1024:,.0f} MiB without, "
          f"{mem1['shmem'] / 1024:,.0f} MiB with; bound + ring = "
          f"{(stats['max_bytes'] + stats['ring_bytes']) / 2**20:,.0f} MiB")
    if args.compare:
        equal, total, worst = compare(path, bound, args.compare)
        print(f"pixels, cached vs uncached (epochs 1 and 2, {args.compare} batches each): "
              f"{equal} of {total} images identical; largest mean |difference| {worst:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
