"""Packing with Ray on this machine vs the local engine with the same worker count.

What it shows is the Ray engine's overhead, as a ratio of wall times (Ray ÷
local, page cache warm, ``durable=False``, ``workers = W`` for both; Ray on a
local cluster of W CPUs, ranges of ``--task-records``, default 4 per worker):

(a) plain packing (JPEGs stored as they are): ``--copies`` hard links of each of
    :mod:`scripts.bench_pack`'s synthetic JPEGs, so there are enough files for
    the per-record rate to show through the fixed costs (same bytes, no disk);
(b) ``--max-side 256`` (decode, resize, re-encode: CPU-bound; both engines run
    W processes) on the JPEGs themselves;
(c) a pack of 20 files: the fixed cost of a pack, with the cluster already up;
(d) Ray's start-up (``ray.init``) and the first pack (workers still importing):
    paid once per ``pack-dataset --engine ray`` command on one machine.

Cases run back to back in rounds; each ratio is taken within a round, the median shown.

Usage: ``python -m scripts.bench_ray [--data DIR] [--count N] [--quick]``.
Needs ``pip install 'shardpack[ray]'``.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from scripts import harness as h

__all__ = ["main"]


def _pack(src: Path, out: Path, **kw) -> None:
    from packer import PackOptions, pack

    pack(src, out / "ds", PackOptions(durable=False, **kw))


def _seconds(fn, scratch: Path) -> float:
    with h.fresh_dir(scratch) as out:
        return h.timed(fn, out)


def _rounds(cases, repeat: int, scratch: Path) -> list[tuple[float, float, float]]:
    """(local s, ray s, ray ÷ local) medians per (local, ray) pair of ``cases``."""
    times: list[list[tuple[float, float]]] = [[] for _ in cases]
    for _ in range(repeat):
        for i, (a, b) in enumerate(cases):
            times[i].append((_seconds(a, scratch), _seconds(b, scratch)))
    return [(h.median(a for a, _ in t), h.median(b for _, b in t),
             h.paired_ratio([b for _, b in t], [a for a, _ in t])) for t in times]


def main(argv: list[str] | None = None) -> int:
    p = h.parser(__doc__)
    h.add_data(p, help="cache folder for the generated image folder")
    p.add_argument("--count", type=int, default=4_000, help="JPEGs generated (default 4,000)")
    p.add_argument("--copies", type=int, default=5,
                   help="hard links per JPEG for the plain case (default 5)")
    h.add_workers(p, help="worker count for both engines (default: all cores)")
    p.add_argument("--task-records", type=int, default=None,
                   help="records per Ray task (default: 4 ranges per worker)")
    p.add_argument("--quick", action="store_true", help="1,000 JPEGs, one round")
    h.add_repeat(p)
    args = p.parse_args(argv)
    try:
        import ray
    except ImportError:
        print("Ray is not installed: pip install 'shardpack[ray]'", file=sys.stderr)
        return 1
    count, repeat = (1_000, 1) if args.quick else (args.count, args.repeat)
    args.data.mkdir(parents=True, exist_ok=True)
    src = h.image_folder(args.data, count)
    samples = h.folder_samples(src)
    many = h.link_folder(src, args.data / f"{src.name}x{args.copies}", copies=args.copies)
    nbytes = h.warm(*(path for path, _, _ in samples))
    n, w = len(samples), args.workers
    n_many = n * args.copies
    few_dir = args.data / f"{src.name}-first20"  # a flat folder: --from files
    if not (few_dir / ".complete").exists():
        shutil.rmtree(few_dir, ignore_errors=True)
        few_dir.mkdir()
        for i, (path, _, _) in enumerate(samples[:20]):
            os.link(path, few_dir / f"{i:02d}.jpg")
        (few_dir / ".complete").touch()

    def ray_kw(records: int) -> dict:
        task = args.task_records or max(1, -(-records // (4 * w)))
        return {"engine": "ray", "workers": w, "task_records": task}

    print(f"{n} JPEGs, {nbytes / n / 1e3:.0f} KB mean, {nbytes / 1e9:.2f} GB; plain case: "
          f"{n_many} files ({args.copies} hard links each); W = {w} workers "
          f"({os.cpu_count()} cores); Ray ranges: 4 per worker; median of {repeat}, "
          "page cache warm")
    scratch = Path(tempfile.mkdtemp(prefix="bench-ray-", dir=args.data))
    t = time.perf_counter()
    ray.init(num_cpus=w, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    start_up = time.perf_counter() - t
    cases = [
        (f"plain, {n_many} files", lambda o: _pack(many, o, workers=w),
         lambda o: _pack(many, o, **ray_kw(n_many))),
        (f"--max-side 256, {n} files", lambda o: _pack(src, o, workers=w, max_side=256),
         lambda o: _pack(src, o, max_side=256, **ray_kw(n))),
        ("a pack of 20 files (fixed cost)", lambda o: _pack(few_dir, o, workers=w),
         lambda o: _pack(few_dir, o, **ray_kw(20))),
    ]
    try:
        first = _seconds(cases[0][2], scratch)
        _seconds(cases[0][1], scratch)  # warm-up: imports
        results = _rounds([(a, b) for _, a, b in cases], repeat, scratch)
    finally:
        ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)

    print()
    h.Table(h.Col("case", 34), h.Col("local s", 8, ">"), h.Col("ray s", 8, ">"),
            h.Col("local rec/s", 12, ">"), h.Col("ray rec/s", 10, ">"),
            h.Col("ray ÷ local", 12, ">"), sep=" ").print(
        [(name, f"{a:.2f}", f"{b:.2f}", f"{records / a:,.0f}", f"{records / b:,.0f}",
          f"{ratio:.2f}")
         for (name, _, _), (a, b, ratio), records in zip(cases, results, (n_many, n, 20),
                                                          strict=True)])
    print(f"\nRay start-up (ray.init, {w} CPUs): {start_up:.2f} s; first Ray pack of the plain "
          f"case (cold workers): {first:.2f} s")
    cold = (start_up + first) / results[0][0]
    print(f"one pack-dataset --engine ray command, plain case (start-up + first pack) ÷ local: "
          f"{cold:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
