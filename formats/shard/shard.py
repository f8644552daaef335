"""Reads one shard through mmap: a field is an index lookup and a slice.

Opening a shard checks headers and file sizes only (O(1)); the per-record index
checks run lazily, vectorized in numpy, on each block of :data:`BLOCK` records the
first time a record of that block is read from this mapping
(:meth:`ShardReader.validate`), so no slice can ever fall outside the file and a
batch that touches one record in each of 256 shards checks 256 blocks, not 256
whole indexes. Nothing about an index is trusted from outside its mapping (no
cache folder holds a "validated" mark a hostile hand could set): a reopened shard,
in another process or after an eviction, starts with no block checked.

A file that shrinks while it is mapped is the one thing those checks cannot
cover: touching a page past its new end raises SIGBUS, which kills the process
(no Python handler can resume the faulting read). Callers therefore run
:meth:`ShardReader.check_size` before reading a shard: once per batch per shard
in the loader, once per single-record read. It is one ``fstat`` of each mapped
file (about 0.3 us) on the descriptor the map itself holds, so it sees the file
that is mapped even after a rename replaced the name. A truncation racing the
read between check and access is not covered; one before it always is.

An open shard holds two descriptors (Python's ``mmap`` keeps a duplicate of
each file's); :class:`formats.shard.shard_set.ShardSet` bounds how many shards a
process keeps open.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path

import numpy as np

from ..checksum import crc32c
from ..errors import CorruptRecordError, FormatError, MissingFileError, VersionError
from ..files import FD_EXHAUSTED, open_regular
from .layout import (
    DATA_HEADER,
    DATA_MAGIC,
    HEADER_SIZE,
    INDEX_HEADER,
    INDEX_HEADER_CRC_SPAN,
    INDEX_MAGIC,
    MAJOR,
    index_sections,
)
from .manifest import ShardEntry

__all__ = ["BLOCK", "ShardReader"]

# Records per block of lazy index validation. 256 records x a few fields is a few
# KiB of index: one vectorized check costs about what its numpy calls' overhead
# does, and a full shuffle's first batch (one record in each of up to 256 shards)
# checks 256 x 256 records however large the shards are.
BLOCK_SHIFT = 8
BLOCK = 1 << BLOCK_SHIFT


def _map(path: Path, root: Path, expected_size: int, what: str,
         follow_symlinks: bool) -> tuple[mmap.mmap, int, bytes]:
    """Map a regular file of exactly ``expected_size`` bytes: (map, mtime in ns, its
    header's bytes).

    The header is read with ``pread``, not through the map: a page's first touch in
    a fresh mapping is a page fault (25-30 us on a virtual machine, against 1 us for
    the read), and a full shuffle opens up to a batch's worth of shards at once.

    Raises:
        MissingFileError: the file does not exist (a ``FormatError`` and a
            ``FileNotFoundError``: deleted since the dataset was opened, say).
        FormatError: not a regular file, wrong size, cannot be mapped.
        UnsafePathError: a symlink out of ``root`` (unless ``follow_symlinks``).
        OSError: only EMFILE/ENFILE (see :func:`formats.files.open_regular`).
    """
    fd, st = open_regular(path, root, what=f"{what} file", missing=MissingFileError,
                          follow_symlinks=follow_symlinks)
    try:
        size = st.st_size
        if size != expected_size:
            kind = "truncated" if size < expected_size else "larger than recorded"
            raise FormatError(f"{what} file is {kind}", path=path, found=f"{size} bytes",
                              expected=f"{expected_size} bytes")
        if size < HEADER_SIZE:
            raise FormatError(f"{what} file is shorter than its header", path=path, found=size)
        try:
            header = os.pread(fd, HEADER_SIZE, 0)
            return mmap.mmap(fd, 0, access=mmap.ACCESS_READ), st.st_mtime_ns, header
        except OSError as exc:
            if exc.errno in FD_EXHAUSTED:
                raise
            raise FormatError(f"cannot map {what} file ({exc.strerror})", path=path) from None
    finally:
        os.close(fd)


def _check_magic(path: Path, raw: bytes, header: np.ndarray, magic: bytes, what: str) -> None:
    if raw[:8] != magic:
        raise FormatError(f"not a shardpack {what} file (bad magic)", path=path, offset=0,
                          found=raw[:8], expected=magic)
    if int(header["major"]) != MAJOR:
        raise VersionError(
            f"{what} file has format version {int(header['major'])}.{int(header['minor'])}; "
            f"this shardpack reads {MAJOR}.x: upgrade shardpack",
            path=path,
        )
    if int(header["header_size"]) != HEADER_SIZE:
        raise FormatError(f"{what} header size", path=path, offset=12,
                          found=int(header["header_size"]), expected=HEADER_SIZE)


class ShardReader:
    """One open shard.

    Attributes:
        offsets, lengths: ``(records, fields)`` uint64 views of the index.
        crcs: ``(records, fields)`` uint32 views of the per-field CRC32C.
        checked: a bit per record, set once every field of it matched its CRC32C in
            this mapping (``ShardDataset.__getitem__`` checks a record once per mapping).
        validated: True once every index entry was checked in this mapping (all
            blocks; see :meth:`validate`).
        data: the data file as a read-only uint8 numpy view (whole file).
    """

    def __init__(self, root: Path, entry: ShardEntry, num_fields: int, alignment: int, *,
                 follow_symlinks: bool = False) -> None:
        self.entry = entry
        root = root if isinstance(root, Path) else Path(root)  # reopened often: no needless Path
        self.data_path = root / entry.data_file
        self.index_path = root / entry.index_file
        self.offsets = self.lengths = self.crcs = self.data = self.view = None
        self._index_mm = self._data_mm = None
        self._words: dict[str, np.ndarray] = {}
        *_, expected_index = index_sections(entry.records, num_fields)
        if entry.index_bytes != expected_index:
            raise FormatError("index size recorded in the manifest does not fit its record count",
                              path=self.index_path, found=entry.index_bytes, expected=expected_index)
        try:
            self._open(root, entry, num_fields, alignment, expected_index, follow_symlinks)
        except BaseException:
            self.close()  # a refused shard keeps no descriptor
            raise

    def _open(self, root: Path, entry: ShardEntry, num_fields: int, alignment: int,
              expected_index: int, follow_symlinks: bool) -> None:
        self._index_mm, index_mtime, index_head = _map(self.index_path, root, expected_index,
                                                       "index", follow_symlinks)
        self._data_mm, data_mtime, data_head = _map(self.data_path, root, entry.data_bytes,
                                                    "data", follow_symlinks)
        self._index_size = expected_index
        self._data_size = entry.data_bytes
        # Which files were mapped: a shard reopened later (after an eviction, or in a
        # worker) must be these same files, not ones written since in their place.
        self.identity = (data_mtime, index_mtime)

        # Headers are read from copies: a refused shard leaves no view pinning its maps.
        ih = np.frombuffer(index_head, INDEX_HEADER, 1)[0]
        _check_magic(self.index_path, index_head, ih, INDEX_MAGIC, "index")
        if crc32c(index_head[:INDEX_HEADER_CRC_SPAN]) != int(ih["header_crc32c"]):
            raise FormatError("index header checksum mismatch", path=self.index_path, offset=44)
        for key, expected in (("record_count", entry.records), ("num_fields", num_fields),
                              ("alignment", alignment), ("data_size", entry.data_bytes)):
            if int(ih[key]) != expected:
                raise FormatError(f"index header {key} disagrees with the manifest",
                                  path=self.index_path, found=int(ih[key]), expected=expected)
        dh = np.frombuffer(data_head, DATA_HEADER, 1)[0]
        _check_magic(self.data_path, data_head, dh, DATA_MAGIC, "data")
        if int(dh["alignment"]) != alignment:
            raise FormatError("data header alignment disagrees with the manifest",
                              path=self.data_path, offset=16, found=int(dh["alignment"]),
                              expected=alignment)

        n = entry.records
        offsets_at, lengths_at, crcs_at, _ = index_sections(n, num_fields)
        cells = n * num_fields
        shape = (n, num_fields)
        self.offsets = np.frombuffer(self._index_mm, "<u8", cells, offsets_at).reshape(shape)
        self.lengths = np.frombuffer(self._index_mm, "<u8", cells, lengths_at).reshape(shape)
        self.crcs = np.frombuffer(self._index_mm, "<u4", cells, crcs_at).reshape(shape)
        self.data = np.frombuffer(self._data_mm, np.uint8)
        self.view = memoryview(self._data_mm)
        self.alignment = alignment
        self.validated = n == 0
        # A flag per block of BLOCK records: its index entries passed validate() in
        # this mapping (an index file, like a data file, is never written in place).
        self._blocks = np.zeros((n + BLOCK - 1) >> BLOCK_SHIFT, bool)
        self._blocks_left = len(self._blocks)
        # A bit per record: every field of it matched its CRC32C in this mapping. Data
        # files are never written in place (FORMAT.md: a dataset is replaced whole, by a
        # rename), so a mapping's bytes are what the first check saw; and a zero-copy
        # view handed out is only ever vouched for at the moment of a check, so checking
        # the same record again on every read guards nothing more. A reopened shard (an
        # eviction, another process, a pickled dataset) starts with no bits set.
        self.checked = bytearray((n + 7) // 8)

    def __len__(self) -> int:
        return self.entry.records

    def check_size(self) -> None:
        """Raise :class:`FormatError` if a mapped file has shrunk since it was opened
        (reading it would raise SIGBUS; see the module docstring)."""
        if self._data_mm.size() < self._data_size or self._index_mm.size() < self._index_size:
            for path, mm, expected in ((self.data_path, self._data_mm, self._data_size),
                                       (self.index_path, self._index_mm, self._index_size)):
                if mm.size() < expected:
                    raise FormatError(
                        "file was truncated while mapped (changed in place since the dataset "
                        "was opened); reading it would crash the process with SIGBUS",
                        path=path, found=f"{mm.size()} bytes", expected=f"{expected} bytes")

    def words(self, dtype: np.dtype) -> np.ndarray:
        """The data file as 8-byte words of ``dtype`` (``<i8``/``<f8``), for gathering
        scalar fields, whose payloads are 8 bytes at 8-aligned offsets."""
        view = self._words.get(dtype.char)
        if view is None:
            view = self.data[: self.data.size - self.data.size % 8].view(dtype)
            self._words[dtype.char] = view
        return view

    def validate(self, records=None) -> None:
        """Check index entries against the data file, in numpy; raise on the first bad one.

        Every entry MUST lie inside the data file after its header, aligned, and start
        at or after the end of the entry before it (FORMAT.md). With ``records`` (an
        int or an integer array of record numbers in this shard), only the blocks of
        :data:`BLOCK` records they lie in are checked, each once per mapping; without,
        the whole index. A record is sliced only after its block passed.

        Raises:
            FormatError: an entry is out of bounds, misaligned or overlapping (names
                the index file, the record and the field).
        """
        if self.validated:
            return
        if records is None:
            self._check_span(0, None)
            self._blocks[:] = True
            self._blocks_left = 0
            self.validated = True
            return
        done = self._blocks
        if isinstance(records, (int, np.integer)):
            todo = [] if done[int(records) >> BLOCK_SHIFT] else [int(records) >> BLOCK_SHIFT]
        elif len(records) <= 64:  # a few records of a shuffled batch: Python beats numpy
            todo = sorted({b for b in (np.asarray(records) >> BLOCK_SHIFT).tolist()
                           if not done[b]})
        else:
            blocks = np.unique(np.asarray(records) >> BLOCK_SHIFT)
            todo = blocks[~done[blocks]].tolist()
        if not todo:
            return
        # One check per run of consecutive blocks: a slice of the index, no gather.
        width = BLOCK * self.offsets.shape[1]
        first = todo[0]
        for a, b in zip(todo, [*todo[1:], None]):  # noqa: B905
            if b != a + 1:
                self._check_span(first * width, (a + 1) * width)
                first = b
        done[todo] = True
        self._blocks_left -= len(todo)
        if self._blocks_left == 0:
            self.validated = True

    def _check_span(self, lo: int, hi: int | None) -> None:
        """Check the flat index entries ``lo:hi`` (``0, None``: all of them), and the
        entry before ``lo``, which the first of them is compared with.

        An index passes iff every entry is aligned and starts at or after the end of
        the entry before it, the first starts after the header, no offset or length
        exceeds the file (so no sum wraps) and the last entry ends within it: the
        chain then puts every entry inside the file. That is six numpy reductions
        over the span; only a span that fails is looked at entry by entry, to name
        the first bad one.
        """
        lo = max(lo - 1, 0)
        off = self.offsets.reshape(-1)[lo:hi]
        length = self.lengths.reshape(-1)[lo:hi]
        if not len(off):
            return
        size = self.entry.data_bytes
        if (int(off.max()) <= size and int(length.max()) <= size
                and int(off[0]) >= HEADER_SIZE and not (off & (self.alignment - 1)).any()):
            ends = off + length  # no overflow: both terms are <= size
            if int(ends[-1]) <= size and not (off[1:] < ends[:-1]).any():
                return
        bad = self._out_of_bounds(off, length)
        if not bad.any():
            bad[1:] = off[1:] < (off + length)[:-1]  # payloads in order, never overlapping
        self._refuse(lo + int(np.flatnonzero(bad)[0]))

    def _out_of_bounds(self, off: np.ndarray, length: np.ndarray) -> np.ndarray:
        size = self.entry.data_bytes
        bad = (off < HEADER_SIZE) | (off > size) | (length > size) | (off % self.alignment != 0)
        if not bad.any():
            bad = off + length > size  # no overflow: both terms are <= size
        return bad

    def _refuse(self, cell: int) -> None:
        record, field = divmod(cell, self.offsets.shape[1])
        off, length = self.offsets[record, field], self.lengths[record, field]
        raise FormatError(
            f"index entry for field {field} is out of bounds, misaligned or overlapping",
            path=self.index_path, record=record,
            found=f"offset {int(off)} length {int(length)}",
            expected=f"aligned to {self.alignment}, after the previous payload, "
                     f"within {self.entry.data_bytes} bytes",
        )

    def payload(self, record: int, field: int, check: bool = False) -> memoryview:
        """The stored bytes of one field of one record (zero-copy)."""
        if not self.validated and not self._blocks[record >> BLOCK_SHIFT]:
            self.validate(record)
        start = int(self.offsets[record, field])
        view = self.view[start : start + int(self.lengths[record, field])]
        if check:
            self.check(record, field, view)
        return view

    def check(self, record: int, field: int, view) -> None:
        """Raise :class:`CorruptRecordError` unless ``view`` matches its stored CRC32C."""
        expected = int(self.crcs[record, field])
        found = crc32c(view)
        if found != expected:
            raise CorruptRecordError(
                f"field {field} checksum mismatch",
                path=self.data_path, record=record, offset=int(self.offsets[record, field]),
                found=f"0x{found:08x}", expected=f"0x{expected:08x}",
            )

    def close(self) -> None:
        """Release the maps (deferred to garbage collection while views are alive)."""
        self.offsets = self.lengths = self.crcs = self.data = None
        self._words = {}
        if self.view is not None:
            with contextlib.suppress(BufferError):
                self.view.release()
        for mm in (self._index_mm, self._data_mm):
            if mm is None:
                continue
            try:
                mm.close()
            except BufferError:
                pass  # a caller still holds a view; the map (and its descriptor) go when it does
