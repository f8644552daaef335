"""``num_workers="auto"`` against the best fixed worker count (issue 15: >= 0.95 each).

In one run, page cache warm, the same Loader (persistent workers, shuffled) over:

* decode-bound: the 2,000 packed JPEGs of the other benchmarks (200-400 px),
  decode + RandomResizedCrop(224) + flip, batch 64;
* light: 4,000 small JPEGs (48 px), decode + CenterCrop(32), batch 256: little work
  per record, so per-batch costs and the main process weigh most.

Each fixed count from 1 to 2 x cores, then ``"auto"``, runs ``--epochs`` epochs
after one untimed epoch (for ``"auto"`` the untimed epoch is where it measures and
settles; its changes are printed). Images/s are the best of ``--repeat`` runs;
the ratio is auto ÷ the best fixed count.

Then the competing-process check: ``"auto"`` runs the decode-bound workload while,
after ``--compete-after`` seconds, one CPU-burning process per core starts; the
script prints when the monitor first reports other processes' CPU use and when
the loader first changes its worker count for them (target: within 10 s).

Usage: ``python -m scripts.bench_workers [--epochs 3] [--repeat 2]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]


def _small_dataset(root: Path, count: int = 4000) -> Path:
    import numpy as np
    import simplejpeg

    from formats import DatasetWriter, Field

    path = root / f"small-jpegs-{count}"
    if (path / "manifest.json").exists():
        return path
    rng = np.random.default_rng(0)
    with DatasetWriter(path, [Field("image", "jpeg"), Field("label", "int")],
                       durable=False, overwrite=True) as w:
        for i in range(count):
            img = rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)
            w.write({"image": simplejpeg.encode_jpeg(img, quality=85), "label": i % 10})
    return path


def _run(path: Path, workers, transform, batch: int, epochs: int, monitor=None):
    import reader

    with reader.Loader(path, batch, num_workers=workers, shuffle=True, seed=0,
                       transform=transform, persistent_workers=True, monitor=monitor) as lo:
        for _ in lo:  # untimed: start-up, and where "auto" measures and settles
            pass
        t = time.perf_counter()
        n = 0
        for _ in range(epochs):
            for b in lo:
                n += len(b["label"])
        return n / (time.perf_counter() - t), lo.worker_changes, lo.num_workers


BURN = "while True: sum(i * i for i in range(10_000))"


def compete(path: Path, transform, cores: int, after_s: float, run_s: float) -> None:
    import reader
    from reader import Monitor

    mon = Monitor(1.0, output=False)
    burners: list = []
    started = None
    seen_monitor = seen_change = None
    with reader.Loader(path, 64, shuffle=True, seed=0, transform=transform,
                       persistent_workers=True, monitor=mon) as lo:
        t0 = time.perf_counter()
        t_scaler = lo._scaler._t0  # worker_changes' at_s counts from here
        while time.perf_counter() - t0 < after_s + run_s:
            for _ in lo:
                now = time.perf_counter()
                if started is None and now - t0 >= after_s:
                    # Other programs, not children of the loader's process.
                    burners = [subprocess.Popen([sys.executable, "-c", BURN])
                               for _ in range(cores)]
                    started = now
                if started is not None and seen_monitor is None:
                    other = (mon.stats().get("current") or {}).get("other_cpu_pct")
                    if other is not None and other >= 20:
                        seen_monitor = now - started
                        print(f"    monitor: {mon.stats()['diagnosis']['message']}")
                if started is not None and seen_change is None and any(
                        "other processes" in c.reason and c.at_s >= started - t_scaler
                        for c in lo.worker_changes):
                    seen_change = now - started
                if now - t0 >= after_s + run_s:
                    break
        changes = lo.worker_changes
    for p in burners:
        p.kill()
        p.wait()
    print(f"competing process: {cores} CPU burners started {after_s:.0f} s in; monitor named "
          f"them after {_s(seen_monitor)}, the loader changed its workers after "
          f"{_s(seen_change)} (target <= 10 s)")
    for c in changes:
        print(f"    {c.at_s:6.1f} s  workers {c.before} -> {c.after}: {c.reason}")


def _s(x: float | None) -> str:
    return "never" if x is None else f"{x:.1f} s"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "shardpack-bench")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--compete-after", type=float, default=6.0)
    p.add_argument("--compete-for", type=float, default=14.0)
    args = p.parse_args(argv)
    from reader.runtime.autoscale import usable_cores
    from reader.transforms import CenterCrop, RandomHorizontalFlip, RandomResizedCrop
    from scripts.bench_pack import packed_dataset

    big = packed_dataset(args.data, 2000)
    small = _small_dataset(args.data)
    cores = usable_cores()
    workloads = (
        ("decode-bound: 2,000 JPEGs 200-400 px, decode+RRC 224+flip, batch 64", big,
         [RandomResizedCrop(224), RandomHorizontalFlip()], 64),
        ("light: 4,000 JPEGs 48 px, decode+CenterCrop 32, batch 256", small,
         [CenterCrop(32)], 256),
    )
    print(f"{cores} cores; images/s best of {args.repeat}, {args.epochs} epochs after one "
          "untimed, persistent workers")
    for label, path, transform, batch in workloads:
        print(label)
        fixed = {}
        for n in range(1, 2 * cores + 1):
            fixed[n] = max(_run(path, n, transform, batch, args.epochs)[0]
                           for _ in range(args.repeat))
            print(f"    {n} workers {fixed[n]:10,.0f}", flush=True)
        runs = [_run(path, "auto", transform, batch, args.epochs) for _ in range(args.repeat)]
        rate, changes, final = max(runs, key=lambda r: r[0])
        best = max(fixed, key=fixed.get)
        print(f"    auto      {rate:10,.0f}  (ended at {final} workers)  "
              f"auto ÷ best fixed ({best}) = {rate / fixed[best]:.3f}  target >= 0.95")
        for c in changes:
            print(f"        {c.at_s:6.1f} s  workers {c.before} -> {c.after}: {c.reason}")
    compete(big, workloads[0][2], cores, args.compete_after, args.compete_for)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
