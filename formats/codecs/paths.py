"""Input path patterns (a file, a folder, a glob, or a brace pattern like
``a-{000..009}.tar``), and the small files foreign sinks leave beside their shards.

Beside the shards (the formats have no place for these facts):

* ``classes.json``: the class names, a JSON list; label ``i`` is name ``i``. No
  file when the classes have no names (labels are kept as they are).
* ``schema.json``: the field types the shards were written from, so that our source
  reads every value back as what it was (a float as a float, an ndarray as an
  ndarray, a key with its extension). An object::

      {"format": "shardpack.codec-schema", "version": 1, "codec": "webdataset",
       "fields": [{"name": "image", "type": "jpeg"}, ...], "names": {"image": "*", ...}}

  ``fields`` are field entries as in FORMAT.md (without compression); ``names``
  maps a field to where the codec put it (a tar member extension, a TFRecord
  feature). A ``schema.json`` without this ``format`` value is someone else's
  file and is ignored. It is written when the sink closes: an image field's type
  is then what its payloads are (:func:`formats.fields.stored_image_type`), never
  what the first record suggested.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from ..bounded import parse_json, read_small_file, refuse_special_file
from ..errors import FormatError, SchemaError
from ..fields import Field
from ..files import atomic_write_bytes

__all__ = ["CLASSES_FILE", "SCHEMA_FILE", "canonical_order", "expand_braces",
           "expand_inputs", "read_classes_file", "read_schema_file", "write_classes_file",
           "write_schema_file"]

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_MAX_EXPANSION = 1_000_000
_MAX_CLASSES_FILE = 64 << 20
_MAX_SCHEMA_FILE = 16 << 20
_SCHEMA_MARK = "shardpack.codec-schema"


def expand_braces(pattern: str) -> list[str]:
    """Expand ``{a,b}`` lists and ``{000..009}`` ranges (zero padding kept), as braceexpand does."""
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    body = m.group(1)
    r = _RANGE.match(body)
    if r:
        lo, hi = int(r.group(1)), int(r.group(2))
        if abs(hi - lo) >= _MAX_EXPANSION:
            raise FormatError("brace range is too large", found=body)
        width = len(r.group(1)) if r.group(1).startswith("0") else 0
        step = 1 if hi >= lo else -1
        items = [f"{i:0{width}d}" for i in range(lo, hi + step, step)]
    else:
        items = body.split(",")
    head, tail = pattern[: m.start()], pattern[m.end():]
    return [x for item in items for x in expand_braces(head + item + tail)]


def expand_inputs(path: str | Path, suffixes: Iterable[str]) -> list[Path]:
    """The input files a source reads, in a stable (sorted or pattern) order.

    Args:
        path: a file, a folder (its files ending in one of ``suffixes``, sorted),
            a glob, or a brace pattern.
        suffixes: file name endings that count in a folder, e.g. ``(".tar",)``.

    Raises:
        FormatError: nothing matches.
    """
    text = str(path)
    suffixes = tuple(suffixes)
    p = Path(text)
    refuse_special_file(p)  # a FIFO is no "input file not found", and must not hang
    if p.is_dir():
        files = sorted(q for q in p.iterdir() if q.is_file() and q.name.lower().endswith(suffixes))
    elif p.is_file():
        files = [p]
    else:
        files = []
        for pattern in expand_braces(text):
            if glob.has_magic(pattern):
                files.extend(Path(q) for q in sorted(glob.glob(pattern)) if Path(q).is_file())
            elif Path(pattern).is_file():
                files.append(Path(pattern))
            else:
                raise FormatError("input file not found", path=pattern)
    if not files:
        raise FormatError(f"no input files (looked for {', '.join(suffixes)})", path=text)
    return files


CLASSES_FILE = "classes.json"
SCHEMA_FILE = "schema.json"
_ORDER = {"image": 0, "label": 1, "key": 2}


def canonical_order(fields):
    """``image``, ``label``, ``key`` first, the rest in their input order."""
    return tuple(sorted(fields, key=lambda f: _ORDER.get(f.name, 3)))


def _json_bytes(obj) -> bytes:
    """Readable UTF-8 JSON; a lone surrogate (only ever inside a string) is written as
    its ``\\udXXX`` escape, which parses back to the same text."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False) + "\n"
    return text.encode("utf-8", "backslashreplace")


def write_classes_file(root: Path, classes) -> None:
    """Class names beside foreign shards that have no place for them (TFRecord, tar)."""
    if classes is not None:
        atomic_write_bytes(Path(root) / CLASSES_FILE, _json_bytes(list(classes)), durable=False)


def _read_json_file(path: Path, limit: int, what: str):
    """The JSON in a small file of ours beside foreign shards, read within ``limit``
    bytes and nesting bounds.

    Raises:
        FormatError: unreadable, too large, too deep or not JSON (names the file).
    """
    try:
        raw = read_small_file(path, limit, what)
    except OSError as exc:
        raise FormatError(f"unreadable {what} ({exc.strerror})", path=path) from None
    return parse_json(raw, path=path, what=what, error=FormatError, max_bytes=limit)


def read_classes_file(folder: Path) -> tuple[str, ...] | None:
    """The class names :func:`write_classes_file` left in ``folder``, if any.

    Raises:
        FormatError: the file exists but is not a JSON list of strings.
    """
    path = Path(folder) / CLASSES_FILE
    if not os.path.lexists(path):
        return None
    obj = _read_json_file(path, _MAX_CLASSES_FILE, "class names")
    if not isinstance(obj, list) or not all(isinstance(c, str) for c in obj):
        raise FormatError("class names must be a JSON list of strings", path=path)
    return tuple(obj)


def write_schema_file(root: Path, codec: str, fields, names: dict[str, str]) -> None:
    """Write ``schema.json`` (see the module docstring) into ``root``, atomically."""
    entries = []
    for f in fields:
        entry = f.to_json()
        entry.pop("compression", None)
        entries.append(entry)
    obj = {"format": _SCHEMA_MARK, "version": 1, "codec": codec, "fields": entries,
           "names": dict(names)}
    atomic_write_bytes(Path(root) / SCHEMA_FILE, _json_bytes(obj), durable=False)


def read_schema_file(folder: Path, codec: str) -> tuple[tuple[Field, ...], dict[str, str]] | None:
    """(fields, names) from the ``schema.json`` our ``codec`` sink left in ``folder``,
    or None when there is none (or it is someone else's file).

    Raises:
        FormatError: it is ours but malformed (names the file and what is wrong).
    """
    path = Path(folder) / SCHEMA_FILE
    if not os.path.lexists(path):
        return None
    obj = _read_json_file(path, _MAX_SCHEMA_FILE, "schema file")
    if not isinstance(obj, dict) or obj.get("format") != _SCHEMA_MARK:
        return None
    if obj.get("version") != 1:
        raise FormatError("schema file of an unknown version", path=path,
                          found=obj.get("version"), expected=1)
    if obj.get("codec") != codec:
        return None  # written beside another format's shards
    entries, names = obj.get("fields"), obj.get("names")
    if not isinstance(entries, list) or not isinstance(names, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in names.items()):
        raise FormatError("schema file: 'fields' must be a list and 'names' an object of "
                          "strings", path=path)
    try:
        fields = tuple(Field.from_json(e) for e in entries)
    except SchemaError as exc:
        raise FormatError(f"schema file: {exc}", path=path) from None
    if len({f.name for f in fields}) != len(fields) or set(names) - {f.name for f in fields}:
        raise FormatError("schema file: field names repeat, or 'names' names an unknown "
                          "field", path=path)
    return fields, names
