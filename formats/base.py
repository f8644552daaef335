"""The codec protocol: every format offers a source and a sink with the same verbs.

Conversion is "a source of one format, a sink of another", driven by the packer.
A :class:`Record` carries field values, metadata-table values, and where it came
from (for error messages and the packer's skip list).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .fields import Field

__all__ = ["Record", "Sink", "Source"]


@dataclass
class Record:
    """One sample on its way between formats.

    Args:
        fields: field name -> value (bytes-like for bytes/image fields).
        meta: metadata-table values (``width``, ``height``) when known.
        origin: where it came from, e.g. ``cats/001.jpg`` or ``train-0.tar:000123.jpg``.
    """

    fields: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    origin: str = ""


@runtime_checkable
class Source(Protocol):
    """Iterates records of one dataset in a stable order.

    ``fields`` (the schema) and ``classes`` are known before iteration;
    ``len()`` works when the count is known up front.
    """

    fields: tuple[Field, ...]
    classes: tuple[str, ...] | None

    def __iter__(self) -> Iterator[Record]: ...


@runtime_checkable
class Sink(Protocol):
    """Writes records; a context manager whose clean exit completes the output."""

    def write(self, record: Record) -> None: ...

    def __enter__(self) -> Sink: ...

    def __exit__(self, exc_type, exc, tb) -> None: ...
