"""Which source feeds each position of a mixture's stream: a pure function of
(seed, position).

The stream is cut into *cycles* of ``A = sum(counts)`` positions, each holding exactly
``counts[s]`` samples of source ``s`` (a cycle under 256 positions is repeated to reach
it: weights 4:1 make cycles of 4 x 52 + 52) (weights are integers here: :func:`integer_weights`
turns a user's into them). A cycle is cut into blocks of at most ``block`` positions.
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

from .permutation import permute, round_keys

__all__ = ["Arrangement", "integer_weights"]

BLOCK = 4096  # positions per block: the bound on a run of one source and on its deviation
_TAG = 0x6D6978  # "mix": separates the arrangement's keys from the sources' orders
_MIN_CYCLE = 256  # a shorter cycle (weights 4:1) is repeated to at least this many
_MASK64 = (1 << 64) - 1
_KEPT = 8  # block layouts kept (a batch of a rank of 64 spans 4 blocks of 4096)


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
        scale = -(-_MIN_CYCLE // total)  # a tiny cycle repeats (its layout costs per call)
        self.counts = [c * scale for c in counts]
        self.cycle = total * scale
        if block < 2 or block & (block - 1):
            raise ValueError(f"block must be a power of two, not {block}")
        self.block = block
        self._bits = block.bit_length() - 1
        self.blocks = -(-self.cycle // block)
        self.keys = round_keys(seed, _TAG)
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
        slot = self._shuffle(np.arange(size), size, key)  # its place in the sorted layout
        src = np.repeat(np.arange(len(here), dtype=self._src_type), here)[slot]
        order = np.argsort(src, kind="stable")  # a radix sort on these small ints
        within = np.empty(size, np.int64)
        within[order] = np.arange(size) - np.repeat(cum[:-1], here)
        hit = (src, within, before)
        self._layouts[key] = hit
        if len(self._layouts) > _KEPT:
            self._layouts.popitem(last=False)
        return hit

    def _shuffle(self, p: np.ndarray, size: int, key: int) -> np.ndarray:
        """The block's keyed bijection of its slots. A whole block (``size == block``, a
        power of two) takes two affine rounds around a xorshift, mod ``block``: a few
        numpy operations (a Feistel network costs 110 us for 4096 here); what it must do
        is spread each source's slots through the block and across interleaved ranks,
        not resist analysis. A cycle's shorter last block takes the Feistel
        permutation (:func:`permute`)."""
        if size != self.block:
            return permute(p, size, self.keys, tweak=key)
        a1, b1, a2, b2 = _round_constants(int(self.keys[0]), key)
        mask = size - 1
        x = (p * a1 + b1) & mask
        x ^= x >> (self._bits // 2)
        return (x * a2 + b2) & mask


def _round_constants(key: int, block: int) -> tuple[int, int, int, int]:
    """Two odd multipliers and two offsets for one block, from splitmix64 of
    (key, block): Python ints, small enough that ``int64 * multiplier`` cannot
    overflow for positions under 2^31."""
    out = []
    z = (key ^ (block * 0x9E3779B97F4A7C15)) & _MASK64
    for _ in range(4):
        z = (z + 0x9E3779B97F4A7C15) & _MASK64
        y = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        y = ((y ^ (y >> 27)) * 0x94D049BB133111EB) & _MASK64
        out.append((y ^ (y >> 31)) & 0xFFFFFFF)
    return out[0] | 1, out[1], out[2] | 1, out[3]
