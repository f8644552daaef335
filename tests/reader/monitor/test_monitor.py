"""Monitor: figures, diagnosis of each bottleneck pattern, the report, the switches."""

from __future__ import annotations

import io
import itertools
import json
import logging

import numpy as np
import pytest

from reader.monitor import monitor as monitor_mod
from reader.monitor.diagnosis import Diagnosis, Thresholds, diagnose
from reader.monitor.monitor import (
    Monitor,
    MonitorConfig,
    default_monitor,
    disable_monitor,
    enable_monitor,
    format_table,
    resolve_monitor,
)
from reader.monitor.report import METRICS
from reader.runtime.proc import CpuTicks, ProcCpu
from tests.helpers_monitor import (
    CPU_BOUND,
    HEALTHY,
    IO_BOUND,
    STARVED,
    SYNC_BOUND,
    TRANSFER_BOUND,
    TRANSFORM_BOUND,
    FakeClock,
    FakeCpu,
    Pattern,
    feed,
    timing,
)

pytest.importorskip("reader.runtime.timing", reason="reader/runtime/timing.py (BatchTiming) not written yet")


def make(interval: float = 1.0, **kwargs) -> tuple[Monitor, FakeClock, io.StringIO]:
    """A Monitor on a fake clock; no CPU figures unless ``cpu`` is given (the real
    machine's would make the synthetic cases depend on what else runs)."""
    clock = FakeClock()
    out = io.StringIO()
    kwargs.setdefault("output", out)
    cpu = kwargs.pop("cpu", None)
    cpu = cpu(clock) if callable(cpu) and not isinstance(cpu, ProcCpu) else cpu
    return Monitor(interval, clock=clock, num_workers=2, cpu=cpu, **kwargs), clock, out


@pytest.mark.parametrize(
    ("pattern", "kind", "words"),
    [
        (HEALTHY, "healthy", "training step"),
        (CPU_BOUND, "cpu-bound", "--max-side"),
        (TRANSFORM_BOUND, "cpu-bound", "the transform is the cost"),
        (IO_BOUND, "io-bound", "larger shards"),
        (SYNC_BOUND, "sync-bound", "prefetch"),
        (TRANSFER_BOUND, "transfer-bound", "pinned"),
    ],
    ids=["healthy", "cpu", "transform", "io", "sync", "transfer"],
)
def test_synthetic_patterns_are_diagnosed(pattern, kind, words):
    mon, clock, out = make()
    feed(mon, clock, pattern, 200)
    stats = mon.stats()
    assert stats["reports"] >= 2
    assert stats["diagnosis"]["kind"] == kind, stats["diagnosis"]["message"]
    assert words in stats["diagnosis"]["message"]
    assert f"diagnosis: {stats['diagnosis']['message']}" in out.getvalue()


def test_transform_time_is_blamed_on_the_transform_not_the_decode():
    mon, clock, _ = make()
    feed(mon, clock, TRANSFORM_BOUND, 200)
    stats = mon.stats()
    assert stats["current"]["transform_share_pct"] == pytest.approx(80.0)
    assert stats["current"]["decode_share_pct"] == pytest.approx(10.0)
    d = stats["diagnosis"]
    assert d["cause"] == "transform" and "transform takes 80%" in d["message"]
    assert "--max-side" not in d["message"] and "GPU" in d["message"]


@pytest.mark.parametrize(
    ("other", "loader", "cause"),
    [(60.0, 39.0, "other-processes"), (10.0, 50.0, "dispatch"), (None, None, "dispatch")],
    ids=["starved", "idle-cores", "no-proc"],
)
def test_other_processes_taking_the_cores_are_named(other, loader, cause):
    """Workers idle although work is queued: a slow main process, unless other programs
    hold the cores; without CPU figures (no /proc) the old rule stands."""
    cpu = None if other is None else (lambda c: FakeCpu(c, loader_pct=loader, other_pct=other))
    mon, clock, _ = make(cpu=cpu)
    feed(mon, clock, STARVED, 300)
    stats = mon.stats()
    d = stats["diagnosis"]
    assert d["cause"] == cause, d["message"]
    if other is None:
        assert stats["current"]["other_cpu_pct"] is None
        assert d["kind"] == "sync-bound"
    else:
        assert stats["current"]["other_cpu_pct"] == pytest.approx(other, abs=0.5)
        assert stats["current"]["loader_cpu_pct"] == pytest.approx(loader, abs=0.5)
        assert stats["current"]["idle_cpu_pct"] == pytest.approx(100 - other - loader, abs=0.5)
    if cause == "other-processes":
        assert d["kind"] == "cpu-bound"
        assert "other processes use 60% of the cores" in d["message"]
        assert "decode takes 75%" in d["message"]  # what the workers' own time goes to
        assert "main process" not in d["message"]


def test_all_cores_busy_means_more_workers_will_not_help():
    mon, clock, _ = make(cpu=lambda c: FakeCpu(c, loader_pct=98.0, other_pct=1.0))
    feed(mon, clock, TRANSFORM_BOUND, 200)
    d = mon.stats()["diagnosis"]
    assert d["cause"] == "transform" and "more workers will not help" in d["message"]
    mon, clock, _ = make(cpu=lambda c: FakeCpu(c, loader_pct=50.0))
    feed(mon, clock, TRANSFORM_BOUND, 200)
    assert "add workers" in mon.stats()["diagnosis"]["message"]


def _hovering(clock, mon, intervals: int, busy_pcts: tuple[float, ...]) -> list[str]:
    """Steady work whose worker busy share takes ``busy_pcts`` in turn, one interval
    each (1 s = 50 batches of 20 ms); returns the verdict after each report."""
    kinds = []
    for i in range(intervals):
        busy = busy_pcts[i % len(busy_pcts)] / 100 * 2 * 0.020  # 2 workers
        p = Pattern(io=0.1 * busy, decode=0.8 * busy, transform=0.05 * busy,
                    assemble=0.05 * busy, step=0.005, wait=0.015, prefetch=4)  # fmt: skip
        before = mon.reports
        feed(mon, clock, p, 50, start=50 * i)
        if mon.reports > before:
            kinds.append(mon.stats()["diagnosis"]["kind"])
    return kinds


def test_verdict_is_stable_when_figures_hover_at_a_limit():
    """Worker busy alternating 72% / 78% around the 75% limit (sync- vs CPU-bound)."""
    alternating = (72.0, 78.0)
    # Judged one interval at a time with no band, the verdict flips every report...
    mon, clock, _ = make(window=1, thresholds=Thresholds(hysteresis=0.0))
    kinds = _hovering(clock, mon, 12, alternating)
    flips = sum(a != b for a, b in itertools.pairwise(kinds))
    assert set(kinds) == {"sync-bound", "cpu-bound"} and flips >= 8, kinds
    # ...by default it holds still once the first `window` (2) intervals, judged each
    # on its own, are past.
    mon, clock, _ = make()
    kinds = _hovering(clock, mon, 12, alternating)
    assert len(kinds) >= 10 and len(set(kinds[2:])) == 1, kinds
    # Two intervals each way (a slower wobble) is held by the band alone.
    mon, clock, _ = make()
    kinds = _hovering(clock, mon, 16, (72.0, 72.0, 78.0, 78.0))
    assert len(set(kinds[2:])) == 1, kinds


def _until_report(mon, clock, p: Pattern) -> None:
    """Deliver batches of ``p`` until the monitor reports."""
    reports = mon.reports
    while mon.reports == reports:
        feed(mon, clock, p, 1)


def test_one_odd_interval_does_not_change_the_verdict():
    mon, clock, out = make()
    for _ in range(5):
        _until_report(mon, clock, CPU_BOUND)
    _until_report(mon, clock, HEALTHY)  # one interval in which the consumer did not wait
    assert mon.stats()["current"]["queue_wait_pct"] < 5
    assert mon.stats()["interval_diagnosis"]["kind"] == "healthy"
    assert mon.stats()["diagnosis"]["kind"] == "cpu-bound"
    assert "(held: this interval alone reads healthy (consumer)" in out.getvalue().splitlines()[-1]
    for _ in range(2):  # it lasts: the verdict follows
        _until_report(mon, clock, HEALTHY)
    assert mon.stats()["diagnosis"]["kind"] == "healthy"


def test_table_records_and_stats_share_metric_names(tmp_path):
    path = tmp_path / "run.jsonl"
    mon, clock, out = make(record=path, cpu=FakeCpu)
    feed(mon, clock, CPU_BOUND, 60)
    record = json.loads(path.read_text().splitlines()[-1])
    table = out.getvalue().split("[shardpack monitor")[-1].splitlines()[2:]
    names = [row.split()[0] for row in table[:len([m for m in METRICS if not m.only])]]
    # A CPU run prints every row but those of paths it did not take (Metric.only) ...
    assert names == [m.key for m in METRICS if not m.only]
    assert table[len(names)].startswith("worker_busy_pct by builder")
    for span in ("current", "mean"):
        keys = {m.key for m in METRICS}  # ... which stats() and the records still carry
        assert keys <= set(record[span]) and keys <= set(mon.stats()[span])
        assert all(record[span][m.key] is None for m in METRICS if m.only)
    assert record["current"]["loader_cpu_pct"] == pytest.approx(50.0, abs=0.5)


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
    lines = {line.split(" ")[0]: line for line in text.splitlines()}
    assert "< 20" in lines["load_latency_ms"] and "! 40.0" in lines["load_latency_ms"]
    # A high decode share is what a JPEG pipeline does: no limit, no mark (the verdict
    # says whether it is the bottleneck).
    assert lines["decode_share_pct"].split()[1:] == ["75.0", "75.0"]
    assert "h2d_gb_s" not in lines and "gpu_img_s" not in lines  # no device path: no rows
    assert "< 10" in lines["queue_wait_pct"] and "!" in lines["queue_wait_pct"]
    assert lines["other_cpu_pct"].split()[1:3] == ["n/a", "n/a"]  # cpu=None
    assert lines["metric"].split() == ["metric", "current", "mean", "threshold"]


def test_healthy_table_marks_only_what_is_out_of_bounds():
    mon, clock, _ = make()
    feed(mon, clock, HEALTHY, 60)
    lines = {line.split(" ")[0]: line for line in format_table(mon.stats()).splitlines()}
    # Decode dominates worker time in a JPEG pipeline even when the loader keeps up: a
    # healthy run's table marks nothing.
    assert "53.3" in lines["decode_share_pct"]
    assert not [row for row in lines.values() if "!" in row], lines


def test_thresholds_are_configurable():
    mon, clock, _ = make(thresholds=Thresholds(max_queue_wait_pct=90.0))
    feed(mon, clock, CPU_BOUND, 100)
    assert mon.stats()["diagnosis"]["kind"] == "healthy"
    assert "< 90" in format_table(mon.stats(), Thresholds(max_queue_wait_pct=90.0))
    with pytest.raises(ValueError, match="max_decode_share_pct"):
        Thresholds(max_decode_share_pct=150)
    with pytest.raises(ValueError, match="min_h2d_gb_s"):
        Thresholds(min_h2d_gb_s=-1)
    with pytest.raises(ValueError, match="hysteresis"):
        Thresholds(hysteresis=1.0)
    with pytest.raises(ValueError, match="window"):
        Monitor(1, window=0)


def test_diagnose_is_a_pure_function_of_figures():
    base = {"batches": 10, "num_workers": 4, "load_latency_ms": 50.0, "queue_wait_pct": 40.0,
            "worker_busy_pct": 95.0, "io_share_pct": 10.0, "decode_share_pct": 60.0,
            "transform_share_pct": 25.0, "assemble_share_pct": 5.0}  # fmt: skip
    assert diagnose(base).kind == "cpu-bound"
    assert "decode takes 60%" in diagnose(base).message and diagnose(base).cause == "decode"
    transform = diagnose({**base, "decode_share_pct": 10, "transform_share_pct": 70})
    assert transform.cause == "transform" and "transform takes 70%" in transform.message
    assert "--max-side" not in transform.message
    # Other programs hold the cores: named, whatever the stages say; idle cores: not.
    busy_machine = {**base, "other_cpu_pct": 60.0, "loader_cpu_pct": 38.0, "idle_cpu_pct": 2.0}
    assert diagnose(busy_machine).cause == "other-processes"
    assert diagnose({**busy_machine, "idle_cpu_pct": 40.0}).cause == "decode"
    assert diagnose({**busy_machine, "queue_wait_pct": 2}).kind == "healthy"
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


def test_diagnose_keeps_the_previous_verdict_within_the_band():
    figures = {"batches": 10, "num_workers": 2, "queue_wait_pct": 40.0, "worker_busy_pct": 72.0,
               "prefetch_depth": 4.0, "io_share_pct": 5.0, "decode_share_pct": 90.0}  # fmt: skip
    cpu = Diagnosis("cpu-bound", "", "decode")
    sync = Diagnosis("sync-bound", "", "dispatch")
    assert diagnose(figures).kind == "sync-bound"  # alone: 72 < 75
    assert diagnose(figures, previous=cpu).kind == "cpu-bound"  # within 75 x (1 - 0.1)
    assert diagnose({**figures, "worker_busy_pct": 65.0}, previous=cpu).kind == "sync-bound"
    assert diagnose({**figures, "worker_busy_pct": 80.0}, previous=sync).kind == "sync-bound"
    assert diagnose({**figures, "worker_busy_pct": 85.0}, previous=sync).kind == "cpu-bound"
    healthy = Diagnosis("healthy", "", "consumer")
    assert diagnose({**figures, "queue_wait_pct": 10.5}, previous=healthy).kind == "healthy"
    assert diagnose({**figures, "queue_wait_pct": 9.5}, previous=sync).kind == "sync-bound"
    strict = Thresholds(hysteresis=0.0)
    assert diagnose({**figures, "queue_wait_pct": 9.5}, strict, previous=sync).kind == "healthy"


def test_output_to_logger_and_path(tmp_path, caplog):
    logger = logging.getLogger("shardpack.test.monitor")
    mon, clock, _ = make(output=logger)
    with caplog.at_level(logging.INFO, logger=logger.name):
        feed(mon, clock, HEALTHY, 60)
    assert any("queue_wait_pct" in r.getMessage() for r in caplog.records)

    path = tmp_path / "report.txt"
    mon, clock, _ = make(output=str(path))
    feed(mon, clock, HEALTHY, 60)
    assert path.read_text().count("[shardpack monitor") == mon.reports >= 1


def test_output_defaults_to_stderr(capsys):
    mon = Monitor(0.5, clock=(clock := FakeClock()), cpu=None)
    feed(mon, clock, HEALTHY, 60)
    err = capsys.readouterr().err
    assert "load_latency_ms" in err and "diagnosis: healthy" in err


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
    assert all(r["window"] == 2 and r["interval_diagnosis"]["kind"] == "io-bound" for r in lines)
    assert all(r["diagnosis"]["cause"] == "storage" for r in lines)


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
    assert resolve_monitor(True).config.interval == 5.0
    own = Monitor(1)
    assert resolve_monitor(own, num_workers=4) is own and own.num_workers == 4
    # Four kinds of value, one meaning each; the others say what to write instead.
    with pytest.raises(TypeError, match=r"pass monitor=reader\.Monitor\(5\)"):
        resolve_monitor(5)
    with pytest.raises(TypeError, match="for no monitor, pass monitor=False"):
        resolve_monitor(0)
    with pytest.raises(TypeError, match="enable_monitor takes the settings"):
        enable_monitor(Monitor(5))
    with pytest.raises(TypeError, match=r"pass monitor=config\.build\(\)"):
        resolve_monitor(MonitorConfig(interval=3))
    with pytest.raises(TypeError, match=r"monitor must be a reader\.Monitor, True, None or False"):
        resolve_monitor("5")
    with pytest.raises(ValueError, match="interval"):
        Monitor(0)
    assert monitor_mod._default is None


def test_stats_before_any_batch():
    mon = Monitor(5, cpu=None)
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
    mon = Monitor(1000.0, clock=clock, output=False, cpu=None)  # worker count inferred
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


def _fake_proc(root, pid: int, children: dict[int, str]) -> None:
    """A /proc with the machine's line, this process's stat and some children's."""
    (root / "stat").write_text("cpu  600 10 200 1000 90 5 5 0 40 0\ncpu0 1 2 3 4\n")
    for p, stat in {pid: "(python3) S 1 1 1 0 -1 0 0 0 0 0 70 30 25 5 20 0",
                    **children}.items():  # fmt: skip
        (root / str(p)).mkdir()
        (root / str(p) / "stat").write_text(f"{p} {stat}\n")


def test_proc_cpu_reads_machine_and_loader_ticks(tmp_path):
    import os

    pid = os.getpid()
    _fake_proc(tmp_path, pid, {
        # A worker whose name holds ") " : fields count from the last ')'.
        7001: "(shardpack w) 0) R 1 1 1 0 -1 0 0 0 0 0 40 10 0 0 20 0",
        7002: "(gone) Z",  # unparsable: skipped, not an error
    })  # fmt: skip
    ticks = ProcCpu(pids=lambda: [7001, 7002, 7003], root=str(tmp_path))()
    # total = user..steal (guest is inside user); idle = idle + iowait.
    assert ticks == CpuTicks(busy=820, total=1910, loader=70 + 30 + 25 + 5 + 40 + 10)


def test_proc_cpu_degrades_to_none_without_proc(tmp_path):
    assert ProcCpu(root=str(tmp_path / "missing"))() is None
    (tmp_path / "stat").write_text("intr 1 2 3\n")
    assert ProcCpu(root=str(tmp_path))() is None
    clock = FakeClock()
    mon = Monitor(1.0, clock=clock, output=False, num_workers=2,
                  cpu=ProcCpu(root=str(tmp_path / "missing")))  # fmt: skip
    feed(mon, clock, STARVED, 100)
    stats = mon.stats()
    assert stats["current"]["other_cpu_pct"] is None and stats["mean"]["idle_cpu_pct"] is None
    assert stats["diagnosis"]["kind"] == "sync-bound"
    assert "n/a" in format_table(stats)


def test_proc_cpu_on_this_machine_counts_a_busy_child():
    import multiprocessing
    import time

    cpu = ProcCpu()
    before = cpu()
    if before is None:
        pytest.skip("no readable /proc on this machine")
    child = multiprocessing.get_context("fork").Process(target=_spin, args=(0.3,))
    child.start()
    child.join()
    after = cpu()
    time.sleep(0)
    assert after.total > before.total and after.busy >= before.busy
    # The child's 0.3 s of CPU moved into this process's reaped-children time.
    assert after.loader - before.loader >= 0.2 * FakeCpu.HZ


def _spin(seconds: float) -> None:
    import time

    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


class ScriptedCpu:
    """CPU ticks read back from a list of (busy, total, loader) deltas, one per reading."""

    def __init__(self, deltas) -> None:
        self.deltas = list(deltas)
        self.now = CpuTicks(0, 0, 0)

    def __call__(self) -> CpuTicks:
        if self.deltas:
            busy, total, loader = self.deltas.pop(0)
            self.now = CpuTicks(self.now.busy + busy, self.now.total + total,
                                self.now.loader + loader)
        return self.now


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cpu_split_always_sums_to_100(seed):
    """The trial's case (a short interval of 3 ticks: loader 4, busy 2, read 133 %) and
    random readings in which the loader's ticks outrun the machine's busy ticks (the two
    come from different counters): loader + other + idle is 100 in every interval, and
    the loader's share never exceeds the busy share."""
    rng = np.random.default_rng(seed)
    deltas = [(0, 0, 0), (2, 3, 4)] + [
        (int(b), int(b + i), int(max(b + rng.integers(-20, 20), 0)))
        for b, i in zip(rng.integers(0, 200, 40), rng.integers(0, 200, 40), strict=True)
    ]
    clock = FakeClock()
    mon = Monitor(0.5, clock=clock, output=False, num_workers=2, cpu=ScriptedCpu(deltas))
    for i in range(len(deltas) - 1):
        clock.advance(0.5)
        mon.on_batch(timing(HEALTHY, i, i % 2))
        cur = mon.stats()["current"]
        parts = [cur["loader_cpu_pct"], cur["other_cpu_pct"], cur["idle_cpu_pct"]]
        if None in parts:
            continue
        assert sum(parts) == pytest.approx(100.0), (f"seed {seed} interval {i}", parts)
        assert all(0 <= p <= 100 for p in parts), parts
        assert cur["loader_cpu_pct"] <= 100 - cur["idle_cpu_pct"] + 1e-9, parts
    first = Monitor(0.5, clock=FakeClock(), output=False, num_workers=2,
                    cpu=ScriptedCpu([(0, 0, 0), (2, 3, 4)]))
    first.on_batch(timing(HEALTHY, 0, 0))
    first._clock.advance(0.5)
    first.on_batch(timing(HEALTHY, 1, 1))
    cur = first.stats()["current"]
    assert cur["loader_cpu_pct"] == pytest.approx(200 / 3)
    assert cur["other_cpu_pct"] == 0 and cur["idle_cpu_pct"] == pytest.approx(100 / 3)


def test_proc_cpu_counts_a_child_reaped_mid_reading_once(tmp_path, monkeypatch):
    """A worker reaped between the reading of this process's reaped-children time and
    the reading of the worker itself is counted once, then and later: not dropped from
    one reading and added whole to the next (which split an interval at > 100 %)."""
    import os

    from reader.runtime import proc

    pid = os.getpid()
    _fake_proc(tmp_path, pid, {7001: "(w) R 1 1 1 0 -1 0 0 0 0 0 400 100 0 0 20 0"})
    real = proc.process_ticks

    def reaped_while_read(p, children=False, root="/proc"):
        if p == 7001 and (tmp_path / "7001").exists():
            # The worker is reaped now: its 500 ticks move into our cutime.
            (tmp_path / "7001" / "stat").unlink()
            (tmp_path / "7001").rmdir()
            (tmp_path / str(pid) / "stat").write_text(
                f"{pid} (python3) S 1 1 1 0 -1 0 0 0 0 0 70 30 525 5 20 0\n")
            return None
        return real(p, children=children, root=root)

    monkeypatch.setattr(proc, "process_ticks", reaped_while_read)
    ticks = ProcCpu(pids=lambda: [7001], root=str(tmp_path))()
    assert ticks.loader == 70 + 30 + 525 + 5  # the worker's 500 ticks, once
