"""The node's cache folder: where it is, and why it cannot be used, in words.

``formats.shard`` keeps the node's per-record columns there and ``formats.storage``
its downloads of remote shards (``packer`` its staged packs and copied sources), so
this sits below both subpackages: neither imports the other for it. What each
does when the folder cannot be used is its own (the columns fall back to private
memory; downloads raise :class:`~formats.errors.CacheError`); the wording of the
trouble is this module's, one place for all of them.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

__all__ = ["cache_trouble", "default_cache_folder", "free_bytes"]


def default_cache_folder() -> Path:
    """Where shardpack keeps downloads, staged packs and the node's columns:
    ``$SHARDPACK_CACHE``, else ``$XDG_CACHE_HOME/shardpack``, else ``~/.cache/shardpack``;
    made absolute (a leading ``~`` expanded: a quoted ``"~/cache"`` reaches us unexpanded),
    so that processes with other working folders name the same one.

    Nothing is created or checked here: each user of the folder says what it does
    when the folder cannot be used (the columns fall back to memory, downloads raise
    :class:`~formats.errors.CacheError`).
    """
    env = os.environ.get("SHARDPACK_CACHE")
    if env:
        return Path(env).expanduser().absolute()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base).expanduser().absolute() / "shardpack"


def cache_trouble(folder: Path, exc: OSError | str) -> str:
    """Why the cache folder ``folder`` cannot be used, in words for an error or a
    warning: the refusal (``exc``, or a reason), the free space where it is (or would
    be), and what ``$SHARDPACK_CACHE`` says now."""
    why = exc if isinstance(exc, str) else _refusal(exc)
    free = "free space unknown"
    for at in (folder, *folder.parents):
        if os.path.lexists(at):
            if not at.is_dir():
                why = f"{at} is a file, not a folder"
                continue
            try:
                free = f"{_size(free_bytes(at))} free in {at}"
            except OSError:
                pass
            break
    env = os.environ.get("SHARDPACK_CACHE")
    said = f"$SHARDPACK_CACHE is {env}" if env else "$SHARDPACK_CACHE is unset"
    return f"{why}; {free}; {said}"


def _refusal(exc: OSError) -> str:
    code = errno.errorcode.get(exc.errno or 0)
    return f"{exc.strerror or exc}{f' [{code}]' if code else ''}"


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return ""


def free_bytes(path) -> int:
    """Bytes an unprivileged process may still write on ``path``'s filesystem.

    Raises:
        OSError: ``path`` cannot be inspected.
    """
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
