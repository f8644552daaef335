"""Token streams: fixed blocks of ``block_size + 1`` tokens across record boundaries.

Language-model pretraining reads pre-tokenized text as one long stream cut into
blocks (LitData's ``TokensLoader``): block ``i`` of a dataset is tokens ``[i *
block_size, (i + 1) * block_size]`` of the concatenation of every record's token
array, in storage order, so consecutive blocks overlap by one token (inputs are
``block[:-1]``, targets ``block[1:]``). :class:`TokenBlocks` serves these blocks in a
shuffled order, from one dataset or from a :class:`reader.Mix` of several.

The order: over one dataset, the sampler's (a pure function of (seed, epoch, rank,
world_size), the same number of batches on every rank, exact mid-epoch resume at the
same world size); over a mixture, the mixture's plan (:mod:`reader.batching.mixture`,
with blocks for records): which source feeds each position of one global stream is a
pure function of (seed, position), each source keeps its own pass counter and block
order, and a state names global positions, so it resumes at any world size or batch
size and re-plans with other weights or sources. A block never spans two sources:
each source's blocks are cut from its own stream.

How blocks are read (:mod:`reader.batching.token_source`): a block inside one record
is a slice of its shard's data viewed as tokens: zero-copy with ``batch_size=None``,
and in a batch one row of a fancy-indexed gather over an overlapping-rows view of the
shard (a C loop of row copies, no per-block Python). A block that crosses into the
next record (or shard) is copied piece by piece. Everything per block (its source,
record, shard and offset) is computed in numpy for a chunk of 65,536 blocks at a
time (:mod:`reader.batching.token_plan`); a batch is a slice of those arrays and one
gather per shard it touches (a batch of a mixture touches a shard of each source in
it: a few rows from each are copied one by one, cheaper than a gather and a scatter).
The order is computed, never stored, so an epoch starts in O(shards).

Checksums: each record's payload is checked (CRC32C) the first time a block touches
it in this process; a damaged record is an error naming shard, record and byte
offset, never a wrong token.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from formats import ShardDataset
from formats.errors import ArgumentError

from ..data.dataset import open_dataset
from ..errors import LoaderError, StateError
from ..ledger import Ledger, check_ledger
from ..options import SamplerOptions, check_batch_size, check_int
from .mix import Mix
from .mixture import ORDER as MIX_ORDER
from .mixture import MixOrder
from .sampler import EpochOrder, Sampler, check_epoch, check_resume, next_unseen
from .token_plan import BlockPlan, TokenSources
from .token_source import TokenSource

__all__ = ["TokenBlocks"]

# Separates the token-block stream from the record-order one (both keyed by seed, epoch).
_BLOCK_STREAM = 0x746F6B656E

_CHUNK = 1 << 16  # blocks planned at once (about 5 MB of plan arrays)
# Up to this many blocks of one shard in a batch are copied row by row: 0.5 us a row of
# 2,049 int32 here, against 2 us plus 0.3 a row for a gather and a scatter (equal at 32).
_ROW_COPIES = 16


class TokenBlocks:
    """Shuffled fixed-size token blocks of a dataset's token field, in batches.

    Args:
        source: a dataset folder, an open ``ShardDataset``, or a :class:`reader.Mix` of
            several: blocks of each source by weight (``Mix(weights=None)``: by size in
            blocks, every source finishing its pass together; ``samples_per_epoch``
            counts blocks, by default all of them). Every source has the token field,
            with one dtype.
        block_size: tokens per training example; each block holds ``block_size + 1``.
        batch_size: blocks per batch (an ``[n, block_size + 1]`` array), or None (as
            in torch: no batching) for one block at a time, a ``[block_size + 1]`` array
            (a read-only zero-copy view when it lies in one record).
        field: the token field: an uncompressed integer ``ndarray`` of shape ``[None]``.
        shuffle: ``"block"`` (default): shards in a random order, then the blocks of
            each shard in a random order (LitData shuffles chunks, then items within
            a chunk, the same way): a batch is one gather from one shard (from one
            shard of each source in it, over a mixture). ``"full"``: one permutation of
            all blocks (of each source's, over a mixture). ``False``: in order.
        seed: as for :class:`reader.Loader`.
        drop_last: as for :class:`reader.Loader` (refused over a mixture, where every
            batch is full).
        rank: as for :class:`reader.Loader`.
        world_size: as for :class:`reader.Loader`.
        check_crc: verify each record's checksum the first time it is read.
        ledger: ``True`` keeps a running hash of every batch's blocks (a source's name
            and the block's number in it) in the state dict; a path
            (``"ledger-{rank}.jsonl"``) also appends one line per batch there
            (:mod:`reader.ledger`).

    Loops follow the Loader's rule: every ``iter()`` starts the current epoch at its
    first batch, unless :meth:`load_state_dict` was called since the last ``iter()``;
    an epoch whose last batch was delivered is finished (the next ``iter()`` starts
    the next one); a loop left early leaves the epoch where it is; :meth:`state_dict`
    names the next unseen batch of the running (or last) loop. One iterator runs at
    a time: a new ``iter()``, :meth:`set_epoch` to another epoch or
    :meth:`load_state_dict` ends the previous one (its next ``next()`` says why).

    Resume: a state of one dataset resumes at the same world size, batch size and
    order (as the Loader's); a state of a mixture at any world size or batch size, and
    with other weights or sources (each continuing source where its pass was;
    :meth:`plan_report`). For an elastic run over one dataset, mix one source:
    ``Mix({"tokens": path})``. A state of one kind never loads into the other.

    Raises:
        ArgumentError: the field is missing, not an integer ``[None]`` array, or
            compressed; a source holds fewer than ``block_size + 1`` tokens; the
            sources' token dtypes differ (each message names the source).
    """

    def __init__(self, source: str | Path | ShardDataset | Mix, block_size: int,
                 batch_size: int | None = 8, *, field: str = "tokens",
                 shuffle: bool | str = "block", seed: int = 0, drop_last: bool = False,
                 rank: int | None = None, world_size: int | None = None,
                 check_crc: bool = True, ledger: bool | str | os.PathLike = False) -> None:
        self.block_size = check_int("block_size", block_size, 1)
        self.batch_size = None if batch_size is None else check_batch_size(batch_size)
        self.options = SamplerOptions(shuffle=shuffle, seed=seed, drop_last=drop_last,
                                      rank=rank, world_size=world_size)
        ledger = check_ledger(ledger)
        mix = source if isinstance(source, Mix) else None
        self.names = mix.names if mix is not None else None
        self._owned: list[ShardDataset] = []
        try:
            self.sources = self._open(mix.sources if mix else {None: source}, field)
        except BaseException:
            self._close_owned()
            raise
        first = self.sources[0]
        self.field, self.dtype, self.check_crc = field, first.dtype, check_crc
        self.dataset = first.dataset if mix is None else None  # one dataset's, as before
        self.num_tokens = sum(s.num_tokens for s in self.sources)
        self.num_blocks = sum(s.num_blocks for s in self.sources)
        self._set = TokenSources(self.sources)  # global numbers, and the chunks' plans
        b = self.batch_size or 1
        if mix is None:
            self.sampler: Sampler | MixOrder = _BlockOrder(
                first.num_blocks, first.block_starts, b, self.options)
        else:
            self.sampler = MixOrder(self.names, [s.num_blocks for s in self.sources],
                                    [s.block_starts for s in self.sources], self._set.block_off,
                                    mix.weights, mix.samples_per_epoch, b, self.options,
                                    unit="blocks")
        self.ledger = None if ledger is None else Ledger(
            self._ledger_ids, self.options.rank, None if ledger is True else ledger)
        self.epoch = 0
        self.position = 0  # the next batch of the running (or last) loop
        self._resume = False  # load_state_dict() since the last iter(): it starts there
        self._loop: _Loop | None = None  # the running iterator's
        self._plan: tuple | None = None  # (epoch, first block, BlockPlan): see _chunk

    def _open(self, given: Mapping, field: str) -> list[TokenSource]:
        out = []
        for name, src in given.items():
            ds = src
            if not isinstance(src, ShardDataset):
                ds = open_dataset(src)
                self._owned.append(ds)
            out.append(TokenSource(ds, field, self.block_size, name))
        for s in out[1:]:
            if s.dtype != out[0].dtype:
                raise ArgumentError(
                    f"token field {field!r}: source {out[0].name!r} ({out[0].dataset.root}) "
                    f"stores {out[0].dtype}, source {s.name!r} ({s.dataset.root}) {s.dtype}; "
                    "a batch is one array, so every source's tokens need one dtype: repack "
                    "one of them")
        return out

    # -- the plan of a chunk -----------------------------------------------------------

    def _chunk(self, epoch: int, block: int) -> tuple[int, BlockPlan]:
        """The plan of the chunk of this rank's epoch from its ``block``-th block (a
        batch's first): (the chunk's first block, its arrays). A chunk is ``_CHUNK``
        blocks rounded to whole batches, planned in numpy at once, so a batch costs a
        slice and memory stays flat whatever the epoch's length."""
        if self._plan is not None:
            e, lo, plan = self._plan
            if e == epoch and lo <= block < lo + len(plan.rec):
                return lo, plan
        b = self.batch_size or 1
        lo = block - block % b
        src, blk = self._blocks(epoch, lo, lo + -(-_CHUNK // b) * b)
        plan = self._set.plan(src, blk, b, check_crc=self.check_crc,
                              ids=self.ledger is not None)
        self._plan = (epoch, lo, plan)
        return lo, plan

    def _blocks(self, epoch: int, lo: int, hi: int) -> tuple[np.ndarray | None, np.ndarray]:
        """(source, block within it) of this rank's blocks ``lo`` to ``hi`` of ``epoch``
        (source None: the one dataset)."""
        if not isinstance(self.sampler, MixOrder):
            return None, self.sampler.records_between(epoch, lo, hi)
        b = self.batch_size or 1
        stop = min(-(-hi // b), self.sampler.num_batches_in(epoch))
        return self.sampler.sources_of(self.sampler.positions(epoch, lo // b, stop))

    def __len__(self) -> int:
        return self.sampler.num_batches_in(self.epoch)

    # -- iteration ---------------------------------------------------------------------

    def __iter__(self):
        # Not a generator itself: where the loop starts is decided now, at iter().
        n = self.sampler.num_batches_in(self.epoch)
        if 0 < n <= self.position:
            self.epoch, self.position = self.epoch + 1, 0  # every batch was delivered
            n = self.sampler.num_batches_in(self.epoch)
        elif not self._resume:
            self.position = 0  # a loop left early: its epoch again, from the first batch
        self._resume = False
        self._end_loop("a newer iter() of this TokenBlocks replaced this iterator: one "
                       "iterator runs at a time")
        loop = self._loop = _Loop()
        if self.batch_size is None:  # its own generator: a `yield from` costs per block
            return self._views(loop, self.epoch, self.position, n)
        return self._batches(loop, self.epoch, self.position, n)

    def _batches(self, loop: _Loop, epoch: int, k: int, n: int):
        ledger = self.ledger
        while k < n:
            if loop.ended is not None:
                raise RuntimeError(loop.ended)
            out = self._batch(epoch, k)
            if ledger is not None:
                ledger.served(epoch, k)
            k += 1
            self.position = k
            yield out
        self._finished(loop, epoch)

    def _finished(self, loop: _Loop, epoch: int) -> None:
        """The epoch's last block was delivered: the next iter() starts the next epoch."""
        if loop.ended is None and self.epoch == epoch:
            self.epoch, self.position = epoch + 1, 0

    def _end_loop(self, why: str) -> None:
        """End the running iterator: its next ``next()`` raises ``RuntimeError(why)``."""
        if self._loop is not None:
            self._loop.ended = why
            self._loop = None

    def _views(self, loop: _Loop, epoch: int, k: int, n: int):
        """One block at a time: a row of the shard's overlapping-rows view (zero-copy)
        for a block inside a record, a copy for one across records. Per block only list
        lookups: the shard's file size is checked when the shard changes (a view is read
        after it is yielded, so a check per block would guard nothing more)."""
        current, rows, base, end = -1, None, 0, 0
        ledger = self.ledger
        for i in range(k, n):
            if loop.ended is not None:
                raise RuntimeError(loop.ended)
            if i >= end:  # the next chunk's plan, as lists: per block only lookups
                base, plan = self._chunk(epoch, i)
                end = base + len(plan.rec)
                shards, elems, ins = (plan.shard.tolist(), plan.elem.tolist(),
                                      plan.inside.tolist())
            j = i - base
            if plan.check:
                self._set.verify(plan.rec[j:j + 1])
            if ins[j]:
                s = shards[j]
                if s != current:
                    current, rows = s, self._set.rows(s)
                out = rows[elems[j]]
            else:
                current = -1
                out = self._batch(epoch, i)
            if ledger is not None:
                ledger.served(epoch, i)
            self.position = i + 1
            yield out
        self._finished(loop, epoch)

    def _batch(self, epoch: int, k: int) -> np.ndarray:
        b = self.batch_size or 1
        base, plan = self._chunk(epoch, k * b)
        lo, hi = k * b - base, min((k + 1) * b - base, len(plan.rec))
        elem, bounds, pieces = plan.elem, plan.bounds, plan.pieces
        if plan.check:
            self._set.verify(plan.rec[lo:hi])
            self._set.verify(pieces[1][int(bounds[lo]):int(bounds[hi])])
        s = plan.shard_of[lo // b]
        if s >= 0:
            # The usual batch of one dataset: every block inside a record of one shard,
            # one gather.
            rows = self._set.rows(s)
            if self.batch_size is None:
                return rows[int(elem[lo])]  # a read-only view of the shard
            return rows[elem[lo:hi]]
        width = self.block_size + 1
        out = np.empty((hi - lo, width), self.dtype)
        # The blocks inside a record, by shard (precomputed: BlockPlan.runs): a few are copied
        # row by row (half the cost of a gather and a scatter), more in one of each.
        first, shards, starts, place, first_elem = plan.runs
        for r in range(first[lo // b], first[lo // b + 1]):
            a, z = starts[r], starts[r + 1]
            rows = self._set.rows(shards[r])
            if z - a > _ROW_COPIES:
                out[place[a:z]] = rows[first_elem[a:z]]
                continue
            for i, e in zip(place[a:z].tolist(), first_elem[a:z].tolist(), strict=True):
                out[i] = rows[e]
        p0, p1 = int(bounds[lo]), int(bounds[hi])
        if p1 > p0:
            flat = out.reshape(-1)
            owner, _, pshard, src, dst, length = (a[p0:p1].tolist() for a in pieces)
            for i, t, e, d, n in zip(owner, pshard, src, dst, length, strict=True):
                to = (i - lo) * width + d
                source, local = self._set.shard(t)
                flat[to:to + n] = source.view(local)[e:e + n]
        return out if self.batch_size is not None else out[0]

    # -- position, state and the ledger ------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` current, starting at its first batch; the current epoch is left
        as it is (a loaded state survives ``set_epoch`` at the top of a training loop)."""
        epoch = check_epoch(epoch, "TokenBlocks")
        if epoch != self.epoch:
            self._end_loop(f"set_epoch({epoch}) moved this TokenBlocks to another epoch")
            self.epoch, self.position = int(epoch), 0
            self._resume = False

    def state_dict(self) -> dict:
        """The next unseen batch of the running (or last) loop, and what the block order
        depends on: over a mixture, global positions (:meth:`MixOrder.state`)."""
        if isinstance(self.sampler, MixOrder):
            state = {**self.sampler.state(self.epoch, self.position),
                     "block_size": self.block_size}
        else:
            epoch, batch = next_unseen(self.sampler, self.epoch, self.position)
            state = {"epoch": epoch, "batch": batch, "block_size": self.block_size,
                     "num_tokens": self.num_tokens, **self.sampler.describe()}
        if self.ledger is not None:
            state["ledger"] = self.ledger.state()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Make the next ``iter()`` continue at the batch after the last one delivered when
        ``state`` was taken (a running iterator is ended). Over a mixture, at any world
        size or batch size, re-planning if the weights or sources differ.

        Raises:
            StateError: ``state`` is not a state dict, or was taken with another order,
                block size or dataset (a ``ValueError``), or by a TokenBlocks over one
                dataset when this one reads a mixture, or the other way round.
        """
        mixed = isinstance(state, Mapping) and state.get("order") == MIX_ORDER
        if isinstance(self.sampler, MixOrder):
            if mixed and state.get("unit") == "blocks" and state.get("block_size") != \
                    self.block_size:
                raise StateError(f"token state was saved with block_size="
                                 f"{state.get('block_size')!r}, this TokenBlocks has "
                                 f"block_size={self.block_size}: cannot resume exactly")
            position = self.sampler.resume(state)
        else:
            if mixed:
                raise StateError(
                    "token state: saved by a TokenBlocks over a reader.Mix (of "
                    f"{', '.join(map(repr, state.get('sources') or {}))}); this one reads "
                    "one dataset and cannot continue it: pass the same reader.Mix")
            mine = {k: v for k, v in self.state_dict().items() if k != "ledger"}
            check_resume(mine, {k: v for k, v in state.items() if k != "ledger"}
                         if isinstance(state, dict) else state, "token")
            position = next_unseen(self.sampler, int(state["epoch"]), int(state["batch"]))
        if self.ledger is not None:
            self.ledger.resume(state)
        self._end_loop("load_state_dict() moved this TokenBlocks to the saved position")
        self.epoch, self.position = position
        self._resume = True

    def plan_report(self) -> dict:
        """A mixture's progress at the next unseen batch: per source (by name) its
        ``weight`` (share), ``blocks``, ``pass`` (from 0), ``served`` and ``left`` of
        that pass, and ``in_plan`` (False for a source a loaded state knew that this
        mixture dropped).

        Raises:
            LoaderError: this TokenBlocks reads one dataset, not a :class:`reader.Mix`.
        """
        if not isinstance(self.sampler, MixOrder):
            raise LoaderError("plan_report() describes a mixture: this TokenBlocks reads "
                              "one dataset (pass a reader.Mix to mix several)")
        return self.sampler.report(self.epoch, self.position)

    def _ledger_ids(self, epoch: int, k: int) -> np.ndarray:
        """Batch ``k``'s blocks as the ledger's ids (a mixture's say which source:
        :meth:`MixOrder.ledger_ids`), read from the chunk's plan, which the batch was
        just served from."""
        b = self.batch_size or 1
        base, plan = self._chunk(epoch, k * b)
        ids = plan.ids[k * b - base:(k + 1) * b - base]
        if self.names is None:
            return np.asarray(ids, np.int64).astype(np.uint64)
        return self.sampler.ledger_ids(ids)

    def close(self) -> None:
        self._end_loop("this TokenBlocks was closed")
        self._plan = None
        for s in self.sources:
            s.release()
        if self.ledger is not None:
            self.ledger.close()
        self._close_owned()

    def _close_owned(self) -> None:
        while self._owned:
            self._owned.pop().close()

    def __enter__(self) -> TokenBlocks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Loop:
    """One iterator of a :class:`TokenBlocks`; ``ended`` says why a newer call ended it."""

    __slots__ = ("ended",)

    def __init__(self) -> None:
        self.ended: str | None = None


class _BlockOrder(Sampler):
    """The sampler's order, ranks and batches, with the ``"block"`` order made of whole
    shards: shards shuffled, then all the blocks of each (the records' ``"block"`` order
    shuffles windows of a fixed size, which straddle shard boundaries)."""

    def _epoch_order(self, epoch: int) -> EpochOrder:
        if self.options.shuffle != "block":
            return super()._epoch_order(epoch)
        return EpochOrder(self.num_records, self.shard_starts, self.options, epoch,
                          stream=_BLOCK_STREAM, window=None)
