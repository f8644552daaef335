"""scripts/bench.py without the `bench` extra's packages: each row that needs one is
skipped with a one-line reason naming what to install, never a traceback (issue 35:
with the `roi` extra but no Pillow, `bench --quick` crashed at its first row)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import simplejpeg

from scripts import bench
from scripts import harness as h


@pytest.fixture
def no_pillow(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "PIL.Image", None)


def test_missing_names_the_distribution_and_the_extra(no_pillow):
    assert h.missing("PIL") == "needs Pillow, not installed here: pip install 'shardpack[bench]'"
    assert h.missing("numpy") is None
    assert "no_such_module_35" in h.missing("numpy", "no_such_module_35")


def test_the_decode_rows_run_without_pillow_and_the_pillow_rows_say_why(no_pillow):
    jpeg = simplejpeg.encode_jpeg(np.zeros((240, 320, 3), np.uint8))
    rates = bench.decode_rates([jpeg] * 3)
    assert set(rates) == {"simplejpeg", "ours_rrc"} and all(r > 0 for r in rates.values())
    report = bench.new_report()
    case = bench.Case("1-core decode, PIL", "img/s", skipped=h.missing("PIL"))
    bench.row(report, case)
    assert report.rows == [("skip", "1-core decode, PIL",
                            "skipped: needs Pillow, not installed here: pip install "
                            "'shardpack[bench]'")]


def test_a_peer_runner_that_needs_pillow_is_skipped_before_it_starts(no_pillow, monkeypatch):
    def no_process(*args, **kwargs):
        raise AssertionError("a runner was started")

    monkeypatch.setattr(bench.subprocess, "Popen", no_process)
    res = bench.Runner(None, cold=False)("imagefolder", "pipeline", "imagefolder", "x")
    assert res == {"skipped": h.missing("PIL")}
    assert bench.runner_needs("wds", "pipeline") == ("webdataset", "torch")
    assert bench.runner_needs("shards", "pipeline") == ()
