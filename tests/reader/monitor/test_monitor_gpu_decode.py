"""The monitor's GPU decode figures (``decode_device="cuda"``): their arithmetic on
synthetic timings, the table's rows (only where the path was taken), the records,
monitor-report and the sinks, the diagnosis, the ranks' capacity, and one Loader run
on the stand-ins (numpy for cupy, simplejpeg for nvImageCodec) with its timeline."""

from __future__ import annotations

import io
import json
import os
import sys
import types
from dataclasses import replace

import pytest

from reader.monitor.diagnosis import diagnose
from reader.monitor.monitor import Monitor
from reader.monitor.ranks import loader_capacity
from reader.monitor.report import METRICS, format_summary, format_table, main, summarize_records
from reader.monitor.sinks import scalars
from reader.monitor.trace import MAIN
from tests.helpers_monitor import CPU_BOUND, HEALTHY, SYNC_BOUND, FakeClock, feed
from tests.reader.monitor.test_monitor_trace import check_chrome_trace

GPU_KEYS = ("gpu_decode_pct", "gpu_img_s", "cpu_img_s", "gpu_share")

# CPU_BOUND with the GPU decoding 12 of each batch's 32 images in 4 ms; the workers
# decode and transform the other 20 in 30 + 6 ms.
GPU_CPU_BOUND = replace(CPU_BOUND, gpu_records=12, gpu_decode=0.004, gpu_share=0.375)


def make(interval: float = 1000.0, **kwargs) -> tuple[Monitor, FakeClock, io.StringIO]:
    clock = FakeClock()
    out = io.StringIO()
    kwargs.setdefault("output", out)
    return Monitor(interval, clock=clock, num_workers=2, cpu=None, **kwargs), clock, out


def rows(text: str) -> dict[str, list[str]]:
    """The last table's rows by metric name."""
    table = text.split("[shardpack monitor")[-1].splitlines()[2:]
    return {line.split()[0]: line.split()[1:] for line in table if line and line[0] != " "}


def test_the_figures_are_the_intervals_sums():
    mon, clock, _ = make()
    feed(mon, clock, GPU_CPU_BOUND, 99)
    feed(mon, clock, replace(GPU_CPU_BOUND, gpu_share=0.5), 1, start=99)
    for span in ("current", "mean"):
        f = mon.stats()[span]
        assert f["gpu_decode_pct"] == pytest.approx(100 * 12 / 32)
        assert f["gpu_img_s"] == pytest.approx(12 / 0.004)  # measured, not an estimate
        # the workers' 20 images in 36 ms of decode and transform, 2 of them at once
        assert f["cpu_img_s"] == pytest.approx(20 * 2 / 0.036)
        assert f["gpu_share"] == 0.5  # the latest, not an average


def test_skipped_records_and_a_side_that_decoded_nothing():
    mon, clock, _ = make()
    feed(mon, clock, replace(GPU_CPU_BOUND, skipped=4), 10)
    f = mon.stats()["current"]
    assert f["cpu_img_s"] == pytest.approx((32 - 12 - 4) * 2 / 0.036)  # as the split counts
    mon, clock, _ = make()
    feed(mon, clock, replace(GPU_CPU_BOUND, gpu_records=0, gpu_decode=0.0), 10)
    f = mon.stats()["current"]
    assert f["gpu_decode_pct"] == 0.0 and f["gpu_img_s"] is None  # no rate, not 0 img/s
    assert f["cpu_img_s"] == pytest.approx(32 * 2 / 0.036)


def test_a_cpu_run_has_the_keys_with_none_and_no_rows():
    mon, clock, out = make(interval=1.0)
    feed(mon, clock, CPU_BOUND, 100)
    stats = mon.stats()
    for span in ("current", "mean"):
        assert all(stats[span][k] is None for k in GPU_KEYS)
    shown = rows(out.getvalue())
    assert list(shown)[:-1] == [m.key for m in METRICS if not m.only]  # and "diagnosis:"


def test_a_gpu_runs_table_shows_the_rows_until_both_columns_are_empty():
    mon, clock, out = make(interval=1.0)
    feed(mon, clock, replace(GPU_CPU_BOUND, h2d=0.002, h2d_bytes=4_000_000), 100)
    shown = rows(out.getvalue())
    keys = [m.key for m in METRICS]
    assert [k for k in shown if k in keys] == keys  # every row, in METRICS order
    assert shown["gpu_decode_pct"] == ["37.5", "37.5"]
    assert shown["gpu_img_s"] == ["3000", "3000"]
    assert shown["cpu_img_s"] == ["1111", "1111"]
    assert shown["gpu_share"] == ["0.38", "0.38"]
    assert shown["h2d_gb_s"] == ["!", "2.00", "!", "2.00", ">", "5"]  # below its limit
    # The GPU stops (decode_device="cpu" next run): current is empty, the mean is not.
    feed(mon, clock, CPU_BOUND, 100, start=100)
    shown = rows(out.getvalue())
    assert shown["gpu_img_s"] == ["n/a", "3000"]
    stats = mon.stats()
    stats["mean"] = stats["current"]  # both empty: the rows go
    assert "gpu_img_s" not in rows(format_table(stats))


def test_records_monitor_report_and_sinks_carry_them(tmp_path, capsys):
    path = tmp_path / "run.jsonl"
    got = []
    mon, clock, _ = make(interval=1.0, output=False, record=path, sinks=[got.append])
    feed(mon, clock, GPU_CPU_BOUND, 100)
    mon.flush()
    record = json.loads(path.read_text().splitlines()[-1])
    assert record["current"]["gpu_img_s"] == pytest.approx(3000)
    assert record["current"]["gpu_share"] == 0.375
    exported = scalars(got[-1])
    assert {k: round(exported[k], 1) for k in GPU_KEYS} == {
        "gpu_decode_pct": 37.5, "gpu_img_s": 3000.0, "cpu_img_s": 1111.1, "gpu_share": 0.4}
    summary = summarize_records(path)
    assert summary["figures"]["gpu_img_s"]["mean"] == pytest.approx(3000)
    assert summary["figures"]["cpu_img_s"]["last"] == pytest.approx(20 * 2 / 0.036)
    assert "gpu_decode_pct" in format_summary(summary)
    assert main([str(path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["figures"]["gpu_decode_pct"]["max"] == pytest.approx(37.5)


def test_a_cpu_runs_records_keep_the_keys_as_none_and_sinks_leave_them_out(tmp_path):
    path = tmp_path / "cpu.jsonl"
    got = []
    mon, clock, _ = make(interval=1.0, output=False, record=path, sinks=[got.append])
    feed(mon, clock, CPU_BOUND, 100)
    mon.flush()
    record = json.loads(path.read_text().splitlines()[-1])
    assert all(k in record["current"] and record["current"][k] is None for k in GPU_KEYS)
    assert not set(GPU_KEYS) & set(scalars(got[-1]))  # None is left out, never 0
    summary = summarize_records(path)
    assert all(summary["figures"][k] is None for k in GPU_KEYS)
    assert "gpu_img_s" not in format_summary(summary)


def test_a_cpu_bound_loader_says_what_the_gpu_already_decodes():
    mon, clock, _ = make(interval=1.0)
    feed(mon, clock, GPU_CPU_BOUND, 200)
    d = mon.stats()["diagnosis"]
    assert (d["kind"], d["cause"]) == ("cpu-bound", "decode")
    assert "the GPU decodes 38% of the samples at 3000 img/s (the workers 1111 img/s)" \
        in d["message"]
    assert "moving more to the GPU will not help" in d["message"]
    assert "add workers" in d["message"]
    mon, clock, _ = make(interval=1.0)
    feed(mon, clock, CPU_BOUND, 200)
    assert "GPU" not in mon.stats()["diagnosis"]["message"]


def test_the_gpu_clause_only_where_it_applies():
    base = {"batches": 10, "samples": 320, "wall_s": 1.0, "queue_wait_pct": 40,
            "worker_busy_pct": 95, "num_workers": 2, "gpu_decode_pct": 25.0,
            "gpu_img_s": 800.0, "cpu_img_s": None}
    read = diagnose({**base, "io_share_pct": 40, "decode_share_pct": 30})
    assert read.cause == "read" and "GPU" not in read.message  # the split does not read
    decode = diagnose({**base, "decode_share_pct": 80})
    assert "the GPU decodes 25% of the samples at 800 img/s," in decode.message
    assert "workers" not in decode.message.split("->")[0].split("GPU")[1]  # no CPU rate known
    assert "GPU" not in diagnose({**base, "decode_share_pct": 80, "gpu_decode_pct": 0}).message


def test_a_slow_main_process_names_the_gpu_stage():
    # 80 of 320 images at 800 img/s: 0.1 s of the 1 s wall in the main process.
    f = {"batches": 10, "samples": 320, "wall_s": 1.0, "queue_wait_pct": 40,
         "worker_busy_pct": 30, "num_workers": 2, "prefetch_depth": 4,
         "gpu_decode_pct": 25.0, "gpu_img_s": 800.0}
    d = diagnose(f)
    assert (d.kind, d.cause) == ("sync-bound", "dispatch")
    assert "the GPU decode stage, which runs there, takes 10% of wall time" in d.message
    mon, clock, _ = make(interval=1.0)
    feed(mon, clock, SYNC_BOUND, 200)
    assert "GPU" not in mon.stats()["diagnosis"]["message"]


def test_the_gpu_stage_bounds_a_ranks_capacity():
    f = {"batches": 10, "samples": 320, "busy_ms": 20.0, "num_workers": 2}
    assert loader_capacity(f) == pytest.approx(320 * 2 / 0.2)  # 3200/s from the workers
    # The GPU takes a quarter of every batch at 400 img/s: 1600 samples/s at most.
    assert loader_capacity({**f, "gpu_decode_pct": 25.0, "gpu_img_s": 400.0}) \
        == pytest.approx(1600)
    assert loader_capacity({**f, "gpu_decode_pct": 25.0, "gpu_img_s": 40_000.0}) \
        == pytest.approx(3200)
    assert loader_capacity({**f, "gpu_decode_pct": None, "gpu_img_s": None}) \
        == pytest.approx(3200)


def test_healthy_gpu_runs_stay_healthy():
    mon, clock, _ = make(interval=1.0)
    feed(mon, clock, replace(HEALTHY, gpu_records=16, gpu_decode=0.003, gpu_share=0.5), 200)
    d = mon.stats()["diagnosis"]
    assert d["kind"] == "healthy" and "GPU" not in d["message"]


@pytest.fixture
def stand_ins(monkeypatch):
    """fake cupy and fake nvImageCodec in place of the real ones (as in test_gpu_decode)."""
    pytest.importorskip("simplejpeg")
    pytest.importorskip("cv2")
    from tests import fake_cupy, fake_nvimgcodec

    fake_cupy.copies.clear()
    fake_cupy.launches.clear()
    fake_nvimgcodec.regions.clear()
    fake_nvimgcodec.fail.clear()
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    nvidia = types.ModuleType("nvidia")
    nvidia.nvimgcodec = fake_nvimgcodec
    monkeypatch.setitem(sys.modules, "nvidia", nvidia)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", fake_nvimgcodec)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_hybrid_loader_reports_both_rates_and_the_split(tmp_path, rng, stand_ins, num_workers):
    import reader
    from reader.options import DeviceOptions
    from tests.reader.runtime.test_gpu_decode import RRC_FLIP, _dataset

    _dataset(tmp_path, rng, 40)
    trace = tmp_path / "trace.json"
    mon = Monitor(1000.0, output=False, cpu=None, trace=trace)
    with reader.Loader(tmp_path, 5, num_workers=num_workers, seed=3, shuffle=True,
                       transform=RRC_FLIP, device="cuda", monitor=mon,
                       device_options=DeviceOptions(decode_device="cuda")) as lo:
        for _ in lo:
            pass
    mean = mon.stats()["mean"]
    assert mean["samples"] == 40
    assert 0 < mean["gpu_decode_pct"] < 100
    assert mean["gpu_img_s"] > 0 and mean["cpu_img_s"] > 0
    assert 0 < mean["gpu_share"] < 1
    assert "gpu_img_s" in format_table(mon.stats())
    mon.close()
    doc = json.loads(trace.read_text())
    main_track = check_chrome_trace(doc)[(os.getpid(), MAIN)]  # spans nest, as Perfetto needs
    stages = [e for e in main_track if e["name"] == "GPU decode"]
    delivers = [e for e in main_track if e["name"] == "deliver"]
    assert len(stages) == len(delivers) == 8
    assert sum(e["args"]["records"] for e in stages) == round(40 * mean["gpu_decode_pct"] / 100)
    for g, d in zip(stages, delivers, strict=True):
        assert d["ts"] == g["ts"] and g["ts"] + g["dur"] <= d["ts"] + d["dur"]


def test_the_timeline_plot_draws_the_gpus_share(tmp_path):
    pytest.importorskip("matplotlib", reason="plotting needs matplotlib")
    from reader.monitor.report import load_records, timeline_figure

    def labels(pattern):
        path = tmp_path / f"{id(pattern)}.jsonl"
        mon, clock, _ = make(interval=1.0, output=False, record=path)
        feed(mon, clock, pattern, 100)
        mon.flush()
        fig = timeline_figure(load_records(path), path)
        return {t.get_text() for ax in fig.axes if ax.get_legend() is not None
                for t in ax.get_legend().get_texts()}

    assert "gpu_decode_pct" in labels(GPU_CPU_BOUND)
    assert "gpu_decode_pct" not in labels(CPU_BOUND)
