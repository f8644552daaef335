"""The example trainers run as files (``python scripts/train_example.py``), the way most
projects' examples run, as well as modules (``python -m scripts.train_example``), from
any folder (issue 35: run as files, they failed with ``No module named 'scripts'``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers_paths import ROOT

TRAINERS = ["train_example", "train_detection_example", "train_lm_example"]


def _run(argv, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing borrowed
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("name", TRAINERS)
def test_a_trainer_runs_as_a_file_from_another_folder(tmp_path, name):
    proc = _run([str(ROOT / "scripts" / f"{name}.py"), "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: {name}.py")


def test_train_example_as_a_module_and_as_a_file(tmp_path):
    proc = _run(["-m", "scripts.train_example", "--help"], ROOT)
    assert proc.returncode == 0 and proc.stdout.startswith("usage:"), proc.stderr
    pytest.importorskip("torch", reason="the example trainer needs PyTorch")
    proc = _run([str(ROOT / "scripts" / "train_example.py"), "--data", str(tmp_path / "toy"),
                 "--make-data", "--records", "32", "--batch-size", "8", "--workers", "0",
                 "--size", "24", "--steps", "2"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "done: 2 steps" in proc.stdout
