"""Full verification of a dataset: every file checksum, every index entry, every field CRC,
and that every payload of a ``jpeg`` or ``png`` field is an image of that format
(sniffed from its first bytes: a field's type is a promise to readers that decode it).

Unlike reading, verification does not stop at the first problem: it collects one
:class:`Problem` per damaged file or record, so a user sees the extent of the damage.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..checksum import crc32c, fd_crc32c
from ..errors import ShardpackError
from ..files import open_regular
from ..sniff import sniff
from .decoding import PayloadDecoder, load_dictionaries
from .manifest import read_manifest
from .shard import ShardReader

__all__ = ["ALL_MATCH", "Problem", "verify_dataset"]

#: What a verification that found no problem says (``inspect-shards verify``, the demo).
ALL_MATCH = "OK: every record and shard checksum matches"

#: Records of one field in one shard reported by name for holding another format;
#: the rest are counted in one more problem.
_MAX_TYPE_PROBLEMS = 100


@dataclass(frozen=True)
class Problem:
    """One thing wrong: where (file, record, field, byte offset) and what."""

    file: str
    what: str
    record: int | None = None
    field: str | None = None
    offset: int | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        where = [self.file]
        if self.record is not None:
            where.append(f"record {self.record}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        if self.offset is not None:
            where.append(f"at byte {self.offset}")
        return f"{' '.join(where)}: {self.what}"


def verify_dataset(path: str | Path, progress: Callable[[int], None] | None = None, *,
                   follow_symlinks: bool = False) -> list[Problem]:
    """Check everything; return the problems found (empty when the dataset is sound).

    Args:
        path: the dataset folder.
        progress: called with a byte count as data is checked (for a progress bar).
        follow_symlinks: check files that are symlinks out of the folder instead of
            reporting them (FORMAT.md, §8).

    Raises:
        ManifestError, VersionError, UnsafePathError: the manifest itself is
            unusable (nothing else can be checked without it).
    """
    root = Path(path)
    manifest = read_manifest(root, follow_symlinks=follow_symlinks)
    problems: list[Problem] = []
    try:
        decoder = PayloadDecoder(manifest.fields, manifest.max_raw_size,
                               load_dictionaries(root, manifest, follow_symlinks))
    except ShardpackError:  # reported below, by file; compressed images go unsniffed
        decoder = None
    for field, (name, crc) in manifest.dictionaries.items():
        problems.extend(_check_file(root, name, None, crc, follow_symlinks, field=field))
    for entry in manifest.shards:
        for file, size, crc in (
            (entry.data_file, entry.data_bytes, entry.data_crc32c),
            (entry.index_file, entry.index_bytes, entry.index_crc32c),
            (entry.meta_file, entry.meta_bytes, entry.meta_crc32c),
        ):
            problems.extend(_check_file(root, file, size, crc, follow_symlinks))
        try:
            shard = ShardReader(root, entry, len(manifest.fields), manifest.alignment,
                                follow_symlinks=follow_symlinks)
            shard.check_size()
            shard.validate()
        except ShardpackError as exc:
            problems.append(Problem(entry.data_file, exc.message, record=exc.record, offset=exc.offset))
            if progress is not None:
                progress(entry.data_bytes)
            continue
        try:
            problems.extend(_check_records(shard, manifest.fields))
            problems.extend(_check_image_formats(shard, manifest.fields, decoder))
        finally:
            shard.close()
        if progress is not None:
            progress(entry.data_bytes)
    return problems


def _check_file(root: Path, name: str, size: int | None, crc: int, follow_symlinks: bool,
                field: str | None = None) -> list[Problem]:
    """Size and checksum of one file (a regular file, never a FIFO, which would block)."""
    try:
        fd, st = open_regular(root / name, root, what="file", follow_symlinks=follow_symlinks)
    except ShardpackError as exc:
        return [Problem(name, exc.message if exc.found is None else f"{exc.message} ({exc.found})",
                        field=field)]
    except OSError as exc:  # EMFILE
        return [Problem(name, f"cannot open ({exc.strerror})", field=field)]
    try:
        if size is not None and st.st_size != size:
            return [Problem(name, f"size {st.st_size} bytes, manifest says {size}", field=field)]
        try:
            found = fd_crc32c(fd)
        except OSError as exc:
            return [Problem(name, f"cannot read ({exc.strerror})", field=field)]
    finally:
        os.close(fd)
    if found != crc:
        return [Problem(name, f"file checksum 0x{found:08x}, manifest says 0x{crc:08x}", field=field)]
    return []


def _check_records(shard: ShardReader, fields) -> list[Problem]:
    problems = []
    view = shard.view
    offsets = shard.offsets.tolist()
    ends = (shard.offsets + shard.lengths).tolist()
    crcs = shard.crcs.tolist()
    for r, (row_off, row_end, row_crc) in enumerate(zip(offsets, ends, crcs, strict=True)):
        for j, (o, e, c) in enumerate(zip(row_off, row_end, row_crc, strict=True)):
            found = crc32c(view[o:e])
            if found != c:
                problems.append(Problem(
                    shard.data_path.name,
                    f"checksum 0x{found:08x}, expected 0x{c:08x}",
                    record=r, field=fields[j].name, offset=o,
                ))
    scalar_cols = [j for j, f in enumerate(fields) if f.type in ("int", "float")]
    for j in scalar_cols:
        bad = np.flatnonzero(shard.lengths[:, j] != 8)
        for r in bad[:100].tolist():
            problems.append(Problem(shard.data_path.name, "scalar payload is not 8 bytes",
                                    record=r, field=fields[j].name, offset=offsets[r][j]))
    return problems


def _check_image_formats(shard: ShardReader, fields, decoder: PayloadDecoder | None) -> list[Problem]:
    """Every non-empty payload of a ``jpeg``/``png`` field, sniffed."""
    problems = []
    view = shard.view
    for j, f in enumerate(fields):
        if f.type not in ("jpeg", "png") or (f.compression != "none" and decoder is None):
            continue
        starts = shard.offsets[:, j].tolist()
        ends = (shard.offsets[:, j] + shard.lengths[:, j]).tolist()
        bad = 0
        for r, (o, e) in enumerate(zip(starts, ends, strict=True)):
            if o == e:
                continue  # an empty payload is allowed (FORMAT.md, section 5)
            if f.compression == "none":
                head = view[o:min(e, o + 32)]
            else:
                try:
                    head = decoder.decode(j, view[o:e])[:32]
                except ShardpackError:
                    continue  # damaged: its checksum problem is already reported
            kind = sniff(head)
            if kind != f.type:
                bad += 1
                if bad <= _MAX_TYPE_PROBLEMS:
                    problems.append(Problem(shard.data_path.name,
                                            f"payload is {kind}, but the field is {f.type}",
                                            record=r, field=f.name, offset=o))
        if bad > _MAX_TYPE_PROBLEMS:
            problems.append(Problem(shard.data_path.name,
                                    f"{bad - _MAX_TYPE_PROBLEMS} more records hold payloads that "
                                    f"are not {f.type}", field=f.name))
    return problems
