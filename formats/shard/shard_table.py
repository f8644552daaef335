"""The shard table: every shard's name, record count, file sizes and checksums, as columns.

A manifest of version 2 lists its shards in ``shards.arrow`` (FORMAT.md, §4.1), an
Arrow IPC file beside it, rather than as one JSON object per shard: a dataset of a
million shards opens by mapping that file and checking its columns in numpy and
Arrow's C++ (sizes, counts, names, uniqueness), with no Python object per shard.
A :class:`ShardTable` is a sequence of :class:`ShardEntry`, each built only when
asked for; the columns (``records``, ``data_bytes``, ...) serve whatever sums or
searches over every shard.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..checksum import crc32c, format_crc
from ..errors import ManifestError
from ..files import check_plain_name, read_regular
from .arrow_strings import string_buffers
from .layout import CRC_DTYPE, HEADER_SIZE, LENGTH_DTYPE, OFFSET_DTYPE

__all__ = ["SHARD_TABLE_NAME", "ShardEntry", "ShardTable", "index_sizes"]

SHARD_TABLE_NAME = "shards.arrow"

# A shard's files add ".meta.parquet" to its name, and a file name holds 255 bytes.
_MAX_NAME = 255 - len(".meta.parquet")

_COUNTS = ("records", "data_bytes", "index_bytes", "meta_bytes")
_CRCS = ("data_crc32c", "index_crc32c", "meta_crc32c")
SCHEMA = pa.schema([("name", pa.string())] + [(c, pa.int64()) for c in _COUNTS]
                   + [(c, pa.uint32()) for c in _CRCS])


@dataclass(frozen=True)
class ShardEntry:
    """One shard as the manifest lists it."""

    name: str
    records: int
    data_bytes: int
    index_bytes: int
    meta_bytes: int
    data_crc32c: int
    index_crc32c: int
    meta_crc32c: int

    @property
    def data_file(self) -> str:
        return f"{self.name}.rec"

    @property
    def index_file(self) -> str:
        return f"{self.name}.idx"

    @property
    def meta_file(self) -> str:
        return f"{self.name}.meta.parquet"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "records": self.records,
            "data_bytes": self.data_bytes,
            "index_bytes": self.index_bytes,
            "meta_bytes": self.meta_bytes,
            "data_crc32c": format_crc(self.data_crc32c),
            "index_crc32c": format_crc(self.index_crc32c),
            "meta_crc32c": format_crc(self.meta_crc32c),
        }


def index_sizes(records: np.ndarray, num_fields: int) -> np.ndarray:
    """:func:`formats.shard.layout.index_sections`' file size for many record counts."""
    cells = records.astype(np.int64) * num_fields

    def up(n):
        return (n + 63) & ~np.int64(63)

    lengths_at = up(HEADER_SIZE + cells * OFFSET_DTYPE.itemsize)
    crcs_at = up(lengths_at + cells * LENGTH_DTYPE.itemsize)
    return crcs_at + cells * CRC_DTYPE.itemsize


class ShardTable(Sequence):
    """The shards of a dataset, in global-index order: a sequence of :class:`ShardEntry`.

    ``records``, ``data_bytes``, ``index_bytes``, ``meta_bytes`` and the three
    ``*_crc32c`` are numpy columns (read-only views of the table's file where it
    was mapped).
    """

    def __init__(self, table: pa.Table) -> None:
        table = table.combine_chunks()
        self._names = table.column("name").chunk(0) if table.num_rows else pa.array([], pa.string())
        for c in _COUNTS + _CRCS:
            dtype = np.int64 if c in _COUNTS else np.uint32
            setattr(self, c, np.frombuffer(table.column(c).chunk(0).buffers()[1], dtype,
                                           table.num_rows, table.column(c).chunk(0).offset
                                           * np.dtype(dtype).itemsize)
                    if table.num_rows else np.zeros(0, dtype))
        self._table = table

    @classmethod
    def from_entries(cls, entries: Sequence[ShardEntry]) -> ShardTable:
        cols = {"name": pa.array([e.name for e in entries], pa.string())}
        for c in _COUNTS:
            cols[c] = pa.array([getattr(e, c) for e in entries], pa.int64())
        for c in _CRCS:
            cols[c] = pa.array([getattr(e, c) for e in entries], pa.uint32())
        return cls(pa.table(cols, schema=SCHEMA))

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if type(i) is not int or not 0 <= i < len(self.records):  # else asked by the hundred
            i = range(len(self))[i]  # IndexError, negative indices
        return ShardEntry(self._names[i].as_py(), int(self.records[i]), int(self.data_bytes[i]),
                          int(self.index_bytes[i]), int(self.meta_bytes[i]),
                          int(self.data_crc32c[i]), int(self.index_crc32c[i]),
                          int(self.meta_crc32c[i]))

    def __iter__(self) -> Iterator[ShardEntry]:
        names = self._names.to_pylist()
        cols = [getattr(self, c).tolist() for c in _COUNTS + _CRCS]
        for i, name in enumerate(names):
            yield ShardEntry(name, *(col[i] for col in cols))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShardTable):
            return self._table.equals(other._table)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def take(self, rows) -> ShardTable:
        """The table of the shards at ``rows`` (indices), in that order."""
        return ShardTable(self._table.take(pa.array(np.asarray(rows, np.int64))))

    def name(self, i: int) -> str:
        return self._names[i].as_py()

    @property
    def total_records(self) -> int:
        return int(self.records.sum())

    # -- the file ----------------------------------------------------------------------

    def to_ipc(self) -> bytes:
        """The table's file: Arrow IPC, uncompressed (so it maps), one record batch."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, SCHEMA) as writer:
            writer.write_table(self._table, max_chunksize=max(1, self._table.num_rows))
        return sink.getvalue().to_pybytes()

    @classmethod
    def read(cls, root: str | Path, name: str, *, size: int, crc: int, rows: int,
             num_fields: int, follow_symlinks: bool = False) -> ShardTable:
        """Read and check ``root/name`` (FORMAT.md, §4.1) against what the manifest says.

        Raises:
            ManifestError: a missing file or one that is not regular, a size or
                checksum other than the manifest's, not an Arrow IPC file of the
                table's schema, a row count other than ``rows``, a null, a negative
                count, an index size that does not fit its record count, two shards
                of one name.
            UnsafePathError: a shard name that is not a plain name in the folder.
        """
        check_plain_name(root, name, what="shard table name")
        path = Path(root) / name
        # Read, not mapped: a map would hold a descriptor as long as the dataset lives;
        # the table costs some 60 bytes a shard (60 MB for a million).
        buf = read_regular(path, root, limit=size, what="shard table", error=ManifestError,
                           follow_symlinks=follow_symlinks, size=size)
        found = crc32c(buf)
        if found != crc:
            raise ManifestError("shard table checksum mismatch", path=path,
                                found=format_crc(found), expected=format_crc(crc))
        try:
            table = pa.ipc.open_file(pa.py_buffer(buf)).read_all()
            table.validate(full=True)  # offsets in bounds, strings UTF-8
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise ManifestError(f"shard table is not a readable Arrow IPC file ({exc})",
                                path=path) from None
        if not table.schema.equals(SCHEMA):
            raise ManifestError("shard table has the wrong columns", path=path,
                                found=str(table.schema).replace("\n", ", "),
                                expected=str(SCHEMA).replace("\n", ", "))
        if table.num_rows != rows:
            raise ManifestError("shard table's row count disagrees with totals.shards",
                                path=path, found=table.num_rows, expected=rows)
        for c in SCHEMA.names:
            if table.column(c).null_count:
                raise ManifestError(f"shard table column {c!r} holds nulls", path=path)
        out = cls(table)
        out._check(path, root, num_fields)
        return out

    def _check(self, path: Path, root: str | Path, num_fields: int) -> None:
        for c in _COUNTS:
            bad = np.flatnonzero(getattr(self, c) < 0)
            if bad.size:
                raise ManifestError(f"shards[{bad[0]}]: {c} is negative", path=path,
                                    found=int(getattr(self, c)[bad[0]]))
        offsets, data, _ = string_buffers(self._names)
        lengths = np.diff(offsets)
        first = data[np.minimum(offsets[:-1], max(len(data) - 1, 0))] if len(data) else lengths
        second = data[np.minimum(offsets[:-1] + 1, max(len(data) - 1, 0))] if len(data) else lengths
        dots = ((lengths == 1) & (first == 46)) | ((lengths == 2) & (first == 46) & (second == 46))
        bad_byte = np.flatnonzero(np.isin(data[offsets[0]:offsets[-1]], (0, 47, 92)))
        bad = np.flatnonzero((lengths == 0) | (lengths > _MAX_NAME) | dots)
        rows = [*bad[:1].tolist(), *(np.searchsorted(offsets, bad_byte[:1] + offsets[0],
                                                     side="right") - 1).tolist()]
        if rows:
            name = self.name(min(rows))
            check_plain_name(root, name, what="shard name")
            raise ManifestError(f"shard name longer than {_MAX_NAME} bytes", path=path,
                                found=name[:40] + "...")
        duplicate = _duplicate(offsets, data)
        if duplicate is not None:
            raise ManifestError("two shards share a name", path=path, found=duplicate)
        # The index size is a function of the record count: checked here, a claimed
        # count is backed by an index file of that size on disk (checked at open).
        # Counts so large that the size overflows int64 cannot be backed either.
        too_big = self.records > (np.int64(1) << 40) // max(1, num_fields)
        expected = index_sizes(np.where(too_big, 0, self.records), num_fields)
        bad = np.flatnonzero(too_big | (expected != self.index_bytes))
        if bad.size:
            i = int(bad[0])
            raise ManifestError(f"shards[{i}]: index size (index_bytes) does not fit its "
                                "record count", path=path, found=int(self.index_bytes[i]),
                                expected=None if too_big[i] else int(expected[i]))


def _duplicate(offsets: np.ndarray, data: np.ndarray) -> str | None:
    """A name that occurs twice, or None: names hashed in numpy (a polynomial over their
    bytes, chunk by chunk), and only names whose hashes collide compared as strings."""
    n = len(offsets) - 1
    if n < 2:
        return None
    hashes = np.empty(n, np.uint64)
    with np.errstate(over="ignore"):
        powers = np.uint64(0x100000001B3) ** np.arange(_MAX_NAME + 1, dtype=np.uint64)
        for a in range(0, n, 1 << 18):
            b = min(n, a + (1 << 18))
            lo, hi = offsets[a], offsets[b]
            lengths = np.diff(offsets[a:b + 1])
            within = np.arange(hi - lo) - np.repeat(offsets[a:b] - lo, lengths)
            terms = (data[lo:hi].astype(np.uint64) + np.uint64(1)) * powers[within]
            hashes[a:b] = np.add.reduceat(terms, offsets[a:b] - lo) if hi > lo else 0
            hashes[a:b] ^= lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    order = np.argsort(hashes, kind="stable")
    same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
    seen: dict[bytes, int] = {}
    for i in np.unique(np.concatenate([order[same], order[same + 1]])).tolist():
        name = data[offsets[i]:offsets[i + 1]].tobytes()
        if name in seen:
            return name.decode("utf-8", "replace")
        seen[name] = i
    return None
