"""Per-record columns of a dataset, computed once per node and memory-mapped by all.

Size-aware batches need every record's image size or field size, slot sizing
their maxima, and lookups by key a sorted index of the keys. Read from the
metadata tables and index files into each process's own memory, that is 8-16
bytes a record per process (16 GB per rank at 10^9 records) and the same minutes
of reading on every rank. Instead a column is built once, shard by shard (memory
bounded by the largest shard), by the first process that needs it while the
others on the node wait on its lock, written as a ``.npy`` file in the cache
folder, and mapped read-only by every process: the page cache holds it once.

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

from ..files import temp_name
from ..storage import default_cache_folder

__all__ = ["cached_columns", "columns_folder", "mapped_column"]

Spec = tuple[tuple[int, ...], object]  # (shape, dtype) of one column file


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

    def build(out: dict[str, np.ndarray]) -> None:
        column, starts = out[name], ds.starts
        for s in range(len(starts) - 1):
            a, b = int(starts[s]), int(starts[s + 1])
            if b > a:
                column[a:b] = per_shard(s)

    return cached_columns(ds, {name: (shape, dtype)}, build)[name]


def cached_columns(ds, specs: dict[str, Spec],
                   build: Callable[[dict[str, np.ndarray]], None]) -> dict[str, np.ndarray]:
    """The columns ``specs`` names of ``ds``, mapped read-only; when any is missing
    or does not map as specified, ``build`` fills all of them (writable maps of
    temporary files, renamed into place once it returns), under the node's lock.

    Raises:
        whatever ``build`` raises (no column is then written).
    """
    folder = columns_folder(ds)
    found = _load_all(folder, specs)
    if found is not None:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX)  # the others on the node wait for the builder
        if _load_all(folder, specs) is None:
            _build(folder, specs, build)
            _drop_older(folder)
    finally:
        os.close(fd)
    found = _load_all(folder, specs)
    assert found is not None, folder
    return found


def _load_all(folder: Path, specs: dict[str, Spec]) -> dict[str, np.ndarray] | None:
    out = {}
    for name, (shape, dtype) in specs.items():
        try:
            arr = np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError):
            return None
        if arr.shape != tuple(shape) or arr.dtype != np.dtype(dtype):
            return None
        out[name] = arr
    return out


def _build(folder: Path, specs: dict[str, Spec],
           build: Callable[[dict[str, np.ndarray]], None]) -> None:
    temps = {name: temp_name(folder / f"{name}.npy") for name in specs}
    try:
        out = {name: np.lib.format.open_memmap(temps[name], mode="w+", dtype=dtype, shape=shape)
               for name, (shape, dtype) in specs.items()}
        build(out)
        for arr in out.values():
            arr.flush()
        del out, arr
        for name, tmp in temps.items():
            os.replace(tmp, folder / f"{name}.npy")
    except BaseException:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        raise


def _drop_older(folder: Path) -> None:
    """Delete the columns of this dataset's earlier manifests (ours: under our cache)."""
    for sibling in folder.parent.iterdir():
        if sibling != folder and sibling.is_dir() and not sibling.is_symlink():
            shutil.rmtree(sibling, ignore_errors=True)
