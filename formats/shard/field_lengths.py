"""How long the variable-size fields' values are, from the index files alone.

A payload's length is in its shard's index (FORMAT.md, §6.2), so the size of
every ``str``, ``json`` and ``bytes`` value and the element count of every
variable-shape ``ndarray`` come without reading a payload: a variable-shape
payload is ``u64 ndim, u64 dims[ndim]`` then the array bytes (§5), so it holds
``(length - 8 * (1 + ndim)) / itemsize`` elements, and with one varying
dimension ``elements / (product of the fixed ones)`` rows. A compressed field's
stored lengths say nothing of its values: it gets its stored sizes only.

Only the header and the lengths table of each index are read (checked against
the manifest first, so a damaged index is an error, not a wrong figure); the
figures are statistics, so the other index checks (§8, step 3) are left to readers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..checksum import crc32c
from ..errors import FormatError
from ..fields import Field
from ..files import open_regular
from .layout import HEADER_SIZE, INDEX_HEADER, INDEX_MAGIC, MAJOR, index_sections
from .manifest import Manifest, ShardEntry

__all__ = ["distribution", "field_lengths", "length_fields", "ragged_fields"]

#: Field types whose payload length varies by record (images aside: the record size
#: already shows them).
_SIZED_TYPES = frozenset({"str", "json", "bytes"})
_CHUNK_CELLS = 1 << 20  # lengths read 8 MiB at a time, whatever the shard's size

# Reads ``size`` bytes at ``offset`` of one shard's index file.
IndexReader = Callable[[int, int], bytes]


def ragged_fields(fields) -> list[Field]:
    """The ``ndarray`` fields with a dimension that varies per record."""
    return [f for f in fields if f.type == "ndarray" and not f.fixed_shape]


def length_fields(fields) -> list[Field]:
    """The fields whose payload length varies: ragged arrays, text, JSON, raw bytes."""
    return [f for f in fields if f.type in _SIZED_TYPES or (f.type == "ndarray"
                                                             and not f.fixed_shape)]


def distribution(values: np.ndarray) -> dict[str, Any] | None:
    """min, p10, median (p50), p90, p99, max, mean, count and total of ``values``."""
    if values.size == 0:
        return None
    q = np.percentile(values, [0, 10, 50, 90, 99, 100])
    return {"count": int(values.size), "total": int(values.sum()), "mean": float(values.mean()),
            "min": float(q[0]), "p10": float(q[1]), "p50": float(q[2]), "p90": float(q[3]),
            "p99": float(q[4]), "max": float(q[5])}


def field_lengths(root: str | Path, manifest: Manifest, fields: list[Field], *,
                  follow_symlinks: bool = False,
                  fetch: Callable[[ShardEntry], bytes] | None = None,
                  with_arrays: bool = False) -> dict[str, dict[str, Any]]:
    """Per field of ``fields``, the distribution of its values' sizes over all records.

    Args:
        root: the dataset folder (its index files are read, unless ``fetch``).
        fields: fields of the manifest's schema (see :func:`length_fields`).
        follow_symlinks: read index files that are symlinks out of the folder.
        fetch: gives an index file's bytes by shard entry (a remote dataset's
            index, fetched whole; checked against the manifest's CRC32C here).
        with_arrays: add ``values``, the per-record figure the distribution is of.

    Returns:
        By field name: ``unit`` (``bytes``, ``elements`` or ``stored bytes`` for a
        compressed field), ``lengths`` (the distribution of that figure) and, for a
        ragged array, ``elements_total``, ``rows`` (one varying dimension only) and
        ``malformed`` (payloads whose length fits no array of the field's dtype).

    Raises:
        FormatError: an index file is missing, of another size than the manifest
            says, or not an index of this shard.
    """
    if not fields:
        return {}
    columns = [manifest.fields.index(f) for f in fields]
    parts: list[list[np.ndarray]] = [[] for _ in fields]
    root = Path(root)
    for entry in manifest.shards:
        with _index_reader(root, entry, follow_symlinks, fetch) as read:
            for k, col in enumerate(_lengths(read, entry, len(manifest.fields), columns,
                                             root / entry.index_file)):
                parts[k].append(col)
    out = {}
    for f, chunks in zip(fields, parts, strict=True):
        lengths = np.concatenate(chunks) if chunks else np.zeros(0, np.uint64)
        out[f.name] = _describe(f, lengths, with_arrays)
    return out


def _describe(f: Field, lengths: np.ndarray, with_arrays: bool) -> dict[str, Any]:
    if f.compression != "none":
        values = lengths.astype(np.int64)
        out: dict[str, Any] = {"unit": "stored bytes", "compression": f.compression}
    elif f.type != "ndarray":
        values = lengths.astype(np.int64)
        out = {"unit": "bytes"}
    else:
        head = 8 * (1 + len(f.shape))
        itemsize = np.dtype(f.dtype).itemsize
        body = lengths.astype(np.int64) - head
        good = (body >= 0) & (body % itemsize == 0)
        values = body[good] // itemsize
        out = {"unit": "elements", "elements_total": int(values.sum()),
               "malformed": int((~good).sum())}
        fixed = [d for d in f.shape if d is not None]
        per_row = int(np.prod(fixed, dtype=np.int64))
        if len(f.shape) - len(fixed) == 1 and per_row:  # else the header alone says the rows
            out["rows"] = distribution(values // per_row)
    out["lengths"] = distribution(values)
    if with_arrays:
        out["values"] = values
    return out


def _lengths(read: IndexReader, entry: ShardEntry, num_fields: int, columns: list[int],
             path: Path):
    """The length columns ``columns`` of one shard's index (one array per column)."""
    raw = read(0, HEADER_SIZE)
    header = np.frombuffer(raw, INDEX_HEADER, 1)[0]
    if raw[:8] != INDEX_MAGIC or int(header["major"]) != MAJOR:
        raise FormatError(f"not a shardpack index file of major version {MAJOR}", path=path,
                          found=raw[:10].hex(" "))
    for key, expected in (("record_count", entry.records), ("num_fields", num_fields)):
        if int(header[key]) != expected:
            raise FormatError(f"index header {key} disagrees with the manifest", path=path,
                              found=int(header[key]), expected=expected)
    _, lengths_at, _, _ = index_sections(entry.records, num_fields)
    cols: list[list[np.ndarray]] = [[] for _ in columns]
    rows_per_chunk = max(1, _CHUNK_CELLS // num_fields)
    for start in range(0, entry.records, rows_per_chunk):
        rows = min(rows_per_chunk, entry.records - start)
        raw = read(lengths_at + 8 * start * num_fields, 8 * rows * num_fields)
        table = np.frombuffer(raw, "<u8").reshape(rows, num_fields)
        for k, j in enumerate(columns):
            cols[k].append(table[:, j].copy())
    for k in range(len(columns)):
        merged = np.concatenate(cols[k]) if cols[k] else np.zeros(0, np.uint64)
        if merged.size and int(merged.max()) > entry.data_bytes:
            raise FormatError("index holds a payload length larger than its data file",
                              path=path, found=int(merged.max()),
                              expected=f"at most {entry.data_bytes}")
        yield merged


@contextmanager
def _index_reader(root: Path, entry: ShardEntry, follow_symlinks: bool,
                  fetch: Callable[[ShardEntry], bytes] | None) -> Iterator[IndexReader]:
    """An :data:`IndexReader` over one shard's index file, closed on exit."""
    path, size = root / entry.index_file, entry.index_bytes
    if fetch is not None:
        data = fetch(entry)
        if len(data) != size or crc32c(data) != entry.index_crc32c:
            raise FormatError("index file is not the one the manifest names (its size or "
                              "CRC32C differs)", path=path)
        yield lambda at, n: data[at:at + n]
        return
    try:
        fd, st = open_regular(path, root, what="index file", error=FormatError,
                              follow_symlinks=follow_symlinks)
    except OSError as exc:
        raise FormatError(f"cannot open index file ({exc.strerror})", path=path) from None

    def pread(at: int, n: int) -> bytes:
        data = os.pread(fd, n, at)
        if len(data) != n:
            raise FormatError("index file changed size while being read", path=path)
        return data

    try:
        if st.st_size != size:
            raise FormatError("index file size disagrees with the manifest", path=path,
                              found=st.st_size, expected=size)
        yield pread
    finally:
        os.close(fd)
