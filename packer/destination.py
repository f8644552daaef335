"""A local DST claimed for one pack: one writer, nothing of anyone else's deleted,
and a replace that leaves the old dataset or the new one, never neither.

Claiming DST (the protocol; cited as "claiming DST" where it is used)
----------------------------------------------------------------------
1. **Lock.** DST is created if missing and ``DST/.shardpack.lock`` is locked
   (``flock``, exclusive, not waiting) for the whole pack; the holder writes its
   PID there, so a second pack fails at once naming it. After locking, the file
   is checked to still be the one at that path: a replace moves folders, and the
   holder deletes the file before it unlocks, so a lock on a file that moved
   away guards nothing. A finished pack leaves no lock file behind.
2. **Survey** (:mod:`formats.shard.ownership`, told the names a pack works under:
   :data:`packer.work_names.WORK`; an earlier pack's range state, ``.ray/``, is
   first renamed to today's name). Refused: a ``manifest.json`` that is
   not ours (never replaced); a complete dataset or output without
   ``--overwrite``; entries we cannot prove are ours without ``--overwrite``
   (a resume goes on beside the entries its interrupted run accepted).
3. **Where the pack writes.** *In place* when DST holds no complete output:
   our leftovers are deleted (kept with ``--resume``). *Staged* when DST holds a
   complete output to replace, or the sink is a foreign format (no resume
   journal, so its output appears whole or not at all): the pack writes into
   the sibling folder ``.<name>.shardpack-new``, which holds a marker naming DST
   and its own locked lock file.
4. **Commit** (staged). A foreign sink's files are listed in the output ledger.
   DST's foreign entries are recorded in the marker, then moved into the staging
   folder; the two folders are exchanged with one atomic rename (Linux
   ``renameat2(RENAME_EXCHANGE)``; elsewhere DST is renamed to
   ``.<name>.shardpack-old`` and the staging folder to DST); the marker is
   dropped; the old folder, which now holds only our files, is deleted.
   Readers that opened the old dataset keep their maps; new opens see the new one.
5. **Recovery** (at the next claim, under the lock). A staging folder whose
   marker lists moved entries gets them back (the exchange never happened),
   then is resumed (``--resume``) or deleted. A staging folder without a marker
   is the old folder of an exchange that completed: our files go. A
   ``.shardpack-old`` folder with no DST is renamed back.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import stat
from pathlib import Path

from formats.files import atomic_write_bytes, fsync_dir
from formats.shard.ownership import (
    LEDGER_NAME,
    LOCK_NAME,
    STAGING_MARKER,
    Survey,
    output_entries,
    remove_ours,
    survey,
    write_ledger,
)
from formats.storage import display_uri

from .errors import DestinationError, PackError, PackInterrupted, UsageError
from .options import PackOptions
from .work_names import WORK, adopt_legacy_state

__all__ = ["Destination", "claim", "claimed"]

log = logging.getLogger("shardpack.packer")

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_SHOWN = 5  # foreign entries named in a refusal


def _renameat2():
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one atomic step; False where the system cannot."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _lock(folder: Path) -> int:
    """Lock ``folder/.shardpack.lock`` (step 1); the descriptor, to close to unlock."""
    import fcntl

    path = folder / LOCK_NAME
    for _ in range(8):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise PackError(f"cannot create the lock file ({exc.strerror})", path=path) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise PackError(f"another pack (PID {holder}) is writing to this DST; wait for it "
                            "to finish", path=folder) from None
        mine = os.fstat(fd)
        try:
            now = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)  # the folder was swapped while we locked: lock the file there now
    raise PackError("DST keeps changing while it is being locked", path=folder)


def _read_marker(path: Path) -> dict | None:
    try:
        st = os.stat(path, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 16 << 20:
            return None
        obj = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _refuse_foreign(s: Survey, dst: Path) -> None:
    shown = ", ".join(repr(n) for n in s.foreign[:_SHOWN])
    more = f" and {len(s.foreign) - _SHOWN} more" if len(s.foreign) > _SHOWN else ""
    raise DestinationError(f"DST holds files that shardpack did not write ({shown}{more}); pack into "
                     "an empty or new folder, or pass --overwrite (PackOptions(overwrite=True)) "
                     "to pack beside them (they are kept as they are)", path=dst)


class Destination:
    """A claimed local DST (see the module docstring).

    Attributes:
        dst: DST as the user gave it.
        folder: where the pack writes: DST, or the staging folder.
        staged: whether :meth:`commit` swaps ``folder`` in.
    """

    def __init__(self, dst: Path, options: PackOptions, *, foreign_sink: bool) -> None:
        self.dst = dst
        self.options = options
        self.foreign_sink = foreign_sink
        real = Path(os.path.abspath(dst))
        if not real.name:
            raise UsageError("DST cannot be the root folder", path=dst)
        self._real = real
        self.staging = real.with_name(f".{real.name}.shardpack-new")
        self._old = real.with_name(f".{real.name}.shardpack-old")
        self.folder = dst
        self.staged = False
        self._locks: list[int] = []
        if not real.exists() and self._old.is_dir():
            os.rename(self._old, real)  # step 5: a fallback swap killed halfway
        self._created = not real.exists()
        try:
            real.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DestinationError(f"cannot create DST ({exc.strerror})", path=dst) from None
        self._locks.append(_lock(real))
        try:
            self._prepare()
        except BaseException:
            self.release()
            raise

    # -- steps 2, 3 and 5 ----------------------------------------------------------------

    def _prepare(self) -> None:
        o = self.options
        pending = self._recover()
        s = self._survey(self._real)
        if s.bad_manifest is not None:
            raise DestinationError(f"DST holds a manifest.json that is not a valid shardpack manifest "
                             f"({s.bad_manifest}); it is never replaced: remove it yourself",
                             path=self.dst)
        if o.resume and pending:
            self._stage(fresh=False)
            return
        if pending:
            self._drop_staging()
        if s.complete and not o.overwrite:
            what = ("it is complete: nothing to resume; " if o.resume else "")
            raise DestinationError(f"DST is already a dataset; {what}pass --overwrite "
                                   "(PackOptions(overwrite=True)) to replace it", path=self.dst)
        interrupted = s.journal or s.work_state
        if s.foreign and not o.overwrite and not (o.resume and interrupted):
            _refuse_foreign(s, self.dst)
        if s.complete or self.foreign_sink:
            self._stage(fresh=True)
        elif not o.resume:
            remove_ours(self._real, s.leftovers, work=WORK)

    def _recover(self) -> bool:
        """Step 5; True when a staging folder of an unfinished pack is left."""
        if not self.staging.is_dir() or self.staging.is_symlink():
            return False
        marker = _read_marker(self.staging / STAGING_MARKER)
        if marker is None or marker.get("dst") != str(self._real):
            self._delete_old(self.staging)
            if self.staging.exists():
                raise PackError("this folder beside DST holds files that shardpack did not "
                                "write, and packs to DST need its name: move it away",
                                path=self.staging)
            return False
        stuck = []
        for rel in marker.get("moved") or ():
            if not isinstance(rel, str) or ".." in Path(rel).parts or os.path.isabs(rel):
                continue
            src, dest = self.staging / rel, self._real / rel
            if os.path.lexists(src):
                if os.path.lexists(dest):
                    stuck.append(rel)
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.rename(src, dest)
        if stuck:
            raise PackError(f"{len(stuck)} entries moved out of DST by an interrupted replace "
                            f"could not go back (DST has new entries of the same names, e.g. "
                            f"{stuck[0]!r}); move them back yourself", path=self.staging)
        self._write_marker([])
        return True

    def _survey(self, folder: Path) -> Survey:
        """Step 2 for ``folder`` (DST or a staging folder of ours, both under DST's lock)."""
        adopt_legacy_state(folder, self.options.durable)
        return survey(folder, WORK)

    def _stage(self, *, fresh: bool) -> None:
        if fresh:
            self.staging.mkdir()
            self._write_marker([])
        self._locks.append(_lock(self.staging))
        if not fresh:  # resumed: the range driver looks for its state by today's name
            adopt_legacy_state(self.staging, self.options.durable)
        self.folder = self.staging
        self.staged = True

    def _write_marker(self, moved: list[str]) -> None:
        data = json.dumps({"dst": str(self._real), "moved": moved}).encode()
        atomic_write_bytes(self.staging / STAGING_MARKER, data, durable=self.options.durable)

    def _drop_staging(self) -> None:
        # Ours as a whole: we made it (its marker names DST), and every entry moved
        # into it from DST has been moved back (_recover) or never was (commit).
        import shutil

        shutil.rmtree(self.staging)

    def _delete_old(self, folder: Path) -> None:
        s = self._survey(folder)
        remove_ours(folder, s.ours, work=WORK)
        self._rmdir(folder, s)

    @staticmethod
    def _rmdir(folder: Path, s: Survey) -> None:
        try:
            folder.rmdir()
        except OSError:
            log.warning("%s holds files that shardpack did not write (%s); left in place",
                        folder, ", ".join(s.foreign[:_SHOWN]))

    # -- step 4 --------------------------------------------------------------------------

    def commit(self) -> None:
        """Make the finished pack DST's content (staged packs; in place, nothing to do)."""
        if not self.staged:
            return
        durable = self.options.durable
        if self.foreign_sink:
            write_ledger(self.staging, self._output_files(), durable=durable)
        s = survey(self._real, WORK)
        moved = s.foreign
        taken = [n for n in moved if os.path.lexists(self.staging / n)]
        if taken:
            raise PackError(f"DST holds {taken[0]!r}, which the new output also writes; move it "
                            "away and pack again", path=self.dst)
        self._write_marker(moved)
        try:
            for rel in moved:
                (self.staging / rel).parent.mkdir(parents=True, exist_ok=True)
                os.rename(self._real / rel, self.staging / rel)
            if exchange(self.staging, self._real):
                old = self.staging
            else:
                os.rename(self._real, self._old)
                os.rename(self.staging, self._real)
                old = self._old
        except OSError:
            if self.staging.is_dir() and self._real.is_dir():
                self._recover()  # the swap did not happen: the moved entries go back
            raise
        (self._real / STAGING_MARKER).unlink(missing_ok=True)
        if durable:
            fsync_dir(self._real.parent)
        self.staged = False
        self.folder = self.dst
        self._delete_old(old)

    def _output_files(self) -> list[str]:
        return output_entries(self.staging, skip=(LOCK_NAME, STAGING_MARKER, LEDGER_NAME))

    def abandon(self) -> None:
        """A failed staged pack of a foreign sink: nothing of it is worth keeping."""
        if self.staged and self.foreign_sink:
            self._recover()
            self._drop_staging()
            self.staged = False

    def release(self) -> None:
        """Unlock. Our lock files go first, while still locked: a pack that opened one
        and locks it after us finds it no longer at its path (step 1) and retries."""
        held = {(st.st_ino, st.st_dev) for st in map(os.fstat, self._locks)}
        for path in (self._real / LOCK_NAME, self.staging / LOCK_NAME):
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            if (st.st_ino, st.st_dev) in held:
                path.unlink()
        for fd in self._locks:
            os.close(fd)
        self._locks = []
        if self._created:
            try:
                self._real.rmdir()  # a pack refused before writing leaves no empty DST
            except OSError:
                pass


def claim(dst: Path, options: PackOptions) -> Destination:
    """Claim the local folder ``dst`` for one pack (the module docstring's protocol)."""
    return Destination(dst, options, foreign_sink=options.sink != "shards")


def claimed(dst: Path, options: PackOptions, run):
    """``run(folder)`` on DST claimed as this module describes ("claiming DST"): locked,
    refused if it holds what is not ours, staged when it replaces; returns its
    :class:`~packer.report.PackSummary`, committed once complete."""
    dest = claim(dst, options)
    try:
        summary = run(dest.folder)
        if summary.complete:
            dest.commit()
        summary.dst = display_uri(dst)
        return summary
    except BaseException as exc:
        dest.abandon()
        if isinstance(exc, PackInterrupted):  # the CLI says where the shards are
            if dest.foreign_sink:
                exc.summary.resumable = False  # abandon() deleted the staged output
            elif dest.staged:
                exc.summary.kept_in = str(Path(dest.dst).parent / dest.staging.name)
        raise
    finally:
        dest.release()
