"""scripts/gpu_check.sh: the one-line skip without a GPU (what CI runs), and its GPU
branch driven end to end, every step, on the stand-ins for cupy (tests/fake_cupy.py,
numpy) and nvImageCodec (tests/fake_nvimgcodec.py, simplejpeg): a rehearsal of the
lent GPU's one command, so a script bug costs CI seconds, not the device's minutes."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

from scripts import bench_gpu, gpu_requirements
from scripts import bench_gpu_decode as gd
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


@pytest.fixture
def stand_ins(stand_in, monkeypatch):
    """Both stand-ins: fake cupy, and fake nvImageCodec as ``nvidia.nvimgcodec``."""
    pytest.importorskip("simplejpeg")
    from tests import fake_nvimgcodec

    fake_nvimgcodec.reset()
    nvidia = types.ModuleType("nvidia")
    nvidia.nvimgcodec = fake_nvimgcodec
    monkeypatch.setitem(sys.modules, "nvidia", nvidia)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", fake_nvimgcodec)
    return stand_in, fake_nvimgcodec


def _positive(*xs):
    return all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in xs)


def test_a_driver_the_wheels_do_not_match_is_a_reason_not_a_crash(stand_in, monkeypatch):
    assert bench_gpu.gpu_unusable() is None

    def too_old():
        raise stand_in.CUDARuntimeError("cudaErrorInsufficientDriver: CUDA driver version is "
                                        "insufficient for CUDA runtime version")

    monkeypatch.setattr(stand_in.runtime, "getDeviceCount", too_old)
    assert "cudaErrorInsufficientDriver" in bench_gpu.gpu_unusable()
    monkeypatch.setattr(stand_in.runtime, "getDeviceCount", lambda: 0)
    assert "no CUDA device visible" in bench_gpu.gpu_unusable()


def test_gpu_branch_on_the_stand_ins_runs_every_step_and_writes_the_table(tmp_path, stand_ins,
                                                                           monkeypatch, capsys):
    """The device's command, every step, on tiny data (32 JPEGs, 0.2 s a rate)."""
    _, nv = stand_ins
    ran = []
    gpu_decoded_before = []  # regions nvImageCodec had decoded when gpu_decode began
    measure = gd.gpu_decode

    def gpu_decode(*args):
        gpu_decoded_before.append(len(nv.regions))
        return measure(*args)

    monkeypatch.setattr(gd, "gpu_decode", gpu_decode)

    def tests_on_the_device(marker, workdir):
        ran.append(marker)
        return {"selection": f"-m '{marker}'", "exit": 0, "passed": 9, "failed": [],
                "skips": {"torch without CUDA": 1}}

    monkeypatch.setattr(bench_gpu, "run_tests", tests_on_the_device)
    out = tmp_path / "gpu.json"
    rc = bench_gpu.main(["--data", str(tmp_path), "--out", str(out), "--images", "32",
                         "--batch", "8", "--workers", "2", "--rounds", "2", "--step-ms", "1",
                         "--seconds", "0.2"])
    table = capsys.readouterr().out
    assert rc == 0, table
    assert ran == ["gpu"]  # the device tests, with real cupy in a real run
    r = json.loads(out.read_text())
    assert r["device"]["name"] == "fake" and r["tests"]["passed"] == 9
    for step in ("tests", "data", "h2d", "epoch", "pipeline", "dali", "gpu_decode", "cpu_scaling"):
        assert "error" not in r[step] and r[step]["seconds"] >= 0
    # h2d, epoch and pipeline measure the CPU decode's path to the GPU, nvImageCodec
    # or not (decode_device="auto" would have decoded their batches on the GPU).
    assert gpu_decoded_before == [0] and len(nv.regions) > 0
    h = r["h2d"]
    assert (h["ring_mode"], h["staging_mode"]) == ("register", "staging")
    assert h["batch_bytes"] >= 8 * 224 * 224 * 3  # a whole batch's images (and labels)
    assert _positive(h["raw_pinned_gb_s"], h["ring_gb_s"], h["ring_ratio"], h["staging_ratio"])
    e = r["epoch"]
    assert e["ok"] and e["batches"] == e["compared"] == 4 and e["max_abs_diff"] == 0
    p = r["pipeline"]
    assert len(p["cpu_img_s"]) == len(p["cuda_img_s"]) == 2 and _positive(p["ratio"])
    assert p["met"] == (p["ratio"] >= 0.9)
    assert "nvidia.dali does not import" in r["dali"]["skipped"]
    g = r["gpu_decode"]
    assert g["workers"] == 2 and set(g["img_s"]) == {"own", "gpu", "hybrid", "cpu"}
    for rates in g["img_s"].values():
        assert len(rates) == 2 and _positive(*rates)
    assert _positive(g["gpu_over_own"], g["hybrid_over_sum"], g["hybrid_over_cpu"])
    assert g["met"]["gpu_over_own"] == (g["gpu_over_own"] >= 0.85)
    assert len(g["hybrid_share"]) == 2 and all(0 < s < 1 for s in g["hybrid_share"])
    px = g["pixels"]
    assert len(px["mean_abs_diff"]) == len(px["max_abs_diff"]) == 3 and px["images"] == 32
    assert all(0 <= m <= 2 for m in px["mean_abs_diff"]) and max(px["max_abs_diff"]) <= 8
    o = g["overlap"]  # the step is 1.25 x the GPU pipeline's batch time
    assert o["step_ms"] == pytest.approx(1.25 * 8 / np.median(g["img_s"]["gpu"]) * 1e3, rel=0.01)
    assert _positive(o["img_s"], o["of_step_bound"]) and 0 <= o["queue_wait_fraction"] < 1
    assert o["met"] == (o["of_step_bound"] >= 0.9)
    c = r["cpu_scaling"]
    assert c["bare_processes"] == 2 and len(c["bare_img_s"]) == 2 and _positive(*c["bare_img_s"])
    assert set(c["loader_img_s"]) == set(c["per_worker_img_s"]) == {"1", "2"}
    for n, rates in c["loader_img_s"].items():
        assert len(rates) == 2 and _positive(*rates, c["per_worker_img_s"][n])
    assert _positive(c["loader_over_bare"]) and c["met"] == (c["loader_over_bare"] >= 0.9)
    assert "(b) slot ring, register" in table and f"{h['ring_ratio']:.2f}" in table
    assert "pipeline to the GPU (float16 NCHW)" in table and f"{p['ratio']:.2f}" in table
    assert "9 passed, 0 failed, 1 skipped" in table
    assert re.search(r"\nDALI GPU pipeline +skipped\n", table)
    assert "skipped (1): torch without CUDA" in table
    assert "DALI GPU pipeline: nvidia.dali does not import" in table
    assert "nvImageCodec's own batch decode" in table and "our GPU-decode pipeline" in table
    assert f"{g['gpu_over_own']:.2f}" in table and f"{g['hybrid_over_sum']:.2f}" in table
    assert str(px["mean_abs_diff"]) in table
    assert f"GPU pipeline + {o['step_ms']:.0f} ms step" in table
    assert "2 bare processes (decode+crop+flip)" in table and "Loader, 2 workers" in table
    assert f"{c['loader_over_bare']:.2f}" in table
    assert "GPU decode (nvImageCodec)" not in table  # neither skipped nor failed


def test_the_own_rate_refuses_images_nvimgcodec_did_not_decode(tmp_path, stand_ins):
    """nvImageCodec returns None for every image where no backend decodes (no nvjpeg):
    counting those would report a rate of nothing decoded."""
    simplejpeg = pytest.importorskip("simplejpeg")
    _, nv = stand_ins
    jpegs = [np.frombuffer(simplejpeg.encode_jpeg(np.full((16, 16, 3), v, np.uint8)), np.uint8)
             for v in (10, 200)]
    assert gd.nvimgcodec_rate(jpegs, 2, seconds=0.05) > 0
    nv.fail.add(bytes(jpegs[1]))
    with pytest.raises(RuntimeError, match="decoded 1 of 2 JPEGs of a batch"):
        gd.nvimgcodec_rate(jpegs, 2, seconds=0.05)
    with pytest.raises(RuntimeError, match="make no batch of 4: give more --images"):
        gd.nvimgcodec_rate(jpegs, 4, seconds=0.05)


def test_without_nvimgcodec_gpu_decode_is_skipped_saying_which_wheels(tmp_path, stand_in,
                                                                      monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # import fails
    monkeypatch.setattr(bench_gpu, "run_tests", lambda marker, workdir: {
        "selection": "-m 'gpu'", "exit": 0, "passed": 1, "failed": [], "skips": {}})
    out = tmp_path / "gpu.json"
    rc = bench_gpu.main(["--data", str(tmp_path), "--out", str(out), "--images", "16",
                         "--batch", "16", "--workers", "1", "--only", "tests,gpu_decode"])
    table = capsys.readouterr().out
    assert rc == 0, table
    r = json.loads(out.read_text())
    assert "nvidia_nvimgcodec_cu12" in r["gpu_decode"]["skipped"] and "cpu_scaling" not in r
    assert re.search(r"\nGPU decode \(nvImageCodec\) +skipped\n", table)


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
                         "--batch", "16", "--workers", "1", "--only", "tests,h2d,epoch,pipeline"])
    table = capsys.readouterr().out
    assert rc == 1
    r = json.loads(out.read_text())
    assert r["h2d"]["error"] == "RuntimeError: the ring could not be registered"
    assert "host-to-device: RuntimeError: the ring could not be registered" in table
    assert "MISMATCH" in table and "3 passed, 1 failed" in table and "FAILED test_x: boom" in table
