"""``num_workers="auto"``: the worker count that gives the training loop the most batches.

The objective is the consumer's rate: batches the training loop gets per second of
a window (pauses between iterations left out). Workers are not a goal in
themselves: on a machine whose cores the trainer's own Python, other programs or
the hypervisor also take, only a measurement says whether one worker more or one
fewer helps. So the count is found by measuring, starting from the seed's rule.

**Start** (the seed's rule, section 5.1, on measured rates), after the first
window: ideal workers = min(cores, a worker's time per batch ÷ the consumer's time
per batch) × 1.5, capped at the cores when the work is CPU-bound (the workers'
CPU time ÷ busy time at least :data:`CPU_BOUND`, or no idle core) and at twice
the cores when the workers wait on storage.

**Search** (a hill climb with hysteresis; :class:`Climb` holds it, with no clock
and no ``/proc`` so recorded traces replay through it):

* a **probe** moves the count by one and measures one window at the new count:
  one more worker while the consumer waited more than :data:`WAIT_HIGH` of the
  window with the workers busy; one fewer while the consumer did not wait and one
  worker fewer would still be busy less than :data:`SPARE_BUSY` of its time, or
  while other programs compete for the cores and the consumer hardly waited (the
  training loop sets the rate: a worker fewer leaves it more of the contested
  cores; while the loader sets the rate, the fair scheduler gives more workers a
  larger share, which the probe up finds);
* a worker more **stays** only if the rate rose by :data:`GAIN`; a worker fewer
  stays if the rate fell by at most :data:`LOSS` (the same rate with fewer
  processes is better). A kept probe goes on in the same direction; one that did
  not pay is undone, and that direction is not tried again;
* with no direction left the count is **settled**: nothing moves until the
  machine changes. Settling takes at most three windows on a steady workload
  (start, probe, undo), and a settled count does not flip back and forth.

**Re-opening** the search, once a change has held for two windows in a row, each
with its signal named in the change's reason:

* *over-subscription*: other programs' runnable tasks while no core stood idle
  moved by :data:`OTHERS_MOVED` since the count settled. The run queue
  (``procs_running`` of ``/proc/stat``) less the loader's own runnable tasks (its
  threads and its workers), sampled every :data:`RUNQ_EVERY_S` at a delivered
  batch and averaged over the window: demand for the cores that is not ours, on any
  Linux. Chosen by measurement (``python -m scripts.bench_workers --signals``, 2
  cores): 0.04 without other programs at 1 to 4 workers, 2.0 with two CPU burners
  at every count. CPU pressure (``/proc/pressure/cpu``) was rejected: the loader's
  own workers raise it (50 % at 3 workers on 2 cores with nothing else running);
  so was the CPU time other programs got (the machine's busy time less the
  loader's, steal left out): it tells them apart too but shrinks as the loader
  takes a larger share (1.35 cores at 1 worker, 0.69 at 4), and stands in only
  where the run queue cannot be read;
* the settled count's rate moved by :data:`RATE_MOVED` (the workload changed).

A search reopened because other programs' runnable tasks rose by k first probes up
by k workers at once (the fair scheduler's share; see :meth:`Climb._fair_share`),
then goes on one at a time.

Each window starts :data:`SETTLE_BATCHES` batches after a change, so a new
worker's start and the batches already in flight do not count for the new count.
Bounds: 1 to twice the usable cores, and no more than the memory available allows
(:data:`WORKER_BYTES` of headroom per worker). Every change and its reason is kept
in :attr:`WorkerScaler.changes` and shown by the monitor; the windows themselves in
:attr:`WorkerScaler.windows`.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from dataclasses import dataclass, field

from .proc import machine_cpu, process_state, procs_running, running_tasks, worker_pids

__all__ = ["Climb", "ScaleChange", "WindowFigures", "WorkerScaler", "seed_rule",
           "usable_cores"]

WINDOW_S = 1.0
MIN_BATCHES = 8  # a window also holds at least this many batches
SETTLE_BATCHES = 2  # batches after a change before the next window starts
WAIT_HIGH = 0.05
WAIT_LOW = 0.01
IDLE_CORES = 0.75
SPARE_BUSY = 0.6
CPU_BOUND = 0.7  # workers' CPU time ÷ busy time above which the work is CPU-bound
GAIN = 0.03  # a worker more stays only if the rate rose by this share
LOSS = 0.02  # a worker fewer stays if the rate fell by at most this share
CONTENDED = 0.75  # the contest (others' runnable tasks, no core idle) that makes fewer worth a try
NO_IDLE = 0.25  # idle cores below this: none stood idle
OTHERS_MOVED = 0.75  # the contest moving this much since the count settled reopens the search
RATE_MOVED = 0.25  # the settled count's rate moved by this share re-opens the search
WORKER_BYTES = 256 << 20
HISTORY = 256  # windows kept in WorkerScaler.windows
RUNQ_EVERY_S = 0.1  # the run queue is sampled at most this often (at a delivered batch)


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
    """What one window measured (shares are of the window's wall time).

    Attributes:
        workers: workers running during the window.
        rate: batches the consumer got per second.
        wait_share: the consumer's time blocked in ``next()``.
        consumer_s: the consumer's mean time per batch outside ``next()`` (0: none seen).
        busy_s: the workers' mean wall time per batch.
        busy_workers: worker-equivalents busy (sum of busy time ÷ window).
        cpu_per_busy: the workers' CPU time ÷ their busy time (None: unknown).
        idle_cores: cores the machine left idle (None: unknown).
        other_cores: cores used by processes other than the loader's, steal left
            out (None: unknown).
        steal_cores: cores the hypervisor took (None: unknown).
        others_runnable: the machine's run queue less the loader's runnable tasks,
            the mean of samples taken through the window (None: unknown).
    """

    workers: int
    rate: float
    wait_share: float
    consumer_s: float
    busy_s: float
    busy_workers: float
    cpu_per_busy: float | None
    idle_cores: float | None
    other_cores: float | None
    steal_cores: float | None = None
    others_runnable: float | None = None

    @property
    def contest(self) -> float:
        """Other programs' runnable tasks while no core stood idle: the over-subscription
        signal (0 when a core stood idle or the machine's figures are unknown). Where
        the run queue was not sampled, the cores other programs took stand in."""
        if self.idle_cores is None or self.idle_cores >= NO_IDLE:
            return 0.0
        if self.others_runnable is not None:
            return self.others_runnable
        return self.other_cores or 0.0


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


def _others(w: WindowFigures, cores: int) -> str:
    if w.others_runnable is None:
        return f"other programs took {w.contest:.1f} of {cores} cores with none idle"
    return (f"other programs kept {w.contest:.1f} tasks runnable (the run queue less the "
            f"loader's) with none of {cores} cores idle")


@dataclass
class Climb:
    """The search for the count that gives the best rate (see the module docstring).

    Pure: :meth:`step` takes one window's figures and returns the change it calls for,
    so a trace of windows replays through it exactly.

    Args:
        cores: usable cores.
        hi: the most workers allowed.
    """

    cores: int
    hi: int
    ruled: bool = False  # the seed's rule has set the count
    rates: dict[int, float] = field(default_factory=dict)  # since the search (re)opened
    tried: set[int] = field(default_factory=set)  # directions undone since then
    probe: tuple[int, int, float] | None = None  # (from count, direction, contest then)
    settled: tuple[int, float, float] | None = None  # (count, rate, contest) when settled
    pending: str | None = None  # a settled count's change seen in one window, not yet two

    def step(self, w: WindowFigures) -> tuple[int, str] | None:
        """The new worker count after window ``w`` and why, or None to keep it."""
        n = w.workers
        if not self.ruled:
            self.ruled = True
            target, why = seed_rule(w, self.cores, self.hi)
            self.rates[n] = w.rate
            if target != n:
                return target, f"seed rule: {why}"
            return self._next(w, None, f"seed rule: {why}")
        if self.probe is not None:
            return self._judge(w)
        if self.settled is not None:
            reopen = self._changed(w)
            # A change must hold for two windows: one noisy window opens no search.
            self.pending, confirmed = reopen, reopen is not None and self.pending is not None
            if not confirmed:
                return None
            stride = self._fair_share(w)
            self.settled = self.pending = None
            self.rates, self.tried = {n: w.rate}, set()
            return self._next(w, None, reopen, stride)
        self.rates[n] = w.rate
        return self._next(w, None, "")

    def _judge(self, w: WindowFigures) -> tuple[int, str] | None:
        """The window after a probe: keep the new count, or go back."""
        base, d, contest = self.probe
        self.probe = None
        n = w.workers
        if abs(w.contest - contest) >= OTHERS_MOVED:
            # The machine changed during the probe: its window compares nothing.
            self.rates, self.tried = {n: w.rate}, set()
            return self._next(w, None, f"{_others(w, self.cores)} (was {contest:.1f}): "
                                       "measuring again")
        before = self.rates.get(base, 0.0)
        self.rates[n] = w.rate
        change = w.rate / before - 1.0 if before > 0 else 0.0
        kept = change >= GAIN if d > 0 else change >= -LOSS
        said = (f"{n} workers gave {w.rate:.1f} batches/s, {change:+.1%} on {base}'s "
                f"{before:.1f}")
        if kept:
            return self._next(w, d, f"{said}: keeping {n}")
        self.tried.add(d)
        bar = f"not the {GAIN:.0%} a worker more must bring" if d > 0 else \
              f"more than the {LOSS:.0%} a worker fewer may cost"
        return base, f"{said}, {bar}: back to {base}"

    def _next(self, w: WindowFigures, prefer: int | None, said: str,
              stride: int = 1) -> tuple[int, str] | None:
        """Probe from ``w.workers`` (``prefer``: the direction that just paid), or settle.
        A probe up adds ``stride`` workers (capped at the bound); one down retires one."""
        n = w.workers
        d, why = self._direction(w, prefer)
        if d == 0:
            self.settled = (n, w.rate, w.contest)
            return None
        to = min(n + stride, self.hi) if d > 0 else n - 1
        self.probe = (n, d, w.contest)
        words = f"{said}; " if said else ""
        return to, f"{words}{why}: trying {to}"

    def _fair_share(self, w: WindowFigures) -> int:
        """Workers a search reopened by other programs' demand first probes up by.

        Under the fair scheduler each runnable task gets an equal share of the cores,
        so k more tasks of other programs take the loader's share unless it runs k
        more workers; probing one at a time would judge each step on one noisy window
        and stop at the first that gained under :data:`GAIN` (measured with two
        burners on 2 cores: 2 workers 1,052 img/s, 3: 1,149, 4: 1,200)."""
        rose = w.contest - self.settled[2]
        return max(1, round(rose)) if rose >= OTHERS_MOVED else 1

    def _direction(self, w: WindowFigures, prefer: int | None) -> tuple[int, str]:
        n = w.workers
        up = down = None
        if n < self.hi and +1 not in self.tried and w.wait_share > WAIT_HIGH \
                and w.busy_workers >= 0.75 * n:
            up = f"the consumer waited {w.wait_share:.0%} of the window with the workers busy"
        if n > 1 and -1 not in self.tried:
            if w.wait_share < WAIT_LOW and w.busy_workers < SPARE_BUSY * (n - 1):
                down = (f"the consumer did not wait and the workers were busy "
                        f"{w.busy_workers:.1f} of {n}")
            elif w.contest >= CONTENDED and w.wait_share < WAIT_HIGH and prefer is None:
                # The training loop, not the loader, sets the rate: a worker fewer
                # leaves it more of the contested cores.
                down = (f"{_others(w, self.cores)} and the consumer waited "
                        f"{w.wait_share:.0%}: a worker fewer leaves the training loop more")
        if prefer == +1 and up:
            return +1, up
        if prefer == -1 and down:
            return -1, down
        if prefer is None and up:
            return +1, up
        if prefer is None and down:
            return -1, down
        return 0, ""

    def _changed(self, w: WindowFigures) -> str | None:
        """Why the settled count's search opens again, or None."""
        n, rate, contest = self.settled
        if abs(w.contest - contest) >= OTHERS_MOVED:
            return f"{_others(w, self.cores)} (was {contest:.1f} when {n} workers settled)"
        if rate > 0 and abs(w.rate / rate - 1.0) >= RATE_MOVED:
            return (f"the rate moved from {rate:.1f} to {w.rate:.1f} batches/s at {n} "
                    "workers (the workload changed)")
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
        self.climb = Climb(self.cores, self.hi)
        self.changes: list[ScaleChange] = []
        self.windows: deque[WindowFigures] = deque(maxlen=HISTORY)
        self._t0 = time.perf_counter()
        self._moved = True  # the first window starts once the workers deliver
        self.mark(self._t0, [])

    @property
    def ruled(self) -> bool:
        return self.climb.ruled

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
        """Start a window with workers ``pids``: at ``now``, or, after a change of the
        count (and at the start), :data:`SETTLE_BATCHES` batches later, so a new
        worker's start and the batches already in flight count for no window."""
        self._pids = list(pids)
        self._settle, self._moved = (SETTLE_BATCHES if self._moved else 0), False
        self._open(now)

    def _open(self, now: float) -> None:
        self._since = self._last = now
        self._waited = self._consumer = self._busy = 0.0
        self._batches = 0
        self._runq: list[int] = []
        self._runq_at = now
        self._machine = machine_cpu()
        # Before the first change the loader has not named its workers: its children.
        self._cpu = _cpu_times([os.getpid(), *(self._pids or worker_pids())])

    def on_batch(self, waited_s: float, consumer_s: float, busy_s: float) -> None:
        """One delivered batch: how long ``next()`` waited, the consumer's time
        since the previous ``next()`` returned, the worker's busy time."""
        now = time.perf_counter()
        if self._settle:
            self._settle -= 1
            if not self._settle:
                self._open(now)
            return
        self._waited += waited_s
        self._consumer += consumer_s
        self._busy += busy_s
        self._batches += 1
        self._last = now
        if now - self._runq_at >= RUNQ_EVERY_S:
            self._runq_at = now
            queue = procs_running()
            if queue is not None:
                self._runq.append(queue - running_tasks(self._pids or worker_pids()))

    def due(self, now: float) -> bool:
        return (not self._settle and now - self._since >= WINDOW_S
                and self._batches >= MIN_BATCHES)

    def window(self, now: float, pids: list[int]) -> WindowFigures:
        """The figures of the window ending ``now`` (then a new window starts)."""
        span = now - self._since
        cpu = _cpu_times([os.getpid(), *pids])
        used = {p: c - self._cpu.get(p, 0.0) for p, c in cpu.items()}
        worker_cpu = sum(used.get(p, 0.0) for p in pids) if len(cpu) == len(pids) + 1 else None
        machine = machine_cpu()
        idle = other = steal = None
        if machine is not None and self._machine is not None and machine.total > self._machine.total:
            ticks = machine.total - self._machine.total
            share = (machine.busy - self._machine.busy) / ticks
            idle = (1.0 - share) * self.cores
            steal = (machine.steal - self._machine.steal) / ticks * self.cores
            other = max(0.0, share * self.cores - sum(used.values()) / span - steal)
        b = max(self._batches, 1)
        w = WindowFigures(
            workers=len(pids), rate=self._batches / span, wait_share=self._waited / span,
            consumer_s=self._consumer / b, busy_s=self._busy / b, busy_workers=self._busy / span,
            cpu_per_busy=worker_cpu / self._busy if worker_cpu is not None and self._busy else None,
            idle_cores=idle, other_cores=other, steal_cores=steal,
            others_runnable=max(0.0, sum(self._runq) / len(self._runq)) if self._runq else None)
        self.windows.append(w)
        self.mark(now, pids)
        return w

    def step(self, w: WindowFigures) -> int:
        """The worker count after window ``w`` (recording the change, if any)."""
        change = self.climb.step(w)
        if change is None or change[0] == w.workers:
            return w.workers
        target, why = change
        self._moved = True
        self.changes.append(ScaleChange(time.perf_counter() - self._t0, w.workers, target, why))
        return target


def _cpu_times(pids: list[int]) -> dict[int, float]:
    out = {}
    for p in pids:
        s = process_state(p)
        if s is not None:
            out[p] = s.cpu_s
    return out
