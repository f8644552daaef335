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

import shutil
import sys
import tempfile
from pathlib import Path

from scripts import harness as h

__all__ = ["main"]


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


def _seconds(fn, repeat: int, scratch: Path) -> float:
    """The median of ``repeat`` runs of ``fn(out)``, each into a fresh folder."""
    runs = []
    for _ in range(repeat):
        with h.fresh_dir(scratch) as out:
            runs.append(h.timed(fn, out))
    return h.median(runs)


def _out_bytes(fn, scratch: Path) -> int:
    with h.fresh_dir(scratch) as out:
        fn(out)
        return sum(p.stat().st_size for p in out.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    p = h.parser(__doc__)
    h.add_data(p, help="cache folder for the generated image folder")
    p.add_argument("--count", type=int, default=20_000, help="images (default 20,000)")
    p.add_argument("--quick", action="store_true", help="2,000 images, one repeat")
    h.add_repeat(p)
    args = p.parse_args(argv)
    count, repeat = (2_000, 1) if args.quick else (args.count, args.repeat)
    args.data.mkdir(parents=True, exist_ok=True)
    src = h.image_folder(args.data, count)
    samples = h.folder_samples(src)
    nbytes = h.warm(*(path for path, _, _ in samples))
    n = len(samples)
    cores = h.CORES
    scratch = Path(tempfile.mkdtemp(prefix="bench-pack-", dir=args.data))
    print(f"{n} JPEGs, {nbytes / n / 1e3:.0f} KB mean, {nbytes / 1e9:.2f} GB, {cores} cores, "
          f"median of {repeat}, page cache warm")

    cases = [
        ("copy limit (read + append, 1 proc)",
         lambda o: h.copy_limit([path for path, _, _ in samples], o / "copy.bin")),
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
                _seconds(fn, 1, scratch)
            results.append((name, _seconds(fn, repeat, scratch)))
        shrink = _out_bytes(side[1], scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    limit = results[0][1]
    packed = results[1][1]
    print()
    h.Table(h.Col("writer", 38), h.Col("records/s", 10, ">"), h.Col("MB/s", 8, ">"),
            h.Col("vs limit", 9, ">"), h.Col("pack vs it", 11, ">"), sep=" ").print(
        [(name, f"{n / s:,.0f}", f"{nbytes / s / 1e6:,.0f}", f"{limit / s:.2f}",
          f"{s / packed:.2f}") for name, s in results])
    print(f"\npacking ÷ copy limit: {limit / packed:.2f} (target >= 0.9)")
    print(f"--max-side 256: {nbytes / 1e6:,.0f} MB in -> {shrink / 1e6:,.0f} MB out "
          f"({shrink / nbytes:.2f}x size)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
