"""Packing speed vs the copy limit and peer writers (DESIGN.md, "Figures to reach").

In one run, page cache warm, each measured ``--repeat`` times (median shown):

(a) copy limit: read every source file (os.read) and append it to one file
    (os.write), one process;
(b) ``packer.pack`` with workers = cores (and ``--max-side 256``);
(c) peers writing the same samples: the ``tfrecord`` package's TFRecordWriter and
    webdataset's TarWriter (each reads the files itself, one process).

Usage: ``python -m scripts.bench_pack [--data DIR] [--quick]``.
Needs ``pip install 'shardpack[bench]'`` for the peers (skipped when missing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]


def _dataset(data: Path, count: int) -> tuple[Path, list[tuple[str, str, int]]]:
    from scripts.synth import cached_image_folder

    classes = 20
    per_class = max(1, count // classes)
    root = cached_image_folder(data / f"imagefolder-{classes * per_class}", classes, per_class)
    samples = []
    for label, cls in enumerate(sorted(p.name for p in root.iterdir() if p.is_dir())):
        for f in sorted((root / cls).iterdir()):
            samples.append((str(f), f"{cls}/{f.name}", label))
    return root, samples


def packed_dataset(data: Path, count: int) -> Path:
    """The synthetic folder of ``count`` JPEGs (:func:`_dataset`), packed into shards
    once and kept under ``data`` for the reader benchmarks."""
    from packer import PackOptions, pack

    src, _ = _dataset(data, count)
    path = data / f"packed-{src.name}"
    if not (path / "manifest.json").exists():
        pack(src, path, PackOptions(shard_size=64_000_000, overwrite=True))
    return path


def _warm(samples) -> int:
    total = 0
    for path, _, _ in samples:
        with open(path, "rb") as f:
            total += len(f.read())
    return total


def _copy_limit(samples, out: Path) -> None:
    from scripts.bench import copy_limit

    copy_limit([path for path, _, _ in samples], out / "copy.bin")


def _pack(src: Path, out: Path, **kw) -> None:
    from packer import PackOptions, pack

    pack(src, out / "ds", PackOptions(durable=False, **kw))


def _tfrecord(samples, out: Path) -> None:
    from tfrecord import TFRecordWriter

    w = TFRecordWriter(str(out / "data.tfrecord"))
    for path, key, label in samples:
        with open(path, "rb") as f:
            data = f.read()
        w.write({"image": (data, "byte"), "label": (label, "int"), "key": (key.encode(), "byte")})
    w.close()


def _webdataset(samples, out: Path) -> None:
    import webdataset as wds

    with wds.TarWriter(str(out / "data.tar")) as w:
        for path, key, label in samples:
            with open(path, "rb") as f:
                data = f.read()
            w.write({"__key__": key.rsplit(".", 1)[0], "jpg": data, "cls": label})


def _time(fn, repeat: int, scratch: Path) -> float:
    runs = []
    for _ in range(repeat):
        # Writeback of the previous run's gigabytes would throttle this one's writes
        # (dirty-page limits) and bias whichever case runs later: start clean.
        os.sync()
        out = Path(tempfile.mkdtemp(dir=scratch))
        t = time.perf_counter()
        fn(out)
        runs.append(time.perf_counter() - t)
        shutil.rmtree(out)
    return statistics.median(runs)


def _out_bytes(fn, scratch: Path) -> int:
    out = Path(tempfile.mkdtemp(dir=scratch))
    fn(out)
    n = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    shutil.rmtree(out)
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "shardpack-bench",
                   help="cache folder for the generated image folder")
    p.add_argument("--count", type=int, default=20_000, help="images (default 20,000)")
    p.add_argument("--quick", action="store_true", help="2,000 images, one repeat")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    count, repeat = (2_000, 1) if args.quick else (args.count, args.repeat)
    args.data.mkdir(parents=True, exist_ok=True)
    src, samples = _dataset(args.data, count)
    nbytes = _warm(samples)
    n = len(samples)
    cores = os.cpu_count() or 1
    scratch = Path(tempfile.mkdtemp(prefix="bench-pack-", dir=args.data))
    print(f"{n} JPEGs, {nbytes / n / 1e3:.0f} KB mean, {nbytes / 1e9:.2f} GB, {cores} cores, "
          f"median of {repeat}, page cache warm")

    cases = [
        ("copy limit (read + append, 1 proc)", lambda o: _copy_limit(samples, o)),
        (f"pack-dataset, workers={cores}", lambda o: _pack(src, o, workers=cores)),
    ]
    for name, mod, fn in (("tfrecord", "tfrecord", _tfrecord), ("webdataset", "webdataset",
                                                                  _webdataset)):
        try:
            __import__(mod)
        except ImportError:
            print(f"({name} not installed: pip install 'shardpack[bench]')")
            continue
        cases.append((f"{name} writer (1 proc)", lambda o, fn=fn: fn(samples, o)))
    side = ("pack-dataset --max-side 256", lambda o: _pack(src, o, workers=cores, max_side=256))
    cases.append(side)

    try:
        results = []
        for name, fn in cases:
            if fn is not side[1]:  # warm-up: imports, lazy module loads (side is long enough)
                _time(fn, 1, scratch)
            results.append((name, _time(fn, repeat, scratch)))
        shrink = _out_bytes(side[1], scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    limit = results[0][1]
    packed = results[1][1]
    print(f"\n{'writer':<38} {'records/s':>10} {'MB/s':>8} {'vs limit':>9} {'pack vs it':>11}")
    for name, s in results:
        print(f"{name:<38} {n / s:>10,.0f} {nbytes / s / 1e6:>8,.0f} {limit / s:>9.2f} "
              f"{s / packed:>11.2f}")
    print(f"\npacking ÷ copy limit: {limit / packed:.2f} (target >= 0.9)")
    print(f"--max-side 256: {nbytes / 1e6:,.0f} MB in -> {shrink / 1e6:,.0f} MB out "
          f"({shrink / nbytes:.2f}x size)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
