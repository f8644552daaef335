"""Across ranks: each rank's figures in a shared folder, rank 0 naming the slowest one,
and ``monitor-report`` over several ranks' records."""

from __future__ import annotations

import io
import json
import logging
import time
from pathlib import Path

import pytest

import reader
from formats.errors import ArgumentError
from reader import Monitor
from reader.monitor.ranks import STRAGGLER_PCT, RankFolder, compare, loader_capacity, rank_file
from reader.monitor.report import main as report_main
from reader.monitor.report import ranks_figure, summarize_ranks
from tests.helpers_monitor import CPU_BOUND, HEALTHY, FakeClock, feed
from tests.helpers_reader import CropPipeline, make_dataset
from tests.hostile import mount_tmpfs, umount


def entry(samples: int, busy_ms: float, workers: int = 2, batches: int = 10, kind="healthy"):
    return {"figures": {"samples": samples, "batches": batches, "busy_ms": busy_ms,
                        "num_workers": workers, "samples_per_s": 100.0, "queue_wait_pct": 5.0},
            "diagnosis": {"kind": kind, "cause": None, "message": kind}}  # fmt: skip


def test_loader_capacity_is_samples_per_busy_second_of_all_builders():
    # 10 batches of 32 samples, 40 ms each, 2 workers: 320 samples in 0.2 s of each worker.
    assert loader_capacity(entry(320, 40.0)["figures"]) == pytest.approx(1600.0)
    assert loader_capacity(entry(320, 40.0, workers=0)["figures"]) == pytest.approx(800.0)
    assert loader_capacity({"batches": 0, "samples": 0, "busy_ms": None}) is None


def test_compare_names_the_rank_far_below_the_median():
    entries = {0: entry(320, 10.0), 1: entry(320, 11.0), 2: entry(320, 10.5),
               3: entry(320, 40.0, kind="cpu-bound")}  # fmt: skip
    c = compare(entries, 4)
    assert c["straggler"] and c["slowest"]["rank"] == 3
    median = (1 / 11.0 + 1 / 10.5) / 2  # of the capacities (the middle two of four)
    assert c["slowest"]["behind_pct"] == pytest.approx(100 * (1 - (1 / 40.0) / median))
    assert c["message"].startswith("ranks: 4 of 4 reporting; straggler: rank 3:")
    assert "cpu-bound" in c["message"]


def test_compare_within_the_band_names_no_straggler_and_lists_the_silent_ranks():
    entries = {0: entry(320, 10.0), 2: entry(320, 10.0 / (1 - (STRAGGLER_PCT - 5) / 100))}
    c = compare(entries, 5)
    assert not c["straggler"] and c["slowest"]["rank"] == 2
    assert c["missing"] == [1, 3, 4]
    assert "2 of 5 reporting (not: 1, 3, 4)" in c["message"] and "no straggler" in c["message"]


def test_rank_files_are_named_by_rank_and_bad_ones_count_as_silent(tmp_path):
    clock = [1000.0]
    folders = [RankFolder(tmp_path, clock=lambda: clock[0]) for _ in range(4)]
    for r, f in enumerate(folders):
        f.set_rank(r, 4)
    stats = {"name": "x", "reports": 1, "interval_s": 1.0, "diagnosis": {"kind": "healthy"},
             "current": entry(320, 10.0)["figures"] | {"per_worker": {"0": {}}}}  # fmt: skip
    for f in folders[1:]:
        f.exchange(stats)
    assert sorted(p.name for p in tmp_path.iterdir()) == [rank_file(r) for r in (1, 2, 3)]
    assert "per_worker" not in json.loads((tmp_path / rank_file(1)).read_text())["figures"]
    (tmp_path / rank_file(2)).write_text('{"kind": "shardpack monitor rank", "rank": 2,')
    (tmp_path / rank_file(3)).write_text(
        (tmp_path / rank_file(1)).read_text().replace('"world_size": 4', '"world_size": 8'))
    assert folders[0].exchange(stats)["missing"] == [2, 3]
    clock[0] += 3 * 1.0 + 2  # rank 1's file is now stale
    assert folders[0].exchange(stats)["missing"] == [1, 2, 3]
    assert folders[1].exchange(stats) is None  # only rank 0 compares


def test_a_rank_out_of_range_or_a_file_for_a_folder_is_refused(tmp_path):
    with pytest.raises(ArgumentError, match=r"rank 4 is not in \[0, world_size=4\)"):
        RankFolder(tmp_path).set_rank(4, 4)
    (tmp_path / "f").write_text("")
    with pytest.raises(ArgumentError, match="exists and is not a folder"):
        Monitor(ranks=tmp_path / "f")


def test_the_rank_comes_from_the_environment_without_a_loader(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    clock = FakeClock()
    mon = Monitor(0.5, output=False, cpu=None, clock=clock, ranks=tmp_path)
    feed(mon, clock, HEALTHY, 40)
    assert (tmp_path / rank_file(2)).exists() and mon.ranks.last is None


def test_a_read_only_folder_stops_the_sharing_not_the_monitor(tmp_path, caplog):
    point = tmp_path / "ro"
    if not mount_tmpfs(point, "1m", "ro"):
        pytest.skip("needs root and mount for a real read-only disk")
    try:
        clock = FakeClock()
        mon = Monitor(0.5, output=False, cpu=None, clock=clock, ranks=point)
        mon.set_rank(0, 2)
        with caplog.at_level(logging.WARNING, logger="reader.monitor.ranks"):
            feed(mon, clock, CPU_BOUND, 200)
    finally:
        umount(point)
    assert mon.reports >= 3
    assert "Read-only" in mon.ranks.stopped
    assert len([r for r in caplog.records if r.name == "reader.monitor.ranks"]) == 1
    assert mon.ranks.last["reporting"] == 1  # rank 0 still compares what it has


# -- four ranks, one throttled ---------------------------------------------------------

INTERVAL = 0.2


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """Four Loaders (ranks 0-3 of 4) consumed in lockstep, as a synchronized job steps;
    rank 3's transform sleeps 4 ms a record. Returns (folder, rank 0's report texts)."""
    root = tmp_path_factory.mktemp("ranks")
    ds = make_dataset(root / "ds", n=4 * 16 * 40, records_per_shard=320)
    shared, records = root / "shared", root / "records"
    records.mkdir()
    out = io.StringIO()
    loaders = []
    for r in range(4):
        mon = Monitor(INTERVAL, output=out if r == 0 else False, cpu=None, ranks=shared,
                      record=records / f"rank{r}.jsonl", name=f"r{r}")  # fmt: skip
        loaders.append(reader.Loader(ds, 16, num_workers=1, prefetch=2, rank=r, world_size=4,
                                     transform=CropPipeline(sleep=0.004 if r == 3 else 0.0),
                                     monitor=mon))  # fmt: skip
    t0 = time.perf_counter()
    try:
        for _step in zip(*loaders, strict=True):
            if loaders[0].monitor.reports >= 5 or time.perf_counter() - t0 > 30:
                break
    finally:
        for loader in loaders:
            loader.monitor.flush()
            loader.close()
    reports = [block for block in out.getvalue().split("[shardpack monitor") if block]
    return shared, records, reports


def test_rank_0_names_the_throttled_rank_within_three_intervals(four_ranks):
    shared, _, reports = four_ranks
    assert sorted(p.name for p in shared.iterdir()) == [rank_file(r) for r in range(4)]
    lines = [line for text in reports for line in text.splitlines() if line.startswith("ranks:")]
    assert len(lines) == len(reports) >= 3
    first = next(i for i, line in enumerate(lines) if "straggler: rank 3:" in line)
    assert first < 3, lines[:3]
    # Never another rank, and from then on every report of all four names it.
    assert not [line for line in lines if "straggler: rank" in line
                and "straggler: rank 3:" not in line]  # fmt: skip
    assert all("straggler: rank 3:" in line for line in lines[first:] if "4 of 4" in line)


def test_monitor_report_compares_the_ranks_records(four_ranks, tmp_path, capsys):
    _, records, _ = four_ranks
    summary = summarize_ranks([records])
    assert [s["rank"] for s in summary["ranks"]] == [0, 1, 2, 3]
    assert summary["comparison"]["slowest"]["rank"] == 3 and summary["comparison"]["straggler"]
    png = tmp_path / "ranks.png"
    files = [str(records / f"rank{r}.jsonl") for r in range(4)]
    assert report_main([*files, "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "straggler: rank 3:" in text and text.count("rank ") >= 4
    assert png.stat().st_size > 10_000
    fig = ranks_figure([records])
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels[3:7] == [f"rank {r}" for r in range(4)]  # one strip per rank
    assert "straggler: rank 3:" in fig._suptitle.get_text()


def test_inspect_shards_monitor_report_takes_a_folder_or_several_files(four_ranks, capsys):
    from reader.inspect.cli import main as inspect_main

    _, records, _ = four_ranks
    assert inspect_main(["monitor-report", str(records), "--json"]) == 0
    folder = json.loads(capsys.readouterr().out)
    files = [str(records / f"rank{r}.jsonl") for r in range(4)]
    assert inspect_main(["monitor-report", *files, "--json"]) == 0
    several = json.loads(capsys.readouterr().out)
    assert folder["comparison"] == several["comparison"]
    assert several["comparison"]["slowest"]["rank"] == 3
    assert inspect_main(["monitor-report", files[0]]) == 0  # one file: as before
    assert "straggler" not in capsys.readouterr().out
    empty = Path(records).parent / "empty"
    empty.mkdir()
    assert inspect_main(["monitor-report", str(empty)]) == 1
    assert "no .jsonl monitor record file" in capsys.readouterr().err
