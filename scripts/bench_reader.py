"""Reader benchmark: ratios against the hardware limit and against peers, in one run.

    python -m scripts.bench_reader --data /tmp/bench-reader [--quick] [--workers N]

Warm page cache throughout (every input is read once before it is timed).
(a) raw loader read (no decode) bytes/s vs a numpy memcpy of the same bytes;
(b) full pipeline (decode + RandomResizedCrop 224 + flip, batch 256, workers =
cores) images/s vs cores x the single-core decode+crop rate measured in-process;
(c) ImageFolder + PIL + torch DataLoader, same work; (d) webdataset tars with our
decoder; (e) single-core decode+crop+flip, ours vs naive PIL; and the loader's
resident anonymous memory (main + workers) for a small and a 10x larger dataset.
``--map-style`` measures only (f): ``ds[i]`` with CRC32C checks on (the default) and
off, read again and read for the first time from a new mapping, as handed out
(zero-copy) and with the image copied out, in alternated rounds (``--repeat``, median).
Needs the ``bench`` extra (torch, webdataset); peers that are missing are skipped.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from formats import DatasetWriter, Field, open_shards
from scripts import harness as h

BATCH = 256
SIZE = 224


# -- data ------------------------------------------------------------------------------

def build_inputs(root: Path, n: int, classes: int = 10, seed: int = 0) -> dict[str, Path]:
    """Generate ``n`` JPEGs once; pack them as shards, an image folder and webdataset tars."""
    from scripts.synth import make_jpeg

    root.mkdir(parents=True, exist_ok=True)
    shards, folder, tars = root / f"shards-{n}", root / f"folder-{n}", root / f"wds-{n}"
    done = root / f".done-{n}"
    if done.exists():
        return {"shards": shards, "folder": folder, "wds": tars}
    rng = np.random.default_rng(seed)
    tars.mkdir(exist_ok=True)
    ntar = 8
    with contextlib.ExitStack() as stack, DatasetWriter(
            shards, [Field("image", "jpeg"), Field("label", "int")], overwrite=True,
            shard_size=64 << 20, durable=False) as w:
        tfs = [stack.enter_context(tarfile.open(tars / f"part-{i:03d}.tar", "w"))
               for i in range(ntar)]
        for i in range(n):
            data = make_jpeg(rng, int(rng.integers(300, 500)), int(rng.integers(300, 500)))
            label = i % classes
            w.write({"image": data, "label": label})
            d = folder / f"c{label:02d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{i:06d}.jpg").write_bytes(data)
            tf = tfs[i % ntar]
            for name, payload in ((f"{i:06d}.jpg", data), (f"{i:06d}.cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                info.mtime = 0
                tf.addfile(info, io.BytesIO(payload))
    done.touch()
    return {"shards": shards, "folder": folder, "wds": tars}


def build_tiny(root: Path, n: int) -> Path:
    """``n`` tiny records (for the memory-vs-dataset-size check)."""
    import simplejpeg

    path = root / f"tiny-{n}"
    if (path / "manifest.json").exists():
        return path
    rng = np.random.default_rng(1)
    jpegs = [simplejpeg.encode_jpeg(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8))
             for _ in range(64)]
    with DatasetWriter(path, [Field("image", "jpeg"), Field("label", "int")], overwrite=True,
                       durable=False) as w:
        for i in range(n):
            w.write({"image": jpegs[i % 64], "label": i})
    return path


# -- measurements ------------------------------------------------------------------------

def raw_read(shards: Path) -> tuple[float, float]:
    """(loader bytes/s with owned copies, memcpy bytes/s of the same payload bytes)."""
    from reader import Loader

    ds = open_shards(shards)
    payload = sum(int(s.lengths[:, 0].sum()) for s in ds.shards)

    def loader_pass() -> int:
        with Loader(ds, BATCH, decode=False, copy=True) as lo:
            nbytes = sum(len(x) for b in lo for x in b["image"])
        assert nbytes == payload
        return nbytes

    src = [s.data for s in ds.shards]
    dst = np.empty(max(a.size for a in src), np.uint8)

    def copy_pass() -> int:
        for a in src:
            np.copyto(dst[: a.size], a)
        return sum(a.size for a in src)

    return (max(h.per_second(loader_pass) for _ in range(3)),
            max(h.per_second(copy_pass) for _ in range(3)))


def map_style(shards: Path, repeat: int, label: str) -> list[tuple]:
    """(f) rows: ``ds[i]`` records/s at random indices, checks on ÷ off, medians of
    ``repeat`` alternated rounds (the case first in a round rotates).

    ``ds[i]`` checks a record the first time it is read from its shard's mapping, so
    two regimes: *again* (random indices, 20,000 reads over the records of mappings
    that have read them before: what every epoch after a worker's first sees) and
    *first* (every record once, in a random order, from a dataset opened just before
    the timed pass: each read pays its CRC32C). The first read's bound is reading the
    payload's bytes once, so its row also compares it with an unchecked read that
    copies the payload out (one memcpy of the same bytes)."""
    datasets = {check: open_shards(shards, check_crc=check) for check in (True, False)}
    n = len(datasets[True])
    again = np.random.default_rng(0).integers(0, n, 20_000).tolist()
    first = np.random.default_rng(1).permutation(n).tolist()
    dst = memoryview(bytearray(8 << 20))

    def served(check: bool, copy: bool, fresh: bool) -> Callable[[], int]:
        ds = open_shards(shards, check_crc=check) if fresh else datasets[check]
        order = first if fresh else again

        def run() -> int:
            for i in order:
                image = ds[i]["image"]
                if copy:
                    dst[: len(image)] = image
            if fresh:
                ds.close()
            return len(order)
        return run

    cases = [(check, copy, fresh) for fresh in (False, True) for copy in (False, True)
             for check in (True, False)]
    rates: dict[tuple, list[float]] = {c: [] for c in cases}
    for c in cases:
        served(*c)()  # warm: the page cache, and the long-lived datasets' mappings
    h.rounds(cases, repeat, lambda c, _r: rates[c].append(h.per_second(served(*c))))
    rows = []
    for fresh in (False, True):
        regime = "first read" if fresh else "read again"
        for copy in (False, True):
            on, off = h.median(rates[True, copy, fresh]), h.median(rates[False, copy, fresh])
            what = "+ image copied out" if copy else "zero-copy"
            rows.append((f"(f) ds[i] {regime}, {label}, {what}: crc on / off",
                         f"{on:.0f} rec/s", f"{off:.0f} rec/s", on / off,
                         ">= 0.9" if not fresh else "(no target: see the next row)"))
        on, bound = h.median(rates[True, False, True]), h.median(rates[False, True, True])
        if fresh:
            rows.append((f"(f) ds[i] first read, {label}: crc on / unchecked + one copy out",
                         f"{on:.0f} rec/s", f"{bound:.0f} rec/s", on / bound,
                         ">= 0.9 (the bound: the bytes read once)"))
    return rows


def single_core_ours(shards: Path, n: int) -> float:
    ds = open_shards(shards)
    dec = h.rrc_flip_decoder(SIZE)
    rng = np.random.default_rng(0)
    views = ds.payloads(np.arange(min(n, len(ds))), "image")

    def decode(views) -> int:
        for v in views:
            dec(v, rng)
        return len(views)

    decode(views[:10])
    return h.per_second(decode, views)


def _one_core(job: tuple[Path, int, int]) -> tuple[int, float]:
    shards, start, count = job
    ds = open_shards(shards)
    dec = h.rrc_flip_decoder(SIZE)
    rng = np.random.default_rng(start)
    views = ds.payloads(np.arange(start, start + count) % len(ds), "image")
    return count, h.timed(lambda: [dec(v, rng) for v in views])


def parallel_raw_decode(shards: Path, cores: int, per_core: int) -> float:
    """Images/s of ``cores`` bare processes decoding at once: the ceiling under today's load."""
    import multiprocessing as mp

    with mp.get_context("fork").Pool(cores) as pool:
        t = time.perf_counter()
        done = pool.map(_one_core, [(shards, i * per_core, per_core) for i in range(cores)])
        wall = time.perf_counter() - t
    return sum(c for c, _ in done) / wall


def single_core_naive(shards: Path, n: int) -> float:
    ds = open_shards(shards)
    datas = [bytes(v) for v in ds.payloads(np.arange(min(n, len(ds))), "image")]
    rng = np.random.default_rng(0)

    def decode() -> int:
        for d in datas:
            h.naive_rrc_flip(d, rng, SIZE)
        return len(datas)

    return h.per_second(decode)


def full_pipeline(shards: Path, workers: int, epochs: int = 1) -> float:
    from reader import Loader

    with Loader(shards, BATCH, num_workers=workers, shuffle="block", seed=0,
                transform=h.rrc_flip(SIZE)) as lo:
        return max(h.per_second(lambda: sum(len(b["label"]) for b in lo))
                   for _ in range(epochs))


def imagefolder_torch(folder: Path, workers: int) -> float:
    import torch

    from scripts.bench_peers import ImageFolderPIL

    dl = torch.utils.data.DataLoader(ImageFolderPIL(folder), batch_size=BATCH, shuffle=True,
                                     num_workers=workers)
    return h.per_second(lambda: sum(len(y) for _, y in dl))


def webdataset_torch(tars: Path, workers: int) -> float:
    import torch
    import webdataset as wds

    from scripts.bench_peers import wds_decode

    urls = sorted(str(p) for p in tars.glob("*.tar"))
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(wds_decode).batched(BATCH)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    return h.per_second(lambda: sum(len(y) for _, y in dl))


def loader_memory(path: Path, workers: int, batches: int = 20) -> int:
    """RssAnon of main + workers (KiB) after ``batches`` batches of a full shuffle."""
    from reader import Loader
    from reader.transforms import CenterCrop

    with Loader(path, 64, num_workers=workers, shuffle="full", transform=[CenterCrop(32)]) as lo:
        it = iter(lo)
        for _ in range(batches):
            next(it)
        kb = h.rss_anon_kb(os.getpid()) + sum(h.rss_anon_kb(p.pid) for p in it.workers)
        it.shutdown()
    return kb


# -- report -----------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = h.parser(__doc__, full=True)
    h.add_data(p, Path("/tmp/shardpack-bench-reader"))
    p.add_argument("--quick", action="store_true", help="fewer images (about a minute)")
    h.add_workers(p, len(os.sched_getaffinity(0)))
    p.add_argument("--images", type=int, default=None)
    p.add_argument("--map-style", action="store_true", help="only (f): ds[i], checks on vs off")
    h.add_repeat(p, 5)
    args = p.parse_args(argv)
    load = h.Load()
    n = args.images or (1536 if args.quick else 4096)
    cores = args.workers
    t0 = time.perf_counter()
    inputs = build_inputs(args.data, n)
    tiny = [build_tiny(args.data, m) for m in ((2000, 20000) if args.quick else (10000, 100000))]
    print(f"data: {n} JPEGs (~{sum(f.stat().st_size for f in inputs['shards'].glob('*.rec')) / n / 1e3:.0f} KB), "
          f"prepared in {time.perf_counter() - t0:.0f} s; workers = cores = {cores}", file=sys.stderr)
    h.warm(*inputs.values())

    rows = []
    if args.map_style:
        rows += map_style(inputs["shards"], args.repeat, "the JPEGs")
        rows += map_style(tiny[0], args.repeat, "tiny (1 KB)")
        _print(rows, load, t0)
        return 0
    mem = [loader_memory(t, cores) for t in tiny]
    loader_bps, copy_bps = raw_read(inputs["shards"])
    rows.append(("(a) raw read, loader / memcpy", f"{loader_bps / 1e9:.2f} GB/s", f"{copy_bps / 1e9:.2f} GB/s",
                 loader_bps / copy_bps, ">= 0.8"))
    k = max(256, n // 4)
    ours1 = single_core_ours(inputs["shards"], k)
    naive1 = single_core_naive(inputs["shards"], k)
    rows.append(("(e) 1 core decode+RRC+flip, ours / naive PIL", f"{ours1:.0f} img/s", f"{naive1:.0f} img/s",
                 ours1 / naive1, ">= 1.4"))
    full = full_pipeline(inputs["shards"], cores, epochs=2)
    par = parallel_raw_decode(inputs["shards"], cores, n // cores)
    ceiling = cores * ours1
    rows.append(("(b) full pipeline / (cores x 1-core rate)", f"{full:.0f} img/s", f"{ceiling:.0f} img/s",
                 full / ceiling, ">= 0.9"))
    rows.append(("(b') full pipeline / bare parallel decode, same load", f"{full:.0f} img/s",
                 f"{par:.0f} img/s", full / par, "(context)"))
    try:
        folder = imagefolder_torch(inputs["folder"], cores)
        rows.append(("(b)/(c) vs ImageFolder+PIL+DataLoader", f"{full:.0f} img/s", f"{folder:.0f} img/s",
                     full / folder, ">= 1.5"))
    except ImportError as exc:
        rows.append(("(c) ImageFolder+PIL+DataLoader", "skipped", str(exc), float("nan"), ">= 1.5"))
    try:
        wds_rate = webdataset_torch(inputs["wds"], cores)
        rows.append(("(b)/(d) vs webdataset (same decoder)", f"{full:.0f} img/s", f"{wds_rate:.0f} img/s",
                     full / wds_rate, "> 1.0"))
    except ImportError as exc:
        rows.append(("(d) webdataset", "skipped", str(exc), float("nan"), "> 1.0"))
    small, large = (len(open_shards(t)) for t in tiny)
    rows.append((f"memory: RssAnon {large} vs {small} records", f"{mem[1] / 1024:.0f} MiB",
                 f"{mem[0] / 1024:.0f} MiB", mem[1] / mem[0], "~ 1.0 (flat)"))

    rows += map_style(inputs["shards"], args.repeat, "the JPEGs")
    rows += map_style(tiny[0], args.repeat, "tiny (1 KB)")
    _print(rows, load, t0)
    return 0


def _print(rows: list[tuple], load: h.Load, t0: float) -> None:
    h.Table(h.Col("measure"), h.Col("ours", 14, ">"), h.Col("reference", 14, ">"),
            h.Col("ratio", 6, ">"), h.Col("target", 0)).print(
        [(name, ours, ref, f"{ratio:.2f}", target) for name, ours, ref, ratio, target in rows])
    print(load.line())
    print(f"total {time.perf_counter() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
