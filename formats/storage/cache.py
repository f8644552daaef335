"""A local folder of whole shards downloaded from object storage, bounded in size.

Layout: ``FOLDER/<dataset key>/`` holds a copy of the dataset's manifest and the
shard files fetched so far; the key hashes the dataset's URI and its manifest, so a
dataset rewritten in place never meets its stale shards.

Rules, all kept with ``flock`` so that any number of loaders and processes can
share one folder:

* A shard is *present* when its ``.rec`` and ``.idx`` are; each is downloaded to a
  temporary name, checked against the manifest's size and CRC32C, then renamed,
  the ``.idx`` last. A partial download is never taken for a shard.
* A process that maps a shard holds a shared lock on ``<name>.lock`` (a *pin*)
  until it unmaps it. Eviction takes the exclusive lock without waiting, so a
  pinned shard is never evicted.
* One download per shard at a time (``<name>.dl``): a second process needing it
  waits, then finds it present.
* A folder that cannot be created or written (``$SHARDPACK_CACHE`` a file, under
  one, read-only, full) is a :class:`~formats.errors.CacheError` naming it and the
  way out. Downloads cannot fall back to memory as the node's columns do: a shard is
  mapped from its file, and a dataset larger than memory is why shards are cached.
* Before a download, least-recently-used unpinned shards are evicted, whole,
  until the new one fits in ``max_bytes`` (use = the lock file's mtime). The
  bound is soft only when every shard in the cache is pinned: the download goes
  ahead (a loader never deadlocks on its own working set) and ``overflows``
  counts it.

Pins are released by closing the lock's file descriptor, never ``LOCK_UN``: a
forked worker shares its parent's descriptors, and unlocking one would unpin the
shard for both. For the same reason a forked child closes, at once, every lock
descriptor it inherited (``os.register_at_fork``): a download lock held by a
parent's thread at the moment of a fork would otherwise stay held for as long
as the child lives, and a pin until the child unmaps the shard.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..cache_folder import cache_trouble, default_cache_folder, free_bytes
from ..errors import CacheError, StorageError
from ..shard.manifest import ShardEntry
from .location import Location

__all__ = ["ORPHAN_S", "ROOM_FOR_TABLES", "CacheOptions", "Pin", "ShardCache"]

_PRESENT = (".rec", ".idx")
# What a download's failure says about the local disk, not the object store.
_LOCAL_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})
ORPHAN_S = 600.0
ROOM_FOR_TABLES = 1 << 20  # free bytes a dataset's folder needs before its first download


@dataclass(frozen=True)
class CacheOptions:
    """Where remote shards are kept, and how many are fetched ahead.

    Args:
        folder: the cache folder (default: :func:`default_cache_folder`).
        max_bytes: the most shard bytes (``.rec`` + ``.idx``) to keep, all datasets
            in the folder together (``None``: no bound but the disk). Smaller than
            the dataset works, with ``shuffle="block"`` (or no shuffle): a full
            shuffle touches every shard in every batch. The bound leaves out the
            small metadata tables and dictionaries, and is exceeded only while
            shards that processes have mapped leave no room (``overflows``
            counts it) or while several processes download at once.
        prefetch_shards: shards the loader downloads ahead of the batches in flight.
        download_threads: parallel downloads when prefetching.
    """

    folder: str | Path | None = None
    max_bytes: int | None = None
    prefetch_shards: int = 4
    download_threads: int = 4

    def __post_init__(self) -> None:
        if self.max_bytes is not None and self.max_bytes <= 0:
            raise ValueError(f"cache max_bytes must be positive, not {self.max_bytes}")
        if self.prefetch_shards < 0 or self.download_threads < 1:
            raise ValueError("prefetch_shards must be >= 0 and download_threads >= 1")

    def open(self) -> ShardCache:
        return ShardCache(self.folder or default_cache_folder(), self.max_bytes)


def dataset_key(uri: str, manifest: bytes) -> str:
    return hashlib.sha256(uri.encode() + b"\0" + manifest).hexdigest()[:24]


# Lock descriptors this process holds for a moment (downloads, eviction), and its pins.
_held: set[int] = set()
_pins: weakref.WeakSet = weakref.WeakSet()


def _forget_inherited_locks() -> None:
    """In a forked child: drop the parent's lock descriptors (the parent keeps its locks)."""
    for fd in list(_held):
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()
    for pin in list(_pins):
        pin.release()


os.register_at_fork(after_in_child=_forget_inherited_locks)


def _unusable(folder: Path, exc: OSError) -> CacheError:
    """The error for a cache folder the filesystem refuses (see the module)."""
    return CacheError(
        f"the shard cache folder cannot be used ({cache_trouble(folder, exc)}): remote shards "
        "are downloaded to a folder and mapped from it, with no fallback to memory. Point "
        "$SHARDPACK_CACHE or CacheOptions(folder=...) at a writable folder with room for "
        "the shards read", path=folder)


@contextmanager
def _refused_as(folder: Path):
    """Turn the filesystem's refusals (a file where a folder should be, read-only,
    full, no permission) into the typed error naming the cache folder."""
    try:
        yield
    except CacheError:
        raise
    except OSError as exc:
        raise _unusable(folder, exc) from exc


def _open_lock(path: Path) -> int:
    with _refused_as(path.parent):
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


@contextmanager
def _locked(path: Path, how: int):
    fd = _open_lock(path)
    _held.add(fd)
    try:
        fcntl.flock(fd, how)
        yield fd
    finally:
        _held.discard(fd)
        os.close(fd)


class Pin:
    """A shared lock on one cached shard, held while it is mapped."""

    __slots__ = ("__weakref__", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        _pins.add(self)

    def release(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __del__(self) -> None:
        self.release()


class ShardCache:
    """The cache folder (see module docstring).

    Args:
        folder: where shards are kept (created if missing).
        max_bytes: the bound on shard bytes, or ``None``.

    Raises:
        CacheError: the folder cannot be created (see the module).
    """

    def __init__(self, folder: str | Path, max_bytes: int | None = None) -> None:
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        with _refused_as(self.folder):
            self.folder.mkdir(parents=True, exist_ok=True)
        self.downloads = 0
        self.download_bytes = 0
        self.evictions = 0
        self.overflows = 0

    def __reduce__(self):
        return (ShardCache, (self.folder, self.max_bytes))

    def dataset_dir(self, uri: str, manifest: bytes) -> Path:
        """The dataset's folder in the cache, made if need be.

        Raises:
            CacheError: it cannot be made, is not writable, or has under
                :data:`ROOM_FOR_TABLES` bytes free (the manifest and tables land
                here before any shard).
        """
        d = self.folder / dataset_key(uri, manifest)
        with _refused_as(self.folder):
            d.mkdir(exist_ok=True)
            if not os.access(d, os.W_OK):
                raise OSError(errno.EACCES, f"{os.strerror(errno.EACCES)}: not writable")
            if free_bytes(d) < ROOM_FOR_TABLES:
                raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: under "
                                            f"{ROOM_FOR_TABLES:,} bytes free")
        return d

    # -- pins and presence --------------------------------------------------------------

    @staticmethod
    def present(root: Path, entry: ShardEntry) -> bool:
        return all((root / f"{entry.name}{s}").exists() for s in _PRESENT)

    def pin(self, root: Path, entry: ShardEntry) -> Pin:
        """Pin ``entry`` (present or not) and mark it used now."""
        fd = _open_lock(root / f"{entry.name}.lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.utime(fd)
        except BaseException:
            os.close(fd)
            raise
        return Pin(fd)

    def acquire(self, location: Location, root: Path, entry: ShardEntry) -> Pin:
        """Pin ``entry`` and make sure it is present, downloading it if need be."""
        pin = self.pin(root, entry)
        try:
            self.ensure(location, root, entry)
        except BaseException:
            pin.release()
            raise
        return pin

    def ensure(self, location: Location, root: Path, entry: ShardEntry, *,
               optional: bool = False) -> bool:
        """Download ``entry`` unless present; True if this call downloaded it.

        The caller should hold a pin, or the shard may be evicted again at once.
        ``optional`` (a prefetch): give up, returning False, rather than go over
        the bound.
        """
        if self.present(root, entry):
            return False
        with _locked(root / f"{entry.name}.dl", fcntl.LOCK_EX):
            if self.present(root, entry):
                return False  # another process fetched it while we waited
            need = entry.data_bytes + entry.index_bytes
            if not self.make_room(need) and optional:
                return False
            try:
                for suffix, size, crc in ((".rec", entry.data_bytes, entry.data_crc32c),
                                          (".idx", entry.index_bytes, entry.index_crc32c)):
                    name = f"{entry.name}{suffix}"
                    _download(location, name, root / name, size, crc)
            except BaseException:
                (root / entry.data_file).unlink(missing_ok=True)  # never half a shard
                raise
            self.downloads += 1
            self.download_bytes += need
        self.touch(root, entry)  # listed for eviction, as the most recently used
        return True

    @staticmethod
    def touch(root: Path, entry: ShardEntry) -> None:
        fd = _open_lock(root / f"{entry.name}.lock")
        try:
            os.utime(fd)
        finally:
            os.close(fd)

    def ensure_meta(self, location: Location, root: Path, entry: ShardEntry) -> Path:
        """The shard's small metadata table, fetched once and kept (never evicted)."""
        path = root / entry.meta_file
        if not path.exists():
            _download(location, entry.meta_file, path, entry.meta_bytes, entry.meta_crc32c)
        return path

    def discard(self, root: Path, entry: ShardEntry) -> bool:
        """Delete a cached shard now (a damaged copy), unless some process has it pinned."""
        return self._evict(root, entry.name)

    # -- eviction ----------------------------------------------------------------------

    def _shards(self) -> list[tuple[float, Path, str, int]]:
        """(last use, dataset dir, shard name, bytes) of every shard with a file here
        (a half one too: it takes room, and eviction removes it)."""
        out = []
        for d in self.folder.iterdir():
            if not d.is_dir():
                continue
            for lock in d.glob("*.lock"):
                name = lock.name[: -len(".lock")]
                size = 0
                for suffix in _PRESENT:
                    try:
                        size += (d / f"{name}{suffix}").stat().st_size
                    except FileNotFoundError:
                        pass
                try:
                    used = lock.stat().st_mtime
                except FileNotFoundError:
                    continue
                if size:
                    out.append((used, d, name, size))
        return out

    def usage(self) -> int:
        """Bytes of present shards in the whole folder (all datasets)."""
        return sum(s[3] for s in self._shards())

    def make_room(self, need: int) -> bool:
        """Evict least-recently-used unpinned shards until ``need`` more bytes fit.

        Returns False (and counts an overflow) when pinned shards leave too little room.
        """
        if self.max_bytes is None:
            return True
        with _locked(self.folder / ".evict.lock", fcntl.LOCK_EX):
            self._drop_orphans()
            shards = sorted(self._shards())
            total = sum(s[3] for s in shards)
            for _, d, name, size in shards:
                if total + need <= self.max_bytes:
                    return True
                if self._evict(d, name):
                    total -= size
            if total + need <= self.max_bytes:
                return True
            self.overflows += 1
            return False

    def _drop_orphans(self) -> None:
        """Temporary files of downloads that died (``.NAME.tmp-PID``, idle for
        ``ORPHAN_S``). Judged by age, not by PID: a cache folder shared between
        containers sees other PID namespaces; a live download writes every chunk."""
        now = time.time()
        for tmp in self.folder.glob("*/.*.tmp-*"):
            try:
                if now - tmp.stat().st_mtime > ORPHAN_S:
                    tmp.unlink(missing_ok=True)
            except FileNotFoundError:
                pass

    def _evict(self, root: Path, name: str) -> bool:
        fd = _open_lock(root / f"{name}.lock")
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # pinned: in use by some process
            for suffix in (".idx", ".rec"):  # .idx first: "present" ends at once
                (root / f"{name}{suffix}").unlink(missing_ok=True)
            self.evictions += 1
            return True
        finally:
            os.close(fd)

    def stats(self) -> dict:
        return {"downloads": self.downloads, "download_bytes": self.download_bytes,
                "evictions": self.evictions, "overflows": self.overflows}


def _download(location: Location, name: str, dest: Path, size: int, crc: int) -> None:
    """``location.download`` into the cache, the local side's failures typed: a disk
    without room for ``size`` bytes is refused before the download (not retried into
    it), and a local refusal during it names the cache folder, not the object."""
    with _refused_as(dest.parent):
        free = free_bytes(dest.parent)
        if free < size:
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: {size:,} bytes to "
                                        f"download, {free:,} free")
    try:
        location.download(name, dest, size=size, crc=crc)
    except StorageError as exc:
        cause = exc.__cause__
        if isinstance(cause, OSError) and (
                cause.errno in _LOCAL_FULL
                or (cause.filename is not None and Path(cause.filename).parent == dest.parent)):
            raise _unusable(dest.parent, cause) from exc
        raise
