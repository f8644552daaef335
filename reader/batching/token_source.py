"""One dataset's token field as a stream of fixed blocks: where each block lies, and
reading it.

Block ``i`` of a source is tokens ``[i * block_size, (i + 1) * block_size]`` of the
concatenation of every record's token array, in storage order (LitData's
``TokensLoader``). An uncompressed ``ndarray`` payload is the array's bytes after a
16-byte header, at an aligned offset (FORMAT.md), so the shard's data file, viewed as
the token dtype, holds every record's tokens at a known element offset: a block inside
one record is a row of an overlapping-rows view of its shard (:meth:`TokenSource.rows`),
and a block across records is copied piece by piece (:meth:`TokenSource.pieces`).
Both are found in numpy for many blocks at once (:meth:`TokenSource.locate`), from two
columns per record mapped from the cache folder; nothing per record is held in this
process's own memory.

Checksums: each record's payload is checked (CRC32C) the first time a block touches it
in this process (:meth:`TokenSource.verify`); a damaged record is an error naming
shard, record and byte offset, never a wrong token.
"""

from __future__ import annotations

import hashlib

import numpy as np
from numpy.lib.stride_tricks import as_strided

from formats import ShardDataset
from formats.checksum import crc32c
from formats.errors import ArgumentError
from formats.shard.column_cache import mapped_column

__all__ = ["TokenSource"]

_HEADER = 16  # u64 ndim = 1, u64 length: the variable-shape ndarray header (FORMAT.md)


class TokenSource:
    """The token field of one open dataset, cut into blocks of ``block_size + 1`` tokens.

    Args:
        dataset: the open dataset (its owner closes it).
        field: the token field: an uncompressed integer ``ndarray`` of shape ``[None]``.
        block_size: tokens per training example.
        name: the source's name in a mixture (named in errors), or None.

    Raises:
        ArgumentError: no such field, the field is not an uncompressed integer ``[None]``
            array, or the dataset holds fewer than ``block_size + 1`` tokens; each
            message names the source (and its folder).
    """

    def __init__(self, dataset: ShardDataset, field: str, block_size: int,
                 name: str | None = None) -> None:
        self.dataset = ds = dataset
        self.name = name
        what = f"{ds.root}" if name is None else f"source {name!r} ({ds.root})"
        if field not in ds.field_index:
            raise ArgumentError(f"no field {field!r} in {what}; its fields are "
                                f"{', '.join(f'{f.name} ({f.type})' for f in ds.fields)}")
        f = ds.fields[ds.field_index[field]]
        if f.type != "ndarray" or tuple(f.shape) != (None,) or np.dtype(f.dtype).kind not in "iu":
            raise ArgumentError(f"token field {field!r} of {what} must be an integer ndarray "
                                f"of shape [None], not {f.type} {f.dtype} {f.shape}")
        if f.compression != "none":
            raise ArgumentError(f"token field {field!r} of {what} is stored {f.compression}-"
                                "compressed: blocks are read in place, so pack it uncompressed")
        self.field = field
        self.dtype = np.dtype(f.dtype)
        self.block_size = block_size
        self.j = ds.field_index[field]
        self._index()
        total = self.num_tokens
        self.num_blocks = (total - 1) // block_size if total else 0
        if self.num_blocks == 0:
            raise ArgumentError(f"a block needs block_size + 1 = {block_size + 1} tokens; "
                                f"{field!r} of {what} holds {total} in all")
        # The first block of each shard (by the shard its first token is in): the "block"
        # order shuffles shards, then the blocks of each, so a batch is one gather.
        token_at = self.record_start(ds.starts)
        self.block_starts = np.minimum(-(-token_at // block_size), self.num_blocks)
        # A bit per record: its checksum was checked in this process.
        self._verified = np.zeros((len(ds) + 7) // 8, np.uint8)
        self._rows: dict[int, np.ndarray] = {}

    # -- the index, once ---------------------------------------------------------------

    def _index(self) -> None:
        """Per record, its first token's place in the stream and in its shard's data:
        two columns mapped from the cache folder (8 bytes a record each, built once per
        node, :mod:`formats.shard.column_cache`); a record's shard is found in the dataset's
        starts."""
        ds, j, item = self.dataset, self.j, self.dtype.itemsize
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

    def record_start(self, rec) -> np.ndarray:
        """Where records ``rec`` start in the stream (its end for ``len(dataset)``)."""
        rec = np.asarray(rec, np.int64)
        n = len(self._starts)
        if n == 0:
            return np.zeros(rec.shape, np.int64)
        return np.where(rec < n, self._starts[np.minimum(rec, n - 1)], self.num_tokens)

    def shard_of(self, rec) -> np.ndarray:
        return np.searchsorted(self.dataset.starts, rec, side="right") - 1

    # -- where blocks lie --------------------------------------------------------------

    def locate(self, blocks: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per block: its first token's record, that record's shard, the token's element
        in the shard's data, and whether the block lies in that one record."""
        first = blocks * self.block_size
        # Records of no tokens share their start with the next one: side="right" finds
        # the last of them, which holds the token.
        rec = np.searchsorted(self._starts, first, side="right") - 1
        begin = self._starts[rec]
        inside = first - begin + self.block_size + 1 <= self.record_start(rec + 1) - begin
        return rec, self.shard_of(rec), self._elem[rec] + first - begin, inside

    def pieces(self, blocks: np.ndarray, rec: np.ndarray) -> tuple[np.ndarray, ...]:
        """The pieces of blocks that cross records (``rec``: each one's first record),
        one per record touched, block by block: (the block's index in ``blocks``, record,
        shard, source element, offset in the block, length)."""
        width = self.block_size + 1
        first = blocks * self.block_size
        last = np.searchsorted(self._starts, first + width - 1, side="right") - 1
        per = last - rec + 1
        owner = np.repeat(np.arange(len(blocks)), per)
        prec = np.repeat(rec, per) + (np.arange(per.sum()) - np.repeat(np.cumsum(per) - per, per))
        lo_tok = np.maximum(self._starts[prec], first[owner])
        hi_tok = np.minimum(self.record_start(prec + 1), first[owner] + width)
        return (owner, prec, self.shard_of(prec), self._elem[prec] + lo_tok - self._starts[prec],
                lo_tok - first[owner], hi_tok - lo_tok)

    # -- reading -----------------------------------------------------------------------

    def view(self, s: int) -> np.ndarray:
        """Shard ``s``'s data file as tokens (checked for truncation on every call)."""
        data = self.dataset.shard(s).data
        return data[: data.size - data.size % self.dtype.itemsize].view(self.dtype)

    def rows(self, s: int) -> np.ndarray:
        """Every ``block_size + 1`` run of shard ``s``'s tokens as one row (a view whose rows
        overlap): a fancy index on it copies whole rows in C."""
        self.dataset.shard(s)  # the file still has its full size (the guard against SIGBUS)
        rows = self._rows.pop(s, None)  # re-inserted last: the dict is in order of use
        if rows is None:
            view = self.view(s)
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

    def checked(self, records: np.ndarray) -> np.ndarray:
        """Whether each of ``records`` had its checksum checked in this process."""
        bit = np.uint8(1) << (records & 7).astype(np.uint8)
        return (self._verified[records >> 3] & bit) != 0

    def verify(self, records: np.ndarray) -> None:
        """Check the records' checksums, each once in this process."""
        seen = self.checked(records)
        if seen.all():
            return
        ds = self.dataset
        for r in np.unique(records[~seen]).tolist():
            s = int(self.shard_of(r))
            local = r - int(ds.starts[s])
            sh = ds.shard(s)
            payload = sh.payload(local, self.j)
            if crc32c(payload) != int(sh.crcs[local, self.j]):
                sh.check(local, self.j, payload)  # raises, naming shard, record and offset
            self._verified[r >> 3] |= np.uint8(1 << (r & 7))

    def release(self) -> None:
        """Drop the shard views (their maps); the dataset stays open."""
        self._rows = {}
