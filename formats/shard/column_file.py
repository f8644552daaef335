"""One column file of the node's cache: a checksummed array that cannot fault.

Layout (little-endian, :data:`HEADER`, 64 bytes, then the body)::

    magic  8 bytes   b"SPCOL\\x00\\x01\\x00" (the last two: version 1.0)
    crc    u32       CRC32C of the body's chunk checksums (below)
    ndim   u32       1..4
    body   u64       the body's bytes (= file size - 64)
    dtype  8 bytes   numpy's dtype string, e.g. b"<i8", NUL-padded
    shape  u64 x 4   the dims, unused ones 0
    body             the C-ordered values

The body is checksummed in chunks of :data:`CHUNK` bytes (CRC32C each, ``formats.checksum``)
and the header holds the CRC32C of those chunk checksums (u32 little-endian): one pass
over the body, like a whole-body checksum, that leaves each chunk's checksum behind,
so a caller can later re-check the few chunks a lookup touched (:func:`intact`).

A file is written by :func:`reserve` (its blocks allocated with ``posix_fallocate``
before it is mapped: a mapping over unallocated blocks of a full disk faults with
SIGBUS on the first write, where an allocation fails with ``ENOSPC``) and
:func:`seal` (the header, once the body is written); the caller renames it into place.
No fsync: a torn file after a power loss fails its checksum and is rebuilt.

:func:`load` maps a file read-only and checks it, **once per process per file**: the
checksum reads the whole body through the map (chunks of 64 KiB, no copy), about 1 ms
per 8 MB from the page cache with the page faults (a 10^6-key index, 16 MB: 2-3 ms,
where mapping it unchecked took under 1 ms), so a node's second process pays that
instead of the build. At 10^9 records (16 GB of key index, some seconds) it is still
cheaper than what a damaged index costs: keys reported missing.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import numpy as np

from ..checksum import crc32c
from ..errors import CacheError

__all__ = ["CHUNK", "HEADER", "Bad", "forget", "intact", "load", "reserve", "seal"]

HEADER = np.dtype([("magic", "S8"), ("crc", "<u4"), ("ndim", "<u4"), ("body", "<u8"),
                   ("dtype", "S8"), ("shape", "<u8", (4,))])
assert HEADER.itemsize == 64
MAGIC = b"SPCOL\x00\x01\x00"
CHUNK = 1 << 16  # 64 KiB: a miss re-checks a few dozen of them (see intact)

# Files this process has checked: (path, inode, size, mtime) -> their chunk checksums.
_checked: dict[tuple, np.ndarray] = {}


class Bad(Exception):
    """Private: a column file is there but unusable (its reason is the message)."""


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _too_large(path: Path, nbytes: int, exc: BaseException) -> CacheError:
    return CacheError(f"cannot map a column of {nbytes:,} bytes ({exc}): too large for this "
                      "process's address space or memory (raise its limit, ulimit -v, or use "
                      "fewer records)", path=path)


def reserve(path: Path, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A new file ``path`` (which must not exist) with all its blocks allocated, its
    body mapped writable (a plain array when the body is empty).

    Raises:
        OSError: the filesystem refused (``ENOSPC``, ``EROFS``, ``EACCES``, ...); the
            file is then deleted.
        CacheError: the body is too large to map (``ENOMEM``).
    """
    dtype = np.dtype(dtype)
    body = _nbytes(shape, dtype)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            _allocate(fd, HEADER.itemsize + body)
        finally:
            os.close(fd)
        if body == 0:
            return np.zeros(shape, dtype)
        try:  # by name: the map's filename says where a build's scratch goes
            return np.memmap(path, dtype, "r+", offset=HEADER.itemsize, shape=shape)
        except (OSError, MemoryError) as exc:
            if isinstance(exc, OSError) and exc.errno != errno.ENOMEM:
                raise
            raise _too_large(path, body, exc) from None
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _allocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        zeros = bytes(min(size, CHUNK))  # no fallocate here: zeros allocate as well
        at = 0
        while at < size:
            at += os.pwrite(fd, zeros[:size - at], at)


def _chunk_crcs(body: np.ndarray) -> np.ndarray:
    raw = memoryview(np.ascontiguousarray(body).reshape(-1).view(np.uint8))
    return np.fromiter((crc32c(raw[a:a + CHUNK]) for a in range(0, len(raw), CHUNK)),
                       np.uint32)


def seal(path: Path, body: np.ndarray) -> np.ndarray:
    """Write ``path``'s header for its finished ``body`` (what :func:`reserve` gave);
    returns the body's chunk checksums, for :func:`remember`."""
    if isinstance(body, np.memmap):
        body.flush()
    crcs = _chunk_crcs(body)
    head = np.zeros((), HEADER)
    head["magic"], head["ndim"], head["body"] = MAGIC, body.ndim, body.nbytes
    head["crc"] = crc32c(crcs.astype("<u4").tobytes())
    head["dtype"] = body.dtype.str.encode()
    head["shape"][:body.ndim] = body.shape
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, head.tobytes(), 0)
    finally:
        os.close(fd)
    return crcs


def remember(path: Path, crcs: np.ndarray) -> None:
    """Count the file just sealed (and renamed to ``path``: a rename keeps its inode and
    mtime) as checked in this process: the builder's :func:`load` then maps it without
    checksumming the pages it has just checksummed. Other processes check it whole."""
    st = os.stat(path)
    _checked[(str(path), st.st_ino, st.st_size, st.st_mtime_ns)] = crcs


def load(path: Path, shape: tuple[int, ...], dtype) -> np.ndarray | None:
    """``path`` mapped read-only, checked (see the module): None when there is no file.

    Raises:
        Bad: the file is not the column asked for, or its body fails its checksum.
        CacheError: the body is too large to map (``ENOMEM``).
    """
    dtype = np.dtype(dtype)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise Bad(f"cannot open it ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Bad("not a regular file")
        raw = os.pread(fd, HEADER.itemsize, 0)
        if len(raw) < HEADER.itemsize:
            raise Bad(f"{st.st_size} bytes, shorter than its header")
        head = np.frombuffer(raw, HEADER)[0]
        body = _nbytes(shape, dtype)
        ndim = int(head["ndim"])
        if raw[:len(MAGIC)] != MAGIC:  # (numpy strips an S8 field's trailing NULs)
            raise Bad("not a column file (magic)")
        if (ndim != len(shape) or tuple(int(d) for d in head["shape"][:ndim]) != tuple(shape)
                or bytes(head["dtype"]).rstrip(b"\0") != dtype.str.encode()):
            raise Bad("another column's shape or type")
        if int(head["body"]) != body or st.st_size != HEADER.itemsize + body:
            raise Bad(f"{st.st_size} bytes, expected {HEADER.itemsize + body}")
        if body == 0:
            arr = np.zeros(shape, dtype)
            arr.flags.writeable = False
            return arr
        with os.fdopen(os.dup(fd), "rb") as f:
            try:
                arr = np.memmap(f, dtype, "r", offset=HEADER.itemsize, shape=shape)
            except (OSError, MemoryError) as exc:
                if isinstance(exc, OSError) and exc.errno != errno.ENOMEM:
                    raise Bad(f"cannot map it ({exc})") from None
                raise _too_large(path, body, exc) from None
        seen = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
        crcs = _checked.get(seen)
        if crcs is None:
            crcs = _chunk_crcs(arr)
            if crc32c(crcs.astype("<u4").tobytes()) != int(head["crc"]):
                raise Bad("its body fails its checksum")
            _checked[seen] = crcs
        arr._chunk_crcs = crcs  # for intact()
        return arr
    finally:
        os.close(fd)


def intact(arr: np.ndarray, *spans: tuple[int, int]) -> bool:
    """Whether the rows ``lo:hi`` of each span (all rows without one) of the column
    ``arr`` still hold what :func:`load` checked: the chunks they lie in are
    checksummed again. Always True for an array not loaded from a file (a private one)."""
    crcs = getattr(arr, "_chunk_crcs", None)
    if crcs is None or arr.size == 0:
        return True
    n = len(arr)
    row = arr.nbytes // n
    chunks: set[int] = set()
    for lo, hi in spans or ((0, n),):
        lo, hi = max(lo, 0), min(hi, n)
        if hi > lo:
            chunks.update(range(lo * row // CHUNK, (hi * row - 1) // CHUNK + 1))
    raw = memoryview(arr.reshape(-1).view(np.uint8))
    return all(crc32c(raw[c * CHUNK:(c + 1) * CHUNK]) == int(crcs[c]) for c in sorted(chunks))


def forget(path: Path) -> None:
    """Drop this process's record of having checked ``path`` (it is to be rebuilt)."""
    for seen in [k for k in _checked if k[0] == str(path)]:
        del _checked[seen]
