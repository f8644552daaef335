"""``--from X`` / ``--to Y``: built-in folder sources first, then ``formats.codecs.registry``.

The codec side is described in the package docstring (:mod:`packer`). The
registry module is imported lazily, on first need, so the packer works (for
folders and our shards) before and without it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from formats.codecs.folders import BUILTIN_SOURCES, Listing, detect_builtin, list_source

from .errors import UsageError
from .options import PackOptions

__all__ = ["check_names", "choices", "detect_source", "open_sink", "open_source", "registry"]

_REGISTRY = "formats.codecs.registry"


def registry():
    """The ``formats.codecs.registry`` module, or None while it does not exist."""
    try:
        return importlib.import_module(_REGISTRY)
    except ModuleNotFoundError as exc:
        if exc.name in (_REGISTRY, "formats"):
            return None
        raise


def choices(what: str) -> tuple[str, ...]:
    """Every name ``--from`` (``what="source"``) or ``--to`` (``"sink"``) accepts."""
    reg = registry()
    if what == "source":
        return tuple(dict.fromkeys(BUILTIN_SOURCES + tuple(getattr(reg, "SOURCES", ()))))
    return tuple(dict.fromkeys(("shards", *getattr(reg, "SINKS", ()))))


def _not_available(name: str, what: str) -> UsageError:
    import difflib

    known = choices(what)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    flag = "--from" if what == "source" else "--to"
    return UsageError(f"{flag} {name!r}: no such format; {hint}choose from {', '.join(known)}")


def check_names(options: PackOptions) -> None:
    """Refuse an unknown ``--from``/``--to`` before anything is read or written.

    Raises:
        UsageError: names the closest known format and every choice.
    """
    reg = registry()
    listed = {"source": reg is None or hasattr(reg, "SOURCES"),
              "sink": reg is None or hasattr(reg, "SINKS")}  # else: checked when opened
    if options.source is not None and listed["source"] \
            and options.source not in choices("source"):
        raise _not_available(options.source, "source")
    if listed["sink"] and options.sink not in choices("sink"):
        raise _not_available(options.sink, "sink")


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
    """A :class:`~formats.codecs.folders.Listing` for built-in kinds, else a registry Source.

    Raises:
        UsageError: ``name`` is neither built in nor known to ``formats.codecs.registry``.
    """
    if name in BUILTIN_SOURCES:
        return list_source(name, src, to_jpeg=options.to_jpeg)
    reg = registry()
    if reg is None or not hasattr(reg, "open_source"):
        raise _not_available(name, "source")
    try:
        codec = dict(_codec_options(options))
        if options.image_root is not None:  # PackOptions allows it for parquet only
            codec["image_root"] = options.image_root
        return reg.open_source(name, src, codec)
    except KeyError:
        raise _not_available(name, "source") from None


def open_sink(name: str, dst: Path, fields, classes, options: PackOptions):
    """A registry Sink for ``--to name`` (``shards`` is handled by the packer itself).

    Raises:
        UsageError: ``name`` is unknown to ``formats.codecs.registry``.
    """
    reg = registry()
    if reg is None or not hasattr(reg, "open_sink"):
        raise _not_available(name, "sink")
    codec = dict(_codec_options(options))
    if name == "tfrecord":
        codec["index"] = options.tfrecord_index
    try:
        return reg.open_sink(name, dst, tuple(fields), classes, codec)
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
