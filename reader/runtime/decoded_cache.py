"""A decoded-sample cache shared by all workers (the seed's ``CacheDataset``, section 5.2).

Decoding a JPEG costs far more than cropping and resizing its pixels. With
``Loader(..., decoded_cache=DecodedCacheOptions(max_bytes=...))`` a worker that
decodes an image keeps its pixels (optionally pre-shrunk by the DCT so the short
side stays at least ``short_side``, e.g. the crop size) in memory shared by every
worker; in later epochs any worker takes its random crop from those pixels
instead of decoding again. What it serves is exactly what the uncached path
serves: the geometry is planned as there (the same random draws on the original
size), and the uncached path decodes each box at a DCT scale chosen from the box
(1/2, 1/4, 1/8 once the box is that many times the output), whose pixels no resample
of another scale's reproduces; so each record's row keeps the scale its pixels were
decoded at, and a crop whose scale differs is decoded from the record as without a
cache (:meth:`reader.transforms.decode.Decoder.from_cache`). With RandomResizedCrop(224)
on images with a side under 448 pixels every crop is served from the cache;
larger images, or a ``short_side`` pre-shrink, cost some crops a decode.

Layout (one mapping): a header (bytes used), a directory of one row per record
(``offset, height, width, cached height, cached width, DCT scale``), one state byte per
record, then the pixels, packed in the order they arrive.

Policy: first come, first kept. Images are stored while they fit in
``max_bytes``; once full, the rest are decoded every time (no eviction: with a
shuffled order every epoch then finds the same cached fraction, and nothing is
rewritten while other workers may read it). A record is written once: its state
goes from empty to writing (under a lock, with the space reserved) to ready
(under the lock again, after the pixels are written), and readers only read
ready records.

Memory: an anonymous shared mapping for forked workers (pages are taken as they
are written, so the cache costs what it holds, at most ``max_bytes``; freed when
the loader and its workers are gone, whatever the exit); a file for spawned
workers or when ``path`` is given (for a cache larger than RAM, on a local disk).
A file is reserved whole at creation (``posix_fallocate``), so a full disk is an
error then, naming it, never a crash when a page is first written; it is deleted
at ``close()``. A file under ``/dev/shm`` is named after the loader's process and
reclaimed like a slot ring when that process was killed; a ``path`` file left by
a killed loader is recognised (its header names the cache and its owner's pid)
and replaced by the next loader, never a file that is not such a cache.
"""

from __future__ import annotations

import itertools
import mmap
import os
from pathlib import Path

import numpy as np

from ..options import DecodedCacheOptions
from .slots import SHM_PREFIX, reclaim_stale_segments

__all__ = ["DecodedCache"]

EMPTY, WRITING, READY = 0, 1, 2
_HEADER = 64  # bytes used (int64) at 0, the magic at 16, the owner's pid at 32
_MAGIC = b"shardpack-dcache"
_MAGIC_AT, _PID_AT = 16, 32
_ROW = 6  # offset, height, width, cached height, cached width, scale (int64)
_counter = itertools.count()


def _reclaim_or_refuse(path: Path) -> None:
    """``path`` exists: delete it if it is a decoded cache whose loader is gone (killed
    before it could), else refuse. Never anything else of the user's."""
    owner = None
    try:
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                head = f.read(_HEADER)
            if head[_MAGIC_AT : _MAGIC_AT + len(_MAGIC)] == _MAGIC:
                owner = int.from_bytes(head[_PID_AT : _PID_AT + 8], "little")
    except OSError:
        pass
    if owner is None:
        raise FileExistsError(f"{path}: exists and is not a decoded cache; the decoded cache "
                              "file must not exist (it is created, and deleted at close)")
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        path.unlink()  # left by a loader that was killed: ours to remove
        return
    except PermissionError:
        pass
    raise FileExistsError(f"{path}: the decoded cache of a running loader (pid {owner}); "
                          "give this loader another path")


class DecodedCache:
    """The shared cache (see the module docstring); built by the Loader, used by workers.

    Args:
        options: the bound, the pre-shrink and the file.
        num_records: records in the dataset (directory rows).
        lock: a multiprocessing lock shared with the workers.
        named: back it by a file even without ``options.path`` (spawned workers
            attach by name).
    """

    def __init__(self, options: DecodedCacheOptions, num_records: int, lock,
                 named: bool = False) -> None:
        self.short_side = options.short_side
        self.capacity = int(options.max_bytes)
        self.num_records = int(num_records)
        self._lock = lock
        self._owner = os.getpid()
        self._layout()
        self.path: Path | None = None
        self._delete = False
        if options.path is not None:
            self.path = Path(options.path)
            if self.path.exists() or self.path.is_symlink():
                _reclaim_or_refuse(self.path)
        elif named:
            reclaim_stale_segments()
            self.path = Path("/dev/shm") / f"{SHM_PREFIX}{os.getpid()}_cache_{next(_counter)}"
        if self.path is None:
            self._mm = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        else:
            self._mm = self._create_file()
        self._setup()

    def _layout(self) -> None:
        """Where the directory, the states and the pixels start (see the module docstring)."""
        self._dir_at = _HEADER
        self._state_at = self._dir_at + 8 * _ROW * self.num_records
        self._data_at = -(-(self._state_at + self.num_records) // mmap.PAGESIZE) * mmap.PAGESIZE
        self.nbytes = self._data_at + self.capacity

    def _create_file(self) -> mmap.mmap:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self._delete = True
        try:
            os.posix_fallocate(fd, 0, self.nbytes)
            return mmap.mmap(fd, self.nbytes)  # the mapping outlives the descriptor
        except OSError as exc:
            self._unlink()
            raise OSError(exc.errno, f"cannot reserve {self.nbytes:,} bytes for the decoded "
                                     f"cache ({exc.strerror}): {self.path}") from None
        finally:
            os.close(fd)

    def _setup(self) -> None:
        buf = self._mm
        if os.getpid() == self._owner and buf[_MAGIC_AT : _MAGIC_AT + len(_MAGIC)] != _MAGIC:
            buf[_MAGIC_AT : _MAGIC_AT + len(_MAGIC)] = _MAGIC  # what a later run can recognise
            buf[_PID_AT : _PID_AT + 8] = self._owner.to_bytes(8, "little")
        self._used = np.frombuffer(buf, np.int64, 1, 0)
        self._dir = np.frombuffer(buf, np.int64, _ROW * self.num_records,
                                  self._dir_at).reshape(self.num_records, _ROW)
        self._state = np.frombuffer(buf, np.uint8, self.num_records, self._state_at)
        self._data = np.frombuffer(buf, np.uint8, self.capacity, self._data_at)
        self.full = False  # this process saw the cache full: skip the lock from now on

    # -- worker side ---------------------------------------------------------------------

    def get(self, record: int) -> tuple[np.ndarray, int, int, int] | None:
        """``(pixels, original height, original width, scale)`` of a cached record, or
        None; ``scale`` as :meth:`put` was given it."""
        if self._state[record] != READY:
            return None
        off, h, w, ch, cw, scale = self._dir[record].tolist()
        return self._data[off : off + ch * cw * 3].reshape(ch, cw, 3), h, w, scale

    def put(self, record: int, image: np.ndarray, height: int, width: int,
            scale: int) -> np.ndarray:
        """Keep ``image`` for ``record`` if it fits; returns the cached copy, or ``image``.

        ``scale``: the DCT scale ``image`` was decoded at, as
        :meth:`reader.transforms.decode.Decoder.decode_for_cache` says it.
        """
        need = image.size
        if self.full or image.ndim != 3 or image.shape[2] != 3:
            return image
        with self._lock:
            used = int(self._used[0])
            if self._state[record] != EMPTY:
                return image  # another worker has it (a record twice in one epoch)
            if used + need > self.capacity:
                self.full = True
                return image
            self._used[0] = used + need
            self._state[record] = WRITING
        view = self._data[used : used + need].reshape(image.shape)
        np.copyto(view, image)
        ch, cw = image.shape[:2]
        self._dir[record] = (used, height, width, ch, cw, scale)
        with self._lock:  # the pixels and the row are written before READY is seen
            self._state[record] = READY
        return view

    # -- figures and lifetime --------------------------------------------------------------

    def stats(self) -> dict:
        """Records cached, bytes used and the bound."""
        return {"records": int((self._state == READY).sum()), "bytes": int(self._used[0]),
                "max_bytes": self.capacity}

    def __getstate__(self) -> dict:
        if self.path is None:
            raise TypeError("an anonymous decoded cache is inherited by fork; spawned workers "
                            "need a named one")
        return {"path": str(self.path), "short_side": self.short_side,
                "capacity": self.capacity, "num_records": self.num_records,
                "lock": self._lock, "owner": self._owner}

    def __setstate__(self, state: dict) -> None:
        self.path = Path(state["path"])
        self.short_side = state["short_side"]
        self.capacity = state["capacity"]
        self.num_records = state["num_records"]
        self._lock = state["lock"]
        self._owner = state["owner"]
        self._delete = False
        self._layout()
        fd = os.open(self.path, os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, self.nbytes)
        finally:
            os.close(fd)
        self._setup()

    def _unlink(self) -> None:
        if self._delete and self.path is not None and os.getpid() == self._owner:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            self._delete = False

    def close(self) -> None:
        """Unmap (deferred while a view is alive) and delete the file. Idempotent."""
        if getattr(self, "_mm", None) is None:
            return
        self._used = self._dir = self._state = self._data = None
        try:
            self._mm.close()
        except BufferError:
            pass  # a view is alive: the mapping goes with it
        self._mm = None
        self._unlink()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
