"""The loader's Data Monitor: per-batch stage timings, an interval table, a diagnosis.

Protocol: the loader calls :meth:`Monitor.on_batch` once per delivered batch,
in the consumer's thread, with that batch's ``reader.timing.BatchTiming``.
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
serves both the "current" (last interval) and "mean" (whole run) columns.

Figures (keys of ``stats()["current"]`` / ``["mean"]``): wall time runs from
the consumer's first ``next()``. ``queue_wait_pct`` is the share of wall time
the consumer spent inside ``next()`` (blocked on a batch, or building it when
there are no workers). Stage shares (``io``, ``decode``, ``transform``,
``assemble``) are of the workers' busy time; ``worker_busy_pct`` is busy time
over ``num_workers`` x wall. ``read_mb_s`` is bytes over IO time (the storage
rate while reading), ``mb_per_s``/``samples_per_s`` are over wall time.
``h2d_*`` are None on CPU.

Switching on: ``reader.enable_monitor(interval=5)`` for every Loader created
afterwards in the process (they call :func:`resolve_monitor`), or
``Loader(..., monitor=5)`` for one.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from reader.diagnosis import Diagnosis, Thresholds, diagnose
from reader.monitor_report import format_table

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


class _Totals:
    """Running sums over delivered batches (seconds, bytes, counts)."""

    __slots__ = (
        "assemble", "batches", "busy", "bytes", "decode", "h2d", "h2d_batches", "h2d_bytes",
        "io", "latency", "prefetch", "samples", "skipped", "transform", "wait",
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


def _ratio(num: float, den: float, scale: float = 1.0) -> float | None:
    return num / den * scale if den > 0 else None


def _capped(pct: float | None) -> float | None:
    return None if pct is None else min(pct, 100.0)


def _figures(
    t: _Totals, wall: float, max_latency: float, num_workers: int, busy_by_worker: dict
) -> dict[str, Any]:
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
        read_mb_s=_ratio(t.bytes, t.io, 1e-6),
        queue_wait_pct=_ratio(t.wait, wall, 100.0),  # share of wall time inside next()
        # In-process (0 workers) the main process is the one builder.
        # A batch is counted when delivered, so a short interval can hold more busy
        # time than its wall time; the share is capped at 100%.
        worker_busy_pct=_capped(_ratio(t.busy, max(num_workers, 1) * wall, 100.0)),
        samples_per_s=_ratio(t.samples, wall),
        mb_per_s=_ratio(t.bytes, wall, 1e-6),
        h2d_ms=_ratio(t.h2d, t.h2d_batches, 1e3) if t.h2d_batches else None,
        h2d_gb_s=_ratio(t.h2d_bytes, t.h2d, 1e-9) if t.h2d_batches else None,
        h2d_share_pct=_ratio(t.h2d, wall, 100.0) if t.h2d_batches else None,
        prefetch_depth=_ratio(t.prefetch, n),
        skipped=t.skipped,
        per_worker={
            str(w): {"batches": b, "busy_pct": _capped(_ratio(s, wall, 100.0))}
            for w, (s, b) in sorted(busy_by_worker.items(), key=lambda kv: str(kv[0]))
        },
    )
    return fig


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
    """

    interval: float = 5.0
    output: Any = None
    record: str | os.PathLike | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)

    def __post_init__(self) -> None:
        if not isinstance(self.interval, (int, float)) or not self.interval > 0:
            raise ValueError(f"monitor interval: expected seconds > 0, found {self.interval!r}")

    def build(self, num_workers: int | None = None, name: str | None = None) -> Monitor:
        """A Monitor with these settings."""
        return Monitor(self.interval, output=self.output, record=self.record,
                       thresholds=self.thresholds, num_workers=num_workers, name=name)


class Monitor:
    """Accumulates per-batch timings and reports every ``interval`` seconds.

    Not thread-safe: ``on_batch``, ``stats`` and ``flush`` are meant to be
    called from the consumer's thread.

    Args:
        interval: seconds between reports.
        output: see :class:`MonitorConfig`.
        record: see :class:`MonitorConfig`.
        thresholds: see :class:`MonitorConfig`.
        num_workers: the loader's worker count (busy share is relative to it);
            when None, the number of distinct worker ids >= 0 seen so far
            (id -1 means built in the main process).
        name: shown in the report and the records, to tell loaders apart.
        clock: seconds, monotonic; replaceable for tests.
    """

    def __init__(
        self,
        interval: float = 5.0,
        *,
        output: Any = None,
        record: str | os.PathLike | None = None,
        thresholds: Thresholds | None = None,
        num_workers: int | None = None,
        name: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = MonitorConfig(interval, output, record, thresholds or Thresholds())
        self.num_workers = num_workers
        self.name = name
        # "remote": the loader reads through the shard cache (set by the Loader), so
        # reading time may be downloading and the diagnosis says what helps there.
        self.storage = "local"
        self._clock = clock
        self._total = _Totals()
        self._base = _Totals()  # totals at the last report
        self._workers: dict[Any, list] = {}  # worker id -> [busy seconds, batches]
        self._workers_base: dict[Any, tuple] = {}
        self._max_latency = 0.0  # whole run
        self._interval_max_latency = 0.0
        self._start: float | None = None
        self._mark = 0.0  # clock at the last report
        self._next = float("inf")
        self._last: dict[str, Any] | None = None  # figures of the last reported interval
        self.reports = 0

    def on_batch(self, timing: Any) -> None:
        """Add one delivered batch's ``BatchTiming``; report if an interval has passed."""
        now = self._clock()
        # Time the consumer spent inside next(): blocked on the queue, or building
        # the batch itself when there are no workers (then wait_s is 0).
        wait = timing.next_s if timing.next_s > timing.wait_s else timing.wait_s
        if self._start is None:
            # The run starts when the consumer first asked for a batch.
            self._start = self._mark = now - wait
            self._next = self._mark + self.config.interval
        t = self._total
        t.batches += 1
        t.samples += timing.records
        t.bytes += timing.bytes
        t.io += timing.io_s
        t.decode += timing.decode_s
        t.transform += timing.transform_s
        t.assemble += timing.assemble_s
        t.busy += timing.busy_s
        t.wait += wait
        t.latency += timing.latency_s
        t.prefetch += timing.prefetch
        t.skipped += timing.skipped
        if timing.h2d_s is not None:
            t.h2d += timing.h2d_s
            t.h2d_bytes += timing.h2d_bytes or 0
            t.h2d_batches += 1
        if timing.latency_s > self._interval_max_latency:
            self._interval_max_latency = timing.latency_s
        w = self._workers.get(timing.worker)
        if w is None:
            w = self._workers[timing.worker] = [0.0, 0]
        w[0] += timing.busy_s
        w[1] += 1
        if now >= self._next:
            self._report(now)

    def _worker_count(self) -> int:
        """Workers as configured (0: batches built in the main process)."""
        if self.num_workers is not None:
            return self.num_workers
        return sum(1 for w in self._workers if not (isinstance(w, int) and w < 0))

    def _interval_figures(self, now: float) -> dict[str, Any]:
        delta = {
            w: (s - self._workers_base.get(w, (0.0, 0))[0], b - self._workers_base.get(w, (0.0, 0))[1])
            for w, (s, b) in self._workers.items()
        }
        fig = _figures(
            self._total.minus(self._base),
            now - self._mark,
            self._interval_max_latency,
            self._worker_count(),
            delta,
        )
        fig["storage"] = self.storage
        return fig

    def _mean_figures(self, now: float) -> dict[str, Any]:
        return _figures(
            self._total,
            now - self._start if self._start is not None else 0.0,
            max(self._max_latency, self._interval_max_latency),
            self._worker_count(),
            self._workers,
        )

    def stats(self) -> dict[str, Any]:
        """The figures as a dict, at any time.

        Returns:
            ``{"name", "interval_s", "elapsed_s", "reports", "current", "mean",
            "diagnosis", "thresholds"}``. ``current`` is the last reported
            interval (the interval in progress before the first report);
            ``mean`` covers the whole run; ``diagnosis`` is
            ``{"kind", "message"}`` for ``current``.
        """
        now = self._clock()
        current = self._last if self._last is not None else self._interval_figures(now)
        return self._stats(now, current)

    def _stats(self, now: float, current: dict[str, Any]) -> dict[str, Any]:
        th = self.config.thresholds
        return {
            "name": self.name,
            "interval_s": self.config.interval,
            "elapsed_s": now - self._start if self._start is not None else 0.0,
            "reports": self.reports,
            "current": current,
            "mean": self._mean_figures(now),
            "diagnosis": diagnose(current, th).to_dict(),
            "thresholds": asdict(th),
        }

    def diagnosis(self) -> Diagnosis:
        """The diagnosis of the current figures."""
        return Diagnosis(**self.stats()["diagnosis"])

    def flush(self) -> None:
        """Report the interval in progress now, if it holds any batch (e.g. at epoch end)."""
        if self._total.batches > self._base.batches:
            self._report(self._clock())

    def _report(self, now: float) -> None:
        current = self._interval_figures(now)
        stats = self._stats(now, current)
        self._last = current
        self._base = self._total.copy()
        self._workers_base = {w: (s, b) for w, (s, b) in self._workers.items()}
        self._max_latency = max(self._max_latency, self._interval_max_latency)
        self._interval_max_latency = 0.0
        self._mark = now
        self._next = now + self.config.interval
        self.reports += 1
        _emit_text(self.config.output, format_table(stats, self.config.thresholds))
        if self.config.record is not None:
            line = {"time": time.time(), "interval": self.reports, **stats}
            with open(self.config.record, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, sort_keys=True) + "\n")


# The process-wide default, set only by an explicit enable_monitor() call.
_default: MonitorConfig | None = None
_count = 0


def enable_monitor(
    interval: float = 5.0,
    *,
    output: Any = None,
    record: str | os.PathLike | None = None,
    thresholds: Thresholds | None = None,
) -> MonitorConfig:
    """Monitor every Loader created from now on in this process.

    Args:
        interval: seconds between reports.
        output: ``None`` (stderr), a text stream, a ``logging.Logger``, a file
            path, or ``False`` (no printed report, e.g. with ``record``).
        record: a JSONL file to append one line per interval to.
        thresholds: limits for the report and the diagnosis.

    Returns:
        The configuration now in force.
    """
    global _default
    _default = MonitorConfig(interval, output, record, thresholds or Thresholds())
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
        value: None (the process default of :func:`enable_monitor`), False (off
            even if enabled), True (default interval), a number (interval in
            seconds), a :class:`MonitorConfig`, or a :class:`Monitor` (used as is).
        num_workers: the loader's worker count.

    Returns:
        The Monitor to call ``on_batch`` on, or None.

    Raises:
        TypeError: for any other value.
    """
    if value is None:
        return default_monitor(num_workers=num_workers)
    if value is False:
        return None
    if isinstance(value, Monitor):
        if value.num_workers is None:
            value.num_workers = num_workers
        return value
    if value is True:
        return Monitor(num_workers=num_workers)
    if isinstance(value, MonitorConfig):
        return value.build(num_workers)
    if isinstance(value, (int, float)):
        return Monitor(value, num_workers=num_workers)
    raise TypeError(
        f"monitor: expected None, a bool, an interval in seconds, a MonitorConfig or a "
        f"Monitor, found {type(value).__name__}"
    )
