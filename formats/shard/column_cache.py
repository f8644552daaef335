"""Per-record columns of a dataset, computed once per node and memory-mapped by all.

Size-aware batches need every record's image size or field size, slot sizing
their maxima, and lookups by key a sorted index of the keys. Read from the
metadata tables and index files into each process's own memory, that is 8-16
bytes a record per process (16 GB per rank at 10^9 records) and the same minutes
of reading on every rank. Instead a column is built once, shard by shard (memory
bounded by the largest shard), by the first process that needs it while the
others on the node wait on its lock, written as a column file
(:mod:`formats.shard.column_file`: blocks reserved before they are mapped, a
checksummed body) in the cache folder, and mapped read-only by every process: the
page cache holds it once.

The cache folder, never the dataset's (whose files are ours only through its
manifest): ``$SHARDPACK_CACHE/columns/<dataset>/<manifest crc32c>/NAME.col``, where
``<dataset>`` names the dataset folder's resolved path. The manifest's CRC32C covers
the shard table and with it every shard file's checksum, so a dataset rewritten in
place gets a new folder.

The cache folder is ours to repair and never a reason to fail:

* **No room, no folder.** Where the folder cannot hold the columns (``ENOSPC``,
  ``EROFS``, ``EACCES``, ``$SHARDPACK_CACHE`` a file or under one, any other refusal
  of the filesystem), they are built in this process's private memory instead, with
  one warning per process naming the folder, its free space and ``$SHARDPACK_CACHE``;
  what was partly written is deleted. Columns too large to map (``ENOMEM``) are a
  :class:`~formats.errors.CacheError`: private memory would not hold them either.
* **Damage.** A column file that fails its checks (size, header, checksum) is
  rebuilt, once, with a warning; a crash mid-write cannot leave one (it is renamed
  into place whole), but a disk, a power loss or a hand can.
* **Locks.** One process builds while the others wait, within bounds: a waiter
  says so after a few seconds and builds privately once the builder shows no
  progress (:mod:`formats.shard.column_locks`).
* **Earlier manifests.** The folders of the dataset's earlier manifests (first used
  before this one) are deleted only when no process maps or builds their columns
  (their locks taken exclusively): a reader of the old dataset kept open across a
  ``pack-dataset --overwrite`` keeps its columns, and the readers of the old and new
  datasets no longer delete each other's. A lock, not an age: exact, and released by
  the kernel when a process dies.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..cache_folder import cache_trouble, default_cache_folder
from ..errors import CacheError
from ..files import temp_name
from . import column_file
from .column_file import Bad
from .column_locks import Hold, Unusable, build_lock, free_to_delete

__all__ = ["cached_columns", "columns_folder", "discard", "mapped_column", "scratch"]

log = logging.getLogger(__name__)

Spec = tuple[tuple[int, ...], object]  # (shape, dtype) of one column file

SUFFIX = ".col"

_warned: set[str] = set()  # cache folders this process has warned about (one warning each)
_swept: set[str] = set()  # column folders whose older siblings this process has tried


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
        CacheError: the column is too large to map or hold in memory.
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
    or damaged, ``build`` fills all of them (writable maps of temporary files with
    their blocks reserved, renamed into place once it returns), under the node's
    lock. Where the cache folder cannot hold them, ``build`` fills arrays in this
    process's memory instead (see the module).

    Raises:
        CacheError: the columns are too large to map or hold in memory.
        whatever ``build`` raises (no column is then written).
    """
    folder = columns_folder(ds)
    hold = Hold.take(folder)
    found, damage = _load_all(folder, specs, hold)
    if found is not None:
        _drop_older_once(folder)
        return found
    try:
        with build_lock(folder):
            hold = hold or Hold.take(folder)
            found, again = _load_all(folder, specs, hold)  # built while this one waited?
            if found is None:
                damage = damage or again
                if damage:
                    warnings.warn(f"shardpack: {damage}: rebuilding it", RuntimeWarning,
                                  stacklevel=3)
                _build(folder, specs, build)
                found, damage = _load_all(folder, specs, hold)
                if found is None:
                    raise Unusable(f"the columns written there do not read back ({damage})")
                _drop_older(folder)
    except Unusable as why:
        _warn_private(folder, why.args[0], specs)
        return _private(specs, build)
    return found


def discard(ds, names) -> None:
    """Delete the column files ``names`` of ``ds`` (found damaged after they were
    mapped): the next :func:`cached_columns` rebuilds them."""
    folder = columns_folder(ds)
    for name in names:
        path = folder / f"{name}{SUFFIX}"
        column_file.forget(path)
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only cache: the rebuild checks it again and falls back


@contextmanager
def scratch(beside: np.ndarray, name: str, shape: tuple[int, ...], dtype) -> Iterator[np.ndarray]:
    """A writable work array for a build, deleted after: a reserved temporary file in
    the folder of the column ``beside`` (a column :func:`cached_columns` handed to
    ``build``), or private memory when the columns are built there.

    Raises:
        Unusable: the folder has no room for it (:func:`cached_columns` then builds
            privately, with its warning).
    """
    where = getattr(beside, "filename", None)
    if where is None:
        yield np.empty(shape, dtype)
        return
    path = temp_name(Path(where).parent / name)
    try:
        arr = column_file.reserve(path, tuple(shape), dtype)
    except CacheError:
        raise
    except OSError as exc:
        raise Unusable(exc) from None
    try:
        yield arr
    finally:
        del arr
        path.unlink(missing_ok=True)


# -- reading ---------------------------------------------------------------------------

def _load_all(folder: Path, specs: dict[str, Spec],
              hold: Hold | None) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """The columns mapped and checked, or (None, what was damaged if anything)."""
    out = {}
    for name, (shape, dtype) in specs.items():
        path = folder / f"{name}{SUFFIX}"
        try:
            arr = column_file.load(path, tuple(shape), dtype)
        except Bad as exc:
            return None, f"the cached column {path} is damaged ({exc})"
        if arr is None:
            return None, None
        if isinstance(arr, np.memmap):
            arr._hold = hold  # the folder is in use while the column is mapped
        out[name] = arr
    return out, None


# -- building --------------------------------------------------------------------------

def _build(folder: Path, specs: dict[str, Spec],
           build: Callable[[dict[str, np.ndarray]], None]) -> None:
    """Build the columns into reserved temporary files and rename them into place.

    Raises:
        Unusable: the folder refused (nothing of the build is left in it).
        CacheError: a column too large to map.
    """
    _drop_temps(folder)
    temps = {name: temp_name(folder / f"{name}{SUFFIX}") for name in specs}
    made: dict[str, np.ndarray] = {}
    try:
        try:
            for name, (shape, dtype) in specs.items():
                made[name] = column_file.reserve(temps[name], tuple(shape), dtype)
        except CacheError:
            raise
        except OSError as exc:
            raise Unusable(exc) from None
        build(made)
        try:
            crcs = {name: column_file.seal(temps[name], arr) for name, arr in made.items()}
            made.clear()  # unmapped
            for name, tmp in temps.items():
                os.replace(tmp, folder / f"{name}{SUFFIX}")
                column_file.remember(folder / f"{name}{SUFFIX}", crcs[name])
        except OSError as exc:
            raise Unusable(exc) from None
    except BaseException:
        made.clear()
        for tmp in temps.values():
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass  # the folder itself went away
        raise


def _drop_temps(folder: Path) -> None:
    """Temporary files of builders that died (this process holds the build lock: no
    live builder writes here), so they do not keep a full disk full."""
    for tmp in folder.glob(".*.tmp-*"):
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def _private(specs: dict[str, Spec],
             build: Callable[[dict[str, np.ndarray]], None]) -> dict[str, np.ndarray]:
    need = _nbytes(specs)
    try:
        out = {name: np.zeros(tuple(shape), dtype) for name, (shape, dtype) in specs.items()}
    except MemoryError as exc:
        raise CacheError(f"cannot build columns of {need:,} bytes in this process's memory "
                         f"either ({exc})") from None
    build(out)
    for arr in out.values():
        arr.flags.writeable = False
    return out


def _nbytes(specs: dict[str, Spec]) -> int:
    return sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
               for shape, dtype in specs.values())


def _warn_private(folder: Path, reason: OSError | str, specs: dict[str, Spec]) -> None:
    root = str(default_cache_folder())
    if root in _warned:
        log.debug("shardpack: columns in private memory again (%s)", reason)
        return
    _warned.add(root)
    warnings.warn(
        f"shardpack: the cache folder {folder} cannot hold this dataset's columns "
        f"({cache_trouble(folder, reason)}): building them in this process's memory instead "
        f"({_nbytes(specs):,} bytes here, built again by every process that needs them). "
        "Point $SHARDPACK_CACHE at a writable folder with room to build them once per node.",
        RuntimeWarning, stacklevel=4)


# -- earlier manifests -----------------------------------------------------------------

def _drop_older_once(folder: Path) -> None:
    if str(folder) not in _swept:
        _swept.add(str(folder))
        _drop_older(folder)


def _first_used(folder: Path) -> float:
    try:
        return (folder / ".inuse").stat().st_mtime  # made once, never written
    except OSError:
        return 0.0  # never mapped (or a layout before .inuse): the oldest


def _drop_older(folder: Path) -> None:
    """Delete the column folders of this dataset's earlier manifests that no process
    uses (see the module)."""
    mine = _first_used(folder) or time.time()
    try:
        siblings = [p for p in folder.parent.iterdir() if p != folder]
    except OSError:
        return
    for sibling in siblings:
        if sibling.is_symlink() or not sibling.is_dir() or _first_used(sibling) >= mine:
            continue
        fds = free_to_delete(sibling)
        if fds is not None:
            try:
                shutil.rmtree(sibling, ignore_errors=True)
            finally:
                for fd in fds:
                    os.close(fd)
