"""A run of records given column by column, encoded with per-column (not per-record)
Python work: the writer's path for callers that make many small records (a function's
samples, token documents), where per-record overhead would cost more than the data.

Every column encodes to exactly the payloads :func:`formats.fields.encode_value`
gives value by value (tests compare the files byte for byte); a value that does not
fit raises the same :class:`~formats.errors.SchemaError`, naming the record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from crc32c import crc32c as _crc32c

from ..checksum import crc32c_words
from ..errors import SchemaError
from ..fields import BYTES_TYPES, Field, encode_value

__all__ = ["EncodedColumn", "column_of", "encode_column"]


class EncodedColumn(NamedTuple):
    """One field's payloads for a run of records.

    A payload is ``heads[i] + bodies[i]`` (``heads`` is None when every payload is
    its body alone): an ndarray's shape header and its data are never joined here
    (the shard writer copies every piece of a run once, into its data file's
    buffer). A body is any C-contiguous buffer (bytes, an ndarray); ``lengths``
    and ``crcs`` are the payloads', in bytes.
    """

    heads: list | None
    bodies: list
    lengths: np.ndarray  # int64
    crcs: np.ndarray  # uint32


def encode_column(f: Field, values: Sequence[Any], first: int = 0) -> EncodedColumn:
    """The payloads of ``values`` for field ``f`` (uncompressed).

    Bodies may be views of the caller's buffers (bytes, contiguous arrays): the
    caller writes them before handing control back to whoever owns the values.

    Args:
        first: the number of the first value's record, for error messages.

    Raises:
        SchemaError: a value of the wrong type (naming its record).
    """
    t = f.type
    if t in ("int", "float"):
        return _scalars(f, values, first)
    if t == "ndarray":
        column = _arrays(f, values)
        if column is not None:
            return column
    elif t == "str" and all(type(v) is str for v in values):
        try:
            return column_of(list(map(str.encode, values)))  # UTF-8
        except UnicodeEncodeError:
            pass  # encode_value names the record below
    elif t in BYTES_TYPES and all(type(v) is bytes for v in values):
        return column_of(list(values))
    return _one_by_one(f, values, first)


def _one_by_one(f: Field, values: Sequence[Any], first: int) -> EncodedColumn:
    """The column of values no fast path takes: encode_value on each (casting, or
    naming the record that does not fit)."""
    return column_of([_one(f, v, first + i) for i, v in enumerate(values)])


def _one(f: Field, value: Any, record: int):
    try:
        return encode_value(f, value)
    except SchemaError as exc:
        raise SchemaError(exc.message, record=record, found=exc.found,
                          expected=exc.expected) from None


def column_of(bodies: list) -> EncodedColumn:
    """The column of payloads ``bodies`` (bytes-like, each a whole payload)."""
    n = len(bodies)
    return EncodedColumn(None, bodies, np.fromiter(map(len, bodies), np.int64, n),
                  np.fromiter(map(_crc32c, bodies), np.uint32, n))


def _scalars(f: Field, values: Sequence[Any], first: int) -> EncodedColumn:
    exact = int if f.type == "int" else float
    if not all(type(v) is exact for v in values):  # numpy scalars, bools, ints as floats
        return _one_by_one(f, values, first)
    try:
        words = np.array(values, "<i8" if exact is int else "<f8")
    except OverflowError:  # an int beyond int64: encode_value names it
        return _one_by_one(f, values, first)
    view = memoryview(words.tobytes())
    n = len(values)
    return EncodedColumn(None, [view[i:i + 8] for i in range(0, 8 * n, 8)], np.full(n, 8, np.int64),
                  crc32c_words(words))


def _arrays(f: Field, values: Sequence[Any]) -> EncodedColumn | None:
    """The ndarray column when every value is a C-contiguous array of the schema's
    dtype and shape (None otherwise: values are then encoded one by one, which casts
    and names the record that does not fit). The arrays are their own bodies."""
    dtype = np.dtype(f.dtype)
    ndim = len(f.shape)
    if not all(type(v) is np.ndarray and v.dtype == dtype and v.ndim == ndim for v in values):
        return None
    n = len(values)
    if ndim == 1:  # a 1-D array's length is its shape
        shapes = np.fromiter(map(len, values), np.int64, n).reshape(n, 1)
    else:
        shapes = np.array([v.shape for v in values], np.int64).reshape(n, ndim)
    fixed = [(j, d) for j, d in enumerate(f.shape) if d is not None]
    if any((shapes[:, j] != d).any() for j, d in fixed):
        return None
    bodies = list(values)
    sizes = np.fromiter((v.nbytes for v in values), np.int64, n)
    try:
        if f.fixed_shape:
            return EncodedColumn(None, bodies, sizes, np.fromiter(map(_crc32c, bodies), np.uint32, n))
        heads_arr = np.empty((n, 1 + ndim), "<u8")
        heads_arr[:, 0] = ndim
        heads_arr[:, 1:] = shapes
        width = 8 * (1 + ndim)
        packed = memoryview(heads_arr.tobytes())
        heads = [packed[i:i + width] for i in range(0, n * width, width)]
        crcs = np.fromiter(map(_crc32c, bodies, map(_crc32c, heads)), np.uint32, n)
    except ValueError:  # an array that is not C-contiguous
        return None
    return EncodedColumn(heads, bodies, sizes + width, crcs)
