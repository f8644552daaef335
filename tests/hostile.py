"""Run one hostile-input case in a child process, bounded in time and memory.

A case is a module-level function ``case(path: str) -> None`` in a test module: it
opens, reads or packs what ``path`` holds the way a user would. The child runs it
under an address-space limit (a runaway allocation becomes a ``MemoryError``, never
the machine's OOM killer) and reports how it ended; the parent kills it at the
deadline. The test then asserts the outcome: a typed :class:`ShardpackError` (or a
CLI exit status with a message) within the time and memory bounds.

Every outcome is appended to the file named by ``SHARDPACK_HOSTILE_LOG`` when set;
``conftest.py`` sets it and prints the totals (cases, handled, worst peak memory,
slowest case) at the end of the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Outcome", "mount_tmpfs", "run_case", "umount"]

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
# The child's own allowance on top of what its imports mapped: generous headroom for
# the address space (arenas, thread stacks), while peak RSS is what tests assert.
_ADDRESS_SPACE_HEADROOM = 2 << 30

_CHILD = textwrap.dedent("""
    import importlib, json, resource, sys, time, traceback
    sys.path[:0] = [{folder!r}, {tests!r}, {root!r}]
    mod = importlib.import_module({module!r})
    import formats, numpy, pyarrow, pyarrow.parquet  # noqa: F401  (imports not timed)
    with open("/proc/self/statm") as f:
        vsize = int(f.read().split()[0]) * resource.getpagesize()
    limit = vsize + {headroom}
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = {{"kind": "ok"}}
    t0 = time.perf_counter()
    try:
        getattr(mod, {func!r})(*{args!r})
    except BaseException as exc:
        from formats.errors import ShardpackError
        out = {{"kind": "typed" if isinstance(exc, ShardpackError) else "untyped",
               "error": type(exc).__name__, "message": str(exc)[:2000],
               "traceback": traceback.format_exc()[-4000:]}}
    out["seconds"] = time.perf_counter() - t0
    # VmHWM, not ru_maxrss: the latter keeps the forking parent's peak across exec.
    with open("/proc/self/status") as f:
        hwm = next(line for line in f if line.startswith("VmHWM:"))
    out["peak_mb"] = int(hwm.split()[1]) / 1024
    print("\\n@@OUTCOME@@" + json.dumps(out), flush=True)
""")


@dataclass
class Outcome:
    """How a case ended.

    Attributes:
        kind: ``typed`` (a ShardpackError), ``untyped`` (any other exception),
            ``ok`` (no error), ``timeout`` or ``crash`` (a signal or an exit
            without a report: SIGBUS, SIGSEGV, the OOM killer).
        error, message: the exception's type name and text.
        seconds: the case's own time (imports not counted).
        peak_mb: the child's peak resident memory.
    """

    case: str
    kind: str
    error: str = ""
    message: str = ""
    traceback: str = ""
    seconds: float = 0.0
    peak_mb: float = 0.0
    returncode: int | None = None

    def __str__(self) -> str:
        return (f"{self.case}: {self.kind} {self.error}: {self.message} "
                f"({self.seconds:.2f} s, {self.peak_mb:.0f} MB, rc={self.returncode})\n"
                f"{self.traceback}")


def run_case(module: str, func: str, *args, timeout: float = 5.0, label: str | None = None,
             env: dict[str, str] | None = None) -> Outcome:
    """Run ``module.func(*args)`` in a child; ``args`` must be literals (repr round-trips).

    Args:
        timeout: the case's deadline, in seconds, on top of the child's start-up.
        label: the case's name in the log (default ``module.func``).
        env: extra environment variables for the child.
    """
    # Test modules live in the folders of tests/ (imported by their own name, as pytest does).
    folder = next(TESTS.rglob(f"{module}.py")).parent
    code = _CHILD.format(folder=str(folder), tests=str(TESTS), root=str(ROOT), module=module,
                         func=func, args=tuple(args), headroom=_ADDRESS_SPACE_HEADROOM)
    name = label or f"{module}.{func}"
    startup = 20.0  # importing numpy/pyarrow on a loaded 2-core CI machine
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout + startup, env={**os.environ, **(env or {})},
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        outcome = Outcome(name, "timeout", seconds=timeout + startup)
    else:
        marker = proc.stdout.rfind("@@OUTCOME@@")
        if marker < 0:
            outcome = Outcome(name, "crash", message=proc.stderr[-2000:],
                              returncode=proc.returncode)
        else:
            report = json.loads(proc.stdout[marker + len("@@OUTCOME@@"):])
            outcome = Outcome(name, returncode=proc.returncode, **report)
            if outcome.seconds > timeout:
                outcome.kind = "timeout"
    log = os.environ.get("SHARDPACK_HOSTILE_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(outcome) | {"traceback": ""}) + "\n")
    return outcome


def mount_tmpfs(point: Path, size: str, *options: str) -> bool:
    """Mount a tmpfs at ``point`` (True: a real full or read-only disk for the test), or
    say why not (False: not root, or mount not permitted here)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    point.mkdir(parents=True, exist_ok=True)
    opts = ",".join((f"size={size}", *options))
    return subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(point)],
                          capture_output=True).returncode == 0


def umount(point: Path) -> None:
    subprocess.run(["umount", str(point)], capture_output=True)
