"""The README's demo (`bash dev.sh demo`) runs on the core dependencies alone."""

from __future__ import annotations

import subprocess
import sys

import pytest

from formats.shard.verify import ALL_MATCH

# Everything in the extras (dev, ray, torch, gpu, bench): the demo must import none of them.
NOT_CORE = ("PIL", "matplotlib", "torch", "cupy", "ray", "webdataset", "tfrecord", "datasets",
            "moto", "hypothesis")


@pytest.mark.slow
def test_demo_runs_without_any_extra(tmp_path):
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in NOT_CORE)
    code = (f"import sys; {blocked}\n"
            "from scripts.demo import main\n"
            f"sys.exit(main(['--out', {str(tmp_path)!r}, '--classes', '2', '--per-class', '24',"
            " '--epochs', '1']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = proc.stdout
    for step in ("== 1. 48 JPEGs", "== 2. pack-dataset", "== 3. inspect-shards",
                 ALL_MATCH, "== 4. reader.Loader",
                 "diagnosis:", "read 48 images"):
        assert step in out, step
    assert (tmp_path / "monitor.jsonl").stat().st_size > 0
