"""``pack-dataset --engine ray --ray-address`` joining a cluster that ``ray start`` runs
on this machine: the multi-node path, end to end, in a separate process."""

from __future__ import annotations

import os
import queue
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'shardpack[ray]'")

import formats
from packer import PackOptions, pack
from tests.helpers_packer import image_folder
from tests.helpers_paths import ROOT

RAY = Path(sys.executable).with_name("ray")


@pytest.fixture(scope="module")
def head():
    """A head node started by ``ray start --block`` (stopping that process stops exactly
    the processes it started), with token authentication as Ray >= 2.59 has it. The
    token rides in the environment, and HOME is a temporary folder: a token file in
    the real ~/.ray would turn authentication on for every later Ray user there."""
    if not RAY.exists():
        pytest.skip(f"no ray command beside {sys.executable}")
    temp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths have a length limit
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "HOME": temp}
    proc = subprocess.Popen(
        [str(RAY), "start", "--head", "--block", "--num-cpus", "2", "--port", "0",
         "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", temp],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    # Read on a thread, to the end: the deadline holds even if ray start goes quiet, and
    # a full pipe never blocks the head.
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, proc.stdout), lines.put(None)],
                     daemon=True).start()
    address, seen, deadline = None, [], time.monotonic() + 120
    try:
        while address is None:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            seen.append(line)
            m = re.search(r"--address='([^']+)'", line)
            address = m.group(1) if m else None
        if address is None:
            pytest.fail("ray start printed no address within 120 s:\n" + "".join(seen[-30:]))
        yield address, env
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(temp, ignore_errors=True)


def test_pack_dataset_joins_a_running_cluster(head, tmp_path):
    address, env = head
    src = tmp_path / "src"
    image_folder(src, np.random.default_rng(7), classes=("a", "b", "c"), per_class=8)
    out = subprocess.run(
        [sys.executable, "-m", "packer.cli", str(src), str(tmp_path / "ray"), "--engine", "ray",
         "--ray-address", address, "--task-records", "5", "--json"],
        capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    pack(src, tmp_path / "local", PackOptions(workers=0, durable=False))
    a, b = formats.open_shards(tmp_path / "ray"), formats.open_shards(tmp_path / "local")
    assert len(a.manifest.shards) == 5  # 24 records in ranges of 5

    def plain(r):
        return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in r.items()}

    assert [plain(a[i]) for i in range(24)] == [plain(b[i]) for i in range(24)]


def test_a_cluster_that_refuses_the_driver_is_a_clear_error(head, tmp_path):
    address, env = head
    image_folder(tmp_path / "src", np.random.default_rng(8), per_class=2)
    env = {k: v for k, v in env.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    out = subprocess.run(
        [sys.executable, "-m", "packer.cli", str(tmp_path / "src"), str(tmp_path / "out"),
         "--engine", "ray", "--ray-address", address],
        capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "cannot join the Ray cluster" in out.stderr and "RAY_AUTH_MODE" in out.stderr
