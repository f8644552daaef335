"""Lookup by key at any dataset size: a hash index mapped from the node's cache.

Sorting every key in each process's memory costs the keys' bytes plus 16 bytes a
record per process, and about a second per million keys on every rank (minutes
at 10^9). Instead the index is two columns built once per node in the cache
folder (:mod:`formats.shard.column_cache`) and mapped by every process: each key's
64-bit hash, sorted, and beside it the record that holds the key, 16 bytes a
record in all. The build reads the metadata tables shard by shard and sorts in
buckets of the hash's top bits, so its memory is bounded by the largest shard and
bucket, not the dataset.

A lookup hashes the key, bisects the mapped hashes (some 30 page reads at 10^9
records) and then *reads the key of every candidate record back*: a hash
collision costs a comparison, never a wrong record. Where the dataset's ``str``
field ``key`` holds the same key as the metadata for every record (what the packer
writes; the build checks it, for a local dataset only: a remote one would download
every shard), that read is the field's payload, an index lookup; otherwise it is
the candidate shard's metadata table (the last few are kept), about a millisecond
for a shard of 2,500 records, 35 ms for one of 10^5. Equal keys keep record order
(stable sorts), so a key's records come back ascending. Records without a key (null) hash to 0,
a value no key hashes to, and are never found.
"""

from __future__ import annotations

import bisect
import difflib
import warnings
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from ..errors import FormatError
from .arrow_strings import string_buffers
from .column_cache import cached_columns, columns_folder, discard, scratch
from .column_file import intact

__all__ = ["CLOSE_MATCH_SCAN", "CLOSE_MATCH_SHARDS", "KeyIndex", "key_hash", "key_hashes"]

# Close matches of a missing key are sought among the keys of the first shards, up to
# this many keys and shards (all of them in a dataset this small), read once per
# index, and of those only the ones that sort next to it (difflib costs ~10 us per
# candidate).
CLOSE_MATCH_SCAN = 100_000
CLOSE_MATCH_SHARDS = 64
CLOSE_MATCH_NEAR = 200
_BUCKET = 1 << 20  # hashes sorted at once by the build: 16 MB with their records
_CHUNK = 1 << 20  # hashes read at once by the build's passes over the column (~60 MB of work arrays)
_SHARDS_KEPT = 4  # shards whose keys a lookup keeps for its checks
_COLUMNS = ("key-sorted-hash", "key-sorted-record", "key-in-field")
_NONE = np.zeros(0, np.int64)

# MurmurHash3's finalizer multipliers and the golden ratio's: Python ints for the
# one-key hash, numpy scalars for the column's.
_C1, _C2, _PHI = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x9E3779B97F4A7C15
_M1, _M2, _GOLDEN = np.uint64(_C1), np.uint64(_C2), np.uint64(_PHI)


def _fmix(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer: every input bit reaches every output bit."""
    h ^= h >> np.uint64(33)
    h *= _M1
    h ^= h >> np.uint64(33)
    h *= _M2
    h ^= h >> np.uint64(33)
    return h


def key_hashes(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The 64-bit hash of each key's UTF-8 bytes (uint64; 0 for a null key, which no
    key hashes to), in numpy: one pass per 8 bytes of the longest key, over the keys
    that long, so the cost is the keys' bytes / 8 vector steps, not a call per key."""
    return _hash(*string_buffers(keys))


def _hash(off: np.ndarray, raw: np.ndarray, valid: np.ndarray) -> np.ndarray:
    lengths = np.diff(off)
    padded = np.concatenate([raw, np.zeros(8, np.uint8)])
    # row i: the 8 bytes from raw[i] on (a view: each gather copies only what it takes)
    windows = np.lib.stride_tricks.as_strided(padded, (max(len(padded) - 7, 0), 8), (1, 1))
    h = _fmix(lengths.astype(np.uint64) ^ _GOLDEN)
    active = np.flatnonzero(lengths)
    word = 0
    while active.size:
        left = lengths[active] - 8 * word
        chunk = np.ascontiguousarray(windows[off[active] + 8 * word]).view("<u8").reshape(-1)
        short = left < 8
        if short.any():  # drop the bytes past the key's end
            bits = (left[short] * 8).astype(np.uint64)
            chunk[short] &= (np.uint64(1) << bits) - np.uint64(1)
        hh = h[active] ^ chunk
        hh *= _GOLDEN
        hh ^= hh >> np.uint64(29)
        h[active] = hh
        word += 1
        active = active[left > 8]
    h = _fmix(h)
    h[h == 0] = 1
    h[~valid] = 0
    return h


_MASK = (1 << 64) - 1


def _fmix_one(h: int) -> int:
    h ^= h >> 33
    h = (h * _C1) & _MASK
    h ^= h >> 33
    h = (h * _C2) & _MASK
    return h ^ (h >> 33)


def key_hash(key: bytes) -> int:
    """:func:`key_hashes` of one key's UTF-8 bytes, in Python ints: a lookup hashes one
    key, where numpy's per-call overhead would cost ten times the arithmetic."""
    h = _fmix_one(len(key) ^ _PHI)
    for at in range(0, len(key), 8):
        h = ((h ^ int.from_bytes(key[at:at + 8], "little")) * _PHI) & _MASK
        h ^= h >> 29
    return _fmix_one(h) or 1


class KeyIndex:
    """Record keys to global record indices for the dataset ``ds`` (see the module).

    Attributes:
        records: the dataset's record count.
        size: how many records have a key.
    """

    def __init__(self, ds) -> None:
        self.ds = ds
        self.records = len(ds)
        self._shard_keys: OrderedDict[int, tuple] = OrderedDict()
        self._near: tuple[list[str], list[bytes]] | None = None  # see close_matches
        self._map()

    def _map(self) -> None:
        columns = _build(self.ds)
        self._hashes, self._records = columns["key-sorted-hash"], columns["key-sorted-record"]
        self._in_field = columns["key-in-field"]
        self.by_field = bool(self._in_field[0])
        self.size = self.records - int(np.searchsorted(self._hashes, np.uint64(1)))

    def find(self, key: str) -> np.ndarray:
        """The record indices with ``key``, ascending (empty when there is none).

        Raises:
            FormatError: the index is damaged again right after it was rebuilt.
        """
        target = key.encode("utf-8", "surrogatepass")  # a lone surrogate matches nothing
        h = key_hash(target)
        found, damage = self._find(target, h)
        if damage is None:
            return found
        warnings.warn(f"shardpack: the key index of {self.ds.root} is damaged ({damage}): "
                      "rebuilding it", RuntimeWarning, stacklevel=3)
        discard(self.ds, _COLUMNS)
        self._shard_keys.clear()
        self._map()
        found, damage = self._find(target, h)
        if damage is not None:
            raise FormatError(f"the key index is damaged again after a rebuild ({damage})",
                              path=columns_folder(self.ds))
        return found

    def _find(self, target: bytes, h: int) -> tuple[np.ndarray, str | None]:
        """:meth:`find`'s records, and what is damaged when the index is found so: a
        record number out of range, or a miss where a chunk the lookup read fails its
        checksum (a miss re-checks those few chunks, about a millisecond; a hit needs
        no check, its key was read back)."""
        lo, hi = (int(np.searchsorted(self._hashes, np.uint64(h), side))
                  for side in ("left", "right"))
        candidates = self._records[lo:hi].tolist()
        if any(not 0 <= r < self.records for r in candidates):
            return _NONE, f"a record number out of range 0..{self.records - 1}"
        found = [r for r in candidates if self._key_of(r) == target]
        if not found and not (
                intact(self._in_field) and intact(self._records, (lo, hi))
                and intact(self._hashes, (lo - 1, hi + 1),
                           *((p, p + 1) for p in _probes(self._hashes, h)))):
            return _NONE, "a chunk the lookup read fails its checksum"
        return np.asarray(found, np.int64), None

    def _key_of(self, record: int) -> bytes | None:
        if self.by_field and self.ds._shards:  # not closed (its metadata still reads)
            return bytes(self.ds.payload(record, "key"))
        s, r = self.ds.locate(record)
        keys = self._shard_keys.get(s)
        if keys is None:
            keys = string_buffers(self.ds.metadata(["key"], shard=s).column("key"))
            self._shard_keys[s] = keys
            if len(self._shard_keys) > _SHARDS_KEPT:
                self._shard_keys.popitem(last=False)
        else:
            self._shard_keys.move_to_end(s)
        off, raw, valid = keys
        return raw[off[r]:off[r + 1]].tobytes() if valid[r] else None

    def close_matches(self, key: str, n: int = 3) -> list[str]:
        """Up to ``n`` keys like ``key`` (:func:`difflib.get_close_matches`) among the
        first :data:`CLOSE_MATCH_SCAN` keys of the dataset, in at most
        :data:`CLOSE_MATCH_SHARDS` shards (read once per index), of those the
        ``2 * CLOSE_MATCH_NEAR`` that sort next to ``key``."""
        if self._near is None:
            seen: list[str] = []
            for s in range(min(len(self.ds.starts) - 1, CLOSE_MATCH_SHARDS)):
                column = self.ds.metadata(["key"], shard=s).column("key")
                seen.extend(k for k in column.to_pylist() if k is not None)
                if len(seen) >= CLOSE_MATCH_SCAN:
                    break
            ordered = sorted(set(seen[:CLOSE_MATCH_SCAN]),
                             key=lambda k: k.encode("utf-8", "surrogatepass"))
            self._near = ordered, [k.encode("utf-8", "surrogatepass") for k in ordered]
        ordered, encoded = self._near
        at = bisect.bisect_left(encoded, key.encode("utf-8", "surrogatepass"))
        near = ordered[max(0, at - CLOSE_MATCH_NEAR):at + CLOSE_MATCH_NEAR]
        return difflib.get_close_matches(key, near, n=n)

    @property
    def nbytes(self) -> int:
        """Bytes the index maps (shared by the node's processes through the page cache)."""
        return self._hashes.nbytes + self._records.nbytes


def _build(ds) -> dict[str, np.ndarray]:
    """The sorted hash and record columns, built once per node (see the module)."""
    n = len(ds)
    bits = max(0, int(np.ceil(np.log2(max(n, 1) / _BUCKET))))

    def build(out: dict[str, np.ndarray]) -> None:
        sorted_hash, sorted_record = out["key-sorted-hash"], out["key-sorted-record"]
        same = ds.local_files and _plain_key_field(ds)
        with scratch(sorted_hash, "key-unsorted", (n,), np.uint64) as hashes:
            starts = ds.starts
            for s in range(len(starts) - 1):  # in record order, shard by shard
                a, b = int(starts[s]), int(starts[s + 1])
                if b > a:
                    keys = string_buffers(ds.metadata(["key"], shard=s).column("key"))
                    hashes[a:b] = _hash(*keys)
                    same = same and _field_agrees(ds, a, b, *keys)
            out["key-in-field"][0] = same
            _sort(hashes, sorted_hash, sorted_record, bits)

    hashes, records, in_field = _COLUMNS
    return cached_columns(ds, {hashes: ((n,), np.uint64), records: ((n,), np.int64),
                               in_field: ((1,), np.bool_)}, build)


def _probes(hashes: np.ndarray, h: int) -> Iterator[int]:
    """The positions a binary search for ``h`` in ``hashes`` reads, both sides (a damaged
    one on the way sends the search astray, to a place that looks intact)."""
    for right in (False, True):
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi) // 2
            yield mid
            v = int(hashes[mid])
            if v < h or (right and v == h):
                lo = mid + 1
            else:
                hi = mid


def _plain_key_field(ds) -> bool:
    """Whether ``ds`` has an uncompressed ``str`` field ``key`` (its payload is the key)."""
    j = ds.field_index.get("key")
    return j is not None and ds.fields[j].type == "str" and ds.fields[j].compression == "none"


def _field_agrees(ds, a: int, b: int, off: np.ndarray, raw: np.ndarray,
                  valid: np.ndarray) -> bool:
    """Whether records ``a:b`` (one shard) hold in their ``key`` field exactly the keys
    their metadata gives (``off``, ``raw``, ``valid``)."""
    if not valid.all():
        return False
    views = ds.payloads(np.arange(a, b, dtype=np.int64), "key")
    lengths = np.fromiter(map(len, views), np.int64, len(views))
    return (np.array_equal(lengths, np.diff(off))
            and b"".join(views) == raw[off[0]:off[-1]].tobytes())


def _sort(hashes: np.ndarray, sorted_hash: np.ndarray, sorted_record: np.ndarray,
          bits: int) -> None:
    """``hashes`` sorted stably into ``sorted_hash``, their record numbers beside them:
    scattered into ``2**bits`` buckets of the top bits (and one of the records
    without a key), then each bucket of keys sorted."""
    n = len(hashes)
    if bits == 0:  # one bucket: one stable sort
        order = np.argsort(hashes, kind="stable")
        sorted_hash[:] = hashes[order]
        sorted_record[:] = order
        return
    shift = np.uint64(64 - bits)

    def buckets(h: np.ndarray) -> np.ndarray:
        # Bucket 0 holds the records without a key (hash 0), left unsorted: however
        # many they are, they are in record order already, and sort first.
        return np.where(h == 0, 0, (h >> shift).astype(np.int64) + 1)

    counts = np.zeros((1 << bits) + 1, np.int64)
    for a in range(0, n, _CHUNK):
        counts += np.bincount(buckets(np.asarray(hashes[a:a + _CHUNK])),
                              minlength=len(counts))
    ends = np.cumsum(counts)
    filled = ends - counts  # the next free place of each bucket
    for a in range(0, n, _CHUNK):  # scatter, keeping record order within a bucket
        h = np.asarray(hashes[a:a + _CHUNK])
        bucket = buckets(h)
        order = np.argsort(bucket, kind="stable")
        b = bucket[order]
        first = np.r_[0, np.flatnonzero(np.diff(b)) + 1]  # each bucket's run in b
        sizes = np.diff(np.r_[first, len(b)])
        places = filled[b] + np.arange(len(b)) - np.repeat(first, sizes)
        sorted_hash[places] = h[order]
        sorted_record[places] = order + a
        filled[b[first]] += sizes
    lo = int(ends[0])
    for hi in ends[1:].tolist():  # each bucket of keys sorted by hash, stably
        if hi - lo > 1:
            seg = np.asarray(sorted_hash[lo:hi])
            order = np.argsort(seg, kind="stable")
            sorted_hash[lo:hi] = seg[order]
            sorted_record[lo:hi] = np.asarray(sorted_record[lo:hi])[order]
        lo = hi
