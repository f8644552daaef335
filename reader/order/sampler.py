"""The epoch order: a pure function of (seed, epoch, rank, world_size).

Batch ``k`` of an epoch is fixed before any worker runs, so batches are the same
for any number of workers, and resuming at batch ``k`` is exact: the state is
just (epoch, next batch). Ranks split one global order after it is padded by
wrapping or truncated, so every rank gets the same number of batches: by
interleaving (rank ``r`` takes positions ``r, r + W, r + 2W, ...``), except for
the ``"block"`` order, where rank ``r`` takes the ``r``-th contiguous run. The
block order is built from whole shards, so a contiguous run touches only about
``1/W`` of the shards: a rank reading through a cache downloads only those.

:func:`shuffled_order` and :func:`rank_positions` are the two halves of that
rule, shared with the size-aware batches of :mod:`reader.batching`, which split
a global list of *batches* among ranks the same way this sampler splits records.
"""

from __future__ import annotations

import math

import numpy as np

from ..options import SamplerOptions

__all__ = ["Sampler", "next_unseen", "per_rank", "rank_positions", "shuffled_order"]


def shuffled_order(num_records: int, shard_starts: np.ndarray, options: SamplerOptions,
                   epoch: int) -> np.ndarray:
    """The whole epoch's record order (all ranks), before padding or truncation."""
    n = num_records
    mode = options.shuffle
    if not mode:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng([options.seed, int(epoch)])
    if mode == "full":
        return rng.permutation(n).astype(np.int64, copy=False)
    # "block": shards in random order, then records shuffled within windows.
    starts = shard_starts
    shards = rng.permutation(len(starts) - 1)
    order = np.concatenate(
        [np.arange(starts[s], starts[s + 1], dtype=np.int64) for s in shards]
    ) if len(shards) else np.zeros(0, np.int64)
    w = options.shuffle_window
    full = (n // w) * w
    if full:
        order[:full] = rng.permuted(order[:full].reshape(-1, w), axis=1).reshape(-1)
    if full < n:
        order[full:] = rng.permutation(order[full:])
    return order


def next_unseen(order, epoch: int, batch: int) -> tuple[int, int]:
    """(epoch, batch) of the next unseen batch of ``order`` (a :class:`Sampler` or bound
    batches): past an epoch's last batch, the next epoch's first, so a state saved
    after the last batch never replays an epoch."""
    if batch >= order.num_batches_in(epoch):
        return epoch + 1, 0
    return epoch, batch


def per_rank(n: int, options: SamplerOptions) -> int:
    """Items each rank gets from a global sequence of ``n``: ``n // W`` with
    ``drop_last``, else ``ceil(n / W)`` (the sequence padded by wrapping)."""
    w = options.world_size
    return n // w if options.drop_last else -(-n // w)


def rank_positions(n: int, options: SamplerOptions) -> np.ndarray:
    """Positions in a global sequence of ``n`` items that this rank takes, in order.

    The sequence is padded by wrapping to its start (or truncated, with
    ``drop_last``) to ``per_rank(n) * W`` items; rank ``r`` then takes positions
    ``r, r + W, ...`` (interleaved), or the ``r``-th contiguous run for the
    ``"block"`` order.
    """
    w, r = options.world_size, options.rank
    each = per_rank(n, options)
    if each == 0:
        return np.zeros(0, np.int64)
    if options.shuffle == "block":
        pos = np.arange(r * each, (r + 1) * each, dtype=np.int64)
    else:
        pos = np.arange(r, each * w, w, dtype=np.int64)
    return pos % n if each * w > n else pos


class Sampler:
    """Record indices per batch for one rank.

    Its members are the batch-order interface the Loader uses, which the bound
    batches of :mod:`reader.batching` offer too: ``num_batches_in(epoch)``,
    ``batch(epoch, k)``, ``rank_indices(epoch)`` with ``rank_offsets(epoch)``,
    ``partition``, ``max_batch_size`` and ``describe()``.

    Args:
        num_records: dataset length.
        shard_starts: prefix sums of records per shard (``ShardDataset.starts``),
            used by the ``"block"`` order.
        batch_size: records per batch.
        options: order and partitioning.
    """

    def __init__(self, num_records: int, shard_starts, batch_size: int,
                 options: SamplerOptions) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        self.num_records = int(num_records)
        self.shard_starts = np.asarray(shard_starts, np.int64)
        self.batch_size = int(batch_size)
        self.options = options
        self.num_samples = per_rank(self.num_records, options)
        if options.drop_last:
            self.num_batches = self.num_samples // self.batch_size
        else:
            self.num_batches = math.ceil(self.num_samples / self.batch_size)
        self._cache: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.num_batches

    @property
    def max_batch_size(self) -> int:
        """The most records one batch holds."""
        return self.batch_size

    def num_batches_in(self, epoch: int) -> int:
        """Batches in ``epoch`` for this rank (the same in every epoch here)."""
        return self.num_batches

    def rank_offsets(self, epoch: int) -> np.ndarray:
        """Where each batch starts in :meth:`rank_indices` (``num_batches + 1`` values)."""
        n = len(self.rank_indices(epoch))
        return np.minimum(np.arange(self.num_batches + 1, dtype=np.int64) * self.batch_size, n)

    def describe(self) -> dict:
        """Everything the order depends on (a resumed state must agree on all of it)."""
        o = self.options
        return {"seed": o.seed, "shuffle": o.shuffle, "window": o.shuffle_window, "rank": o.rank,
                "world_size": o.world_size, "drop_last": o.drop_last,
                "batch_size": self.batch_size, "num_records": self.num_records,
                "partition": self.partition}

    @property
    def partition(self) -> str:
        """How ranks split the order: ``contiguous`` runs (block order) or ``interleaved``."""
        return "contiguous" if self.options.shuffle == "block" else "interleaved"

    def global_order(self, epoch: int) -> np.ndarray:
        """The whole epoch's order (all ranks), before padding or truncation."""
        return shuffled_order(self.num_records, self.shard_starts, self.options, epoch)

    def rank_indices(self, epoch: int) -> np.ndarray:
        """This rank's records for ``epoch``, in delivery order (cached for one epoch)."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        order = self.global_order(epoch)
        mine = order[rank_positions(len(order), self.options)]
        if self.options.drop_last:
            mine = mine[: self.num_batches * self.batch_size]
        mine = np.ascontiguousarray(mine)
        self._cache = (epoch, mine)
        return mine

    def batch(self, epoch: int, k: int) -> np.ndarray:
        """Record indices of batch ``k`` of ``epoch``."""
        if not 0 <= k < self.num_batches:
            raise IndexError(f"batch {k} out of range for an epoch of {self.num_batches} batches")
        b = self.batch_size
        return self.rank_indices(epoch)[k * b : (k + 1) * b]
