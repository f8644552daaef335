"""Output folders of foreign-format sinks: refuse to clobber, write each file atomically."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import FormatError
from .files import temp_name

__all__ = ["AtomicFile", "prepare_output_dir"]


def prepare_output_dir(root: str | Path, *, overwrite: bool, owned: tuple[str, ...]) -> Path:
    """Create ``root``; with ``overwrite``, delete the files a previous run left.

    Args:
        root: the output folder.
        overwrite: delete files whose names start with one of ``owned``.
        owned: name prefixes this sink writes (only those are ever deleted).

    Raises:
        FormatError: ``root`` already holds such files and ``overwrite`` is false.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    old = [p for p in root.iterdir() if p.is_file() and p.name.startswith(owned)]
    if old and not overwrite:
        raise FormatError(f"output folder already holds {len(old)} such files; pass overwrite "
                          "to replace them", path=root, found=old[0].name)
    for p in old:
        p.unlink()
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
