"""The header of an ``.npy`` file, read with numpy's own parser and never unpickled."""

from __future__ import annotations

import io

import numpy as np

__all__ = ["read_npy_header"]


def read_npy_header(data: bytes) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """``(dtype, shape, fortran order, data offset)`` of an ``.npy`` file's first bytes.

    Raises:
        ValueError: not an ``.npy`` header (of version 1, 2 or 3), or a dtype that
            holds Python objects (reading those would mean unpickling).
    """
    buf = io.BytesIO(data)
    fmt = np.lib.format
    try:
        version = fmt.read_magic(buf)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(buf)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = fmt.read_array_header_2_0(buf)
        else:
            raise ValueError(f"npy version {version} is not read")
    except (ValueError, EOFError, SyntaxError, TypeError) as exc:
        raise ValueError(f"not a valid .npy header ({exc})") from None
    if dtype.hasobject:
        raise ValueError(f".npy of dtype {dtype} holds Python objects (never unpickled)")
    return dtype, tuple(shape), fortran, buf.tell()
