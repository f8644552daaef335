"""The locks of a column folder (:mod:`formats.shard.column_cache`): who builds, who waits,
who still maps it.

* ``.lock``: the builder's, exclusive (``flock``: a dead holder's lock is released by
  the kernel, so no lock is ever stale). The builder touches it every :data:`_BEAT_S`
  while it builds (a heartbeat, from a thread). A waiter logs after
  :data:`LOG_AFTER_S` and every 30 s after; it gives up (:class:`Unusable`) when the
  holder has shown no heartbeat for :data:`STALL_S` (a stopped process, or a lock
  held by something that is not building; then at once for the next column of the
  folder, while the holder still shows none), or after :data:`MAX_WAIT_S` whatever
  the holder does.
* ``.inuse``: shared by every process that maps one of the folder's columns, for as
  long as any is mapped (:class:`Hold`); a folder is deleted only by whoever takes it
  and ``.lock`` exclusively (:func:`free_to_delete`). Exact, one descriptor per mapped
  set, released by the kernel when a process dies.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["LOG_AFTER_S", "MAX_WAIT_S", "STALL_S", "Hold", "Unusable", "build_lock",
           "free_to_delete"]

log = logging.getLogger("formats.shard.column_cache")  # one logger for the column cache

LOG_AFTER_S = 2.0
STALL_S = 5.0
MAX_WAIT_S = 600.0
_BEAT_S = 1.0  # a builder's heartbeat; STALL_S leaves room for a loaded machine
_TOLD_EVERY_S = 30.0

_stalled: dict[str, float] = {}  # column folders whose lock this process gave up: its mtime then


class Unusable(Exception):
    """Private: the cache folder cannot hold the columns; its one argument says why
    (the ``OSError`` the filesystem raised, or words)."""


class Hold:
    """A shared ``flock`` on a column folder's ``.inuse``, held while any column of
    the folder is mapped (each mapped array keeps it alive); closed, never unlocked,
    so a forked child that inherited it keeps the folder in use too."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass  # at interpreter exit

    @classmethod
    def take(cls, folder: Path) -> Hold | None:
        """The hold, or None where the folder is missing or refuses (nothing to keep)."""
        path = folder / ".inuse"
        deadline = time.monotonic() + 1.0  # a deleter holds it for one rmtree
        while time.monotonic() < deadline:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:
                try:
                    fd = os.open(path, os.O_RDONLY)
                except OSError:
                    return None
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                if os.fstat(fd).st_ino == os.stat(path).st_ino:  # not deleted meanwhile
                    return cls(fd)
            except OSError:
                time.sleep(0.01)
            os.close(fd)
        return None


@contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    """The folder's build lock, waited for within bounds, with a heartbeat while held.

    Raises:
        Unusable: no folder or lock file can be made, or the holder stalled.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise Unusable(exc) from None
    try:
        _wait(fd, folder)
        stop = threading.Event()
        beat = threading.Thread(target=_beat, args=(fd, stop), daemon=True,
                                name="shardpack-column-build")
        _touch(fd)
        beat.start()
        try:
            yield
        finally:
            stop.set()
            beat.join()
    finally:
        os.close(fd)


def _touch(fd: int) -> None:
    try:
        os.utime(fd)
    except OSError:
        pass  # a heartbeat lost costs a waiter's patience, nothing else


def _beat(fd: int, stop: threading.Event) -> None:
    while not stop.wait(_BEAT_S):
        _touch(fd)


def _wait(fd: int, folder: Path) -> None:
    """Take the lock ``fd``, waiting as the module says.

    Raises:
        Unusable: the holder shows no heartbeat for STALL_S, or MAX_WAIT_S passed.
    """
    start = time.monotonic()
    told, pause = 0.0, 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _stalled.pop(str(folder), None)
            return
        except BlockingIOError:
            pass
        waited = time.monotonic() - start
        beat = os.fstat(fd).st_mtime
        quiet = time.time() - beat
        if _stalled.get(str(folder)) == beat or (waited > STALL_S and quiet > STALL_S):
            _stalled[str(folder)] = beat  # the next column of this folder: no second wait
            raise Unusable(f"another process holds its lock {folder / '.lock'} and has shown "
                           f"no sign of progress for {quiet:.0f} s")
        if waited > MAX_WAIT_S:
            raise Unusable(f"another process has held its lock {folder / '.lock'} for over "
                           f"{MAX_WAIT_S:.0f} s")
        if waited > LOG_AFTER_S and (not told or waited - told > _TOLD_EVERY_S):
            told = waited
            log.warning("shardpack: waiting %.0f s for another process building the columns "
                        "in %s (its lock %s); giving up after %.0f s without progress",
                        waited, folder, folder / ".lock", STALL_S)
        time.sleep(pause)
        pause = min(2 * pause, 0.25)


def free_to_delete(folder: Path) -> list[int] | None:
    """Exclusive locks on ``folder``'s ``.lock`` and ``.inuse`` (their descriptors), or
    None while a process builds in it or maps it."""
    fds: list[int] = []
    for name in (".lock", ".inuse"):
        try:
            fd = os.open(folder / name, os.O_RDONLY)
        except FileNotFoundError:
            continue  # nobody can hold a lock on a file that is not there
        except OSError:
            break
        fds.append(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            break
    else:
        return fds
    for fd in fds:
        os.close(fd)
    return None
