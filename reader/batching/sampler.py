"""The epoch order: a pure function of (seed, epoch, rank, world_size).

Batch ``k`` of an epoch is fixed before any worker runs, so batches are the same
for any number of workers, and resuming at batch ``k`` is exact: the state is
just (epoch, next batch). Ranks split one global order after it is padded by
wrapping or truncated, so every rank gets the same number of batches: by
interleaving (rank ``r`` takes positions ``r, r + W, r + 2W, ...``), except for
the ``"block"`` order, where rank ``r`` takes the ``r``-th contiguous run. The
block order is built from whole shards, so a contiguous run touches only about
``1/W`` of the shards: a rank reading through a cache downloads only those.

The global order is never stored: :class:`EpochOrder` gives the record at any
position (O(1) each, O(shards) to set up), and :func:`rank_positions` a rank's
positions by arithmetic, so a batch costs O(batch size) at any dataset size and
workers receive a batch's records, never the epoch's order. The size-aware batches
of :mod:`reader.batching`, which group every record of the epoch, draw the whole
order (:func:`shuffled_order`) and split their global list of *batches* among ranks
the same way this sampler splits records.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import numpy as np

from formats.errors import ArgumentError

from ..errors import StateError
from ..options import SamplerOptions, check_int
from .permutation import WindowPermutations, permute, round_keys

__all__ = ["ORDER", "EpochOrder", "Sampler", "check_resume", "next_unseen", "per_rank",
           "rank_positions", "shuffled_order"]


# Names the way a shuffled order is computed; a state saved under another (or none: the
# orders drawn whole by numpy, before this name existed) cannot resume exactly.
ORDER = "computed-1"
_WINDOWS = 0x77696E646F77  # separates the windows' permutations from the shards' order


class EpochOrder:
    """One epoch's record order (all ranks, before padding) as a function of position.

    Nothing here grows with the records: ``"full"`` is a keyed bijection on
    ``[0, n)`` (:mod:`reader.batching.permutation`); ``"block"`` keeps the shard
    permutation and its prefix sums (12 bytes a shard) and permutes each window of
    ``window`` positions of the shards' concatenation when it is reached
    (:class:`~reader.batching.permutation.WindowPermutations`); ``window=None``
    makes every shard its own window (the blocks of a token stream). ``cache`` bounds
    the windows' permutations kept (elements: 8 bytes each), so several orders alive
    at once (a mixture's sources) can share one budget.
    """

    def __init__(self, num_records: int, shard_starts: np.ndarray, options: SamplerOptions,
                 epoch: int, *, stream: int = 0, window: int | str | None = "options",
                 cache: int = 1 << 22) -> None:
        self.num_records = n = int(num_records)
        self.mode = options.shuffle or None
        self.window = options.shuffle_window if window == "options" else window
        if self.mode is None:
            return  # in storage order: no keys (numpy.random alone costs 8 ms to import)
        if self.mode == "full":
            self.keys = round_keys(options.seed, epoch, stream)
            return
        self.windows = WindowPermutations(options.seed, epoch, stream, _WINDOWS, cache=cache)
        starts = np.asarray(shard_starts, np.int64)
        rng = np.random.default_rng([options.seed, int(epoch), stream])
        count = len(starts) - 1
        # 12 bytes a shard: the permutation as int32 where it fits, and the prefix sums.
        self.shards = rng.permutation(count).astype(np.int32 if count < 1 << 31 else np.int64)
        self.shard_starts = starts
        self.ends = np.diff(starts)[self.shards]
        np.cumsum(self.ends, out=self.ends)  # where each shard of the shuffled sequence ends
        self.full = n - n % self.window if self.window else 0

    def records(self, positions) -> np.ndarray:
        """The records at ``positions`` (each in ``[0, num_records)``), int64."""
        p = np.asarray(positions, np.int64)
        if self.mode is None:
            return p.copy()
        if self.mode == "full":
            return permute(p, self.num_records, self.keys)
        if self.window is None:  # each shard its own window
            i = np.searchsorted(self.ends, p, side="right")
            s, begin, size = self._shard_at(i)
            return begin + self.windows(p - (self.ends[i] - size), size, s)
        w, full = self.window, self.full
        j = p // w
        size = np.where(p >= full, self.num_records - full, w)
        q = j * w + self.windows(p - j * w, size, j)
        i = np.searchsorted(self.ends, q, side="right")
        _, begin, size = self._shard_at(i)
        return begin + q - (self.ends[i] - size)

    def _shard_at(self, i: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The shards at places ``i`` of the shuffled sequence: (shard, first record, size)."""
        s = self.shards[i]
        begin = self.shard_starts[s]
        return s, begin, self.shard_starts[s + 1] - begin


def shuffled_order(num_records: int, shard_starts: np.ndarray, options: SamplerOptions,
                   epoch: int) -> np.ndarray:
    """The whole epoch's record order (all ranks), before padding or truncation: for
    the size-aware batches, which group every record of the epoch."""
    return EpochOrder(num_records, shard_starts, options, epoch).records(
        np.arange(num_records, dtype=np.int64))


def next_unseen(order, epoch: int, batch: int) -> tuple[int, int]:
    """(epoch, batch) of the next unseen batch of ``order`` (a :class:`Sampler` or bound
    batches): past an epoch's last batch, the next epoch's first, so a state saved
    after the last batch never replays an epoch."""
    if batch >= order.num_batches_in(epoch):
        return epoch + 1, 0
    return epoch, batch


def check_epoch(epoch, what: str) -> int:
    """``set_epoch``'s argument as an int >= 0 (numpy integers too; ``bool``, ``str``
    and floats refused, never truncated: ``set_epoch(1.5)`` is a mistake, not epoch 1);
    ``what`` names the reader in messages.

    Raises:
        ArgumentTypeError: not an integer.
        ArgumentError: a negative one.
    """
    return check_int(f"{what}.set_epoch(epoch): epoch", epoch, 0)


def check_resume(mine: dict, state, what: str) -> None:
    """Refuse ``state`` unless it is a state dict saved by an order equal to ``mine``
    (both ``state_dict()``s) in all but the position; ``what`` names the reader in
    messages.

    Raises:
        StateError: ``state`` is not a state dict (not a mapping, or without a
            non-negative int ``epoch`` and ``batch``), or names the first setting that
            differs.
    """
    if not isinstance(state, Mapping):
        raise StateError(f"{what} load_state_dict(state): state must be the dict that "
                         f"state_dict() returned, not {type(state).__name__} {state!r}")
    missing = [k for k in ("epoch", "batch") if k not in state]
    if missing:
        raise StateError(f"{what} load_state_dict(state): the state has no "
                         f"{' or '.join(map(repr, missing))}; pass the dict that "
                         f"state_dict() returned (it has {', '.join(map(repr, mine))})")
    for key in ("epoch", "batch"):
        v = state[key]
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral) or v < 0:
            raise StateError(f"{what} load_state_dict(state): state[{key!r}] must be an "
                             f"int >= 0, not {type(v).__name__} {v!r}")
    state = dict(state)
    if "order" not in state:
        if mine.get("shuffle"):
            raise StateError(
                f"{what} state was saved by a shardpack before {ORDER!r} shuffled orders "
                "(which drew the whole order from numpy): its shuffled epochs are not this "
                "version's, so it cannot resume exactly; start the saved epoch again with "
                f"set_epoch({state.get('epoch', 0)})")
        # Unshuffled orders did not change, and always interleaved ranks (states saved
        # before "partition" existed lack it).
        state["order"] = mine.get("order")
        state.setdefault("partition", "interleaved")
    for key in mine:
        if key in ("epoch", "batch", "num_batches"):
            continue
        if state.get(key) != mine[key]:
            raise StateError(f"{what} state was saved with {key}={state.get(key)!r}, this "
                             f"{what} has {key}={mine[key]!r}: cannot resume exactly")
    extra = sorted(set(state) - set(mine))
    if extra:
        raise StateError(f"{what} state was saved with {', '.join(extra)} (another batch "
                         f"sampler), which this {what} does not use: cannot resume exactly")


def per_rank(n: int, options: SamplerOptions) -> int:
    """Items each rank gets from a global sequence of ``n``: ``n // W`` with
    ``drop_last``, else ``ceil(n / W)`` (the sequence padded by wrapping)."""
    w = options.world_size
    return n // w if options.drop_last else -(-n // w)


def rank_positions(n: int, options: SamplerOptions, start: int = 0,
                   stop: int | None = None) -> np.ndarray:
    """Positions in a global sequence of ``n`` items that this rank takes, in order
    (its items ``start`` to ``stop``, by default all ``per_rank(n)`` of them).

    The sequence is padded by wrapping to its start (or truncated, with
    ``drop_last``) to ``per_rank(n) * W`` items; rank ``r`` then takes positions
    ``r, r + W, ...`` (interleaved), or the ``r``-th contiguous run for the
    ``"block"`` order.
    """
    w, r = options.world_size, options.rank
    each = per_rank(n, options)
    stop = each if stop is None else min(stop, each)
    if stop <= start:
        return np.zeros(0, np.int64)
    i = np.arange(start, stop, dtype=np.int64)
    pos = r * each + i if options.shuffle == "block" else r + i * w
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
            raise ArgumentError(f"batch_size must be >= 1, not {batch_size}")
        self.num_records = int(num_records)
        self.shard_starts = np.asarray(shard_starts, np.int64)
        self.batch_size = int(batch_size)
        self.options = options
        self.num_samples = per_rank(self.num_records, options)
        if options.drop_last:
            self.num_batches = self.num_samples // self.batch_size
        else:
            self.num_batches = math.ceil(self.num_samples / self.batch_size)
        self._order: tuple[int, EpochOrder] | None = None

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
        n = self.num_batches * self.batch_size if self.options.drop_last else self.num_samples
        return np.minimum(np.arange(self.num_batches + 1, dtype=np.int64) * self.batch_size, n)

    def describe(self) -> dict:
        """Everything the order depends on (a resumed state must agree on all of it)."""
        o = self.options
        return {"seed": o.seed, "shuffle": o.shuffle, "window": o.shuffle_window, "rank": o.rank,
                "world_size": o.world_size, "drop_last": o.drop_last,
                "batch_size": self.batch_size, "num_records": self.num_records,
                "partition": self.partition, "order": ORDER}

    @property
    def partition(self) -> str:
        """How ranks split the order: ``contiguous`` runs (block order) or ``interleaved``."""
        return "contiguous" if self.options.shuffle == "block" else "interleaved"

    def order(self, epoch: int) -> EpochOrder:
        """The epoch's order as a function (cached for one epoch; O(shards) to build)."""
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, self._epoch_order(epoch))
        return self._order[1]

    def _epoch_order(self, epoch: int) -> EpochOrder:
        return EpochOrder(self.num_records, self.shard_starts, self.options, epoch)

    def global_order(self, epoch: int) -> np.ndarray:
        """The whole epoch's order (all ranks), before padding or truncation."""
        return self.order(epoch).records(np.arange(self.num_records, dtype=np.int64))

    def rank_indices(self, epoch: int) -> np.ndarray:
        """This rank's records for ``epoch``, in delivery order: O(records / ranks), for a
        caller that wants the whole epoch at once (the loader asks batch by batch)."""
        return self.records_between(epoch, 0, self.num_samples)

    def records_between(self, epoch: int, start: int, stop: int) -> np.ndarray:
        """This rank's records ``start`` to ``stop`` of ``epoch`` (its delivery order,
        clipped to the records its batches hold): O(stop - start)."""
        kept = self.num_batches * self.batch_size if self.options.drop_last else None
        stop = stop if kept is None else min(stop, kept)
        return self.order(epoch).records(rank_positions(self.num_records, self.options,
                                                        start, stop))

    def batch(self, epoch: int, k: int) -> np.ndarray:
        """Record indices of batch ``k`` of ``epoch``: O(batch size), whatever the dataset."""
        if not 0 <= k < self.num_batches:
            raise IndexError(f"batch {k} out of range for an epoch of {self.num_batches} batches")
        b = self.batch_size
        return self.records_between(epoch, k * b, (k + 1) * b)
