"""Token streams: fixed blocks of ``block_size + 1`` tokens across record boundaries.

Language-model pretraining reads pre-tokenized text as one long stream cut into
blocks (LitData's ``TokensLoader``): block ``i`` is tokens ``[i * block_size,
(i + 1) * block_size]`` of the concatenation of every record's token array, in
storage order, so consecutive blocks overlap by one token (inputs are
``block[:-1]``, targets ``block[1:]``). :class:`TokenBlocks` serves these blocks
in a shuffled order with the sampler's guarantees: a pure function of (seed,
epoch, rank, world_size), the same number of batches on every rank, exact
mid-epoch resume through ``state_dict()``.

How a block is read: an uncompressed ``ndarray`` payload is the array's bytes
after a 16-byte header, at an aligned offset (FORMAT.md), so the shard's data
file, viewed as the token dtype, holds every record's tokens at a known element
offset. A block inside one record is a slice of that view: zero-copy with
``batch_size=None``, and in a batch one row of a fancy-indexed gather over an
overlapping-rows view of the shard (a C loop of row copies, no per-block
Python). A block that crosses into the next record (or shard) is copied piece
by piece. Everything per block (its record, shard and offset) is computed in
numpy for a chunk of 65,536 blocks at a time; a batch is a slice of those arrays
and one gather per shard it touches. The epoch's order is computed, never stored
(:class:`reader.batching.sampler.EpochOrder`), so an epoch starts in O(shards).

Checksums: each record's payload is checked (CRC32C) the first time a block
touches it in this process; a damaged record is an error naming shard, record
and byte offset, never a wrong token.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import as_strided

from formats import ShardDataset
from formats.checksum import crc32c
from formats.errors import ArgumentError
from formats.shard.column_cache import mapped_column

from ..data.dataset import open_dataset
from ..options import SamplerOptions, check_batch_size, check_int
from .sampler import EpochOrder, Sampler, check_epoch, check_resume, next_unseen

__all__ = ["TokenBlocks"]

# Separates the token-block stream from the record-order one (both keyed by seed, epoch).
_BLOCK_STREAM = 0x746F6B656E

_CHUNK = 1 << 16  # blocks planned at once (about 5 MB of plan arrays)

_HEADER = 16  # u64 ndim = 1, u64 length: the variable-shape ndarray header (FORMAT.md)


class TokenBlocks:
    """Shuffled fixed-size token blocks of a dataset's token field, in batches.

    Args:
        source: a dataset folder or an open ``ShardDataset``.
        block_size: tokens per training example; each block holds ``block_size + 1``.
        batch_size: blocks per batch (an ``[n, block_size + 1]`` array), or None (as
            in torch: no batching) for one block at a time, a ``[block_size + 1]`` array
            (a read-only zero-copy view when it lies in one record).
        field: the token field: an uncompressed integer ``ndarray`` of shape ``[None]``.
        shuffle: ``"block"`` (default): shards in a random order, then the blocks of
            each shard in a random order (LitData shuffles chunks, then items within
            a chunk, the same way): a batch is one gather from one shard. ``"full"``:
            one permutation of all blocks (batches then mix shards and cost a gather
            per shard they touch). ``False``: in order.
        seed, drop_last, rank, world_size: as for :class:`reader.Loader`.
        check_crc: verify each record's checksum the first time it is read.

    Loops follow the Loader's rule: every ``iter()`` starts the current epoch at its
    first batch, unless :meth:`load_state_dict` was called since the last ``iter()``;
    an epoch whose last batch was delivered is finished (the next ``iter()`` starts
    the next one); a loop left early leaves the epoch where it is; :meth:`state_dict`
    names the next unseen batch of the running (or last) loop. One iterator runs at
    a time: a new ``iter()``, :meth:`set_epoch` to another epoch or
    :meth:`load_state_dict` ends the previous one (its next ``next()`` says why).

    Raises:
        ValueError: the field is not an integer ``[None]`` array, is compressed, or
            the dataset holds fewer than ``block_size + 1`` tokens.
    """

    def __init__(self, source: str | Path | ShardDataset, block_size: int,
                 batch_size: int | None = 8, *, field: str = "tokens",
                 shuffle: bool | str = "block", seed: int = 0, drop_last: bool = False,
                 rank: int | None = None, world_size: int | None = None,
                 check_crc: bool = True) -> None:
        self.block_size = check_int("block_size", block_size, 1)
        self.batch_size = None if batch_size is None else check_batch_size(batch_size)
        self.options = SamplerOptions(shuffle=shuffle, seed=seed, drop_last=drop_last,
                                      rank=rank, world_size=world_size)
        self._owns = not isinstance(source, ShardDataset)
        self.dataset = open_dataset(source) if self._owns else source
        ds = self.dataset
        if field not in ds.field_index:
            raise ArgumentError(f"no field {field!r} in {ds.root}; its fields are "
                             f"{', '.join(f'{f.name} ({f.type})' for f in ds.fields)}")
        f = ds.fields[ds.field_index[field]]
        if f.type != "ndarray" or tuple(f.shape) != (None,) or np.dtype(f.dtype).kind not in "iu":
            raise ArgumentError(f"token field {field!r} must be an integer ndarray of shape [None], "
                             f"not {f.type} {f.dtype} {f.shape}")
        if f.compression != "none":
            raise ArgumentError(f"token field {field!r} is stored {f.compression}-compressed: "
                             "blocks are read in place, so pack it uncompressed")
        self.field = field
        self.dtype = np.dtype(f.dtype)
        self.check_crc = check_crc
        self._j = ds.field_index[field]
        self._index()
        total = self.num_tokens
        self.num_blocks = (total - 1) // self.block_size if total else 0
        if self.num_blocks == 0:
            raise ArgumentError(f"a block needs block_size + 1 = {self.block_size + 1} tokens; "
                             f"{field!r} of {ds.root} holds {total} in all")
        # Blocks by the shard their first token is in: the "block" order shuffles shards,
        # then the blocks of each shard, so a batch is one gather from one shard.
        token_at = self._record_start(ds.starts)
        block_starts = np.minimum(-(-token_at // self.block_size), self.num_blocks)
        self.sampler = _BlockOrder(self.num_blocks, block_starts, self.batch_size or 1,
                                   self.options)
        self.epoch = 0
        self.position = 0  # the next batch of the running (or last) loop
        self._resume = False  # load_state_dict() since the last iter(): it starts there
        self._loop: _Loop | None = None  # the running iterator's
        # A bit per record: its checksum was checked in this process.
        self._verified = np.zeros((len(ds) + 7) // 8, np.uint8)
        self._rows: dict[int, np.ndarray] = {}
        self._plan: tuple | None = None  # (epoch, first block, arrays): see _chunk

    # -- the index, once ---------------------------------------------------------------

    def _index(self) -> None:
        """Per record, its first token's place in the stream and in its shard's data:
        two columns mapped from the cache folder (8 bytes a record each, built once per
        node, :mod:`formats.shard.column_cache`); a record's shard is found in the dataset's
        starts. Nothing per record in this process's own memory."""
        ds, j, item = self.dataset, self._j, self.dtype.itemsize
        tag = hashlib.sha256(self.field.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        running = [0]  # shards are given in order: the stream so far

        def starts(s: int) -> np.ndarray:
            count = (ds.shard(s).lengths[:, j].astype(np.int64) - _HEADER) // item
            out = running[0] + np.cumsum(count) - count
            running[0] += int(count.sum())
            return out

        def elems(s: int) -> np.ndarray:
            return (ds.shard(s).offsets[:, j].astype(np.int64) + _HEADER) // item

        self._starts = mapped_column(ds, f"token-starts-{tag}", np.int64, starts)
        self._elem = mapped_column(ds, f"token-elems-{tag}", np.int64, elems)
        n = len(ds)
        if n == 0:
            self.num_tokens = 0
            return
        s = int(np.searchsorted(ds.starts, n - 1, side="right")) - 1
        last = ds.shard(s).lengths[n - 1 - int(ds.starts[s]), j]
        self.num_tokens = int(self._starts[n - 1]) + (int(last) - _HEADER) // item

    def _record_start(self, rec) -> np.ndarray:
        """Where records ``rec`` start in the stream (its end for ``len(dataset)``)."""
        rec = np.asarray(rec, np.int64)
        n = len(self._starts)
        if n == 0:
            return np.zeros(rec.shape, np.int64)
        return np.where(rec < n, self._starts[np.minimum(rec, n - 1)], self.num_tokens)

    def _shard_of(self, rec: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.dataset.starts, rec, side="right") - 1

    def _view(self, s: int) -> np.ndarray:
        """Shard ``s``'s data file as tokens (checked for truncation on every call)."""
        sh = self.dataset.shard(s)
        data = sh.data
        return data[: data.size - data.size % self.dtype.itemsize].view(self.dtype)

    # -- the epoch's plan --------------------------------------------------------------

    def _chunk(self, epoch: int, block: int) -> tuple[int, tuple]:
        """The plan of the chunk of this rank's epoch that holds its ``block``-th block:
        (the chunk's first block, its arrays). A chunk is ``_CHUNK`` blocks rounded to
        whole batches, planned in numpy at once, so a batch costs a slice and memory
        stays flat whatever the epoch's length.

        The arrays, per block of the chunk: its record, shard, first token's element in
        its shard's data and whether it lies in one record; per batch: its shard when
        its blocks all lie in records of that one shard (-1 otherwise: the rare batch
        at a shard's end, or one with a block across records); and the pieces of the
        blocks that cross records (one per record touched)."""
        b = self.batch_size or 1
        size = -(-_CHUNK // b) * b
        lo = block // size * size
        if self._plan is not None and self._plan[:2] == (epoch, lo):
            return lo, self._plan[2]
        width = self.block_size + 1
        blocks = self.sampler.records_between(epoch, lo, lo + size)
        first = blocks * self.block_size
        # Records of no tokens share their start with the next one: side="right" finds
        # the last of them, which holds the token.
        rec = np.searchsorted(self._starts, first, side="right") - 1
        begin = self._starts[rec]
        inside = first - begin + width <= self._record_start(rec + 1) - begin
        shard = self._shard_of(rec)
        elem = self._elem[rec] + first - begin
        heads = np.arange(0, len(blocks), b)
        single = ((np.minimum.reduceat(shard, heads) == np.maximum.reduceat(shard, heads))
                  & np.logical_and.reduceat(inside, heads)) if len(blocks) else np.zeros(0, bool)
        shard_of = np.where(single, shard[heads] if len(blocks) else 0, -1).tolist()
        # Pieces of the blocks that cross records: (position, record, shard, source
        # element, offset in the block, length).
        cross = np.flatnonzero(~inside)
        last = np.searchsorted(self._starts, first[cross] + width - 1, side="right") - 1
        per = last - rec[cross] + 1
        bounds = np.zeros(len(blocks) + 1, np.int64)
        np.add.at(bounds, cross + 1, per)
        np.cumsum(bounds, out=bounds)
        owner = np.repeat(cross, per)
        prec = np.repeat(rec[cross], per) + (np.arange(per.sum()) - np.repeat(
            np.cumsum(per) - per, per))
        lo_tok = np.maximum(self._starts[prec], first[owner])
        hi_tok = np.minimum(self._record_start(prec + 1), first[owner] + width)
        pieces = (owner, prec, self._shard_of(prec), self._elem[prec] + lo_tok - self._starts[prec],
                  lo_tok - first[owner], hi_tok - lo_tok)
        # Whether any record the chunk reads is unchecked: once every one is, batches
        # skip the checks altogether (every later epoch, and most of the first).
        check = self.check_crc and not (self._checked(rec).all()
                                         and self._checked(pieces[1]).all())
        plan = (rec, shard, elem, inside, bounds, pieces, shard_of, check)
        self._plan = (epoch, lo, plan)
        return lo, plan

    def __len__(self) -> int:
        return self.sampler.num_batches

    # -- iteration ---------------------------------------------------------------------

    def __iter__(self):
        # Not a generator itself: where the loop starts is decided now, at iter().
        n = self.sampler.num_batches
        if 0 < n <= self.position:
            self.epoch, self.position = self.epoch + 1, 0  # every batch was delivered
        elif not self._resume:
            self.position = 0  # a loop left early: its epoch again, from the first batch
        self._resume = False
        self._end_loop("a newer iter() of this TokenBlocks replaced this iterator: one "
                       "iterator runs at a time")
        loop = self._loop = _Loop()
        return self._serve(loop, self.epoch, self.position, n)

    def _serve(self, loop: _Loop, epoch: int, k: int, n: int):
        if self.batch_size is None:  # its own generator: a `yield from` costs per block
            return self._views(loop, epoch, k, n)
        return self._batches(loop, epoch, k, n)

    def _batches(self, loop: _Loop, epoch: int, k: int, n: int):
        while k < n:
            if loop.ended is not None:
                raise RuntimeError(loop.ended)
            out = self._batch(epoch, k)
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
        for i in range(k, n):
            if loop.ended is not None:
                raise RuntimeError(loop.ended)
            if i >= end:  # the next chunk's plan, as lists: per block only lookups
                base, (rec, shard, elem, inside, *_, check) = self._chunk(epoch, i)
                end = base + len(rec)
                shards, elems, ins = shard.tolist(), elem.tolist(), inside.tolist()
            j = i - base
            if check:
                self._verify(rec[j:j + 1])
            if ins[j]:
                s = shards[j]
                if s != current:
                    current, rows = s, self._overlapping_rows(s)
                out = rows[elems[j]]
            else:
                current = -1
                out = self._batch(epoch, i)
            self.position = i + 1
            yield out
        self._finished(loop, epoch)

    def _batch(self, epoch: int, k: int) -> np.ndarray:
        b = self.batch_size or 1
        base, (rec, shard, elem, inside, bounds, pieces, shard_of, check) = self._chunk(epoch,
                                                                                      k * b)
        lo, hi = k * b - base, min((k + 1) * b - base, len(rec))
        if check:
            self._verify(rec[lo:hi])
            self._verify(pieces[1][int(bounds[lo]):int(bounds[hi])])
        s = shard_of[lo // b]
        if s >= 0:
            # The usual batch: every block inside a record of one shard, one gather.
            rows = self._overlapping_rows(s)
            if self.batch_size is None:
                return rows[int(elem[lo])]  # a read-only view of the shard
            return rows[elem[lo:hi]]
        width = self.block_size + 1
        out = np.empty((hi - lo, width), self.dtype)
        ins, sh, el = inside[lo:hi], shard[lo:hi], elem[lo:hi]
        for t in np.unique(sh[ins]).tolist():
            at = np.flatnonzero(ins & (sh == t))
            out[at] = self._overlapping_rows(t)[el[at]]
        p0, p1 = int(bounds[lo]), int(bounds[hi])
        if p1 > p0:
            flat = out.reshape(-1)
            owner, _, pshard, src, dst, length = (a[p0:p1].tolist() for a in pieces)
            for i, t, e, d, n in zip(owner, pshard, src, dst, length, strict=True):
                at = (i - lo) * width + d
                flat[at:at + n] = self._view(t)[e:e + n]
        return out if self.batch_size is not None else out[0]

    def _overlapping_rows(self, s: int) -> np.ndarray:
        """Every ``block_size + 1`` run of shard ``s``'s tokens as one row (a view whose rows
        overlap): a fancy index on it copies whole rows in C."""
        self.dataset.shard(s)  # the file still has its full size (the guard against SIGBUS)
        rows = self._rows.pop(s, None)  # re-inserted last: the dict is in order of use
        if rows is None:
            view = self._view(s)
            width = self.block_size + 1
            item = self.dtype.itemsize
            rows = as_strided(view, shape=(max(view.size - width + 1, 0), width),
                              strides=(item, item), writeable=False)
            # A view holds its shard's map open: keep no more than the dataset keeps open.
            limit = getattr(self.dataset, "max_open", None) or len(self.dataset.starts)
            while len(self._rows) >= max(1, limit - 1):
                del self._rows[next(iter(self._rows))]
        self._rows[s] = rows
        return rows

    def _checked(self, records: np.ndarray) -> np.ndarray:
        """Whether each of ``records`` had its checksum checked in this process."""
        bit = np.uint8(1) << (records & 7).astype(np.uint8)
        return (self._verified[records >> 3] & bit) != 0

    def _verify(self, records: np.ndarray) -> None:
        """Check the records' checksums, each once in this process."""
        seen = self._checked(records)
        if seen.all():
            return
        for r in np.unique(records[~seen]).tolist():
            s = int(self._shard_of(r))
            local = r - int(self.dataset.starts[s])
            sh = self.dataset.shard(s)
            payload = sh.payload(local, self._j)
            if crc32c(payload) != int(sh.crcs[local, self._j]):
                sh.check(local, self._j, payload)  # raises, naming shard, record and offset
            self._verified[r >> 3] |= np.uint8(1 << (r & 7))

    # -- position ----------------------------------------------------------------------

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
        depends on."""
        epoch, batch = next_unseen(self.sampler, self.epoch, self.position)
        return {"epoch": epoch, "batch": batch, "block_size": self.block_size,
                "num_tokens": self.num_tokens, **self.sampler.describe()}

    def load_state_dict(self, state: dict) -> None:
        """Make the next ``iter()`` continue at the batch after the last one delivered when
        ``state`` was taken (a running iterator is ended).

        Raises:
            StateError: ``state`` is not a state dict, or was taken with another order,
                block size or dataset (a ``ValueError``).
        """
        check_resume(self.state_dict(), state, "token")
        self._end_loop("load_state_dict() moved this TokenBlocks to the saved position")
        self.epoch, self.position = next_unseen(self.sampler, int(state["epoch"]),
                                               int(state["batch"]))
        self._resume = True

    def close(self) -> None:
        self._end_loop("this TokenBlocks was closed")
        self._plan = None
        self._rows = {}
        if self._owns:
            self.dataset.close()

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
