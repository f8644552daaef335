"""Any file as a field: the records of a folder of files (or a file list) that holds
files with other extensions than images', and either no image or an image with a
sidecar (the rule is :mod:`packer.sources.listing` ``_any_files``; image folders
with a stray README stay image folders).

Grouping (WebDataset's rule, :func:`formats.codecs.webdataset.split_key`): a file's
key is its path up to the first dot of its name, its field the rest, lowercased
(``sub/a.jpg`` + ``sub/a.json`` + ``sub/a.txt`` are one record, key ``sub/a``, fields
``jpg``, ``json``, ``txt``), so ``key + "." + field`` is the file's name again. A file
list's row is one record of one file (its other columns as before).

Types, by extension, decided once for the whole listing:

=================================  =============  =======================================
extension                          field type     value
=================================  =============  =======================================
an image's (``jpg``, ``png``...)   ``jpeg`` /     the file, checked like every image (the
                                   ``image``      writer types it ``jpeg``, ``png`` or
                                                  ``image`` by what it holds)
``txt``                            ``str``        the text (UTF-8)
``json``                           ``json``       the parsed value (stored as canonical
                                                  JSON: keys sorted, no spaces)
``npy``                            ``ndarray``    the array (``allow_pickle=False``: the
                                                  header is parsed, never code); dtype
                                                  and number of dimensions from the first
                                                  file, a dimension that differs between
                                                  files is variable (``None``)
audio (``wav``, ``flac``, ``mp3``  ``bytes``      the file as it is (decode it in the
``ogg``, ``opus``, ``m4a``)                       Loader's workers)
anything else                      ``str`` when   the file as it is
                                   the first such
                                   file is UTF-8
                                   text, else
                                   ``bytes``
=================================  =============  =======================================

Every record must have the same fields: the set most records have (ties: the first
in key order). A record with other files is bad input (kind ``other-fields``), as is
a file without an extension (``no-extension``), an ``.npy`` of another dtype or
number of dimensions than the field's (``bad-array``); when read, a text file that
is not UTF-8 (``not-text``), JSON that does not parse (``bad-json``) and an ``.npy``
whose header or size is wrong (``bad-array``).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np

from formats.bounded import parse_json
from formats.codecs.webdataset import split_key
from formats.errors import FormatError
from formats.fields import Field, json_payload
from formats.media import AUDIO_EXTENSIONS, IMAGE_SUFFIXES, JPEG_SUFFIXES
from formats.npy import read_npy_header

from ..errors import _Bad

__all__ = ["MAX_FILE_BYTES", "file_value", "group_files", "npy_header", "type_fields"]

#: The largest file read as one value (what the packer reads from object storage too).
MAX_FILE_BYTES = 1 << 30
_TEXT_PROBE = 1 << 20  # how much of the first file of an unknown extension is looked at
_NPY_HEADER = 1 << 16


def group_files(found: list[tuple[str, str, Any]]
                ) -> tuple[list[str], list[list[tuple[str, str]]], dict[int, tuple[str, str]]]:
    """Records from ``(path, key, problem)`` files in listing order: their keys, their
    ``(field, path)`` members, and the problems known already (by record index)."""
    keys: list[str] = []
    members: list[list[tuple[str, str]]] = []
    problems: dict[int, tuple[str, str]] = {}
    index: dict[str, int] = {}
    for path, name, problem in found:
        split = split_key(name)
        key, field = (name, None) if split is None else (split[0], split[1].lower())
        if key not in index:
            index[key] = len(keys)
            keys.append(key)
            members.append([])
        i = index[key]
        if problem is not None and i not in problems:
            problems[i] = problem
        if field is None:
            problems.setdefault(i, ("no-extension", f"{name}: a file without an extension "
                                    "cannot be a field (named by extension: key.field)"))
            continue
        members[i].append((field, path))
    return keys, members, problems


def npy_header(data: bytes) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """(dtype, shape, fortran order, data offset) of an ``.npy`` file's first bytes.

    Raises:
        _Bad: not an ``.npy`` header, or a dtype holding Python objects.
    """
    try:
        return read_npy_header(data)
    except ValueError as exc:
        raise _Bad("bad-array", str(exc)) from None


def _head(path: str, n: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _is_text(data: bytes) -> bool:
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A probe cut inside a multi-byte character is still text.
        return len(data) == _TEXT_PROBE and exc.start >= len(data) - 3
    return True


def type_fields(members: list[list[tuple[str, str]]], problems: dict[int, tuple[str, str]]
                ) -> list[Field]:
    """The fields of grouped records (the module docstring's rules); records whose files
    do not fit them get a problem in ``problems``."""
    sets = Counter(tuple(sorted(f for f, _ in m)) for i, m in enumerate(members)
                   if i not in problems and m)
    if not sets:
        return []
    best = max(sets.values())
    layout = next(s for s in (tuple(sorted(f for f, _ in m)) for m in members) if sets.get(s) == best)
    for i, m in enumerate(members):
        have = tuple(sorted(f for f, _ in m))
        if i not in problems and have != layout:
            problems[i] = ("other-fields", f"has files {list(have)}; records here have "
                           f"{list(layout)} (key.field, named by extension)")
    fields = []
    for name in layout:
        paths = [(i, p) for i, m in enumerate(members) if i not in problems
                 for f, p in m if f == name]
        fields.append(_field(name, paths, problems))
    return fields


def _field(name: str, paths: list[tuple[int, str]], problems: dict[int, tuple[str, str]]
           ) -> Field:
    ext = name.rsplit(".", 1)[-1]  # a.seg.png: field "seg.png", typed as a png
    if f".{ext}" in IMAGE_SUFFIXES:
        jpeg = all(os.path.splitext(p)[1].lower() in JPEG_SUFFIXES for _, p in paths)
        return Field(name, "jpeg" if jpeg else "image")
    if ext == "txt":
        return Field(name, "str")
    if ext == "json":
        return Field(name, "json")
    if ext == "npy":
        return _array_field(name, paths, problems)
    if ext in AUDIO_EXTENSIONS or not paths:
        return Field(name, "bytes")
    try:
        text = _is_text(_head(paths[0][1], _TEXT_PROBE))
    except OSError:
        text = False  # reading it again at pack time says what is wrong
    return Field(name, "str" if text else "bytes")


def _array_field(name: str, paths: list[tuple[int, str]],
                 problems: dict[int, tuple[str, str]]) -> Field:
    """dtype and ndim from the first readable header; the other files' must agree."""
    first: tuple[np.dtype, list] | None = None
    for i, p in paths:
        try:
            dtype, shape, _, _ = npy_header(_head(p, _NPY_HEADER))
        except OSError:
            continue  # reading it at pack time says what is wrong
        except _Bad as bad:
            problems[i] = (bad.kind, f"{os.path.basename(p)}: {bad.reason}")
            continue
        dtype = dtype.newbyteorder("<")  # either byte order: stored little-endian
        if first is None:
            first = (dtype, list(shape))
        elif dtype != first[0] or len(shape) != len(first[1]):
            problems[i] = ("bad-array", f"{os.path.basename(p)}: {dtype.str} {list(shape)}, "
                           f"where the field holds {first[0].str} with {len(first[1])} "
                           "dimension(s)")
        else:
            first[1][:] = [d if d == n else None for d, n in zip(first[1], shape, strict=True)]
    if first is None:
        return Field(name, "ndarray", dtype="<u1", shape=(None,))
    return Field(name, "ndarray", dtype=first[0].str, shape=tuple(first[1]))


def file_value(f: Field, data: bytes, name: str) -> Any:
    """The value of field ``f`` from a whole file's bytes (images aside: the packer
    checks those).

    Raises:
        _Bad: the file is not what its field holds.
    """
    if f.type == "bytes":
        return data
    if f.type == "str":
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _Bad("not-text", f"not UTF-8 text (byte {exc.start}), where field "
                              f"{f.name!r} holds text") from None
    if f.type == "json":
        try:
            value = parse_json(data, path=name, what="JSON file", error=FormatError,
                               max_bytes=MAX_FILE_BYTES)
        except FormatError as exc:
            raise _Bad("bad-json", exc.message) from None
        try:
            json_payload(value)  # what the writer stores must exist
        except (TypeError, ValueError, RecursionError) as exc:
            raise _Bad("bad-json", f"JSON that cannot be stored as JSON text ({exc}: "
                              "NaN, Infinity, a number beyond a float, or a lone "
                              "surrogate)") from None
        return value
    dtype, shape, fortran, offset = npy_header(data[:_NPY_HEADER])
    if dtype.names is not None or dtype.subdtype is not None:
        raise _Bad("bad-array", f"an array of the structured dtype {dtype}, which is not "
                          "stored: save each of its fields as an array of its own")
    if dtype.newbyteorder("<") != np.dtype(f.dtype) or len(shape) != len(f.shape) or any(
            d is not None and d != n for d, n in zip(f.shape, shape, strict=True)):
        raise _Bad("bad-array", f"{dtype.str} {list(shape)}, where field {f.name!r} "
                          f"holds {f.dtype} {list(f.shape)}")
    count = int(np.prod(shape, dtype=np.int64))
    if len(data) - offset != count * dtype.itemsize:
        raise _Bad("bad-array", f"{len(data) - offset} bytes of data, where its header "
                          f"says {count * dtype.itemsize}")
    arr = np.frombuffer(data, dtype, count, offset).reshape(shape, order="F" if fortran else "C")
    if dtype.byteorder == ">":
        arr = arr.astype(dtype.newbyteorder("<"))  # stored little-endian (FORMAT.md)
    # ascontiguousarray would make a 0-d array 1-d.
    return np.ascontiguousarray(arr) if arr.ndim > 1 else arr
