"""Monitor records read back: summary, CLI handler, bad files, the PNG timeline."""

from __future__ import annotations

import json

import pytest

from reader import Monitor
from reader.monitor.report import (
    METRICS,
    MonitorRecordError,
    format_summary,
    load_records,
    main,
    plot_records,
    summarize_records,
    timeline_figure,
)
from tests.helpers_monitor import (
    CPU_BOUND,
    HEALTHY,
    TRANSFORM_BOUND,
    FakeClock,
    FakeCpu,
    feed,
)


@pytest.fixture
def records(tmp_path):
    """A record file: ~4 s healthy then ~4 s CPU-bound, 1 s intervals."""
    path = tmp_path / "run.jsonl"
    clock = FakeClock()
    mon = Monitor(1.0, output=False, record=path, clock=clock, num_workers=2, name="train",
                  cpu=FakeCpu(clock))  # fmt: skip
    feed(mon, clock, HEALTHY, 200)
    feed(mon, clock, CPU_BOUND, 200, start=200)
    mon.flush()
    return path, mon


def test_summary(records):
    path, mon = records
    s = summarize_records(path)
    assert s["intervals"] == mon.reports
    assert s["batches"] == 400
    assert s["samples"] == 400 * 32
    assert s["loaders"] == ["train"]
    assert s["duration_s"] == pytest.approx(mon.stats()["elapsed_s"])
    assert set(s["diagnoses"]) == {"healthy", "cpu-bound"}
    assert s["bottleneck"] in ("healthy", "cpu-bound")
    assert s["last_diagnosis"].startswith("CPU-bound")
    wait = s["figures"]["queue_wait_pct"]
    assert wait["min"] == pytest.approx(0.0) and wait["max"] > 50
    assert wait["min"] <= wait["mean"] <= wait["max"]
    assert s["figures"]["h2d_gb_s"] is None
    assert s["figures"]["loader_cpu_pct"]["mean"] == pytest.approx(50.0, abs=0.5)
    text = format_summary(s)
    assert "queue_wait_pct" in text and "bottleneck:" in text
    assert "h2d_gb_s" not in text  # a path this CPU run did not take: no row (Metric.only)


def test_summary_uses_the_table_and_record_names(records):
    path, _ = records
    names = [m.key for m in METRICS]
    assert list(summarize_records(path)["figures"]) == [n for n in names if n != "skipped"]
    current = load_records(path)[-1]["current"]
    assert set(names) <= set(current)
    rows = [line.split()[0] for line in format_summary(summarize_records(path)).splitlines()[2:]]
    printed = [m.key for m in METRICS if not m.only and m.key != "skipped"]
    assert rows[: len(printed)] == printed


def test_cli_text_and_json(records, capsys):
    path, _ = records
    assert main([str(path)]) == 0
    assert "diagnoses (intervals)" in capsys.readouterr().out
    assert main([str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["batches"] == 400


def test_bad_files(tmp_path, capsys):
    with pytest.raises(MonitorRecordError, match="cannot read"):
        summarize_records(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(MonitorRecordError, match="no monitor records"):
        summarize_records(empty)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"current": {"batches": 1}}\n{oops\n')
    with pytest.raises(MonitorRecordError, match="record 2: not JSON"):
        summarize_records(bad)
    bad.write_text('{"current": {"batches": 1}}\n[1, 2]\n')
    with pytest.raises(MonitorRecordError, match="record 2: not a monitor record"):
        summarize_records(bad)
    assert main([str(bad)]) == 1
    assert "bad.jsonl record 2" in capsys.readouterr().err


def test_plot(records, tmp_path):
    pytest.importorskip("matplotlib", reason="plotting needs matplotlib")
    path, _ = records
    png = tmp_path / "timeline.png"
    plot_records(path, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 5000


def test_plot_has_a_title_naming_the_bottleneck_and_legends_off_the_data(tmp_path):
    pytest.importorskip("matplotlib", reason="plotting needs matplotlib")
    path = tmp_path / "aug.jsonl"
    clock = FakeClock()
    mon = Monitor(1.0, output=False, record=path, clock=clock, num_workers=2, name="aug",
                  cpu=FakeCpu(clock))  # fmt: skip
    feed(mon, clock, HEALTHY, 60)
    feed(mon, clock, TRANSFORM_BOUND, 300, start=60)
    fig = timeline_figure(load_records(path), path)
    fig.draw_without_rendering()
    title = fig.get_suptitle()
    assert "aug.jsonl (aug)" in title
    assert "bottleneck: cpu-bound (transform) in" in title
    legends = [(ax, ax.get_legend()) for ax in fig.axes if ax.get_legend() is not None]
    assert len(legends) == len(fig.axes) == 5
    labels = {t.get_text() for _, leg in legends for t in leg.get_texts()}
    assert {"decode_share_pct", "transform_share_pct", "queue_wait_pct", "other_cpu_pct",
            "samples_per_s", "load_latency_ms", "cpu-bound", "healthy"} <= labels  # fmt: skip
    figure_box = fig.bbox
    for _, legend in legends:
        box = legend.get_window_extent()
        # Off every panel's data area, and inside the image (not cut off).
        assert not any(box.overlaps(ax.get_window_extent()) for ax in fig.axes), labels
        assert figure_box.x0 <= box.x0 and box.x1 <= figure_box.x1 + 1


def test_plot_without_matplotlib_names_the_fix(records, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ImportError, match=r"pip install 'shardpack\[plot\]'"):
        plot_records(records[0], tmp_path / "x.png")


def test_handler_fits_a_parent_parser_with_dst(records, capsys):
    """inspect-shards style: ``DST`` positional and ``--json`` on the parent parser."""
    import argparse

    from reader.monitor.report import add_monitor_report_arguments, monitor_report_command

    parser = argparse.ArgumentParser()
    parser.add_argument("dst")
    parser.add_argument("--json", action="store_true")
    add_monitor_report_arguments(parser, file=False, json_flag=False)
    args = parser.parse_args([str(records[0]), "--json"])
    assert monitor_report_command(args) == 0
    assert json.loads(capsys.readouterr().out)["intervals"] == records[1].reports


def test_inspect_shards_monitor_report_command(records, capsys):
    from reader.inspect.cli import main

    assert main([str(records[0]), "monitor-report", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["batches"] == 400
    assert main([str(records[0]), "monitor-report"]) == 0
    assert "train" in capsys.readouterr().out


def test_inspect_shards_monitor_report_plot_makes_missing_folders(records, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="plotting needs matplotlib")
    from reader.inspect.cli import main

    png = tmp_path / "new" / "dir" / "t.png"
    assert main([str(records[0]), "monitor-report", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_monitor_guide_s_table_of_metrics_is_generated_from_metrics():
    """One place per fact: the guide holds a marker, the docs hook renders every metric's
    meaning and default limit from METRICS and Thresholds; no meaning is copied by hand."""
    import importlib.util
    from pathlib import Path

    from reader.monitor.diagnosis import Thresholds

    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("docs_hooks", root / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    guide = (root / "docs" / "guides" / "monitor.md").read_text()
    assert "<!-- metrics -->" in guide
    rendered = hooks.on_page_markdown(guide, type("Page", (), {"file": None}), None, None)
    rows = {line.split("|")[1].strip(" `"): line for line in rendered.splitlines()
            if line.startswith("| `")}
    for m in METRICS:
        assert m.key in rows, m.key
        assert m.meaning[1:40] in rows[m.key], m.key
        assert m.meaning not in guide, f"{m.key}: its meaning copied into the guide"
        if m.limit:
            assert f"{m.op} {getattr(Thresholds(), m.limit):g} (`{m.limit}`)" in rows[m.key]
    assert rows["decode_share_pct"].rstrip().endswith("| — |")
