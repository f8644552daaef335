"""The benchmarks' DALI peer without DALI: its settings parse, its rows say in one line
that DALI is missing, and the scaling figure is what BENCHMARKS.md says it is."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts import bench, bench_peers
from tests.helpers_paths import ROOT


@pytest.fixture
def no_dali(tmp_path, monkeypatch):
    """A PYTHONPATH on which ``import nvidia.dali`` fails, as where DALI is not installed."""
    hidden = tmp_path / "hidden"
    (hidden / "nvidia" / "dali").mkdir(parents=True)
    (hidden / "nvidia" / "__init__.py").write_text("")
    (hidden / "nvidia" / "dali" / "__init__.py").write_text(
        'raise ImportError("hidden by this test")\n')
    monkeypatch.setenv("PYTHONPATH", str(hidden))
    return hidden


def test_dali_settings_are_the_defaults_with_pairs_applied():
    s = bench_peers.dali_settings(["prefetch_queue_depth=3", "antialias=false", "crop=after",
                                   "exec_dynamic=true"])
    assert s == {**bench_peers.DALI_SETTINGS, "prefetch_queue_depth": 3, "antialias": False,
                 "crop": "after", "exec_dynamic": True}
    assert bench_peers.dali_settings(None) == bench_peers.DALI_SETTINGS
    kw = bench_peers._dali_pipeline_kw(2, 256, s)
    assert kw == {"batch_size": 256, "num_threads": 2, "device_id": None, "seed": 0,
                  "prefetch_queue_depth": 3, "exec_dynamic": True}  # op choices stay out
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        bench_peers.dali_settings(["antialias"])
    with pytest.raises(SystemExit, match="'antialais': not a setting these pipelines use"):
        bench_peers.dali_settings(["antialais=false"])  # a typo is refused, not ignored


@pytest.mark.parametrize("args", [["pipeline", "dali-files", "."],
                                  ["detection", "dali-det", ".", "--annotations", "a.json"]])
def test_runner_without_dali_says_so_in_one_line(no_dali, args):
    proc = subprocess.run([sys.executable, "scripts/bench_peers.py", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (line,) = proc.stdout.splitlines()
    why = json.loads(line)["skipped"]
    assert why.startswith("ImportError: DALI not installed in ") and "nvidia-dali" in why


def test_suite_skips_dali_with_one_line(no_dali):
    why = bench.dali_missing(sys.executable)
    assert why is not None and "\n" not in why and "nvidia-dali-cuda120" in why
    run = bench.Runner(sys.executable, cold=False)
    assert run("dali-files", "pipeline", "dali-files", ".") == {"skipped": why}


def test_scaling_is_rate_at_cores_over_cores_times_rate_at_one_per_round():
    at2 = bench.Case("a", "img/s", rates=[180.0, 150.0, 200.0])
    at1 = bench.Case("b", "img/s", rates=[100.0, 100.0, 100.0])
    assert bench.scaling(at2, at1, 2) == 0.9
