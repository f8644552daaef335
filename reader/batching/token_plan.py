"""Token sources as one for planning: global numbers, and the plan of a chunk of blocks.

:class:`reader.TokenBlocks` plans a chunk of a rank's blocks at once, whatever sources
they come from: source ``s``'s record ``r`` is record ``rec_off[s] + r`` here, its shard
``k`` shard ``shard_off[s] + k`` and its block ``b`` block ``block_off[s] + b`` (the
numbers the mixture's order and the ledger use), so a chunk's plan is one set of arrays
and a batch one slice of them. One dataset is the case of one source, at offsets 0.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

import numpy as np

from .token_source import TokenSource

__all__ = ["BlockPlan", "TokenSources"]


class TokenSources:
    """Sources (:class:`TokenSource`) numbered as one.

    Args:
        parts: the sources, in the order their numbers follow one another.
    """

    def __init__(self, parts: list[TokenSource]) -> None:
        self.parts = list(parts)
        self.rec_off = _offsets(len(s.dataset) for s in self.parts)
        self.shard_off = _offsets(len(s.dataset.starts) - 1 for s in self.parts)
        self.block_off = _offsets(s.num_blocks for s in self.parts)
        self._bounds = self.shard_off.tolist()

    def plan(self, src: np.ndarray | None, blk: np.ndarray, b: int, *, check_crc: bool,
             ids: bool) -> BlockPlan:
        """Per block: its record, shard, first token's element in its shard's data and
        whether it lies in one record (global numbers); per batch: its shard when its
        blocks all lie in records of that one shard (-1 otherwise: the rare batch at a
        shard's end, one with a block across records, and most batches of a mixture);
        the other batches' blocks by shard (:func:`_runs`); and the pieces of the blocks
        that cross records (one per record touched).

        Args:
            src: each block's source (None: every block of the first).
            blk: each block's number in its source.
            b: blocks per batch (the chunk is whole batches).
            check_crc: whether records are checked the first time they are read.
            ids: keep each block's number in the mixture (for the ledger).
        """
        n = len(blk)
        rec, shard = np.empty(n, np.int64), np.empty(n, np.int64)
        elem, inside = np.empty(n, np.int64), np.empty(n, bool)
        parts = []
        groups = ([(0, np.arange(n))] if src is None else
                  [(s, np.flatnonzero(src == s)) for s in np.unique(src).tolist()])
        for s, at in groups:
            source, mine = self.parts[s], blk[at]
            r, sh, e, ins = source.locate(mine)
            rec[at], shard[at] = r + self.rec_off[s], sh + self.shard_off[s]
            elem[at], inside[at] = e, ins
            cross = np.flatnonzero(~ins)
            if cross.size:
                owner, prec, pshard, *rest = source.pieces(mine[cross], r[cross])
                parts.append((at[cross][owner], prec + self.rec_off[s],
                              pshard + self.shard_off[s], *rest))
        # Pieces of the blocks that cross records, block by block: (position, record,
        # shard, source element, offset in the block, length).
        pieces = tuple(np.concatenate(c) for c in zip(*parts, strict=True)) if parts else \
            tuple(np.zeros(0, np.int64) for _ in range(6))
        if len(parts) > 1:
            order = np.argsort(pieces[0], kind="stable")
            pieces = tuple(c[order] for c in pieces)
        bounds = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(pieces[0], minlength=n), out=bounds[1:])
        heads = np.arange(0, n, b)
        single = ((np.minimum.reduceat(shard, heads) == np.maximum.reduceat(shard, heads))
                  & np.logical_and.reduceat(inside, heads)) if n else np.zeros(0, bool)
        shard_of = np.where(single, shard[heads] if n else 0, -1).tolist()
        runs = _runs(shard, elem, inside, single, b)
        # Whether any record the chunk reads is unchecked: once every one is, batches
        # skip the checks altogether (every later epoch, and most of the first).
        check = check_crc and not (self.all_checked(rec) and self.all_checked(pieces[1]))
        number = None
        if ids:
            number = blk if src is None else self.block_off[src] + blk
        return BlockPlan(rec, shard, elem, inside, bounds, pieces, shard_of, runs, check, number)

    def shard(self, t: int) -> tuple[TokenSource, int]:
        """(source, its shard) of global shard ``t``."""
        s = bisect.bisect_right(self._bounds, t) - 1
        return self.parts[s], t - self._bounds[s]

    def rows(self, t: int) -> np.ndarray:
        """Global shard ``t``'s overlapping rows (:meth:`TokenSource.rows`)."""
        if len(self.parts) == 1:
            return self.parts[0].rows(t)
        source, local = self.shard(t)
        return source.rows(local)

    def _by_source(self, records: np.ndarray):
        """(source, its local records) for global ``records``."""
        if len(self.parts) == 1:
            return [(self.parts[0], records)]
        src = np.searchsorted(self.rec_off, records, side="right") - 1
        return [(self.parts[s], records[src == s] - self.rec_off[s])
                for s in np.unique(src).tolist()]

    def all_checked(self, records: np.ndarray) -> bool:
        """Whether every one of ``records`` (global) had its checksum checked in this
        process."""
        return all(source.checked(local).all() for source, local in self._by_source(records))

    def verify(self, records: np.ndarray) -> None:
        """Check the records' (global) checksums, each once in this process."""
        for source, local in self._by_source(records):
            source.verify(local)


def _runs(shard: np.ndarray, elem: np.ndarray, inside: np.ndarray, single: np.ndarray,
          b: int) -> tuple:
    """For the batches that are not one gather (``single`` False): their blocks inside a
    record grouped by shard, batch by batch, so such a batch costs a gather per shard
    and no search (a batch of a mixture draws from a shard of each source in it).

    Returns (per batch, its first run, ``len + 1`` values; per run, its shard and where
    its blocks begin in the next two arrays; the blocks' places in their batch and their
    first token's element), the per-run and per-batch values as lists."""
    batch = np.arange(len(shard)) // b
    pick = np.flatnonzero(inside & ~single[batch])
    pick = pick[np.lexsort((shard[pick], batch[pick]))]  # by batch, then shard; stable
    key_b, key_s = batch[pick], shard[pick]
    new = np.ones(len(pick), bool)
    new[1:] = (key_b[1:] != key_b[:-1]) | (key_s[1:] != key_s[:-1])
    begins = np.flatnonzero(new)
    first = np.searchsorted(key_b[begins], np.arange(len(single) + 1))
    return (first.tolist(), key_s[begins].tolist(), np.append(begins, len(pick)).tolist(),
            pick - key_b * b, elem[pick])


class BlockPlan(NamedTuple):
    """A chunk's plan (:meth:`TokenSources.plan`); records and shards are global."""

    rec: np.ndarray
    shard: np.ndarray
    elem: np.ndarray
    inside: np.ndarray
    bounds: np.ndarray  # where each block's pieces begin
    pieces: tuple
    shard_of: list  # per batch
    runs: tuple  # the blocks of the other batches by shard (_runs)
    check: bool
    ids: np.ndarray | None  # the ledger's: each block's number in the mixture


def _offsets(counts) -> np.ndarray:
    out = [0]
    for c in counts:
        out.append(out[-1] + int(c))
    return np.asarray(out, np.int64)
