"""A real ``pack-dataset`` killed with SIGKILL mid-way, resumed: byte-identical output."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers_packer import dataset_files, jpeg

# The installed console script when there is one, else the same entry point.
CLI = [shutil.which("pack-dataset")] if shutil.which("pack-dataset") else [
    sys.executable, "-c", "import sys; from packer.cli import main; sys.exit(main())"]


def _run(*args, **kw):
    return subprocess.Popen([*CLI, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kw)


@pytest.mark.slow
def test_sigkill_then_resume_is_byte_identical(tmp_path, rng):
    src = tmp_path / "src"
    for c in range(4):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(500):
            # Every 97th input is bad, so skipped.jsonl must survive the resume too.
            data = b"" if (c * 500 + i) % 97 == 0 else jpeg(rng, 8, 8)
            (src / f"c{c}" / f"{i:04d}.jpg").write_bytes(data)
    args = ["--records-per-shard", "3", "--on-error", "skip", "--quiet", "--workers", "0"]
    full = _run(src, tmp_path / "full", *args)
    assert full.wait(60) == 0, full.stderr.read().decode()

    cut = tmp_path / "cut"
    killed = False
    for _attempt in range(3):
        shutil.rmtree(cut, ignore_errors=True)
        proc = _run(src, cut, *args)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            if (cut / "shard-00150.idx").exists():
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.002)
        proc.wait(30)
        if killed:
            break
    assert killed, "the pack finished before it could be killed"
    assert proc.returncode == -signal.SIGKILL
    assert not (cut / "manifest.json").exists()
    assert (cut / "_journal.jsonl").exists()

    resumed = _run(src, cut, *args, "--resume", "--json")
    out, err = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, err.decode()
    assert b'"resumed_records": 0' not in out
    assert dataset_files(cut) == dataset_files(tmp_path / "full")
    assert (cut / "skipped.jsonl").read_text().count("\n") == 21
