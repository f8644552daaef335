"""``--from X`` / ``--to Y``: the built-in listed sources first (:mod:`packer.sources`),
then ``formats.codecs.registry``.

The codec side is described in the package docstring (:mod:`packer`). The
registry module is imported lazily, on first need, so the packer works (for
folders and our shards) before and without it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from formats.errors import InputError, InputUsageError
from formats.shard import ownership
from formats.storage import is_uri

from .errors import UsageError
from .options import PackOptions
from .sources.coco import list_coco
from .sources.filelist import LIST_EXTENSIONS, list_file
from .sources.folders import FOLDER_SOURCES, detect_folder, list_folder
from .sources.listing import Listing
from .work_names import WORK, holds_legacy_state

__all__ = ["BUILTIN_SOURCES", "check_names", "check_source_options", "choices",
           "detect_builtin", "detect_source", "list_source", "listing_options", "open_sink",
           "open_source", "registry"]

#: The listed sources (:mod:`packer.sources`), asked before the registry's.
BUILTIN_SOURCES = (*FOLDER_SOURCES, "filelist", "coco")
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
        InputError: SRC is an unfinished pack of ours.
        InputUsageError: nothing recognizes SRC.
    """
    reg = registry()
    if reg is not None and hasattr(reg, "detect"):
        kind = reg.detect(src)
        if kind:
            return kind
    if src.is_dir():
        found = ownership.survey(src, WORK)
        if found.dataset is None and (found.journal or found.work_state
                                      or holds_legacy_state(src)):
            raise InputError("SRC is a pack that did not finish (it holds our journal and no "
                             "manifest.json): finish it with --resume (the same SRC and "
                             "options, this folder as DST), or remove it; --from files "
                             "packs its files as they are", path=src)
    kind = detect_builtin(src)
    if kind is None:
        raise InputUsageError("cannot tell what SRC is; name it with --from", path=src)
    return kind


def detect_builtin(src: Path) -> str | None:
    """``filelist`` for a list file, ``imagefolder``/``files`` for a folder
    (:func:`packer.sources.folders.detect_folder`), else None."""
    if src.is_file():
        return "filelist" if src.suffix.lower() in LIST_EXTENSIONS else None
    if not src.is_dir():
        return None
    return detect_folder(src)


def list_source(kind: str, src: Path, *, to_jpeg: bool = False,
                field_types: dict[str, str] | None = None, annotations: Path | None = None,
                drop_empty: bool = False, max_side: int | None = None) -> Listing:
    """List a built-in source (one of :data:`BUILTIN_SOURCES`).

    Args:
        field_types: ``filelist``: column name -> type, instead of the inferred one
            (:mod:`packer.sources.columns`).
        annotations, drop_empty, max_side: ``coco``: the annotation file, whether
            images without annotations are dropped, and the ``--max-side`` that
            will shrink images (see :func:`packer.sources.coco.list_coco`).

    Raises:
        InputUsageError: SRC is not the kind of thing ``kind`` reads, or an
            option for another kind.
        InputError: a file list that cannot be parsed (names line and column).
    """
    src = Path(src)
    if field_types and kind != "filelist":
        raise InputUsageError(f"--field types the columns of a file list, not of --from {kind}")
    if (annotations is not None or drop_empty) and kind != "coco":
        raise InputUsageError(f"--annotations and --drop-empty are for --from coco, not {kind}")
    if kind == "coco":
        return list_coco(src, annotations, to_jpeg=to_jpeg, drop_empty=drop_empty,
                         max_side=max_side)
    if kind in FOLDER_SOURCES:
        return list_folder(kind, src, to_jpeg=to_jpeg)
    if kind == "filelist":
        return list_file(src, to_jpeg=to_jpeg, field_types=field_types)
    raise InputUsageError(f"not a built-in source: {kind!r}")


def open_source(name: str, src: Path, options: PackOptions) -> Listing | Any:
    """A :class:`~packer.sources.listing.Listing` for built-in kinds, else a registry Source.

    Raises:
        UsageError: ``name`` is neither built in nor known to ``formats.codecs.registry``.
    """
    if name in BUILTIN_SOURCES:
        return list_source(name, src, **listing_options(options))
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


def check_source_options(kind: str | None, options: PackOptions, *, remote: bool = False) -> None:
    """Refuse an option of one source kind given for another, and what a COCO source
    cannot do (never accepted and ignored).

    Raises:
        UsageError: names the option and the kind.
    """
    if options.field_types and kind not in (None, "filelist"):
        raise UsageError(f"--field types the columns of a file list, not of --from {kind}")
    if kind != "coco":
        return
    if remote or is_uri(options.annotations):
        raise UsageError("--from coco reads a local images folder and annotation file; copy "
                         "them to a local disk first")
    if options.sink == "imagefolder":
        raise UsageError("--to imagefolder keeps only image, label and key: the boxes, labels "
                         "and masks of --from coco would be lost; write shards, webdataset "
                         "or tfrecord")
    if options.sink == "parquet":
        raise UsageError("--to parquet keeps class names only as the ClassLabel of an int "
                         "'label' column: the category names of --from coco (whose labels are "
                         "per box) would be lost; write shards, webdataset or tfrecord")


def listing_options(options: PackOptions) -> dict[str, Any]:
    """What :func:`list_source` takes from the options."""
    return {"to_jpeg": options.to_jpeg, "field_types": dict(options.field_types),
            "annotations": options.annotations, "drop_empty": options.drop_empty,
            "max_side": options.max_side}


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
