"""Atomic file writes, dataset-relative names that cannot escape their folder, and
opening a dataset's files for reading: regular files only, symlinks kept inside."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .errors import FormatError, ShardpackError, UnsafePathError
from .names import check_name

__all__ = ["atomic_write_bytes", "check_plain_name", "describe_mode", "fsync_dir", "open_regular", "read_regular",
           "safe_child", "temp_name", "try_lock"]

# The descriptor table is full: callers that keep files open close some and retry,
# so these pass through open_regular as OSError instead of becoming a typed error.
FD_EXHAUSTED = (errno.EMFILE, errno.ENFILE)
# What an O_NOFOLLOW open of a symlink fails with (FreeBSD says EMLINK).
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NOFOLLOW_REFUSED = (errno.ELOOP, errno.EMLINK)


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
    """Write ``data`` to a temporary name, then rename it over ``path``: a reader (or a
    crash) sees the old file or the new one, never half of one. The temporary file is
    this process's (:func:`temp_name`): one left by an earlier write of this process
    that could not finish is removed, and it is created new, never through a symlink
    planted at its name."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     0o644)
        with os.fdopen(fd, "wb") as f:
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
        UnsafePathError: ``name`` is not one safe part by :mod:`formats.names`' rule
            (empty, ``.``/``..``, a separator, NUL...): nothing outside ``root`` is
            ever opened because of a name in a manifest.
    """
    check_plain_name(root, name, what=what)
    return Path(root) / name


def check_plain_name(root: str | Path, name: object, *, what: str = "file name") -> None:
    """What :func:`safe_child` checks, without building the path (a manifest holds
    one name per shard, and building a Path costs more than the rest of a shard entry).

    Raises:
        UnsafePathError: as for :func:`safe_child`; ``root`` is named in the message.
    """
    check_name(name, where=root, what=what)  # the one rule (formats.names)


def writev_all(fd: int, pieces: list) -> None:
    """Write every buffer of ``pieces`` (at most ``SC_IOV_MAX``, 1024 on Linux) with
    ``writev``, no copy into a file buffer; a short write (rare: signals, a full disk)
    leaves a tail that is written again."""
    while pieces:
        written = os.writev(fd, pieces)
        done = 0
        while done < len(pieces) and written >= len(pieces[done]):
            written -= len(pieces[done])
            done += 1
        pieces = pieces[done:]
        if pieces and written:
            pieces[0] = memoryview(pieces[0])[written:]


def describe_mode(mode: int) -> str:
    """What a file that is not a regular one is, in words ("a FIFO")."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _is_link(path: str | Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False  # the open reports it, with the same reason


def _inside(root: str | Path, path: Path, what: str) -> Path:
    """Where the symlink ``path`` leads, refused unless that is inside ``root``.

    The dataset folder itself may be a symlink: both sides are resolved.
    """
    target = Path(os.path.realpath(path))
    top = os.path.realpath(root)
    if os.path.commonpath([top, str(target)]) != top:
        raise UnsafePathError(
            f"{what} is a symlink to a file outside the dataset folder; open the dataset "
            "with follow_symlinks=True to read it anyway",
            path=path, found=str(target), expected=f"a file inside {top}",
        )
    return target


def open_regular(path: str | Path, root: str | Path, *, what: str = "file",
                 error: type[ShardpackError] = FormatError,
                 missing: type[ShardpackError] | None = None,
                 follow_symlinks: bool = False) -> tuple[int, os.stat_result]:
    """Open a dataset file for reading: ``(descriptor, fstat)``; the caller closes it.

    Only a regular file is ever returned: a FIFO would block the reader forever
    (the open itself is non-blocking, then ``fstat`` decides), a device never
    ends, a directory is not data. Unless ``follow_symlinks``, a symlink is
    followed only when it resolves inside ``root`` (FORMAT.md, §8).

    Raises:
        error: missing (``missing`` instead, when given), unreadable, or not a regular
            file (names the file).
        UnsafePathError: a symlink leading out of ``root``.
        OSError: only ``EMFILE``/``ENFILE`` (the descriptor table is full), so a
            caller holding other files open can close some and retry.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK
    target = path
    if not follow_symlinks:
        flags |= _O_NOFOLLOW
        if not _O_NOFOLLOW and _is_link(path):  # no O_NOFOLLOW to find out: look first
            target = _inside(root, path, what)
    try:
        try:
            fd = os.open(target, flags)
        except OSError as exc:
            # A symlink fails an O_NOFOLLOW open and is looked at only then: a dataset's
            # files are opened by the hundred, and are almost never links.
            if not (flags & _O_NOFOLLOW and exc.errno in _NOFOLLOW_REFUSED and _is_link(path)):
                raise
            # A name that becomes a link again between the check and the open fails.
            fd = os.open(_inside(root, path, what), flags)
    except FileNotFoundError:
        raise (missing or error)(f"{what} is missing", path=path) from None
    except OSError as exc:
        if exc.errno in FD_EXHAUSTED:
            raise
        if exc.errno in _NOFOLLOW_REFUSED:
            raise UnsafePathError(f"{what} became a symlink while being opened", path=path) from None
        raise error(f"cannot open {what} ({exc.strerror})", path=path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} is {describe_mode(st.st_mode)}, not a regular file", path=path)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(path: str | Path, root: str | Path, *, limit: int, what: str = "file",
                 error: type[ShardpackError] = FormatError, follow_symlinks: bool = False,
                 size: int | None = None) -> bytes:
    """The whole content of a dataset file opened with :func:`open_regular`.

    Args:
        limit: refuse a file larger than this many bytes, before reading any of it.
        size: the exact size the file must have (from the manifest), checked first.

    Raises:
        error: as for :func:`open_regular`, or the file is larger than ``limit``,
            or not ``size`` bytes long.
    """
    try:
        fd, st = open_regular(path, root, what=what, error=error, follow_symlinks=follow_symlinks)
    except OSError as exc:  # EMFILE: nothing here to close
        raise error(f"cannot open {what} ({exc.strerror})", path=path) from None
    with os.fdopen(fd, "rb") as f:
        if size is not None and st.st_size != size:
            kind = "truncated" if st.st_size < size else "larger than recorded"
            raise error(f"{what} is {kind}", path=path, found=f"{st.st_size} bytes",
                        expected=f"{size} bytes")
        if st.st_size > limit:
            raise error(f"{what} is larger than this reader accepts", path=path,
                        found=f"{st.st_size} bytes", expected=f"at most {limit} bytes")
        try:
            data = f.read(st.st_size + 1)  # one byte more: a file growing while read
        except OSError as exc:
            raise error(f"cannot read {what} ({exc.strerror})", path=path) from None
    if len(data) != st.st_size:
        raise error(f"{what} changed size while being read", path=path, found=f"{len(data)} bytes")
    return data
