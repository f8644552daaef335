"""A mixture's sources read as one dataset by the runtime: source ``s``'s record ``r``
is record ``offsets[s] + r`` here, and its shard ``k`` shard ``shard_offsets[s] + k``.

It offers what the workers and the main process read a batch with (``payloads``,
``scalars``, ``values``, ``get``, ``where``, ``fields``), each call split by source and
put back in the batch's order; nothing is copied. Its fields are those every source
has with the same type, encoding and shape, where image types agree as ``image`` (a
``jpeg`` field of one source and a ``png`` or ``image`` one of another: the decoder
reads each payload's own format); the others are named in :attr:`differing` so an
error can say which source disagrees.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from formats.errors import RecordIndexError
from formats.fields import IMAGE_TYPES, Field

__all__ = ["MixedDataset"]


class MixedDataset:
    """Sources (open datasets) as one, by name.

    Args:
        names: each source's name, in the mixture's order.
        parts: the open datasets, in the same order.
    """

    def __init__(self, names: tuple[str, ...], parts: list) -> None:
        self.names = tuple(names)
        self.parts = list(parts)
        sizes = [len(d) for d in self.parts]
        self.offsets = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=self.offsets[1:])
        shards = [len(d.starts) - 1 for d in self.parts]
        self.shard_offsets = np.zeros(len(shards) + 1, np.int64)
        np.cumsum(shards, out=self.shard_offsets[1:])
        self.starts = np.concatenate(
            [d.starts[:-1] + self.offsets[i] for i, d in enumerate(self.parts)]
            + [self.offsets[-1:]])
        self.fields, self.differing = _common_fields(self.names, self.parts)
        self.field_index = {f.name: i for i, f in enumerate(self.fields)}
        max_raw = {}
        for d in self.parts:
            for name, size in d.manifest.max_raw_size.items():
                max_raw[name] = max(max_raw.get(name, 0), size)
        self.manifest = SimpleNamespace(max_raw_size=max_raw)  # what the batch plan reads
        self.root = "the mixture of " + ", ".join(
            f"{n} ({d.root})" for n, d in zip(self.names, self.parts, strict=True))
        classes = {d.classes for d in self.parts}
        self.classes = classes.pop() if len(classes) == 1 else None

    def nothing_shared(self) -> str | None:
        """Why reading this mixture's shared fields would give batches of keys alone (or
        of nothing): each source's fields, and why those named alike differ; None when
        the sources share a field besides ``key``.

        The Loader refuses such a mixture unless fields are named: a training job
        reading only keys is never what was meant, and silently is the worst way to
        learn that the sources were packed differently."""
        if any(f.name != "key" for f in self.fields):
            return None
        each = "; ".join(f"source {n!r} has " + (", ".join(f"{f.name} ({_spelled(f)})"
                                                          for f in d.fields) or "no field")
                         for n, d in zip(self.names, self.parts, strict=True))
        alike = [f"{name}: {why}" for name, why in self.differing.items()
                 if all(any(f.name == name for f in d.fields) for d in self.parts)]
        return (f"the sources of this mixture share no field besides 'key', so its batches "
                f"would hold keys alone: {each}" + (f" (differing: {'; '.join(alike)})"
                                                     if alike else ""))

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __repr__(self) -> str:
        return f"MixedDataset({', '.join(map(repr, self.parts))})"

    @property
    def check_crc(self) -> bool:
        return all(d.check_crc for d in self.parts)

    @check_crc.setter
    def check_crc(self, value: bool) -> None:
        for d in self.parts:
            d.check_crc = value

    # -- one record -------------------------------------------------------------------

    def part_of(self, index: int) -> tuple[int, int]:
        """(source number, record within that source) of a record of the mixture."""
        index = int(index)
        if not 0 <= index < len(self):
            raise RecordIndexError(f"record {index} out of range for {self.root} of "
                                   f"{len(self)} records")
        s = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return s, index - int(self.offsets[s])

    def get(self, index: int, field: str) -> Any:
        s, r = self.part_of(index)
        return self.parts[s].get(r, field)

    def payload(self, index: int, field: str) -> memoryview:
        s, r = self.part_of(index)
        return self.parts[s].payload(r, field)

    def where(self, index: int, field: str) -> tuple[Path, int, int]:
        s, r = self.part_of(index)
        return self.parts[s].where(r, field)

    def locate(self, index: int) -> tuple[int, int]:
        """(shard of the mixture, record within it)."""
        s, r = self.part_of(index)
        k, local = self.parts[s].locate(r)
        return int(self.shard_offsets[s]) + k, local

    def shard(self, k: int):
        s = int(np.searchsorted(self.shard_offsets, k, side="right")) - 1
        return self.parts[s].shard(k - int(self.shard_offsets[s]))

    # -- many records -----------------------------------------------------------------

    def _split(self, indices) -> list[tuple[int, Any, np.ndarray]]:
        """(source, positions in the batch, records in that source) per source used."""
        idx = np.asarray(indices, np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            bad = int(idx[(idx < 0) | (idx >= len(self))][0])
            raise RecordIndexError(f"record {bad} out of range for {self.root} of "
                                   f"{len(self)} records")
        src = np.searchsorted(self.offsets, idx, side="right") - 1
        if idx.size == 0:
            return []
        first = int(src[0])
        if (src == first).all():
            return [(first, slice(None), idx - self.offsets[first])]
        return [(s, pos, idx[pos] - self.offsets[s])
                for s in np.unique(src).tolist() for pos in [np.flatnonzero(src == s)]]

    def scalars(self, indices, field: str) -> np.ndarray:
        groups = self._split(indices)
        if len(groups) == 1:
            return self.parts[groups[0][0]].scalars(groups[0][2], field)
        out = np.empty(len(indices), np.int64 if self._type(field) == "int" else np.float64)
        for s, pos, local in groups:
            out[pos] = self.parts[s].scalars(local, field)
        return out

    def payloads(self, indices, field: str) -> list[memoryview]:
        return self._listed(indices, field, "payloads")

    def spans(self, indices, field: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(shards of the mixture, byte offsets, lengths), as a source's ``spans``."""
        shard = np.empty(len(indices), np.int64)
        offsets, lengths = np.empty(len(indices), np.int64), np.empty(len(indices), np.int64)
        for s, pos, local in self._split(indices):
            k, offsets[pos], lengths[pos] = self.parts[s].spans(local, field)
            shard[pos] = k + self.shard_offsets[s]
        return shard, offsets, lengths

    def values(self, indices, field: str) -> list:
        return self._listed(indices, field, "values")

    def _listed(self, indices, field: str, how: str) -> list:
        groups = self._split(indices)
        if len(groups) == 1:
            return list(getattr(self.parts[groups[0][0]], how)(groups[0][2], field))
        out: list = [None] * len(indices)
        for s, pos, local in groups:
            got = getattr(self.parts[s], how)(local, field)
            for i, p in enumerate(pos.tolist()):
                out[p] = got[i]
        return out

    def _type(self, field: str) -> str:
        return self.fields[self.field_index[field]].type


def _common_fields(names: tuple[str, ...], parts: list) -> tuple[tuple[Field, ...], dict]:
    """The fields every source has alike (in the first source's order), and for each
    other field name, why it is not one: which source lacks it or stores it otherwise."""
    first = parts[0].fields
    common, differing = [], {}
    everywhere = [{f.name: f for f in d.fields} for d in parts]
    for f in first:
        others = [mine.get(f.name) for mine in everywhere[1:]]
        if f.type in IMAGE_TYPES and all(o is not None and o.type in IMAGE_TYPES for o in others):
            if any(o.type != f.type for o in others):
                f = replace(f, type="image")  # each payload decodes by its own format
            others = [replace(o, type=f.type) for o in others]
        why = [_unlike(f, names[0], o, n) for n, o in zip(names[1:], others, strict=True)]
        why = [w for w in why if w]
        if why:
            differing[f.name] = "; ".join(why)
        else:
            common.append(f)
    for n, mine in zip(names[1:], everywhere[1:], strict=True):
        for name in mine:
            if name not in everywhere[0] and name not in differing:
                differing[name] = f"source {names[0]!r} has no field {name!r} (source {n!r} has)"
    return tuple(common), differing


def _unlike(f: Field, first: str, other: Field | None, name: str) -> str | None:
    if other is None:
        return f"source {name!r} has no field {f.name!r}"
    if other != f:
        return (f"source {first!r} stores {f.name!r} as {_spelled(f)}, source {name!r} as "
                f"{_spelled(other)}")
    return None


def _spelled(f: Field) -> str:
    extra = [f"compression={f.compression}"] if f.compression != "none" else []
    if f.dtype is not None:
        extra.append(f"dtype={f.dtype}")
    if f.shape is not None:
        extra.append(f"shape={f.shape}")
    return f.type + (f" ({', '.join(extra)})" if extra else "")
