"""The shards of a dataset a process has open: at most ``max_open``, each checked
before it is read.

An open shard holds at most two descriptors (its maps', or, not mapped yet, its
files' while it is read), so a process keeps at most ``max_open`` shards open,
least recently used first out; by default their descriptors take half the
process's limit (:func:`default_max_open`), so a dataset of any number of shards
opens under any ``ulimit -n`` and the other half is left to the rest of the
program. A shard closed that way is reopened on its next use and must then be
the same files as before (their mtimes are kept): a dataset replaced under its
path is refused, never read half old, half new. A worker that unpickles a
dataset checks that the manifest is still the one the parent opened (its
CRC32C).

Every read goes through :meth:`ShardSet._ready`, which maps a shard opened on
first use once its reads are more than a few records (:meth:`ShardReader.sparse`)
and checks first that a mapped shard's files have not shrunk since they were
mapped (:meth:`ShardReader.check_size`; once per shard per batch, once per single
record), so a file truncated under a reader is a typed error, not SIGBUS.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

from ..checksum import crc32c
from ..errors import FormatError, ManifestError
from ..files import FD_EXHAUSTED
from .manifest import MANIFEST_NAME, Manifest, decode_manifest, read_manifest_bytes
from .shard import ShardReader

__all__ = ["ShardSet", "default_max_open"]


# Datasets of at most this many shards have every shard opened (and checked) at once.
EAGER_SHARDS = 256


def default_max_open() -> int:
    """Shards one process keeps open: two descriptors each, half its descriptor limit.

    The other half stays with the program: sockets, pipes, other datasets, and
    shards whose records a caller still holds views of (a map lives, with its
    descriptor, as long as a view of it does). Under the common limit of 1024
    that is 256 shards open at once; a dataset with more is still read, its
    shards reopened as reads need them (a fraction of a millisecond each).
    """
    try:
        import resource
    except ImportError:  # not POSIX: no limit to read
        return 1024
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 16
    return max(4, soft // 4)


class ShardSet:
    """The manifest of a dataset and the shards this process has open.

    Args:
        path: the dataset folder (holding ``manifest.json``).
        follow_symlinks: read dataset files that are symlinks to files outside
            the folder (refused by default; FORMAT.md, §8).
        max_open: shards this process keeps open (default: :func:`default_max_open`).
    """

    # Reopened shards must be the files first opened (a remote cache may fetch anew).
    _same_files = True
    # Reading a shard's data costs pages of a local file, not a download of the shard.
    local_files = True

    def __init__(self, path: str | Path, *, follow_symlinks: bool = False,
                 max_open: int | None = None) -> None:
        self.root = Path(path)
        self.follow_symlinks = follow_symlinks
        self._manifest_seen = self._manifest_stat()  # before the read: see _check_unreplaced
        raw = read_manifest_bytes(self.root, follow_symlinks=follow_symlinks)
        self.manifest: Manifest = decode_manifest(raw, self.root / MANIFEST_NAME,
                                                  follow_symlinks=follow_symlinks)
        self.manifest_crc32c = crc32c(raw)
        self.max_open = max(1, max_open or default_max_open())
        self._identity: list[tuple | None] = [None] * len(self.manifest.shards)
        self._forget_shards()

    # -- open shards, at most max_open of them ----------------------------------------

    def _forget_shards(self) -> None:
        self._shards: list[ShardReader | None] = [None] * len(self.manifest.shards)
        self._last: ShardReader | None = None  # the shard read last (see _ready)
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._bounded = self.max_open < len(self._shards)
        self._lazy = self._bounded or len(self._shards) > EAGER_SHARDS

    def _open_all(self) -> None:
        """Open (check, FORMAT.md §8 item 2) every shard now, when they are few enough:
        a reader opened before a dataset is overwritten then reads the old one to its
        end. More shards (a million open in a fraction of a second) are each opened and
        checked when a read first needs them."""
        if not self._lazy:
            for s in range(len(self._shards)):
                self._open_shard(s)

    def _map_shard(self, s: int) -> ShardReader:
        """Open shard ``s``: mapped at once when the dataset opens every shard, else
        mapped later, when its reads are no longer a few records (the module docstring
        of :mod:`formats.shard.shard`)."""
        m = self.manifest
        return ShardReader(self.root, m.shards[s], len(m.fields), m.alignment,
                           follow_symlinks=self.follow_symlinks, mapped=not self._lazy)

    def _with_descriptors(self, action, s: int, keep: int = 0):
        """``action()``; when the descriptor table is full, again after closing every
        open shard but the ``keep`` most recently used (the table is full of something
        else: give back what we hold)."""
        try:
            return action()
        except OSError as exc:
            if exc.errno not in FD_EXHAUSTED:
                raise
        self._trim(keep)
        try:
            return action()
        except OSError as again:
            if again.errno not in FD_EXHAUSTED:
                raise
            raise FormatError(
                f"cannot open shard ({again.strerror}): this process keeps at most "
                f"{self.max_open} shards open, two descriptors each, and a shard whose "
                "records are still referenced stays open; raise 'ulimit -n' or drop views",
                path=self.root / self.manifest.shards[s].data_file) from None

    def _open_shard(self, s: int, opened: list[int] | None = None) -> ShardReader:
        """Open shard ``s``, closing the least recently used shards first (``opened``:
        see :meth:`_check_opened`)."""
        self._trim(self.max_open - 1)
        reader = self._with_descriptors(lambda: self._map_shard(s), s)
        known = self._identity[s]
        if known is None and self._lazy:
            # A shard first opened after the dataset was (see _open_all): the manifest
            # must still be the one this object was opened on.
            if opened is not None:
                opened.append(s)  # checked once for the whole batch, after its opens
            else:
                try:
                    self._check_unreplaced(quick=True)
                except BaseException:
                    reader.close()
                    raise
        if known is None or not self._same_files:
            self._identity[s] = reader.identity
        elif known != reader.identity:
            reader.close()
            raise FormatError(f"the dataset at {self.root} was replaced since it was opened "
                              "(this shard's files are not the ones first opened); reopen it",
                              path=reader.data_path)
        self._shards[s] = reader
        self._lru[s] = None
        return reader

    def _close_shard(self, s: int) -> None:
        del self._lru[s]
        reader, self._shards[s] = self._shards[s], None
        if reader is self._last:
            self._last = None
        reader.close()  # views still held by a caller keep their map alive

    def _trim(self, limit: int) -> None:
        """Close the least recently used shards beyond ``limit``."""
        while len(self._lru) > limit:
            self._close_shard(next(iter(self._lru)))

    def _check_opened(self, opened: list[int]) -> None:
        """The manifest check (:meth:`_check_unreplaced`, quick) of the shards a batch,
        read shard by shard, opened for the first time: once for the batch, after all
        its opens (a full shuffle's batch opens hundreds), so a dataset replaced while
        the batch was read is still refused. Those shards are then closed and
        forgotten, and the records read from them, never returned, go with them."""
        if not opened:
            return
        try:
            self._check_unreplaced(quick=True)
        except BaseException:
            for s in opened:
                if self._shards[s] is not None:
                    self._close_shard(s)
                self._identity[s] = None
            raise

    def _ready(self, s: int, records=None, opened: list[int] | None = None) -> ShardReader:
        """Shard ``s`` open, mapped unless ``records`` (its record numbers: an int or an
        array) are few enough to read without (:meth:`ShardReader.sparse`), its files
        still their full size, and the index entries of ``records`` validated, or all of
        them without (see :meth:`ShardReader.validate`: a block's entries once per open
        shard). A batch read shard by shard passes ``opened`` (a list), then calls
        :meth:`_check_opened` with it, whatever happened."""
        reader = self._shards[s]
        if reader is None:
            reader = self._open_shard(s, opened)
        elif self._bounded:
            self._lru.move_to_end(s)
        if reader is not self._last:
            # A shard not mapped holds its descriptors only while it is read: a batch
            # over hundreds of shards holds two at a time (ShardReader.release).
            if self._last is not None:
                self._last.release()
            self._last = reader
        if not reader.mapped and not reader.sparse(records):
            self._lru.move_to_end(s)  # the one kept should the descriptor table be full
            self._with_descriptors(reader.map, s, keep=1)
        reader.check_size()  # on every read path: the one guard against SIGBUS
        if not reader.validated:
            reader.validate(records)
        return reader

    def shard(self, s: int) -> ShardReader:
        """The reader of shard ``s`` (opened if it is not, mapped and checked, its whole
        index validated; see :meth:`_ready`)."""
        return self._ready(s)

    # -- pickling: worker processes reopen the maps ----------------------------------

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for key in ("_shards", "_lru", "_last"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._check_unreplaced()
        self._forget_shards()  # opened on first use, each checked against _identity

    def _manifest_stat(self) -> tuple[int, int, int, int] | None:
        try:
            # Joined as text: asked at each shard's first open, or a batch's (_check_opened).
            st = os.stat(os.path.join(self.root, MANIFEST_NAME))
        except OSError:
            return None
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

    def _check_unreplaced(self, quick: bool = False) -> None:
        """Refuse a dataset whose manifest is no longer the one this object was opened on
        (``pack-dataset --overwrite`` swaps a new dataset in under the same path).

        ``quick``: when the manifest is still the file this object read (device, inode,
        size and mtime as they were before it was read: a swap is a rename, a new
        inode), it is not read again. A full shuffle opens up to a batch's worth of
        shards at once, each first open asking; a stat is a few microseconds where
        reading and checksumming the manifest is tens.
        """
        seen = self._manifest_stat()  # before the read, as in __init__
        if quick and seen is not None and seen == self._manifest_seen:
            return
        raw = read_manifest_bytes(self.root, follow_symlinks=self.follow_symlinks)
        found = crc32c(raw)
        if found != self.manifest_crc32c:
            raise ManifestError(f"the dataset at {self.root} was replaced since it was opened; "
                                "reopen it", path=self.root / MANIFEST_NAME,
                                found=f"manifest crc32c {found:08x}",
                                expected=f"{self.manifest_crc32c:08x}")
        # The same manifest (touched, or rewritten as it was): later quick checks pass
        # on this stat instead of reading it again at every shard's first open.
        self._manifest_seen = seen

    def close(self) -> None:
        for s in list(getattr(self, "_lru", ())):
            self._close_shard(s)
        self._shards = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def shards(self) -> list[ShardReader | None]:
        """The open shards (None: not open now; opened again on use)."""
        return self._shards
