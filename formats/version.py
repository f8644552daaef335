"""The installed shardpack's version, for ``--version`` and the manifest's ``created_by``."""

from __future__ import annotations

__all__ = ["package_version"]


def package_version() -> str:
    """``0+unknown`` in a source checkout that is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardpack")
    except PackageNotFoundError:
        return "0+unknown"
