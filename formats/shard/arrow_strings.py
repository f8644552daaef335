"""An Arrow string column as numpy arrays, with no Python object per string.

Shard names (the shard table) and record keys (the key index) are checked and
hashed over their bytes in numpy. (pyarrow.compute would do some of it, but it
imports pandas where pandas is installed: half a second.)
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["string_buffers"]


def string_buffers(strings: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int64 offsets, UTF-8 bytes, validity) of a string column: views of its
    buffers, copied only where chunks are combined or 32-bit offsets widened."""
    if isinstance(strings, pa.ChunkedArray):
        strings = (strings.combine_chunks() if strings.num_chunks
                   else pa.array([], pa.large_string()))
    strings = strings.cast(pa.large_string())
    n = len(strings)
    _, offsets, data = strings.buffers()
    off = (np.frombuffer(offsets, np.int64)[strings.offset:strings.offset + n + 1] if n
           else np.zeros(1, np.int64))
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    valid = (strings.is_valid().to_numpy(zero_copy_only=False) if strings.null_count
             else np.ones(n, bool))
    return off, raw, valid
