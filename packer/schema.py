"""The schema of samples a user's function makes: the compact spelling, inference from
the first samples, and the check of one sample against it.

Inference (:func:`infer_fields`) reads the first :data:`INFER_SAMPLES` dict samples
in input order, so it depends on the inputs alone, never on the worker count. The
fields are the first sample's keys, in its order; each type is the first sample's:

==========================================  ==============================================
value                                       field
==========================================  ==============================================
``int`` / ``numpy.integer``                 ``int`` (``float`` when another of the first
                                            samples holds a float there)
``float`` / ``numpy.floating``              ``float``
``str``                                     ``str``
``bytes`` / ``bytearray`` / ``memoryview``  ``image`` when it holds an encoded image (the
                                            writer types it ``jpeg`` or ``png`` by what it
                                            holds), else ``bytes``
``dict`` / ``list``                         ``json``
``numpy.ndarray``                           ``ndarray`` of its dtype and shape; a
                                            dimension that differs between the first
                                            samples is variable (``None``), and so is
                                            the first dimension of a detection field
                                            (:func:`per_box_fields`)
``None``                                    the type of the first sample that holds
                                            something else there (all None: ``json``)
==========================================  ==============================================

A detection field (``boxes`` and the per-box names of
:data:`formats.fields.PER_BOX_NAMES`: ``labels``, ``iscrowd``, ``area``, ``keypoints``...)
holds one row per box, and the number of boxes varies between images even when the
first samples happen to agree: its first dimension is inferred as ``None``, so the
Loader moves and filters it with the image (``[3, 4]`` would be refused there), and
the pack's summary lists these fields (``per_box_fields``).

Checking (:func:`check_sample`) never casts: an array of another dtype, a float in an
``int`` field or a str that is not UTF-8 is bad input, returned as a *kind* and a
reason (the pack applies ``on_error`` to it in one place, :func:`packer.loop.write_items`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from formats.errors import SchemaError
from formats.fields import BOXES_FIELD, BYTES_TYPES, IMAGE_TYPES, PER_BOX_NAMES, Field, json_payload
from formats.sniff import image_kind

from .errors import PackError, UsageError, _Bad
from .work import WorkOptions, prepare

__all__ = ["INFER_SAMPLES", "check_run", "check_sample", "describe", "infer_fields",
           "parse_schema", "per_box_fields"]

#: How many samples (the first, in input order) inference reads.
INFER_SAMPLES = 64
_INT64 = (-(1 << 63), (1 << 63) - 1)
_ARRAY = re.compile(r"^\s*([<>|=]?[A-Za-z]+\d*)\s*\[(.*)\]\s*$")
_IMAGES = WorkOptions("image")  # image payloads are checked, never re-encoded


# -- the compact spelling -------------------------------------------------------------------

def parse_schema(schema: Any) -> tuple[Field, ...]:
    """Fields from a list of :class:`formats.Field` or a dict of name -> type.

    A type is a :class:`~formats.Field`, or a string: ``int``, ``float``, ``str``,
    ``bytes``, ``json``, ``jpeg``, ``png``, ``image``, or an array as
    ``DTYPE[DIMS]`` (``int32[None]``, ``<f4[None, 4]``, ``uint8[224, 224, 3]``;
    ``None`` or ``?`` for a dimension that varies).

    Raises:
        UsageError: names the field and what was expected.
    """
    if isinstance(schema, Mapping):
        fields = [_field(name, spec) for name, spec in schema.items()]
    elif isinstance(schema, (list, tuple)) and all(isinstance(f, Field) for f in schema):
        fields = list(schema)
    else:
        raise UsageError("schema must be a list of formats.Field or a dict of field name -> "
                         f"type (e.g. {{'text': 'str', 'tokens': 'int32[None]'}}), not "
                         f"{type(schema).__name__}")
    if not fields:
        raise UsageError("schema has no fields")
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise UsageError(f"schema names a field twice: {sorted({n for n in names if names.count(n) > 1})}")
    return tuple(fields)


def _field(name: Any, spec: Any) -> Field:
    if not isinstance(name, str):
        raise UsageError(f"schema field names are strings, not {name!r}")
    if isinstance(spec, Field):
        if spec.name != name:
            raise UsageError(f"schema key {name!r} holds a Field named {spec.name!r}")
        return spec
    if not isinstance(spec, str):
        raise UsageError(f"schema field {name!r}: a type is a string or a Field, not {spec!r}")
    try:
        m = _ARRAY.match(spec)
        if m is None:
            return Field(name, spec.strip())
        dims = [d.strip() for d in m.group(2).split(",")] if m.group(2).strip() else []
        shape = tuple(None if d in ("None", "?") else int(d) for d in dims)  # "": a typo
        return Field(name, "ndarray", dtype=m.group(1), shape=shape)
    except (SchemaError, ValueError) as exc:
        raise UsageError(f"schema field {name!r}: {spec!r} is not a type ({exc}); use int, "
                         "float, str, bytes, json, jpeg, png, image or DTYPE[DIMS] such as "
                         "int32[None]") from None


def describe(f: Field) -> str:
    """A field's type in the compact spelling (``int32[None]`` is ``<i4[None]``)."""
    if f.type != "ndarray":
        return f.type
    return f"{f.dtype}[{', '.join('None' if d is None else str(d) for d in f.shape)}]"


# -- inference ------------------------------------------------------------------------------

def _kind_of(value: Any) -> str | None:
    """The field type a value suggests (None for None)."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "image" if image_kind(value) is not None else "bytes"
    if isinstance(value, (dict, list)):
        return "json"
    if isinstance(value, np.ndarray):
        return "ndarray"
    return f"unsupported:{type(value).__name__}"


def infer_fields(samples: list[tuple[str, dict]]) -> tuple[Field, ...]:
    """The schema of ``samples`` ((name, sample) pairs, in input order; see the module
    docstring).

    Raises:
        PackError: a value of a type no field holds, naming the input and the field.
    """
    first_name, first = samples[0]
    keys = set(first)  # the same fields in another order are alike too
    alike = [s for _, s in samples if isinstance(s, dict) and s.keys() == keys]
    fields = []
    for key in first:
        if not isinstance(key, str) or not key:
            raise PackError(f"field names are non-empty strings, not {key!r}", path=first_name)
        values = [s[key] for s in alike]
        kinds = [_kind_of(v) for v in values]
        known = [k for k in kinds if k is not None]
        kind = known[0] if known else "json"
        where = next((n for (n, s) in samples if isinstance(s, dict) and _kind_of(s.get(key)) == kind),
                     first_name)
        if kind == "bool":
            raise PackError(f"field {key!r} holds a bool: store it as an int (int(v)) or declare "
                            "the schema", path=where)
        if kind.startswith("unsupported:"):
            raise PackError(f"field {key!r} holds a {kind.split(':')[1]}, which no field type "
                            "stores (int, float, str, bytes, dict/list as json, numpy.ndarray)",
                            path=where)
        if kind == "int" and "float" in known:
            kind = "float"
        if kind != "ndarray":
            fields.append(Field(key, kind))
            continue
        arr = next(v for v in values if isinstance(v, np.ndarray))
        if arr.dtype.names is not None or arr.dtype.subdtype is not None:
            raise PackError(f"field {key!r} holds an ndarray of the structured dtype "
                            f"{arr.dtype}: store each of its fields as an array of its own "
                            "(or .view(np.uint8) and declare the schema)", path=where)
        if arr.dtype.hasobject or arr.dtype.itemsize == 0:
            raise PackError(f"field {key!r} holds an ndarray of dtype {arr.dtype}: only "
                            "fixed-size dtypes are stored", path=where)
        shape: list[int | None] = list(arr.shape)
        for v in values:
            if isinstance(v, np.ndarray) and v.dtype == arr.dtype and v.ndim == arr.ndim:
                shape = [d if d == n else None for d, n in zip(shape, v.shape, strict=True)]
        if shape and _is_per_box(key):
            shape[0] = None  # one row per box: the count varies between images
        fields.append(Field(key, "ndarray", dtype=arr.dtype.str, shape=tuple(shape)))
    return tuple(fields)


def _is_per_box(name: str) -> bool:
    return name == BOXES_FIELD or name in PER_BOX_NAMES


def per_box_fields(fields: tuple[Field, ...]) -> tuple[str, ...]:
    """The detection fields among inferred ``fields`` (see the module docstring): what
    a summary says was given a variable first dimension by name."""
    return tuple(f.name for f in fields if f.type == "ndarray" and f.shape
                 and _is_per_box(f.name))


# -- checking one sample --------------------------------------------------------------------

def check_sample(sample: Any, fields: tuple[Field, ...], max_bytes: int | None,
                 name: str, images: WorkOptions = _IMAGES) -> tuple[dict[str, Any], int]:
    """``sample`` as the record to write, and its payload bytes.

    Args:
        sample: what the function returned or yielded.
        fields: the schema.
        max_bytes: the shard size: a larger sample is refused (None: no bound).
        name: how the input is named (image payloads are checked under it).
        images: how image payloads are checked (the pixel budget, whether a JPEG
            the Loader cannot decode is kept); never re-encoded.

    Raises:
        _Bad: the sample does not fit (kinds ``not-a-dict``, ``fields``, ``type``,
            ``dtype``, ``shape``, ``not-utf8``, ``not-json``, ``over-shard-size``, and the
            image kinds of :func:`packer.work.prepare`).
    """
    if not isinstance(sample, dict):
        raise _Bad("not-a-dict", f"the function gave a {type(sample).__name__}, not a dict "
                  "of field -> value")
    if len(sample) != len(fields) or any(f.name not in sample for f in fields):
        missing = [f.name for f in fields if f.name not in sample]
        extra = [k for k in sample if k not in {f.name for f in fields}]
        raise _Bad("fields", f"missing {missing}, unknown {extra}; the schema's fields are "
                  f"{[f.name for f in fields]}")
    record = {}
    nbytes = 0
    for f in fields:
        value, n = _value(f, sample[f.name], name, images)
        record[f.name] = value
        nbytes += n
    if max_bytes is not None and nbytes > max_bytes:
        raise _Bad("over-shard-size", f"{nbytes:,} bytes, more than the shard size ({max_bytes:,}); "
                  "raise shard_size")
    return record, nbytes


def check_run(samples: list, fields: tuple[Field, ...], max_bytes: int | None
              ) -> tuple[dict[str, list], list[int]] | None:
    """Many samples checked at once, column by column: the columns to write and each
    sample's payload bytes, when every sample fits without a conversion; None when
    one may not (then :func:`check_sample` decides sample by sample, and names it).

    Accepts nothing :func:`check_sample` refuses: the values taken here are the
    exact types it passes unchanged (a Python ``int``, ``float``, ``str``, ``bytes``,
    an ndarray of the field's dtype and shape).
    """
    keys = {f.name for f in fields}
    if not samples or not all(type(s) is dict and s.keys() == keys for s in samples):
        return None
    columns: dict[str, list] = {}
    total = np.zeros(len(samples), np.int64)
    for f in fields:
        values = [s[f.name] for s in samples]
        sizes = _column_bytes(f, values)
        if sizes is None:
            return None
        columns[f.name] = values
        total += sizes
    if max_bytes is not None and len(total) and int(total.max()) > max_bytes:
        return None
    return columns, total.tolist()


def _column_bytes(f: Field, values: list) -> np.ndarray | int | None:
    """Each value's payload bytes, or None when a value is not of the one type
    :func:`check_run` takes for the field as is."""
    t = f.type
    if t == "int":
        if not all(type(v) is int for v in values) or \
                not _INT64[0] <= min(values) <= max(values) <= _INT64[1]:
            return None
        return 8
    if t == "float":
        return 8 if all(type(v) is float for v in values) else None
    if t == "str":
        if not all(type(v) is str for v in values):
            return None
        try:  # an ASCII str's UTF-8 length is its length
            return np.fromiter((len(v) if v.isascii() else len(v.encode("utf-8")) for v in values),
                               np.int64, len(values))
        except UnicodeEncodeError:
            return None
    if t == "bytes":
        ok = all(type(v) is bytes for v in values)
        return np.fromiter(map(len, values), np.int64, len(values)) if ok else None
    if t == "ndarray":
        dtype, ndim = np.dtype(f.dtype), len(f.shape)
        if not all(type(v) is np.ndarray and v.dtype == dtype and v.ndim == ndim for v in values):
            return None
        fixed = [(j, d) for j, d in enumerate(f.shape) if d is not None]
        if fixed and any(v.shape[j] != d for v in values for j, d in fixed):
            return None
        head = 0 if f.fixed_shape else 8 * (1 + ndim)
        return np.fromiter((v.nbytes for v in values), np.int64, len(values)) + head
    if t == "json":
        try:
            return np.fromiter(map(len, map(json_payload, values)), np.int64, len(values))
        except (TypeError, ValueError, RecursionError):
            return None
    return None  # images: each payload is checked by its header, one by one


def _wrong(f: Field, value: Any) -> _Bad:
    return _Bad("type", f"field {f.name!r}: a {type(value).__name__}, where the schema says "
               f"{describe(f)}")


def _value(f: Field, value: Any, name: str, images: WorkOptions) -> tuple[Any, int]:
    t = f.type
    if t == "int":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise _wrong(f, value)
        value = int(value)
        if not _INT64[0] <= value <= _INT64[1]:
            raise _Bad("type", f"field {f.name!r}: {value} does not fit in an int64")
        return value, 8
    if t == "float":
        if isinstance(value, (bool, np.bool_)) or \
                not isinstance(value, (int, float, np.integer, np.floating)):
            raise _wrong(f, value)
        return float(value), 8
    if t == "str":
        if not isinstance(value, str):
            raise _wrong(f, value)
        try:
            return value, len(value.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise _Bad("not-utf8", f"field {f.name!r}: not valid UTF-8 text (a lone surrogate "
                      f"{value[exc.start]!r} at index {exc.start})") from None
    if t in BYTES_TYPES:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise _wrong(f, value)
        if t in IMAGE_TYPES:
            got = prepare(bytes(value) if not isinstance(value, bytes) else value, name, images)
            if got.kind is not None:
                raise _Bad(got.kind, f"field {f.name!r}: {got.reason}")
        return value, len(value)
    if t == "json":
        try:
            n = len(json_payload(value))  # as the writer encodes it: mixed key types fail here
        except (TypeError, ValueError, RecursionError) as exc:
            raise _Bad("not-json", f"field {f.name!r}: not JSON ({exc})") from None
        return value, n
    return value, _array_bytes(f, value)


def _array_bytes(f: Field, value: Any) -> int:
    if not isinstance(value, np.ndarray):
        raise _wrong(f, value)
    if value.dtype.newbyteorder("<") != np.dtype(f.dtype):  # byte order aside (stored LE)
        raise _Bad("dtype", f"field {f.name!r}: an ndarray of {value.dtype.str}, where the schema "
                  f"says {describe(f)} (cast it in the function: .astype({f.dtype!r}))")
    if value.ndim != len(f.shape) or any(
            d is not None and d != n for d, n in zip(f.shape, value.shape, strict=True)):
        raise _Bad("shape", f"field {f.name!r}: shape {list(value.shape)}, where the schema says "
                  f"{describe(f)} (declare a varying dimension as None in schema=)")
    return value.nbytes + (0 if f.fixed_shape else 8 * (1 + value.ndim))
