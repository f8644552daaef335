"""Random access to a whole dataset by global record index.

Opening reads the manifest and its shard table; a dataset of a few shards (at
most 256) has every shard's two files opened and checked at once, a larger one
each when a read first needs it (a million shards open in a fraction of a
second). A global index maps to (shard, record) through prefix sums; a batch
of indices is located with one ``searchsorted`` and gathered shard by shard in
numpy. Which shards are open, and checking them before each read, is
:class:`formats.shard.shard_set.ShardSet`'s: a batch reads one shard at a time, so it
never needs more open at once than that allows. The object pickles without its
maps (worker processes reopen them lazily).

A record is also found by its key (``ds.index_of(key)``, ``ds[key]``) through the
metadata tables' ``key`` column, never the data files: a hash index built once per
node in the cache folder and mapped by every process (:mod:`formats.shard.key_index`,
16 bytes a record); a lookup bisects it and checks the candidate's key.
"""

from __future__ import annotations

import bisect
import difflib
import operator
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..checksum import crc32c, crc32c_many, crc32c_words
from ..errors import (
    ArgumentTypeError,
    CorruptRecordError,
    DatasetNotFoundError,
    DuplicateKeyError,
    RecordIndexError,
    SchemaError,
    UnknownKeyError,
    quoted,
)
from ..fields import BYTES_TYPES, SCALAR_TYPES, Field
from .decoding import PayloadDecoder, load_dictionaries
from .key_index import KeyIndex
from .lazy import LazyValues, Record
from .manifest import MANIFEST_NAME
from .metadata import read_metadata
from .shard_set import ShardSet, default_max_open

__all__ = ["ShardDataset", "check_dataset_path", "default_max_open", "open_shards",
           "read_metadata", "record_indices"]

# Entries of a missing dataset's parent folder compared for a "did you mean".
_SIBLINGS_SCANNED = 2000
# Datasets of at most this many shards find a record's shard by bisecting a list of the starts.
_LIST_SHARDS = 1 << 16
# Keys longer than this get no "close matches" (difflib's cost grows with the key).
_CLOSE_KEY_CHARS = 1000


def open_shards(path: str | Path, *, check_crc: bool = True, follow_symlinks: bool = False,
                max_open: int | None = None) -> ShardDataset:
    """Open the dataset in ``path`` (see :class:`ShardDataset`)."""
    return ShardDataset(path, check_crc=check_crc, follow_symlinks=follow_symlinks,
                        max_open=max_open)


class ShardDataset(ShardSet):
    """A read-only dataset.

    Args:
        path: the dataset folder (holding ``manifest.json``).
        check_crc: verify each field's CRC32C when it is read, as the Loader does
            (the default: one pass in C over the bytes read; ``False`` opts out;
            :func:`formats.verify_dataset` always checks).
        follow_symlinks: read dataset files that are symlinks to files outside
            the folder (refused by default; FORMAT.md, §8).
        max_open: shards this process keeps open (default: :func:`default_max_open`).

    Raises:
        DatasetNotFoundError: ``path`` does not exist or is not a folder (a
            ``ManifestError`` and a ``FileNotFoundError``).
        ManifestError, VersionError, FormatError: the dataset is incomplete,
            damaged, or of an unknown major version.
        UnsafePathError: a file is a symlink out of the folder.
    """

    def __init__(self, path: str | Path, *, check_crc: bool = True, follow_symlinks: bool = False,
                 max_open: int | None = None) -> None:
        check_dataset_path(path)
        super().__init__(path, follow_symlinks=follow_symlinks, max_open=max_open)
        self.check_crc = check_crc
        self.fields: tuple[Field, ...] = self.manifest.fields
        self.field_index = {f.name: i for i, f in enumerate(self.fields)}
        self._names = [f.name for f in self.fields]
        # Fields whose value is the stored bytes themselves (no decoding at all).
        self._plain = [f.type in BYTES_TYPES and f.compression == "none" for f in self.fields]
        self._parsed_later = [f.type == "json" for f in self.fields]  # parsed when first read
        counts = self.manifest.shards.records
        self.starts = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=self.starts[1:])
        # A list bisects in 0.3 us where the array's searchsorted takes 1.6 (a record read
        # costs some 35): kept for datasets of up to 65,536 shards, so a million shards
        # still open without a Python object each.
        self._starts_list = self.starts.tolist() if len(counts) <= _LIST_SHARDS else None
        self._decoder = PayloadDecoder(self.fields, self.manifest.max_raw_size,
                                     load_dictionaries(self.root, self.manifest, follow_symlinks))
        self._keys: KeyIndex | None = None  # built by the first lookup by key
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
        """(shard number, record within the shard) of a global index (negative ones
        count from the end, as in a list).

        Raises:
            RecordIndexError: ``index`` is out of range (an ``IndexError``).
            ArgumentTypeError: ``index`` is not an integer (a ``TypeError``; a
                float is never truncated).
        """
        if type(index) is not int:
            index = _record_index(index)
        n = len(self)
        if not -n <= index < n:
            raise RecordIndexError(f"record {index} out of range for a dataset of {n} records",
                                   path=self.root)
        if index < 0:
            index += n
        starts = self._starts_list
        if starts is None:
            s = int(self.starts.searchsorted(index, "right")) - 1
            return s, index - int(self.starts[s])
        s = bisect.bisect_right(starts, index) - 1
        return s, index - starts[s]

    def payload(self, index: int, field: str) -> memoryview:
        """The stored bytes of one field (zero-copy once its shard is mapped; compressed
        if the field is)."""
        s, r = self.locate(index)
        return self._ready(s, r).payload(r, self.field_index[field], self.check_crc)

    def where(self, index: int, field: str) -> tuple[Path, int, int]:
        """Where one field of one record is stored, for messages that name it: (the
        shard's data file, the record within the shard, the field's byte offset)."""
        s, r = self.locate(index)
        shard = self._ready(s, r)
        return shard.data_path, r, int(shard.row(r)[0][self.field_index[field]])

    def get(self, index: int, field: str) -> Any:
        """The decoded value of one field of one record."""
        s, r = self.locate(index)
        j = self.field_index[field]
        return self._decode(s, r, j, self._ready(s, r).payload(r, j, self.check_crc))

    def __getitem__(self, index: int | str | slice) -> Record | list[Record]:
        """One record by global index (negative ones count from the end) or by key (a
        ``str``, see :meth:`index_of`); a ``slice`` gives a list of records, as a list's
        slice does (``ds[:3]``, ``ds[::-1]``; each record read as ``ds[i]`` would).

        A record is a :class:`formats.shard.lazy.Record`, a mapping of field -> value
        that changes as a dict does: bytes fields as zero-copy memoryviews, a JSON
        field parsed when first read; pickled (to a DataLoader worker's parent) it is
        a ``dict`` of plain values, bytes fields as ``bytes``. Every payload's CRC32C
        is checked here, read or not, the first time the record is read from its
        shard's mapping (unless the dataset was opened with ``check_crc=False``): a
        record read again from the same mapping is not checked again (see
        ``ShardReader.checked``), a reopened shard is.

        Raises:
            RecordIndexError: the index is out of range (an ``IndexError``).
            ArgumentTypeError: not an int, str or slice (a ``TypeError``; ``ds[1.7]``
                is refused, never truncated).
            UnknownKeyError, DuplicateKeyError: a key that names no single record.
            CorruptRecordError: a payload fails its checksum or does not decode
                (names the shard file, the record and the byte offset).
        """
        if type(index) is not int:
            if isinstance(index, str):
                index = self.index_of(index)
            elif isinstance(index, slice):
                return [self[i] for i in range(*index.indices(len(self)))]
        s, r = self.locate(index)
        shard = self._ready(s, r)
        # One row of the index as Python ints, then a slice per field: the per-record
        # cost is a few attribute lookups, not a numpy scalar per field.
        view = shard.view
        out: dict[str, Any] = {}
        later: dict[str, tuple[int, memoryview]] = {}
        decode, plain, later_j = self._decoder.decode, self._plain, self._parsed_later
        # The stored CRCs as one row of Python ints: a check is then one call in C per
        # field and an int compare (shard.check, which says where, only on a mismatch).
        # A record is checked once per mapping (shard.checked, ShardReader's docstring):
        # the views handed out are the mapping's bytes, which no later check could vouch
        # for better than the first.
        checked = shard.checked
        starts, lengths, crcs = shard.row(
            r, crcs=self.check_crc and not checked[r >> 3] >> (r & 7) & 1)
        j = 0
        try:
            for j, (o, n) in enumerate(zip(starts, lengths, strict=True)):
                payload = view[o : o + n]
                if crcs is not None and crc32c(payload) != crcs[j]:
                    shard.check(r, j, payload)  # raises, naming shard, record and offset
                if plain[j]:
                    out[self._names[j]] = payload
                elif later_j[j]:
                    later[self._names[j]] = (j, payload)
                else:
                    out[self._names[j]] = decode(j, payload)
        except CorruptRecordError as exc:
            if exc.path is not None:  # a checksum error: already says where
                raise
            raise self._located(exc, s, r, j) from None
        if crcs is not None:
            checked[r >> 3] |= 1 << (r & 7)

        def decode_later(name: str) -> Any:
            j, payload = later[name]
            return self._decode(s, r, j, payload)

        return Record(self._names, out, decode_later)

    def values(self, indices, field: str) -> list | LazyValues:
        """The decoded values of one field for many records, its payloads gathered
        shard by shard (:meth:`payloads`); a JSON field's values are parsed when first
        read (a :class:`formats.shard.lazy.LazyValues`).

        Raises:
            CorruptRecordError: a payload does not decode (names shard and record).
        """
        idx = record_indices(indices)
        j = self.field_index[field]
        views = self.payloads(idx, field)

        def one(k: int) -> Any:
            try:
                return self._decoder.decode(j, views[k])
            except CorruptRecordError as exc:
                s, r = self.locate(int(idx[k]))  # the starts outlive close(): lazy values may too
                raise self._located(exc, s, r, j) from None

        if self._parsed_later[j]:
            return LazyValues(one, len(views))
        try:
            decode = self._decoder.decode
            return [decode(j, v) for v in views]
        except CorruptRecordError:
            return [one(k) for k in range(len(views))]  # raises, naming the record

    def _decode(self, s: int, r: int, j: int, view: memoryview) -> Any:
        try:
            return self._decoder.decode(j, view)
        except CorruptRecordError as exc:  # and DecompressionError
            raise self._located(exc, s, r, j) from None

    def _located(self, exc: CorruptRecordError, s: int, r: int, j: int) -> CorruptRecordError:
        """``exc`` (which says what) with where: the shard's file, the record, the offset
        (the offset only while the shard is open: a lazy value can be read after the
        dataset was closed, its views holding the maps)."""
        shard = self._shards[s] if s < len(self._shards) else None
        path = (shard.data_path if shard is not None
                else self.root / self.manifest.shards[s].data_file)
        offset = shard.row(r)[0][j] if shard is not None else None
        return type(exc)(exc.message, path=path, record=r, offset=offset, found=exc.found,
                         expected=exc.expected)

    # -- many records at once ---------------------------------------------------------

    def locate_many(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Vectorized :meth:`locate`: (shard numbers, records within shards); indices
        are 0 to ``len(self) - 1`` here (no negative ones).

        Raises:
            RecordIndexError: an index is out of range (an ``IndexError``).
            ArgumentTypeError: ``indices`` are not integers (see :func:`record_indices`).
        """
        idx = record_indices(indices)
        n = len(self)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = int(idx[(idx < 0) | (idx >= n)][0])
            raise RecordIndexError(f"record {bad} out of range for a dataset of {n} records",
                                   path=self.root)
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

    def _gather(self, indices, j: int, out: list | None = None, crcs: bool = False):
        """(shard numbers, records within shards, offsets, lengths, stored CRCs or None)
        of field ``j`` (the CRCs when ``crcs``); with ``out`` (a list as long as the
        batch), also each record's payload, sliced while its shard is the one read (a
        shard not mapped holds its files open only then: ShardSet._ready)."""
        shard, local = self.locate_many(indices)
        offsets = np.empty(shard.shape, np.uint64)
        lengths = np.empty(shard.shape, np.uint64)
        crcs = np.empty(shard.shape, np.uint32) if crcs else None
        opened: list[int] = []
        try:
            for k, pos in self._groups(shard):
                loc = local[pos]
                s = self._ready(k, loc, opened)
                starts, lengths[pos], stored = s.entries(loc, j, crcs is not None)
                offsets[pos] = starts
                if crcs is not None:
                    crcs[pos] = stored
                if out is not None:
                    view = s.view  # slices of a map's outlive close(), holding the map
                    where = range(len(loc)) if type(pos) is slice else pos.tolist()  # one shard
                    for p, o, e in zip(where, starts.tolist(),
                                       (starts + lengths[pos]).tolist(), strict=True):
                        out[p] = view[o:e]
        finally:
            self._check_opened(opened)
        return shard, local, offsets, lengths, crcs

    def _check_many(self, found: np.ndarray, stored: np.ndarray, shard, local, j: int,
                    payload_of) -> None:
        """Raise for the first record whose computed CRC differs from the stored one."""
        bad = np.flatnonzero(found != stored)
        if bad.size:
            i = int(bad[0])
            self._check(int(shard[i]), int(local[i]), j, payload_of(i))  # raises, naming it

    def spans(self, indices, field: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where one field of many records lies: (shard numbers, byte offsets, lengths).

        All numpy, one gather per distinct shard: the batch-level lookup the loader uses.
        """
        shard, _, offsets, lengths, _ = self._gather(indices, self.field_index[field])
        return shard, offsets, lengths

    def payloads(self, indices, field: str) -> list[memoryview]:
        """Zero-copy stored bytes of one field for many records.

        Two kinds of records are copied instead: those of a shard opened on first use
        and not mapped yet (its first few records are read with ``pread``; see
        :mod:`formats.shard.shard`), and in a batch spanning more shards than this
        process keeps open, those of its shards closed before it ends, or each of
        their maps, held by its views, would keep a descriptor open.
        """
        j = self.field_index[field]
        if self._bounded:
            shard, local = self.locate_many(indices)
            groups = self._groups(shard)
            if len(groups) > self.max_open:
                return self._payloads_copying(shard, local, groups, j)
        idx = record_indices(indices)
        out: list = [None] * idx.size
        shard, local, _, _, crcs = self._gather(idx, j, out, self.check_crc)
        if crcs is not None:  # one pass in C over the batch, one numpy compare
            self._check_many(crc32c_many(out), crcs, shard, local, j, out.__getitem__)
        return out

    def _check(self, s: int, r: int, j: int, payload) -> None:
        shard = self._shards[s] or self._ready(s, r)
        shard.check(r, j, payload)

    def _payloads_copying(self, shard, local, groups, j: int) -> list[memoryview]:
        out: list = [None] * shard.size
        copy = len(groups) - self.max_open  # the shards closed again within this batch
        opened: list[int] = []
        try:
            for g, (k, pos) in enumerate(groups):
                loc = local[pos]
                s = self._ready(k, loc, opened)
                starts, lengths, _ = s.entries(loc, j)
                view = s.view
                for p, r, o, e in zip(pos.tolist(), loc.tolist(), starts.tolist(),
                                      (starts + lengths).tolist(), strict=True):
                    out[p] = memoryview(view[o:e].tobytes()) if g < copy else view[o:e]
                    if self.check_crc:
                        s.check(r, j, out[p])
        finally:
            self._check_opened(opened)
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
        crcs = np.empty(shard.shape, np.uint32) if self.check_crc else None
        opened: list[int] = []
        try:
            for k, pos in self._groups(shard):
                loc = local[pos]
                s = self._ready(k, loc, opened)
                offsets, lengths[pos], stored = s.entries(loc, j, crcs is not None)
                # These records' offsets were validated to lie in the file (their blocks'
                # entries, by _ready): a wrong length is found below.
                out[pos] = s.words_at(offsets, dt)
                if crcs is not None:
                    crcs[pos] = stored
        finally:
            self._check_opened(opened)
        if crcs is not None:  # the 8 payload bytes are the word's: checked in numpy
            self._check_many(crc32c_words(out), crcs, shard, local, j,
                             lambda i: out[i : i + 1].tobytes())
        if lengths.size and (lengths != 8).any():
            i = int(np.flatnonzero(lengths != 8)[0])
            k = int(shard[i])
            raise CorruptRecordError(f"{f.type} field {field!r} payload size",
                                     path=self.root / self.manifest.shards[k].data_file,
                                     record=int(local[i]), found=int(lengths[i]), expected=8)
        return out

    # -- records by key ---------------------------------------------------------------

    def index_of(self, key: str) -> int:
        """The global index of the record whose metadata ``key`` is ``key``.

        Keys are the values of the ``str`` field named ``key`` (FORMAT.md, §6.4),
        read from the metadata tables, not the data files. The first lookup
        maps the node's index (:meth:`key_index`, built by the first process that
        needs it); each costs a bisection and a check of the candidate's key.

        Raises:
            UnknownKeyError: no record has ``key`` (a ``KeyError``; the message
                names the dataset and up to three close matches).
            DuplicateKeyError: several records have ``key`` (a ``KeyError``
                naming their indices; :meth:`indices_of` gives them all).
            SchemaError: the dataset has no keys at all.
            TypeError: ``key`` is not a ``str``.
        """
        found = self.indices_of(key)
        if found.size == 1:
            return int(found[0])
        # The key is quoted cut to its first characters (formats.errors.quoted): a
        # 10 MB key looked up in vain makes a message of a few lines, not of 10 MB.
        if found.size == 0:
            close = self._keys.close_matches(key) if len(key) <= _CLOSE_KEY_CHARS else []
            hint = f"; close matches: {', '.join(map(quoted, close))}" if close else ""
            raise UnknownKeyError(f"no record with key {quoted(key)} among its "
                                  f"{self._keys.size} keys{hint}", path=self.root, key=key,
                                  matches=close)
        shown = found[:5].tolist()
        raise DuplicateKeyError(
            f"{found.size} records have key {quoted(key)}: records {shown}"
            + (" ..." if found.size > len(shown) else "")
            + "; ds.indices_of(key) gives them all", path=self.root, key=key,
            matches=found.tolist())

    def indices_of(self, key: str) -> np.ndarray:
        """The global indices of every record with ``key``, ascending (int64; empty if none).

        Raises:
            SchemaError: the dataset has no keys at all.
            TypeError: ``key`` is not a ``str``.
        """
        if not isinstance(key, str):
            raise ArgumentTypeError(f"a record key is a str, not {type(key).__name__}",
                                    found=key)
        return self.key_index().find(key)

    def key_index(self) -> KeyIndex:
        """The dataset's key index (mapped on first use, then kept; not pickled).

        Raises:
            SchemaError: no record has a key (the dataset has no ``str`` field
                named ``key``, and none was given as metadata when it was packed).
        """
        if self._keys is None:
            keys = KeyIndex(self)
            if keys.size == 0 and len(self):
                has = ", ".join(f"{f.name}: {f.type}" for f in self.fields)
                raise SchemaError(
                    "no record keys: lookup by key needs a str field named 'key' "
                    f"(this dataset's fields: {has}); use integer indices", path=self.root)
            self._keys = keys
        return self._keys

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_keys"] = None  # rebuilt where it is used, never shipped to workers
        return state

    # -- metadata ---------------------------------------------------------------------

    def metadata(self, columns: list[str] | None = None, *,
                 shard: int | None = None) -> pa.Table:
        """The per-record metadata table of all shards, or of ``shard`` alone (see
        :func:`read_metadata`): a dataset of many shards is read one at a time."""
        return read_metadata(self.root, columns, self.manifest,
                             follow_symlinks=self.follow_symlinks,
                             shards=None if shard is None else [shard])


def _record_index(value: object) -> int:
    """``value`` as a record index: an ``int`` or anything that is one exactly
    (``numpy.int64``, via ``__index__``); a float is refused, never truncated."""
    try:
        return operator.index(value)
    except TypeError:
        raise ArgumentTypeError(
            f"a record index is an int (or, for ds[...], a str key or a slice), "
            f"not {type(value).__name__}", found=value) from None


def record_indices(indices) -> np.ndarray:
    """``indices`` (a sequence or array of ints) as a flat int64 array.

    Raises:
        ArgumentTypeError: they are not integers (floats would be truncated, booleans
            read as a mask): names the dtype found (a ``TypeError``).
    """
    idx = np.asarray(indices)
    # [] is an empty float64 array: no index in it to truncate.
    if idx.dtype.kind not in "iu" and (idx.size or idx.dtype.kind not in "fO"):
        raise ArgumentTypeError("record indices are integers", found=f"dtype {idx.dtype}",
                                    expected="an int array or a sequence of ints")
    return idx.astype(np.int64, copy=False).reshape(-1)


def check_dataset_path(path: str | Path) -> None:
    """Refuse a ``path`` that does not exist or is not a folder, saying so (with the
    closest names in its parent folder), before anything looks for ``manifest.json``.

    Raises:
        DatasetNotFoundError: as above.
    """
    p = Path(path)
    if p.is_dir():
        return
    if p.exists():
        hint = (f"; pass its folder, {str(p.parent)!r}" if p.name == MANIFEST_NAME else "")
        raise DatasetNotFoundError(f"not a folder: a dataset is a folder holding {MANIFEST_NAME}"
                                   + hint, path=p)
    raise DatasetNotFoundError("the path does not exist" + _did_you_mean(p), path=p)


def _did_you_mean(p: Path) -> str:
    """``"; did you mean 'x'?"`` from the names in ``p``'s parent (at most
    :data:`_SIBLINGS_SCANNED` of them), or what part of the path is missing."""
    parent = p.parent
    if not parent.is_dir():
        missing = parent
        while not missing.parent.is_dir() and missing.parent != missing:
            missing = missing.parent
        return f" ({str(missing)!r} does not exist either)"
    names = []
    try:
        with os.scandir(parent) as it:
            for entry in it:
                names.append(entry.name)
                if len(names) >= _SIBLINGS_SCANNED:
                    break
    except OSError:
        return ""
    close = difflib.get_close_matches(p.name, names, n=3)
    return f"; did you mean {' or '.join(repr(str(parent / c)) for c in close)}?" if close else ""
