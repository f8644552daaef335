"""Benchmark of the shard format's read path against memcpy (issue: foundation).

Measures, in one run, with the dataset in the page cache:
  * sequential read of every record's raw field bytes through the reader,
    touching every byte (copied into a reused buffer), vs numpy memcpy of the
    same number of bytes and vs plain ``readinto`` of the data files;
  * random-access lookups per second, single (``ds.payload``) and vectorized
    (``ds.spans`` for 1M indices);
  * the time to open a 1,000,000-record dataset.

Run: ``python -m scripts.bench_format [--records 3000] [--size 100000] [--data DIR]``
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from formats import DatasetWriter, Field, open_shards
from scripts import harness as h

REPEATS = 5


def best_of(fn, repeats=REPEATS):
    """Median and spread of ``repeats`` timings of ``fn()`` (seconds)."""
    times = [h.timed(fn) for _ in range(repeats)]
    return h.median(times), h.spread(times)


def build(root: Path, records: int, size: int) -> None:
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, size * 2, np.uint8).tobytes()
    with DatasetWriter(root, [Field("image", "jpeg"), Field("label", "int")],
                       shard_size=64 << 20, durable=False) as w:
        for i in range(records):
            n = int(size * (0.5 + rng.random()))
            start = int(rng.integers(0, len(pool) - n))
            w.write({"image": pool[start : start + n], "label": i % 1000})


def build_tiny(root: Path, records: int) -> None:
    with DatasetWriter(root, [Field("label", "int")], records_per_shard=250_000, alignment=8,
                       durable=False) as w:
        for i in range(records):
            w.write({"label": i})


def main(argv=None) -> None:
    ap = h.parser(__doc__, full=True)
    ap.add_argument("--records", type=int, default=3000)
    ap.add_argument("--size", type=int, default=100_000, help="mean record size in bytes")
    h.add_data(ap, None, help="where to build datasets (default: a temp dir)")
    args = ap.parse_args(argv)

    tmp = tempfile.TemporaryDirectory() if args.data is None else None
    base = Path(tmp.name) if tmp else args.data
    ds_path, tiny_path = base / "records", base / "tiny"
    if not (ds_path / "manifest.json").exists():
        build(ds_path, args.records, args.size)
    if not (tiny_path / "manifest.json").exists():
        build_tiny(tiny_path, 1_000_000)

    ds = open_shards(ds_path)
    n = len(ds)
    _, _, lengths = ds.spans(np.arange(n), "image")
    total = int(lengths.sum())
    biggest = int(lengths.max())
    dst = np.empty(biggest, np.uint8)

    # Warm the page cache and the index validation.
    for s in ds.shards:
        s.data.sum(dtype=np.uint64)

    views = [s.view for s in ds.shards]
    dst_view = memoryview(dst)

    def reader_seq():
        # The loader's raw path: one vectorized index lookup per batch, then a slice per record.
        for start in range(0, n, 256):
            shard, offsets, lengths = ds.spans(np.arange(start, min(start + 256, n)), "image")
            for s, o, e in zip(shard.tolist(), offsets.tolist(), (offsets + lengths).tolist(),
                               strict=True):
                dst_view[: e - o] = views[s][o:e]

    def reader_single():
        for i in range(n):
            v = ds.payload(i, "image")
            dst_view[: len(v)] = v

    src = np.concatenate([np.frombuffer(v, np.uint8) for v in ds.payloads(np.arange(n), "image")])
    big_dst = np.ones_like(src)  # touched: page faults are not part of memcpy's figure

    def memcpy():
        np.copyto(big_dst, src)

    files = [s.data_path for s in ds.shards]
    buf = bytearray(8 << 20)

    def file_read():
        for p in files:
            with open(p, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass

    file_bytes = sum(p.stat().st_size for p in files)
    for warm in (reader_seq, memcpy, file_read):
        warm()
    t_seq, n_seq = best_of(reader_seq)
    t_single, n_single = best_of(reader_single)
    t_mem, n_mem = best_of(memcpy)
    t_file, n_file = best_of(file_read)

    rng = np.random.default_rng(1)
    idx_single = rng.integers(0, n, 100_000).tolist()

    def lookups_single():
        for i in idx_single:
            ds.payload(i, "image")

    idx_vec = rng.integers(0, n, 1_000_000)

    def lookups_vec():
        ds.spans(idx_vec, "image")

    t_ls, n_ls = best_of(lookups_single)
    t_lv, n_lv = best_of(lookups_vec)

    tiny = open_shards(tiny_path)
    tiny_idx = rng.integers(0, len(tiny), 1_000_000)
    t_tiny_vec, n_tiny = best_of(lambda: tiny.scalars(tiny_idx, "label"))
    tiny.close()
    t_open, n_open = best_of(lambda: open_shards(tiny_path).close())

    gb = 1e9
    rows = [
        ("memcpy (numpy, one buffer)", total / t_mem / gb, "GB/s", 1.0, n_mem),
        ("plain readinto of data files", file_bytes / t_file / gb, "GB/s", (file_bytes / t_file) / (total / t_mem), n_file),
        ("reader sequential, batched spans + views", total / t_seq / gb, "GB/s", t_mem / t_seq, n_seq),
        ("reader sequential, one record at a time", total / t_single / gb, "GB/s", t_mem / t_single, n_single),
    ]
    print(f"dataset: {n} records, {total / 1e6:.0f} MB of field bytes, {len(ds.shards)} shards")
    h.Table(h.Col("read path", 42), h.Col("rate", 10, ">"), h.Col("", 4),
            h.Col("÷ memcpy", 9, ">"), h.Col("spread", 6, ">", gap="  "), sep=" ").print(
        [(name, f"{rate:.2f}", unit, f"{ratio:.2f}", f"{noise:.0%}")
         for name, rate, unit, ratio, noise in rows])
    print()
    h.Table(h.Col("lookups", 42), h.Col("per second", 14, ">"),
            h.Col("spread", 6, ">", gap="  "), sep=" ").print([
        ("single (ds.payload)", f"{len(idx_single) / t_ls:,.0f}", f"{n_ls:.0%}"),
        ("vectorized (ds.spans, 1M indices)", f"{len(idx_vec) / t_lv:,.0f}", f"{n_lv:.0%}"),
        ("vectorized scalars, 1M-record dataset", f"{len(tiny_idx) / t_tiny_vec:,.0f}",
         f"{n_tiny:.0%}")])
    print()
    print(f"open a 1,000,000-record dataset: {t_open * 1e3:.1f} ms (spread {n_open:.0%}; target < 100 ms)")
    print(f"targets: sequential ≥ 0.8 of memcpy: {'met' if t_mem / t_seq >= 0.8 else 'MISSED'}; "
          f"≥ 1,000,000 vectorized lookups/s: {'met' if len(idx_vec) / t_lv >= 1e6 else 'MISSED'}")
    ds.close()
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
