"""The main process's CPU per batch: what one trainer process pays to take batches.

4,000 small JPEGs (48 px, ``bench_workers``' light set), CenterCrop(32), batch 256,
2 persistent workers, shuffled; an idle consumer. The figure is the main process's
CPU time (``time.process_time``: every thread of it, the queues' feeder threads
included) per batch delivered, over ``--epochs`` epochs after one warm-up epoch.
With 64 workers one trainer process must take batches at 64 x a worker's rate, so
this cost bounds how many workers one process can feed (issue 36: <= 500 us).

``--mix N`` reads the same images as a ``reader.Mix`` of N sources (the folder N times,
under N names, equal weights): what the plan adds; ``--ledger`` keeps a ledger.

Usage: ``python -m scripts.bench_main_cpu [--epochs 20] [--workers 2] [--mix N]
[--ledger]``; prints one line ``main-cpu-per-batch-us <value>``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

__all__ = ["main"]


def main(argv=None) -> int:
    import reader
    from scripts.bench_workers import _small_dataset

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "shardpack-bench-main-cpu"))
    ap.add_argument("--mix", type=int, default=0, metavar="N",
                    help="read it as a reader.Mix of N sources (0: the dataset alone)")
    ap.add_argument("--ledger", action="store_true", help="keep a ledger (ledger=True)")
    args = ap.parse_args(argv)
    path = _small_dataset(Path(args.root))
    source = path
    if args.mix:
        source = reader.Mix({f"s{i}": path for i in range(args.mix)},
                            weights={f"s{i}": 1 for i in range(args.mix)},
                            samples_per_epoch=4000)
    with reader.Loader(source, 256, num_workers=args.workers, shuffle=True, seed=0,
                       transform=[reader.CenterCrop(32)], persistent_workers=True,
                       ledger=args.ledger) as lo:
        for _ in lo:  # warm-up: workers started, pages in
            pass
        batches = 0
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(args.epochs):
            for _ in lo:
                batches += 1
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    print(f"main-cpu-per-batch-us {cpu / batches * 1e6:.0f} (batches {batches}, "
          f"wall {wall:.2f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
