"""What checking every record's CRC32C costs the Loader (DESIGN.md: "checksums on by
default", pipeline with checks ÷ without ≥ 0.98).

In one run, page cache warm, the same packed JPEGs read by ``reader.Loader`` with
``check_crc=True`` (the default) and ``check_crc=False``, alternated, best of
``--repeat``: the full pipeline (decode + RandomResizedCrop(224) + flip, workers =
cores) and the raw path (no decode: bytes and labels only, where a check costs the
most relative to the work).

Usage: ``python -m scripts.bench_checksums [--count 2000] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

__all__ = ["main"]


def _epoch(ds_path: Path, check: bool, *, decode: bool, workers: int) -> float:
    import reader
    from reader.transforms import RandomHorizontalFlip, RandomResizedCrop

    transform = [RandomResizedCrop(224), RandomHorizontalFlip()] if decode else None
    with reader.Loader(ds_path, batch_size=128, num_workers=workers if decode else 0,
                       shuffle=True, seed=0, transform=transform, decode=decode,
                       check_crc=check) as lo:
        t = time.perf_counter()
        n = 0
        for batch in lo:
            n += len(batch["label"])
        return n / (time.perf_counter() - t)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "shardpack-bench")
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    from packer import PackOptions, pack
    from scripts.bench_pack import _dataset

    src, _ = _dataset(args.data, args.count)
    ds_path = args.data / f"checksums-{src.name}"
    if not (ds_path / "manifest.json").exists():
        pack(src, ds_path, PackOptions(shard_size=64_000_000, overwrite=True))
    workers = os.cpu_count() or 1
    print(f"{args.count} JPEGs, Loader batch 128, best of {args.repeat}, alternated, "
          f"page cache warm; pipeline: {workers} workers")
    print(f"{'path':46} {'checks on':>10} {'checks off':>11} {'on ÷ off':>9}  target")
    for label, decode in (("full pipeline (decode + RRC 224 + flip) img/s", True),
                          ("raw bytes + labels, main process, rec/s", False)):
        best = {True: 0.0, False: 0.0}
        for _ in range(args.repeat):
            for check in (True, False):
                best[check] = max(best[check], _epoch(ds_path, check, decode=decode,
                                                      workers=workers))
        target = ">= 0.98" if decode else "(no decode: the worst case)"
        print(f"{label:46} {best[True]:10,.0f} {best[False]:11,.0f} "
              f"{best[True] / best[False]:9.3f}  {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
