"""Shared fixtures. Randomness is seeded and the seed is shown on failure."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture
def rng(request):
    """A numpy Generator whose seed is printed when the test fails."""
    seed = int(os.environ.get("SHARDPACK_TEST_SEED", "12345"))
    request.node.user_properties.append(("seed", seed))
    print(f"rng seed: {seed} (set SHARDPACK_TEST_SEED to change)")
    return np.random.default_rng(seed)
