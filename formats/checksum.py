"""CRC32C (Castagnoli), the checksum of every record field, shard file and TFRecord frame.

The ``crc32c`` package was chosen by measurement: 27 GB/s on 100 KB buffers on
the reference machine against 13 GB/s for ``google-crc32c``, and it accepts any
buffer (memoryview slices of an mmap) without a copy.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from crc32c import crc32c as _crc32c

__all__ = ["crc32c", "crc32c_many", "crc32c_words", "fd_crc32c", "file_crc32c", "format_crc",
           "parse_crc"]

_CHUNK = 8 << 20


def crc32c(data, value: int = 0) -> int:
    """CRC32C of a bytes-like object, continuing from ``value``."""
    return _crc32c(data, value)


def crc32c_many(views) -> np.ndarray:
    """CRC32C of each buffer in ``views``: one pass in C per buffer, no other Python work.

    Not spread over threads: the ``crc32c`` package releases the GIL on large
    buffers, but on the reference machine a checked raw read is bound by memory
    bandwidth (it runs at the speed of memcpy), and two threads measured no faster.
    """
    return np.fromiter(map(_crc32c, views), np.uint32, len(views))


def _table() -> np.ndarray:
    poly = np.uint32(0x82F63B78)  # CRC32C, reflected
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ poly, t >> 1).astype(np.uint32)
    return t


_TABLE = _table()


def crc32c_words(words: np.ndarray) -> np.ndarray:
    """CRC32C of each 8-byte little-endian word of ``words`` (an int64/float64/uint64 array).

    The checksum of many 8-byte scalar payloads at once, in numpy: eight table
    steps over the whole array, instead of one call per record.
    """
    b = np.ascontiguousarray(words).view("<u8").view(np.uint8).reshape(-1, 8)
    crc = np.full(len(b), 0xFFFFFFFF, np.uint32)
    for i in range(8):
        crc = _TABLE[(crc ^ b[:, i]) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


def file_crc32c(path: str | Path, progress=None) -> int:
    """CRC32C of a whole file, read in 8 MiB chunks.

    Args:
        path: the file.
        progress: optional callable receiving the number of bytes of each chunk.
    """
    with open(path, "rb", buffering=0) as f:
        return fd_crc32c(f.fileno(), progress)


def fd_crc32c(fd: int, progress=None) -> int:
    """CRC32C of what is left to read from the open descriptor ``fd`` (see :func:`file_crc32c`)."""
    value = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    while n := os.readv(fd, [buf]):
        value = _crc32c(view[:n], value)
        if progress is not None:
            progress(n)
    return value


def format_crc(value: int) -> str:
    """The manifest's spelling of a checksum: 8 lowercase hex digits."""
    return f"{value:08x}"


def parse_crc(text: object) -> int | None:
    """Inverse of :func:`format_crc`; None when ``text`` is not 8 hex digits."""
    if not isinstance(text, str) or len(text) != 8:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None

