"""The loader's Data Monitor: per-batch stage timings, an interval table, a diagnosis.

Protocol: the loader calls :meth:`Monitor.on_batch` once per delivered batch,
in the consumer's thread, with that batch's ``reader.runtime.timing.BatchTiming``.
``on_batch`` only adds numbers to running float totals (a few microseconds); at
most once per ``interval`` seconds, checked with ``time.monotonic`` in the same
call, it turns the totals since the last report into a table and a diagnosis,
writes them to ``output`` and appends a JSON line to ``record``.

Why no timer thread: a thread would need a lock (or tolerate torn reads) around
totals that ``on_batch`` updates on every batch, which costs the hot path and
makes figures inconsistent. Reporting from ``on_batch`` means a consumer stuck
inside one training step gets no report until it asks for the next batch; that
report then shows the stall (the interval's wall time grows, samples/s drops).
A loader that hangs outright is the loader watchdog's job, not the monitor's.

Interval figures are differences of cumulative totals, so one set of sums
serves both the "current" (last interval) and "mean" (whole run) columns. The
names of the figures are the same in ``stats()``, the printed table, the JSONL
records and ``monitor-report`` (see :data:`reader.monitor.report.METRICS`).

A stable verdict: each interval is diagnosed on its own figures, with the
limits biased towards the verdict shown (``Thresholds.hysteresis``), and the
verdict shown changes only when the last ``window`` intervals all agree on a
new one. So one odd interval, or figures that alternate around a limit, leave
it alone, and no verdict is ever shown that no interval had. The first
``window`` intervals are judged each on its own, without bias: the first holds
the workers' start-up, which must not become the verdict that is held. (Judging the figures of
several intervals summed does invent one: half an interval of a healthy run
and half of a CPU-bound one average to a sync-bound one.)

Figures: wall time runs from the consumer's first ``next()``. ``num_workers`` is
the processes that built the interval's batches: 0 when the main process built
them all (``num_workers=0``, or raw mode, which starts no workers whatever
``num_workers`` says), and ``per_worker`` names that builder ``main``.
``first_batch_wait_pct`` is the share of wall time spent waiting for each epoch's
first batch (the workers' start-up, every epoch unless they persist), out of
``queue_wait_pct``.
``queue_wait_pct`` is the share of wall time the consumer spent inside
``next()`` (blocked on a batch, or building it when there are no workers).
``data_readiness_pct`` is the share of ``next()`` calls that found their batch
already built (SPDL's "data readiness"; 0 without workers, where ``next()``
builds it). Read ``queue_wait_pct`` first: it is what the loader costs the
training loop (time lost). Readiness says how that loss is spread:
readiness near 100 with a high wait means rare long stalls (a slow shard,
a download, a pause: look at ``load_latency_max_ms``); readiness near 0 means
the trainer waits at nearly every step, if only briefly, so the loader is at
its throughput limit and any slowdown of it slows training (more workers, a
cheaper decode). Low wait with low readiness is a balanced pipeline with no margin.
Stage shares (``io``, ``decode``, ``transform``, ``assemble``) are of the
workers' busy time; ``decode`` is the fused decode + crop + resize + flip,
``transform`` what runs after it (user callables). ``worker_busy_pct`` is busy
time over ``num_workers`` x wall. ``mb_per_s`` and ``samples_per_s`` are the stored
bytes (every field's) and samples delivered over wall time; ``read_mb_s`` is the
bytes the builders paged in over the time that took (the storage's rate while
reading), None where they page in nothing (fields served as views over the shards).
``h2d_*`` are None on CPU. With ``decode_device="cuda"`` (the GPU decodes part of
each batch, :mod:`reader.runtime.split`), ``gpu_decode_pct`` is the share of samples
the GPU decoded, ``gpu_img_s`` and ``cpu_img_s`` the two sides' rates measured over
the interval (by the split controller's definitions, not its running estimates) and
``gpu_share`` the split's latest share; all four are None on other paths. Rows of a
path a run did not take are left out of the printed table
(``reader.monitor.report.Metric.only``). ``loader_cpu_pct``, ``other_cpu_pct`` and
``idle_cpu_pct`` split the machine's CPU time (all cores = 100) between this
process with its child processes (the workers), every other process, and
idle; they come from ``/proc`` (see :class:`ProcCpu`) and are None without it.

Sinks: each report's record (the dict a JSONL line holds) is handed to every
sink of ``sinks=`` (TensorBoard, W&B, Prometheus; :mod:`reader.monitor.sinks`
states the protocol) and, for ``record=``, to a ``JsonlSink`` first: one path
for every destination. A sink that raises is logged once by name and counted
in ``stats()["sink_errors"]``; the loader goes on.

Switching on: ``reader.enable_monitor(interval=5)`` for every Loader created
afterwards in the process (they call :func:`resolve_monitor`), or
``Loader(..., monitor=reader.Monitor(5))`` for one.

A timeline and the other ranks (one Monitor, one Loader): ``trace="trace.json"``
keeps the last batches' spans, worker by worker, and writes them as a Chrome trace
for Perfetto or ``chrome://tracing`` (:mod:`reader.monitor.trace`);
``ranks="/shared/run1"``, a folder every rank can reach, has each rank leave its
figures there at each report and rank 0's report name the slowest rank
(:mod:`reader.monitor.ranks`). Neither ever stops training: a write that fails logs
one warning and that output stops.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from formats.errors import ArgumentError, ArgumentTypeError

from ..runtime.proc import CpuTicks, ProcCpu
from ..runtime.split import cpu_rate
from .diagnosis import Diagnosis, Thresholds, diagnose
from .ranks import RankFolder
from .report import format_table
from .sinks import JsonlSink, check_sinks, sink_name
from .trace import Trace

log = logging.getLogger(__name__)

__all__ = [
    "Diagnosis",
    "Monitor",
    "MonitorConfig",
    "Thresholds",
    "default_monitor",
    "diagnose",
    "disable_monitor",
    "enable_monitor",
    "format_table",
    "resolve_monitor",
]

_STAGES = ("io", "decode", "transform", "assemble")
MAIN = -1  # BatchTiming.worker of a batch built in the main process


PROC_CPU = ProcCpu()


class _Totals:
    """Running sums over delivered batches (seconds, bytes, counts)."""

    __slots__ = (
        "assemble", "batches", "busy", "bytes", "cpu_records", "cpu_s", "decode", "gpu_batches",
        "gpu_records", "gpu_s", "h2d", "h2d_batches", "h2d_bytes", "io", "latency", "prefetch",
        "read_bytes", "ready", "samples", "skipped", "start_wait", "starts", "transform", "wait",
    )  # fmt: skip

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def copy(self) -> _Totals:
        other = _Totals()
        for name in self.__slots__:
            setattr(other, name, getattr(self, name))
        return other

    def minus(self, base: _Totals) -> _Totals:
        other = _Totals()
        for name in self.__slots__:
            setattr(other, name, getattr(self, name) - getattr(base, name))
        return other


@dataclass(frozen=True)
class _Mark:
    """The state at one report (or the run's start): what later figures subtract."""

    at: float
    totals: _Totals
    workers: dict[Any, tuple[float, int]]
    cpu: CpuTicks | None


def _ratio(num: float, den: float, scale: float = 1.0) -> float | None:
    return num / den * scale if den > 0 else None


def _capped(pct: float | None) -> float | None:
    return None if pct is None else min(pct, 100.0)


def _cpu_figures(a: CpuTicks | None, b: CpuTicks | None) -> dict[str, float | None]:
    """The machine's CPU time between two readings, split three ways that sum to 100.

    ``idle_cpu_pct`` and the busy rest come from ``/proc/stat`` alone; the loader's
    share of the busy time is its own ticks (:class:`ProcCpu`), capped at the busy
    time, and ``other_cpu_pct`` is what is left. The cap is needed because the two
    sources are counted differently: ``/proc/stat`` charges each 10 ms clock tick to
    whatever ran at it, a process's ticks come from its measured run time, and the
    two files are read microseconds apart, so over an interval of a few ticks (a
    short last interval, a flush) the loader's figure can exceed the machine's busy
    time. The split is then approximate (within a few ticks of each core), never
    inconsistent: the three always add up to 100.
    """
    total = b.total - a.total if a is not None and b is not None else 0
    if total <= 0:
        return {"loader_cpu_pct": None, "other_cpu_pct": None, "idle_cpu_pct": None}
    busy = min(max(b.busy - a.busy, 0), total)
    own = min(max(b.loader - a.loader, 0), busy)
    return {"loader_cpu_pct": 100.0 * own / total, "other_cpu_pct": 100.0 * (busy - own) / total,
            "idle_cpu_pct": 100.0 * (total - busy) / total}  # fmt: skip


def _gpu_figures(t: _Totals, num_workers: int, share: float | None) -> dict[str, float | None]:
    """The GPU decode's figures (``decode_device="cuda"``), None where no batch carried them.

    Both rates are measured over the same batches, the interval's (or the run's), so
    they compare: ``gpu_img_s`` is GPU-decoded images over the GPU stage's seconds;
    ``cpu_img_s`` is the workers' CPU-decoded images over their decode and transform
    seconds, times the workers (they decode in parallel): the split controller's
    definitions (:mod:`reader.runtime.split`). Its own estimates (``BatchTiming``'s
    ``cpu_img_s``/``gpu_img_s``) are averages weighted to the last few batches, which
    would hide the interval's figures behind the previous ones. A side that decoded
    nothing has no rate (None, not 0). ``gpu_share`` is the controller's latest share.
    """
    if not t.gpu_batches:
        return {"gpu_decode_pct": None, "gpu_img_s": None, "cpu_img_s": None, "gpu_share": None}
    return {
        "gpu_decode_pct": _ratio(t.gpu_records, t.samples, 100.0),
        "gpu_img_s": _ratio(t.gpu_records, t.gpu_s) if t.gpu_records else None,
        "cpu_img_s": cpu_rate(t.cpu_records, t.cpu_s, num_workers),
        "gpu_share": share,
    }  # fmt: skip


def _figures(
    t: _Totals, wall: float, max_latency: float, num_workers: int, busy_by_worker: dict,
    cpu: dict[str, float | None], gpu_share: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Turn sums over some batches and the wall time they span into the reported figures."""
    n = t.batches
    fig: dict[str, Any] = {
        "batches": n,
        "samples": t.samples,
        "bytes": t.bytes,
        "wall_s": wall,
        "num_workers": num_workers,
        "load_latency_ms": _ratio(t.latency, n, 1e3),
        "load_latency_max_ms": max_latency * 1e3 if n else None,
    }
    for stage in _STAGES:
        fig[f"{stage}_ms"] = _ratio(getattr(t, stage), n, 1e3)
        fig[f"{stage}_share_pct"] = _ratio(getattr(t, stage), t.busy, 100.0)
    fig.update(
        busy_ms=_ratio(t.busy, n, 1e3),
        # Bytes the builders paged in over the time that took: the storage's rate
        # while reading (None where they paged in nothing: fields served as views).
        read_mb_s=_ratio(t.read_bytes, t.io, 1e-6) if t.read_bytes else None,
        queue_wait_pct=_ratio(t.wait, wall, 100.0),  # share of wall time inside next()
        data_readiness_pct=_ratio(t.ready, n, 100.0),  # share of next() calls served at once
        # Waiting for each epoch's first batch: worker start-up, unless they persist.
        first_batch_wait_pct=_ratio(t.start_wait, wall, 100.0),
        epochs_started=t.starts,
        # In-process (0 workers) the main process is the one builder.
        # A batch is counted when delivered, so a short interval can hold more busy
        # time than its wall time; the share is capped at 100%.
        worker_busy_pct=_capped(_ratio(t.busy, max(num_workers, 1) * wall, 100.0)),
        samples_per_s=_ratio(t.samples, wall),
        mb_per_s=_ratio(t.bytes, wall, 1e-6),
        h2d_ms=_ratio(t.h2d, t.h2d_batches, 1e3) if t.h2d_batches else None,
        h2d_gb_s=_ratio(t.h2d_bytes, t.h2d, 1e-9) if t.h2d_batches else None,
        h2d_share_pct=_ratio(t.h2d, wall, 100.0) if t.h2d_batches else None,
        **_gpu_figures(t, num_workers, gpu_share),
        prefetch_depth=_ratio(t.prefetch, n),
        skipped=t.skipped,
        **cpu,
        per_worker={
            _builder_name(w): {"batches": b, "busy_pct": _capped(_ratio(s, wall, 100.0))}
            for w, (s, b) in sorted(busy_by_worker.items(), key=lambda kv: str(kv[0]))
        },
    )
    return fig


def _builder_name(worker: Any) -> str:
    """A builder's name in ``per_worker``: the worker's id, or ``"main"`` for the main
    process (``BatchTiming.worker`` -1)."""
    return "main" if worker == MAIN else str(worker)


def _emit_text(output: Any, text: str) -> None:
    if output is False:
        return
    if output is None:
        output = sys.stderr  # looked up now, so redirected stderr is honoured
    if isinstance(output, logging.Logger):
        output.info("%s", text)
    elif isinstance(output, (str, os.PathLike)):
        with open(output, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")
    else:
        output.write(text + "\n")
        output.flush()


@dataclass(frozen=True)
class MonitorConfig:
    """How monitors are built (kept process-wide by :func:`enable_monitor`).

    Args:
        interval: seconds between reports.
        output: ``None`` for stderr, a text stream, a ``logging.Logger`` (INFO),
            a file path (appended to), or ``False`` for no printed report.
        record: a JSONL file path to append one line per interval to, or None.
        thresholds: the report's and the diagnosis' limits.
        window: intervals that must agree on a new verdict before it is shown
            (1: each interval's own verdict).
        sinks: where else each interval's record goes (see
            :mod:`reader.monitor.sinks`); shared by every Monitor built.
    """

    interval: float = 5.0
    output: Any = None
    record: str | os.PathLike | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    window: int = 2
    sinks: tuple = ()

    def __post_init__(self) -> None:
        if not isinstance(self.interval, (int, float)) or not self.interval > 0:
            raise ArgumentError(f"monitor interval: expected seconds > 0, found {self.interval!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ArgumentError(f"monitor window: expected intervals >= 1, found {self.window!r}")
        object.__setattr__(self, "sinks", check_sinks(self.sinks))

    def build(self, num_workers: int | None = None, name: str | None = None) -> Monitor:
        """A Monitor with these settings."""
        return Monitor(self.interval, output=self.output, record=self.record,
                       thresholds=self.thresholds, window=self.window, sinks=self.sinks,
                       num_workers=num_workers, name=name)  # fmt: skip


class Monitor:
    """Accumulates per-batch timings and reports every ``interval`` seconds.

    Not thread-safe: ``on_batch``, ``stats`` and ``flush`` are meant to be
    called from the consumer's thread.

    Args:
        interval: seconds between reports.
        output: see :class:`MonitorConfig`.
        record: see :class:`MonitorConfig`.
        thresholds: see :class:`MonitorConfig`.
        window: see :class:`MonitorConfig`.
        sinks: see :class:`MonitorConfig`: callables handed each interval's
            record (:mod:`reader.monitor.sinks`).
        num_workers: the loader's worker count (busy share is relative to it);
            when None, the number of distinct worker ids >= 0 seen so far
            (id -1 means built in the main process). An interval whose batches
            the main process built, all of them, reports 0 whatever this says
            (raw mode names workers it never starts).
        name: shown in the report and the records, to tell loaders apart.
        clock: seconds, monotonic; replaceable for tests.
        cpu: returns cumulative :class:`CpuTicks` (or None when unknown), read
            at the start and at each report; None leaves the CPU figures out.
        trace: a file to write the timeline of the last batches to, as a Chrome
            trace (:mod:`reader.monitor.trace`); replaced at reports (at most every
            10 s), at :meth:`flush`, :meth:`close` and exit.
        ranks: a folder shared by every rank (:mod:`reader.monitor.ranks`): each
            rank writes its figures there at each report, and rank 0's report
            names the slowest rank. The rank and world size are the Loader's.

    Raises:
        ArgumentError: a bad interval or window; a trace path that is a folder or
            a symlink, or cannot be written; a ranks path that is not a folder.
    """

    def __init__(
        self,
        interval: float = 5.0,
        *,
        output: Any = None,
        record: str | os.PathLike | None = None,
        thresholds: Thresholds | None = None,
        window: int = 2,
        sinks: Iterable[Callable[[dict], Any]] = (),
        num_workers: int | None = None,
        name: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], CpuTicks | None] | None = PROC_CPU,
        trace: str | os.PathLike | None = None,
        ranks: str | os.PathLike | None = None,
    ) -> None:
        self.config = MonitorConfig(interval, output, record, thresholds or Thresholds(), window,
                                    sinks)  # fmt: skip
        # record= is one more sink, first: every destination takes one path (_send).
        self._sinks = ((JsonlSink(record),) if record is not None else ()) + self.config.sinks
        self._sink_errors: dict[str, int] = {}  # sink name -> failed calls
        self.num_workers = num_workers
        self.name = name
        # "remote": the loader reads through the shard cache (set by the Loader), so
        # reading time may be downloading and the diagnosis says what helps there.
        self.storage = "local"
        self._clock = clock
        self._cpu = cpu
        self._total = _Totals()
        self._workers: dict[Any, list] = {}  # worker id -> [busy seconds, batches]
        self._first: _Mark | None = None  # the run's start
        self._mark: _Mark | None = None  # the last report (or the start)
        self._max_latency = 0.0  # whole run, up to the last report
        self._interval_max_latency = 0.0
        self._epoch: int | None = None  # the epoch of the last batch delivered
        self._gpu_share: float | None = None  # the split controller's latest share
        self._start: float | None = None
        self._next = float("inf")
        self._last: dict[str, Any] | None = None  # figures of the last reported interval
        self._recent: deque[Diagnosis] = deque(maxlen=window)  # the intervals' own verdicts
        self._verdict: Diagnosis | None = None  # the verdict shown
        self._notes: list[str] = []  # what the loader changed since the last report
        self.reports = 0
        # The timeline and the other ranks (reader.monitor.trace, reader.monitor.ranks).
        self.trace = Trace(trace, name=name) if trace is not None else None
        self.ranks = RankFolder(ranks) if ranks is not None else None
        self._shown_kind: str | None = None  # the verdict last marked on the timeline
        if self.trace is not None:
            weakref.finalize(self, self.trace.close)  # the last write, at exit at the latest

    def count_workers(self, pids: Callable[[], Iterable[int]]) -> None:
        """Count these processes (a Loader's workers) as the loader's CPU use, instead of
        every multiprocessing child of this process: the training script's other
        children then count as other processes, as they are."""
        if self._cpu is PROC_CPU:
            self._cpu = ProcCpu(pids)

    def note(self, text: str) -> None:
        """Something the loader changed (e.g. its worker count, and why): shown under
        the next report's table and recorded with it."""
        self._notes.append(text)
        if self.trace is not None:
            self.trace.mark(text, "note")

    def set_rank(self, rank: int, world_size: int) -> None:
        """This process's rank and the job's world size (the Loader calls this)."""
        if self.ranks is not None:
            self.ranks.set_rank(rank, world_size)
        if self.trace is not None:
            self.trace.rank = rank

    def close(self) -> None:
        """Report the interval in progress and write the trace a last time."""
        self.flush()
        if self.trace is not None:
            self.trace.close()

    def on_batch(self, timing: Any) -> None:
        """Add one delivered batch's ``BatchTiming``; report if an interval has passed."""
        if self.trace is not None:
            self.trace.on_batch(timing)
        now = self._clock()
        # Time the consumer spent inside next(): blocked on the queue, or building
        # the batch itself when there are no workers (then wait_s is 0).
        wait = timing.next_s if timing.next_s > timing.wait_s else timing.wait_s
        if self._start is None:
            # The run starts when the consumer first asked for a batch.
            self._start = now - wait
            self._first = self._mark = _Mark(self._start, _Totals(), {}, self._read_cpu())
            self._next = self._start + self.config.interval
        t = self._total
        t.batches += 1
        t.samples += timing.records
        t.bytes += timing.bytes
        t.read_bytes += timing.read_bytes
        t.io += timing.io_s
        t.decode += timing.decode_s
        t.transform += timing.transform_s
        t.assemble += timing.assemble_s
        t.busy += timing.busy_s
        t.wait += wait
        t.latency += timing.latency_s
        t.prefetch += timing.prefetch
        t.skipped += timing.skipped
        t.ready += timing.ready
        if timing.epoch != self._epoch:  # an epoch's first batch delivered
            self._epoch = timing.epoch
            t.starts += 1
            t.start_wait += wait
        if timing.h2d_s is not None:
            t.h2d += timing.h2d_s
            t.h2d_bytes += timing.h2d_bytes or 0
            t.h2d_batches += 1
        if timing.gpu_records is not None:
            t.gpu_batches += 1
            t.gpu_records += timing.gpu_records
            t.gpu_s += timing.gpu_decode_s or 0.0
            # The workers' side of the split, as the split controller counts it.
            t.cpu_records += timing.records - timing.gpu_records - timing.skipped
            t.cpu_s += timing.decode_s + timing.transform_s
            if timing.gpu_share is not None:
                self._gpu_share = timing.gpu_share
        if timing.latency_s > self._interval_max_latency:
            self._interval_max_latency = timing.latency_s
        w = self._workers.get(timing.worker)
        if w is None:
            w = self._workers[timing.worker] = [0.0, 0]
        w[0] += timing.busy_s
        w[1] += 1
        if now >= self._next:
            self._report(now)

    def _read_cpu(self) -> CpuTicks | None:
        return self._cpu() if self._cpu is not None else None

    def _worker_count(self, delta: dict) -> int:
        """The worker processes that build the batches of ``delta`` (worker id ->
        (busy seconds, batches)): 0 where the main process built every one of them
        (``num_workers=0``, or raw mode, ``decode=False``, which never starts the
        workers its ``num_workers`` names), else the workers as configured."""
        built = [w for w, (_, b) in delta.items() if b > 0]
        if built and all(w == MAIN for w in built):
            return 0
        if self.num_workers is not None:
            return self.num_workers
        return sum(1 for w in self._workers if w != MAIN)

    def _since(self, mark: _Mark | None, now: float, max_latency: float,
               cpu: CpuTicks | None) -> dict[str, Any]:  # fmt: skip
        """Figures of the batches delivered since ``mark`` (the start when None)."""
        if mark is None:
            mark = _Mark(now, _Totals(), {}, None)
        zero = (0.0, 0)
        delta = {w: (s - mark.workers.get(w, zero)[0], b - mark.workers.get(w, zero)[1])
                 for w, (s, b) in self._workers.items()}  # fmt: skip
        fig = _figures(self._total.minus(mark.totals), now - mark.at, max_latency,
                       self._worker_count(delta), delta, _cpu_figures(mark.cpu, cpu),
                       self._gpu_share)  # fmt: skip
        fig["storage"] = self.storage
        return fig

    def stats(self) -> dict[str, Any]:
        """The figures as a dict, at any time.

        Returns:
            ``{"name", "interval_s", "window", "elapsed_s", "reports", "current",
            "mean", "diagnosis", "interval_diagnosis", "thresholds", "sink_errors"}``.
            ``current`` is the last reported interval (the interval in progress
            before the first report); ``mean`` covers the whole run up to now.
            ``diagnosis`` is the verdict shown, ``{"kind", "message", "cause"}``
            (see the module docstring: it changes only when ``window``
            intervals agree); ``interval_diagnosis`` is ``current``'s own.
            ``sink_errors`` counts failed calls by sink name (see ``sinks``).
        """
        now = self._clock()
        cpu = self._read_cpu()
        if self._last is not None and self._verdict is not None:
            current, verdict, own = self._last, self._verdict, self._recent[-1]
        else:
            current = self._since(self._first, now, self._interval_max_latency, cpu)
            verdict = own = diagnose(current, self.config.thresholds)
        return self._stats(now, current, verdict, own, cpu)

    def _stats(self, now: float, current: dict, verdict: Diagnosis, own: Diagnosis,
               cpu: CpuTicks | None) -> dict[str, Any]:  # fmt: skip
        run_max = max(self._max_latency, self._interval_max_latency)
        return {
            "name": self.name,
            "interval_s": self.config.interval,
            "window": self.config.window,
            "elapsed_s": now - self._start if self._start is not None else 0.0,
            "reports": self.reports,
            "current": current,
            "mean": self._since(self._first, now, run_max, cpu),
            "diagnosis": verdict.to_dict(),
            "interval_diagnosis": own.to_dict(),
            "thresholds": asdict(self.config.thresholds),
            "sink_errors": dict(self._sink_errors),
        }

    def _settled(self) -> bool:
        """Whether a verdict has been shown long enough to be held (see the module docstring)."""
        return (
            len(self._recent) == self._recent.maxlen
            and self._verdict is not None
            and self._verdict.kind != "no-data"
        )

    def _settle(self, own: Diagnosis, settled: bool) -> Diagnosis:
        """The verdict to show, given the latest interval's own (see the module docstring)."""
        self._recent.append(own)
        shown = self._verdict
        if not settled or shown is None:
            return own
        same = (own.kind, own.cause)
        if (shown.kind, shown.cause) == same or all(
            (d.kind, d.cause) == same for d in self._recent
        ):
            return own  # this interval's figures in the message
        return shown

    def diagnosis(self) -> Diagnosis:
        """The diagnosis of the current figures."""
        return Diagnosis(**self.stats()["diagnosis"])

    def flush(self) -> None:
        """Report the interval in progress now, if it holds any batch (e.g. at epoch end)."""
        if self._mark is not None and self._total.batches > self._mark.totals.batches:
            self._report(self._clock())
        if self.trace is not None:
            self.trace.write()

    def _report(self, now: float) -> None:
        cpu = self._read_cpu()
        current = self._since(self._mark, now, self._interval_max_latency, cpu)
        settled = self._settled()
        own = diagnose(current, self.config.thresholds,
                       previous=self._verdict if settled else None)  # fmt: skip
        self._verdict = self._settle(own, settled)
        self._last = current
        stats = self._stats(now, current, self._verdict, own, cpu)
        self._mark = _Mark(now, self._total.copy(),
                           {w: (s, b) for w, (s, b) in self._workers.items()}, cpu)
        self._max_latency = max(self._max_latency, self._interval_max_latency)
        self._interval_max_latency = 0.0
        self._next = now + self.config.interval
        self.reports += 1
        notes, self._notes = self._notes, []
        shared = self._share(stats)
        text = format_table(stats, self.config.thresholds)
        if notes:
            text += "".join(f"\n  changed: {n}" for n in notes)
        if shared is not None:
            text += "\n" + shared
        _emit_text(self.config.output, text)
        if self._sinks:
            self._send({"time": time.time(), "interval": self.reports, **stats, "notes": notes})

    def _send(self, record: dict[str, Any]) -> None:
        """Hand one interval's record to every sink; one that raises is logged (its first
        failure) and counted, and never stops the loader (the sink protocol, step 3)."""
        for sink in self._sinks:
            try:
                sink(record)
            except Exception as exc:
                name = sink_name(sink)
                failed = self._sink_errors.get(name, 0)
                self._sink_errors[name] = failed + 1
                if not failed:
                    log.warning("monitor%s: sink %s failed (%s: %s); the loader goes on, and "
                                "the sink's failures are counted in stats()['sink_errors']",
                                f" {self.name}" if self.name else "", name,
                                type(exc).__name__, exc)  # fmt: skip

    def _share(self, stats: dict[str, Any]) -> str | None:
        """The report's timeline marker and trace write, and its exchange with the other
        ranks: adds ``rank`` (and on rank 0 ``ranks``) to ``stats``; returns rank 0's
        line about the slowest rank, or None."""
        if self.trace is not None:
            kind = stats["diagnosis"]["kind"]
            if kind != self._shown_kind:
                self._shown_kind = kind
                self.trace.mark(f"verdict: {stats['diagnosis']['message']}", "diagnosis")
            self.trace.tick()
        if self.ranks is None:
            return None
        compared = self.ranks.exchange(stats)
        stats["rank"] = self.ranks.rank
        if compared is None:
            return None
        stats["ranks"] = compared
        return compared["message"]


# The process-wide default, set only by an explicit enable_monitor() call.
_default: MonitorConfig | None = None
_count = 0


def enable_monitor(
    interval: float = 5.0,
    *,
    output: Any = None,
    record: str | os.PathLike | None = None,
    thresholds: Thresholds | None = None,
    window: int = 2,
    sinks: Iterable[Callable[[dict], Any]] = (),
) -> MonitorConfig:
    """Monitor every Loader created from now on in this process.

    Args:
        interval: seconds between reports.
        output: ``None`` (stderr), a text stream, a ``logging.Logger``, a file
            path, or ``False`` (no printed report, e.g. with ``record``).
        record: a JSONL file to append one line per interval to.
        thresholds: limits for the report and the diagnosis.
        window: intervals that must agree on a new verdict before it is shown.
        sinks: metric sinks (``reader.monitor.TensorBoardSink("runs/x")``,
            ``WandbSink()``, ``PrometheusSink(9100)``, or any callable taking a
            record), built once and shared by every Loader's monitor; each
            loader's figures are told apart by its name (``loader-1``, ...).

    Returns:
        The configuration now in force.
    """
    global _default
    if isinstance(interval, Monitor):
        raise ArgumentTypeError("enable_monitor takes the settings of the monitors it will make "
                        "(interval=5, output=..., record=...), not a Monitor: pass a Monitor "
                        "to one Loader as monitor=...")
    _default = MonitorConfig(interval, output, record, thresholds or Thresholds(), window,
                             sinks)  # fmt: skip
    return _default


def disable_monitor() -> None:
    """Stop monitoring Loaders created from now on (existing monitors keep running)."""
    global _default
    _default = None


def default_monitor(*, num_workers: int | None = None, name: str | None = None) -> Monitor | None:
    """A new Monitor from the :func:`enable_monitor` settings, or None when it is off."""
    global _count
    config = _default
    if config is None:
        return None
    _count += 1
    return config.build(num_workers, name or f"loader-{_count}")


def resolve_monitor(value: Any = None, *, num_workers: int | None = None) -> Monitor | None:
    """Turn a Loader's ``monitor=`` argument into a Monitor or None.

    Args:
        value: a :class:`Monitor` (used as is), True (a Monitor with the default
            settings), None (the process default of :func:`enable_monitor`) or False
            (off even if enabled).
        num_workers: the loader's worker count.

    Returns:
        The Monitor to call ``on_batch`` on, or None.

    Raises:
        TypeError: for any other value, saying how to write it.
    """
    if value is None:
        return default_monitor(num_workers=num_workers)
    if value is False:
        return None
    if value is True:
        return Monitor(num_workers=num_workers)
    if isinstance(value, Monitor):
        if value.num_workers is None:
            value.num_workers = num_workers
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        hint = (f": for a report every {value:g} s, pass monitor=reader.Monitor({value!r})"
                if value > 0 else ": for no monitor, pass monitor=False")
    elif isinstance(value, MonitorConfig):
        hint = ": pass monitor=config.build() for a Monitor with its settings"
    else:
        hint = " (a hook of your own subclasses reader.Monitor)"
    raise ArgumentTypeError(f"monitor must be a reader.Monitor, True, None or False, not "
                    f"{type(value).__name__} {value!r}{hint}")
