"""Across ranks: each rank's figures in a shared folder; rank 0 names the slowest rank.

In a job of many ranks the step time is the slowest rank's, and each rank's monitor
sees only itself. ``Monitor(ranks="/shared/run1")`` on every rank (the rank and world
size are the Loader's) makes them compare notes.

Protocol (RANK FOLDER):

1. At each of its reports, rank ``r`` writes ``rank-<r as 5 digits>.json`` in the
   folder: its rank, world size, name, report number, interval length, wall-clock
   time, the interval's figures (the report's ``current``, without the per-worker
   breakdown) and its verdict. A temporary file, then ``os.replace``: a reader sees
   the old file or the new one, never half of one. File names come from rank numbers
   only.
2. Rank 0, at each of its reports, reads the files of ranks ``0 .. world_size - 1``.
   A file that is missing, unreadable, not such a record, of another world size, or
   older than :data:`STALE_INTERVALS` of its writer's intervals (by wall clock: ranks
   on several machines need clocks within a second or so of each other, as NTP
   keeps them) counts as a rank not reporting.
3. Who is slowest: each rank's *loader capacity*, the samples its builders make
   per second of their busy time, times their number (:func:`loader_capacity`;
   with GPU decode, no more than its stage in the main process allows):
   what the loader could deliver if the trainer never held it back. Samples
   delivered per second are no measure: in a synchronized job every rank steps at
   the slowest one's pace. The slowest rank is the one of lowest capacity; it is a
   straggler when :data:`STRAGGLER_PCT` % or more below the median of the ranks
   reporting. Its share of time waiting in ``next()`` and its verdict come with it.
4. Rank 0's report gets one line (``ranks: ...``) and its figures a ``ranks`` dict
   (:func:`compare`); every rank's figures carry its ``rank``.

A write that fails (read-only or full folder, folder removed) logs one warning and
stops this rank's sharing; the monitor goes on.

Why files and not a ``torch.distributed`` all-gather: a collective must be entered
by every rank in the same order, while each monitor reports on its own clock, at
its own step; a gather there would stall training or deadlock, and the rank that
would arrive late is the very straggler. A small file per rank and interval waits
for nobody.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from formats.errors import ArgumentError, ArgumentTypeError
from formats.files import atomic_write_bytes

from ..options import SamplerOptions

__all__ = ["STALE_INTERVALS", "STRAGGLER_PCT", "RankFolder", "compare", "loader_capacity",
           "rank_file"]

log = logging.getLogger(__name__)

#: A rank's file older than this many of its intervals counts as not reporting.
STALE_INTERVALS = 3
#: The slowest rank is a straggler this far (percent) or more below the median capacity.
STRAGGLER_PCT = 20.0

_KIND = "shardpack monitor rank"


def rank_file(rank: int) -> str:
    """The file name of ``rank``'s figures in the folder."""
    return f"rank-{rank:05d}.json"


def loader_capacity(figures: dict[str, Any]) -> float | None:
    """Samples per second the loader's builders make while busy, all of them together:
    ``samples x max(num_workers, 1) / busy seconds``; None without busy time.

    With GPU decode (``decode_device="cuda"``) the GPU stage decodes its share of every
    batch in the main process, one batch after another, so it bounds the rate too:
    ``samples / GPU stage seconds``, derived from ``gpu_decode_pct`` and ``gpu_img_s``;
    the capacity is the lower of the two.

    Args:
        figures: one interval's figures (a report's ``current``).
    """
    busy_ms, batches = figures.get("busy_ms"), figures.get("batches") or 0
    samples = figures.get("samples") or 0
    if not busy_ms or not batches or not samples:
        return None
    workers = samples * max(figures.get("num_workers") or 0, 1) / (busy_ms * batches / 1e3)
    pct, gpu = figures.get("gpu_decode_pct"), figures.get("gpu_img_s")
    if pct and gpu:
        return min(workers, gpu * 100.0 / pct)
    return workers


def compare(entries: dict[int, dict[str, Any]], world_size: int,
            missing: list[int] | None = None) -> dict[str, Any]:  # fmt: skip
    """Name the slowest of the ranks reporting (step 3 of RANK FOLDER).

    Args:
        entries: rank -> its file's contents (``figures``, ``diagnosis``), the ranks
            reporting.
        world_size: ranks in the job.
        missing: ranks not reporting (default: those of ``range(world_size)`` not in
            ``entries``).

    Returns:
        ``{"world_size", "reporting", "missing", "slowest", "straggler", "message"}``:
        ``slowest`` (None when no rank has a capacity) holds ``rank``,
        ``loader_samples_per_s``, ``median_loader_samples_per_s``, ``behind_pct``,
        ``samples_per_s``, ``queue_wait_pct`` and ``diagnosis``; ``straggler`` says
        whether it is :data:`STRAGGLER_PCT` % or more behind; ``message`` is the
        report's line.
    """
    if missing is None:
        missing = [r for r in range(world_size) if r not in entries]
    caps = {r: c for r, e in entries.items()
            if (c := loader_capacity(e.get("figures") or {})) is not None}  # fmt: skip
    out: dict[str, Any] = {"world_size": world_size, "reporting": len(entries),
                           "missing": sorted(missing), "slowest": None, "straggler": False}
    if caps:
        rank = min(caps, key=lambda r: (caps[r], r))
        median = statistics.median(caps.values())
        behind = 100.0 * (1.0 - caps[rank] / median) if median > 0 else 0.0
        fig = entries[rank].get("figures") or {}
        out["slowest"] = {
            "rank": rank, "loader_samples_per_s": caps[rank],
            "median_loader_samples_per_s": median, "behind_pct": behind,
            "samples_per_s": fig.get("samples_per_s"),
            "queue_wait_pct": fig.get("queue_wait_pct"),
            "diagnosis": entries[rank].get("diagnosis") or {},
        }  # fmt: skip
        out["straggler"] = len(caps) > 1 and behind >= STRAGGLER_PCT
    out["message"] = _line(out)
    return out


def _line(c: dict[str, Any]) -> str:
    head = f"ranks: {c['reporting']} of {c['world_size']} reporting"
    missing = c["missing"]
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (f" (+{len(missing) - 8})" if len(missing) > 8 else "")
        head += f" (not: {shown})"
    s = c["slowest"]
    if s is None:
        return head + "; no loader figures yet"
    d = s["diagnosis"]
    verdict = (d.get("kind") or "?") + (f" ({d['cause']})" if d.get("cause") else "")
    wait = s["queue_wait_pct"]
    waits = f", waits {wait:.0f}% in next()" if wait is not None else ""
    if c["reporting"] < 2:
        return f"{head}; rank {s['rank']}'s loader makes {s['loader_samples_per_s']:.0f} samples/s"
    figure = (f"its loader makes {s['loader_samples_per_s']:.0f} samples/s, "
              f"{s['behind_pct']:.0f}% below the median {s['median_loader_samples_per_s']:.0f}")
    if c["straggler"]:
        return f"{head}; straggler: rank {s['rank']}: {figure}{waits}; {verdict}"
    return (f"{head}; slowest rank {s['rank']}: {figure}: no straggler (within "
            f"{STRAGGLER_PCT:.0f}%)")


class RankFolder:
    """This rank's side of the RANK FOLDER protocol (see the module docstring).

    Args:
        folder: the shared folder (made if missing).
        clock: wall-clock seconds (``time.time``), comparable across machines.

    Raises:
        ArgumentError: the folder is a file, or cannot be made.
    """

    def __init__(self, folder: str | os.PathLike, *,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.folder = os.fspath(folder) if isinstance(folder, (str, os.PathLike)) else None
        if not isinstance(self.folder, str) or not self.folder:
            raise ArgumentTypeError(f"monitor ranks: expected a folder path, found {folder!r}")
        if os.path.exists(self.folder) and not os.path.isdir(self.folder):
            raise ArgumentError(f"monitor ranks {self.folder}: exists and is not a folder")
        try:
            os.makedirs(self.folder, exist_ok=True)
        except OSError as exc:
            raise ArgumentError(f"monitor ranks {self.folder}: cannot make the folder "
                                f"({exc.strerror})") from None
        self._clock = clock
        self.rank: int | None = None
        self.world_size: int | None = None
        self.stopped: str | None = None  # why this rank stopped writing, or None
        self.last: dict[str, Any] | None = None  # rank 0: the last comparison

    def set_rank(self, rank: int, world_size: int) -> None:
        """This process's rank and the job's world size (the Loader's)."""
        for what, value in (("rank", rank), ("world_size", world_size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ArgumentError(f"monitor ranks: {what} must be an int, not {value!r}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ArgumentError(f"monitor ranks: rank {rank} is not in [0, world_size={world_size})")
        self.rank, self.world_size = rank, world_size

    def exchange(self, stats: dict[str, Any]) -> dict[str, Any] | None:
        """Write this rank's figures (step 1); on rank 0, read every rank's and
        compare them (steps 2 and 3).

        Args:
            stats: the report's figures (``Monitor.stats()`` form).

        Returns:
            On rank 0 the comparison (:func:`compare`), else None.
        """
        if self.rank is None:
            # No Loader told us: the environment torchrun sets, as the Loader reads it.
            opts = SamplerOptions()
            self.set_rank(opts.rank, opts.world_size)
        now = self._clock()
        current = {k: v for k, v in (stats.get("current") or {}).items() if k != "per_worker"}
        mine = {"kind": _KIND, "rank": self.rank, "world_size": self.world_size,
                "name": stats.get("name"), "report": stats.get("reports"),
                "interval_s": stats.get("interval_s"), "time": now, "figures": current,
                "diagnosis": stats.get("diagnosis")}  # fmt: skip
        if self.stopped is None:
            self._write(mine)
        if self.rank != 0:
            return None
        entries, missing = {0: mine}, []
        for r in range(1, self.world_size):
            entry = self._read(r, now)
            if entry is None:
                missing.append(r)
            else:
                entries[r] = entry
        self.last = compare(entries, self.world_size, missing)
        return self.last

    def _write(self, mine: dict[str, Any]) -> None:
        path = os.path.join(self.folder, rank_file(self.rank))
        try:
            atomic_write_bytes(Path(path), json.dumps(mine, sort_keys=True).encode(),
                               durable=False)
        except OSError as exc:
            self.stopped = exc.strerror or str(exc)
            log.warning("monitor ranks %s: cannot write %s (%s); this rank stops sharing its "
                        "figures (training goes on)", self.folder, rank_file(self.rank),
                        self.stopped)  # fmt: skip

    def _read(self, rank: int, now: float) -> dict[str, Any] | None:
        """Rank ``rank``'s figures, or None when it counts as not reporting (step 2)."""
        path = os.path.join(self.folder, rank_file(rank))
        try:
            with open(path, encoding="utf-8") as fh:
                entry = json.loads(fh.read(1 << 20))
        except (OSError, ValueError):
            return None
        if (not isinstance(entry, dict) or entry.get("kind") != _KIND
                or entry.get("rank") != rank or entry.get("world_size") != self.world_size
                or not isinstance(entry.get("figures"), dict)):
            return None
        at, every = entry.get("time"), entry.get("interval_s")
        if not isinstance(at, (int, float)) or not isinstance(every, (int, float)):
            return None
        if now - at > STALE_INTERVALS * every + 1.0:
            return None
        return entry
