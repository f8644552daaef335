"""The README's demo: make a small image dataset locally, pack it, read it back.

Run: ``bash dev.sh demo`` (or ``python -m scripts.demo [--out DIR]``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import simplejpeg

import formats
from scripts.synth import make_image_folder


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("demo"), help="working folder (default: ./demo)")
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--per-class", type=int, default=50)
    args = ap.parse_args(argv)

    src, dst = args.out / "images", args.out / "shards"
    t0 = time.perf_counter()
    files = make_image_folder(src, args.classes, args.per_class, seed=0)
    mb = sum(f.stat().st_size for f in files) / 1e6
    print(f"1. generated {len(files)} JPEGs ({mb:.1f} MB) in {src}/ "
          f"({time.perf_counter() - t0:.1f} s)")

    t0 = time.perf_counter()
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    fields = [formats.Field("image", "jpeg"), formats.Field("label", "int"), formats.Field("key", "str")]
    with formats.DatasetWriter(dst, fields, records_per_shard=64, classes=classes,
                               overwrite=True) as w:
        for f in files:
            data = f.read_bytes()
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
            w.write({"image": data, "label": classes.index(f.parent.name),
                     "key": f.relative_to(src).as_posix()}, meta={"width": width, "height": height})
    print(f"2. packed them into {len(w.sealed)} shards in {dst}/ ({time.perf_counter() - t0:.2f} s)")

    ds = formats.open_shards(dst, check_crc=True)
    idx = np.random.default_rng(0).permutation(len(ds))[:8]
    labels = ds.scalars(idx, "label")
    shapes = [simplejpeg.decode_jpeg(bytes(v)).shape for v in ds.payloads(idx, "image")]
    print(f"3. read back {len(ds)} records; random sample: labels {labels.tolist()}, "
          f"decoded shapes {shapes[:3]}...")
    problems = formats.verify_dataset(dst)
    print(f"4. verified every checksum: {'OK' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
