"""scripts/gpu_check.sh: the one-line skip without a GPU (what CI runs), and its GPU
branch driven end to end on the numpy stand-in for cupy (tests/fake_cupy.py)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest

from scripts import bench_gpu, gpu_requirements
from tests.helpers_paths import ROOT


def _check(tmp_path, *args, env=None):
    env = {**os.environ, "SHARDPACK_VENV": sys.prefix, **(env or {})}
    return subprocess.run(["bash", "scripts/gpu_check.sh", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path):
    hidden = tmp_path / "hidden"  # cupy made unimportable, as on a machine without it
    (hidden / "cupy").mkdir(parents=True)
    (hidden / "cupy" / "__init__.py").write_text('raise ImportError("hidden by this test")\n')
    out = tmp_path / "report.json"
    proc = _check(tmp_path, "--data", str(tmp_path / "data"), "--out", str(out),
                  env={"PYTHONPATH": str(hidden)})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    assert lines[0].startswith("gpu check: no usable GPU (cupy does not import: "
                               "ImportError: hidden by this test): skipped the GPU checks")
    report = json.loads(out.read_text())
    assert report["skipped"] == "cupy does not import: ImportError: hidden by this test"
    tests = report["stand_in_tests"]  # the checks that need no GPU did run, and passed
    assert tests["selection"] == "-m 'not gpu'" and tests["exit"] == 0
    assert tests["passed"] >= 10 and tests["failed"] == []
    assert f"{tests['passed']} passed, 0 failed" in lines[0]
    assert not (tmp_path / "data" / "shards-4096").exists()  # nothing measured, nothing made


@pytest.mark.parametrize("args", [["--wheels"], ["--wheels", "/nonexistent/wheels"],
                                  ["--download", "d", "--images", "8"]])
def test_bad_usage_is_refused_before_anything_is_installed(tmp_path, args):
    proc = _check(tmp_path, *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "gpu_check.sh: " in proc.stderr


def test_the_wheels_it_installs_come_from_pyproject(tmp_path):
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert gpu_requirements.requirements()[:len(project["dependencies"])] == project["dependencies"]
    assert set(project["optional-dependencies"]["gpu"]) <= set(gpu_requirements.requirements())
    for name in ("nvidia_dali_cuda120-2.3.0-py3-none-manylinux2014_x86_64.whl",
                 "nvidia_dali_cuda120-2.4.0-py3-none-manylinux2014_x86_64.whl",
                 "torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl"):
        (tmp_path / name).touch()
    extra = gpu_requirements.requirements(tmp_path)[len(gpu_requirements.requirements()):]
    assert extra == [str(tmp_path / "nvidia_dali_cuda120-2.4.0-py3-none-manylinux2014_x86_64.whl")]


@pytest.fixture
def stand_in(monkeypatch):
    from tests import fake_cupy

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    return fake_cupy


def test_a_driver_the_wheels_do_not_match_is_a_reason_not_a_crash(stand_in, monkeypatch):
    assert bench_gpu.gpu_unusable() is None

    def too_old():
        raise stand_in.CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is "
                                        "insufficient for CUDA runtime version")

    monkeypatch.setattr(stand_in.runtime, "getDeviceCount", too_old)
    assert "cudaErrorInsufficientDriver" in bench_gpu.gpu_unusable()
    monkeypatch.setattr(stand_in.runtime, "getDeviceCount", lambda: 0)
    assert "no CUDA device visible" in bench_gpu.gpu_unusable()


def test_gpu_branch_on_the_stand_in_writes_every_figure_and_the_table(tmp_path, stand_in,
                                                                      monkeypatch, capsys):
    ran = []

    def tests_on_the_device(marker, workdir):
        ran.append(marker)
        return {"selection": f"-m '{marker}'", "exit": 0, "passed": 9, "failed": [],
                "skips": {"torch without CUDA": 1}}

    monkeypatch.setattr(bench_gpu, "run_tests", tests_on_the_device)
    out = tmp_path / "gpu.json"
    rc = bench_gpu.main(["--data", str(tmp_path), "--out", str(out), "--images", "32",
                         "--batch", "16", "--workers", "1", "--rounds", "2", "--step-ms", "1"])
    table = capsys.readouterr().out
    assert rc == 0, table
    assert ran == ["gpu"]  # the device tests, with real cupy in a real run
    r = json.loads(out.read_text())
    assert r["device"]["name"] == "fake" and r["tests"]["passed"] == 9
    h = r["h2d"]
    assert (h["ring_mode"], h["staging_mode"]) == ("register", "staging")
    assert h["batch_bytes"] >= 16 * 224 * 224 * 3  # a whole batch's images (and labels)
    for key in ("raw_pinned_gb_s", "ring_gb_s", "ring_ratio", "staging_ratio"):
        assert math.isfinite(h[key]) and h[key] > 0
    e = r["epoch"]
    assert e["ok"] and e["batches"] == e["compared"] == 2 and e["max_abs_diff"] == 0
    p = r["pipeline"]
    assert len(p["cpu_img_s"]) == len(p["cuda_img_s"]) == 2 and p["ratio"] > 0
    assert p["met"] == (p["ratio"] >= 0.9)
    assert "nvidia.dali does not import" in r["dali"]["skipped"]
    for step in ("tests", "h2d", "epoch", "pipeline", "dali"):
        assert "error" not in r[step] and r[step]["seconds"] >= 0
    assert "(b) slot ring, register" in table and f"{h['ring_ratio']:.2f}" in table
    assert "pipeline to the GPU (float16 NCHW)" in table and f"{p['ratio']:.2f}" in table
    assert "9 passed, 0 failed, 1 skipped" in table
    assert re.search(r"\nDALI GPU pipeline +skipped\n", table)
    assert "skipped (1): torch without CUDA" in table
    assert "DALI GPU pipeline: nvidia.dali does not import" in table


def test_a_failing_step_is_reported_and_fails_the_check(tmp_path, stand_in, monkeypatch, capsys):
    monkeypatch.setattr(bench_gpu, "run_tests", lambda marker, workdir: {
        "selection": "-m 'gpu'", "exit": 1, "passed": 3, "failed": ["test_x: boom"], "skips": {}})

    def broken(*args):
        raise RuntimeError("the ring could not be registered")

    monkeypatch.setattr(bench_gpu, "h2d", broken)
    monkeypatch.setattr(bench_gpu, "pipeline", broken)
    monkeypatch.setattr(bench_gpu, "check_epoch", lambda *a: {
        "batches": 1, "compared": 1, "max_abs_diff": 0.5, "ok": False, "step_ms": 1.0, "queue_wait_fraction": 0.0})
    out = tmp_path / "gpu.json"
    rc = bench_gpu.main(["--data", str(tmp_path), "--out", str(out), "--images", "16",
                         "--batch", "16", "--workers", "1"])
    table = capsys.readouterr().out
    assert rc == 1
    r = json.loads(out.read_text())
    assert r["h2d"]["error"] == "RuntimeError: the ring could not be registered"
    assert "host-to-device: RuntimeError: the ring could not be registered" in table
    assert "MISMATCH" in table and "3 passed, 1 failed" in table and "FAILED test_x: boom" in table
