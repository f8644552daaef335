"""Reads one shard through mmap: a field is an index lookup and a slice.

Opening a shard checks headers and file sizes only (O(1)); the per-record index
checks run lazily, vectorized in numpy, on each block of :data:`BLOCK` records the
first time a record of that block is read from this open shard
(:meth:`ShardReader.validate`), so no slice can ever fall outside the file and a
batch that touches one record in each of 256 shards checks 256 blocks, not 256
whole indexes. Nothing about an index is trusted from outside this open shard (no
cache folder holds a "validated" mark a hostile hand could set): a reopened shard,
in another process or after an eviction, starts with no block checked.

A shard opened on first use (``mapped=False``: a dataset of many shards, whose
first full-shuffle batch opens a batch's worth of them) reads its first few
records with ``pread`` (:data:`SPARSE_RECORDS`, a few at a time): on a virtual
machine a map costs 20-45 us and each page's first touch in it a fault of 25-30
us, where a ``pread`` of a page costs about 1 us. Between reads its descriptors are
closed (:meth:`ShardReader.release`) and reopened on demand, each checked to be
the file first opened (:class:`_ShardFile`). A read of more records at once, or
one past that budget, maps both files, so what is mapped is the pair of files
checked at open whatever was renamed since. Until then it checks the index
entries of each record it reads, one by one, not their block (a numpy check of a
block costs some 20 us); once mapped, blocks as above. Records whose CRC32C was
checked stay checked (the files are the same; a dataset is never written in place).

A file that shrinks while it is mapped is the one thing those checks cannot
cover: touching a page past its new end raises SIGBUS, which kills the process
(no Python handler can resume the faulting read). Callers therefore run
:meth:`ShardReader.check_size` before reading a shard: once per batch per shard
in the loader, once per single-record read. It is one ``fstat`` of each mapped
file (about 0.3 us) on the descriptor the map itself holds, so it sees the file
that is mapped even after a rename replaced the name. A truncation racing the
read between check and access is not covered; one before it always is. A shard
read with ``pread`` needs no such check: a read past a file's new end comes back
short and is refused, typed.

An open shard holds at most two descriptors (its files', or once mapped Python's
``mmap``'s duplicate of each); :class:`formats.shard.shard_set.ShardSet` bounds how
many shards a process keeps open.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading
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

# A shard opened unmapped reads up to SPARSE_RECORDS records (counted per read, so a
# record read for two fields counts twice) with pread, at most SPARSE_READ at once,
# then maps its files. A full shuffle's batch holds one or two records of each shard
# it touches, so its first batch reads every shard without a map; a map serves the
# rest of the epoch (its page faults and block checks are paid once per page and
# block). Measured over a raw full shuffle of 300 shards, the first 201 batches took
# as long in all as when every shard was mapped at once with 16 (3% more over the
# 200 after the first with 32, which keep shards unmapped for longer).
SPARSE_RECORDS = 16
SPARSE_READ = 4
# Until mapped, the data file is read a page at a time and keeps its last PAGES_KEPT
# pages (16 KiB a shard): a record's fields lie side by side, and a batch reads them one
# field at a time (its index rows are kept whole: ShardReader._read_row).
PAGE = 4096
PAGES_KEPT = 4


def _pread(fd: int, n: int, at: int, path: Path) -> bytes:
    """``n`` bytes of an open shard file from byte ``at``: all of them, or a typed error.

    Raises:
        FormatError: the file ends before them (truncated since it was opened; the
            entries read were checked against its size at open) or cannot be read.
    """
    try:
        raw = os.pread(fd, n, at)
    except OSError as exc:
        raise FormatError(f"cannot read shard file ({exc.strerror})", path=path,
                          offset=at) from None
    if len(raw) != n:
        raise FormatError("file was truncated while open (changed in place since the "
                          "dataset was opened)", path=path, offset=at,
                          found=f"{len(raw)} bytes", expected=f"{n} bytes")
    return raw


def _map(fd: int, path: Path, size: int, what: str) -> mmap.mmap:
    """Map the whole of a shard file opened (the map keeps its own duplicate of ``fd``).

    Raises:
        FormatError: it cannot be mapped, or it shrank since it was opened.
        OSError: only EMFILE/ENFILE (the map's duplicate descriptor).
    """
    try:
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        if exc.errno in FD_EXHAUSTED:
            raise
        raise FormatError(f"cannot map {what} file ({exc.strerror})", path=path) from None
    except ValueError:  # an empty file: it was truncated since it was opened
        mm = None
    if mm is None or len(mm) < size:
        found = 0 if mm is None else len(mm)
        if mm is not None:
            mm.close()
        raise FormatError(f"{what} file was truncated while open (changed in place since "
                          "the dataset was opened)", path=path, found=f"{found} bytes",
                          expected=f"{size} bytes")
    return mm


_UNSIGNED = {1: "B", 2: "H", 4: "I", 8: "Q"}  # struct's codes, by size


def _unpacker(dtype: np.dtype) -> tuple[struct.Struct, tuple[str, ...]]:
    """A header dtype of :mod:`formats.shard.layout` (unsigned little-endian integers,
    byte strings and reserved bytes) as a ``struct`` format and the names it yields:
    the layout stays declared once, and a full shuffle's batch parses hundreds of
    headers (numpy's record scalar costs microseconds a field)."""
    codes, names = ["<"], []
    for name in dtype.names:
        sub = dtype.fields[name][0]
        if sub.kind == "V":
            codes.append(f"{sub.itemsize}x")  # reserved: skipped
            continue
        assert sub.kind in "uS", dtype
        codes.append(f"{sub.itemsize}s" if sub.kind == "S" else _UNSIGNED[sub.itemsize])
        names.append(name)
    unpacker = struct.Struct("".join(codes))
    assert unpacker.size == dtype.itemsize, dtype
    return unpacker, tuple(names)


_INDEX_HEADER = _unpacker(INDEX_HEADER)
_DATA_HEADER = _unpacker(DATA_HEADER)


def _header(raw: bytes, layout: tuple[struct.Struct, tuple[str, ...]]) -> dict:
    """A file's header as Python values by field name (:func:`_unpacker`'s layout)."""
    unpacker, names = layout
    return dict(zip(names, unpacker.unpack(raw), strict=True))


def _check_magic(path: str, raw: bytes, header: dict, magic: bytes, what: str) -> None:
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


class _ShardFile:
    """One of the two files of a shard not mapped yet: read with ``pread``, and sliced
    as its map's memoryview would be (``file[start:stop]``: a copy, whole or refused).

    Its descriptor is closed between uses (:meth:`release`) and reopened on demand,
    and a reopened file must be the very file first opened (device, inode, size and
    mtime). A full shuffle's batch reads a record or two in each of a few hundred
    shards: holding two descriptors for each would grow the process's descriptor
    table past 64, 128 and 256 entries within the batch, and each growth, in a
    process with threads, waits for an RCU grace period (5-13 ms measured here).
    A lock keeps a read and a release of the descriptor apart: a descriptor closed
    under a read in another thread could be reused by a file opened meanwhile.
    """

    __slots__ = ("_lock", "_pages", "_seen", "closed", "fd", "follow_symlinks", "path", "root",
                 "size", "what")

    def __init__(self, path: str, root: Path, size: int, what: str,
                 follow_symlinks: bool) -> None:
        self.fd = -1
        self.path, self.root, self.size, self.what = path, root, size, what
        self.follow_symlinks = follow_symlinks
        self.closed = False
        self._seen: tuple[int, int, int, int] | None = None
        self._pages: dict[int, bytes] = {}  # the last PAGES_KEPT pages read, by offset
        self._lock = threading.Lock()

    def open(self) -> tuple[int, bytes]:
        """Open the file, which must be regular and exactly :attr:`size` bytes: (its
        mtime in ns, its header's bytes).

        The header is read with ``pread``, not through a map: a page's first touch
        in a fresh mapping is a page fault (25-30 us on a virtual machine, against 1
        us for the read).

        Raises:
            MissingFileError: the file does not exist (a ``FormatError`` and a
                ``FileNotFoundError``: deleted since the dataset was opened, say).
            FormatError: not a regular file, wrong size, unreadable.
            UnsafePathError: a symlink out of the dataset (unless ``follow_symlinks``).
            OSError: only EMFILE/ENFILE (see :func:`formats.files.open_regular`).
        """
        fd, st = open_regular(self.path, self.root, what=f"{self.what} file",
                              missing=MissingFileError, follow_symlinks=self.follow_symlinks)
        self.fd = fd
        size = st.st_size
        if size != self.size:
            kind = "truncated" if size < self.size else "larger than recorded"
            raise FormatError(f"{self.what} file is {kind}", path=self.path,
                              found=f"{size} bytes", expected=f"{self.size} bytes")
        if size < HEADER_SIZE:
            raise FormatError(f"{self.what} file is shorter than its header", path=self.path,
                              found=size)
        self._seen = (st.st_dev, st.st_ino, size, st.st_mtime_ns)
        return st.st_mtime_ns, _pread(fd, HEADER_SIZE, 0, self.path)

    def _descriptor(self) -> int:
        """The open descriptor, the file reopened if it was released (under the lock).

        Raises:
            FormatError: the shard was closed or mapped since, or the file is no
                longer the one first opened (replaced, or truncated in place).
        """
        if self.fd >= 0:
            return self.fd
        if self.closed:
            raise FormatError("read of a shard file closed since it was opened", path=self.path)
        try:
            fd, st = open_regular(self.path, self.root, what=f"{self.what} file",
                                  missing=MissingFileError,
                                  follow_symlinks=self.follow_symlinks)
        except OSError as exc:  # EMFILE: the table is full of other files
            raise FormatError(f"cannot reopen shard file ({exc.strerror})",
                              path=self.path) from None
        seen = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if seen != self._seen:
            os.close(fd)
            same_file = seen[:2] == self._seen[:2]
            raise FormatError(
                "file was truncated or rewritten while open (changed in place since the "
                "dataset was opened)" if same_file else
                f"the dataset at {self.root} was replaced since it was opened (this "
                "shard's files are not the ones first opened); reopen it", path=self.path)
        self.fd = fd
        return fd

    def pread(self, n: int, at: int) -> bytes:
        """``n`` bytes from byte ``at`` (see :func:`_pread`)."""
        with self._lock:
            return _pread(self._descriptor(), n, at, self.path)

    def read(self, n: int, at: int) -> memoryview:
        """:meth:`pread` through the pages kept, when the bytes lie in one page."""
        page = at - at % PAGE
        with self._lock:
            if at + n > page + PAGE:
                return memoryview(_pread(self._descriptor(), n, at, self.path))
            raw = self._pages.get(page)
            if raw is None:
                raw = _pread(self._descriptor(), min(PAGE, self.size - page), page, self.path)
                if len(self._pages) >= PAGES_KEPT:
                    del self._pages[next(iter(self._pages))]
                self._pages[page] = raw
            if at + n > page + len(raw):  # past the size checked at open: a bad entry's
                return memoryview(_pread(self._descriptor(), n, at, self.path))  # refused
        return memoryview(raw)[at - page : at - page + n]

    def map(self) -> mmap.mmap:
        """The whole file mapped (see :func:`_map`), through a descriptor checked to be
        of the file first opened."""
        with self._lock:
            return _map(self._descriptor(), self.path, self.size, self.what)

    def __getitem__(self, span: slice) -> memoryview:
        return self.read(span.stop - span.start, span.start)

    def release(self) -> None:
        """Close the descriptor until the next read."""
        with self._lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1

    def close(self) -> None:
        """Close the descriptor for good (the shard is mapped or closed)."""
        self.release()
        self.closed = True
        self._pages = {}

    def __del__(self) -> None:
        # A reader dropped unclosed (two threads opening one shard at once: ShardSet
        # keeps one) gives its descriptor back with it, as a map would.
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)


class ShardReader:
    """One open shard.

    Attributes:
        offsets, lengths: ``(records, fields)`` uint64 views of the index (None
            until the shard is mapped: :meth:`row` and :meth:`entries` read either way).
        crcs: ``(records, fields)`` uint32 views of the per-field CRC32C (likewise).
        checked: a bit per record, set once every field of it matched its CRC32C in
            this open shard (``ShardDataset.__getitem__`` checks a record once).
        validated: True once every index entry was checked in this open shard (all
            blocks; see :meth:`validate`).
        mapped: whether the files are mapped (see the module docstring).
        data: the data file as a read-only uint8 numpy view (whole file; None until
            mapped).
        view: the data file, sliced ``view[start:stop]``: the map's memoryview
            (zero-copy), or, until mapped, copies read with ``pread``.
    """

    def __init__(self, root: Path, entry: ShardEntry, num_fields: int, alignment: int, *,
                 follow_symlinks: bool = False, mapped: bool = True) -> None:
        self.entry = entry
        # Names as text: a full shuffle opens hundreds of shards per batch, and a Path
        # costs microseconds to build and again to pass to each system call.
        index_name = f"{root}{os.sep}{entry.index_file}"
        data_name = f"{root}{os.sep}{entry.data_file}"
        self.offsets = self.lengths = self.crcs = self.data = self.view = None
        self._index_mm = self._data_mm = None
        self.mapped = False
        self._words: dict[str, np.ndarray] = {}
        *sections, expected_index = index_sections(entry.records, num_fields)
        if entry.index_bytes != expected_index:
            raise FormatError("index size recorded in the manifest does not fit its record count",
                              path=index_name, found=entry.index_bytes, expected=expected_index)
        self._sections = sections[:3]  # where the offsets, lengths and crcs tables start
        # The files, read with pread until mapped (then closed: the maps hold their own).
        self._index_file = _ShardFile(index_name, root, expected_index, "index", follow_symlinks)
        self._data_file = _ShardFile(data_name, root, entry.data_bytes, "data", follow_symlinks)
        try:
            self._open(entry, num_fields, alignment)
            if mapped:
                self.map()
        except BaseException:
            self.close()  # a refused shard keeps no descriptor
            raise

    def _open(self, entry: ShardEntry, num_fields: int, alignment: int) -> None:
        index_mtime, index_head = self._index_file.open()
        data_mtime, data_head = self._data_file.open()
        self._index_size = self._index_file.size
        self._data_size = entry.data_bytes
        # Which files were opened: a shard reopened later (after an eviction, or in a
        # worker) must be these same files, not ones written since in their place.
        self.identity = (data_mtime, index_mtime)

        # Headers are read from copies: a refused shard leaves no view pinning its maps.
        ih = _header(index_head, _INDEX_HEADER)
        _check_magic(self._index_file.path, index_head, ih, INDEX_MAGIC, "index")
        if crc32c(index_head[:INDEX_HEADER_CRC_SPAN]) != int(ih["header_crc32c"]):
            raise FormatError("index header checksum mismatch", path=self._index_file.path,
                              offset=44)
        for key, expected in (("record_count", entry.records), ("num_fields", num_fields),
                              ("alignment", alignment), ("data_size", entry.data_bytes)):
            if int(ih[key]) != expected:
                raise FormatError(f"index header {key} disagrees with the manifest",
                                  path=self._index_file.path, found=int(ih[key]), expected=expected)
        dh = _header(data_head, _DATA_HEADER)
        _check_magic(self._data_file.path, data_head, dh, DATA_MAGIC, "data")
        if int(dh["alignment"]) != alignment:
            raise FormatError("data header alignment disagrees with the manifest",
                              path=self._data_file.path, offset=16, found=int(dh["alignment"]),
                              expected=alignment)

        n = entry.records
        self.alignment = alignment
        self.num_fields = num_fields
        self.view = self._data_file
        self.validated = n == 0
        # A flag per block of BLOCK records: its index entries passed validate() in
        # this open shard (an index file, like a data file, is never written in place).
        self._blocks = np.zeros((n + BLOCK - 1) >> BLOCK_SHIFT, bool)
        self._blocks_left = len(self._blocks)
        # A bit per record: every field of it matched its CRC32C in this open shard.
        # Data files are never written in place (FORMAT.md: a dataset is replaced whole,
        # by a rename), so the bytes are what the first check saw, read or mapped; and a
        # zero-copy view handed out is only ever vouched for at the moment of a check,
        # so checking the same record again on every read guards nothing more. A
        # reopened shard (an eviction, another process, a pickled dataset) starts with
        # no bits set.
        self.checked = bytearray((n + 7) // 8)
        # Until mapped: the records left to read with pread, and the index rows read.
        self._sparse_left = SPARSE_RECORDS
        self._rows: dict[int, tuple] = {}

    @property
    def data_path(self) -> Path:
        return Path(self._data_file.path)

    @property
    def index_path(self) -> Path:
        return Path(self._index_file.path)

    def map(self) -> None:
        """Map both files (through descriptors checked to be of the files opened, so the
        files mapped are the ones checked at open, whatever was renamed since), then
        close those descriptors: the maps hold their own. Done once; checks done
        before carry over.

        Raises:
            FormatError: a file cannot be mapped, or shrank since it was opened.
            OSError: only EMFILE/ENFILE (each map duplicates its descriptor); calling
                it again after closing other files resumes where it stopped.
        """
        if self.mapped:
            return
        if self._index_mm is None:
            self._index_mm = self._index_file.map()
        if self._data_mm is None:
            self._data_mm = self._data_file.map()
        self._index_file.close()
        self._data_file.close()
        n, cells = self.entry.records, self.entry.records * self.num_fields
        offsets_at, lengths_at, crcs_at = self._sections
        shape = (n, self.num_fields)
        self.offsets = np.frombuffer(self._index_mm, "<u8", cells, offsets_at).reshape(shape)
        self.lengths = np.frombuffer(self._index_mm, "<u8", cells, lengths_at).reshape(shape)
        self.crcs = np.frombuffer(self._index_mm, "<u4", cells, crcs_at).reshape(shape)
        self.data = np.frombuffer(self._data_mm, np.uint8)
        self.view = memoryview(self._data_mm)
        self.mapped = True
        self._rows = {}

    def release(self) -> None:
        """Close the descriptors of a shard not mapped until its next read (see
        :class:`_ShardFile`); a mapped shard's are its maps'."""
        if not self.mapped:
            self._index_file.release()
            self._data_file.release()

    def sparse(self, records) -> bool:
        """Whether to read ``records`` (an int or an array of record numbers; None: the
        whole shard) with ``pread`` rather than map first: not mapped, few of them
        (:data:`SPARSE_READ`), and within what is left of :data:`SPARSE_RECORDS`, from
        which they are then counted off."""
        if self.mapped or records is None:
            return False
        count = 1 if isinstance(records, (int, np.integer)) else len(records)
        if count > SPARSE_READ or count > self._sparse_left:
            return False
        self._sparse_left -= count
        return True

    def __len__(self) -> int:
        return self.entry.records

    def check_size(self) -> None:
        """Raise :class:`FormatError` if a mapped file has shrunk since it was opened
        (reading it would raise SIGBUS; see the module docstring). A shard not mapped
        needs no check: its reads come back short instead, and are refused."""
        if not self.mapped:
            return
        if self._data_mm.size() < self._data_size or self._index_mm.size() < self._index_size:
            for path, mm, expected in ((self.data_path, self._data_mm, self._data_size),
                                       (self.index_path, self._index_mm, self._index_size)):
                if mm.size() < expected:
                    raise FormatError(
                        "file was truncated while mapped (changed in place since the dataset "
                        "was opened); reading it would crash the process with SIGBUS",
                        path=path, found=f"{mm.size()} bytes", expected=f"{expected} bytes")

    # -- index entries and payloads, mapped or not ---------------------------------

    def row(self, record: int, crcs: bool = False) -> tuple[list, list, list | None]:
        """Record ``record``'s offsets, lengths and (with ``crcs``) stored CRC32Cs, one
        per field, as Python ints. Its block must have been validated."""
        if self.mapped:
            return (self.offsets[record].tolist(), self.lengths[record].tolist(),
                    self.crcs[record].tolist() if crcs else None)
        starts, lengths, stored = self._read_row(record)
        return starts, lengths, stored if crcs else None

    def entries(self, records: np.ndarray, field: int,
                crcs: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Offsets and lengths (uint64) and with ``crcs`` the stored CRC32Cs (uint32) of
        field ``field`` of ``records`` (record numbers, validated blocks)."""
        if self.mapped:
            return (self.offsets[records, field], self.lengths[records, field],
                    self.crcs[records, field] if crcs else None)
        rows = [self._read_row(r) for r in records.tolist()]
        return (np.array([r[0][field] for r in rows], np.uint64),
                np.array([r[1][field] for r in rows], np.uint64),
                np.array([r[2][field] for r in rows], np.uint32) if crcs else None)

    def _read_row(self, record: int) -> tuple[list, list, list]:
        """One index row, read with ``pread``, checked (:meth:`_check_entries`) and kept
        until mapped (at most :data:`SPARSE_RECORDS` rows: the reads before the map)."""
        row = self._rows.get(record)
        if row is None:
            f = self.num_fields
            cell = record * f
            lo = max(cell - 1, 0)  # with the entry before, which the first is compared with
            offsets_at, lengths_at, crcs_at = self._sections
            read = self._index_file.pread
            n = cell + f - lo
            starts = struct.unpack(f"<{n}Q", read(8 * n, offsets_at + 8 * lo))
            lengths = struct.unpack(f"<{n}Q", read(8 * n, lengths_at + 8 * lo))
            self._check_entries(lo, starts, lengths)
            row = (list(starts[cell - lo :]), list(lengths[cell - lo :]),
                   list(struct.unpack(f"<{f}I", read(4 * f, crcs_at + 4 * cell))))
            if len(self._rows) >= SPARSE_RECORDS:
                self._rows.clear()
            self._rows[record] = row
        return row

    def _check_entries(self, lo: int, starts: tuple, lengths: tuple) -> None:
        """:meth:`_check_span`'s rules for the few flat entries from ``lo`` (Python ints,
        one by one: a row and the entry before it cost less so than in numpy)."""
        size, alignment = self.entry.data_bytes, self.alignment
        end = HEADER_SIZE
        for k, (o, n) in enumerate(zip(starts, lengths, strict=True)):
            if o < end or o > size or n > size or o % alignment or o + n > size:
                self._refuse(lo + k, o, n)
            end = o + n

    def words(self, dtype: np.dtype) -> np.ndarray:
        """The data file (mapped) as 8-byte words of ``dtype`` (``<i8``/``<f8``), for
        gathering scalar fields, whose payloads are 8 bytes at 8-aligned offsets."""
        view = self._words.get(dtype.char)
        if view is None:
            view = self.data[: self.data.size - self.data.size % 8].view(dtype)
            self._words[dtype.char] = view
        return view

    def words_at(self, offsets: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """The 8-byte words of ``dtype`` at ``offsets`` (validated entries of scalar
        fields: 8-aligned, inside the file)."""
        if self.mapped:
            return self.words(dtype)[offsets >> 3]
        read = self._data_file.read
        return np.frombuffer(b"".join([read(8, o) for o in offsets.tolist()]), dtype)

    def validate(self, records=None) -> None:
        """Check index entries against the data file, in numpy; raise on the first bad one.

        Every entry MUST lie inside the data file after its header, aligned, and start
        at or after the end of the entry before it (FORMAT.md). With ``records`` (an
        int or an integer array of record numbers in this shard), only the blocks of
        :data:`BLOCK` records they lie in are checked, each once per open shard;
        without, the whole index. A record is sliced only after its block passed. A
        shard not mapped checks only the entries of ``records`` (and the entry before
        each), as it reads them (:meth:`_read_row`): a few records of a few hundred
        shards, where a block's check costs some 20 us in numpy.

        Raises:
            FormatError: an entry is out of bounds, misaligned or overlapping (names
                the index file, the record and the field).
        """
        if self.validated:
            return
        if not self.mapped and records is not None:  # each record's own entries
            for r in [records] if isinstance(records, (int, np.integer)) else records.tolist():
                self._read_row(int(r))
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
        width = BLOCK * self.num_fields
        first = todo[0]
        for a, b in zip(todo, [*todo[1:], None]):  # noqa: B905
            if b != a + 1:
                self._check_span(first * width, (a + 1) * width)
                first = b
        done[todo] = True
        self._blocks_left -= len(todo)
        if self._blocks_left == 0:
            self.validated = True

    def _cells(self, lo: int, hi: int | None) -> tuple[np.ndarray, np.ndarray]:
        """The flat index entries ``lo:hi`` (``hi`` None or past the end: to the end):
        offsets and lengths, from the map or read with ``pread``."""
        if self.mapped:
            return self.offsets.reshape(-1)[lo:hi], self.lengths.reshape(-1)[lo:hi]
        cells = self.entry.records * self.num_fields
        n = max((cells if hi is None else min(hi, cells)) - lo, 0)
        offsets_at, lengths_at, _ = self._sections
        read = self._index_file.pread
        return (np.frombuffer(read(8 * n, offsets_at + 8 * lo), "<u8"),
                np.frombuffer(read(8 * n, lengths_at + 8 * lo), "<u8"))

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
        off, length = self._cells(lo, hi)
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
        first = int(np.flatnonzero(bad)[0])
        self._refuse(lo + first, int(off[first]), int(length[first]))

    def _out_of_bounds(self, off: np.ndarray, length: np.ndarray) -> np.ndarray:
        size = self.entry.data_bytes
        bad = (off < HEADER_SIZE) | (off > size) | (length > size) | (off % self.alignment != 0)
        if not bad.any():
            bad = off + length > size  # no overflow: both terms are <= size
        return bad

    def _refuse(self, cell: int, off: int, length: int) -> None:
        record, field = divmod(cell, self.num_fields)
        raise FormatError(
            f"index entry for field {field} is out of bounds, misaligned or overlapping",
            path=self.index_path, record=record,
            found=f"offset {off} length {length}",
            expected=f"aligned to {self.alignment}, after the previous payload, "
                     f"within {self.entry.data_bytes} bytes",
        )

    def payload(self, record: int, field: int, check: bool = False) -> memoryview:
        """The stored bytes of one field of one record (zero-copy once mapped)."""
        if not self.validated and not self._blocks[record >> BLOCK_SHIFT]:
            self.validate(record)
        offsets, lengths, _ = self.row(record)
        start = offsets[field]
        view = self.view[start : start + lengths[field]]
        if check:
            self.check(record, field, view)
        return view

    def check(self, record: int, field: int, view) -> None:
        """Raise :class:`CorruptRecordError` unless ``view`` matches its stored CRC32C."""
        offsets, _, crcs = self.row(record, crcs=True)
        expected = crcs[field]
        found = crc32c(view)
        if found != expected:
            raise CorruptRecordError(
                f"field {field} checksum mismatch",
                path=self.data_path, record=record, offset=offsets[field],
                found=f"0x{found:08x}", expected=f"0x{expected:08x}",
            )

    def close(self) -> None:
        """Release the files (maps: deferred to garbage collection while views are alive)."""
        self._index_file.close()
        self._data_file.close()
        self.offsets = self.lengths = self.crcs = self.data = None
        self._words = {}
        if isinstance(self.view, memoryview):
            with contextlib.suppress(BufferError):
                self.view.release()
        for mm in (self._index_mm, self._data_mm):
            if mm is None:
                continue
            try:
                mm.close()
            except BufferError:
                pass  # a caller still holds a view; the map (and its descriptor) go when it does
