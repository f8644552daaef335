"""Render the monitor: the interval table; and its JSONL records read back.

:func:`format_table` renders one ``Monitor.stats()`` dict as the interval report.

A record file holds one JSON object per line, one per reported interval, as
written by :class:`reader.monitor.Monitor` with ``record=``. Several loaders (or
runs) may append to one file; lines carry the loader ``name``.

``inspect-shards monitor-report FILE [--plot out.png] [--json]`` is wired to
:func:`monitor_report_command`; :func:`main` is the same as a standalone entry.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from typing import Any

from formats.errors import ShardpackError
from reader.diagnosis import Thresholds

__all__ = [
    "MonitorRecordError",
    "add_monitor_report_arguments",
    "format_summary",
    "format_table",
    "load_records",
    "main",
    "monitor_report_command",
    "plot_records",
    "summarize_records",
]

# Figures summarized (min/mean/max/last over intervals), in display order.
SUMMARY_KEYS = (
    "load_latency_ms", "io_share_pct", "decode_share_pct", "transform_share_pct",
    "assemble_share_pct", "queue_wait_pct", "worker_busy_pct", "h2d_gb_s", "samples_per_s",
    "mb_per_s", "prefetch_depth",
)  # fmt: skip


class MonitorRecordError(ShardpackError):
    """A monitor record file is missing, empty, or has a malformed line."""


# (label, figure key, threshold attribute, "<" or ">", format)
_ROWS = (
    ("load latency (ms)", "load_latency_ms", "max_load_latency_ms", "<", "{:.1f}"),
    ("load latency max (ms)", "load_latency_max_ms", None, "", "{:.1f}"),
    ("io share (%)", "io_share_pct", "max_io_share_pct", "<", "{:.1f}"),
    ("decode share (%)", "decode_share_pct", "max_decode_share_pct", "<", "{:.1f}"),
    ("transform share (%)", "transform_share_pct", None, "", "{:.1f}"),
    ("assemble share (%)", "assemble_share_pct", None, "", "{:.1f}"),
    ("read rate (MB/s)", "read_mb_s", None, "", "{:.0f}"),
    ("transfer bandwidth (GB/s)", "h2d_gb_s", "min_h2d_gb_s", ">", "{:.2f}"),
    ("queue wait (%)", "queue_wait_pct", "max_queue_wait_pct", "<", "{:.1f}"),
    ("worker busy (%)", "worker_busy_pct", None, "", "{:.1f}"),
    ("samples/s", "samples_per_s", None, "", "{:.0f}"),
    ("throughput (MB/s)", "mb_per_s", None, "", "{:.1f}"),
    ("prefetch depth", "prefetch_depth", None, "", "{:.1f}"),
    ("skipped records", "skipped", None, "", "{:d}"),
)


def _cell(value: Any, fmt: str, limit: float | None, op: str) -> str:
    if value is None:
        return "n/a"
    text = fmt.format(value)
    bad = limit is not None and ((op == "<" and value >= limit) or (op == ">" and value <= limit))
    return f"! {text}" if bad else text


def format_table(stats: dict[str, Any], thresholds: Thresholds | None = None) -> str:
    """Render a ``Monitor.stats()`` dict as the interval report.

    Values outside their threshold are prefixed with ``!``.

    Args:
        stats: as returned by :meth:`Monitor.stats`.
        thresholds: the limits shown and checked; defaults to ``Thresholds()``.

    Returns:
        The table and the diagnosis line, without a trailing newline.
    """
    th = thresholds or Thresholds()
    cur, mean = stats["current"], stats["mean"]
    head = (
        f"[shardpack monitor{' ' + stats['name'] if stats.get('name') else ''}] t={stats['elapsed_s']:.1f}s  "
        f"batches {mean['batches']} (+{cur['batches']})  workers {mean['num_workers']}"
    )
    rows = [("metric", "current", "mean", "threshold")]
    for label, key, attr, op, fmt in _ROWS:
        limit = getattr(th, attr) if attr else None
        rows.append(
            (
                label,
                _cell(cur.get(key), fmt, limit, op),
                _cell(mean.get(key), fmt, limit, op),
                f"{op} {limit:g}" if limit is not None else "",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [head]
    for r in rows:
        lines.append(
            f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}"
        )
    per_worker = cur.get("per_worker") or {}
    if per_worker:
        shown = list(per_worker.items())[:16]
        busy = "  ".join(
            f"w{w} {'n/a' if v['busy_pct'] is None else format(v['busy_pct'], '.0f')}"
            for w, v in shown
        )
        more = f"  (+{len(per_worker) - 16} more)" if len(per_worker) > 16 else ""
        lines.append(f"worker busy by worker (%): {busy}{more}")
    lines.append(f"diagnosis: {stats['diagnosis']['message']}")
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
        "last_diagnosis": message}``. Counts are summed over intervals, and
        ``duration_s`` is the sum of interval wall times (summed per loader).

    Raises:
        MonitorRecordError: see :func:`load_records`.
    """
    records = load_records(path)
    currents = [r["current"] for r in records]
    figures = {
        key: _spread([c[key] for c in currents if c.get(key) is not None]) for key in SUMMARY_KEYS
    }
    kinds = Counter(r.get("diagnosis", {}).get("kind", "unknown") for r in records)
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
        "bottleneck": kinds.most_common(1)[0][0],
        "last_diagnosis": records[-1].get("diagnosis", {}).get("message", ""),
    }


def format_summary(summary: dict[str, Any]) -> str:
    """Render :func:`summarize_records` output as a table for people."""
    lines = [
        f"{summary['path']}: {summary['intervals']} intervals, {summary['duration_s']:.1f} s, "
        f"{summary['batches']} batches, {summary['samples']} samples, "
        f"{summary['skipped']} skipped, loaders {', '.join(summary['loaders']) or '-'}",
        f"{'metric':<22}{'min':>10}{'mean':>10}{'max':>10}{'last':>10}",
    ]
    for key, spread in summary["figures"].items():
        if spread is None:
            lines.append(f"{key:<22}{'n/a':>10}{'n/a':>10}{'n/a':>10}{'n/a':>10}")
        else:
            lines.append(
                f"{key:<22}"
                + "".join(f"{spread[s]:>10.1f}" for s in ("min", "mean", "max", "last"))
            )
    kinds = ", ".join(f"{k} {n}" for k, n in summary["diagnoses"].items())
    lines.append(f"diagnoses (intervals): {kinds}")
    lines.append(f"bottleneck: {summary['bottleneck']}")
    lines.append(f"last: {summary['last_diagnosis']}")
    return "\n".join(lines)


def plot_records(path: str | os.PathLike, png: str | os.PathLike) -> None:
    """Draw a PNG timeline: stage time per batch (stacked) and throughput.

    Args:
        path: the JSONL file.
        png: where to write the image.

    Raises:
        ImportError: matplotlib is not installed (with an install hint).
        MonitorRecordError: see :func:`load_records`.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed; must precede pyplot
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(
            "plotting monitor records needs matplotlib: pip install matplotlib"
        ) from exc
    records = load_records(path)
    t, elapsed = [], 0.0
    for r in records:
        # Intervals of several loaders interleave; their own clocks are used when present.
        elapsed = r.get("elapsed_s", elapsed + (r["current"].get("wall_s") or 0.0))
        t.append(elapsed)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    stages = ("io", "decode", "transform", "assemble")
    stacks = [[r["current"].get(f"{s}_ms") or 0.0 for r in records] for s in stages]
    top.stackplot(t, stacks, labels=[f"{s} ms" for s in stages], alpha=0.8)
    latency = [r["current"].get("load_latency_ms") or 0.0 for r in records]
    top.plot(t, latency, color="black", label="load latency ms")
    top.set_ylabel("ms per batch")
    top.legend(loc="upper left", fontsize="small")
    bottom.plot(t, [r["current"].get("samples_per_s") or 0.0 for r in records], label="samples/s")
    bottom.set_ylabel("samples/s")
    right = bottom.twinx()
    right.plot(
        t, [r["current"].get("queue_wait_pct") or 0.0 for r in records], color="tab:red",
        label="queue wait %",
    )  # fmt: skip
    right.set_ylabel("queue wait %")
    bottom.set_xlabel("seconds")
    bottom.legend(loc="upper left", fontsize="small")
    right.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


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
        parser.add_argument("file", help="a monitor JSONL record file (Loader monitor record=)")
    parser.add_argument("--plot", metavar="PNG", help="also draw a timeline PNG (needs matplotlib)")
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def monitor_report_command(args: argparse.Namespace) -> int:
    """CLI handler: print the summary of ``args.file`` (or ``args.dst``); returns the exit status.

    Exit status 0 on success, 1 for an unreadable or malformed file or a
    missing matplotlib (message on stderr).
    """
    path = getattr(args, "file", None) or args.dst
    plot = getattr(args, "plot", None)
    try:
        summary = summarize_records(path)
        if plot:
            plot_records(path, plot)
    except (MonitorRecordError, ImportError, OSError) as exc:
        sys.stderr.write(f"monitor-report: {exc}\n")
        return 1
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(format_summary(summary) + "\n")
        if plot:
            sys.stdout.write(f"timeline written to {plot}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m reader.monitor_report FILE [--plot PNG] [--json]``."""
    parser = argparse.ArgumentParser(
        prog="monitor-report", description="Summarize a shardpack monitor record file."
    )
    add_monitor_report_arguments(parser)
    return monitor_report_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
