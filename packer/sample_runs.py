"""A function's samples on their way to the writer: frozen as they come, and handed
over in runs bounded in bytes and samples, whatever one input yields.

Invariants:

* A run holds at most about :data:`RUN_BYTES` bytes of samples (the largest sample
  alone may be more) or :data:`RUN_SAMPLES` samples: a generator of any length, even
  one without end, is written as it goes, never held whole.
* Runs may span inputs and may end in the middle of one; the records written, and
  so the bytes, never depend on where they end.
* What the function gave is frozen as it comes (it may reuse its dict, array or
  buffer for the next sample).
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Iterator
from typing import Any

import numpy as np

from formats.fields import json_payload

from .errors import _Bad
from .loop import Item, Run
from .schema import check_run, check_sample
from .work import WorkOptions

__all__ = ["RUN_BYTES", "RUN_SAMPLES", "Runs", "freeze", "raised", "several"]

#: A run of samples is handed to the writer at about this many bytes, or samples
#: (their dicts cost memory too), whichever comes first: memory is bounded whatever
#: one input yields (``write_run`` joins at most 4 MB at a time as well).
RUN_BYTES = 4 << 20
RUN_SAMPLES = 4096


def freeze(sample: Any) -> tuple[Any, int]:
    """``sample`` as the function can no longer change it, and about how many bytes it
    holds (what bounds a run). Samples wait in a run, and a function may reuse its dict,
    array or buffer for the next sample (a generator yielding one dict, updated). A new
    dict; arrays copied (C-contiguous, as they are stored), byte buffers as bytes, json
    containers as fresh ones. Anything else is immutable, or refused by the check as
    it is."""
    if type(sample) is not dict:
        return sample, 0
    out = dict(sample)
    size = 0
    for k, v in out.items():
        if isinstance(v, np.ndarray):
            out[k] = v = v.copy()
            size += v.nbytes
        elif isinstance(v, (bytearray, memoryview)):
            out[k] = v = bytes(v)  # a view of ints: its bytes, as a bytes field stores them
            size += len(v)
        elif isinstance(v, (str, bytes)):
            size += len(v)
        elif isinstance(v, (dict, list)):
            try:
                text = json_payload(v)
                out[k] = json.loads(text)
                size += len(text)
            except (TypeError, ValueError, RecursionError):
                pass  # not JSON: the check names it
        else:
            size += 8
    return out, size


def several(out: Any) -> bool:
    """Whether what the function gave is several samples (an iterator, consumed as the
    pack goes, never held whole) rather than one."""
    return type(out) is not dict and isinstance(out, Iterator)


def raised(exc: Exception, given: int, kept: bool) -> str:
    """Why an input failed: the exception, where, and what became of its samples."""
    tb = traceback.extract_tb(exc.__traceback__)
    frame = tb[-1] if tb else None
    said = f"{type(exc).__name__}: {exc}".rstrip(": ")
    where = f" (at {os.path.basename(frame.filename)}:{frame.lineno} in {frame.name})" \
        if frame else ""
    after = ""
    if given:
        after = f" after {given} sample(s)" + ("; they are written, the rest of the input "
                                               "is not" if kept else "")
    return f"the function raised {said}{where}{after}"


class Runs:
    """A range's samples on their way to the writer, handed over in runs bounded in
    bytes (:data:`RUN_BYTES`) and samples (:data:`RUN_SAMPLES`) whatever one input
    yields, so memory stays bounded for a generator of any length.

    A run is one :class:`~packer.loop.Run` when every sample fits as is
    (:func:`check_run`), else an item per sample, each bad one named by its input (and
    its place among the samples of a generator).

    Args:
        part: the range (its ``fields`` and ``name(i, j)``: a
            :class:`packer.samples.SampleRange`).
        max_bytes: the shard size (a larger sample is bad input).
        images: how image payloads are checked (:func:`packer.plan.work_options`).
    """

    def __init__(self, part, max_bytes: int | None, images: WorkOptions) -> None:
        self.part, self.max_bytes, self.images = part, max_bytes, images
        self.samples: list = []
        # Per input with samples in this run: (input, where its first is, its number
        # among the input's samples, whether the input is a generator).
        self.spans: list[tuple[int, int, int, bool]] = []
        self.nbytes = 0

    def begin(self, i: int, many: bool) -> None:
        """Input ``i``'s samples come next (``many``: it is a generator)."""
        span = (i, len(self.samples), 0, many)
        if self.spans and self.spans[-1][1] == len(self.samples):
            self.spans[-1] = span  # the input before gave nothing more to this run
        else:
            self.spans.append(span)

    def add(self, sample: Any) -> bool:
        """Take one sample (frozen here); True once the run is full."""
        frozen, size = freeze(sample)
        self.samples.append(frozen)
        self.nbytes += size
        return self.nbytes >= RUN_BYTES or len(self.samples) >= RUN_SAMPLES

    def flush(self) -> Iterator[Item | Run]:
        """The run's items; the run is empty after, the last input's span going on."""
        samples, spans = self.samples, self.spans
        if not samples:
            return
        self.samples, self.nbytes = [], 0
        i, at, j, many = spans[-1]
        self.spans = [(i, 0, j + len(samples) - at, many)]
        checked = check_run(samples, self.part.fields, self.max_bytes)
        if checked is not None:
            yield Run(*checked)
            return
        ends = [at for _, at, _, _ in spans[1:]] + [len(samples)]
        for (i, at, j, many), end in zip(spans, ends, strict=True):
            for k in range(at, end):
                try:
                    record, nbytes = check_sample(samples[k], self.part.fields,
                                                  self.max_bytes, "", self.images)
                except _Bad as bad:
                    name = self.part.name(i, j + k - at if many else None)
                    yield Item(None, None, name, name, 0, bad.kind, bad.reason)
                    continue
                yield Item(record, None, "", "", nbytes)
