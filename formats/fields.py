"""Field types: how a value becomes payload bytes and how payload bytes are read back.

A schema is an ordered list of :class:`Field`. Encoded images and raw bytes are
returned as zero-copy ``memoryview`` slices of the shard's mmap; ``ndarray``
fields as read-only numpy views; scalars as Python values (FORMAT.md, "Field types").
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import orjson

from .errors import SchemaError
from .sniff import sniff

__all__ = [
    "BOXES_FIELD",
    "BYTES_TYPES",
    "COMPRESSIONS",
    "FIELD_TYPES",
    "IMAGE_TYPES",
    "PER_BOX_NAMES",
    "SCALAR_TYPES",
    "Field",
    "ImageKinds",
    "decode_value",
    "encode_value",
    "json_payload",
    "stored_image_type",
]

BYTES_TYPES = frozenset({"bytes", "jpeg", "png", "image"})
# The detection fields found by name: the Loader (reader.Annotations) moves the boxes
# field (ndarray [None, 4], xyxy pixels) with the image and filters the per-box fields
# (ndarrays with one row per box) with it; pack_samples infers each of them with a
# variable first dimension, since the number of boxes varies between images.
BOXES_FIELD = "boxes"
PER_BOX_NAMES = frozenset({"labels", "iscrowd", "area", "keypoints", "scores", "classes"})
# Encoded images; a writer types such a field by what it holds (jpeg, png, or image).
IMAGE_TYPES = frozenset({"jpeg", "png", "image"})


def stored_image_type(seen) -> str:
    """The type of an image field that held payloads of the formats ``seen`` (``jpeg``,
    ``png``, anything else): one format of its own type, else ``image``."""
    seen = set(seen)
    return seen.pop() if len(seen) == 1 and seen <= {"jpeg", "png"} else "image"


class ImageKinds:
    """What the image fields of the records written hold, payload by payload, so every
    writer (ours and the foreign sinks) types each field by what it held, never as a
    source guessed it (:func:`stored_image_type`)."""

    def __init__(self, fields) -> None:
        self._seen: dict[str, set[str]] = {f.name: set() for f in fields if f.type in IMAGE_TYPES}
        self.names = tuple(self._seen)

    def note(self, name: str, value) -> str:
        """Record one payload of image field ``name``; returns its sniffed kind."""
        kind = sniff(value)
        self._seen[name].add(kind if kind in ("jpeg", "png") else "other")
        return kind

    def typed(self, fields) -> tuple[Field, ...]:
        """``fields`` with each image field typed by what it held (unchanged if nothing)."""
        return tuple(replace(f, type=stored_image_type(self._seen[f.name]))
                     if self._seen.get(f.name) else f for f in fields)

    def state(self) -> dict[str, list[str]]:
        """What was seen, as JSON (a resume journal carries it)."""
        return {k: sorted(v) for k, v in self._seen.items()}

    def restore(self, state) -> None:
        """Take back what :meth:`state` said (unknown names and values ignored)."""
        for k, v in (state or {}).items():
            if k in self._seen and isinstance(v, list):
                self._seen[k] = {x for x in v if x in ("jpeg", "png", "other")}
SCALAR_TYPES = frozenset({"int", "float"})
FIELD_TYPES = BYTES_TYPES | SCALAR_TYPES | {"str", "json", "ndarray"}
COMPRESSIONS = frozenset({"none", "zstd"})

_INT = struct.Struct("<q")
_LONG_DIGITS = re.compile(rb"[0-9]{20}")
_FLOAT = struct.Struct("<d")


@dataclass(frozen=True)
class Field:
    """One named column of a dataset.

    Args:
        name: the field name (non-empty; unique in a schema).
        type: one of ``bytes``, ``jpeg``, ``png``, ``image`` (any encoded image),
            ``int`` (int64), ``float`` (float64), ``str`` (UTF-8), ``json``
            (UTF-8 JSON text), ``ndarray``.
        compression: ``none`` or ``zstd`` (not allowed for ``int``/``float``,
            whose fixed 8 bytes are gathered for a whole batch at once).
        dtype: numpy dtype string for ``ndarray`` (stored little-endian).
        shape: ``ndarray`` shape; ``None`` entries are dimensions that vary per
            record (then the payload starts with its shape, see FORMAT.md).
        level: zstd level used when writing (not part of the format).
    """

    name: str
    type: str
    compression: str = "none"
    dtype: str | None = None
    shape: tuple[int | None, ...] | None = None
    level: int = field(default=3, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SchemaError("field name must be a non-empty string", found=self.name)
        try:
            self.name.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate would make the manifest unreadable
            raise SchemaError("field name must be text (it holds a lone surrogate)",
                              found=ascii(self.name)) from None
        if self.type not in FIELD_TYPES:
            raise SchemaError(
                f"field {self.name!r}: unknown type", found=self.type, expected=sorted(FIELD_TYPES)
            )
        if self.compression not in COMPRESSIONS:
            raise SchemaError(
                f"field {self.name!r}: unknown compression",
                found=self.compression,
                expected=sorted(COMPRESSIONS),
            )
        if self.type in SCALAR_TYPES and self.compression != "none":
            raise SchemaError(f"field {self.name!r}: {self.type} fields are never compressed")
        if self.type == "ndarray":
            if self.dtype is None:
                raise SchemaError(f"field {self.name!r}: ndarray needs a dtype")
            try:
                dt = np.dtype(self.dtype)
            except TypeError as exc:
                raise SchemaError(f"field {self.name!r}: bad dtype", found=self.dtype) from exc
            if dt.hasobject or dt.itemsize == 0:
                raise SchemaError(f"field {self.name!r}: dtype must be fixed-size", found=self.dtype)
            object.__setattr__(self, "dtype", dt.newbyteorder("<").str if dt.itemsize > 1 else dt.str)
            if self.shape is None:
                raise SchemaError(f"field {self.name!r}: ndarray needs a shape")
            shape = tuple(self.shape)
            if not all(d is None or (isinstance(d, int) and d >= 0) for d in shape):
                raise SchemaError(f"field {self.name!r}: bad shape", found=self.shape)
            object.__setattr__(self, "shape", shape)
        elif self.dtype is not None or self.shape is not None:
            raise SchemaError(f"field {self.name!r}: dtype/shape only apply to ndarray fields")

    @property
    def fixed_shape(self) -> bool:
        return self.shape is not None and None not in self.shape

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type, "compression": self.compression}
        if self.type == "ndarray":
            out["dtype"] = self.dtype
            out["shape"] = list(self.shape)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Field:
        if not isinstance(obj, dict):
            raise SchemaError("field entry must be an object", found=type(obj).__name__)
        unknown = set(obj) - {"name", "type", "compression", "dtype", "shape", "dictionary",
                              "dictionary_crc32c", "max_raw_size"}
        if unknown:
            raise SchemaError("field entry has unknown keys", found=sorted(unknown))
        shape = obj.get("shape")
        if shape is not None and not isinstance(shape, list):
            raise SchemaError("field shape must be a list", found=shape)
        return cls(
            name=obj.get("name"),
            type=obj.get("type"),
            compression=obj.get("compression", "none"),
            dtype=obj.get("dtype"),
            shape=None if shape is None else tuple(shape),
        )


def json_payload(value: Any) -> bytes:
    """A ``json`` field's payload: sorted keys, no spaces, no NaN, UTF-8 (FORMAT.md, "Field
    types").

    Raises:
        TypeError, ValueError, RecursionError: ``value`` is not JSON (a set, NaN, a
            dict with keys of mixed types, a lone surrogate, too deep).
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def encode_value(f: Field, value: Any):
    """The uncompressed payload of ``value`` for field ``f`` (a bytes-like object whose
    ``len()`` is its size in bytes)."""
    t = f.type
    try:
        if t in BYTES_TYPES:
            if isinstance(value, memoryview) and (value.ndim != 1 or value.itemsize != 1):
                return value.cast("B")  # len() of a view of ints counts the ints
            if isinstance(value, (bytes, bytearray, memoryview)):
                return value
            if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1:
                return memoryview(np.ascontiguousarray(value))
            raise TypeError(f"expected bytes, got {type(value).__name__}")
        if t == "int":
            if isinstance(value, (bool, float)) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"expected int, got {type(value).__name__}")
            return _INT.pack(int(value))
        if t == "float":
            if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
                raise TypeError(f"expected float, got {type(value).__name__}")
            return _FLOAT.pack(float(value))
        if t == "str":
            if not isinstance(value, str):
                raise TypeError(f"expected str, got {type(value).__name__}")
            return value.encode("utf-8")
        if t == "json":
            return json_payload(value)
        return _encode_ndarray(f, value)
    except (TypeError, ValueError, OverflowError, RecursionError, struct.error) as exc:
        raise SchemaError(f"field {f.name!r} ({t}): {exc}") from exc


def _encode_ndarray(f: Field, value: Any):
    arr = np.asarray(value)
    if arr.dtype != np.dtype(f.dtype):
        if not np.can_cast(arr.dtype, f.dtype, casting="same_kind"):
            raise TypeError(f"dtype {arr.dtype} does not cast safely to {f.dtype}")
        arr = arr.astype(f.dtype)
    if arr.ndim != len(f.shape) or any(
        d is not None and d != n for d, n in zip(f.shape, arr.shape, strict=True)
    ):
        raise ValueError(f"shape {arr.shape} does not match {f.shape}")
    data = np.ascontiguousarray(arr, dtype=np.dtype(f.dtype)).view(np.uint8).reshape(-1)
    if f.fixed_shape:
        return memoryview(data)
    head = struct.pack(f"<{1 + arr.ndim}Q", arr.ndim, *arr.shape)
    return b"".join((head, data))  # one copy (header + array), not two


def decode_value(f: Field, view: memoryview) -> Any:
    """The value of field ``f`` from its (decompressed) payload ``view``.

    Raises:
        SchemaError: the payload does not have the size its type needs (the
            caller adds file and record to the message).
    """
    t = f.type
    if t in BYTES_TYPES:
        return view
    if t == "int":
        _need(f, view, 8)
        return _INT.unpack(view)[0]
    if t == "float":
        _need(f, view, 8)
        return _FLOAT.unpack(view)[0]
    if t == "str":
        return _utf8(f, view)
    if t == "json":
        # orjson reads an integer past 64 bits as a float: a run of 20 digits (rare,
        # and 2**64 has 20) goes to the json module, which keeps it exact.
        if _LONG_DIGITS.search(view) is None:
            try:
                return orjson.loads(view)
            except orjson.JSONDecodeError:
                pass  # the json module's verdict, and its message
        try:
            return json.loads(_utf8(f, view))
        except json.JSONDecodeError as exc:
            raise SchemaError(f"field {f.name!r}: invalid JSON payload ({exc.msg})") from None
    return _decode_ndarray(f, view)


def _utf8(f: Field, view: memoryview) -> str:
    try:
        return str(view, "utf-8")
    except UnicodeDecodeError as exc:
        raise SchemaError(f"field {f.name!r}: invalid UTF-8 at byte {exc.start}") from None


def _need(f: Field, view: memoryview, n: int) -> None:
    if len(view) != n:
        raise SchemaError(f"field {f.name!r} ({f.type}): payload size", found=len(view), expected=n)


_HEADS: dict[int, struct.Struct] = {}  # ndim -> the shape header's struct


def _decode_ndarray(f: Field, view: memoryview) -> np.ndarray:
    # struct, not numpy, for the header: a raw batch decodes one array per record, and
    # numpy's per-call overhead (np.prod, a header array) was 9/10 of it.
    dt = np.dtype(f.dtype)
    if f.fixed_shape:
        shape = f.shape
        start = 0
    else:
        ndim = len(f.shape)
        start = 8 * (1 + ndim)
        if len(view) < start:
            raise SchemaError(f"field {f.name!r}: ndarray payload shorter than its shape header")
        head = _HEADS.get(ndim)
        if head is None:
            head = _HEADS[ndim] = struct.Struct(f"<{1 + ndim}Q")
        found = head.unpack_from(view)
        shape = found[1:]
        if found[0] != ndim or any(d is not None and d != n
                                   for d, n in zip(f.shape, shape, strict=True)):
            raise SchemaError(f"field {f.name!r}: stored shape", found=list(found), expected=f.shape)
    count = 1
    for n in shape:
        count *= n
    if len(view) - start != count * dt.itemsize:
        raise SchemaError(f"field {f.name!r} ({f.type}): payload size", found=len(view) - start,
                          expected=count * dt.itemsize)
    arr = np.frombuffer(view, dt, count, start).reshape(shape)
    arr.flags.writeable = False
    return arr
