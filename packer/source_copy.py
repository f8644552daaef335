"""The local copy of a container source on object storage (TFRecord, WebDataset
tars, Parquet, MDS, our shards): their readers seek, so they read a local file.

The copy lives under the cache folder at a name derived from SRC and is kept
until the pack completes, so the rerun of a failed or interrupted pack fetches
only what it lacks. A journal inside the copy records, per file, the size and
modification time of the object it was fetched from: a file whose object changed
since is fetched again, and a file no longer listed is deleted, so a copy never
mixes old and new objects. One pack at a time holds a copy (an exclusive lock
beside it): a second pack of the same SRC fails at once rather than rewriting
files under the first.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from formats.files import temp_name, try_lock
from formats.storage import Location, StoredFile, default_cache_folder, display_uri

from .errors import PackError

__all__ = ["SourceCopy"]

log = logging.getLogger("shardpack.packer")

_JOURNAL = ".fetched.jsonl"
_LIMIT = 1 << 40  # no single source file is larger; a bound all the same


class SourceCopy:
    """The local copy of the remote SRC ``src``, locked for this process until
    :meth:`release`.

    Raises:
        PackError: another pack holds this copy.
    """

    def __init__(self, src: str) -> None:
        self.src = display_uri(src)
        key = hashlib.sha256(self.src.encode()).hexdigest()[:24]
        self.path = default_cache_folder() / "sources" / key
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = try_lock(self.path.parent / f"{key}.lock")
        if lock is None:
            raise PackError("another pack of this SRC is running and uses its local copy; "
                            "wait for it to finish", path=self.path)
        self._lock = lock

    def fetch(self, location: Location, files: list[StoredFile]) -> Path:
        """Make the copy hold exactly ``files`` of ``location`` and return its folder.

        Raises:
            UnsafePathError: a name that would leave the copy (absolute, ``..``).
            StorageError: a download failed (names the object).
        """
        wanted = {}
        for f in files:
            location.path(f.name)  # relative, no "..": so self.path / name stays inside
            wanted[f.name] = [f.size, f.mtime_ns]
        self.path.mkdir(parents=True, exist_ok=True)
        journal = self.path / _JOURNAL
        have = self._read_journal(journal)
        for p in sorted(self.path.rglob("*"), reverse=True):  # files before their folders
            name = p.relative_to(self.path).as_posix()
            if p.is_file() and name != _JOURNAL and name not in wanted:
                p.unlink()  # no longer listed, or a crashed run's temporary file
            elif p.is_dir() and not any(p.iterdir()):
                p.rmdir()
        with open(journal, "a", encoding="utf-8") as out:
            for name, stamp in wanted.items():
                target = self.path / name
                if have.get(name) == stamp and target.is_file() \
                        and target.stat().st_size == stamp[0]:
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                location.download(name, target, size=stamp[0], limit=_LIMIT)
                # Written after the rename: a crash in between leaves a stamp that does not
                # match the object, so the next run fetches the file again.
                out.write(json.dumps({"name": name, "stamp": stamp}) + "\n")
                out.flush()
        self._compact(journal, wanted)
        return self.path

    def release(self, *, delete: bool) -> None:
        """Unlock; ``delete``: remove the copy (the pack completed), else keep it for a rerun."""
        try:
            if delete:
                shutil.rmtree(self.path, ignore_errors=True)
            elif self.path.exists():
                log.warning("the local copy of %s is kept at %s for a rerun; delete it to "
                            "free the space", self.src, self.path)
        finally:
            os.close(self._lock)

    @staticmethod
    def _read_journal(journal: Path) -> dict[str, list]:
        have: dict[str, list] = {}
        try:
            lines = journal.read_text("utf-8").splitlines()
        except FileNotFoundError:
            return have
        for line in lines:
            try:
                entry = json.loads(line)
                have[entry["name"]] = entry["stamp"]
            except (ValueError, KeyError, TypeError):
                break  # a torn last line: what follows is unknown, so fetched again
        return have

    @staticmethod
    def _compact(journal: Path, wanted: dict[str, list]) -> None:
        tmp = temp_name(journal)
        tmp.write_text("".join(json.dumps({"name": n, "stamp": s}) + "\n"
                               for n, s in wanted.items()), "utf-8")
        os.replace(tmp, journal)
