"""Shared fixtures. Randomness is seeded and the seed is shown on failure."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# Mapped per-record columns and downloads go to a cache folder of the run's own, never
# the user's ~/.cache (worker processes inherit it).
os.environ.setdefault("SHARDPACK_CACHE", tempfile.mkdtemp(prefix="shardpack-test-cache-"))


@pytest.fixture
def rng(request):
    """A numpy Generator whose seed is printed when the test fails."""
    seed = int(os.environ.get("SHARDPACK_TEST_SEED", "12345"))
    request.node.user_properties.append(("seed", seed))
    print(f"rng seed: {seed} (set SHARDPACK_TEST_SEED to change)")
    return np.random.default_rng(seed)


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs of the test's own: a real full or read-only disk (remount it
    ``ro``), skipped where this machine does not let a test mount one (not root)."""
    from hostile import mount_tmpfs, umount

    point = tmp_path / "mnt"
    if not mount_tmpfs(point, "64k"):
        pytest.skip("cannot mount a tmpfs here (not root, or mount not permitted)")
    yield point
    umount(point)


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster for a module (starting Ray costs seconds); modules that
    need it skip first when the ray extra is missing (pytest.importorskip)."""
    import logging

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    yield
    ray.shutdown()


# -- hostile-input cases (tests/hostile.py): their totals close the run ----------------

def pytest_configure(config):
    if not os.environ.get("SHARDPACK_HOSTILE_LOG"):
        import tempfile

        fd, path = tempfile.mkstemp(prefix="shardpack-hostile-", suffix=".jsonl")
        os.close(fd)
        os.environ["SHARDPACK_HOSTILE_LOG"] = path
        config._hostile_log_owned = path


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import json

    path = os.environ.get("SHARDPACK_HOSTILE_LOG")
    if not path or not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if getattr(config, "_hostile_log_owned", None):
        os.unlink(path)
    if not rows:
        return
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    worst = max(rows, key=lambda r: r["peak_mb"])
    slowest = max(rows, key=lambda r: r["seconds"])
    terminalreporter.write_sep("-", "hostile inputs")
    terminalreporter.write_line(
        f"{len(rows)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        + f"; worst peak memory {worst['peak_mb']:.0f} MB ({worst['case']}); "
        f"slowest {slowest['seconds']:.2f} s ({slowest['case']})")
