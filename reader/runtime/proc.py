"""What the kernel says about CPU use: the machine's, a process's, and its scheduling state.

Everything here reads ``/proc`` (Linux) and returns None where it cannot (another
system, a process gone), so callers degrade to "unknown" instead of failing.

* :func:`machine_cpu`: the machine's busy and total time (``/proc/stat``);
* :func:`procs_running` and :func:`running_tasks`: the machine's run queue and how
  much of it is the loader's (its threads and its workers);
* :func:`process_state`: a process's state letter, CPU time and time spent waiting
  for a CPU, to tell a stopped worker (SIGSTOP, a debugger) from a slow one (using
  CPU, or runnable and waiting for it on a loaded machine) and a blocked one
  (asleep, using none): :func:`describe` says which in words;
* :class:`ProcCpu`: the machine's time and the loader's (this process and its
  workers), from which the monitor derives the share other programs take.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["CpuTicks", "MachineCpu", "ProcCpu", "ProcState", "describe", "machine_cpu",
           "process_state", "process_ticks", "procs_running", "running_tasks", "worker_pids"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

_STATES = {
    "R": "running", "S": "asleep", "D": "waiting on IO (uninterruptible)",
    "T": "stopped (SIGSTOP or job control)", "t": "stopped by a debugger (traced)",
    "Z": "exited, not yet reaped", "X": "dead", "I": "idle",
}


@dataclass(frozen=True)
class MachineCpu:
    """Cumulative CPU time of the whole machine, in clock ticks summed over all cores:
    ``busy`` is everything but idle and iowait; ``steal`` (inside ``busy``) is what
    the hypervisor gave other guests."""

    busy: int
    total: int
    steal: int = 0


def machine_cpu(root: str = "/proc") -> MachineCpu | None:
    """The first line of ``/proc/stat``, or None where there is none."""
    try:
        with open(f"{root}/stat", "rb") as f:
            head = f.readline().split()
        if not head or head[0] != b"cpu":
            return None
        # user nice system idle iowait irq softirq steal (guest time is inside user)
        ticks = [int(v) for v in head[1:9]]
    except (OSError, ValueError):
        return None
    total = sum(ticks)
    return MachineCpu(total - ticks[3] - ticks[4], total, ticks[7])


def procs_running(root: str = "/proc") -> int | None:
    """Tasks runnable on the machine now (``procs_running`` of ``/proc/stat``), or None."""
    try:
        with open(f"{root}/stat", "rb") as f:
            for line in f:
                if line.startswith(b"procs_running"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def running_tasks(pids: Iterable[int], root: str = "/proc") -> int:
    """Tasks runnable now among this process's threads and the main threads of ``pids``."""
    n = 0
    try:
        tids = os.listdir(f"{root}/self/task")
    except OSError:
        tids = []
    for tid in tids:
        rest = _stat_fields(tid, f"{root}/self/task")
        n += bool(rest) and rest[0] == b"R"
    for pid in pids:
        rest = _stat_fields(pid, root)
        n += bool(rest) and rest[0] == b"R"
    return n


def _stat_fields(pid: int | str, root: str) -> list[bytes] | None:
    """``/proc/PID/stat`` from field 3 (the state) on, or None."""
    try:
        with open(f"{root}/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    at = text.rfind(b")")
    return text[at + 2:].split() if at >= 0 else None


def process_ticks(pid: int, children: bool = False, root: str = "/proc") -> int | None:
    """CPU time of ``pid`` in clock ticks (user + system; with ``children``, plus that of
    its reaped children), or None."""
    rest = _stat_fields(pid, root)
    try:
        return sum(int(v) for v in rest[11:15 if children else 13]) if rest else None
    except ValueError:
        return None


@dataclass(frozen=True)
class ProcState:
    """``state``: the one-letter state of ``/proc/PID/stat``; ``cpu_s``: user + system
    time; ``wait_s``: time runnable but waiting for a CPU (the scheduler's run-queue
    wait, ``/proc/PID/schedstat``), None where the kernel does not keep it."""

    state: str
    cpu_s: float
    wait_s: float | None = None

    @property
    def stopped(self) -> bool:
        return self.state in ("T", "t")


def _run_queue_wait_s(pid: int, root: str) -> float | None:
    """Seconds ``pid`` (its main thread) was runnable but not running, or None."""
    try:
        with open(f"{root}/{pid}/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9  # on-CPU ns, run-queue ns, timeslices
    except (OSError, IndexError, ValueError):
        return None


def process_state(pid: int, root: str = "/proc") -> ProcState | None:
    """The state of ``pid``, or None where ``/proc`` cannot say (not Linux, gone)."""
    rest = _stat_fields(pid, root)
    try:
        return ProcState(rest[0].decode("ascii", "replace"),
                         (int(rest[11]) + int(rest[12])) / _TICK,
                         _run_queue_wait_s(pid, root)) if rest else None
    except (IndexError, ValueError):
        return None


def describe(before: ProcState | None, now: ProcState | None, seconds: float) -> str:
    """In words: stopped, busy or idle, from the state and the CPU used between two samples.

    The state letter alone is a snapshot (a sleeping worker is "R" for the moment it
    wakes); the time it wanted the CPU over ``seconds`` is what tells slow from stuck:
    the CPU it used, plus the time it waited for one where the kernel says (on a
    loaded machine a spinning worker may get a small share: it is busy, not asleep).
    """
    if now is None:
        return "in an unknown state (no /proc)"
    if now.stopped or before is None:
        return _STATES.get(now.state, f"in state {now.state!r}")
    used = now.cpu_s - before.cpu_s
    waited = (0.0 if now.wait_s is None or before.wait_s is None
              else max(now.wait_s - before.wait_s, 0.0))
    if now.state == "D":
        kind = _STATES["D"]
    elif used + waited >= 0.5 * seconds:
        kind = "busy"
    else:
        kind = "asleep or blocked"
    starved = (f", and {waited:.1f} s waiting for one: the machine is loaded"
               if kind == "busy" and waited >= 0.25 * seconds else "")
    return f"{kind} ({used:.1f} s of CPU in the last {seconds:.1f} s{starved})"


class CpuTicks(NamedTuple):
    """Cumulative CPU time in clock ticks, summed over all cores.

    Attributes:
        busy: the machine's non-idle time (everything but idle and iowait).
        total: the machine's time, busy and idle.
        loader: this process's time, its reaped children's, and its live
            children's (the loader's workers).
    """

    busy: int
    total: int
    loader: int


def worker_pids() -> list[int]:
    # The loader's workers are this process's multiprocessing children; the list
    # also reaps finished ones, as every Process.start() does.
    return [p.pid for p in multiprocessing.active_children() if p.pid is not None]


class ProcCpu:
    """Reads :class:`CpuTicks` from ``/proc`` (Linux); returns None where it cannot.

    The machine's time is the first line of ``/proc/stat``. The loader's is
    ``utime + stime + cutime + cstime`` of ``/proc/<own pid>/stat`` plus
    ``utime + stime`` of each live child's: a worker that exits and is reaped
    moves from the second sum to the first, so the total never drops. Children
    that are not the loader's (a training script's own subprocesses started
    with multiprocessing) count as the loader's.

    Why the reads are ordered and repeated: a child reaped (``waitpid``, by
    ``multiprocessing`` or a pool's ``join``) between reading ``cutime`` and
    reading the child would be counted in neither sum, and its whole lifetime
    would then land in the next interval at once (loader above the machine's busy
    time, the split above 100 %). So the children are listed first (listing may
    reap), ``cutime`` is read before and after the children, and the reading is
    repeated while a reap changed it. The machine's time is read last, so its
    window holds the loader's.

    Args:
        pids: returns the child processes to count (default: this process's
            live multiprocessing children).
        root: the proc file system's mount point.
    """

    def __init__(self, pids: Callable[[], Iterable[int]] | None = None, root: str = "/proc") -> None:
        self.pids = pids or worker_pids
        self.root = root

    def __call__(self) -> CpuTicks | None:
        """The ticks now, or None without a readable ``/proc``."""
        me = os.getpid()
        for _ in range(3):
            pids = list(self.pids())  # may reap: before cutime is read
            before = _own_ticks(me, self.root)
            if before is None:
                return None
            live = sum(process_ticks(pid, root=self.root) or 0 for pid in pids)
            after = _own_ticks(me, self.root)
            if after is None:
                return None
            if after[1] == before[1]:  # no child reaped while the children were read
                break
        machine = machine_cpu(self.root)
        if machine is None:
            return None
        return CpuTicks(machine.busy, machine.total, after[0] + after[1] + live)


def _own_ticks(pid: int, root: str) -> tuple[int, int] | None:
    """``(utime + stime, cutime + cstime)`` of ``pid``, or None."""
    rest = _stat_fields(pid, root)
    try:
        return ((int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14]))
                if rest else None)
    except (IndexError, ValueError):
        return None
