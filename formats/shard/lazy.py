"""Values decoded when they are first read, not when the record is.

A JSON field (COCO's polygons, a caption's metadata) costs tens of microseconds a
record to parse, more than reading every other field of it; a raw batch or a
``ds[i]`` whose caller never looks at it should not pay that. So a record is a
:class:`Record` (a mutable mapping of field -> value, as a dict is, but not a
``dict``: ``json.dumps`` takes ``dict(record)``) and a raw batch's JSON column a
:class:`LazyValues` (a read-only sequence; ``+`` gives a list): each value is
decoded on first access, then kept. A payload that does not decode raises on that access,
naming the shard file and the record, exactly as an eager decode would have.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any

__all__ = ["LazyValues", "Record"]

_PENDING = object()


class LazyValues(Sequence):
    """``n`` values, value ``i`` being ``decode(i)`` the first time it is read."""

    __slots__ = ("_decode", "_values")

    def __init__(self, decode: Callable[[int], Any], n: int) -> None:
        self._decode = decode
        self._values = [_PENDING] * n

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self._values)))]
        value = self._values[i]
        if value is _PENDING:
            i = range(len(self._values))[i]  # a negative index, and the IndexError
            value = self._values[i] = self._decode(i)
        return value

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(len(self._values)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, LazyValues)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __repr__(self) -> str:
        return repr(list(self))

    def __add__(self, other) -> list:
        return [*self, *other]

    def __radd__(self, other) -> list:
        return [*other, *self]

    def __reduce__(self):
        return list, (list(self),)


class Record(MutableMapping):
    """One record's fields: ``values`` holds those decoded already, ``decode(name)``
    gives any other named in ``names`` (and is called once for each). Set, delete,
    ``update``, ``pop``, ``copy`` (a dict) and ``|`` work as on a dict."""

    __slots__ = ("_decode", "_names", "_values")

    def __init__(self, names: Sequence[str], values: dict[str, Any],
                 decode: Callable[[str], Any]) -> None:
        self._names = names
        self._values = values
        self._decode = decode

    def __getitem__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            if name not in self._names:
                raise
        value = self._values[name] = self._decode(name)
        return value

    def __setitem__(self, name: str, value: Any) -> None:
        if name not in self._names:
            self._names = [*self._names, name]  # the dataset's list is shared: a copy
        self._values[name] = value

    def __delitem__(self, name: str) -> None:
        if name not in self._names:
            raise KeyError(name)
        self._names = [n for n in self._names if n != name]
        self._values.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def copy(self) -> dict[str, Any]:
        return dict(self)

    def __or__(self, other) -> dict[str, Any]:
        return {**self, **other}

    def __ror__(self, other) -> dict[str, Any]:
        return {**other, **self}

    def __ior__(self, other) -> Record:
        self.update(other)
        return self

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __repr__(self) -> str:
        return repr(dict(self))

    def __reduce__(self):
        # To another process (a DataLoader worker's sample) as the plain dict it reads
        # as: every value decoded, no closure over this process's maps, and a bytes
        # field's zero-copy view (which pickle refuses) as the bytes it shows.
        return dict, ({name: bytes(v) if type(v) is memoryview else v
                       for name, v in self.items()},)
