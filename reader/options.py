"""The Loader's option records, all of them, and the value checks they run.

Every option is a keyword of :class:`reader.Loader` (one way to pass each); the
Loader checks them into these frozen dataclasses, which the order, the pipeline,
the workers and the runtime take whole: :class:`SamplerOptions` (the order),
:class:`DecodeOptions` (decoding), :class:`WorkerOptions` (processes and memory),
:class:`DecodedCacheOptions` (the decoded-sample cache) and :class:`DeviceOptions`
(the GPU path).

This module sits at the bottom of :mod:`reader`: it imports no module of the
reader, so every layer (the order, the pipeline, the runtime, the Loader) imports
its records from here without a circle and without a lazy import. Each record
checks its values where it is made (``__post_init__``), so a wrong one fails at
construction with a message naming it and its value, never later in a worker.
The checks that need a type of a layer above (a transform spec, an
``Annotations``, a ``FieldDecoder``, a collate mode) live beside those types
(:func:`reader.transforms.checks.check_pipeline_options`) and the Loader runs them
at construction, before it builds :class:`DecodeOptions`.
:func:`check_batch_size` and :func:`check_fields` are the checks the Loader
applies beside these records: the batch size, and field names against a
dataset's schema.

The type rules of every check: ``bool`` is not an int (``num_workers=True`` is
refused), a ``str`` is never a number (``batch_size="32"`` is refused), numpy
integers and booleans count as ints and bools and are stored as Python ones.
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

__all__ = ["DecodeOptions", "DecodedCacheOptions", "DeviceOptions", "SamplerOptions",
           "WorkerOptions", "check_batch_size", "check_fields", "resolve_num_workers"]

SHUFFLE_MODES = (False, "block", "full")
ON_ERROR = ("fail", "skip", "replace")  # on_error's values; reader.transforms.bad_input acts on them
# The Loader's default bound of the ring (WorkerOptions.max_ring_bytes): a ring this
# size that cannot hold one batch gives way to one batch in flight instead of failing
# (reader.runtime.runtime).
DEFAULT_RING_BYTES = 2 << 30
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def check_int(name: str, value: Any, minimum: int | None = None, extra: str = "") -> int:
    """``value`` as an int (``bool`` and ``str`` refused), at least ``minimum``;
    ``extra`` completes "must be an int" in messages (e.g. " or 'auto'")."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        what = "an int" + (f" >= {minimum}" if minimum is not None else "") + extra
        raise ArgumentTypeError(f"{name} must be {what}, not {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ArgumentError(f"{name} must be an int >= {minimum}{extra}, not {value}")
    return value


def check_count(value: Any, what: str = "a state's count") -> int:
    """``value`` as an int >= 0, for a saved state's counts (a bool, a float or a
    negative one is damage: :func:`check_int`'s errors, which the state's reader turns
    into a ``StateError``)."""
    return check_int(what, value, 0)


def check_int_or_auto(name: str, value: Any, minimum: int) -> int | str:
    if isinstance(value, str):
        if value == "auto":
            return value
        raise ArgumentError(f"{name} must be an int >= {minimum} or 'auto', not {value!r}")
    return check_int(name, value, minimum, " or 'auto'")


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be True or False, not {type(value).__name__} {value!r}")
    return bool(value)


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        options = ", ".join(map(repr, allowed))
        raise (ArgumentError if isinstance(value, str) else ArgumentTypeError)(
            f"{name} must be one of {options}, not {value!r}")
    return value


def set_field(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # frozen dataclasses: normalized in __post_init__


def check_batch_size(value: Any) -> int:
    """The Loader's ``batch_size`` as an int >= 1.

    Raises:
        TypeError: not an int (a ``bool``, a ``str`` such as ``"32"``, a float).
        ValueError: an int below 1.
    """
    return check_int("batch_size", value, 1)


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        return int(text)
    except ValueError:
        raise ArgumentError(f"environment variable {name}={text!r} is not an integer") from None


@dataclass(frozen=True)
class SamplerOptions:
    """Which records, in which order, for which rank.

    Args:
        shuffle: ``False`` (storage order), ``"block"`` (shard order shuffled, then
            records shuffled within windows of ``shuffle_window`` consecutive records:
            near-sequential IO with good mixing) or ``"full"`` (a global
            permutation). ``True`` means ``"full"``.
        seed: the order is a pure function of (seed, epoch, rank, world_size).
        drop_last: ``True`` drops the tail so every rank gets ``len // world_size``
            records and drops a last partial batch; ``False`` pads by wrapping to
            the start of the epoch's order (like torch's DistributedSampler) so
            every rank gets ``ceil(len / world_size)`` records, and yields the last
            partial batch. Either way every rank gets the same number of batches.
        rank: this process's rank in ``[0, world_size)``; ``None``: ``$RANK`` (as
            torchrun sets it), else 0.
        world_size: number of ranks splitting each epoch; ``None``:
            ``$WORLD_SIZE``, else 1.
        shuffle_window: records per shuffle window for ``"block"`` (refused with the
            other modes).
    """

    shuffle: bool | str = False
    seed: int = 0
    drop_last: bool = False
    rank: int | None = None
    world_size: int | None = None
    shuffle_window: int = 4096

    def __post_init__(self) -> None:
        shuffle = self.shuffle
        if isinstance(shuffle, (bool, np.bool_)):
            shuffle = "full" if shuffle else False
        elif not isinstance(shuffle, str) or shuffle not in SHUFFLE_MODES:
            raise (ArgumentError if isinstance(shuffle, str) else ArgumentTypeError)(
                f"shuffle must be False, True, 'block' or 'full', not {shuffle!r}")
        set_field(self, "shuffle", shuffle)
        set_field(self, "seed", check_int("seed", self.seed, 0))
        set_field(self, "drop_last", check_bool("drop_last", self.drop_last))
        world_size = (_env_int("WORLD_SIZE", 1) if self.world_size is None
                      else check_int("world_size", self.world_size, 1))
        rank = _env_int("RANK", 0) if self.rank is None else check_int("rank", self.rank)
        if world_size < 1 or not 0 <= rank < world_size:
            raise ArgumentError(f"rank {rank} is not in [0, world_size={world_size})")
        set_field(self, "rank", rank)
        set_field(self, "world_size", world_size)
        set_field(self, "shuffle_window", check_int("shuffle_window", self.shuffle_window, 1))
        if shuffle != "block" and self.shuffle_window != SamplerOptions.shuffle_window:
            raise ArgumentError(f"shuffle_window={self.shuffle_window} would have no effect: it "
                             f"sizes the windows of shuffle='block', and shuffle={shuffle!r}")


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
            ``valid`` mask (a bool array, present in this mode and ``"replace"``) and
            counts it; ``"replace"`` puts a record of the same source, drawn as a pure
            function of the seed and the bad record, in its place (also for a record
            that fails its checksum), so batches and resumes stay exact. Resolved
            once, when the batch is planned, into the one policy every builder calls
            (:class:`reader.transforms.bad_input.BadInput`).
        check_crc: verify the CRC32C of every field of every record read (images,
            labels, keys), so a damaged record is an error naming shard and record,
            never a wrong value. On by default: CRC32C runs at tens of GB/s, far
            ahead of decoding (BENCHMARKS.md measures the cost); False skips it.
        decoded_cache: keep decoded images in memory shared by the workers and
            crop later epochs from them (:class:`DecodedCacheOptions`:
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
            naming shard and record (or skipped or replaced, with ``on_error``). None:
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
        # transform, annotations, collate and decoders are checked against the
        # pipeline's types by reader.transforms.checks, which the Loader runs first.
        if isinstance(self.collate, dict):
            set_field(self, "collate", dict(self.collate))  # the caller's dict may change later
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


@dataclass(frozen=True)
class DecodedCacheOptions:
    """How much decoded image data to keep, at what size, and where.

    Args:
        max_bytes: the bound on cached pixels (bytes). Must hold at least one
            output-sized image.
        short_side: keep images DCT-shrunk (by 2, 4 or 8) as long as their short
            side stays at least this; None keeps them at full size. Less memory,
            but a crop that the uncached path decodes at a finer scale than the
            cached one is decoded again every time (the pixels stay exact).
        path: a file to hold the cache (a local disk, for a cache larger than
            RAM); it must not exist, and is deleted at ``Loader.close()``. None:
            shared memory.
    """

    max_bytes: int
    short_side: int | None = None
    path: str | Path | None = None

    def __post_init__(self) -> None:
        for name in ("max_bytes", "short_side"):
            v = getattr(self, name)
            if v is None and name == "short_side":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ArgumentTypeError(f"{name} must be an int >= 1, not {v!r}")
        if self.path is not None and not isinstance(self.path, (str, os.PathLike)):
            raise ArgumentTypeError(f"path must be a file path or None, not {self.path!r}")


@dataclass(frozen=True)
class DeviceOptions:
    """How batches look on the GPU.

    Args:
        dtype: image dtype on the GPU: ``float16``, ``float32`` or ``uint8`` (no
            normalization; images always travel as uint8, 4x less than float32).
        layout: ``NCHW`` or ``NHWC``.
        mean: per-channel mean on the 0..255 scale (``(x - mean) / std``).
        std: per-channel standard deviation on the 0..255 scale.
        output: ``cupy`` arrays, or ``torch`` tensors through DLPack (zero-copy).
        pinning: ``auto`` (register the ring, fall back to staging), ``register``
            (fail if registration fails) or ``staging``.
        device_id: the GPU; default: ``LOCAL_RANK`` from the environment, else the
            loader's rank modulo the GPU count.
        decode_device: where JPEGs are decoded (:mod:`reader.runtime.gpu_decode`):
            ``"cpu"`` in the workers, as always; ``"cuda"`` on this GPU through
            nvImageCodec (``pip install 'shardpack[gpu-decode]'``), each batch split
            between the GPU and the CPU workers by measured rates (``gpu_share``);
            refused, saying why, where the GPU path cannot make the same batch (a
            pipeline other than fixed-size geometry and flips, detection annotations,
            a decoded cache, ``on_error="replace"``). ``"auto"`` (the default): ``"cuda"``
            where nvImageCodec imports and the pipeline qualifies, else ``"cpu"``,
            decided once when the Loader is built. These options exist only with
            ``device="cuda"``: a CPU loader has no device to decode on.
        gpu_share: the fraction of each batch decoded on the GPU: None (default) lets
            the runtime choose it from the measured rates of the two sides
            (:mod:`reader.runtime.split`); a number in [0, 1] fixes it (1.0: the GPU
            alone; 0.0 measures the CPU side through the same slot layout). Only with
            ``decode_device`` ``"cuda"`` or ``"auto"``.
    """

    dtype: str = "float16"
    layout: str = "NCHW"
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    output: str = "cupy"
    pinning: str = "auto"
    device_id: int | None = None
    decode_device: str = "auto"
    gpu_share: float | None = None

    def __post_init__(self) -> None:
        check_choice("decode_device", self.decode_device, ("cpu", "cuda", "auto"))
        if self.gpu_share is not None:
            g = self.gpu_share
            if isinstance(g, (bool, np.bool_)) or not isinstance(g, numbers.Real) \
                    or math.isnan(g) or not 0.0 <= g <= 1.0:
                raise ArgumentError(f"gpu_share must be a number in [0, 1] or None (measured), "
                                    f"not {g!r}")
            if self.decode_device == "cpu":
                raise ArgumentError(f"gpu_share={g} would have no effect: decode_device='cpu' "
                                    "decodes every image in the workers")
            set_field(self, "gpu_share", float(g))
        if self.dtype not in ("float16", "float32", "uint8"):
            raise ArgumentError(f"dtype must be float16, float32 or uint8, not {self.dtype!r}")
        if self.layout not in ("NCHW", "NHWC"):
            raise ArgumentError(f"layout must be NCHW or NHWC, not {self.layout!r}")
        if self.output not in ("cupy", "torch"):
            raise ArgumentError(f"output must be cupy or torch, not {self.output!r}")
        if self.pinning not in ("auto", "register", "staging"):
            raise ArgumentError(f"pinning must be auto, register or staging, not {self.pinning!r}")
        if len(self.mean) != len(self.std) or any(s == 0 for s in self.std):
            raise ArgumentError("mean and std need one non-zero std per channel")
