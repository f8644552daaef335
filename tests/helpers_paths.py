"""Where things are, for tests in any folder of ``tests/``: the checkout, the tests
and their data files."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent  # the checkout: README.md, pyproject.toml, the packages
DATA = TESTS / "data"
