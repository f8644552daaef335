"""Costs that must not grow with the dataset: the epoch order from 10^6 to 10^10 records.

    python -m scripts.bench_scale [--sizes 6,7,8,9,10] [--world 8] [--seeds 20]
                                  [--quality-records 1_000_000] [--numpy-up-to 8]

For each size N (10^k records in N / 1,000 shards: 10^9 in 10^6 shards, 10^10 in
10^7, from synthetic shard boundaries: no data is read), rank 0 of ``--world``,
each order mode:

* epoch start: building the epoch's order (``Sampler.order``) and the first batch;
* per batch: the indices of one batch of 256, the mean over 2,000 batches at
  random positions of the epoch (a resumed loader pays the same);
* memory: the peak of Python allocations while the epoch starts (tracemalloc:
  numpy's buffers included), against the bound ``16 bytes x shards + 16 MB``;
* the same for the order as numpy drew it before (``rng.permutation`` of the
  whole epoch, then this rank's positions), up to ``--numpy-up-to`` (10^8 takes
  about 6 s and 1 GB; 10^9 would take a minute and 10-24 GB).

Token blocks: ``TokenBlocks``' block order over 10^10 tokens in blocks of 2,048
(4.9 x 10^6 blocks in 10^4 shards), the same figures.

Shuffle quality (the full order against ``numpy.random.permutation``, N =
``--quality-records``, ``--seeds`` seeds): the correlation of neighbouring
positions and the mean number of distinct labels per batch of 256 on a 1,000-class
label column laid out sorted by class; each statistic's range over the seeds for
both, and whether ours lies within numpy's.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from reader.options import SamplerOptions
from reader.order.permutation import permute, round_keys
from reader.order.sampler import Sampler, rank_positions
from reader.order.tokens import _BlockOrder

BATCH = 256
RECORDS_PER_SHARD = 1_000


def boundaries(n: int, shards: int) -> np.ndarray:
    """Shard starts of ``n`` records in ``shards`` shards of near-equal size."""
    return (np.arange(shards + 1, dtype=np.int64) * n) // shards


def measure(make, epoch: int = 1, batches: int = 2_000) -> dict:
    """Epoch start (seconds), its peak allocation (bytes) and the mean cost of a batch."""
    sampler = make()
    tracemalloc.start()
    t0 = time.perf_counter()
    sampler.order(epoch)
    sampler.batch(epoch, 0)
    start = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    ks = np.random.default_rng(0).integers(0, len(sampler), batches).tolist()
    t0 = time.perf_counter()
    for k in ks:
        sampler.batch(epoch, k)
    return {"start": start, "peak": peak, "batch": (time.perf_counter() - t0) / batches}


def numpy_order(n: int, starts: np.ndarray, opts: SamplerOptions, epoch: int = 1) -> dict:
    """The order as numpy drew it before: the whole epoch, then this rank's positions."""
    tracemalloc.start()
    t0 = time.perf_counter()
    rng = np.random.default_rng([opts.seed, epoch])
    if opts.shuffle == "full":
        order = rng.permutation(n)
    else:
        shards = rng.permutation(len(starts) - 1)
        order = np.concatenate([np.arange(starts[s], starts[s + 1]) for s in shards])
        w = opts.shuffle_window
        full = n // w * w
        order[:full] = rng.permuted(order[:full].reshape(-1, w), axis=1).reshape(-1)
    mine = np.ascontiguousarray(order[rank_positions(n, opts)])
    start = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del order, mine
    return {"start": start, "peak": peak}


def orders(sizes: list[int], world: int, numpy_up_to: int) -> None:
    print(f"\n## The epoch order (rank 0 of {world}, batches of {BATCH}, "
          f"{RECORDS_PER_SHARD:,} records a shard)\n")
    print("| records | shards | mode | epoch start | per batch | peak memory | bound "
          "(16 B x shards + 16 MB) | numpy-drawn start | numpy-drawn memory |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k in sizes:
        n = 10 ** k
        shards = max(1, n // RECORDS_PER_SHARD)
        starts = boundaries(n, shards)
        bound = 16 * shards + (16 << 20)
        for mode in ("full", "block"):
            opts = SamplerOptions(shuffle=mode, seed=0, rank=0, world_size=world)
            r = measure(lambda: Sampler(n, starts, BATCH, opts))
            old = numpy_order(n, starts, opts) if k <= numpy_up_to else None
            print(f"| 10^{k} | {shards:,} | {mode} | {r['start'] * 1e3:.1f} ms | "
                  f"{r['batch'] * 1e6:.0f} µs | {r['peak'] / 1e6:.1f} MB | {bound / 1e6:.0f} MB | "
                  + (f"{old['start']:.2f} s | {old['peak'] / 1e6:.0f} MB |" if old else "- | - |"),
                  flush=True)
    tokens, block, token_shards = 10 ** 10, 2048, 10_000
    blocks = (tokens - 1) // block
    starts = boundaries(blocks, token_shards)
    for mode in ("block", "full"):
        opts = SamplerOptions(shuffle=mode, seed=0, rank=0, world_size=world)
        r = measure(lambda: _BlockOrder(blocks, starts, 16, opts))
        print(f"| TokenBlocks: 10^10 tokens, {blocks:,} blocks | {token_shards:,} | {mode} | "
              f"{r['start'] * 1e3:.1f} ms | {r['batch'] * 1e6:.0f} µs (16 blocks) | "
              f"{r['peak'] / 1e6:.1f} MB | {(16 * token_shards + (16 << 20)) / 1e6:.0f} MB | - | - |",
              flush=True)


def label_stats(order: np.ndarray, classes: int = 1_000) -> tuple[float, float]:
    """(neighbour correlation, mean distinct labels per batch) with sorted labels."""
    n = len(order)
    corr = float(np.corrcoef(order[:-1], order[1:])[0, 1])
    labels = np.sort((order * classes // n)[: n - n % BATCH].reshape(-1, BATCH), axis=1)
    return corr, float(((labels[:, 1:] != labels[:, :-1]).sum(axis=1) + 1).mean())


def quality(n: int, seeds: int) -> None:
    ours = np.array([label_stats(permute(np.arange(n), n, round_keys(s, 0)))
                     for s in range(seeds)])
    ref = np.array([label_stats(np.random.default_rng(s).permutation(n)) for s in range(seeds)])
    print(f"\n## Shuffle quality: {n:,} records, {seeds} seeds, the full order against "
          "numpy.random.permutation\n")
    print("| statistic | ours (min - max) | numpy (min - max) | within numpy's range "
          "| ours mean ± sd | numpy mean ± sd |")
    print("|---|---|---|---|---|---|")
    for j, (name, fmt) in enumerate((("neighbour correlation", "{:+.5f}"),
                                     (f"distinct labels per batch of {BATCH}", "{:.3f}"))):
        lo, hi = ref[:, j].min(), ref[:, j].max()
        inside = lo <= ours[:, j].min() and ours[:, j].max() <= hi
        print(f"| {name} | {fmt.format(ours[:, j].min())} - {fmt.format(ours[:, j].max())} | "
              f"{fmt.format(lo)} - {fmt.format(hi)} | {'yes' if inside else 'no'} | "
              f"{fmt.format(ours[:, j].mean())} ± {ours[:, j].std():.5f} | "
              f"{fmt.format(ref[:, j].mean())} ± {ref[:, j].std():.5f} |")
    # The expectation for uniform batches: classes * (1 - (1 - 1/classes)^BATCH).
    print(f"\n(a uniformly random batch holds {1000 * (1 - (1 - 1 / 1000) ** BATCH):.3f} "
          "distinct labels on average)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="6,7,8,9,10",
                    help="powers of ten of the record counts (default 6,7,8,9,10)")
    ap.add_argument("--world", type=int, default=8, help="ranks (rank 0 is measured)")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--quality-records", type=int, default=1_000_000)
    ap.add_argument("--numpy-up-to", type=int, default=8,
                    help="largest power of ten to draw the numpy order for (memory!)")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    orders(sizes, args.world, args.numpy_up_to)
    quality(args.quality_records, args.seeds)


if __name__ == "__main__":
    main()
