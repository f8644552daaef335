"""The Loader's options as the records its parts read: order, decoding, processes.

Every option is a keyword of :class:`reader.Loader` (one way to pass each); the
Loader checks them into these frozen dataclasses, which the sampler, the pipeline
and the workers take whole.

Every option is checked where it is made (``__post_init__``), so a wrong one
fails at construction with a message naming it and its value, never later in a
worker. The checks and their type rules live in :mod:`reader.batching.options`,
beside the order's own record, :class:`SamplerOptions` (re-exported here): the
order imports them from there, below this module, and this module imports the
pipeline's and the runtime's types at the top to check the rest, so no import
circles between the reader's subpackages and none is dodged inside a function.
:func:`check_batch_size` and :func:`check_fields` are the checks the Loader
applies beside these records: the batch size, and field names against a
dataset's schema.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from formats.errors import ArgumentError, ArgumentTypeError

from .batching.options import (
    SamplerOptions,
    check_batch_size,
    check_bool,
    check_choice,
    check_int,
    check_int_or_auto,
    set_field,
)
from .runtime.decoded_cache import DecodedCacheOptions
from .runtime.runtime import DEFAULT_RING_BYTES
from .transforms.bad_input import ON_ERROR, BadInput
from .transforms.collate import check_collate
from .transforms.sample import Annotations, FieldDecoder
from .transforms.transforms import GEOMETRIC, ImagePipeline, Normalize, SampleTransform

__all__ = ["DecodeOptions", "SamplerOptions", "WorkerOptions", "check_batch_size",
           "check_fields", "resolve_num_workers"]

def check_fields(options: DecodeOptions, dataset_fields: Mapping[str, str],
                 dataset: str | Path) -> None:
    """Refuse field names in ``options`` (``fields`` and ``image_field``) that the
    dataset does not have.

    Args:
        options: the decode options to check.
        dataset_fields: the dataset's schema, field name -> type name
            (``{f.name: f.type for f in ds.fields}``), in schema order.
        dataset: names the dataset in messages (its folder or URI).

    Raises:
        ValueError: names the unknown field, the dataset, the fields it has (with
            their types) and the closest name, if one is close.
    """
    asked = [("fields", n) for n in options.fields or ()]
    if options.image_field is not None:
        asked.append(("image_field", options.image_field))
    for arg, name in asked:
        if name not in dataset_fields:
            close = difflib.get_close_matches(name, list(dataset_fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            has = ", ".join(f"{n} ({t})" for n, t in dataset_fields.items())
            raise ArgumentError(f"{arg}: no field {name!r} in the dataset {str(dataset)!r}, "
                             f"whose fields are {has}{hint}")


def _check_transform(value: Any) -> None:
    """None, a worker pipeline (``output_shape`` and ``run``), an ImagePipeline, a
    transform spec or callable, or a list or tuple of specs and callables."""
    def usable(t: Any) -> bool:
        return (isinstance(t, (*GEOMETRIC, Normalize, SampleTransform))
                or (callable(t) and not isinstance(t, type)))

    if value is None or isinstance(value, ImagePipeline) or (
            hasattr(value, "output_shape") and hasattr(value, "run")):
        return
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    for i, t in enumerate(items):
        if not usable(t):
            where = f"transform[{i}]" if isinstance(value, (list, tuple)) else "transform"
            raise ArgumentTypeError(
                f"{where} must be a transform spec from reader.transforms (e.g. "
                f"RandomResizedCrop(224)) or a callable on images, not "
                f"{type(t).__name__} {t!r}")


@dataclass(frozen=True)
class DecodeOptions:
    """How records become arrays.

    Args:
        transform: the image pipeline (from :mod:`reader.transforms`), a list of
            transform specs to build one from, or None (whole images). A pipeline
            with a fixed output shape (e.g. ``RandomResizedCrop(224)``) gives one
            ``[batch, H, W, 3]`` array; one whose size varies (``ResizeShortestEdge``,
            ``Resize(int)``, None) gives padded or ragged images (``collate``).
        decode: ``False`` is raw-bytes mode: no workers, no decoding, bytes fields
            come as lists of zero-copy memoryviews over the shards.
        image_field: the field to decode (default: the first jpeg/image field).
        fields: fields to return (default: all).
        on_error: ``"fail"`` raises on a corrupt image, naming shard and record;
            ``"skip"`` zero-fills the sample, marks it False in the batch's
            ``valid`` mask (a bool array, present only in this mode) and counts it.
            Resolved once into :attr:`bad_input`, the one policy every builder
            calls (:mod:`reader.transforms.bad_input`).
        check_crc: verify the CRC32C of every field of every record read (images,
            labels, keys), so a damaged record is an error naming shard and record,
            never a wrong value. On by default: CRC32C runs at tens of GB/s, far
            ahead of decoding (BENCHMARKS.md measures the cost); False skips it.
        decoded_cache: keep decoded images in memory shared by the workers and
            crop later epochs from them (:class:`reader.runtime.decoded_cache.DecodedCacheOptions`:
            the byte bound, a pre-shrink, an optional file); None decodes every time.
        annotations: which fields follow the image's geometry
            (:class:`reader.Annotations`); None finds ``boxes``, the per-box
            fields, ``keypoints`` and ``mask`` fields by name and shape.
        decoders: field -> :class:`reader.FieldDecoder`: bytes fields decoded in
            the workers by a user callable (audio, ...), batched like arrays.
        collate: how varying-size fields are batched, field -> ``"padded"``,
            ``"ragged"`` or :class:`reader.Padded` (see :mod:`reader.transforms.collate`);
            by default images are padded and arrays ragged.
        max_pixels: the pixel budget: an image (or mask) whose header declares more
            pixels is refused before anything is allocated, a ``CorruptRecordError``
            naming shard and record (or skipped, with ``on_error="skip"``). None:
            :data:`formats.media.MAX_PIXELS` (2^28, what ``pack-dataset`` admits by
            default); raise it to read a dataset packed with ``--max-pixels N``. The
            budget is the reader's to set, never the dataset's.
    """

    transform: Any = None
    decode: bool = True
    image_field: str | None = None
    fields: tuple[str, ...] | None = None
    on_error: str = "fail"
    check_crc: bool = True
    decoded_cache: Any = None
    annotations: Any = None
    collate: Any = None
    decoders: Any = None
    max_pixels: int | None = None

    def __post_init__(self) -> None:
        _check_transform(self.transform)
        if self.annotations is not None and not isinstance(self.annotations, Annotations):
            raise ArgumentTypeError("annotations must be a reader.Annotations or None, "
                                    f"not {type(self.annotations).__name__} {self.annotations!r}")
        if self.collate is not None:
            set_field(self, "collate", check_collate(self.collate))
        if self.decoders is not None and (not isinstance(self.decoders, dict) or not all(
                isinstance(k, str) and isinstance(v, FieldDecoder)
                for k, v in self.decoders.items())):
            raise ArgumentTypeError("decoders must be a dict of field name -> reader.FieldDecoder, "
                                    f"not {self.decoders!r}")
        if self.decoded_cache is not None and not isinstance(self.decoded_cache,
                                                             DecodedCacheOptions):
            raise ArgumentTypeError("decoded_cache must be a reader.DecodedCacheOptions or None, "
                                    f"not {type(self.decoded_cache).__name__}")
        set_field(self, "decode", check_bool("decode", self.decode))
        set_field(self, "check_crc", check_bool("check_crc", self.check_crc))
        if self.max_pixels is not None:
            set_field(self, "max_pixels", check_int("max_pixels", self.max_pixels, 1))
        check_choice("on_error", self.on_error, ON_ERROR)
        if self.image_field is not None and not isinstance(self.image_field, str):
            raise ArgumentTypeError(f"image_field must be a field name (str) or None, "
                            f"not {type(self.image_field).__name__} {self.image_field!r}")
        if self.fields is not None:
            if isinstance(self.fields, (str, bytes)) or not hasattr(self.fields, "__iter__"):
                raise ArgumentTypeError(f"fields must be a tuple of field names or None, not "
                                f"{type(self.fields).__name__} {self.fields!r}"
                                + (f" (one field: fields=({self.fields!r},))"
                                   if isinstance(self.fields, str) else ""))
            fields = tuple(self.fields)
            bad = [f for f in fields if not isinstance(f, str)]
            if bad:
                raise ArgumentTypeError(f"fields must be field names (str), not {bad[0]!r} "
                                f"({type(bad[0]).__name__})")
            if not fields:
                raise ArgumentError("fields must name at least one field (None: all of them)")
            twice = sorted({f for f in fields if fields.count(f) > 1})
            if twice:
                raise ArgumentError(f"fields names {twice[0]!r} more than once: {fields!r}")
            set_field(self, "fields", fields)
        if self.image_field is not None and self.fields is not None \
                and self.image_field not in self.fields:
            raise ArgumentError(f"image_field={self.image_field!r} is not among fields={self.fields!r}: "
                             "add it to fields, or leave image_field out")

    @property
    def bad_input(self) -> BadInput:
        """``on_error`` as the policy every builder of a batch calls."""
        return BadInput(self.on_error)


@dataclass(frozen=True)
class WorkerOptions:
    """Processes and memory.

    Args:
        num_workers: worker processes (0 builds batches in the main process);
            ``"auto"`` starts with one per core (leaving one for the main process on
            machines with more than 4), then measures and adjusts the count while
            the loader runs (:mod:`reader.runtime.autoscale`).
        prefetch: batches in flight (issued, not yet consumed); ``"auto"`` adapts
            the depth between ``num_workers`` and ``max_prefetch`` so the consumer
            rarely waits.
        max_prefetch: the ring is allocated for this many batches in flight
            (default ``4 * num_workers``, at least 2), bounded by ``max_ring_bytes``.
        max_ring_bytes: memory bound of the shared batch ring.
        timeout: seconds without any batch before
            :class:`reader.errors.LoaderTimeoutError`, whose message says what each
            worker is doing (stopped, busy, asleep); None: a stopped worker is an
            error once a batch is ``reader.runtime.epoch.LATE_FACTOR`` times later than the
            slowest so far, slow or blocked ones are reported and waited for.
        start_method: ``"fork"`` (Linux default) or ``"spawn"``.
        copy: return owned arrays instead of views of the shared ring.
        persistent_workers: keep the worker processes from one epoch to the next
            (like torch's DataLoader option) instead of starting them per epoch.
            Start-up then costs once, not in every epoch's first waits, which
            matters for short epochs. The price: idle workers hold their memory
            between epochs until ``Loader.close()`` (or the loader is garbage
            collected), and an epoch left early (``break``) first waits for the
            batches its workers are building, at most ``reader.runtime.epoch.DRAIN_S``
            seconds, before the next one may start. An error or a dead worker
            still stops them all; the next epoch starts fresh ones.
    """

    num_workers: int | str = "auto"
    prefetch: int | str = "auto"
    max_prefetch: int | None = None
    max_ring_bytes: int = DEFAULT_RING_BYTES
    timeout: float | None = None
    start_method: str | None = None
    copy: bool = False
    persistent_workers: bool = False

    def __post_init__(self) -> None:
        set_field(self, "num_workers", check_int_or_auto("num_workers", self.num_workers, 0))
        # At least one batch in flight: 0 could never deliver one.
        set_field(self, "prefetch", check_int_or_auto("prefetch", self.prefetch, 1))
        if self.max_prefetch is not None:
            set_field(self, "max_prefetch", check_int("max_prefetch", self.max_prefetch, 1))
            if self.prefetch != "auto" and self.prefetch > self.max_prefetch:
                raise ArgumentError(f"prefetch={self.prefetch} is more than max_prefetch="
                                 f"{self.max_prefetch}, the batches the ring is sized for")
        set_field(self, "max_ring_bytes", check_int("max_ring_bytes", self.max_ring_bytes, 1))
        if self.timeout is not None:
            t = self.timeout
            if isinstance(t, (bool, np.bool_)) or not isinstance(t, numbers.Real):
                raise ArgumentTypeError(f"timeout must be a number of seconds > 0 or None, "
                                f"not {type(t).__name__} {t!r}")
            if math.isnan(t) or t <= 0:
                raise ArgumentError(f"timeout must be a number of seconds > 0 or None, not {t!r}")
            set_field(self, "timeout", float(t))
        if self.start_method is not None:
            check_choice("start_method", self.start_method, ("fork", "spawn", "forkserver"))
        set_field(self, "copy", check_bool("copy", self.copy))
        set_field(self, "persistent_workers", check_bool("persistent_workers", self.persistent_workers))


def resolve_num_workers(value: int | str) -> int:
    """``"auto"``: one worker per usable core, keeping one for the main process above 4 cores."""
    if value != "auto":
        return int(value)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores - 1 if cores > 4 else cores
