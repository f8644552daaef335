"""Typing a file list's columns, decided on every row of the list, never on the first alone.

Inferred types (``pack-dataset --help`` says the same):

* numbers and text: ``int`` when every value is an integer, ``float`` when every
  value is a number, ``str`` when every value is text. A CSV/TSV column is
  ``int`` when every cell is an integer as written in plain decimal (``-12``,
  ``0``; never ``007``, ``+5``, ``1_000`` or `` 7 ``, which would not come back
  as written), ``float`` when every cell is such an integer or a plain decimal
  number (``-1.5``, ``2e-3``; not ``nan`` or ``inf``), else ``str``, kept as
  written. Mixed types are refused. An integer beyond int64 is a problem of its
  row (named by line), never a float or a wrapped value.
* lists (JSONL only): ``ndarray`` when every value is a list of numbers (shape
  ``[None]``) or every value is a list of lists of numbers of one length ``k``
  across the whole column (shape ``[None, k]``); empty lists fit both. dtype
  ``int64`` when every number is an integer that int64 holds, else ``float32``
  (``float64`` when a value is beyond float32's range, which would make it inf).
  Anything else made of lists and objects (ragged, deeper, holding text, booleans
  or nulls, every row empty) is ``json``. A column mixing lists or objects with
  plain values is refused, naming a row of each, with the ``--field NAME=json``
  hint.

A type given with ``--field NAME=TYPE`` (:data:`TYPES`) replaces the inference.
Rows that do not fit it (a value the type cannot hold, a list whose shape
differs from the column's) are problems of their row, named by file and line:
the pack fails on them, or skips them with ``--on-error skip``. The shape of an
``ndarray`` override is the one most rows have (``[None]``, or ``[None, k]``),
never the first row's. In a CSV/TSV list, an ``ndarray`` or ``json`` column's
cells hold JSON text (``"[1, 2]"``).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from formats.errors import InputError
from formats.fields import Field

__all__ = ["BAD_ROW", "DTYPES", "TYPES", "TypedColumn", "type_column"]

#: The skip kind of a row whose value does not fit its column's type.
BAD_ROW = "bad-row"
#: The ndarray dtypes ``--field`` accepts.
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64")
#: Every type ``--field NAME=TYPE`` accepts.
TYPES = ("int", "float", "str", "json", *DTYPES)

_F32_MAX = float(np.finfo(np.float32).max)
_INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass
class TypedColumn:
    """A typed column: its field, one value per row, and the rows that do not fit
    (row index -> reason; their value is None)."""

    field: Field
    values: list[Any]
    problems: dict[int, str] = field(default_factory=dict)


def _number(v: Any) -> bool:
    return type(v) is int or type(v) is float


def _shape_of(v: Any, booleans: bool = False) -> tuple | None:
    """``()`` for an empty list, ``(None,)`` for a flat list of numbers, ``(None, k)``
    for a list of k-long lists of numbers; None for anything else."""
    ok = (lambda x: _number(x) or type(x) is bool) if booleans else _number
    if type(v) is not list:
        return None
    if not v:
        return ()
    if all(ok(x) for x in v):
        return (None,)
    if type(v[0]) is list and all(type(x) is list and len(x) == len(v[0]) for x in v) \
            and all(ok(y) for x in v for y in x):
        return (None, len(v[0]))
    return None


def _numbers(v: list) -> list:
    return [y for x in v for y in x] if v and type(v[0]) is list else v


def _describe(v: Any) -> str:
    if type(v) is list:
        return "a list"
    if type(v) is dict:
        return "an object"
    return {int: "an integer", float: "a number", str: "text", bool: "a boolean",
            type(None): "null"}.get(type(v), type(v).__name__)


def _infer_container(name: str, values: list) -> TypedColumn:
    shapes = [_shape_of(v) for v in values]
    kinds = {s for s in shapes if s != ()}
    if None in kinds or len(kinds) != 1:  # objects, ragged, deeper, mixed or all empty
        return TypedColumn(Field(name, "json"), list(values))
    shape = kinds.pop()
    nums = [x for v in values for x in _numbers(v)]
    if all(type(x) is int for x in nums):
        if all(-(1 << 63) <= x < (1 << 63) for x in nums):
            return _as_arrays(name, values, "int64", shape)
        return TypedColumn(Field(name, "json"), list(values))  # no fixed-size integer holds them
    big = any(math.isfinite(x) and abs(x) > _F32_MAX for x in nums)
    return _as_arrays(name, values, "float64" if big else "float32", shape)


def _as_arrays(name: str, values: list, dtype: str, shape: tuple) -> TypedColumn:
    empty = np.zeros((0, *shape[1:]), dtype)
    return TypedColumn(Field(name, "ndarray", dtype=dtype, shape=shape),
                  [np.asarray(v, dtype) if v else empty for v in values])


def _infer(name: str, values: list, from_text: bool, lines: list[int], where) -> TypedColumn:
    if from_text:
        if all(map(_PLAIN_INT.fullmatch, values)):
            return _ints(name, [int(v) for v in values], lines, where)
        if all(map(_PLAIN_FLOAT.fullmatch, values)):
            return TypedColumn(Field(name, "float"), [float(v) for v in values])
        return TypedColumn(Field(name, "str"), values)
    kinds = {type(v) for v in values}
    if kinds <= {int}:
        return _ints(name, values, lines, where)
    if kinds <= {int, float}:
        return TypedColumn(Field(name, "float"), [float(v) for v in values])
    if kinds <= {str}:
        return TypedColumn(Field(name, "str"), values)
    if kinds <= {list, dict}:
        column = _infer_container(name, values)
        if column.field.type == "json":
            for i, v in enumerate(values):
                if not _finite(v):
                    column.values[i] = None
                    column.problems[i] = (f"{where} line {lines[i]}: column {name!r} (json): "
                                          "NaN or infinity (JSON text cannot hold them)")
        return column
    nested = [i for i, v in enumerate(values) if type(v) in (list, dict)]
    if nested:
        other = next(i for i, v in enumerate(values) if type(v) not in (list, dict))
        raise InputError(
            f"column {name!r}: line {lines[nested[0]]} holds {_describe(values[nested[0]])}, "
            f"line {lines[other]} {_describe(values[other])}: rows disagree; give "
            f"--field {name}=json to store every value as JSON", path=where)
    odd = next((i for i, v in enumerate(values) if type(v) not in (int, float, str)), None)
    if odd is not None:  # a bool or a null: no column type takes it as it is
        raise InputError(f"column {name!r}: line {lines[odd]} holds {_describe(values[odd])}, "
                         f"which an int, float or str column cannot hold; give --field "
                         f"{name}=json to store the values as JSON", path=where)
    bad = next(i for i, v in enumerate(values) if type(v) is not type(values[0]))
    raise InputError(f"column {name!r}: rows disagree on the type: line {lines[0]} holds "
                     f"{_describe(values[0])}, line {lines[bad]} {_describe(values[bad])}",
                     path=where)


# Numbers as written in plain decimal (ASCII digits): the only cells inference reads as
# numbers, so no cell is rewritten ("007" stays text, as "+5", "1_000" and " 7 " do).
_PLAIN_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")
_PLAIN_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")


def _ints(name: str, values: list[int], lines: list[int], where) -> TypedColumn:
    """An ``int`` column; a value beyond int64 is its row's problem."""
    problems = {i: f"{where} line {lines[i]}: column {name!r} (int): {v} does not fit in "
                   "an int64" for i, v in enumerate(values) if not _INT64[0] <= v <= _INT64[1]}
    return TypedColumn(Field(name, "int"), [None if i in problems else v
                                       for i, v in enumerate(values)], problems)


# -- a type given with --field ------------------------------------------------------------

def _finite(v: Any) -> bool:
    """Whether ``v`` (parsed JSON) holds no NaN or infinity, which JSON text cannot."""
    stack = [v]
    while stack:
        x = stack.pop()
        if type(x) is float and not math.isfinite(x):
            return False
        if type(x) is list:
            stack.extend(x)
        elif type(x) is dict:
            stack.extend(x.values())
    return True


def _scalar(type_: str, v: Any, from_text: bool) -> Any:
    """``v`` as a value of ``type_``; raises ValueError saying why it does not fit."""
    if from_text:
        if type_ == "str":
            return v
        try:
            n = int(v) if type_ == "int" else float(v)
        except ValueError:
            raise ValueError(f"{v[:40]!r} is not {'an integer' if type_ == 'int' else 'a number'}") \
                from None
        if type_ == "int" and not _INT64[0] <= n <= _INT64[1]:
            raise ValueError(f"{v[:40]!r} does not fit in an int64")
        return n
    if type_ == "int" and type(v) is int:
        if not _INT64[0] <= v <= _INT64[1]:
            raise ValueError(f"{v} does not fit in an int64")
        return v
    if type_ == "float" and _number(v):
        return float(v)
    if type_ == "str" and type(v) is str:
        return v
    raise ValueError(f"{_describe(v)} is not {dict(int='an integer', float='a number', str='text')[type_]}")


def _fits_dtype(nums: list, dtype: np.dtype) -> str | None:
    """Why ``nums`` do not fit ``dtype`` (None when they all do)."""
    if dtype.kind == "b":
        return None if all(type(x) is bool for x in nums) else "holds a value that is not a boolean"
    if any(type(x) is bool for x in nums):
        return "holds a boolean"
    if dtype.kind in "iu":
        if any(type(x) is not int for x in nums):
            return f"holds a value that is not an integer ({dtype.name})"
        info = np.iinfo(dtype)
        if any(not info.min <= x <= info.max for x in nums):
            return f"holds an integer outside {dtype.name}'s range [{info.min}, {info.max}]"
        return None
    big = float(np.finfo(dtype).max)
    if any(math.isfinite(x) and abs(x) > big for x in nums):
        return f"holds a number beyond {dtype.name}'s range"
    return None


def _override(name: str, type_: str, values: list, from_text: bool, lines: list[int],
              where) -> TypedColumn:
    problems: dict[int, str] = {}
    out: list[Any] = [None] * len(values)

    def bad(i: int, why: str) -> None:
        problems[i] = f"{where} line {lines[i]}: column {name!r} (--field {name}={type_}): {why}"

    if type_ in ("int", "float", "str"):
        for i, v in enumerate(values):
            try:
                out[i] = _scalar(type_, v, from_text)
            except ValueError as exc:
                bad(i, str(exc))
        return TypedColumn(Field(name, type_), out, problems)
    parsed = list(values)
    if from_text:  # the cells hold JSON text
        for i, v in enumerate(values):
            try:
                parsed[i] = json.loads(v)
            except ValueError:
                bad(i, f"{v[:40]!r} is not JSON")
    if type_ == "json":
        for i, v in enumerate(parsed):
            if i not in problems:
                if _finite(v):
                    out[i] = v
                else:
                    bad(i, "NaN or infinity (JSON text cannot hold them)")
        return TypedColumn(Field(name, "json"), out, problems)
    dtype = np.dtype(type_)
    booleans = dtype.kind == "b"
    shapes = {i: _shape_of(v, booleans) for i, v in enumerate(parsed) if i not in problems}
    counts = Counter(s for s in shapes.values() if s)
    # The shape most rows have; a tie goes to [None], then to the smaller k.
    shape = min(counts, key=lambda s: (-counts[s], len(s), s[1:])) if counts else (None,)
    empty = np.zeros((0, *shape[1:]), dtype)
    for i, s in shapes.items():
        v = parsed[i]
        if s is None or (s and s != shape):
            want = "a list of numbers" if shape == (None,) else f"a list of {shape[1]}-long lists"
            bad(i, f"holds {_describe(v)} that is not {want} (the shape most rows have: "
                   f"{list(shape)})")
            continue
        why = _fits_dtype(_numbers(v), dtype)
        if why:
            bad(i, why)
            continue
        out[i] = np.asarray(v, dtype) if v else empty
    return TypedColumn(Field(name, "ndarray", dtype=dtype.str, shape=shape), out, problems)


def type_column(name: str, values: list, *, from_text: bool, lines: list[int], where,
                override: str | None = None) -> TypedColumn:
    """Type one column (see the module docstring).

    Args:
        values: the column's value in every row (text for CSV/TSV, parsed JSON for JSONL).
        from_text: the values are CSV/TSV cells.
        lines: each row's line number in the list, for messages.
        where: the list (its path or URI), for messages.
        override: a type from :data:`TYPES` given with ``--field``; None infers it.

    Raises:
        InputError: an inferred column whose rows disagree (names a line of each kind).
    """
    if override is None:
        return _infer(name, values, from_text, lines, where)
    return _override(name, override, values, from_text, lines, where)
