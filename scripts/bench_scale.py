"""Costs that must not grow with the dataset: orders, opening, the first batch.

    python -m scripts.bench_scale [--sizes 6,7,8,9,10] [--world 8] [--seeds 20]
                                  [--quality-records 1_000_000] [--numpy-up-to 8]
                                  [--data DIR] [--records 6,7] [--shards 100000]
                                  [--workers-memory] [--keys]

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

Datasets (built once in ``--data``, ``durable=False``, reused by later runs): 10^k
tiny records (a label and an 8-byte key, about 85 bytes a record on disk) for each
``--records`` count (a power of ten, or 3e7), in shards of 10^5 records, and one
dataset of ``--shards`` one-record shards (three files each: 10^6 shards is 3 x 10^6
files, about 12.5 GB and 20 minutes to build; 10^5 by default). Each is measured in a fresh process:
opening it and reading its last record (time, and resident memory above the
interpreter with ``reader`` imported), and a ``Loader`` of raw records (rank 0 of
``--world``, batches of 256): time to its first batch, block shuffle and (the best
of 3 fresh processes) full shuffle, and the main process's resident memory after it.

Workers' memory (``--workers-memory``, on the largest ``--records`` dataset): a
``Loader`` with 2 workers (block shuffle, rank 0 of ``--world``, batches of 256)
resumed at 10 positions spread through the epoch, 100 batches from each: the
workers' and the main process's private resident memory after each stretch.

Lookup by key (``--keys``, on each ``--records`` dataset, each way in a fresh
process and a fresh cache folder): the hash index built once per node and mapped
(``ds.key_index()``) against the in-process sort of the key column it replaced:
the first lookup (which builds it), another process's first lookup, the mean of
2,000 random lookups (each result checked), the bytes held and the peak RSS.

Shuffle quality (the full order against ``numpy.random.permutation``, N =
``--quality-records``, ``--seeds`` seeds): the correlation of neighbouring
positions and the mean number of distinct labels per batch of 256 on a 1,000-class
label column laid out sorted by class; each statistic's range over the seeds for
both, and whether ours lies within numpy's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from reader.batching.permutation import permute, round_keys
from reader.batching.sampler import Sampler, rank_positions
from reader.batching.tokens import _BlockOrder
from reader.options import SamplerOptions
from scripts import harness as h

BATCH = 256
RECORDS_PER_SHARD = 1_000


def boundaries(n: int, shards: int) -> np.ndarray:
    """Shard starts of ``n`` records in ``shards`` shards of near-equal size."""
    return (np.arange(shards + 1, dtype=np.int64) * n) // shards


def measure(sampler, epoch: int = 1, batches: int = 2_000) -> dict:
    """Epoch start (seconds), its peak allocation (bytes) and the mean cost of a batch."""
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
    print(f"\nThe epoch order: rank 0 of {world}, batches of {BATCH}, "
          f"{RECORDS_PER_SHARD:,} records a shard\n")
    table = h.Table(h.Col("records", 42), h.Col("shards", 10, ">"), h.Col("mode", 5),
                    h.Col("start", 9, ">"), h.Col("batch", 8, ">"), h.Col("peak", 9, ">"),
                    h.Col("bound", 7, ">"), h.Col("numpy start", 11, ">"),
                    h.Col("numpy peak", 10, ">"))
    print(table.head(rule=True))
    for k in sizes:
        n = 10 ** k
        shards = max(1, n // RECORDS_PER_SHARD)
        starts = boundaries(n, shards)
        for mode in ("full", "block"):
            opts = SamplerOptions(shuffle=mode, seed=0, rank=0, world_size=world)
            r = measure(Sampler(n, starts, BATCH, opts))
            old = numpy_order(n, starts, opts) if k <= numpy_up_to else None
            print(table.line(f"10^{k}", f"{shards:,}", mode, *_figures(r, shards),
                             f"{old['start']:.2f} s" if old else "-",
                             f"{old['peak'] / 1e6:.0f} MB" if old else "-"), flush=True)
    tokens, block, token_shards = 10 ** 10, 2048, 10_000
    blocks = (tokens - 1) // block
    starts = boundaries(blocks, token_shards)
    for mode in ("block", "full"):
        opts = SamplerOptions(shuffle=mode, seed=0, rank=0, world_size=world)
        r = measure(_BlockOrder(blocks, starts, 16, opts))
        print(table.line(f"TokenBlocks, 10^10 tokens: {blocks:,} blocks", f"{token_shards:,}",
                         mode, *_figures(r, token_shards), "-", "-"), flush=True)
    print("\nstart: the epoch's order and its first batch; batch: one batch's indices (of 16 "
          "blocks for TokenBlocks), mean of 2,000 at random positions; peak: Python "
          "allocations while the epoch starts; bound: 16 B x shards + 16 MB; numpy: the "
          "whole epoch drawn by numpy, as before")


def _figures(r: dict, shards: int) -> tuple[str, str, str, str]:
    return (f"{r['start'] * 1e3:.1f} ms", f"{r['batch'] * 1e6:.0f} µs",
            f"{r['peak'] / 1e6:.1f} MB", f"{(16 * shards + (16 << 20)) / 1e6:.0f} MB")


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
    print(f"\nShuffle quality: {n:,} records, {seeds} seeds, the full order against "
          "numpy.random.permutation\n")
    table = h.Table(h.Col("statistic", 36), h.Col("ours min - max", 19, ">"),
                    h.Col("numpy min - max", 19, ">"), h.Col("inside", 6, ">"),
                    h.Col("ours mean ± sd", 21, ">"), h.Col("numpy mean ± sd", 21, ">"))
    rows = []
    for j, (name, fmt) in enumerate((("neighbour correlation", "{:+.5f}"),
                                     (f"distinct labels per batch of {BATCH}", "{:.3f}"))):
        lo, hi = ref[:, j].min(), ref[:, j].max()
        inside = lo <= ours[:, j].min() and ours[:, j].max() <= hi

        def span(a, b, fmt=fmt):
            return f"{fmt.format(a)} - {fmt.format(b)}"

        rows.append((name, span(ours[:, j].min(), ours[:, j].max()), span(lo, hi),
                     "yes" if inside else "no",
                     f"{fmt.format(ours[:, j].mean())} ± {ours[:, j].std():.5f}",
                     f"{fmt.format(ref[:, j].mean())} ± {ref[:, j].std():.5f}"))
    table.print(rows, rule=True)
    # The expectation for uniform batches: classes * (1 - (1 - 1/classes)^BATCH).
    print(f"\n(a uniformly random batch holds {1000 * (1 - (1 - 1 / 1000) ** BATCH):.3f} "
          "distinct labels on average)")


def build(root, records: int, per_shard: int) -> None:
    """A dataset of ``records`` tiny records, ``per_shard`` a shard (kept if complete)."""
    from formats import DatasetWriter, Field

    if (root / "manifest.json").exists():
        return
    fields = [Field("label", "int"), Field("key", "str")]
    t0 = time.perf_counter()
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=per_shard,
                       durable=False, overwrite=True) as w:
        step = 1 << 16
        for a in range(0, records, step):
            b = min(records, a + step)
            w.write_run({"label": np.arange(a, b) % 1000,
                         "key": [f"{i:08x}" for i in range(a, b)]})
    print(f"built {root} ({records:,} records, {per_shard:,} a shard) in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)


_PROBE = r"""
import json, sys, time
def rss():
    with open("/proc/self/status") as f:
        kb = {l.split(":")[0]: int(l.split()[1]) for l in f if l.startswith("Rss")}
    return kb["RssAnon"] / 1024, kb["RssFile"] / 1024
import reader
base = rss()
def above(now):
    return [now[0] - base[0], now[1] - base[1]]
t0 = time.perf_counter()
ds = reader.open_dataset(sys.argv[1])
last = ds[len(ds) - 1]
opened = time.perf_counter() - t0
open_mb = above(rss())
t0 = time.perf_counter()
lo = reader.Loader(ds, 256, decode=False, shuffle=sys.argv[3], rank=0,
                   world_size=int(sys.argv[2]), num_workers=0)
first = next(iter(lo))
first_s = time.perf_counter() - t0
print(json.dumps({"records": len(ds), "shards": len(ds.starts) - 1, "open": opened,
                  "open_mb": open_mb, "first": first_s, "loader_mb": above(rss())}))
"""


def probe(root: Path, world: int, shuffle: str) -> dict:
    """:data:`_PROBE` over ``root`` in a fresh process: its figures."""
    out = subprocess.run([sys.executable, "-c", _PROBE, str(root), str(world), shuffle],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def record_counts(text: str) -> list[tuple[str, int]]:
    """``--records`` as (name, count): ``7`` is 10^7 records, ``3e7`` is 3 x 10^7."""
    out = []
    for word in filter(None, text.split(",")):
        if "e" in word:
            mantissa, power = word.split("e")
            out.append((word, int(mantissa) * 10 ** int(power)))
        else:
            out.append((f"1e{word}", 10 ** int(word)))
    return out


def datasets(data: Path, records: list[tuple[str, int]], shards: int, world: int) -> None:
    data.mkdir(parents=True, exist_ok=True)
    cases = [(data / f"records-{name}", n, 100_000) for name, n in records]
    if shards:
        cases.append((data / f"shards-{shards}", shards, 1))
    print(f"\nDatasets: open and read the last record; a Loader's first batch (rank 0 of "
          f"{world}, raw), block and full shuffle, each in a fresh process\n")
    rows = []
    for root, n, per in cases:
        build(root, n, per)
        r = probe(root, world, "block")  # (also warms the cache folder)
        full = min(probe(root, world, "full")["first"] for _ in range(3))
        rows.append((f"{r['records']:,}", f"{r['shards']:,}", f"{r['open']:.3f} s",
                     "{:.0f} + {:.0f} MB".format(*r["open_mb"]), f"{r['first']:.3f} s",
                     f"{full:.3f} s", "{:.0f} + {:.0f} MB".format(*r["loader_mb"])))
    h.Table(h.Col("records", align=">"), h.Col("shards", align=">"),
            h.Col("open + last record", align=">"), h.Col("its memory", align=">"),
            h.Col("first batch", align=">"), h.Col("full shuffle", align=">"),
            h.Col("memory after", align=">")).print(rows, rule=True)
    print("\nfirst batch: block shuffle; full shuffle: the best of 3 fresh processes (a batch "
          "touches up to 256 shards: each checks the index blocks it reads, not its whole "
          "index).\nmemory: private + file-backed resident (the page cache's pages of mapped "
          "shard files, shared by every process), above the interpreter with `reader` imported")


_WORKERS_PROBE = r"""
import json, sys
import reader
def anon(pid="self"):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("RssAnon:")) / 1024
lo = reader.Loader(sys.argv[1], 256, shuffle="block", rank=0, world_size=int(sys.argv[2]),
                   num_workers=2)
n = len(lo)
rows = []
for i in range(10):
    state = lo.state_dict()
    lo.load_state_dict({**state, "batch": i * n // 10})
    it = iter(lo)
    for _ in range(min(100, n - i * n // 10)):
        next(it)
    rows.append([i * n // 10, anon(), [anon(p) for p in lo.runtime.worker_pids()]])
lo.close()
print(json.dumps({"batches": n, "rows": rows}))
"""


def workers_memory(root: Path, world: int) -> None:
    out = subprocess.run([sys.executable, "-c", _WORKERS_PROBE, str(root), str(world)],
                         capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\nWorkers' memory: {root.name}, {r['batches']:,} batches for rank 0, 100 batches "
          "at each of 10 positions (private resident MB)\n")
    h.Table(h.Col("from batch", align=">"), h.Col("main", align=">"),
            h.Col("workers", align=">")).print(
        [(f"{b:,}", f"{m:.0f}", " + ".join(f"{w:.0f}" for w in ws)) for b, m, ws in r["rows"]],
        rule=True)


_KEYS_PROBE = r"""
import json, resource, sys, time
import numpy as np
import reader
ds = reader.open_dataset(sys.argv[1])
picks = np.random.default_rng(0).integers(0, len(ds), 2000)
keys = [ds.get(int(i), "key") for i in picks]
if sys.argv[2] == "ours":
    t0 = time.perf_counter()
    index = ds.key_index()
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert all(ds.index_of(k) == i for k, i in zip(keys, picks.tolist()))
    lookup = (time.perf_counter() - t0) / len(keys)
    t0 = time.perf_counter()
    again = reader.open_dataset(sys.argv[1]).index_of(keys[0])
    other = time.perf_counter() - t0
    held = index.nbytes
else:  # the previous way: every process sorts the key column (Arrow) and bisects it
    import bisect
    import pyarrow as pa
    import pyarrow.compute as pc
    t0 = time.perf_counter()
    column = ds.metadata(["key"]).column("key").combine_chunks().cast(pa.large_string())
    order = pc.sort_indices(column)
    ordered = pc.take(column, order).to_numpy(zero_copy_only=False)
    built = other = time.perf_counter() - t0
    held = column.nbytes + order.nbytes
    t0 = time.perf_counter()
    rows = order.to_numpy()
    assert all(int(rows[bisect.bisect_left(ordered, k)]) == i for k, i in zip(keys, picks.tolist()))
    lookup = (time.perf_counter() - t0) / len(keys)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"records": len(ds), "built": built, "lookup": lookup, "other": other,
                  "held": held, "peak": peak}))
"""


def key_lookups(data: Path, records: list[tuple[str, int]]) -> None:
    """The key index (built once per node, mapped) against the in-process sort it replaced."""
    print("\nLookup by key: build, then 2,000 random keys (each checked), in a fresh cache "
          "folder\n")
    rows = []
    for name, _ in records:
        root = data / f"records-{name}"
        for way in ("ours", "sort"):
            with tempfile.TemporaryDirectory() as cache:
                out = subprocess.run([sys.executable, "-c", _KEYS_PROBE, str(root), way],
                                     capture_output=True, text=True, check=True,
                                     env={**os.environ, "SHARDPACK_CACHE": cache})
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append((f"{r['records']:,}", "mapped hash index" if way == "ours"
                         else "sorted in each process (before)", f"{r['built']:.2f} s",
                         f"{r['other']:.3f} s", f"{r['lookup'] * 1e6:.0f} µs",
                         f"{r['held'] / 1e6:.0f} MB", f"{r['peak']:.0f} MB"))
    h.Table(h.Col("records", align=">"), h.Col("index"), h.Col("first lookup", align=">"),
            h.Col("next process", align=">"), h.Col("lookup", align=">"),
            h.Col("held", align=">"), h.Col("peak RSS", align=">")).print(rows, rule=True)
    print("\nfirst lookup: builds the index (ours: once per node, into the cache folder); next "
          "process: another process's first lookup; held: ours maps it (page cache, shared), "
          "the sort keeps it in each process")


def main(argv: list[str] | None = None) -> None:
    ap = h.parser(__doc__)
    ap.add_argument("--sizes", default="6,7,8,9,10",
                    help="powers of ten of the record counts of the order (default 6,7,8,9,10)")
    ap.add_argument("--world", type=int, default=8, help="ranks (rank 0 is measured)")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--quality-records", type=int, default=1_000_000)
    ap.add_argument("--numpy-up-to", type=int, default=8,
                    help="largest power of ten to draw the numpy order for (memory!)")
    h.add_data(ap, h.DATA / "scale", help="where datasets are built (kept)")
    ap.add_argument("--records", default="6,7",
                    help="record counts of the tiny-record datasets: powers of ten, or like 3e7 "
                         "('' for none; 8 needs 8.5 GB)")
    ap.add_argument("--workers-memory", action="store_true",
                    help="measure a Loader's workers over the largest --records dataset")
    ap.add_argument("--keys", action="store_true",
                    help="lookup by key over the --records datasets, against the in-process sort")
    ap.add_argument("--shards", type=int, default=100_000,
                    help="one-record shards of the many-shard dataset (0 for none)")
    args = ap.parse_args(argv)
    load = h.Load()
    orders([int(s) for s in args.sizes.split(",") if s], args.world, args.numpy_up_to)
    records = record_counts(args.records)
    datasets(args.data, records, args.shards, args.world)
    if args.workers_memory and records:
        workers_memory(args.data / f"records-{max(records, key=lambda r: r[1])[0]}", args.world)
    if args.keys and records:
        key_lookups(args.data, records)
    quality(args.quality_records, args.seeds)
    print(f"\n{load.line()}")


if __name__ == "__main__":
    main()
