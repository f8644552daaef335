"""Monitor: figures, diagnosis of each bottleneck pattern, the report, the switches."""

from __future__ import annotations

import io
import json
import logging

import pytest

from reader import monitor as monitor_mod
from reader.diagnosis import Thresholds, diagnose
from reader.monitor import (
    Monitor,
    MonitorConfig,
    default_monitor,
    disable_monitor,
    enable_monitor,
    format_table,
    resolve_monitor,
)
from tests.helpers_monitor import (
    CPU_BOUND,
    HEALTHY,
    IO_BOUND,
    SYNC_BOUND,
    TRANSFER_BOUND,
    FakeClock,
    Pattern,
    feed,
)

pytest.importorskip("reader.timing", reason="reader/timing.py (BatchTiming) not written yet")


def make(interval: float = 1.0, **kwargs) -> tuple[Monitor, FakeClock, io.StringIO]:
    clock = FakeClock()
    out = io.StringIO()
    kwargs.setdefault("output", out)
    return Monitor(interval, clock=clock, num_workers=2, **kwargs), clock, out


@pytest.mark.parametrize(
    ("pattern", "kind", "words"),
    [
        (HEALTHY, "healthy", "training step"),
        (CPU_BOUND, "cpu-bound", "--max-side"),
        (IO_BOUND, "io-bound", "larger shards"),
        (SYNC_BOUND, "sync-bound", "prefetch"),
        (TRANSFER_BOUND, "transfer-bound", "pinned"),
    ],
    ids=["healthy", "cpu", "io", "sync", "transfer"],
)
def test_synthetic_patterns_are_diagnosed(pattern, kind, words):
    mon, clock, out = make()
    feed(mon, clock, pattern, 200)
    stats = mon.stats()
    assert stats["reports"] >= 2
    assert stats["diagnosis"]["kind"] == kind, stats["diagnosis"]["message"]
    assert words in stats["diagnosis"]["message"]
    assert f"diagnosis: {stats['diagnosis']['message']}" in out.getvalue()


def test_figures_add_up():
    mon, clock, _ = make(interval=1000.0)
    feed(mon, clock, CPU_BOUND, 100)
    f = mon.stats()["current"]  # no report yet: the interval in progress
    # The run starts when the consumer began waiting for the first batch.
    wall = 100 * (CPU_BOUND.step + CPU_BOUND.wait) - CPU_BOUND.step
    assert f["batches"] == 100
    assert f["samples"] == 100 * CPU_BOUND.records
    assert f["bytes"] == 100 * CPU_BOUND.nbytes
    assert f["wall_s"] == pytest.approx(wall)
    assert f["queue_wait_pct"] == pytest.approx(100 * 100 * CPU_BOUND.wait / wall)
    assert f["decode_share_pct"] == pytest.approx(100 * 0.030 / 0.040)
    shares = sum(f[f"{s}_share_pct"] for s in ("io", "decode", "transform", "assemble"))
    assert shares == pytest.approx(100.0)
    # Slightly over 100% by the batch counted at the start of the run: capped.
    assert f["worker_busy_pct"] == pytest.approx(min(100 * 100 * 0.040 / (2 * wall), 100.0))
    assert f["samples_per_s"] == pytest.approx(100 * 32 / wall)
    assert f["read_mb_s"] == pytest.approx(CPU_BOUND.nbytes / CPU_BOUND.io / 1e6)
    assert f["load_latency_ms"] == pytest.approx(40.0)
    assert f["h2d_gb_s"] is None
    assert set(f["per_worker"]) == {"0", "1"}
    assert sum(w["batches"] for w in f["per_worker"].values()) == 100


def test_h2d_bandwidth_and_skipped():
    mon, clock, _ = make(interval=1000.0)
    feed(mon, clock, Pattern(h2d=0.002, h2d_bytes=20_000_000, skipped=1), 10)
    f = mon.stats()["mean"]
    assert f["h2d_gb_s"] == pytest.approx(10.0)
    assert f["skipped"] == 10


def test_current_follows_the_last_interval_mean_the_whole_run():
    mon, clock, _ = make(interval=1.0)
    feed(mon, clock, HEALTHY, 200)  # ~4 s healthy
    feed(mon, clock, CPU_BOUND, 200, start=200)  # ~4 s CPU-bound
    stats = mon.stats()
    assert stats["diagnosis"]["kind"] == "cpu-bound"
    assert stats["current"]["decode_share_pct"] == pytest.approx(75.0)
    # The whole-run mean mixes both halves.
    assert 20 < stats["mean"]["queue_wait_pct"] < stats["current"]["queue_wait_pct"]
    assert stats["mean"]["batches"] == 400
    assert stats["reports"] == pytest.approx(8, abs=1)


def test_reports_once_per_interval():
    mon, clock, out = make(interval=0.5)
    feed(mon, clock, HEALTHY, 100)  # 2 s
    assert mon.reports in (3, 4)
    assert out.getvalue().count("[shardpack monitor") == mon.reports
    mon.flush()
    assert mon.reports in (4, 5)  # flush reports the partial interval
    n = mon.reports
    mon.flush()
    assert mon.reports == n  # nothing new to report


def test_table_rows_thresholds_and_marks():
    mon, clock, out = make(interval=1.0)
    feed(mon, clock, CPU_BOUND, 60)
    text = out.getvalue().split("[shardpack monitor")[-1]
    for row in (
        "load latency (ms)", "decode share (%)", "io share (%)", "transfer bandwidth (GB/s)",
        "queue wait (%)", "samples/s", "worker busy (%)", "skipped records",
    ):  # fmt: skip
        assert row in text
    lines = {line.split("  ")[0]: line for line in text.splitlines()}
    assert "< 20" in lines["load latency (ms)"] and "! 40.0" in lines["load latency (ms)"]
    assert "< 35" in lines["decode share (%)"] and "! 75.0" in lines["decode share (%)"]
    assert "> 5" in lines["transfer bandwidth (GB/s)"]
    assert lines["transfer bandwidth (GB/s)"].split()[-4:-2] == ["n/a", "n/a"]
    assert "< 10" in lines["queue wait (%)"] and "!" in lines["queue wait (%)"]
    assert "metric" in text and "current" in text and "mean" in text and "threshold" in text


def test_healthy_table_marks_only_what_is_out_of_bounds():
    mon, clock, _ = make()
    feed(mon, clock, HEALTHY, 60)
    lines = {line.split("  ")[0]: line for line in format_table(mon.stats()).splitlines()}
    # Decode dominates worker time in a JPEG pipeline even when the loader keeps up.
    assert "! 53.3" in lines["decode share (%)"]
    for row in ("load latency (ms)", "queue wait (%)", "io share (%)", "samples/s"):
        assert "!" not in lines[row], lines[row]


def test_thresholds_are_configurable():
    mon, clock, _ = make(thresholds=Thresholds(max_queue_wait_pct=90.0))
    feed(mon, clock, CPU_BOUND, 100)
    assert mon.stats()["diagnosis"]["kind"] == "healthy"
    assert "< 90" in format_table(mon.stats(), Thresholds(max_queue_wait_pct=90.0))
    with pytest.raises(ValueError, match="max_decode_share_pct"):
        Thresholds(max_decode_share_pct=150)
    with pytest.raises(ValueError, match="min_h2d_gb_s"):
        Thresholds(min_h2d_gb_s=-1)


def test_diagnose_is_a_pure_function_of_figures():
    base = {"batches": 10, "num_workers": 4, "load_latency_ms": 50.0, "queue_wait_pct": 40.0,
            "worker_busy_pct": 95.0, "io_share_pct": 10.0, "decode_share_pct": 60.0,
            "transform_share_pct": 25.0, "assemble_share_pct": 5.0}  # fmt: skip
    assert diagnose(base).kind == "cpu-bound"
    assert "decode takes 60%" in diagnose(base).message
    assert diagnose({**base, "decode_share_pct": 10, "transform_share_pct": 70}).message.count(
        "transform takes 70%"
    )
    assert diagnose({**base, "io_share_pct": 70, "decode_share_pct": 20}).kind == "io-bound"
    remote = diagnose({**base, "io_share_pct": 70, "decode_share_pct": 20, "storage": "remote"})
    assert remote.kind == "io-bound" and "CacheOptions(prefetch_shards" in remote.message
    # High IO share but decode also high: the decode side is the one to fix first.
    assert diagnose({**base, "io_share_pct": 55, "decode_share_pct": 40}).kind == "cpu-bound"
    starved = {**base, "worker_busy_pct": 30, "prefetch_depth": 1.0}
    assert diagnose(starved).kind == "sync-bound"
    assert "raise prefetch" in diagnose(starved).message
    # Work is queued for every worker: more prefetch would not help, dispatch is slow.
    queued = {**starved, "prefetch_depth": 6.0}
    assert diagnose(queued).kind == "sync-bound"
    assert "slow to dispatch" in diagnose(queued).message
    assert diagnose({**base, "queue_wait_pct": 2}).kind == "healthy"
    slow_copy = {**base, "queue_wait_pct": 2, "h2d_gb_s": 1.0, "h2d_share_pct": 20}
    assert diagnose(slow_copy).kind == "transfer-bound"
    # A slow copy that costs next to nothing is not the bottleneck.
    assert diagnose({**slow_copy, "h2d_share_pct": 1}).kind == "healthy"
    assert diagnose({"batches": 0}).kind == "no-data"
    assert diagnose({"current": base, "mean": {}}).kind == "cpu-bound"


def test_output_to_logger_and_path(tmp_path, caplog):
    logger = logging.getLogger("shardpack.test.monitor")
    mon, clock, _ = make(output=logger)
    with caplog.at_level(logging.INFO, logger=logger.name):
        feed(mon, clock, HEALTHY, 60)
    assert any("queue wait (%)" in r.getMessage() for r in caplog.records)

    path = tmp_path / "report.txt"
    mon, clock, _ = make(output=str(path))
    feed(mon, clock, HEALTHY, 60)
    assert path.read_text().count("[shardpack monitor") == mon.reports >= 1


def test_output_defaults_to_stderr(capsys):
    mon = Monitor(0.5, clock=(clock := FakeClock()))
    feed(mon, clock, HEALTHY, 60)
    err = capsys.readouterr().err
    assert "load latency (ms)" in err and "diagnosis: healthy" in err


def test_record_jsonl(tmp_path):
    path = tmp_path / "run.jsonl"
    mon, clock, _ = make(output=False, record=path, name="train")
    feed(mon, clock, IO_BOUND, 150)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == mon.reports >= 2
    assert [r["interval"] for r in lines] == list(range(1, len(lines) + 1))
    assert {r["name"] for r in lines} == {"train"}
    assert all(r["diagnosis"]["kind"] == "io-bound" for r in lines)
    assert sum(r["current"]["batches"] for r in lines) <= 150
    assert lines[-1]["mean"]["batches"] == sum(r["current"]["batches"] for r in lines)
    assert lines[0]["thresholds"]["max_load_latency_ms"] == 20.0


def test_enable_disable_default():
    try:
        assert default_monitor() is None
        assert resolve_monitor(None) is None
        config = enable_monitor(interval=2, output=False)
        assert isinstance(config, MonitorConfig)
        mon = resolve_monitor(None, num_workers=3)
        assert isinstance(mon, Monitor) and mon.config.interval == 2 and mon.num_workers == 3
        assert mon.name.startswith("loader-")
        assert resolve_monitor(False) is None
        disable_monitor()
        assert resolve_monitor(None) is None
    finally:
        disable_monitor()
    assert resolve_monitor(5).config.interval == 5
    assert resolve_monitor(True).config.interval == 5.0
    own = Monitor(1)
    assert resolve_monitor(own, num_workers=4) is own and own.num_workers == 4
    assert resolve_monitor(MonitorConfig(interval=3)).config.interval == 3
    with pytest.raises(TypeError, match="monitor: expected"):
        resolve_monitor("5")
    with pytest.raises(ValueError, match="interval"):
        Monitor(0)
    assert monitor_mod._default is None


def test_stats_before_any_batch():
    mon = Monitor(5)
    stats = mon.stats()
    assert stats["diagnosis"]["kind"] == "no-data"
    assert stats["current"]["batches"] == 0
    assert stats["current"]["load_latency_ms"] is None
    assert "n/a" in format_table(stats)


def test_in_process_build_time_counts_as_waiting():
    """Worker -1 builds inside next(): wait_s is 0 but next_s holds the build."""
    from dataclasses import replace

    from tests.helpers_monitor import timing

    clock = FakeClock()
    mon = Monitor(1000.0, clock=clock, output=False)  # worker count inferred
    p = Pattern(step=0.002)
    for i in range(50):
        clock.advance(p.step + p.busy)
        mon.on_batch(replace(timing(p, i, -1), wait_s=0.0, next_s=p.busy))
    f = mon.stats()["current"]
    assert f["num_workers"] == 0
    assert f["queue_wait_pct"] == pytest.approx(100 * p.busy / (p.step + p.busy), rel=0.05)
    assert f["worker_busy_pct"] == pytest.approx(f["queue_wait_pct"], rel=0.05)
    d = mon.stats()["diagnosis"]
    assert d["kind"] == "cpu-bound" and "num_workers=0" in d["message"]
