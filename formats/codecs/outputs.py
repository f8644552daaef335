"""Output folders of foreign-format sinks: refuse to clobber, write each file atomically."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import FormatError
from ..files import temp_name
from ..shard.ownership import remove_ours, survey

__all__ = ["AtomicFile", "prepare_output_dir"]


def prepare_output_dir(root: str | Path, *, overwrite: bool, owned: tuple[str, ...]) -> Path:
    """Create ``root``; with ``overwrite``, delete the output an earlier run completed.

    Only files :mod:`formats.shard.ownership` proves ours (listed in the output ledger that
    ``pack-dataset`` writes) are ever deleted; a file of a name this sink writes that
    is not provably ours is never replaced.

    Args:
        root: the output folder.
        overwrite: delete the earlier output's files.
        owned: name prefixes this sink writes (what could collide).

    Raises:
        FormatError: ``root`` already holds such files, and ``overwrite`` is false
            or they are not provably ours.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    found = survey(root)
    old = [p.name for p in root.iterdir() if p.is_file() and p.name.startswith(owned)]
    theirs = [n for n in old if n not in found.ours]
    if theirs or (old and not overwrite):
        raise FormatError(f"output folder already holds {len(old)} such files"
                          + ("; pass overwrite to replace them" if not theirs else
                             ", not written by shardpack: move them away"),
                          path=root, found=(theirs or old)[0])
    if old:
        remove_ours(root, found.leftovers)
    return root


class AtomicFile:
    """A binary file written under a temporary name and renamed into place on commit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = temp_name(path)
        self.file = open(self.tmp, "wb")  # noqa: SIM115 (closed in commit/abort)
        self.nbytes = 0
        self.records = 0

    def write(self, data) -> None:
        self.file.write(data)
        self.nbytes += len(data)

    def commit(self) -> None:
        self.file.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)
