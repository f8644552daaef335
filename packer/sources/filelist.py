"""File lists: a ``.csv``, ``.tsv`` or ``.jsonl``/``.ndjson`` file with a ``path`` column.

Relative paths are resolved against the list's folder. A file list is the user's
own, trusted input: absolute paths and ``..`` are allowed (never so for names
read from archives or manifests). A list on object storage names objects beside
it: relative, no ``..``. Other columns become fields whose type (int, float, str;
in JSONL also ndarray or json for lists) is inferred from all rows, or given with
``--field NAME=TYPE`` (:mod:`packer.sources.columns`); a ``str`` ``label`` column
becomes class indices (classes sorted). The rules every listing follows are in
:mod:`packer.sources.listing`.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

from formats.errors import InputError, InputUsageError, UnsafePathError
from formats.fields import Field

from .columns import BAD_ROW, type_column
from .listing import Listing, finish

__all__ = ["LIST_EXTENSIONS", "list_file", "list_remote_file"]

LIST_EXTENSIONS = frozenset({".csv", ".tsv", ".jsonl", ".ndjson"})
_RESERVED = ("image", "key")
_LIST_LIMIT = 1 << 30  # a file list read from object storage


def list_file(src: Path, *, to_jpeg: bool = False,
              field_types: dict[str, str] | None = None) -> Listing:
    """List the local file list ``src``.

    Args:
        field_types: column name -> type, instead of the inferred one
            (:mod:`packer.sources.columns`).

    Raises:
        InputUsageError: ``src`` is not a file.
        InputError: the list cannot be parsed (names line and column).
    """
    if not src.is_file():
        raise InputUsageError("--from filelist needs a .csv, .tsv or .jsonl file", path=src)
    return _list_file(src, to_jpeg, field_types=field_types or {})


def _read_rows(src: Path, text: str | None, where) -> tuple[list[dict[str, Any]], list[int]]:
    """The rows of a file list and the line each starts on."""
    suffix = src.suffix.lower()
    if text is None:
        try:
            text = src.read_bytes().decode("utf-8-sig")  # line ends as written (no newline
            # translation: a quoted CSV cell's "\r\n" is its text)
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read file list: {exc}", path=where) from None
    if suffix in (".jsonl", ".ndjson"):
        rows, lines = [], []
        # Lines end at "\n" alone: splitlines() would also cut at U+2028 or U+0085,
        # which JSON strings may hold as they are.
        for n, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"line {n}: invalid JSON ({exc.msg})", path=where) from None
            if not isinstance(row, dict):
                raise InputError(f"line {n}: expected a JSON object", path=where,
                                found=type(row).__name__)
            rows.append(row)
            lines.append(n)
        return rows, lines
    # The csv module reads the text as a file: a quoted cell may hold line breaks
    # (splitlines() had cut them out), and each row's first line is counted.
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t" if suffix == ".tsv" else ",")
    header: list[str] | None = None
    rows, lines = [], []
    while True:
        first = reader.line_num + 1
        try:
            cells = next(reader, None)
        except csv.Error as exc:
            raise InputError(f"line {first}: not CSV ({exc})", path=where) from None
        if cells is None:
            return rows, lines
        if not cells:
            continue  # a blank line
        if header is None:
            header = cells
        elif len(cells) != len(header):
            raise InputError(f"line {first}: wrong number of columns", path=where,
                            found=len(cells), expected=len(header))
        else:
            rows.append(dict(zip(header, cells, strict=True)))
            lines.append(first)


def list_remote_file(location, name: str, *, to_jpeg: bool = False,
                     field_types: dict[str, str] | None = None) -> Listing:
    """A file list stored on object storage, next to the objects it names.

    Paths are names relative to the list's folder there (no ``..``, nothing
    absolute: the object store has no "elsewhere" to point to).

    Raises:
        InputError: the list does not parse (names line and column).
        StorageError: it cannot be read.
    """
    where = location.uri_of(name)
    raw = location.read_bytes(name, _LIST_LIMIT)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read file list: {exc}", path=where) from None
    return _list_file(Path(name), to_jpeg, text=text, location=location, where=where,
                      field_types=field_types or {})


def _list_file(src: Path, to_jpeg: bool, *, text: str | None = None, location=None,
               where: str | None = None, field_types: dict[str, str]) -> Listing:
    """``where``: how errors name the list (its URI, for a list on object storage)."""
    where = where or src
    rows, lines = _read_rows(src, text, where)
    names = list(rows[0]) if rows else []
    unknown = sorted(set(field_types) - set(names))
    if unknown:
        raise InputUsageError(f"--field names {unknown}, which the list has no column of to "
                              f"type (its columns besides 'path': "
                              f"{[n for n in names if n != 'path']})", path=where)
    if not rows:
        return finish("filelist", src, [], {}, [], to_jpeg, location=location)
    if "path" not in names:
        raise InputError("file list has no 'path' column", path=where, found=names)
    for r in _RESERVED:
        if r in names:
            raise InputError(f"file list column {r!r} clashes with the packer's own field",
                            path=where)
    for i, row in enumerate(rows):
        if list(row) != names and set(row) != set(names):
            raise InputError("row has other columns than the first row", path=where, record=i,
                            found=sorted(row), expected=sorted(names))
    base = src.parent
    found = []
    for i, row in enumerate(rows):
        p = row["path"]
        if not isinstance(p, str) or not p:
            raise InputError("empty or non-string 'path'", path=where, record=i, found=p)
        if location is not None:
            try:
                location.path(p)
            except UnsafePathError:
                raise InputError("'path' must name an object beside the list: relative, no "
                                "'..'", path=where, record=i, found=p) from None
            found.append((p, p, None))
            continue
        # Trusted input: the user's own list may point anywhere (see module docstring).
        found.append((os.path.join(base, p), p.replace(os.sep, "/"), None))
    columns: dict[str, list] = {}
    col_fields: list[Field] = []
    classes = None
    text = src.suffix.lower() in (".csv", ".tsv")
    for name in names:
        if name == "path":
            continue
        col = type_column(name, [row[name] for row in rows], from_text=text, lines=lines,
                          where=where, override=field_types.get(name))
        f, values = col.field, col.values
        for i, reason in col.problems.items():
            if found[i][2] is None:  # the first problem of a row is the one it is skipped for
                found[i] = (found[i][0], found[i][1], (BAD_ROW, reason))
        if name == "label" and f.type == "str":
            classes = sorted({v for v in values if v is not None})
            index = {c: i for i, c in enumerate(classes)}
            f, values = Field("label", "int"), [index.get(v) for v in values]
        columns[name] = values
        col_fields.append(f)
    return finish("filelist", src, found, columns, col_fields, to_jpeg, classes,
                  location=location)
