"""Which source feeds each position of a mixture's stream: a pure function of
(seed, position).

The stream is cut into *cycles* of ``A = sum(counts)`` positions, each holding exactly
``counts[s]`` samples of source ``s`` (weights are integers here: :func:`integer_weights`
turns a user's into them). A cycle is cut into blocks of at most ``block`` positions;
cycles shorter than a block (weights 4:1, or small datasets weighed by size) are
grouped, as many as fit, into one block laid out at once, each cycle shuffled within
itself, so every cycle still holds its exact counts.
How many samples of each source the first ``m`` positions of a cycle hold is a binary
split down a tree of the sources: a node given ``m`` sends ``m * left // node`` to its
left half and the rest to its right (integer arithmetic, exact at any size). Each
half's share is non-decreasing in ``m`` and the whole cycle (``m = A``) splits
exactly, so per-block counts are never negative, every cycle holds its exact counts,
and any prefix of the stream is within ``depth`` samples of its ideal share plus the
deviation inside one block (at most the block's size; a hypergeometric spread of
about ``sqrt(block * w * (1 - w)) / 2`` in practice). That bounds the longest run
of one source by the block too: it is a permutation of a block's fixed counts.

Inside a block the sources' slots are laid out by a keyed bijection (seed, cycle,
block) of the block's slots sorted by source, so ranks taking interleaved positions
each see every source, and a source's samples are numbered in position order: the
samples of a source that any prefix of the stream serves are the first ones of its
own order (what a re-plan continues from).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

__all__ = ["Arrangement", "integer_weights"]

BLOCK = 4096  # positions per block: the bound on a run of one source and on its deviation
_TAG = 0x6D6978  # "mix": separates the arrangement's keys from the sources' orders
_MASK64 = (1 << 64) - 1
_KEPT = 64  # block layouts kept (40 KB each: a step of 64 ranks spans 4 blocks of 4096,
# or 64 short cycles)


def integer_weights(weights: list, *, denominator: int = 1 << 20) -> list[int]:
    """Weights as integers in the same proportions: ints are kept (exact: sizes give a
    mixture that finishes every source together); floats are rounded to multiples of
    ``1 / denominator`` of their sum (about 10^-6), every positive weight at least 1."""
    if all(isinstance(w, (int, np.integer)) for w in weights):
        return [int(w) for w in weights]
    total = float(sum(weights))
    return [max(1, round(float(w) / total * denominator)) if w > 0 else 0 for w in weights]


class Arrangement:
    """Source and per-source number of each stream position.

    Args:
        counts: samples of each source per cycle (ints >= 0, at least one positive).
        seed: keys the layout inside each block.
        block: positions per block (fixed: a different block is a different stream).
    """

    def __init__(self, counts: list[int], seed: int, block: int = BLOCK) -> None:
        counts = [int(c) for c in counts]
        total = sum(counts)
        if total < 1 or min(counts) < 0:
            raise ValueError(f"counts must be >= 0 with a positive sum, not {counts}")
        if block < 2 or block & (block - 1):
            raise ValueError(f"block must be a power of two, not {block}")
        # Short cycles are grouped, `group` to a block: the arithmetic below sees one
        # cycle of `group` short ones, the layout shuffles each short one apart.
        self.unit = total
        self.group = max(1, block // total)
        self.counts = [c * self.group for c in counts]
        self.cycle = total * self.group
        self.block = block
        self.blocks = -(-self.cycle // block)
        self.seed = int(seed)
        self._tables: dict[int, np.ndarray] = {}  # size -> its random permutation
        self._layouts: OrderedDict[int, tuple] = OrderedDict()
        self._src_type = np.uint8 if len(counts) <= 256 else np.int32
        self._counts_arr = np.asarray(self.counts, np.int64)

    def prefix_counts(self, m: int) -> list[int]:
        """Samples of each source among the first ``m`` positions of a cycle (``0 <= m <=
        cycle``): the tree split described in the module docstring."""
        out = [0] * len(self.counts)

        def split(lo: int, hi: int, m: int, weight: int) -> None:
            if hi - lo == 1:
                out[lo] = m
                return
            mid = (lo + hi) // 2
            left = sum(self.counts[lo:mid])
            to_left = m * left // weight if weight else 0
            split(lo, mid, to_left, left)
            split(mid, hi, m - to_left, weight - left)

        split(0, len(self.counts), m, self.cycle)
        return out

    def taken(self, stop: int) -> np.ndarray:
        """Samples of each source among stream positions ``[0, stop)``, int64."""
        cycle, offset = divmod(int(stop), self.cycle)
        j, p = divmod(offset, self.block)
        out = cycle * self._counts_arr
        if j >= self.blocks:  # stop at a cycle's end
            return out
        src, _, before = self._layout(cycle, j)
        return out + before + np.bincount(src[:p], minlength=len(self.counts))

    def __call__(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """(source, number of the sample within its source since position 0) of each
        stream position, both int64."""
        g = np.asarray(positions, np.int64)
        cycle, offset = np.divmod(g, self.cycle)
        j, p = np.divmod(offset, self.block)
        where = cycle * self.blocks + j
        first, last = int(where.min()), int(where.max())
        if first == last:  # a batch within one block: no grouping
            return self._place(first, p)
        source = np.empty_like(g)
        number = np.empty_like(g)
        for w in np.unique(where).tolist():
            sel = where == w
            source[sel], number[sel] = self._place(w, p[sel])
        return source, number

    def _place(self, where: int, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots ``p`` of block number ``where`` (counted over cycles): source and number."""
        cycle, j = divmod(where, self.blocks)
        src, within, before = self._layout(cycle, j)
        s = src[p].astype(np.int64)
        return s, cycle * self._counts_arr[s] + before[s] + within[p]

    def _layout(self, cycle: int, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Block ``j`` of ``cycle``: each slot's source, its number among the block's
        samples of that source (in position order), and each source's samples in the
        cycle's earlier blocks. About 40 us for a block of 4096, kept for the next
        batches (a rank of 64 computes every block of the job: 0.6 us a position)."""
        key = cycle * self.blocks + j
        hit = self._layouts.get(key)
        if hit is not None:
            self._layouts.move_to_end(key)
            return hit
        begin = j * self.block
        end = min(begin + self.block, self.cycle)
        before = np.asarray(self.prefix_counts(begin), np.int64)
        here = np.asarray(self.prefix_counts(end), np.int64) - before
        cum = np.zeros(len(here) + 1, np.int64)
        np.cumsum(here, out=cum[1:])
        size = end - begin
        if self.group == 1:
            slot = self._shuffle(np.arange(size), size, key)  # its place in the sorted layout
            src = np.repeat(np.arange(len(here), dtype=self._src_type), here)[slot]
        else:  # `group` short cycles, each a rotation of one random layout of its slots
            unit = self.unit
            one = np.repeat(np.arange(len(here), dtype=self._src_type),
                            np.asarray(self.counts) // self.group)
            table = self._table(unit)
            turns = np.random.default_rng([self.seed, _TAG, key]).integers(0, unit, self.group)
            slot = table[(np.arange(unit)[None, :] + turns[:, None]) % unit]
            src = one[slot].reshape(-1)
        order = np.argsort(src, kind="stable")  # a radix sort on these small ints
        within = np.empty(size, np.int32)
        within[order] = np.arange(size) - np.repeat(cum[:-1], here)
        hit = (src, within, before)
        self._layouts[key] = hit
        if len(self._layouts) > _KEPT:
            self._layouts.popitem(last=False)
        return hit

    def _table(self, size: int) -> np.ndarray:
        """A random permutation of ``size``, drawn once per size met."""
        table = self._tables.get(size)
        if table is None:
            rng = np.random.default_rng([self.seed, _TAG, size])
            table = self._tables[size] = rng.permutation(size).astype(np.int64)
        return table

    def _shuffle(self, p: np.ndarray, size: int, key: int) -> np.ndarray:
        """The block's keyed bijection of its slots: a random permutation of ``size``
        drawn once (numpy's, for each size met: a block's, a cycle's shorter last one),
        entered at an offset and, for a power of two, xored with a mask, both keyed by
        the block. A gather and two integer operations: a Feistel network costs 110 us
        for 4,096 slots here, and cheap arithmetic bijections (affine maps around a
        xorshift) skewed the share of a source that a rank's strided positions get (126
        batches of 32,000 beyond 4 standard deviations, against about 2 for random
        draws). Through a random table strided positions land on random slots."""
        table = self._table(size)
        offset, mask = _round_constants(self.seed, key)
        if size & (size - 1) == 0:
            return table[(p + offset) & (size - 1)] ^ (mask & (size - 1))
        return table[(p + offset) % size]


def _round_constants(seed: int, block: int) -> tuple[int, int]:
    """An offset and a mask for one block, from splitmix64 of (seed, block)."""
    out = []
    z = (seed * 0xD1B54A32D192ED03 ^ block * 0x9E3779B97F4A7C15) & _MASK64
    for _ in range(2):
        z = (z + 0x9E3779B97F4A7C15) & _MASK64
        y = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        y = ((y ^ (y >> 27)) * 0x94D049BB133111EB) & _MASK64
        out.append((y ^ (y >> 31)) & 0x7FFFFFFF)
    return out[0], out[1]
