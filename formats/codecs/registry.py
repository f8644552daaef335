"""Codecs by name: what ``pack-dataset --from X --to Y`` resolves through.

Conversion is "a source of one format, a sink of another" (:func:`convert`).
Each codec module is imported only when its name is used, or its file names are
asked (:func:`kind_by_name`): each codec declares its own (``SUFFIXES``, a marker
file), and this module collects them into the one table that tells a format by a
file's name.

Which sink holds which field types. A sink refuses at open, with a SchemaError
naming the field and the sink, a field it cannot hold; it never degrades a value.
Images are carried byte for byte whatever their format, and typed by what they
hold; class names keep their order (label i is name i), unnamed classes write none.

* ``shards``: every type (FORMAT.md, section 5).
* ``tfrecord``: every type. int as an Int64List; float as a FloatList, which is
  float32 (a value float32 does not hold exactly is refused when written);
  ndarray flattened into an Int64List (bool, integer), a FloatList (float16/32,
  float64 holding float32 values) or the array's bytes, at most one dimension
  varying; str, json, bytes and images as byte strings. Types, feature names
  and the shapes are kept in ``schema.json``; class names in ``classes.json``.
* ``webdataset``: every type, one tar member per field: ``.cls`` and decimal
  text for ints, ``repr`` text for floats, UTF-8, JSON, ``.npy``, images under
  the extension of their format; the exact key in ``.key.txt``. Refused: a
  ``key`` that is not str, two fields on one member extension (or a field named
  like an image extension), a field name holding ``/``. Types in ``schema.json``,
  class names in ``classes.json``.
* ``parquet`` (the Hugging Face ``datasets`` layout): int, float, str, json,
  bytes, images, and ndarray of bool, integer and float dtypes (nested list
  columns). Refused: no ``image`` field, a ``key`` that is not str (it is the
  image's path), other ndarray dtypes. Types in the files' ``shardpack``
  metadata, class names as a ``ClassLabel``.
* ``imagefolder``: the ``image`` (a file), ``label`` (its folder) and ``key``
  (its name); other fields are not written (see :mod:`formats.codecs.imagefolder`).
"""

from __future__ import annotations

import heapq
import importlib
import inspect
import tarfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..base import Record, Sink, Source
from ..bounded import open_input
from ..errors import UnknownFormatError
from ..fields import Field
from ..shard.manifest import MANIFEST_NAME
from ..shard.ownership import LEDGER_NAME, output_entries, survey, write_ledger
from ..sniff import sniff
from .mds import INDEX_NAME
from .paths import expand_braces

__all__ = ["MARKERS", "SINKS", "SOURCES", "convert", "detect",
           "kind_by_name", "open_sink", "open_source"]

_SOURCES = {
    "tfrecord": ("formats.codecs.tfrecord", "TFRecordSource"),
    "webdataset": ("formats.codecs.webdataset", "WebDatasetSource"),
    "parquet": ("formats.codecs.parquet", "ParquetSource"),
    "mds": ("formats.codecs.mds", "MDSSource"),
    "shards": ("formats.codecs.shards", "ShardsSource"),
}
_SINKS = {
    "shards": ("formats.codecs.shards", "ShardsSink"),
    "tfrecord": ("formats.codecs.tfrecord", "TFRecordSink"),
    "webdataset": ("formats.codecs.webdataset", "WebDatasetSink"),
    "parquet": ("formats.codecs.parquet", "ParquetSink"),
    "imagefolder": ("formats.codecs.imagefolder", "ImageFolderSink"),
}
SOURCES: tuple[str, ...] = tuple(_SOURCES)
SINKS: tuple[str, ...] = tuple(_SINKS)
#: A folder holding one of these files is a dataset of that format (asked first).
MARKERS = {MANIFEST_NAME: "shards", INDEX_NAME: "mds"}
# The container formats a file's name tells, in the order asked, by their modules'
# SUFFIXES: at the end of the name, or (True) anywhere in it, as TensorFlow names its
# shards ``train.tfrecord-00000-of-00010``.
_NAMED = (("webdataset", False), ("parquet", False), ("tfrecord", True))

#: Options a caller (the packer) may hand every codec; those a codec has no use for
#: are dropped (an ImageFolder has no shard size), any other unknown option is an error.
COMMON_OPTIONS = frozenset({"shard_size", "records_per_shard", "overwrite", "resume",
                            "created_by", "durable", "on_error"})


def _load(table: dict, name: str, what: str) -> type:
    if name not in table:
        raise UnknownFormatError(f"unknown {what} format {name!r}; known: {', '.join(table)}")
    module, cls = table[name]
    return getattr(importlib.import_module(module), cls)


def _call(cls: type, args: tuple, options: dict, what: str, droppable=COMMON_OPTIONS):
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return cls(*args, **options)
    known = {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    unknown = sorted(set(options) - known - droppable)
    if unknown:
        raise ValueError(f"{what} does not take option(s) {unknown}; it takes {sorted(known)}")
    return cls(*args, **{k: v for k, v in options.items() if k in known})


def _merge(options: Mapping[str, Any] | None, kwargs: dict) -> dict:
    merged = dict(options or {})
    merged.update(kwargs)
    return merged


def open_source(name: str, path: str | Path, options: Mapping[str, Any] | None = None,
                /, **kwargs: Any) -> Source:
    """Open ``path`` as a source of format ``name`` (one of :data:`SOURCES`).

    Options come as a mapping (how the packer passes them) and/or keywords; the
    codec's own keyword arguments are the options it takes.

    Raises:
        UnknownFormatError: unknown name (a KeyError and a ValueError).
        ValueError: an option the codec does not take.
        ShardpackError: the input is missing, damaged or has no usable schema.
    """
    return _call(_load(_SOURCES, name, "source"), (path,), _merge(options, kwargs),
                 f"source {name!r}")


def open_sink(name: str, path: str | Path, fields: tuple[Field, ...], classes=None,
              options: Mapping[str, Any] | None = None, /, **kwargs: Any) -> Sink:
    """A sink of format ``name`` (one of :data:`SINKS`) writing into the folder ``path``.

    ``classes`` and ``options`` as for :func:`open_source`.
    """
    return _call(_load(_SINKS, name, "sink"), (path, tuple(fields), classes),
                 _merge(options, kwargs), f"sink {name!r}")


def kind_by_name(name: str) -> str | None:
    """The format a file's name says (case aside): a dataset's marker file
    (:data:`MARKERS`) or a container's suffix; None when the name says nothing."""
    n = name.lower()
    if n in MARKERS:
        return MARKERS[n]
    for kind, anywhere in _NAMED:
        suffixes = importlib.import_module(_SOURCES[kind][0]).SUFFIXES
        if any(s in n for s in suffixes) if anywhere else n.endswith(suffixes):
            return kind
    return None


def _kind_of_file(p: Path) -> str | None:
    kind = kind_by_name(p.name)
    if kind is not None:
        return kind
    try:
        with open_input(p, compression=None) as f:
            head = f.read(4)
    except (OSError, ValueError):  # a FormatError (not a regular file) is a ValueError
        return None
    if sniff(head) == "parquet":
        return "parquet"
    from .tfrecord import looks_like_tfrecord
    if looks_like_tfrecord(p):
        return "tfrecord"
    return "webdataset" if _starts_with_tar_header(p) else None


def _starts_with_tar_header(p: Path) -> bool:
    """One header block, gunzipped if need be, read and checksummed: never more
    (``tarfile.is_tarfile`` reads a whole pax header, however large it claims to be)."""
    try:
        with open_input(p) as f:
            block = f.read(tarfile.BLOCKSIZE)
        tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except (OSError, ValueError, EOFError, tarfile.HeaderError):
        return False
    return True


def detect(path: str | Path) -> str | None:
    """The foreign source kind of ``path`` (a file, folder, glob or brace pattern), or None.

    None means "not one of :data:`SOURCES`": a plain folder of images is for the
    packer's own folder sources to recognize.
    """
    p = Path(path)
    if p.is_dir():
        for marker, kind in MARKERS.items():
            if (p / marker).is_file():
                return kind
        # The first 64 names, without sorting (or holding) a listing of millions.
        kinds = {_kind_of_file(q) for q in heapq.nsmallest(64, p.iterdir()) if q.is_file()
                 and q.suffix.lower() not in (".idx", ".json", ".txt", ".md")}
        kinds.discard(None)
        return kinds.pop() if len(kinds) == 1 else None
    if p.is_file():
        return _kind_of_file(p)
    import glob
    for pattern in expand_braces(str(path))[:1]:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        for m in matches[:1]:
            if Path(m).is_file():
                return _kind_of_file(Path(m))
    return None


def convert(src_name: str, src: str | Path, dst_name: str, dst: str | Path, *,
            source_options: dict | None = None, progress: Callable[[Record], None] | None = None,
            **sink_options: Any) -> int:
    """Read ``src`` with one codec and write every record to ``dst`` with another.

    Returns:
        The number of records written.
    """
    source = open_source(src_name, src, **(source_options or {}))
    count = 0
    others = _files_not_ours(Path(dst))
    with open_sink(dst_name, dst, source.fields, source.classes, **sink_options) as sink:
        for record in source:
            sink.write(record)
            count += 1
            if progress is not None:
                progress(record)
    if dst_name != "shards":  # our format's manifest already lists its files
        write_ledger(dst, sorted(_files_not_ours(Path(dst)) - others - {LEDGER_NAME}),
                     durable=sink_options.get("durable", True))
    return count


def _files_not_ours(root: Path) -> set[str]:
    """Entries under ``root`` (as a ledger names them) that no ledger of ours lists."""
    if not root.is_dir():
        return set()
    return set(output_entries(root)) - set(survey(root).ledger or ())
