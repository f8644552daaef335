"""``num_workers="auto"`` against the best fixed worker count (issue 26: >= 0.95 each).

Four workloads, page cache warm, the same Loader (persistent workers, shuffled):

* decode-bound: the 2,000 packed JPEGs of the other benchmarks (200-400 px),
  decode + RandomResizedCrop(224) + flip, batch 64, an idle consumer;
* light: 4,000 small JPEGs (48 px), decode + CenterCrop(32), batch 256, an idle
  consumer: little work per record, so per-batch costs and the main process weigh most;
* busy trainer: the decode-bound loader feeding a training step that burns 10 ms of
  CPU per batch of 64 (a Python-heavy trainer: it competes with the workers);
* busy trainer + burners: the same, with one CPU-burning program per core started a
  third of the way into each run (the best fixed count is measured under the same
  burners, started at the same moment).

Each run lasts ``--seconds`` from the Loader's creation to the end, start-up and
``"auto"``'s search included (its first three windows take under a tenth of a run at
the defaults). In each round every count from 1 to 2 x cores and ``"auto"`` runs once,
in a rotated order; the ratio auto ÷ the best fixed count is taken per round, and the
median and every round's are printed, with auto's changes and their reasons.

``--signals`` measures the over-subscription signals instead: for fixed counts with
and without the burners, CPU pressure (``/proc/pressure/cpu`` "some"), the run
queue less the loader's runnable processes (``procs_running``, sampled every 20 ms)
and the cores other programs took (the machine's busy time less the loader's, steal
left out): only a signal that stays near zero without burners, whatever the count,
and rises with them tells other programs from the loader's own workers.

``--record-trace FILE`` keeps the auto runs' windows, each as the scaler measured it,
for ``tests/reader/runtime/test_autoscale_traces.py`` to replay through the rule.

Usage: ``python -m scripts.bench_workers [--seconds 30] [--repeat 3] [--signals]``.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from scripts import harness as h

__all__ = ["main"]

BURN = "while True: sum(i * i for i in range(10_000))"
STEP_CPU_S = 0.010  # the busy trainer's CPU per batch of 64


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


def _burn_cpu(seconds: float) -> None:
    """The training step's own Python work: CPU, not sleep."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class Burners:
    """One CPU-burning program per core (other programs: not the loader's children)."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.procs: list = []

    def start(self) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(self.cores)]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []


def run(path: Path, workers, transform, batch: int, seconds: float, step_s: float = 0.0,
        burners: Burners | None = None):
    """Images/s over ``seconds`` from the Loader's creation; auto's changes; the end count."""
    import reader

    n = 0
    t0 = time.perf_counter()
    started = False
    try:
        with reader.Loader(path, batch, num_workers=workers, shuffle=True, seed=0,
                           transform=transform, persistent_workers=True) as lo:
            while time.perf_counter() - t0 < seconds:
                for b in lo:
                    n += len(b["label"])
                    if step_s:
                        _burn_cpu(step_s)
                    now = time.perf_counter() - t0
                    if burners is not None and not started and now >= seconds / 3:
                        burners.start()
                        started = True
                    if now >= seconds:
                        break
            rate = n / (time.perf_counter() - t0)
            windows = list(lo.runtime.scaler.windows) if lo.runtime.scaler is not None else []
            return rate, lo.worker_changes, lo.num_workers, windows
    finally:
        if burners is not None:
            burners.stop()


TRACES: dict[str, list] = {}  # workload -> the auto runs' windows (--record-trace)


def sweep(label: str, args, cores: int, **kw) -> list[float]:
    """Every fixed count and auto, ``--repeat`` rounds; prints the table; returns the ratios."""
    counts = [*range(1, 2 * cores + 1), "auto"]
    rates: dict = {c: [] for c in counts}
    last_changes, last_final = [], None
    print(label, flush=True)

    def one(c, r):
        nonlocal last_changes, last_final
        rate, changes, final, windows = run(seconds=args.seconds, workers=c, **kw)
        rates[c].append(rate)
        if c == "auto":
            last_changes, last_final = changes, final
            TRACES.setdefault(label, []).append([dataclasses.asdict(w) for w in windows])

    h.rounds(counts, args.repeat, one)
    ratios = [rates["auto"][r] / max(rates[c][r] for c in counts[:-1]) for r in range(args.repeat)]
    for c in counts[:-1]:
        print(f"    {c} workers {h.median(rates[c]):10,.0f} img/s  "
              f"(rounds: {', '.join(f'{x:,.0f}' for x in rates[c])})")
    best = max(counts[:-1], key=lambda c: h.median(rates[c]))
    print(f"    auto      {h.median(rates['auto']):10,.0f} img/s  "
          f"(rounds: {', '.join(f'{x:,.0f}' for x in rates['auto'])}; last ended at "
          f"{last_final} workers)")
    print(f"    auto ÷ best fixed, per round: {', '.join(f'{x:.3f}' for x in ratios)}; median "
          f"{h.median(ratios):.3f}; best fixed by median: {best} (target >= 0.95)")
    for ch in last_changes:
        print(f"        {ch.at_s:6.1f} s  workers {ch.before} -> {ch.after}: {ch.reason}")
    return ratios


# -- the over-subscription signals ---------------------------------------------------------

def _psi_some_us() -> int | None:
    try:
        with open("/proc/pressure/cpu") as f:
            return int(f.readline().rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


class RunQueue(threading.Thread):
    """Mean of procs_running less the loader's runnable processes, sampled every 20 ms
    (this sampling thread, itself running while it reads, is left out too)."""

    def __init__(self, pids) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.samples: list[int] = []
        self.done = threading.Event()

    def run(self) -> None:
        from reader.runtime.proc import process_state, procs_running

        while not self.done.wait(0.02):
            ours = sum(1 for p in self.pids() if (s := process_state(p)) and s.state == "R")
            self.samples.append((procs_running() or 0) - ours - 1)


def signals(args, path: Path, transform, cores: int) -> None:
    import reader
    from reader.runtime.proc import ProcCpu, machine_cpu

    print(f"over-subscription signals, {args.signal_seconds:.0f} s each, decode-bound loader, "
          "idle consumer")
    table = h.Table(h.Col("", 3), h.Col("workers", 8, ">"), h.Col("burners", 8, ">"),
                    h.Col("CPU pressure", 13, ">"), h.Col("run queue - ours", 17, ">"),
                    h.Col("others cores", 13, ">"), h.Col("idle cores", 11, ">"), sep=" ")
    print(table.head())
    for burn in (0, cores):
        for n in range(1, 2 * cores + 1):
            burners = Burners(burn)
            burners.start()
            with reader.Loader(path, 64, num_workers=n, shuffle=True, seed=0,
                               transform=transform, persistent_workers=True) as lo:
                it = iter(lo)
                for _ in range(4):
                    next(it)
                pids = lo.runtime.worker_pids
                rq = RunQueue(lambda pids=pids: [os.getpid(), *pids()])
                cpu = ProcCpu(pids)
                psi0, c0, m0, t0 = _psi_some_us(), cpu(), machine_cpu(), time.perf_counter()
                rq.start()
                while time.perf_counter() - t0 < args.signal_seconds:
                    for _ in lo:
                        if time.perf_counter() - t0 >= args.signal_seconds:
                            break
                rq.done.set()
                rq.join()
                psi1, c1, m1, t1 = _psi_some_us(), cpu(), machine_cpu(), time.perf_counter()
            burners.stop()
            ticks = c1.total - c0.total
            steal = (m1.steal - m0.steal) / ticks
            others = ((c1.busy - c0.busy) - (c1.loader - c0.loader)) / ticks - steal
            idle = 1.0 - (c1.busy - c0.busy) / ticks
            psi = "n/a" if psi0 is None else f"{(psi1 - psi0) / 1e6 / (t1 - t0):.0%}"
            print(table.line("", str(n), str(burn), psi, f"{statistics.mean(rq.samples):.2f}",
                             f"{others * cores:.2f}", f"{idle * cores:.2f}"), flush=True)


def main(argv=None) -> int:
    p = h.parser(__doc__)
    h.add_data(p)
    p.add_argument("--seconds", type=float, default=30.0, help="length of each run")
    h.add_repeat(p, help="rounds")
    p.add_argument("--only", choices=("decode", "light", "trainer", "burners"), action="append",
                   help="run only these workloads (repeatable)")
    p.add_argument("--signals", action="store_true", help="measure the signals instead")
    p.add_argument("--record-trace", type=Path, metavar="JSON",
                   help="write the auto runs' windows (tests/data/autoscale_trace.json replays them)")
    p.add_argument("--signal-seconds", type=float, default=6.0)
    args = p.parse_args(argv)
    from reader.runtime.autoscale import WINDOW_S, usable_cores
    from reader.transforms import CenterCrop

    big = h.packed_dataset(args.data, 2000)
    cores = usable_cores()
    rrc = h.rrc_flip()
    if args.signals:
        signals(args, big, rrc, cores)
        return 0
    small = _small_dataset(args.data)
    print(f"{cores} cores; {args.seconds:.0f} s a run from the Loader's creation, {args.repeat} "
          f"rounds; windows of {WINDOW_S:.1f} s; persistent workers")
    workloads = {
        "decode": ("decode-bound: 2,000 JPEGs 200-400 px, decode+RRC 224+flip, batch 64, "
                   "idle consumer", dict(path=big, transform=rrc, batch=64)),
        "light": ("light: 4,000 JPEGs 48 px, decode+CenterCrop 32, batch 256, idle consumer",
                  dict(path=small, transform=[CenterCrop(32)], batch=256)),
        "trainer": (f"busy trainer: decode-bound, the step burns {STEP_CPU_S * 1e3:.0f} ms of "
                    "CPU per batch of 64", dict(path=big, transform=rrc, batch=64,
                                                step_s=STEP_CPU_S)),
        "burners": (f"busy trainer + {cores} CPU burners from a third of each run",
                    dict(path=big, transform=rrc, batch=64, step_s=STEP_CPU_S,
                         burners=Burners(cores))),
    }
    summary = {}
    for key in args.only or list(workloads):
        label, kw = workloads[key]
        summary[key] = sweep(label, args, cores, **kw)
    print("auto ÷ best fixed (median of rounds; target >= 0.95): " + "; ".join(
        f"{k} {h.median(v):.3f}" for k, v in summary.items()))
    if args.record_trace:
        h.write_json(args.record_trace,
                     {"machine": f"{cores} cores, {os.uname().machine}, recorded "
                                 f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
                      "window_s": WINDOW_S, "cores": cores, "hi": 2 * cores, "traces": TRACES},
                     indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
