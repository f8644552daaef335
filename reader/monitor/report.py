"""Render the monitor: the interval table; and its JSONL records read back.

:func:`format_table` renders one ``Monitor.stats()`` dict as the interval report.

A record file holds one JSON object per line, one per reported interval, as
written by :class:`reader.monitor.monitor.Monitor` with ``record=``. Several loaders (or
runs) may append to one file; lines carry the loader ``name``.

Several ranks' files (each rank's ``record=``; every record of a monitor with
``ranks=`` carries its ``rank``), or a folder of ``.jsonl`` files, are summarized
file by file with a line naming the slowest rank (by loader capacity, the rule of
:mod:`reader.monitor.ranks`), and drawn as one verdict strip per rank under the
ranks' samples/s, waiting share and loader capacity on one wall-clock axis
(:func:`ranks_figure`).

``inspect-shards monitor-report FILE [FILE ...] [--plot out.png] [--json]`` is wired
to :func:`monitor_report_command`; :func:`main` is the same as a standalone entry.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from typing import Any, NamedTuple

from ..errors import MonitorRecordError
from .diagnosis import Thresholds
from .ranks import compare, loader_capacity

__all__ = [
    "METRICS",
    "Metric",
    "MonitorRecordError",
    "add_monitor_report_arguments",
    "format_ranks",
    "format_summary",
    "format_table",
    "load_records",
    "main",
    "monitor_report_command",
    "plot_ranks",
    "plot_records",
    "ranks_figure",
    "record_files",
    "summarize_ranks",
    "summarize_records",
    "timeline_figure",
]

class Metric(NamedTuple):
    """One reported figure: its one name everywhere, how it is shown, its limit.

    Attributes:
        key: the name in ``Monitor.stats()``, the printed table, the JSONL
            records and ``monitor-report`` (and the plot's legends).
        fmt: how the table prints it.
        limit: the :class:`Thresholds` attribute it is checked against, or None.
        op: ``"<"`` (must stay below the limit) or ``">"`` (above), or ``""``.
        meaning: what it measures, in a few words.
        only: for a figure that exists on some paths only, which
            (``"device='cuda'"``), else ``""``. Its row is left out of the printed
            table and summary where it is None throughout (so a CPU run's table has
            no empty GPU rows); ``stats()``, the records and the sinks keep the key
            with None, as for every figure.
    """

    key: str
    fmt: str
    limit: str | None
    op: str
    meaning: str
    only: str = ""


# The table's rows and monitor-report's figures, in display order. Each meaning is the
# one definition of its figure: the monitor guide's table of metrics is generated from
# them (docs/hooks.py, ``<!-- metrics -->``).
METRICS = (
    Metric("load_latency_ms", "{:.1f}", "max_load_latency_ms", "<",
           "mean time from a batch being requested to its builder finishing it (a worker, "
           "or the main process); with prefetch it may be long while nobody waits: read "
           "queue_wait_pct first"),
    Metric("load_latency_max_ms", "{:.1f}", None, "",
           "the longest such time: a rare stall (a slow shard, a download) shows here"),
    Metric("queue_wait_pct", "{:.1f}", "max_queue_wait_pct", "<",
           "share of wall time the training loop spent inside next(), waiting for a batch "
           "(or building it, without workers): what the loader costs you"),
    Metric("first_batch_wait_pct", "{:.1f}", None, "",
           "share of wall time spent waiting for each epoch's first batch: the workers' "
           "start-up, paid every epoch unless persistent_workers=True"),
    Metric("data_readiness_pct", "{:.1f}", None, "",
           "share of next() calls that found their batch already built (0 when batches are "
           "built inside next())"),
    Metric("worker_busy_pct", "{:.1f}", None, "",
           "the builders' busy time over their number x wall time: the workers, or the main "
           "process when it builds (workers 0); by builder on the line under the table "
           "(w0, w1, ...; main)"),
    Metric("io_share_pct", "{:.1f}", "max_io_share_pct", "<",
           "reading (paging in record bytes), share of the builders' busy time"),
    Metric("decode_share_pct", "{:.1f}", None, "",
           "decode (with the fused crop, resize, flip), share of the builders' busy time; "
           "most of it in a JPEG pipeline is normal, so it has no limit: the diagnosis says "
           "whether it is the bottleneck"),
    Metric("transform_share_pct", "{:.1f}", None, "",
           "transforms after the decode (user callables), share of the builders' busy time"),
    Metric("assemble_share_pct", "{:.1f}", None, "",
           "gathering the other fields into the batch, share of the builders' busy time"),
    Metric("read_mb_s", "{:.0f}", None, "",
           "bytes the builders paged in over the time that took: the storage's rate while "
           "reading, not the delivery rate, so far above mb_per_s when reading is a small "
           "part of the work; n/a where nothing is paged in (fields served as views over "
           "the shards, read when your code touches them: raw mode, text)"),
    Metric("h2d_gb_s", "{:.2f}", "min_h2d_gb_s", ">", "host-to-device copy bandwidth",
           "device='cuda'"),
    Metric("gpu_decode_pct", "{:.1f}", None, "", "share of samples the GPU decoded",
           "decode_device='cuda'"),
    Metric("gpu_img_s", "{:.0f}", None, "",
           "GPU-decoded images over the GPU stage's time (decode and resample)",
           "decode_device='cuda'"),
    Metric("cpu_img_s", "{:.0f}", None, "",
           "CPU-decoded images over the workers' decode and transform time, x workers",
           "decode_device='cuda'"),
    Metric("gpu_share", "{:.2f}", None, "",
           "the GPU's share of the next batches, as the split chose it (0..1)",
           "decode_device='cuda'"),
    Metric("samples_per_s", "{:.0f}", None, "", "samples delivered per second of wall time"),
    Metric("mb_per_s", "{:.1f}", None, "",
           "stored bytes delivered per second of wall time, every field's (images, text, "
           "tokens, annotations; as stored, before decoding)"),
    Metric("prefetch_depth", "{:.1f}", None, "",
           "batches in flight (requested, not yet delivered) when one was requested, on "
           "average; fewer than the workers leaves some idle"),
    Metric("loader_cpu_pct", "{:.1f}", None, "",
           "CPU time of this process and its workers, share of all cores; with the next "
           "two it sums to 100 (a short interval's split is approximate, to a few 10 ms "
           "ticks)"),
    Metric("other_cpu_pct", "{:.1f}", "max_other_cpu_pct", "<",
           "CPU time of every other process, share of all cores"),
    Metric("idle_cpu_pct", "{:.1f}", None, "", "idle share of all cores"),
    Metric("skipped", "{:d}", None, "",
           "records skipped as undecodable (on_error='skip'; a count)"),
)  # fmt: skip

# Figures summarized (min/mean/max/last over intervals): every metric but the count.
SUMMARY_KEYS = tuple(m.key for m in METRICS if m.key != "skipped")

_STAGE_SHARES = ("io_share_pct", "decode_share_pct", "transform_share_pct", "assemble_share_pct")


def _shown(metrics: tuple[Metric, ...], *figures: dict[str, Any]) -> list[Metric]:
    """The rows to print: every metric, but one that exists on some paths only
    (``Metric.only``) where none of ``figures`` has it (see :class:`Metric`)."""
    return [m for m in metrics if not m.only or any(f.get(m.key) is not None for f in figures)]


def _cell(value: Any, fmt: str, limit: float | None, op: str) -> str:
    if value is None:
        return "n/a"
    text = fmt.format(value)
    bad = limit is not None and ((op == "<" and value >= limit) or (op == ">" and value <= limit))
    return f"! {text}" if bad else text


def format_table(stats: dict[str, Any], thresholds: Thresholds | None = None) -> str:
    """Render a ``Monitor.stats()`` dict as the interval report.

    The threshold column is the figure's limit (``< 20``: it should stay below 20),
    from ``thresholds`` (:class:`Thresholds`, attribute :attr:`Metric.limit`); a value
    past it is prefixed with ``!``. A mark is a hint, not a verdict: the diagnosis
    line weighs the figures together (a long latency with no waiting is harmless).
    When the verdict shown is held against the last interval's own, a line says so.

    Args:
        stats: as returned by :meth:`Monitor.stats`.
        thresholds: the limits shown and checked; defaults to ``Thresholds()``.

    Returns:
        The table and the diagnosis line, without a trailing newline.
    """
    th = thresholds or Thresholds()
    cur, mean = stats["current"], stats["mean"]
    builders = cur.get("num_workers", mean["num_workers"])
    head = (
        f"[shardpack monitor{' ' + stats['name'] if stats.get('name') else ''}] t={stats['elapsed_s']:.1f}s  "
        f"batches {mean['batches']} (+{cur['batches']})  workers {builders}"
        + (" (the main process builds the batches, inside next())" if builders == 0 else "")
    )
    rows = [("metric", "current", "mean", "threshold")]
    for m in _shown(METRICS, cur, mean):
        limit = getattr(th, m.limit) if m.limit else None
        rows.append(
            (
                m.key,
                *(_cell(f.get(m.key), m.fmt, limit, m.op) for f in (cur, mean)),
                f"{m.op} {limit:g}" if limit is not None else "",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [head]
    for r in rows:
        lines.append(
            f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}"
            .rstrip()
        )
    per_worker = cur.get("per_worker") or {}
    if per_worker:
        shown = list(per_worker.items())[:16]
        busy = "  ".join(
            f"{w if w == 'main' else 'w' + w} "
            f"{'n/a' if v['busy_pct'] is None else format(v['busy_pct'], '.0f')}"
            for w, v in shown
        )
        more = f"  (+{len(per_worker) - 16} more)" if len(per_worker) > 16 else ""
        lines.append(f"worker_busy_pct by builder: {busy}{more}")
    lines.append(f"diagnosis: {stats['diagnosis']['message']}")
    own = stats.get("interval_diagnosis") or stats["diagnosis"]
    if (own.get("kind"), own.get("cause")) != (stats["diagnosis"]["kind"],
                                               stats["diagnosis"].get("cause")):  # fmt: skip
        lines.append(f"  (held: this interval alone reads {own['kind']}"
                     f"{' (' + own['cause'] + ')' if own.get('cause') else ''}; the verdict "
                     f"changes when {stats.get('window', 1)} intervals in a row agree)")  # fmt: skip
    return "\n".join(lines)


def load_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Parse a monitor JSONL file.

    Args:
        path: the file written with ``record=``.

    Returns:
        One dict per interval, in file order.

    Raises:
        MonitorRecordError: the file cannot be read, is empty, or a line is not
            a monitor record (the error names the line as ``record``, 1-based).
    """
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.readlines()
    except OSError as exc:
        raise MonitorRecordError(f"cannot read monitor records ({exc.strerror})", path=path) from exc
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise MonitorRecordError(
                f"not JSON ({exc.msg})", path=path, record=number, expected="a JSON object"
            ) from exc
        if not isinstance(rec, dict) or not isinstance(rec.get("current"), dict):
            raise MonitorRecordError(
                "not a monitor record",
                path=path,
                record=number,
                expected="an object with 'current' figures",
                found=type(rec).__name__ if not isinstance(rec, dict) else sorted(rec)[:6],
            )
        records.append(rec)
    if not records:
        raise MonitorRecordError("no monitor records in file", path=path)
    return records


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "min": min(values),
        "mean": sum(values) / len(values),
        "max": max(values),
        "last": values[-1],
    }


def summarize_records(path: str | os.PathLike) -> dict[str, Any]:
    """Summarize a monitor record file.

    Args:
        path: the JSONL file.

    Returns:
        ``{"path", "intervals", "loaders", "duration_s", "batches", "samples",
        "skipped", "figures": {key: {"min","mean","max","last"} or None},
        "diagnoses": {kind: intervals}, "bottleneck": most frequent kind,
        "bottleneck_cause": its most frequent cause, "bottleneck_message": the
        last message of that kind, "last_diagnosis": message}``. ``figures``
        has the :data:`METRICS` names. Counts are summed over intervals, and
        ``duration_s`` is the sum of interval wall times (summed per loader).

    Raises:
        MonitorRecordError: see :func:`load_records`.
    """
    return _summary(load_records(path), path)


def _summary(records: list[dict[str, Any]], path: str | os.PathLike) -> dict[str, Any]:
    currents = [r["current"] for r in records]
    figures = {
        key: _spread([c[key] for c in currents if c.get(key) is not None]) for key in SUMMARY_KEYS
    }
    verdicts = [r.get("diagnosis") or {} for r in records]
    kinds = Counter(d.get("kind", "unknown") for d in verdicts)
    bottleneck = kinds.most_common(1)[0][0]
    of_kind = [d for d in verdicts if d.get("kind", "unknown") == bottleneck]
    causes = Counter(d.get("cause") or "" for d in of_kind)
    return {
        "path": str(path),
        "intervals": len(records),
        "loaders": sorted({str(r["name"]) for r in records if r.get("name")}),
        "duration_s": sum(c.get("wall_s") or 0.0 for c in currents),
        "batches": sum(c.get("batches") or 0 for c in currents),
        "samples": sum(c.get("samples") or 0 for c in currents),
        "skipped": sum(c.get("skipped") or 0 for c in currents),
        "figures": figures,
        "diagnoses": dict(kinds.most_common()),
        "bottleneck": bottleneck,
        "bottleneck_cause": causes.most_common(1)[0][0],
        "bottleneck_message": of_kind[-1].get("message", ""),
        "last_diagnosis": verdicts[-1].get("message", ""),
    }


def _bottleneck_text(summary: dict[str, Any]) -> str:
    cause = f" ({summary['bottleneck_cause']})" if summary.get("bottleneck_cause") else ""
    n = summary["diagnoses"].get(summary["bottleneck"], 0)
    return f"{summary['bottleneck']}{cause} in {n} of {summary['intervals']} intervals"


def format_summary(summary: dict[str, Any]) -> str:
    """Render :func:`summarize_records` output as a table for people."""
    lines = [
        f"{summary['path']}: {summary['intervals']} intervals, {summary['duration_s']:.1f} s, "
        f"{summary['batches']} batches, {summary['samples']} samples, "
        f"{summary['skipped']} skipped, loaders {', '.join(summary['loaders']) or '-'}",
        f"{'metric':<22}{'min':>10}{'mean':>10}{'max':>10}{'last':>10}",
    ]
    figures = summary["figures"]
    for key in [m.key for m in _shown(METRICS, figures) if m.key in figures]:
        spread = figures[key]
        if spread is None:
            lines.append(f"{key:<22}{'n/a':>10}{'n/a':>10}{'n/a':>10}{'n/a':>10}")
        else:
            lines.append(
                f"{key:<22}"
                + "".join(f"{spread[s]:>10.1f}" for s in ("min", "mean", "max", "last"))
            )
    kinds = ", ".join(f"{k} {n}" for k, n in summary["diagnoses"].items())
    lines.append(f"diagnoses (intervals): {kinds}")
    lines.append(f"bottleneck: {_bottleneck_text(summary)}")
    if summary.get("bottleneck_message") and summary["bottleneck_message"] != summary["last_diagnosis"]:
        lines.append(f"  {summary['bottleneck_message']}")
    lines.append(f"last: {summary['last_diagnosis']}")
    return "\n".join(lines)


# Verdict colours of the plot's bottom strip.
_KIND_COLOURS = {
    "healthy": "tab:green", "cpu-bound": "tab:red", "io-bound": "tab:blue",
    "sync-bound": "tab:orange", "transfer-bound": "tab:purple", "no-data": "lightgrey",
}  # fmt: skip


def timeline_figure(records: list[dict[str, Any]], path: str | os.PathLike = ""):
    """A matplotlib Figure of monitor records over time.

    Panels, sharing the time axis: stage shares of worker time (stacked, the
    :data:`METRICS` names as labels); waiting and CPU shares (and the GPU's share of
    the samples, where it decoded); samples/s; load
    latency; and a strip coloured by each interval's verdict. The title names
    the file and the bottleneck; every legend sits right of its panel, outside
    the data.

    Args:
        records: as returned by :func:`load_records`.
        path: the file they came from, for the title.

    Raises:
        ImportError: matplotlib is not installed (with an install hint).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "plotting monitor records needs matplotlib: pip install 'shardpack[plot]'"
        ) from exc
    summary = _summary(records, path)
    t, elapsed = [], 0.0
    for r in records:
        # Intervals of several loaders interleave; their own clocks are used when present.
        elapsed = r.get("elapsed_s", elapsed + (r["current"].get("wall_s") or 0.0))
        t.append(elapsed)

    def series(key: str) -> list[float]:
        return [r["current"].get(key) or 0.0 for r in records]

    def present(key: str) -> bool:
        return any(r["current"].get(key) is not None for r in records)

    fig = Figure(figsize=(11, 9), layout="constrained")
    shares, waits, rate, latency, strip = fig.subplots(
        5, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2.5, 2, 2, 0.6]}
    )
    shares.stackplot(t, [series(k) for k in _STAGE_SHARES], labels=list(_STAGE_SHARES), alpha=0.8)
    shares.set_ylim(0, 100)
    shares.set_ylabel("% of worker time")
    for key in ("queue_wait_pct", "worker_busy_pct", "loader_cpu_pct", "other_cpu_pct",
                "gpu_decode_pct"):
        if present(key):
            waits.plot(t, series(key), label=key)
    waits.set_ylim(0, 105)
    waits.set_ylabel("%")
    rate.plot(t, series("samples_per_s"), color="tab:green", label="samples_per_s")
    rate.set_ylabel("samples/s")
    latency.plot(t, series("load_latency_ms"), color="black", label="load_latency_ms")
    if present("load_latency_max_ms"):
        latency.plot(t, series("load_latency_max_ms"), color="grey", linestyle=":",
                     label="load_latency_max_ms")  # fmt: skip
    latency.set_ylabel("ms")
    seen: dict[str, Any] = {}
    _verdict_strip(strip, records, t, seen)
    strip.set_yticks([])
    strip.set_ylabel("verdict", rotation=0, ha="right", va="center")
    strip.set_xlabel("seconds")
    for ax in (shares, waits, rate, latency):
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                  fontsize="small")  # fmt: skip
        ax.grid(alpha=0.3)
    strip.legend(list(seen.values()), list(seen), loc="upper left", bbox_to_anchor=(1.01, 1.0),
                 borderaxespad=0.0, fontsize="small", ncols=2)  # fmt: skip
    name = os.path.basename(str(path)) or "monitor records"
    loaders = f" ({', '.join(summary['loaders'])})" if summary["loaders"] else ""
    fig.suptitle(f"shardpack monitor: {name}{loaders}\nbottleneck: {_bottleneck_text(summary)}",
                 fontsize="medium")  # fmt: skip
    return fig


def _verdict_strip(strip, records: list[dict], t: list[float], seen: dict[str, Any]) -> None:
    """One bar per interval on ``strip``, coloured by its verdict, ending at its time;
    ``seen`` collects a bar per verdict for the legend."""
    for r, end in zip(records, t, strict=True):
        kind = (r.get("diagnosis") or {}).get("kind", "unknown")
        wall = r["current"].get("wall_s") or 0.0
        bar = strip.broken_barh([(end - wall, wall)], (0, 1),
                                color=_KIND_COLOURS.get(kind, "grey"))  # fmt: skip
        seen.setdefault(kind, bar)


def plot_records(path: str | os.PathLike, png: str | os.PathLike) -> None:
    """Draw :func:`timeline_figure` of a record file as a PNG.

    Args:
        path: the JSONL file.
        png: where to write the image.

    Raises:
        ImportError: matplotlib is not installed (with an install hint).
        MonitorRecordError: see :func:`load_records`.
    """
    fig = timeline_figure(load_records(path), path)
    fig.savefig(png, dpi=100)


def record_files(paths: list[str | os.PathLike]) -> list[str]:
    """The record files ``paths`` name: each a file, or a folder standing for its
    ``*.jsonl`` files (sorted by name).

    Raises:
        MonitorRecordError: a folder holds no ``.jsonl`` file, or a path does not exist.
    """
    out: list[str] = []
    for path in paths:
        text = os.fspath(path)
        if os.path.isdir(text):
            found = sorted(os.path.join(text, n) for n in os.listdir(text) if n.endswith(".jsonl"))
            if not found:
                raise MonitorRecordError("no .jsonl monitor record file in the folder", path=text)
            out.extend(found)
        else:
            out.append(text)
    return out


def _rank_of(records: list[dict[str, Any]], position: int) -> int:
    """The rank a file's records carry (a monitor with ``ranks=``), else its position."""
    ranks = {r["rank"] for r in records if isinstance(r.get("rank"), int)}
    return ranks.pop() if len(ranks) == 1 else position


def _load_ranks(paths: list[str]) -> list[tuple[int, str, list[dict[str, Any]]]]:
    runs = [(path, load_records(path)) for path in paths]
    return sorted(((_rank_of(recs, i), path, recs) for i, (path, recs) in enumerate(runs)),
                  key=lambda run: run[0])  # fmt: skip


def summarize_ranks(paths: list[str | os.PathLike]) -> dict[str, Any]:
    """Summarize several ranks' record files and name the slowest rank.

    Args:
        paths: record files, or folders of them (:func:`record_files`).

    Returns:
        ``{"ranks": [summary of each file (:func:`summarize_records`) with its
        ``rank`` and ``loader_samples_per_s``], "comparison": the comparison of
        :func:`reader.monitor.ranks.compare` over the whole runs}``.

    Raises:
        MonitorRecordError: see :func:`load_records`.
    """
    summaries, entries = [], {}
    for rank, path, records in _load_ranks(record_files(paths)):
        summary = _summary(records, path)
        currents = [r["current"] for r in records]
        batches = sum(c.get("batches") or 0 for c in currents)
        whole = {
            "batches": batches,
            "samples": summary["samples"],
            "num_workers": currents[-1].get("num_workers"),
            "busy_ms": (sum((c.get("busy_ms") or 0.0) * (c.get("batches") or 0) for c in currents)
                        / batches) if batches else None,
            "samples_per_s": summary["figures"]["samples_per_s"]["mean"]
            if summary["figures"]["samples_per_s"] else None,
            **{key: summary["figures"][key]["mean"] if summary["figures"][key] else None
               for key in ("queue_wait_pct", "gpu_decode_pct", "gpu_img_s")},
        }  # fmt: skip
        summary.update(rank=rank, loader_samples_per_s=loader_capacity(whole))
        summaries.append(summary)
        entries[rank] = {"figures": whole, "diagnosis": {
            "kind": summary["bottleneck"], "cause": summary["bottleneck_cause"],
            "message": summary["bottleneck_message"]}}  # fmt: skip
    world = max(max(entries) + 1, len(entries))
    return {"ranks": summaries, "comparison": compare(entries, world)}


def format_ranks(summary: dict[str, Any]) -> str:
    """Render :func:`summarize_ranks` output: each file's summary, then the comparison."""
    parts = [f"rank {s['rank']}: " + format_summary(s) for s in summary["ranks"]]
    rows = [f"{'rank':>5}{'loader/s':>11}{'samples/s':>11}{'wait %':>8}  bottleneck"]
    for s in summary["ranks"]:
        cap = s["loader_samples_per_s"]
        rate, wait = s["figures"]["samples_per_s"], s["figures"]["queue_wait_pct"]
        rows.append(f"{s['rank']:>5}{'n/a' if cap is None else format(cap, '.0f'):>11}"
                    f"{'n/a' if rate is None else format(rate['mean'], '.0f'):>11}"
                    f"{'n/a' if wait is None else format(wait['mean'], '.1f'):>8}"
                    f"  {_bottleneck_text(s)}")  # fmt: skip
    return "\n\n".join(parts) + "\n\n" + "\n".join(rows) + "\n" + summary["comparison"]["message"]


def ranks_figure(paths: list[str | os.PathLike]):
    """A matplotlib Figure of several ranks' records on one wall-clock axis.

    Panels: samples/s, the share of time waiting in ``next()`` and the loader
    capacity (:func:`reader.monitor.ranks.loader_capacity`), one line per rank;
    then one strip per rank coloured by each interval's verdict. The title names
    the slowest rank.

    Args:
        paths: record files, or folders of them.

    Raises:
        ImportError: matplotlib is not installed (with an install hint).
        MonitorRecordError: see :func:`load_records`.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "plotting monitor records needs matplotlib: pip install 'shardpack[plot]'"
        ) from exc
    runs = _load_ranks(record_files(paths))
    compared = summarize_ranks([path for _, path, _ in runs])["comparison"]
    t0 = min((r.get("time") or 0.0) - (r["current"].get("wall_s") or 0.0)
             for _, _, recs in runs for r in recs)  # fmt: skip
    fig = Figure(figsize=(11, 5 + 0.45 * len(runs)), layout="constrained")
    axes = fig.subplots(3 + len(runs), 1, sharex=True,
                        gridspec_kw={"height_ratios": [2.5, 2, 2] + [0.5] * len(runs)})
    rate, waits, capacity, strips = axes[0], axes[1], axes[2], axes[3:]
    seen: dict[str, Any] = {}
    for (rank, _path, recs), strip in zip(runs, strips, strict=True):
        t = [(r.get("time") or 0.0) - t0 for r in recs]
        rate.plot(t, [r["current"].get("samples_per_s") or 0.0 for r in recs], label=f"rank {rank}")
        waits.plot(t, [r["current"].get("queue_wait_pct") or 0.0 for r in recs],
                   label=f"rank {rank}")  # fmt: skip
        capacity.plot(t, [loader_capacity(r["current"]) or 0.0 for r in recs],
                      label=f"rank {rank}")  # fmt: skip
        _verdict_strip(strip, recs, t, seen)
        strip.set_yticks([])
        strip.set_ylabel(f"rank {rank}", rotation=0, ha="right", va="center")
    rate.set_ylabel("samples/s")
    waits.set_ylabel("queue_wait_pct")
    waits.set_ylim(0, 105)
    capacity.set_ylabel("loader samples/s")
    strips[-1].set_xlabel("seconds (wall clock)")
    for ax in (rate, waits, capacity):
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                  fontsize="small")  # fmt: skip
        ax.grid(alpha=0.3)
    strips[0].legend(list(seen.values()), list(seen), loc="upper left",
                     bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize="small", ncols=2)
    fig.suptitle(f"shardpack monitor: {len(runs)} ranks\n{compared['message']}", fontsize="medium")
    return fig


def plot_ranks(paths: list[str | os.PathLike], png: str | os.PathLike) -> None:
    """Draw :func:`ranks_figure` as a PNG."""
    ranks_figure(paths).savefig(png, dpi=100)


def add_monitor_report_arguments(
    parser: argparse.ArgumentParser, *, file: bool = True, json_flag: bool = True
) -> None:
    """Add ``FILE [--plot PNG] [--json]`` to a (sub)parser.

    Args:
        parser: the parser to extend.
        file: add the positional ``file`` (False when the parent parser already
            takes the path, e.g. inspect-shards' ``DST``).
        json_flag: add ``--json`` (False when a parent parser provides it).
    """
    if file:
        parser.add_argument("file", nargs="+", help="monitor JSONL record files (Loader monitor "
                            "record=), or folders of them: several ranks' files are compared")
    parser.add_argument("--plot", metavar="PNG", help="also draw a timeline PNG (needs "
                        "matplotlib: pip install 'shardpack[plot]')")
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def monitor_report_command(args: argparse.Namespace) -> int:
    """CLI handler: print the summary of ``args.file`` (or ``args.dst`` and ``args.more``);
    returns the exit status.

    One file: its summary (and timeline). Several, or a folder: each rank's summary
    and the slowest rank (and one strip per rank).

    Exit status 0 on success, 1 for an unreadable or malformed file or a
    missing matplotlib (message on stderr).
    """
    given = getattr(args, "file", None) or [args.dst, *(getattr(args, "more", None) or [])]
    plot = getattr(args, "plot", None)
    try:
        paths = record_files(given if isinstance(given, list) else [given])
        if len(paths) == 1:
            summary = summarize_records(paths[0])
            if plot:
                plot_records(paths[0], plot)
        else:
            summary = summarize_ranks(paths)
            if plot:
                plot_ranks(paths, plot)
    except (MonitorRecordError, ImportError, OSError) as exc:
        sys.stderr.write(f"monitor-report: {exc}\n")
        return 1
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    else:
        text = format_summary(summary) if len(paths) == 1 else format_ranks(summary)
        sys.stdout.write(text + "\n")
        if plot:
            sys.stdout.write(f"timeline written to {plot}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m reader.monitor.report FILE [FILE ...] [--plot PNG] [--json]``."""
    parser = argparse.ArgumentParser(
        prog="monitor-report", description="Summarize a shardpack monitor record file."
    )
    add_monitor_report_arguments(parser)
    return monitor_report_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
