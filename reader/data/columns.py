"""Per-record columns of a dataset, computed once per node and memory-mapped by all.

Size-aware batches need every record's image size or field size, and slot sizing
their maxima. Read from the metadata tables and index files into each process's
own memory, that is 8-16 bytes a record per process (16 GB per rank at 10^9
records) and the same minutes of reading on every rank. Instead a column is built
once, shard by shard (memory bounded by the largest shard), by the first process
that needs it while the others on the node wait on its lock, written as a ``.npy``
file in the cache folder, and mapped read-only by every process: the page cache
holds it once.

The cache folder, never the dataset's (whose files are ours only through its
manifest): ``$SHARDPACK_CACHE/columns/<dataset>/<manifest crc32c>/NAME.npy``, where
``<dataset>`` names the dataset folder's resolved path. The manifest's CRC32C covers
the shard table and with it every shard file's checksum, so a dataset rewritten in
place gets a new folder; the folders of its earlier versions are ours and deleted
when the new one is built. A column file that does not map as the array expected
(a crash mid-write cannot leave one: it is renamed into place whole) is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from formats.files import temp_name
from formats.storage import default_cache_folder

__all__ = ["mapped_column"]


def columns_folder(ds) -> Path:
    """Where the columns of the dataset ``ds`` (its current manifest) live."""
    where = hashlib.sha256(str(Path(ds.root).resolve()).encode()).hexdigest()[:16]
    return default_cache_folder() / "columns" / where / f"{ds.manifest_crc32c:08x}"


def mapped_column(ds, name: str, dtype, per_shard: Callable[[int], np.ndarray],
                  width: int | None = None) -> np.ndarray:
    """The read-only, memory-mapped column ``name`` of ``ds``: ``per_shard(s)`` gives
    shard ``s``'s values (its records, or its records x ``width``), called once per
    shard by the one process that builds the column.

    Raises:
        whatever ``per_shard`` raises (the column is then not written).
    """
    shape = (len(ds),) if width is None else (len(ds), width)
    folder = columns_folder(ds)
    path = folder / f"{name}.npy"
    found = _load(path, shape, dtype)
    if found is not None:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)  # the others on the node wait for the builder
        found = _load(path, shape, dtype)
        if found is None:
            _build(path, shape, dtype, ds, per_shard)
            _drop_older(folder)
    finally:
        os.close(fd)
    found = _load(path, shape, dtype)
    assert found is not None, path
    return found


def _load(path: Path, shape: tuple, dtype) -> np.ndarray | None:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    return arr if arr.shape == shape and arr.dtype == np.dtype(dtype) else None


def _build(path: Path, shape: tuple, dtype, ds, per_shard: Callable[[int], np.ndarray]) -> None:
    tmp = temp_name(path)
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
    try:
        starts = ds.starts
        for s in range(len(starts) - 1):
            a, b = int(starts[s]), int(starts[s + 1])
            if b > a:
                out[a:b] = per_shard(s)
        out.flush()
        del out
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _drop_older(folder: Path) -> None:
    """Delete the columns of this dataset's earlier manifests (ours: under our cache)."""
    for sibling in folder.parent.iterdir():
        if sibling != folder and sibling.is_dir() and not sibling.is_symlink():
            shutil.rmtree(sibling, ignore_errors=True)
