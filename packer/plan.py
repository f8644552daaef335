"""What a pack does, decided once for every source and engine.

The record order (a seeded permutation), the fingerprint a ``--resume`` must
match, what each image payload goes through (:class:`~packer.work.WorkOptions`)
and what the manifest records about how the dataset was made: the local loop
(:mod:`packer.loop`) and the Ray engine both take them from here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from formats.checksum import crc32c
from formats.codecs.paths import expand_inputs
from formats.errors import FormatError, InputError
from formats.version import package_version

from .errors import DestinationError, UsageError
from .options import PackOptions
from .sources.listing import Listing
from .work import WorkOptions

__all__ = ["check_paths", "created_by", "listing_fingerprint",
           "pattern_files", "shuffle_order", "source_fingerprint", "work_options"]

def check_paths(src: Path | None, dst: Path) -> None:
    """SRC exists and DST is a folder outside it (what DST holds is the claim's business:
    :mod:`packer.destination`)."""
    if src is not None and not src.exists():
        raise InputError("SRC does not exist", path=src)
    if dst.exists() and not dst.is_dir():
        raise DestinationError("DST exists and is not a folder", path=dst)
    rs, rd = (src or dst).resolve(), dst.resolve()
    if src is not None and src.is_dir() and (rd == rs or rs in rd.parents):
        raise UsageError("DST is inside SRC; it would pack itself", path=dst)


def shuffle_order(n: int, seed: int) -> list[int]:
    """The order ``--shuffle --seed`` writes ``n`` records in (the same for every
    source and engine)."""
    import numpy as np

    return np.random.default_rng(seed).permutation(n).tolist()


def _shaping(options: PackOptions) -> dict[str, Any]:
    # on_error aside: resuming a failed pack with ``skip`` is the way past a bad input.
    return {k: v for k, v in options.recorded().items() if k != "on_error"}


def listing_fingerprint(listing: Listing, options: PackOptions) -> str:
    """A listed source (where it is, every key and column value) and the options that
    shape the output."""
    keys = crc32c("\n".join(listing.keys).encode("utf-8", "surrogateescape"))
    columns = crc32c(json.dumps(listing.columns, sort_keys=True, default=_plain).encode())
    where = str(listing.root) if listing.location is not None else os.path.abspath(listing.root)
    parts = [_shaping(options), listing.kind, where, len(listing), keys, columns]
    if listing.members is not None:  # any files: every record's files and their types
        parts.append(crc32c(json.dumps([listing.members, [f.to_json() for f in listing.fields]])
                            .encode("utf-8", "surrogateescape")))
    text = json.dumps(parts, sort_keys=True)
    return f"{crc32c(text.encode()):08x}"


def _plain(value: Any) -> Any:
    """A column value JSON has no type for (an ndarray), whole: str() would elide it."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return [value.dtype.str, list(value.shape), value.tolist()]
    return str(value)


def source_fingerprint(root: Path | None, kind: str, options: PackOptions) -> str:
    """A container source (every file's name, size and mtime, and where it is) and the
    options that shape the output."""
    files = []
    if root is not None:
        if root.is_file():
            paths, base = [root], root.parent
        elif root.is_dir():
            paths, base = sorted(p for p in root.rglob("*") if p.is_file()), root
        else:
            paths, base = pattern_files(root) or [], Path("/")
        for p in paths:
            st = p.stat()
            files.append([os.path.relpath(p, base), st.st_size, st.st_mtime_ns])
    where = None if root is None else os.path.abspath(root)
    text = json.dumps([kind, _shaping(options), where, files], sort_keys=True)
    return f"{crc32c(text.encode()):08x}"


def pattern_files(src: Path) -> list[Path] | None:
    """The files a SRC that does not exist names as a glob or brace pattern (None: not a
    pattern).

    Raises:
        InputError: a pattern that matches no file.
    """
    import glob
    import re

    text = str(src)
    if src.exists() or not (glob.has_magic(text) or re.search(r"\{[^{}]*[,.][^{}]*\}", text)):
        return None
    try:
        return expand_inputs(text, ("",))
    except FormatError:
        raise InputError("SRC is a pattern (glob or braces) that matches no file; a pattern "
                         "names container files (tfrecord, webdataset, parquet), never "
                         "folders", path=src) from None


def work_options(options: PackOptions, location: Any = None) -> WorkOptions:
    """What every image payload goes through. Its type is the data's: the writer types
    an image field ``jpeg`` while every payload is a JPEG, and ``image`` from the
    first that is not (formats.DatasetWriter), so payloads are checked as images of
    any known format here."""
    return WorkOptions("image", options.max_side, options.quality, options.to_jpeg, location,
                       options.max_pixels, options.keep_unsupported, options.verify_decode)


def created_by(source_kind: str, source_path: str, options: PackOptions) -> dict[str, Any]:
    """The manifest's record of how the dataset was made (every option applied)."""
    return {"tool": "pack-dataset", "version": package_version(),
            "source": {"kind": source_kind, "path": source_path},
            "options": options.recorded()}
