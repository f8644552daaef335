"""Metric sinks: where each interval's figures go besides the printed table.

The sink protocol ("SINK"), which :meth:`reader.monitor.monitor.Monitor._send`
implements:

1. A sink is a callable taking one argument, the interval's *record*: the dict one
   JSONL line holds (``{"time", "interval", "name", "elapsed_s", "current", "mean",
   "diagnosis", "interval_diagnosis", "notes", ...}``: ``Monitor.stats()`` plus the
   wall-clock time, the interval's number and the notes). Its figures keep the names
   of :data:`reader.monitor.report.METRICS`, the names of the table and ``stats()``.
2. The monitor calls every sink once per report, in order, in the consumer's thread
   (the one inside ``next()``), after printing the table. A sink returns quickly:
   TensorBoard's writer and W&B queue to their own threads, Prometheus sets gauges
   (and a push goes from a thread of its own).
3. A sink that raises (an ``Exception``) never stops the loader: the monitor logs its
   first failure with the sink's name (:func:`sink_name`), counts every failure in
   ``stats()["sink_errors"]``, and calls it again at the next report (a full disk may
   come back).
4. The monitor never closes a sink: whoever made it owns it (``close()``, where a sink
   has one). One sink may serve several monitors (``enable_monitor(sinks=...)`` builds
   them once for every Loader); records tell loaders apart by ``"name"``.

Names: ``shardpack/<metric>`` (``shardpack/decode_share_pct``) for a monitor without a
name, ``shardpack/<name>/<metric>`` for a named one (``enable_monitor`` names its
monitors ``loader-1``, ``loader-2``, ...), so two loaders never write one series;
Prometheus, which has no ``/`` in names, exports ``shardpack_<metric>`` with a
``loader`` label. A figure that is None (no device copy on CPU, no ``/proc``) is left
out, never written as 0. The verdict goes where the backend has room for words:
TensorBoard text when it changes, a W&B string, a Prometheus enum of
:data:`reader.monitor.diagnosis.KINDS` with the cause as an info metric.

The backends are optional and imported when a sink is made, with an install hint:
``pip install 'shardpack[monitor]'`` brings all three.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Callable
from typing import Any

from formats.errors import ArgumentError, ArgumentTypeError

from ..errors import MonitorSinkError
from .diagnosis import KINDS
from .report import METRICS

__all__ = [
    "JsonlSink",
    "PrometheusSink",
    "TensorBoardSink",
    "WandbSink",
    "check_sinks",
    "metric_prefix",
    "scalars",
    "sink_name",
]

_HINT = "pip install 'shardpack[monitor]'"
#: How long TensorBoardSink.close waits for its writer (see there).
CLOSE_S = 10.0


def metric_prefix(name: str | None) -> str:
    """``shardpack`` for an unnamed monitor's record, else ``shardpack/<name>``."""
    return "shardpack" if name is None else f"shardpack/{name}"


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The interval's figures a sink exports: the :data:`METRICS` that are not None."""
    current = record["current"]
    out = {}
    for m in METRICS:
        value = current.get(m.key)
        if value is not None:
            out[m.key] = float(value)
    return out


def sink_name(sink: Any) -> str:
    """How logs and ``stats()["sink_errors"]`` name a sink: its ``name``, else its type
    or function name."""
    name = getattr(sink, "name", None)
    if isinstance(name, str) and name:
        return name
    return getattr(sink, "__qualname__", None) or type(sink).__qualname__


def check_sinks(sinks: Any) -> tuple:
    """``sinks=`` as a tuple of callables, or an error saying how to write it."""
    if callable(sinks) or isinstance(sinks, (str, bytes, os.PathLike)):
        raise ArgumentTypeError(f"monitor sinks: expected a list of sinks, found one "
                                f"{type(sinks).__name__}: pass sinks=[sink]")
    try:
        out = tuple(sinks)
    except TypeError:
        raise ArgumentTypeError(f"monitor sinks: expected a list of callables taking a "
                                f"record, found {type(sinks).__name__} {sinks!r}") from None
    for sink in out:
        if not callable(sink):
            raise ArgumentTypeError(f"monitor sinks: expected callables taking a record "
                                    f"(reader.monitor.TensorBoardSink, ...), found "
                                    f"{type(sink).__name__} {sink!r}")
    return out


def _step_of(step: Callable[[], int] | None, record: dict[str, Any]) -> int:
    return int(step()) if step is not None else int(record["interval"])


def _check_step(step: Any) -> Callable[[], int] | None:
    if step is not None and not callable(step):
        raise ArgumentTypeError(f"step: expected a callable returning the trainer's step "
                                f"(step=lambda: trainer.step), found {type(step).__name__}")
    return step


class JsonlSink:
    """One JSON line per interval appended to a file: what ``record=`` writes.

    ``monitor-report`` reads it back (:func:`reader.monitor.report.load_records`).

    Args:
        path: the file; created if missing, appended to (several loaders and runs
            may share one file: lines carry the loader's name).

    Raises:
        MonitorSinkError: the file cannot be opened for appending (checked now, so a
            wrong folder fails where it is given, not at the first report).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self.name = f"jsonl {self.path}"
        try:
            with open(self.path, "a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise MonitorSinkError(f"cannot append monitor records ({exc.strerror})",
                                   path=self.path) from exc

    def __call__(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)


def _summary_writer() -> type:
    """``torch.utils.tensorboard.SummaryWriter``, else ``tensorboardX``'s."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as exc:
            raise ImportError("TensorBoardSink needs torch.utils.tensorboard (torch and "
                              "tensorboard) or tensorboardX: pip install tensorboardX, or "
                              f"{_HINT}") from exc
    return SummaryWriter


class TensorBoardSink:
    """Scalars and the verdict in TensorBoard event files.

    Each figure is a scalar tagged ``shardpack/<metric>`` (see the module docstring
    for named loaders) at the step; the verdict's message is a text entry
    (``shardpack/diagnosis``) whenever its kind or cause changes. Events are flushed
    at every report, so ``tensorboard --logdir`` shows an interval as soon as it is
    reported. The writers write from a thread that stops at its first failure (a
    full disk): from then on every report fails (logged once, counted) until a new
    sink is made.

    Args:
        logdir: the log folder (``tensorboard --logdir`` it, or a parent), or a
            ``SummaryWriter`` of your own (then its run holds the figures too, and
            :meth:`close` leaves it open).
        step: a callable returning the trainer's step (``step=lambda: step``), so
            the figures line up with the training curves; else the monitor's
            interval count.

    Raises:
        MonitorSinkError: the folder cannot be created or written (named).
        ImportError: neither torch's writer nor tensorboardX is installed.
    """

    def __init__(self, logdir: Any, *, step: Callable[[], int] | None = None) -> None:
        self._step = _check_step(step)
        self._verdicts: dict[str | None, tuple] = {}  # loader name -> (kind, cause) written
        if hasattr(logdir, "add_scalar"):
            self.writer, self._own = logdir, False
            self.logdir = getattr(logdir, "log_dir", None) or getattr(logdir, "logdir", None)
            self.name = f"tensorboard {self.logdir or type(logdir).__name__}"
            return
        if not isinstance(logdir, (str, os.PathLike)):
            raise ArgumentTypeError(f"TensorBoardSink: expected a log folder or a SummaryWriter, "
                                    f"found {type(logdir).__name__} {logdir!r}")
        writer = _summary_writer()
        path = self.logdir = os.fspath(logdir)
        self.name = f"tensorboard {path}"
        try:
            os.makedirs(path, exist_ok=True)
            # Writing: the writers create their event file now, but a folder where that
            # is refused can still be made (a read-only parent it already exists in).
            probe = os.path.join(path, f".shardpack-probe-{os.getpid()}")
            with open(probe, "wb"):
                pass
            os.unlink(probe)
            self.writer = writer(path)
        except OSError as exc:
            raise MonitorSinkError(f"cannot write TensorBoard logs ({exc.strerror or exc})",
                                   path=path) from exc
        self._own = True

    def __call__(self, record: dict[str, Any]) -> None:
        w = self.writer
        name = record.get("name")
        prefix = metric_prefix(name)
        step = _step_of(self._step, record)
        wall = record.get("time")
        for key, value in scalars(record).items():
            w.add_scalar(f"{prefix}/{key}", value, step, walltime=wall)
        verdict = record.get("diagnosis") or {}
        said = (verdict.get("kind"), verdict.get("cause"))
        if verdict and self._verdicts.get(name) != said:
            w.add_text(f"{prefix}/diagnosis", verdict.get("message", ""), step, walltime=wall)
            self._verdicts[name] = said
        w.flush()

    def close(self) -> None:
        """Close the writer this sink opened (a writer passed in stays open).

        Raises:
            MonitorSinkError: the last events could not be written (a full disk).
        """
        if not self._own:
            return
        # tensorboardX's close() puts a sentinel in its writer thread's bounded queue: if
        # that thread died (a full disk), the queue is full and close() never returns.
        # So it runs in a daemon thread, waited for at most CLOSE_S.
        failed: list[BaseException] = []

        def close() -> None:
            try:
                self.writer.close()
            except BaseException as exc:  # re-raised below, in the caller's thread
                failed.append(exc)

        closer = threading.Thread(target=close, name="shardpack-tensorboard-close", daemon=True)
        closer.start()
        closer.join(CLOSE_S)
        if closer.is_alive():
            raise MonitorSinkError(f"TensorBoard's writer did not close within {CLOSE_S:g} s "
                                   "(its writing thread stopped, as on a full disk): the last "
                                   "events are lost", path=self.logdir)
        if failed and isinstance(failed[0], OSError):
            exc = failed[0]
            raise MonitorSinkError(f"TensorBoard logs were not all written "
                                   f"({exc.strerror or exc})", path=self.logdir) from exc
        if failed:
            raise failed[0]


class WandbSink:
    """The figures logged to the current Weights & Biases run.

    Keys ``shardpack/<metric>`` (see the module docstring) and ``shardpack/diagnosis``
    (the verdict's kind, a string). With ``step``, each report is ``run.log(...,
    step=step())``: the trainer's step, so the figures share its x axis (W&B drops a
    step lower than one already logged, so pass the step your own ``wandb.log``
    calls use). Without it, each report is one ``run.log`` of its own with
    ``shardpack/interval`` (the monitor's interval count) declared as the figures'
    x axis (``define_metric``); passing the interval as W&B's ``step`` would clash
    with the trainer's steps.

    Args:
        step: a callable returning the trainer's step, or None.
        run: a run (``wandb.init(...)``'s); by default ``wandb.run`` at each report,
            so the sink may be made before ``wandb.init``. Without a run a report
            fails (logged once, counted) and the next is tried again.

    Raises:
        ImportError: wandb is not installed.
    """

    def __init__(self, *, step: Callable[[], int] | None = None, run: Any = None) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ImportError(f"WandbSink needs wandb: pip install wandb, or {_HINT}") from exc
        self._wandb = wandb
        self._step = _check_step(step)
        self._run = run
        self._axes: set[tuple[int, str]] = set()  # (id(run), prefix) given an x axis
        self.name = "wandb"

    def __call__(self, record: dict[str, Any]) -> None:
        run = self._run if self._run is not None else self._wandb.run
        if run is None:
            raise MonitorSinkError("no W&B run: call wandb.init() before the loader's first "
                                   "report (or pass WandbSink(run=...))")
        prefix = metric_prefix(record.get("name"))
        data: dict[str, Any] = {f"{prefix}/{k}": v for k, v in scalars(record).items()}
        verdict = record.get("diagnosis") or {}
        if verdict.get("kind"):
            data[f"{prefix}/diagnosis"] = verdict["kind"]
        if self._step is not None:
            run.log(data, step=_step_of(self._step, record))
            return
        axis = (id(run), prefix)
        if axis not in self._axes:
            run.define_metric(f"{prefix}/*", step_metric=f"{prefix}/interval")
            self._axes.add(axis)
        data[f"{prefix}/interval"] = int(record["interval"])
        run.log(data)


class PrometheusSink:
    """Gauges for Prometheus: served on a port for scraping, or pushed to a Pushgateway.

    One gauge per figure, ``shardpack_<metric>{loader="<name>"}`` (a figure that is
    None has its series removed, so a stale value never lingers); the verdict as the
    enum ``shardpack_diagnosis{loader, shardpack_diagnosis="<kind>"}`` over
    :data:`~reader.monitor.diagnosis.KINDS`, and its cause as the info metric
    ``shardpack_diagnosis_cause_info{loader, cause}``. The metrics live in a registry
    of the sink's own (never the process-wide default one), so they clash with no
    other exporter in the process.

    Args:
        port: serve ``/metrics`` on this port (0: a free one, see :attr:`port`).
        addr: the address to listen on (default: every interface, as scrapers are
            usually remote).
        pushgateway: instead of serving, push to this Pushgateway
            (``"host:9091"``) after each report, from a thread of the sink's own;
            a failed push raises at the next report (logged once, counted).
        job: the Pushgateway's job label.
        grouping_key: the push's other labels. A push replaces everything pushed
            before under the same job and key, so each process pushing to one job
            needs a key of its own (``{"rank": "3"}``).

    Raises:
        MonitorSinkError: the port is in use or cannot be bound (named).
        ArgumentError: neither or both of ``port`` and ``pushgateway``.
        ImportError: prometheus_client is not installed.
    """

    def __init__(self, port: int | None = None, *, addr: str = "0.0.0.0",
                 pushgateway: str | None = None, job: str = "shardpack",
                 grouping_key: dict[str, str] | None = None) -> None:  # fmt: skip
        if (port is None) == (pushgateway is None):
            raise ArgumentError("PrometheusSink: pass port= (serve /metrics) or pushgateway= "
                                "(push after each report), exactly one")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                                 or not 0 <= port <= 65535):
            raise ArgumentError(f"PrometheusSink port: expected 0..65535, found {port!r}")
        try:
            import prometheus_client as pc
        except ImportError as exc:
            raise ImportError("PrometheusSink needs prometheus_client: pip install "
                              f"prometheus-client, or {_HINT}") from exc
        self._pc = pc
        self.registry = pc.CollectorRegistry(auto_describe=True)
        self._gauges = {m.key: pc.Gauge(f"shardpack_{m.key}", m.meaning, ["loader"],
                                        registry=self.registry) for m in METRICS}
        self._kind = pc.Enum("shardpack_diagnosis", "the verdict shown (the monitor's diagnosis)",
                             ["loader"], states=list(KINDS), registry=self.registry)
        self._cause = pc.Info("shardpack_diagnosis_cause", "what within the verdict is to blame",
                              ["loader"], registry=self.registry)
        self.pushgateway, self.job = pushgateway, job
        self.grouping_key = dict(grouping_key or {})
        self._server = self._thread = None
        self._push_error: BaseException | None = None
        self._wake = threading.Event()
        self._closed = False
        if pushgateway is not None:
            self.port = None
            self.name = f"prometheus push {pushgateway}"
            self._thread = threading.Thread(target=self._push_loop, name="shardpack-prometheus-push",
                                            daemon=True)
            self._thread.start()
            return
        try:
            self._server, self._thread = pc.start_http_server(port, addr=addr,
                                                              registry=self.registry)
        except OSError as exc:
            why = ("in use by another process (or an earlier PrometheusSink of this one: "
                   "close() it, or share one sink)") if exc.errno == errno.EADDRINUSE \
                else f"not bindable ({exc.strerror or exc})"
            raise MonitorSinkError(f"Prometheus port {port} on {addr} is {why}; pass another "
                                   f"PrometheusSink(port=...)") from exc
        self.port = self._server.server_port
        self.name = f"prometheus :{self.port}"

    def __call__(self, record: dict[str, Any]) -> None:
        loader = str(record.get("name") or "")
        figures = scalars(record)
        for key, gauge in self._gauges.items():
            value = figures.get(key)
            if value is not None:
                gauge.labels(loader).set(value)
            else:
                try:
                    gauge.remove(loader)
                except KeyError:
                    pass
        verdict = record.get("diagnosis") or {}
        if verdict.get("kind") in KINDS:
            self._kind.labels(loader).state(verdict["kind"])
            self._cause.labels(loader).info({"cause": verdict.get("cause") or ""})
        if self.pushgateway is not None:
            failed, self._push_error = self._push_error, None
            self._wake.set()
            if failed is not None:
                raise failed

    def _push_loop(self) -> None:
        """The pusher thread: one push per wake-up; a failure waits for the next report."""
        while True:
            self._wake.wait()
            self._wake.clear()
            closing = self._closed  # close() wakes it for a last push of the final figures
            try:
                self._pc.push_to_gateway(self.pushgateway, job=self.job, registry=self.registry,
                                         grouping_key=self.grouping_key, timeout=10)
            except Exception as exc:
                self._push_error = exc
            if closing:
                return

    def close(self) -> None:
        """Stop serving (the port is free again), or push a last time and stop the pusher."""
        self._closed = True
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
