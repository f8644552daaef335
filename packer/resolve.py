"""``--from X`` / ``--to Y``: built-in folder sources first, then ``formats.registry``.

The codec side is described in the package docstring (:mod:`packer`). The
registry module is imported lazily, on first need, so the packer works (for
folders and our shards) before and without it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import UsageError
from .listing import BUILTIN_SOURCES, Listing, detect_builtin, list_source
from .options import PackOptions

__all__ = ["detect_source", "open_sink", "open_source", "registry"]

_REGISTRY = "formats.registry"


def registry():
    """The ``formats.registry`` module, or None while it does not exist."""
    try:
        return importlib.import_module(_REGISTRY)
    except ModuleNotFoundError as exc:
        if exc.name in (_REGISTRY, "formats"):
            return None
        raise


def _not_available(name: str, what: str) -> UsageError:
    return UsageError(f"format {name!r} not available as a {what} "
                      f"(built in: {', '.join(BUILTIN_SOURCES) if what == 'source' else 'shards'}"
                      f"{'' if registry() else '; formats.registry is not installed'})")


def detect_source(src: Path) -> str:
    """The source kind of SRC: our shards, a registry codec's, or a built-in one.

    Raises:
        UsageError: nothing recognizes SRC.
    """
    reg = registry()
    if reg is not None and hasattr(reg, "detect"):
        kind = reg.detect(src)
        if kind:
            return kind
    kind = detect_builtin(src)
    if kind is None:
        raise UsageError("cannot tell what SRC is; name it with --from", path=src)
    return kind


def open_source(name: str, src: Path, options: PackOptions) -> Listing | Any:
    """A :class:`~packer.listing.Listing` for built-in kinds, else a registry Source.

    Raises:
        UsageError: ``name`` is neither built in nor known to ``formats.registry``.
    """
    if name in BUILTIN_SOURCES:
        return list_source(name, src, to_jpeg=options.to_jpeg)
    reg = registry()
    if reg is None or not hasattr(reg, "open_source"):
        raise _not_available(name, "source")
    try:
        return reg.open_source(name, src, _codec_options(options))
    except KeyError:
        raise _not_available(name, "source") from None


def open_sink(name: str, dst: Path, fields, classes, options: PackOptions):
    """A registry Sink for ``--to name`` (``shards`` is handled by the packer itself).

    Raises:
        UsageError: ``name`` is unknown to ``formats.registry``.
    """
    reg = registry()
    if reg is None or not hasattr(reg, "open_sink"):
        raise _not_available(name, "sink")
    try:
        return reg.open_sink(name, dst, tuple(fields), classes, _codec_options(options))
    except KeyError:
        raise _not_available(name, "sink") from None


def _codec_options(options: PackOptions) -> Mapping[str, Any]:
    return {
        "shard_size": options.shard_size,
        "records_per_shard": options.records_per_shard,
        "overwrite": options.overwrite,
        "on_error": options.on_error,
        "durable": options.durable,
    }
