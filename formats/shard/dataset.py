"""Random access to a whole dataset by global record index.

Opening reads the manifest and checks each shard's two files: O(shards), nothing
per record. A global index maps to (shard, record) through prefix sums; a batch
of indices is located with one ``searchsorted`` and gathered shard by shard in
numpy. Which shards are open, and checking them before each read, is
:class:`formats.shard.shard_set.ShardSet`'s: a batch reads one shard at a time, so it
never needs more open at once than that allows. The object pickles without its
maps (worker processes reopen them lazily).
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import CorruptRecordError, SchemaError
from ..fields import BYTES_TYPES, SCALAR_TYPES, Field
from .decoding import FieldDecoder, load_dictionaries
from .metadata import read_metadata
from .shard_set import ShardSet, default_max_open

__all__ = ["ShardDataset", "default_max_open", "open_shards", "read_metadata"]


def open_shards(path: str | Path, *, check_crc: bool = False, follow_symlinks: bool = False,
                max_open: int | None = None) -> ShardDataset:
    """Open the dataset in ``path`` (see :class:`ShardDataset`)."""
    return ShardDataset(path, check_crc=check_crc, follow_symlinks=follow_symlinks,
                        max_open=max_open)


class ShardDataset(ShardSet):
    """A read-only dataset.

    Args:
        path: the dataset folder (holding ``manifest.json``).
        check_crc: verify each field's CRC32C when it is read (costs one pass over
            the bytes; :func:`formats.verify_dataset` always checks).
        follow_symlinks: read dataset files that are symlinks to files outside
            the folder (refused by default; FORMAT.md, §8).
        max_open: shards this process keeps open (default: :func:`default_max_open`).

    Raises:
        ManifestError, VersionError, FormatError: the dataset is incomplete,
            damaged, or of an unknown major version.
        UnsafePathError: a file is a symlink out of the folder.
    """

    def __init__(self, path: str | Path, *, check_crc: bool = False, follow_symlinks: bool = False,
                 max_open: int | None = None) -> None:
        super().__init__(path, follow_symlinks=follow_symlinks, max_open=max_open)
        self.check_crc = check_crc
        self.fields: tuple[Field, ...] = self.manifest.fields
        self.field_index = {f.name: i for i, f in enumerate(self.fields)}
        self._names = [f.name for f in self.fields]
        # Fields whose value is the stored bytes themselves (no decoding at all).
        self._plain = [f.type in BYTES_TYPES and f.compression == "none" for f in self.fields]
        counts = np.fromiter((s.records for s in self.manifest.shards), np.int64,
                             len(self.manifest.shards))
        self.starts = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=self.starts[1:])
        self._starts_list = self.starts.tolist()
        self._decoder = FieldDecoder(self.fields, self.manifest.max_raw_size,
                                     load_dictionaries(self.root, self.manifest, follow_symlinks))
        self._open_all()

    # -- shape -------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def classes(self) -> tuple[str, ...] | None:
        return self.manifest.classes

    def __repr__(self) -> str:
        schema = ", ".join(f"{f.name}:{f.type}" for f in self.fields)
        return f"ShardDataset({str(self.root)!r}, records={len(self)}, shards={len(self._shards)}, {schema})"

    # -- single records ---------------------------------------------------------------

    def locate(self, index: int) -> tuple[int, int]:
        """(shard number, record within the shard) of a global index."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"record {index} out of range for a dataset of {n} records")
        if index < 0:
            index += n
        s = bisect.bisect_right(self._starts_list, index) - 1
        return s, index - self._starts_list[s]

    def payload(self, index: int, field: str) -> memoryview:
        """The stored bytes of one field (zero-copy; compressed if the field is)."""
        s, r = self.locate(index)
        return self._ready(s).payload(r, self.field_index[field], self.check_crc)

    def get(self, index: int, field: str) -> Any:
        """The decoded value of one field of one record."""
        s, r = self.locate(index)
        j = self.field_index[field]
        return self._decode(s, r, j, self._ready(s).payload(r, j, self.check_crc))

    def __getitem__(self, index: int) -> dict[str, Any]:
        """All fields of one record: bytes fields as zero-copy memoryviews."""
        s, r = self.locate(int(index))
        shard = self._ready(s)
        # One row of the index as Python ints, then a slice per field: the per-record
        # cost is a few attribute lookups, not a numpy scalar per field.
        view = shard.view
        out = {}
        decode, plain, check = self._decoder.decode, self._plain, self.check_crc
        j = 0
        try:
            for j, (o, n) in enumerate(zip(shard.offsets[r].tolist(), shard.lengths[r].tolist(),
                                           strict=True)):
                payload = view[o : o + n]
                if check:
                    shard.check(r, j, payload)
                out[self._names[j]] = payload if plain[j] else decode(j, payload)
        except CorruptRecordError as exc:
            if exc.path is not None:  # a checksum error: already says where
                raise
            raise self._located(exc, s, r, j) from None
        return out

    def _decode(self, s: int, r: int, j: int, view: memoryview) -> Any:
        try:
            return self._decoder.decode(j, view)
        except CorruptRecordError as exc:  # and DecompressionError
            raise self._located(exc, s, r, j) from None

    def _located(self, exc: CorruptRecordError, s: int, r: int, j: int) -> CorruptRecordError:
        """``exc`` (which says what) with where: the shard's file, the record, the offset."""
        shard = self._shards[s]
        return type(exc)(exc.message, path=shard.data_path, record=r,
                         offset=int(shard.offsets[r, j]), found=exc.found, expected=exc.expected)

    # -- many records at once ---------------------------------------------------------

    def locate_many(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Vectorized :meth:`locate`: (shard numbers, records within shards)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx[(idx < 0) | (idx >= n)][0])
            raise IndexError(f"record {bad} out of range for a dataset of {n} records")
        shard = np.searchsorted(self.starts, idx, side="right") - 1
        return shard, idx - self.starts[shard]

    def _groups(self, shard: np.ndarray) -> list[tuple[int, Any]]:
        """``(shard, positions in the batch)`` for each distinct shard of a batch, in order.

        A batch is read one shard at a time, so it never needs more than one shard
        open at once however many it touches (see "Open shards" above).
        """
        if len(self._shards) == 1 or shard.size == 0:
            return [(0, slice(None))] if shard.size else []
        order = np.argsort(shard, kind="stable")
        ordered = shard[order]
        bounds = [0, *(np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist(), shard.size]
        firsts = ordered[bounds[:-1]].tolist()
        return [(k, order[a:b]) for k, a, b in zip(firsts, bounds, bounds[1:])]  # noqa: B905

    def _gather(self, indices, j: int, views: dict | None = None):
        """(shard numbers, records within shards, offsets, lengths) of field ``j``;
        with ``views``, also each shard's data as a memoryview, by shard number."""
        shard, local = self.locate_many(indices)
        offsets = np.empty(shard.shape, np.uint64)
        lengths = np.empty(shard.shape, np.uint64)
        for k, pos in self._groups(shard):
            s = self._ready(k)
            loc = local[pos]
            offsets[pos] = s.offsets[loc, j]
            lengths[pos] = s.lengths[loc, j]
            if views is not None:
                views[k] = s.view  # slices of it outlive close(), holding the map
        return shard, local, offsets, lengths

    def spans(self, indices, field: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where one field of many records lies: (shard numbers, byte offsets, lengths).

        All numpy, one gather per distinct shard: the batch-level lookup the loader uses.
        """
        shard, _, offsets, lengths = self._gather(indices, self.field_index[field])
        return shard, offsets, lengths

    def payloads(self, indices, field: str) -> list[memoryview]:
        """Zero-copy stored bytes of one field for many records.

        Only a batch spanning more shards than this process keeps open is not all
        zero-copy: the records of its shards closed before it ends are copied, or
        each of their maps, held by its views, would keep a descriptor open.
        """
        j = self.field_index[field]
        if self._bounded:
            shard, local = self.locate_many(indices)
            groups = self._groups(shard)
            if len(groups) > self.max_open:
                return self._payloads_copying(shard, local, groups, j)
        views: dict[int, memoryview] = {}
        shard, local, offsets, lengths = self._gather(indices, j, views)
        out = [
            views[s][o:e]
            for s, o, e in zip(shard.tolist(), offsets.tolist(), (offsets + lengths).tolist(), strict=True)
        ]
        if self.check_crc:
            for s, r, v in zip(shard.tolist(), local.tolist(), out, strict=True):
                self._check(s, r, j, v)
        return out

    def _check(self, s: int, r: int, j: int, payload) -> None:
        shard = self._shards[s] or self._ready(s)
        shard.check(r, j, payload)

    def _payloads_copying(self, shard, local, groups, j: int) -> list[memoryview]:
        out: list = [None] * shard.size
        copy = len(groups) - self.max_open  # the shards closed again within this batch
        for g, (k, pos) in enumerate(groups):
            s = self._ready(k)
            loc = local[pos]
            starts = s.offsets[loc, j]
            view = s.view
            for p, r, o, e in zip(pos.tolist(), loc.tolist(), starts.tolist(),
                                  (starts + s.lengths[loc, j]).tolist(), strict=True):
                out[p] = memoryview(view[o:e].tobytes()) if g < copy else view[o:e]
                if self.check_crc:
                    s.check(r, j, out[p])
        return out

    def scalars(self, indices, field: str) -> np.ndarray:
        """An ``int``/``float`` field for many records as one int64/float64 array.

        Payloads are 8 bytes at 8-aligned offsets, so this is a gather from an
        8-byte view of each data file: no per-record Python work.
        """
        f = self.fields[self.field_index[field]]
        if f.type not in SCALAR_TYPES:
            raise SchemaError(f"field {field!r} is {f.type}, not int or float")
        dt = np.dtype("<i8" if f.type == "int" else "<f8")
        j = self.field_index[field]
        shard, local = self.locate_many(indices)
        out = np.empty(shard.shape, dt)
        lengths = np.empty(shard.shape, np.uint64)
        for k, pos in self._groups(shard):
            s = self._ready(k)
            loc = local[pos]
            offsets = s.offsets[loc, j]
            lengths[pos] = s.lengths[loc, j]
            # Offsets were validated to lie in the file: a wrong length is found below.
            out[pos] = s.words(dt)[offsets >> 3]
            if self.check_crc:
                for r, o in zip(loc.tolist(), offsets.tolist(), strict=True):
                    s.check(r, j, s.view[o : o + 8])
        if lengths.size and (lengths != 8).any():
            i = int(np.flatnonzero(lengths != 8)[0])
            k = int(shard[i])
            raise CorruptRecordError(f"{f.type} field {field!r} payload size",
                                     path=self.root / self.manifest.shards[k].data_file,
                                     record=int(local[i]), found=int(lengths[i]), expected=8)
        return out

    # -- metadata ---------------------------------------------------------------------

    def metadata(self, columns: list[str] | None = None) -> pa.Table:
        """The per-record metadata table of all shards (see :func:`read_metadata`)."""
        return read_metadata(self.root, columns, self.manifest,
                             follow_symlinks=self.follow_symlinks)
