"""Loader options, grouped: what order, how to decode, how many processes.

The common knobs (batch size, workers, prefetch, shuffle, seed, drop_last, rank,
world_size) are keywords of :class:`reader.Loader` itself; these frozen
dataclasses hold the rest and can be passed whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["DecodeOptions", "SamplerOptions", "WorkerOptions", "resolve_num_workers"]

SHUFFLE_MODES = (False, "block", "full")


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not an integer") from None


@dataclass(frozen=True)
class SamplerOptions:
    """Which records, in which order, for which rank.

    Args:
        shuffle: ``False`` (storage order), ``"block"`` (shard order shuffled, then
            records shuffled within windows of ``window`` consecutive records:
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
        window: records per shuffle window for ``"block"``.
    """

    shuffle: bool | str = False
    seed: int = 0
    drop_last: bool = False
    rank: int | None = None
    world_size: int | None = None
    window: int = 4096

    def __post_init__(self) -> None:
        shuffle = "full" if self.shuffle is True else self.shuffle
        if shuffle not in SHUFFLE_MODES:
            raise ValueError(f"shuffle must be False, True, 'block' or 'full', not {self.shuffle!r}")
        object.__setattr__(self, "shuffle", shuffle)
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int, not {self.seed!r}")
        if self.rank is None:
            object.__setattr__(self, "rank", _env_int("RANK", 0))
        if self.world_size is None:
            object.__setattr__(self, "world_size", _env_int("WORLD_SIZE", 1))
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, world_size={self.world_size})")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, not {self.window}")


@dataclass(frozen=True)
class DecodeOptions:
    """How records become arrays.

    Args:
        transform: the image pipeline (from :mod:`reader.transforms`), a list of
            transform specs to build one from, or None. Decoding images needs a
            pipeline with a fixed output shape (e.g. ``RandomResizedCrop(224)`` or
            ``CenterCrop(224)``); without one, image fields come as raw bytes.
        decode: ``False`` is raw-bytes mode: no workers, no decoding, bytes fields
            come as lists of zero-copy memoryviews over the shards.
        image_field: the field to decode (default: the first jpeg/image field).
        fields: fields to return (default: all).
        on_error: ``"fail"`` raises on a corrupt image, naming shard and record;
            ``"skip"`` zero-fills the sample, marks it False in the batch's
            ``valid`` mask (a bool array, present only in this mode) and counts it.
        check_crc: verify the CRC32C of every field of every record read (images,
            labels, keys), so a damaged record is an error naming shard and record,
            never a wrong value. On by default: CRC32C runs at tens of GB/s, far
            ahead of decoding (BENCHMARKS.md measures the cost); False skips it.
    """

    transform: Any = None
    decode: bool = True
    image_field: str | None = None
    fields: tuple[str, ...] | None = None
    on_error: str = "fail"
    check_crc: bool = True

    def __post_init__(self) -> None:
        if self.on_error not in ("fail", "skip"):
            raise ValueError(f"on_error must be 'fail' or 'skip', not {self.on_error!r}")
        if self.fields is not None:
            object.__setattr__(self, "fields", tuple(self.fields))


@dataclass(frozen=True)
class WorkerOptions:
    """Processes and memory.

    Args:
        num_workers: worker processes (0 builds batches in the main process);
            ``"auto"`` picks one per core, leaving one for the main process on
            machines with more than 4.
        prefetch: batches in flight (issued, not yet consumed); ``"auto"`` adapts
            the depth between ``num_workers`` and ``max_prefetch`` so the consumer
            rarely waits.
        max_prefetch: the ring is allocated for this many batches in flight
            (default ``4 * num_workers``, at least 2), bounded by ``max_ring_bytes``.
        max_ring_bytes: memory bound of the shared batch ring.
        timeout: seconds without any batch (all workers alive) before
            :class:`reader.errors.LoaderTimeoutError`; None waits for ever.
        start_method: ``"fork"`` (Linux default) or ``"spawn"``.
        copy: return owned arrays instead of views of the shared ring.
        persistent_workers: keep the worker processes from one epoch to the next
            (like torch's DataLoader option) instead of starting them per epoch.
            Start-up then costs once, not in every epoch's first waits, which
            matters for short epochs. The price: idle workers hold their memory
            between epochs until ``Loader.close()`` (or the loader is garbage
            collected), and an epoch left early (``break``) first waits for the
            batches its workers are building, at most ``reader.epoch.DRAIN_S``
            seconds, before the next one may start. An error or a dead worker
            still stops them all; the next epoch starts fresh ones.
    """

    num_workers: int | str = "auto"
    prefetch: int | str = "auto"
    max_prefetch: int | None = None
    max_ring_bytes: int = 2 << 30
    timeout: float | None = None
    start_method: str | None = None
    copy: bool = False
    persistent_workers: bool = False

    def __post_init__(self) -> None:
        if self.num_workers != "auto" and (not isinstance(self.num_workers, int) or self.num_workers < 0):
            raise ValueError(f"num_workers must be an int >= 0 or 'auto', not {self.num_workers!r}")
        if self.prefetch != "auto" and (not isinstance(self.prefetch, int) or self.prefetch < 1):
            raise ValueError(f"prefetch must be an int >= 1 or 'auto', not {self.prefetch!r}")
        if self.start_method not in (None, "fork", "spawn", "forkserver"):
            raise ValueError(f"start_method must be 'fork', 'spawn' or 'forkserver', not {self.start_method!r}")


def resolve_num_workers(value: int | str) -> int:
    """``"auto"``: one worker per usable core, keeping one for the main process above 4 cores."""
    if value != "auto":
        return int(value)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores - 1 if cores > 4 else cores
