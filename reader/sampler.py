"""The epoch order: a pure function of (seed, epoch, rank, world_size).

Batch ``k`` of an epoch is fixed before any worker runs, so batches are the same
for any number of workers, and resuming at batch ``k`` is exact: the state is
just (epoch, next batch). Ranks split one global order after it is padded by
wrapping or truncated, so every rank gets the same number of batches: by
interleaving (rank ``r`` takes positions ``r, r + W, r + 2W, ...``), except for
the ``"block"`` order, where rank ``r`` takes the ``r``-th contiguous run. The
block order is built from whole shards, so a contiguous run touches only about
``1/W`` of the shards: a rank reading through a cache downloads only those.
"""

from __future__ import annotations

import math

import numpy as np

from .options import SamplerOptions

__all__ = ["Sampler"]


class Sampler:
    """Record indices per batch for one rank.

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
        w = options.world_size
        if options.drop_last:
            self.num_samples = self.num_records // w
            self.num_batches = self.num_samples // self.batch_size
        else:
            self.num_samples = math.ceil(self.num_records / w)
            self.num_batches = math.ceil(self.num_samples / self.batch_size)
        self._cache: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.num_batches

    @property
    def partition(self) -> str:
        """How ranks split the order: ``contiguous`` runs (block order) or ``interleaved``."""
        return "contiguous" if self.options.shuffle == "block" else "interleaved"

    def global_order(self, epoch: int) -> np.ndarray:
        """The whole epoch's order (all ranks), before padding or truncation."""
        n = self.num_records
        mode = self.options.shuffle
        if not mode:
            return np.arange(n, dtype=np.int64)
        rng = np.random.default_rng([self.options.seed, int(epoch)])
        if mode == "full":
            return rng.permutation(n).astype(np.int64, copy=False)
        # "block": shards in random order, then records shuffled within windows.
        starts = self.shard_starts
        shards = rng.permutation(len(starts) - 1)
        order = np.concatenate(
            [np.arange(starts[s], starts[s + 1], dtype=np.int64) for s in shards]
        ) if len(shards) else np.zeros(0, np.int64)
        w = self.options.window
        full = (n // w) * w
        if full:
            order[:full] = rng.permuted(order[:full].reshape(-1, w), axis=1).reshape(-1)
        if full < n:
            order[full:] = rng.permutation(order[full:])
        return order

    def rank_indices(self, epoch: int) -> np.ndarray:
        """This rank's records for ``epoch``, in delivery order (cached for one epoch)."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        order = self.global_order(epoch)
        w, r = self.options.world_size, self.options.rank
        total = self.num_samples * w
        if total > len(order):
            order = np.resize(order, total)  # wraps around to the start of the order
        if self.options.shuffle == "block":
            mine = order[r * self.num_samples : (r + 1) * self.num_samples]
        else:
            mine = order[r:total:w]
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
