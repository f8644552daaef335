"""Random access to a packed dataset (a thin layer over :mod:`formats`).

Opening maps each shard and reads the manifest: the cost grows with the number of
shards, never with the number of records. ``ds[i]`` gives field -> value with
bytes fields as zero-copy memoryviews, and ``ds[key]`` (``ds.index_of(key)``)
finds a record by its key; :func:`read_many` reads many records at once (one
vectorized index lookup per field); ``ds.metadata()`` reads only the small
per-shard parquet tables.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from formats import ShardDataset, open_shards
from formats.errors import ArgumentError, ArgumentTypeError, ShardpackError, quoted
from formats.fields import BYTES_TYPES
from formats.shard.dataset import record_indices
from formats.storage import place
from formats.storage.cache import CacheOptions

__all__ = ["ShardDataset", "key_words", "main_fields", "open_dataset", "read_many"]


def open_dataset(path: str | Path, *, check_crc: bool = True, cache: CacheOptions | None = None,
                 filesystem: Any = None, follow_symlinks: bool = False) -> ShardDataset:
    """Open the dataset folder ``path`` (holding ``manifest.json``), local (a path, or
    a ``file://`` URI) or remote.

    A URI (``s3://bucket/dataset``, or any that :mod:`formats.storage` opens) or a
    ``filesystem`` gives a :class:`reader.data.remote.RemoteDataset`: shards are
    downloaded into the local cache (``cache``) on first use, then mapped.

    Every payload ``ds[i]``, ``ds.values`` and the other reads hand out is checked
    against its CRC32C, as the Loader does; ``check_crc=False`` opts out.

    A local dataset's files that are symlinks to files outside its folder are
    refused unless ``follow_symlinks`` (FORMAT.md, §8); to read such a dataset
    with a :class:`reader.Loader`, hand it the dataset opened here.

    Raises:
        formats.DatasetNotFoundError: a local ``path`` does not exist
            or is not a folder (a ``ManifestError`` and a ``FileNotFoundError``;
            the message suggests close names in its parent folder).
        formats.ManifestError, formats.FormatError, formats.VersionError: the
            dataset is incomplete, damaged, or of an unknown major version.
        formats.StorageError: a remote dataset's storage failed (names the object).
        formats.UnsafePathError: a file is a symlink out of the dataset folder.
        ValueError: ``follow_symlinks`` for a remote dataset (its cache holds no links).
        TypeError: ``path`` is not a str or path, ``cache`` not a ``CacheOptions``.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"path must be a str or os.PathLike (a dataset folder or URI), "
                        f"not {type(path).__name__} ({path!r})")
    if cache is not None and not isinstance(cache, CacheOptions):
        raise ArgumentTypeError(f"cache must be a reader.CacheOptions or None, not {type(cache).__name__}")
    for name, flag in (("check_crc", check_crc), ("follow_symlinks", follow_symlinks)):
        if not isinstance(flag, bool):
            raise ArgumentTypeError(f"{name} must be True or False, not {flag!r}")
    where = place(path)  # read once: RemoteDataset opens this Place, not the string again
    if where.remote or filesystem is not None:
        from .remote import RemoteDataset

        if follow_symlinks:
            raise ArgumentError("follow_symlinks applies to local datasets only")
        return RemoteDataset(where if filesystem is None else str(path), cache=cache, filesystem=filesystem, check_crc=check_crc)
    if cache is not None:
        raise ArgumentError(f"cache= applies to datasets on object storage (s3://...) only; "
                         f"{path} is a local folder, read in place")
    return open_shards(where.text, check_crc=check_crc, follow_symlinks=follow_symlinks)


def read_many(ds: ShardDataset, indices, fields: tuple[str, ...] | None = None) -> dict:
    """Many records at once: int/float fields as int64/float64 arrays, uncompressed
    bytes fields as lists of zero-copy memoryviews, JSON fields as sequences parsed
    item by item when first read (:class:`formats.shard.lazy.LazyValues`), other
    fields as lists of values.
    """
    idx = record_indices(indices)
    return main_fields(ds, tuple(fields or (f.name for f in ds.fields)), idx)


def main_fields(ds: ShardDataset, names: tuple[str, ...], indices: np.ndarray) -> dict:
    """Fields read in the main process: scalars as arrays, bytes as memoryviews, else
    values (JSON parsed when first read: :meth:`ShardDataset.values`)."""
    out = {}
    for n in names:
        f = ds.fields[ds.field_index[n]]
        if f.type in ("int", "float"):
            out[n] = ds.scalars(indices, n)
        elif f.type in BYTES_TYPES and f.compression == "none":
            out[n] = ds.payloads(indices, n)
        else:
            out[n] = ds.values(indices, n)
    return out



PAGE_STRIDE = 4096


def page_in(views) -> int:
    """Touch every page of each payload (so the time to bring them in is the reader's
    ``io``, not the decoder's); returns the bytes they hold."""
    nbytes = 0
    for v in views:
        nbytes += len(v)
        if len(v):
            a = np.frombuffer(v, np.uint8)
            int(a[::PAGE_STRIDE].sum()) + int(a[-1])
    return nbytes


def key_words(ds, index: int) -> str:
    """`` (key 'a/img_00001.jpg')`` for a message about record ``index``, or ``""``
    when the dataset has no ``str`` field named ``key`` or it cannot be read.

    The user knows their files by key, not by global record number: an error that
    names a record names its key too. Read only on the error path (one lookup in the
    metadata), and never raises: a message must not fail while being made."""
    if not any(f.name == "key" and f.type == "str" for f in ds.fields):
        return ""
    try:
        return f" (key {quoted(ds.get(index, 'key'))})"
    except (ShardpackError, LookupError, OSError, ValueError):
        return ""
