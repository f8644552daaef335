"""Atomic file writes and dataset-relative names that cannot escape their folder."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import UnsafePathError

__all__ = ["atomic_write_bytes", "fsync_dir", "safe_child", "temp_name", "try_lock"]


def try_lock(path: Path) -> int | None:
    """Take an exclusive lock on the file ``path`` (created if missing): the open file
    descriptor, to ``os.close`` to unlock, or None when another process holds it. The
    file is never deleted: deleting a lock file races with its next user."""
    import fcntl  # POSIX only: imported here so that formats still imports anywhere

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def temp_name(path: Path) -> Path:
    """Where ``path`` is written before it is complete (never taken for the real file)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def fsync_dir(path: str | Path) -> None:
    """Flush a directory entry (a rename) to disk, where the platform allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to a temporary name, then rename it over ``path``."""
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def safe_child(root: str | Path, name: object, *, what: str = "file name") -> Path:
    """``root / name`` for a plain file name read from untrusted input.

    Raises:
        UnsafePathError: ``name`` is not a string, is empty, is absolute, holds a
            path separator, NUL, or is ``.``/``..``: nothing outside ``root`` is
            ever opened because of a name in a manifest.
    """
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\x00" in name
        or os.path.isabs(name)
    ):
        raise UnsafePathError(
            f"unsafe {what}: must be a plain name inside the dataset folder",
            path=root,
            found=name,
        )
    return Path(root) / name
