"""The byte layout of shard files, declared once (FORMAT.md, "Files").

Every multi-byte integer is little-endian. Both file kinds start with a 64-byte
header whose magic and major version sit at fixed positions, so any file can be
identified before anything else in it is trusted.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "DATA_HEADER",
    "DATA_MAGIC",
    "DEFAULT_ALIGNMENT",
    "FORMAT_NAME",
    "HEADER_SIZE",
    "INDEX_HEADER",
    "INDEX_MAGIC",
    "MAJOR",
    "MINOR",
    "MIN_ALIGNMENT",
    "align_up",
    "index_sections",
]

FORMAT_NAME = "shardpack"
MAJOR = 1
MINOR = 0

DATA_MAGIC = b"SHPKREC\x00"
INDEX_MAGIC = b"SHPKIDX\x00"
HEADER_SIZE = 64

# 64 bytes: a cache line, the widest SIMD register, and Arrow's recommended buffer
# alignment, so array payloads feed numpy/cupy/DMA without a copy. 8 is the floor:
# it is the largest alignment numpy asks of any fixed-size dtype, and scalar fields
# are then gathered for a whole batch with one int64/float64 view of the file.
DEFAULT_ALIGNMENT = 64
MIN_ALIGNMENT = 8
MAX_ALIGNMENT = 4096

DATA_HEADER = np.dtype(
    [
        ("magic", "S8"),
        ("major", "<u2"),
        ("minor", "<u2"),
        ("header_size", "<u4"),
        ("alignment", "<u4"),
        ("reserved", "V44"),
    ]
)

INDEX_HEADER = np.dtype(
    [
        ("magic", "S8"),
        ("major", "<u2"),
        ("minor", "<u2"),
        ("header_size", "<u4"),
        ("record_count", "<u8"),
        ("num_fields", "<u4"),
        ("alignment", "<u4"),
        ("data_size", "<u8"),
        ("data_crc32c", "<u4"),
        ("header_crc32c", "<u4"),
        ("reserved", "V16"),
    ]
)
# header_crc32c covers the bytes before it.
INDEX_HEADER_CRC_SPAN = INDEX_HEADER.fields["header_crc32c"][1]

assert DATA_HEADER.itemsize == HEADER_SIZE and INDEX_HEADER.itemsize == HEADER_SIZE

OFFSET_DTYPE = np.dtype("<u8")
LENGTH_DTYPE = np.dtype("<u8")
CRC_DTYPE = np.dtype("<u4")


def align_up(n: int, alignment: int) -> int:
    """The smallest multiple of ``alignment`` (a power of two) that is >= n."""
    return (n + alignment - 1) & ~(alignment - 1)


def index_sections(record_count: int, num_fields: int) -> tuple[int, int, int, int]:
    """Byte offsets of the offsets, lengths and crcs tables, and the index file size.

    Each table is ``record_count x num_fields`` row-major and starts on a 64-byte
    boundary, so the whole index is a fixed function of its two counts.
    """
    cells = record_count * num_fields
    offsets_at = HEADER_SIZE
    lengths_at = align_up(offsets_at + cells * OFFSET_DTYPE.itemsize, 64)
    crcs_at = align_up(lengths_at + cells * LENGTH_DTYPE.itemsize, 64)
    size = crcs_at + cells * CRC_DTYPE.itemsize
    return offsets_at, lengths_at, crcs_at, size
