"""The monitor: what the loader is doing, and what holds it back.

:mod:`~reader.monitor.monitor` (the :class:`~reader.monitor.monitor.Monitor` fed one
timing per batch, its periodic report and records, and ``enable_monitor``),
:mod:`~reader.monitor.diagnosis` (the verdict: which stage bounds the loader, and
the fix), :mod:`~reader.monitor.report` (the metric table, and ``monitor-report``
over recorded runs, one or several ranks'), :mod:`~reader.monitor.sinks` (where each
interval's figures go: JSONL, TensorBoard, Weights & Biases, Prometheus),
:mod:`~reader.monitor.trace` (the timeline of the last batches, a Chrome trace) and
:mod:`~reader.monitor.ranks` (each rank's figures in a shared folder; rank 0 names the
slowest).
"""

from .diagnosis import Thresholds
from .monitor import Monitor, disable_monitor, enable_monitor
from .sinks import JsonlSink, PrometheusSink, TensorBoardSink, WandbSink

__all__ = ["JsonlSink", "Monitor", "PrometheusSink", "TensorBoardSink", "Thresholds", "WandbSink",
           "disable_monitor", "enable_monitor"]
