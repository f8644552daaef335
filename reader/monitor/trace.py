"""The monitor's timeline: the last batches as a Chrome trace (Perfetto, ``chrome://tracing``).

``Monitor(trace="trace.json")`` keeps the timings of the last :data:`TRACE_BATCHES`
delivered batches and writes them in the Chrome trace event format (a JSON object
with a ``traceEvents`` list), which https://ui.perfetto.dev and ``chrome://tracing``
open. An interval table averages; a timeline shows the one worker stalled on one
shard, the page-cache miss burst, the trainer's pause, the slot waiting to come back.

Tracks (one trace process per loader, ``pid`` the main process's id; its "threads"
are the tracks, named by metadata events):

* ``main: next()`` (tid 1): each ``next()`` call, and inside it ``return slots,
  issue`` (slots handed back to the ring once their leases are freed and their
  device copies done, and the next requests issued to the workers), ``wait``
  (blocked on the batch) and ``deliver`` (the batch's views leased, its device
  copy queued); with ``decode_device="cuda"``, ``GPU decode`` inside ``deliver``:
  the GPU stage's time as measured (:attr:`BatchTiming.gpu_decode_s`: CUDA events,
  read at the delivery that found them done), drawn from the delivery's start as
  one block, cut at its end.
* ``main: H2D copy`` (tid 2, ``device="cuda"``): the host-to-device copy time the
  CUDA events measured, drawn at the delivery that read it (the copy itself runs
  on the copy stream; its place on the host clock is not known).
* ``builder (main process)`` (tid 3): batches built in the main process
  (``num_workers=0``, raw mode), inside the ``wait`` that built them.
* ``worker N`` (tid 10 + N): each batch the worker built, ``batch K`` from its
  start to its end in the worker, with ``io``, ``decode``, ``transform`` and
  ``assemble`` inside it: the batch's total of each stage laid end to end in that
  order, not where each happened (decode and transform alternate record by
  record; the reads that gather scalar fields come first and count as assemble).
* Markers (instant events): the monitor's notes (the worker count changed, and
  why) and each change of the verdict shown.

Clock: ``time.perf_counter()``, which on Linux is ``CLOCK_MONOTONIC``, one clock in
every process of the machine, so a worker's span and the main process's ``next()``
share one time axis (``reader.runtime.timing``); timestamps are whole microseconds of
that clock, so traces of several loaders (or ranks on one machine) line up.

Bound: a ring of the last :data:`TRACE_BATCHES` batches (about 850 bytes of JSON
each, so under 10 MB in all), whatever the run's length or the batch rate: a count,
not a time span, so the file's size does not depend on how fast batches come; and
the last :data:`TRACE_MARKERS` markers inside the batches' span.

Cost: ``on_batch`` appends one tuple to a deque (a fraction of a microsecond). A
batch is formatted once, when a write first includes it, and its text is kept in
the ring; a write joins the ring's texts and writes the file.

Writing (TRACE FILE):

1. At construction the path is checked and the trace written once (empty): a
   folder, a symlink, a missing folder or one this process cannot write is refused
   then, with an ``ArgumentError`` naming the path, before any batch is spent.
2. Then at the monitor's reports (at most every :data:`WRITE_EVERY_S` seconds), at
   its ``flush()`` and ``close()``, and at the interpreter's exit: the whole file
   to a new temporary file in the same folder (``O_EXCL | O_NOFOLLOW``), then
   ``os.replace`` onto the path: a reader (or a crash) sees the old file or the
   new one, never half of one. No fsync: the trace is a diagnostic, and a process
   that dies leaves the last complete file.
3. The path is the user's to replace, like a log file; if it has become a folder or
   a symlink, or a write fails (full disk, read-only folder, folder removed), the
   trace logs one warning, removes its temporary file, drops its ring and stops:
   a trace never stops training.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from formats.errors import ArgumentError, ArgumentTypeError
from formats.files import atomic_write_bytes

__all__ = ["TRACE_BATCHES", "TRACE_MARKERS", "WRITE_EVERY_S", "Trace", "check_trace_path"]

log = logging.getLogger(__name__)

#: Batches kept in the ring (the file holds the last this many).
TRACE_BATCHES = 10_000
#: Markers kept (notes and verdict changes).
TRACE_MARKERS = 1_000
#: Seconds between the writes made at the monitor's reports.
WRITE_EVERY_S = 10.0

MAIN, H2D, BUILDER, WORKER0 = 1, 2, 3, 10
_STAGES = (("io", "io_s"), ("decode", "decode_s"), ("transform", "transform_s"),
           ("assemble", "assemble_s"))  # fmt: skip


def check_trace_path(path: str | os.PathLike) -> str:
    """The trace path as a string, or an ``ArgumentError`` saying why it cannot be one.

    Refused: a folder, a symlink (the file is replaced, never written through a link),
    a path whose folder is missing or is not a folder.
    """
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text:
        raise ArgumentTypeError(f"monitor trace: expected a file path, found {path!r}")
    try:
        st = os.lstat(text)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ArgumentError(f"monitor trace {text}: cannot look at it ({exc.strerror})") from None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise ArgumentError(f"monitor trace {text}: is a symlink; name the file itself (the "
                            "trace replaces its file and never writes through a link)")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ArgumentError(f"monitor trace {text}: exists and is not a file; expected a "
                            "file path such as trace.json")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise ArgumentError(f"monitor trace {text}: its folder {folder} does not exist")
    return text


class Trace:
    """The last batches of one loader, written as a Chrome trace (see the module docstring).

    Not thread-safe: called from the consumer's thread, like the monitor.

    Args:
        path: the trace file (``.json``); replaced at each write.
        name: the loader's name, in the process name of the trace.
        batches: batches kept (the ring's size).
        every: seconds between the writes :meth:`tick` makes.
        clock: ``time.perf_counter`` (the clock of the batch timings); for tests.

    Raises:
        ArgumentError: the path is refused, or the trace cannot be written there.
    """

    def __init__(self, path: str | os.PathLike, *, name: str | None = None,
                 batches: int = TRACE_BATCHES, every: float = WRITE_EVERY_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:  # fmt: skip
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
            raise ArgumentError(f"monitor trace: expected batches >= 1, found {batches!r}")
        self.path = check_trace_path(path)
        self.name = name
        self.rank: int | None = None
        self.every = every
        self._clock = clock
        self._pid = os.getpid()
        self._pending: deque[tuple[float, Any]] = deque(maxlen=batches)
        self._ring: deque[tuple[int, str]] = deque(maxlen=batches)  # (start us, events text)
        self._markers: deque[tuple[int, str, str]] = deque(maxlen=TRACE_MARKERS)
        self._ends: dict[int, int] = {}  # track -> end of its last span (us): spans never overlap
        self._tracks: set[int] = set()
        self._seen = 0  # batches ever delivered
        self._written_at = clock()
        self.stopped: str | None = None  # why tracing stopped (a failed write), or None
        _remove_orphans(self.path)
        try:
            self._write()
        except OSError as exc:
            raise ArgumentError(f"monitor trace {self.path}: cannot be written there "
                                f"({exc.strerror or exc})") from None

    # -- the hot path --------------------------------------------------------------------

    def on_batch(self, timing: Any) -> None:
        """Keep one delivered batch's ``BatchTiming`` (called as the batch is delivered)."""
        self._pending.append((self._clock(), timing))
        self._seen += 1

    def mark(self, text: str, kind: str) -> None:
        """A marker at this moment: ``kind`` is ``"note"`` or ``"diagnosis"``."""
        if self.stopped is None:
            self._markers.append((int(self._clock() * 1e6), text, kind))

    def tick(self) -> None:
        """Write if :attr:`every` seconds have passed since the last write (the monitor
        calls this at its reports)."""
        if self._clock() - self._written_at >= self.every:
            self.write()

    # -- writing -------------------------------------------------------------------------

    def write(self) -> bool:
        """Write the trace now (step 2 of TRACE FILE); False once tracing has stopped."""
        if self.stopped is not None or os.getpid() != self._pid:
            return False  # stopped, or a forked child: the parent owns the file
        try:
            self._write()
        except OSError as exc:
            self._stop(exc.strerror or str(exc))
            return False
        return True

    def _write(self) -> None:
        self._format_pending()
        self._written_at = self._clock()
        text = self._document()
        st = os.lstat(self.path) if os.path.lexists(self.path) else None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise OSError(0, "it is no longer a file (a folder or a symlink took its place)")
        atomic_write_bytes(Path(self.path), text.encode("utf-8"), durable=False)

    def close(self) -> None:
        """Write the trace a last time (idempotent; later batches are not kept)."""
        if self.stopped is None and self.write():
            self.stopped = "closed"
            self._drop()

    def _stop(self, why: str) -> None:
        self.stopped = why
        self._drop()
        log.warning("monitor trace %s: %s; the trace stops here (training goes on, the "
                    "file keeps its last complete write)", self.path, why)

    def _drop(self) -> None:
        self._pending.clear()
        self._ring.clear()
        self._markers.clear()

    def _document(self) -> str:
        pid = self._pid
        label = "shardpack loader" + (f" {self.name}" if self.name else "")
        if self.rank is not None:
            label += f" (rank {self.rank})"
        meta = [{"name": "process_name", "ph": "M", "pid": pid, "tid": MAIN,
                 "args": {"name": label}}]  # fmt: skip
        for tid in sorted(self._tracks | {MAIN}):
            meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                         "args": {"name": _track_name(tid)}})  # fmt: skip
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                         "args": {"sort_index": tid}})  # fmt: skip
        since = self._ring[0][0] if self._ring else 0
        marks = [json.dumps({"name": text, "ph": "i", "s": "p", "pid": pid, "tid": MAIN,
                             "ts": ts, "cat": kind, "args": {"kind": kind}})
                 for ts, text, kind in self._markers if ts >= since]  # fmt: skip
        other = {"producer": "shardpack monitor", "clock": "CLOCK_MONOTONIC, microseconds",
                 "batches_kept": len(self._ring), "batches_seen": self._seen,
                 "loader": self.name, "rank": self.rank}  # fmt: skip
        parts = [json.dumps(m) for m in meta] + [text for _, text in self._ring] + marks
        return ('{"displayTimeUnit": "ms", "otherData": ' + json.dumps(other)
                + ', "traceEvents": [\n' + ",\n".join(parts) + "\n]}\n")

    # -- formatting (each batch once) ----------------------------------------------------

    def _format_pending(self) -> None:
        pending = self._pending
        ring = self._ring
        while pending:
            delivered, t = pending.popleft()
            ring.append(self._batch(delivered, t))

    def _span(self, out: list, tid: int, name: str, start: int, end: int,
              args: str = "") -> tuple[int, int]:
        """Append one complete event on track ``tid``, started no earlier than the end of
        the track's last span (so a track's spans never overlap and its times never go
        back); returns its (start, end)."""
        last = self._ends.get(tid, 0)
        if start < last:
            start = last
        if end < start:
            end = start
        out.append(f'{{"name":"{name}","ph":"X","pid":{self._pid},"tid":{tid},'
                   f'"ts":{start},"dur":{end - start}{args}}}')
        self._ends[tid] = end
        return start, end

    def _batch(self, delivered: float, t: Any) -> tuple[int, str]:
        """The events of one batch: its ``next()`` on the main track (children inside
        it), its build on its builder's track, its device copy; in whole microseconds."""
        out: list[str] = []
        ends = self._ends
        ret = int(delivered * 1e6)
        call = ret - int((t.next_s if t.next_s > t.wait_s else t.wait_s) * 1e6)
        wait_at = int(t.wait_at * 1e6) if t.wait_at > 0.0 else call
        if wait_at < call:
            call = wait_at  # next()'s duration was measured a little before this call
        wait_end = min(wait_at + int(t.wait_s * 1e6), ret)
        call, ret = self._span(out, MAIN, "next()", call, ret,
                               f',"args":{{"batch":{t.batch},"epoch":{t.epoch},'
                               f'"wait_ms":{t.wait_s * 1e3:.3f},"prefetch":{t.prefetch}}}')
        ends[MAIN] = call  # the children nest inside next(), from its start
        if wait_at > call:
            self._span(out, MAIN, "return slots, issue", call, min(wait_at, ret))
        if wait_end > wait_at:
            self._span(out, MAIN, "wait", wait_at, wait_end)
        if ret > wait_end:
            self._span(out, MAIN, "deliver", wait_end, ret)
            if t.gpu_decode_s:  # decode_device="cuda": the GPU stage, inside the delivery
                ends[MAIN] = wait_end
                self._span(out, MAIN, "GPU decode", wait_end,
                           min(wait_end + int(t.gpu_decode_s * 1e6), ret),
                           f',"args":{{"records":{t.gpu_records or 0}}}')
        ends[MAIN] = ret
        # The build, on its builder's track: the stages inside it, end to end.
        tid = WORKER0 + t.worker if t.worker >= 0 else BUILDER
        self._tracks.add(tid)
        done = int(t.done_at * 1e6) if t.done_at > 0.0 else ret
        at, done = self._span(out, tid, f"batch {t.batch}", done - int(t.busy_s * 1e6), done,
                              f',"args":{{"batch":{t.batch},"epoch":{t.epoch},'
                              f'"records":{t.records},"bytes":{t.bytes},'
                              f'"skipped":{t.skipped},"latency_ms":{t.latency_s * 1e3:.3f}}}')
        ends[tid] = at
        for name, attr in _STAGES:
            d = int(getattr(t, attr) * 1e6)
            if d > 0 and at < done:
                at = self._span(out, tid, name, at, min(at + d, done))[1]
        ends[tid] = done
        if t.h2d_s is not None:
            self._tracks.add(H2D)
            # Copies run one after another on the copy stream: a copy drawn before the
            # last one ended starts when it ends, with its own duration.
            at = max(wait_end, ends.get(H2D, 0))
            self._span(out, H2D, "H2D copy", at, at + int(t.h2d_s * 1e6),
                       f',"args":{{"bytes":{t.h2d_bytes or 0}}}')
        return call, ",\n".join(out)


def _track_name(tid: int) -> str:
    if tid == MAIN:
        return "main: next()"
    if tid == H2D:
        return "main: H2D copy"
    if tid == BUILDER:
        return "builder (main process)"
    return f"worker {tid - WORKER0}"


def _remove_orphans(path: str) -> None:
    """Remove the temporary files of writes to ``path`` whose process died mid-write
    (:func:`formats.files.temp_name`'s ``.<name>.tmp-<pid>`` with no process ``pid``): a
    crash leaves no litter for good."""
    folder, base = os.path.split(os.path.abspath(path))
    prefix = f".{base}.tmp-"
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):] if name.startswith(prefix) else ""
        if pid.isdigit() and not _alive(int(pid)):
            _unlink_quietly(os.path.join(folder, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's: alive
    return True


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
