"""``num_workers="auto"``: a worker count measured at start and adjusted while the loader runs.

The seed's rule of thumb (section 5.1): ideal workers = min(cores, expected
throughput ÷ one worker's throughput) × 1.5, bounded by memory and by what the
storage can feed. Here both rates are measured, not guessed:

* **demand**: how fast the consumer takes batches when one is ready (the time
  between two ``next()`` calls, minus the time ``next()`` itself waited);
* **one worker's rate**: 1 ÷ the mean wall time a worker spends on a batch
  (``busy_s``);
* **what kind of work**: the workers' CPU time ÷ their busy time. Near 1 the work
  is CPU-bound and more workers than cores only compete for them, so the rule is
  capped at the cores; well below 1 while cores stand idle the workers wait
  (storage, the network, a ``sleep``) and up to twice the cores may run (below 1
  with no idle core, they wait for the CPU itself: other programs take it).

The rule sets the count once, after the first :data:`WINDOW_S` of batches (windows
run across epochs and ``break``s, pauses between them left out). Then, once per
window:

* **one more** worker while the consumer waited for more than :data:`WAIT_HIGH`
  of the window, the workers were busy, and at least :data:`IDLE_CORES` of a core
  stood idle (more workers cannot help on a machine with no idle core);
* **one fewer** while other processes keep the machine's cores over-subscribed
  (their CPU use plus the workers' CPU use exceeds the cores: every process's time
  slices shrink, and fewer workers switch less; workers that wait on storage use
  little CPU and are not counted as load);
* **one fewer** while the consumer waited for less than :data:`WAIT_LOW` of the
  window and one worker fewer would still be busy for less than
  :data:`SPARE_BUSY` of its time (workers that idle only hold memory).

Bounds: 1 to twice the usable cores, and no more than the memory available
allows (:data:`WORKER_BYTES` of headroom per worker). Every change and its reason
is kept in :attr:`WorkerScaler.changes` and shown by the monitor.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

from .proc import machine_cpu, process_state

__all__ = ["ScaleChange", "WindowFigures", "WorkerScaler", "decide", "usable_cores"]

WINDOW_S = 2.0
WAIT_HIGH = 0.05
WAIT_LOW = 0.01
IDLE_CORES = 0.75
SPARE_BUSY = 0.6
CPU_BOUND = 0.7  # workers' CPU time ÷ busy time above which the work is CPU-bound
WORKER_BYTES = 256 << 20


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def memory_available() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes, or None."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass(frozen=True)
class ScaleChange:
    """One change of the worker count: when (seconds since the loader started), to what, why."""

    at_s: float
    before: int
    after: int
    reason: str


@dataclass(frozen=True)
class WindowFigures:
    """What one window measured (all shares of the window's wall time).

    Attributes:
        workers: workers running during the window.
        wait_share: the consumer's time blocked in ``next()``.
        consumer_s: the consumer's mean time per batch outside ``next()`` (0: none seen).
        busy_s: the workers' mean wall time per batch.
        busy_workers: worker-equivalents busy (sum of busy time ÷ window).
        cpu_per_busy: the workers' CPU time ÷ their busy time (None: unknown).
        idle_cores: cores the machine left idle (None: unknown).
        other_cores: cores used by processes other than the loader's (None: unknown).
    """

    workers: int
    wait_share: float
    consumer_s: float
    busy_s: float
    busy_workers: float
    cpu_per_busy: float | None
    idle_cores: float | None
    other_cores: float | None


def seed_rule(w: WindowFigures, cores: int, hi: int) -> tuple[int, str]:
    """The seed's rule on measured rates: (worker count, the reason in words)."""
    # Workers that use little CPU for their busy time wait on something: storage while
    # cores stand idle, or the CPU itself when other programs take it (then no idle core).
    cpu_bound = (w.cpu_per_busy is None or w.cpu_per_busy >= CPU_BOUND
                 or (w.idle_cores is not None and w.idle_cores < IDLE_CORES))
    cap = cores if cpu_bound else hi
    kind = "CPU-bound" if cpu_bound else "waiting on IO"
    if w.consumer_s <= 0.0 or w.busy_s <= 0.0:
        return max(1, min(cap, hi)), (f"the consumer takes batches as fast as they come; "
                                      f"the work is {kind}: {min(cap, hi)} workers")
    need = min(cores, w.busy_s / w.consumer_s) * 1.5
    n = max(1, min(math.ceil(need), cap, hi))
    return n, (f"a batch takes a worker {w.busy_s * 1e3:.0f} ms, the consumer "
               f"{w.consumer_s * 1e3:.0f} ms; min({cores} cores, "
               f"{w.busy_s / w.consumer_s:.1f}) x 1.5 = {need:.1f}; the work is {kind}: "
               f"{n} workers")


def decide(w: WindowFigures, cores: int, hi: int) -> tuple[int, str] | None:
    """The change (+1 or -1, and why) a window calls for, or None."""
    n = w.workers
    # The workers' CPU, not their busy wall time: a worker waiting on storage loads no core.
    worker_cores = w.busy_workers * (w.cpu_per_busy if w.cpu_per_busy is not None else 1.0)
    over = (w.other_cores is not None and w.other_cores >= 0.5
            and w.other_cores + worker_cores > cores + 0.5)
    if over and n > 1:
        return -1, (f"other processes use {w.other_cores:.1f} of {cores} cores: the machine "
                    "is over-subscribed, fewer workers compete less")
    if (w.wait_share > WAIT_HIGH and n < hi and w.busy_workers >= 0.75 * n
            and (w.idle_cores is None or w.idle_cores >= IDLE_CORES)):
        idle = "" if w.idle_cores is None else f" and {w.idle_cores:.1f} cores idle"
        return +1, (f"the consumer waited {w.wait_share:.0%} of the time, with the workers "
                    f"busy{idle}")
    if w.wait_share < WAIT_LOW and n > 1 and w.busy_workers < SPARE_BUSY * (n - 1):
        return -1, (f"the consumer did not wait and the workers were busy "
                    f"{w.busy_workers:.1f} of {n}: one fewer is enough")
    return None


class WorkerScaler:
    """Measures a loader's windows and says when to add or retire a worker.

    Args:
        start: the worker count to start with (default: the usable cores).
        cores: usable cores (default: this process's affinity).
    """

    def __init__(self, start: int | None = None, cores: int | None = None) -> None:
        self.cores = cores or usable_cores()
        self.hi = self._memory_cap(2 * self.cores)
        self.start = max(1, min(start or self.cores, self.hi))
        self.changes: list[ScaleChange] = []
        self.ruled = False  # the seed's rule has set the count
        self._t0 = time.perf_counter()
        self.mark(self._t0, [])

    @staticmethod
    def _memory_cap(hi: int) -> int:
        avail = memory_available()
        return hi if avail is None else max(1, min(hi, avail // WORKER_BYTES))

    def resume(self, now: float) -> None:
        """A new epoch (or iterator) starts: the window goes on, without the pause since
        the last batch, so epochs shorter than a window still add up to one."""
        if self._batches and self._last is not None:
            self._since += now - self._last
        self._last = now

    def mark(self, now: float, pids: list[int]) -> None:
        """Start a window at ``now`` with workers ``pids``."""
        self._since = self._last = now
        self._waited = self._consumer = self._busy = 0.0
        self._batches = 0
        self._machine = machine_cpu()
        self._cpu = _cpu_times([os.getpid(), *pids])

    def on_batch(self, waited_s: float, consumer_s: float, busy_s: float) -> None:
        """One delivered batch: how long ``next()`` waited, the consumer's time
        since the previous ``next()`` returned, the worker's busy time."""
        self._waited += waited_s
        self._consumer += consumer_s
        self._busy += busy_s
        self._batches += 1
        self._last = time.perf_counter()

    def due(self, now: float) -> bool:
        return now - self._since >= WINDOW_S and self._batches >= 2

    def window(self, now: float, pids: list[int]) -> WindowFigures:
        """The figures of the window ending ``now`` (then a new window starts)."""
        span = now - self._since
        cpu = _cpu_times([os.getpid(), *pids])
        used = {p: c - self._cpu.get(p, 0.0) for p, c in cpu.items()}
        worker_cpu = sum(used.get(p, 0.0) for p in pids) if len(cpu) == len(pids) + 1 else None
        machine = machine_cpu()
        idle = other = None
        if machine is not None and self._machine is not None and machine.total > self._machine.total:
            share = (machine.busy - self._machine.busy) / (machine.total - self._machine.total)
            idle = (1.0 - share) * self.cores
            other = max(0.0, share * self.cores - sum(used.values()) / span)
        b = max(self._batches, 1)
        w = WindowFigures(
            workers=len(pids), wait_share=self._waited / span, consumer_s=self._consumer / b,
            busy_s=self._busy / b, busy_workers=self._busy / span,
            cpu_per_busy=worker_cpu / self._busy if worker_cpu is not None and self._busy else None,
            idle_cores=idle, other_cores=other)
        self.mark(now, pids)
        return w

    def step(self, w: WindowFigures) -> int:
        """The worker count after window ``w`` (recording the change, if any)."""
        n = w.workers
        if not self.ruled:
            self.ruled = True
            target, why = seed_rule(w, self.cores, self.hi)
            if target != n:
                self._record(n, target, f"seed rule: {why}")
            return target
        change = decide(w, self.cores, self.hi)
        if change is None:
            return n
        delta, why = change
        self._record(n, n + delta, why)
        return n + delta

    def _record(self, before: int, after: int, reason: str) -> None:
        self.changes.append(ScaleChange(time.perf_counter() - self._t0, before, after, reason))


def _cpu_times(pids: list[int]) -> dict[int, float]:
    out = {}
    for p in pids:
        s = process_state(p)
        if s is not None:
            out[p] = s.cpu_s
    return out
