"""Writes one shard: its data file, its index file and its metadata table.

Files are written under temporary names and renamed only by :meth:`ShardWriter.seal`,
so a file with a final shard name is always complete.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..checksum import _crc32c, crc32c, file_crc32c
from ..fields import Field
from ..files import temp_name, writev_all
from .layout import (
    DATA_HEADER,
    DATA_MAGIC,
    HEADER_SIZE,
    INDEX_HEADER,
    INDEX_HEADER_CRC_SPAN,
    INDEX_MAGIC,
    MAJOR,
    MINOR,
    index_sections,
)
from .manifest import ShardEntry

__all__ = ["META_SCHEMA", "ShardWriter"]

# The per-record metadata table: readable without touching data files.
META_SCHEMA = pa.schema(
    [
        ("label", pa.int64()),
        ("key", pa.string()),
        ("size", pa.int64()),
        ("width", pa.int32()),
        ("height", pa.int32()),
    ]
)

_ZEROS = memoryview(bytes(4096))
# Pieces (payloads and padding) are gathered and written with one writev() per
# batch: no copy into a userspace buffer, which cost a third of packing time.
_GATHER_BYTES = 1 << 20
_GATHER_PIECES = 512
_IOV_MAX = 1024  # writev's limit on Linux (SC_IOV_MAX)


class ShardWriter:
    """Appends records to one shard.

    Args:
        root: the dataset folder.
        name: the shard's base name (``shard-00000``).
        fields: the schema, in index column order.
        alignment: payload alignment in bytes.
        durable: fsync files before they are renamed.
    """

    def __init__(self, root: Path, name: str, fields: tuple[Field, ...], alignment: int,
                 durable: bool = True) -> None:
        self.root = Path(root)
        self.name = name
        self.fields = fields
        self.alignment = alignment
        self.durable = durable
        self.entry = ShardEntry(name, 0, 0, 0, 0, 0, 0, 0)
        self._data_path = self.root / self.entry.data_file
        self._data_tmp = temp_name(self._data_path)
        self._fd = os.open(self._data_tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._pieces: list = []
        self._pending = 0
        header = np.zeros((), DATA_HEADER)
        header["magic"] = DATA_MAGIC
        header["major"], header["minor"] = MAJOR, MINOR
        header["header_size"], header["alignment"] = HEADER_SIZE, alignment
        self._pos = 0
        self._crc = 0
        self._put(header.tobytes())
        self._offsets: list[int] = []
        self._lengths: list[int] = []
        self._crcs: list[int] = []
        self._meta: dict[str, list] = {k: [] for k in META_SCHEMA.names}

    @property
    def records(self) -> int:
        return len(self._meta["size"])

    @property
    def nbytes(self) -> int:
        return self._pos

    def _put(self, data) -> None:
        if not isinstance(data, (bytes, memoryview)) or (
            isinstance(data, memoryview) and not data.readonly
        ):
            data = bytes(data)  # the caller may reuse a mutable buffer before we write it
        self._pieces.append(data)
        self._pending += len(data)
        self._crc = crc32c(data, self._crc)
        self._pos += len(data)
        if self._pending >= _GATHER_BYTES or len(self._pieces) >= _GATHER_PIECES:
            self._flush()

    def _flush(self) -> None:
        pieces = self._pieces
        for a in range(0, len(pieces), _IOV_MAX):
            writev_all(self._fd, pieces[a:a + _IOV_MAX])
        self._pieces = []
        self._pending = 0

    def append(self, payloads, meta: dict) -> None:
        """Append one record.

        Args:
            payloads: stored (already encoded and compressed) bytes per field, in
                schema order.
            meta: metadata table values (``label``, ``key``, ``width``,
                ``height``; missing ones are null). ``size`` is filled in here.
        """
        # The per-record path of every pack: _put's work inlined, the gather checked
        # once per record (at most two pieces per field: padding, payload).
        if len(self._pieces) + 2 * len(payloads) > _GATHER_PIECES:
            self._flush()
        pieces, offsets, lengths, crcs = self._pieces, self._offsets, self._lengths, self._crcs
        mask = self.alignment - 1
        pos = start = self._pos
        crc = self._crc
        size = 0
        for payload in payloads:
            if not isinstance(payload, bytes) and not (isinstance(payload, memoryview)
                                                       and payload.readonly):
                payload = bytes(payload)  # the caller may reuse a mutable buffer
            pad = ((pos + mask) & ~mask) - pos
            if pad:
                zeros = _ZEROS[:pad]  # alignment <= 4096: one slice of zeros
                pieces.append(zeros)
                crc = _crc32c(zeros, crc)
                pos += pad
            n = len(payload)
            offsets.append(pos)
            lengths.append(n)
            crcs.append(_crc32c(payload))
            if n:
                pieces.append(payload)
                crc = _crc32c(payload, crc)
                pos += n
                size += n
        meta_cols = self._meta
        for k in ("label", "key", "width", "height"):
            meta_cols[k].append(meta.get(k))
        meta_cols["size"].append(size)
        self._crc = crc
        self._pending += pos - start
        self._pos = pos
        if self._pending >= _GATHER_BYTES or len(pieces) >= _GATHER_PIECES:
            self._flush()

    def layout(self, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where a run of records would go if appended now: the payloads' offsets
        (``lengths``' shape: records x fields) and the data size after each record."""
        mask = self.alignment - 1
        flat = lengths.reshape(-1)
        offsets = np.empty_like(flat)
        offsets[0] = (self._pos + mask) & ~mask
        # Each payload starts at the next aligned position after the one before it.
        np.cumsum((flat[:-1] + mask) & ~mask, out=offsets[1:])
        offsets[1:] += offsets[0]
        offsets = offsets.reshape(lengths.shape)
        return offsets, offsets[:, -1] + lengths[:, -1]

    def append_run(self, columns: list, meta: dict[str, list], lengths: np.ndarray,
                   offsets: np.ndarray) -> None:
        """Append a run of records given column by column: the same bytes as
        :meth:`append` record by record, with per-run rather than per-record work.

        Args:
            columns: one :class:`formats.shard.columns.EncodedColumn` per field, in schema order.
            meta: metadata table columns (``label``, ``key``, ``width``, ``height``;
                missing ones are null).
            lengths, offsets: the payloads' lengths and :meth:`layout`'s offsets.

        The payloads are copied before this returns: they may be views of buffers
        the caller reuses afterwards.
        """
        n = len(lengths)
        flat_len = lengths.reshape(-1)
        flat_off = offsets.reshape(-1)
        gaps = np.empty_like(flat_off)
        gaps[0] = flat_off[0] - self._pos
        gaps[1:] = flat_off[1:] - flat_off[:-1] - flat_len[:-1]
        bodies = _by_record([c.bodies for c in columns])
        pieces: list = []
        add = pieces.append
        zeros = _ZEROS
        if all(c.heads is None for c in columns):
            for gap, body in zip(gaps.tolist(), bodies, strict=True):
                if gap:
                    add(zeros[:gap])
                add(body)
        else:
            heads = _by_record([c.heads or [None] * n for c in columns])
            for gap, head, body in zip(gaps.tolist(), heads, bodies, strict=True):
                if gap:
                    add(zeros[:gap])
                if head is not None:
                    add(head)
                add(body)
        # Small records: one join (a copy of data still in cache) costs less than a
        # checksum call and an iovec per piece, and leaves nothing of the caller's.
        data = b"".join(pieces)
        self._crc = _crc32c(data, self._crc)
        self._pieces.append(data)
        self._pending += len(data)
        self._offsets.extend(flat_off.tolist())
        self._lengths.extend(flat_len.tolist())
        self._crcs.extend(np.stack([c.crcs for c in columns], axis=1).reshape(-1).tolist())
        meta_cols = self._meta
        for k in ("label", "key", "width", "height"):
            meta_cols[k].extend(meta.get(k) or [None] * n)
        meta_cols["size"].extend(lengths.sum(axis=1).tolist())
        self._pos = int(flat_off[-1] + flat_len[-1])
        if self._pending >= _GATHER_BYTES or len(self._pieces) >= _GATHER_PIECES:
            self._flush()

    def seal(self) -> ShardEntry:
        """Finish the three files, rename them to their final names, return the entry."""
        self._flush()
        if self.durable:
            os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        data_size = self._pos
        data_crc = self._crc

        n, nf = self.records, len(self.fields)
        offsets_at, lengths_at, crcs_at, index_size = index_sections(n, nf)
        index = bytearray(index_size)
        header = np.zeros((), INDEX_HEADER)
        header["magic"] = INDEX_MAGIC
        header["major"], header["minor"] = MAJOR, MINOR
        header["header_size"], header["record_count"] = HEADER_SIZE, n
        header["num_fields"], header["alignment"] = nf, self.alignment
        header["data_size"], header["data_crc32c"] = data_size, data_crc
        raw = header.tobytes()
        header["header_crc32c"] = crc32c(raw[:INDEX_HEADER_CRC_SPAN])
        index[:HEADER_SIZE] = header.tobytes()
        cells = n * nf
        index[offsets_at : offsets_at + 8 * cells] = np.asarray(self._offsets, "<u8").tobytes()
        index[lengths_at : lengths_at + 8 * cells] = np.asarray(self._lengths, "<u8").tobytes()
        index[crcs_at : crcs_at + 4 * cells] = np.asarray(self._crcs, "<u4").tobytes()

        index_path = self.root / self.entry.index_file
        meta_path = self.root / self.entry.meta_file
        index_tmp, meta_tmp = temp_name(index_path), temp_name(meta_path)
        try:
            self._write_file(index_tmp, index)
            meta_bytes = self._meta_table_bytes()
            self._write_file(meta_tmp, meta_bytes)
            # The index is renamed last: a data file without its index is never opened.
            os.replace(self._data_tmp, self._data_path)
            os.replace(meta_tmp, meta_path)
            os.replace(index_tmp, index_path)
        except BaseException:
            for p in (index_tmp, meta_tmp, self._data_tmp):
                p.unlink(missing_ok=True)
            raise
        self.entry = ShardEntry(
            name=self.name,
            records=n,
            data_bytes=data_size,
            index_bytes=index_size,
            meta_bytes=len(meta_bytes),
            data_crc32c=data_crc,
            index_crc32c=crc32c(index),
            meta_crc32c=crc32c(meta_bytes),
        )
        return self.entry

    def _write_file(self, path: Path, data) -> None:
        with open(path, "wb") as f:
            f.write(data)
            if self.durable:
                f.flush()
                os.fsync(f.fileno())

    def _meta_table_bytes(self) -> bytes:
        # Built from buffers: pa.array() imports pandas (half a second, in every process
        # that seals a shard) to ask whether its input is a pandas object.
        table = pa.Table.from_arrays([_arrow_column(self._meta[f.name], f.type)
                                      for f in META_SCHEMA], schema=META_SCHEMA)
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd")
        return sink.getvalue()

    def abort(self) -> None:
        """Drop the unfinished shard's temporary files."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._data_tmp.unlink(missing_ok=True)


def _by_record(columns: list[list]) -> list:
    """Per-field lists of a run's values, interleaved record by record."""
    if len(columns) == 1:
        return columns[0]
    return [v for record in zip(*columns, strict=True) for v in record]


def entry_matches_files(root: Path, entry: ShardEntry) -> bool:
    """Whether the three files of a sealed shard exist with the recorded sizes and checksums."""
    try:
        for file, size, crc in (
            (entry.data_file, entry.data_bytes, entry.data_crc32c),
            (entry.index_file, entry.index_bytes, entry.index_crc32c),
            (entry.meta_file, entry.meta_bytes, entry.meta_crc32c),
        ):
            path = root / file
            if path.stat().st_size != size or file_crc32c(path) != crc:
                return False
    except OSError:
        return False
    return True


def _arrow_column(values: list, typ: pa.DataType) -> pa.Array:
    """A column of Python ints or strs (None for null) as an Arrow array of ``typ``."""
    n = len(values)
    nulls = values.count(None)
    if nulls == n:  # a column nobody filled (no labels, no sizes): no per-value work
        return pa.nulls(n, typ)
    bitmap = None
    if nulls:
        valid = np.fromiter((v is not None for v in values), bool, n)
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    if pa.types.is_string(typ):
        data = [v.encode("utf-8") if v is not None else b"" for v in values]
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(np.fromiter(map(len, data), np.int64, n), out=offsets[1:])
        return pa.Array.from_buffers(typ, n, [bitmap, pa.py_buffer(offsets),
                                              pa.py_buffer(b"".join(data))], null_count=nulls)
    dtype = {pa.int64(): np.int64, pa.int32(): np.int32}[typ]
    data = np.fromiter((0 if v is None else v for v in values), dtype, n) if nulls else \
        np.array(values, dtype)
    return pa.Array.from_buffers(typ, n, [bitmap, pa.py_buffer(data)], null_count=nulls)

