"""Random access to a whole dataset by global record index.

Opening reads the manifest and maps each shard's two files: O(shards), nothing
per record. A global index maps to (shard, record) through prefix sums; a batch
of indices is located with one ``searchsorted`` and gathered per shard in numpy.
The object pickles without its maps (worker processes reopen them lazily).
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from .checksum import crc32c
from .errors import CorruptRecordError, DecompressionError, FormatError, SchemaError
from .fields import BYTES_TYPES, SCALAR_TYPES, Field, decode_value
from .files import safe_child
from .manifest import Manifest, read_manifest
from .shard import ShardReader
from .shard_writer import META_SCHEMA

__all__ = ["ShardDataset", "open_shards", "read_metadata"]


def open_shards(path: str | Path, *, check_crc: bool = False) -> ShardDataset:
    """Open the dataset in ``path`` (see :class:`ShardDataset`)."""
    return ShardDataset(path, check_crc=check_crc)


class ShardDataset:
    """A read-only dataset.

    Args:
        path: the dataset folder (holding ``manifest.json``).
        check_crc: verify each field's CRC32C when it is read (costs one pass over
            the bytes; :func:`formats.verify_dataset` always checks).

    Raises:
        ManifestError, VersionError, FormatError: the dataset is incomplete,
            damaged, or of an unknown major version.
    """

    def __init__(self, path: str | Path, *, check_crc: bool = False) -> None:
        self.root = Path(path)
        self.check_crc = check_crc
        self.manifest: Manifest = read_manifest(self.root)
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
        self._dictionaries = self._load_dictionaries()
        self._decompressors: dict[int, zstandard.ZstdDecompressor] = {}
        self._shards: list[ShardReader | None] = [None] * len(self.manifest.shards)
        self._open_all()

    def _open_all(self) -> None:
        self._shards = [self._map_shard(s) for s in range(len(self.manifest.shards))]

    def _map_shard(self, s: int) -> ShardReader:
        m = self.manifest
        return ShardReader(self.root, m.shards[s], len(self.fields), m.alignment)

    def _open_shard(self, s: int) -> ShardReader:
        """Map shard ``s`` on first use (datasets that open shards lazily; see reader.remote)."""
        self._shards[s] = reader = self._map_shard(s)
        return reader

    def _will_use(self, shards) -> None:
        """Called with the distinct shards of a batch before they are read."""
        for k in shards:
            if self._shards[k] is None:
                self._open_shard(k)

    def shard(self, s: int) -> ShardReader:
        """The reader of shard ``s`` (mapped on first use)."""
        reader = self._shards[s]
        return reader if reader is not None else self._open_shard(s)

    def _load_dictionaries(self) -> dict[str, bytes]:
        out = {}
        for field, (name, crc) in self.manifest.dictionaries.items():
            path = safe_child(self.root, name, what="dictionary file name")
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise FormatError(f"cannot read zstd dictionary ({exc.strerror})", path=path) from None
            if crc32c(data) != crc:
                raise FormatError("zstd dictionary checksum mismatch", path=path)
            out[field] = data
        return out

    # -- pickling: worker processes reopen the maps ----------------------------------

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_shards"] = None
        state["_decompressors"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._open_all()

    def close(self) -> None:
        for s in self._shards or ():
            if s is not None:
                s.close()
        self._shards = []

    def __enter__(self) -> ShardDataset:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- shape -------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def classes(self) -> tuple[str, ...] | None:
        return self.manifest.classes

    @property
    def shards(self) -> list[ShardReader]:
        return self._shards

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
        return self.shard(s).payload(r, self.field_index[field], self.check_crc)

    def get(self, index: int, field: str) -> Any:
        """The decoded value of one field of one record."""
        s, r = self.locate(index)
        j = self.field_index[field]
        return self._decode(s, r, j, self.shard(s).payload(r, j, self.check_crc))

    def __getitem__(self, index: int) -> dict[str, Any]:
        """All fields of one record: bytes fields as zero-copy memoryviews."""
        s, r = self.locate(int(index))
        shard = self._shards[s]
        if shard is None:
            shard = self._open_shard(s)
        if not shard.validated:
            shard.validate()
        # One row of the index as Python ints, then a slice per field: the per-record
        # cost is a few attribute lookups, not a numpy scalar per field.
        view = shard.view
        out = {}
        for j, (o, n) in enumerate(zip(shard.offsets[r].tolist(), shard.lengths[r].tolist(),
                                       strict=True)):
            payload = view[o : o + n]
            if self.check_crc:
                shard.check(r, j, payload)
            out[self._names[j]] = payload if self._plain[j] else self._decode(s, r, j, payload)
        return out

    def _decode(self, s: int, r: int, j: int, view: memoryview) -> Any:
        f = self.fields[j]
        try:
            if f.compression == "zstd":
                view = memoryview(self._decompress(j, view))
            return decode_value(f, view)
        except (SchemaError, DecompressionError) as exc:
            shard = self._shards[s]
            cls = DecompressionError if isinstance(exc, DecompressionError) else CorruptRecordError
            raise cls(
                exc.message, path=shard.data_path, record=r, offset=int(shard.offsets[r, j]),
                found=exc.found, expected=exc.expected,
            ) from None

    def _decompress(self, j: int, view) -> bytes:
        f = self.fields[j]
        bound = self.manifest.max_raw_size.get(f.name, 0)
        size = zstandard.frame_content_size(view) if len(view) >= 4 else -2
        if size < 0 or size > bound:
            raise DecompressionError(
                f"field {f.name!r}: zstd frame content size", found=size, expected=f"0..{bound}"
            )
        d = self._decompressors.get(j)
        if d is None:
            dd = self._dictionaries.get(f.name)
            d = zstandard.ZstdDecompressor(
                dict_data=None if dd is None else zstandard.ZstdCompressionDict(dd)
            )
            self._decompressors[j] = d
        try:
            out = d.decompress(view, max_output_size=bound)
        except zstandard.ZstdError as exc:
            raise DecompressionError(f"field {f.name!r}: damaged zstd payload ({exc})") from None
        if len(out) != size:
            raise DecompressionError(f"field {f.name!r}: zstd payload size", found=len(out), expected=size)
        return out

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

    def spans(self, indices, field: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where one field of many records lies: (shard numbers, byte offsets, lengths).

        All numpy, one gather per distinct shard: the batch-level lookup the loader uses.
        """
        shard, _, offsets, lengths = self._gather(indices, self.field_index[field])
        return shard, offsets, lengths

    def _gather(self, indices, j: int):
        """(shard numbers, records within shards, offsets, lengths) of field ``j``."""
        shard, local = self.locate_many(indices)
        offsets = np.empty(shard.shape, np.uint64)
        lengths = np.empty(shard.shape, np.uint64)
        if len(self._shards) == 1:
            s = self.shard(0)
            s.validate()
            offsets[:] = s.offsets[local, j]
            lengths[:] = s.lengths[local, j]
            return shard, local, offsets, lengths
        distinct = np.unique(shard).tolist()
        self._will_use(distinct)
        for k in distinct:
            s = self._shards[k]
            s.validate()
            m = shard == k
            offsets[m] = s.offsets[local[m], j]
            lengths[m] = s.lengths[local[m], j]
        return shard, local, offsets, lengths

    def payloads(self, indices, field: str) -> list[memoryview]:
        """Zero-copy stored bytes of one field for many records."""
        j = self.field_index[field]
        shard, local, offsets, lengths = self._gather(indices, j)
        views = [None if s is None else s.view for s in self._shards]
        out = [
            views[s][o:e]
            for s, o, e in zip(shard.tolist(), offsets.tolist(), (offsets + lengths).tolist(), strict=True)
        ]
        if self.check_crc:
            for s, r, v in zip(shard.tolist(), local.tolist(), out, strict=True):
                self._shards[s].check(r, j, v)
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
        shard, local, offsets, lengths = self._gather(indices, j)
        if lengths.size and (lengths != 8).any():
            k = int(np.flatnonzero(lengths != 8)[0])
            raise CorruptRecordError(f"{f.type} field {field!r} payload size",
                                     path=self._shards[int(shard[k])].data_path,
                                     record=int(local[k]), found=int(lengths[k]), expected=8)
        if self.check_crc:
            for s, r, o in zip(shard.tolist(), local.tolist(), offsets.tolist(), strict=True):
                self._shards[s].check(r, j, self._shards[s].view[o : o + 8])
        out = np.empty(shard.shape, dt)
        slots = (offsets // 8).astype(np.int64)
        for k in (np.unique(shard) if len(self._shards) > 1 else [0]):
            data = self._shards[k].data
            words = data[: data.size - data.size % 8].view(dt)
            m = slice(None) if len(self._shards) == 1 else shard == k
            out[m] = words[slots[m]]
        return out

    # -- metadata ---------------------------------------------------------------------

    def metadata(self, columns: list[str] | None = None) -> pa.Table:
        """The per-record metadata table of all shards (see :func:`read_metadata`)."""
        return read_metadata(self.root, columns, self.manifest)


def read_metadata(path: str | Path, columns: list[str] | None = None,
                  manifest: Manifest | None = None) -> pa.Table:
    """The per-record metadata table (label, key, size, width, height), in record order.

    Reads the manifest and the small ``.meta.parquet`` files only, never the data
    files: for filtering, statistics and size-aware batching.
    """
    root = Path(path)
    manifest = manifest or read_manifest(root)
    tables = []
    for e in manifest.shards:
        p = root / e.meta_file
        try:
            tables.append(pq.read_table(p, columns=columns))
        except (OSError, pa.ArrowException) as exc:
            raise FormatError(f"cannot read the metadata table ({exc})", path=p) from None
        if tables[-1].num_rows != e.records:
            raise FormatError("metadata table row count disagrees with the manifest", path=p,
                              found=tables[-1].num_rows, expected=e.records)
    if not tables:
        schema = META_SCHEMA if columns is None else pa.schema([META_SCHEMA.field(c) for c in columns])
        return schema.empty_table()
    return pa.concat_tables(tables)
