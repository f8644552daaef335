"""What the kernel says about a process: its scheduling state and CPU time (``/proc``).

Used to tell a stopped worker (SIGSTOP, a debugger, job control) from a slow one
(running, using CPU) and from a blocked one (asleep, using none).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["MachineCpu", "ProcState", "describe", "machine_cpu", "process_state"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

_STATES = {
    "R": "running", "S": "asleep", "D": "waiting on IO (uninterruptible)",
    "T": "stopped (SIGSTOP or job control)", "t": "stopped by a debugger (traced)",
    "Z": "exited, not yet reaped", "X": "dead", "I": "idle",
}


@dataclass(frozen=True)
class ProcState:
    """``state``: the one-letter state of ``/proc/PID/stat``; ``cpu_s``: user + system time."""

    state: str
    cpu_s: float

    @property
    def stopped(self) -> bool:
        return self.state in ("T", "t")


def process_state(pid: int) -> ProcState | None:
    """The state of ``pid``, or None where ``/proc`` cannot say (not Linux, gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    rest = text[text.rfind(")") + 2:].split()
    try:
        return ProcState(rest[0], (int(rest[11]) + int(rest[12])) / _TICK)
    except (IndexError, ValueError):
        return None


def describe(before: ProcState | None, now: ProcState | None, seconds: float) -> str:
    """In words: stopped, busy or idle, from the state and the CPU used between two samples.

    The state letter alone is a snapshot (a sleeping worker is "R" for the moment it
    wakes); the CPU it used over ``seconds`` is what tells slow from stuck.
    """
    if now is None:
        return "in an unknown state (no /proc)"
    if now.stopped or before is None:
        return _STATES.get(now.state, f"in state {now.state!r}")
    used = now.cpu_s - before.cpu_s
    if now.state == "D":
        kind = _STATES["D"]
    elif used >= 0.5 * seconds:
        kind = "busy"
    else:
        kind = "asleep or blocked"
    return f"{kind} ({used:.1f} s of CPU in the last {seconds:.1f} s)"


@dataclass(frozen=True)
class MachineCpu:
    """Cumulative CPU time of the whole machine, in clock ticks summed over all cores:
    ``busy`` is everything but idle and iowait."""

    busy: int
    total: int


def machine_cpu() -> MachineCpu | None:
    """The first line of ``/proc/stat``, or None where there is none."""
    try:
        with open("/proc/stat", "rb") as f:
            head = f.readline().split()
        if not head or head[0] != b"cpu":
            return None
        # user nice system idle iowait irq softirq steal (guest time is inside user)
        ticks = [int(v) for v in head[1:9]]
    except (OSError, ValueError):
        return None
    total = sum(ticks)
    return MachineCpu(total - ticks[3] - ticks[4], total)
