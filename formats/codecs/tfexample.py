"""A minimal protobuf wire-format codec for ``tf.train.Example`` (no TensorFlow, no protobuf).

The messages (tensorflow/core/example/{example,feature}.proto)::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }      // entries: key = 1, value = 2
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                             Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

The decoder accepts packed and unpacked repeated scalars (proto2 writers emit
either), skips unknown fields, and checks every length against the buffer; the
encoder writes packed lists and sorts feature names so its bytes are deterministic.
A decoded feature is ``bytes``-list (list of bytes), ``np.int64`` or ``np.float32`` array.

Decoding is bounded by more than the record's length: packed lists are decoded
with numpy (a record of millions of numbers takes milliseconds, not minutes, and
no Python object per number), and an Example holds at most ``_MAX_FEATURES``
features, a feature at most ``_MAX_NUMBERS`` numbers (``_MAX_STRINGS`` of them
unpacked, each a Python step) or ``_MAX_STRINGS`` byte strings.

Speed: every Example a writer emits has one layout (entries of exactly a name then
a feature, a feature of exactly one list, number lists packed), and
:func:`decode_example` first tries a parser of that layout alone, which reads the
one-byte tags as constants and each varint inline; anything else (unknown
fields, unpacked lists, any malformed byte) sends the record to the general
parser, which decides, so both accept and refuse exactly the same bytes. The
encoder joins pieces whose lengths it knows, and :func:`encode_example_parts`
leaves the byte strings uncopied (a frame is written from the pieces). Measured
in BENCHMARKS.md ("Conversions").
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np

from ..errors import ExampleError

__all__ = ["decode_example", "encode_example", "encode_example_parts"]

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_MAX_FEATURES = 1 << 16
_MAX_NUMBERS = 1 << 25  # 256 MiB as int64
_MAX_STRINGS = 1 << 20
_VARINT_CHUNK = 1 << 20  # numbers decoded per numpy step: bounds the temporaries


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise ExampleError(f"varint runs past the end at byte {pos}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ExampleError(f"varint longer than 10 bytes at byte {pos}")


def _fields(buf: memoryview, pos: int, end: int):
    """Yield (field number, wire type, value or (start, end) of a LEN payload)."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise ExampleError(f"field number 0 at byte {pos}")
        if wt == _VARINT:
            value, pos = _varint(buf, pos, end)
            yield num, wt, value
        elif wt == _LEN:
            n, pos = _varint(buf, pos, end)
            if n > end - pos:
                raise ExampleError(f"length {n} at byte {pos} runs past the end of its message")
            yield num, wt, (pos, pos + n)
            pos += n
        elif wt in (_I64, _I32):
            n = 8 if wt == _I64 else 4
            if n > end - pos:
                raise ExampleError(f"fixed field at byte {pos} runs past the end")
            yield num, wt, (pos, pos + n)
            pos += n
        else:
            raise ExampleError(f"unsupported wire type {wt} at byte {pos}")


def _signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _packed_varints(buf: memoryview, start: int, end: int) -> np.ndarray:
    """The int64 values of a packed varint run, decoded with numpy, a chunk at a time
    (temporaries stay a few times ``_VARINT_CHUNK`` bytes, whatever the run's length)."""
    data = np.frombuffer(buf[start:end], np.uint8)
    if not len(data):
        return np.empty(0, np.int64)
    if data[-1] >= 0x80:
        raise ExampleError(f"packed varint runs past the end of its list at byte {end}")
    count = int(np.count_nonzero(data < 0x80))
    if count > _MAX_NUMBERS:
        raise ExampleError(f"a feature holds {count} numbers, more than {_MAX_NUMBERS}")
    if count == len(data):  # every value in one byte: the common small labels
        return data.astype(np.int64)
    out = np.empty(count, np.uint64)
    pos = k = 0
    while pos < len(data):
        chunk = data[pos:pos + _VARINT_CHUNK]
        ends = np.flatnonzero(chunk < 0x80)
        if not len(ends):
            raise ExampleError(f"varint longer than 10 bytes at byte {start + pos}")
        chunk = chunk[:ends[-1] + 1]  # whole varints only; the rest starts the next chunk
        starts = np.empty_like(ends)
        starts[0], starts[1:] = 0, ends[:-1] + 1
        lengths = ends - starts + 1
        if lengths.max() > 10:
            raise ExampleError(f"varint longer than 10 bytes in the list at byte {start}")
        shifts = (np.arange(len(chunk)) - np.repeat(starts, lengths)).astype(np.uint64) * 7
        # Bits past 64 fall off, as protobuf's uint64 keeps them.
        payload = (chunk & 0x7F).astype(np.uint64) << shifts
        out[k:k + len(ends)] = np.bitwise_or.reduceat(payload, starts)
        k += len(ends)
        pos += len(chunk)
    return out.view(np.int64)


def _decode_feature(buf: memoryview, start: int, end: int):
    kind = None
    parts: list = []  # bytes, or arrays (lists, unpacked) of numbers
    count = unpacked = 0
    for num, wt, val in _fields(buf, start, end):
        if num not in (1, 2, 3):
            continue
        if wt != _LEN:
            raise ExampleError(f"Feature field {num} has wire type {wt}, expected a message")
        if kind is not None and kind != num:
            parts, count, unpacked = [], 0, 0  # protobuf: the last member of a oneof wins
        kind = num
        s, e = val
        for vn, vwt, v in _fields(buf, s, e):
            if vn != 1:
                continue
            if num == 1:
                if vwt != _LEN:
                    raise ExampleError("BytesList value is not length-delimited")
                parts.append(bytes(buf[v[0]:v[1]]))
                count += 1
            elif num == 2:
                if vwt == _LEN:  # packed
                    if (v[1] - v[0]) % 4:
                        raise ExampleError("packed FloatList length is not a multiple of 4")
                    part = np.frombuffer(buf[v[0]:v[1]], "<f4")
                elif vwt == _I32:
                    part = np.frombuffer(buf[v[0]:v[1]], "<f4")
                    unpacked += 1
                else:
                    raise ExampleError(f"FloatList value has wire type {vwt}")
                parts.append(part)
                count += len(part)
            else:
                if vwt == _LEN:  # packed
                    part = _packed_varints(buf, *v)
                elif vwt == _VARINT:
                    part = [_signed64(v & 0xFFFFFFFFFFFFFFFF)]
                    unpacked += 1
                else:
                    raise ExampleError(f"Int64List value has wire type {vwt}")
                parts.append(part)
                count += len(part)
            limit = _MAX_STRINGS if num == 1 else _MAX_NUMBERS
            if count > limit or unpacked > _MAX_STRINGS:
                raise ExampleError(f"a feature holds more than {limit} values")
    if kind in (2, 3):
        dtype = np.float32 if kind == 2 else np.int64
        return np.concatenate([np.asarray(p, dtype) for p in parts]) if parts else np.empty(
            0, dtype)
    return parts  # bytes list (also a Feature with no kind set)


def decode_example(data) -> dict[str, list[bytes] | np.ndarray]:
    """Feature name -> value of one serialized Example (``data``: any buffer).

    Raises:
        ExampleError: malformed wire format (lengths past the end, bad wire types,
            non-UTF-8 feature names).
    """
    buf = memoryview(data).cast("B")
    fast = _decode_common(data if type(data) is bytes else buf, buf)
    return fast if fast is not None else _decode_general(buf)


def _decode_general(buf: memoryview) -> dict[str, list[bytes] | np.ndarray]:
    """Any Example protobuf accepts (see the module docstring), or ExampleError."""
    out: dict = {}
    entries = 0
    for num, wt, val in _fields(buf, 0, len(buf)):
        if num != 1:
            continue
        if wt != _LEN:
            raise ExampleError("Example.features is not a message")
        for fnum, fwt, fval in _fields(buf, *val):
            if fnum != 1:
                continue
            if fwt != _LEN:
                raise ExampleError("Features.feature entry is not a message")
            entries += 1
            if entries > _MAX_FEATURES:
                raise ExampleError(f"more than {_MAX_FEATURES} features in one Example")
            name, feature = "", []
            for enum, ewt, ev in _fields(buf, *fval):
                if ewt != _LEN:
                    continue
                if enum == 1:
                    try:
                        name = str(buf[ev[0]:ev[1]], "utf-8")
                    except UnicodeDecodeError:
                        raise ExampleError("feature name is not UTF-8") from None
                elif enum == 2:
                    feature = _decode_feature(buf, *ev)
            out[name] = feature
    return out


def _decode_common(b, buf: memoryview) -> dict | None:
    """The Example of the common layout (module docstring), or None for anything
    else, malformed bytes included: :func:`_decode_general` then decides.

    ``b`` is ``buf`` or the bytes under it (indexing bytes is the faster); each
    varint's first byte is read inline, longer ones through :func:`_varint`.
    """
    end = len(buf)
    out: dict = {}
    entries = pos = 0
    try:
        while pos < end:
            if b[pos] != 0x0A:  # Example.features
                return None
            n = b[pos + 1]
            pos += 2
            if n >= 0x80:
                n, pos = _varint(buf, pos - 1, end)
            fend = pos + n
            if fend > end:
                return None
            while pos < fend:
                if b[pos] != 0x0A:  # Features.feature, one map entry
                    return None
                n = b[pos + 1]
                pos += 2
                if n >= 0x80:
                    n, pos = _varint(buf, pos - 1, fend)
                eend = pos + n
                if eend > fend or pos >= eend or b[pos] != 0x0A:  # the entry's key
                    return None
                n = b[pos + 1]
                pos += 2
                if n >= 0x80:
                    n, pos = _varint(buf, pos - 1, eend)
                if pos + n >= eend or b[pos + n] != 0x12:  # then its value, to the end
                    return None
                name = str(buf[pos:pos + n], "utf-8")
                pos += n
                n = b[pos + 1]
                pos += 2
                if n >= 0x80:
                    n, pos = _varint(buf, pos - 1, eend)
                if pos + n != eend or pos >= eend:
                    return None
                kind = b[pos]  # one list, to the end of the Feature
                if kind not in (0x0A, 0x12, 0x1A):
                    return None
                n = b[pos + 1]
                pos += 2
                if n >= 0x80:
                    n, pos = _varint(buf, pos - 1, eend)
                if pos + n != eend:
                    return None
                if kind == 0x0A:  # BytesList
                    value: list | np.ndarray = []
                    while pos < eend:
                        if b[pos] != 0x0A or len(value) >= _MAX_STRINGS:
                            return None
                        n = b[pos + 1]
                        pos += 2
                        if n >= 0x80:
                            n, pos = _varint(buf, pos - 1, eend)
                        if pos + n > eend:
                            return None
                        value.append(bytes(buf[pos:pos + n]))
                        pos += n
                elif pos == eend:  # an empty number list
                    value = np.empty(0, np.int64 if kind == 0x1A else np.float32)
                elif b[pos] != 0x0A:  # not one packed run
                    return None
                else:
                    n = b[pos + 1]
                    pos += 2
                    if n >= 0x80:
                        n, pos = _varint(buf, pos - 1, eend)
                    if pos + n != eend:
                        return None
                    if kind == 0x1A:
                        value = np.array([b[pos]], np.int64) if n == 1 and b[pos] < 0x80 \
                            else _packed_varints(buf, pos, eend)
                    elif n % 4 or n // 4 > _MAX_NUMBERS:
                        return None
                    else:
                        value = np.frombuffer(buf[pos:eend], "<f4").astype(np.float32)
                    pos = eend
                entries += 1
                if entries > _MAX_FEATURES:
                    return None
                out[name] = value
    except (ExampleError, IndexError, UnicodeDecodeError):
        return None
    return out


def _put_varint(out: bytearray, v: int) -> None:
    v &= (1 << 64) - 1
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _put_len(out: bytearray, num: int, payload) -> None:
    _put_varint(out, (num << 3) | _LEN)
    _put_varint(out, len(payload))
    out += payload


#: Byte strings at least this long stay pieces of their own (never copied); shorter
#: runs of pieces are joined.
_OWN_PIECE = 2048
_ONE_BYTE = [bytes((i,)) for i in range(0x80)]


def _head(num: int, n: int) -> bytes:
    """The key of length-delimited field ``num`` (1 to 15) and the length ``n``."""
    if n < 0x80:
        return _ONE_BYTE[num << 3 | _LEN] + _ONE_BYTE[n]
    out = bytearray(_ONE_BYTE[num << 3 | _LEN])
    _put_varint(out, n)
    return bytes(out)


def _varint_bytes(v: int) -> bytes:
    if 0 <= v < 0x80:
        return _ONE_BYTE[v]
    out = bytearray()
    _put_varint(out, v)
    return bytes(out)


@functools.lru_cache(maxsize=1024)
def _name_key(name: str) -> bytes:
    """A map entry's key field: the feature name with its head."""
    raw = name.encode("utf-8")
    return _head(1, len(raw)) + raw


def _feature_parts(value) -> tuple[int, list]:
    """(length, pieces) of one Feature message holding ``value``: short heads, then
    the byte strings uncopied."""
    kind = value.dtype.kind if isinstance(value, np.ndarray) else ""
    if kind in ("i", "u", "b"):
        if value.size == 1:  # a label: no list, no loop
            packed = _varint_bytes(int(value.item()) & 0xFFFFFFFFFFFFFFFF)
        else:
            buf = bytearray()
            for x in value.reshape(-1).tolist():
                _put_varint(buf, int(x))
            packed = bytes(buf)
    elif kind == "f":
        packed = np.ascontiguousarray(value.reshape(-1), "<f4").tobytes()
    else:
        pieces, n = [], 0
        for item in value:
            if type(item) is not bytes:
                item = memoryview(item).cast("B")
            head = _head(1, len(item))
            pieces += (head, item)
            n += len(head) + len(item)
        head = _head(1, n)
        return len(head) + n, [head, *pieces]
    inner = _head(1, len(packed))
    n = len(inner) + len(packed)
    head = _head(2 if kind == "f" else 3, n)
    return len(head) + n, [head + inner, packed]


def encode_example_parts(features: Mapping[str, object]) -> list:
    """The bytes of :func:`encode_example` as a list of pieces to join or write in
    turn: each byte string of ``_OWN_PIECE`` bytes or more is a piece of its own,
    uncopied (so it must not change before the pieces are used)."""
    entries: list = []
    total = 0
    for name in sorted(features):
        key = _name_key(name)
        flen, fparts = _feature_parts(features[name])
        val = _head(2, flen)
        elen = len(key) + len(val) + flen
        head = _head(1, elen)
        entries += (head + key + val, *fparts)
        total += len(head) + elen
    pieces: list = []
    small = [_head(1, total)]
    for p in entries:
        if len(p) < _OWN_PIECE:
            small.append(p)
            continue
        pieces += (b"".join(small), p)
        small = []
    pieces.append(b"".join(small))
    return pieces


def encode_example(features: Mapping[str, object]) -> bytes:
    """Serialize an Example.

    Args:
        features: name -> a list of bytes-like (BytesList), an integer numpy array
            (Int64List) or a floating numpy array (FloatList, stored as float32).
    """
    return b"".join(encode_example_parts(features))
