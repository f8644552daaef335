"""manifest.json: the one file that says a dataset is complete (FORMAT.md, "Manifest").

Parsing checks every key and type before anything else is opened, and every
file name it yields is a plain name inside the dataset folder. A hostile
manifest costs little: its size is capped before it is read, every count fits
an int64, every string encodes to UTF-8, and the stored free-form values are
shallow (formats.bounded.parse_json), so no later step (numpy, paths, printing)
meets a raw exception.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..bounded import parse_json
from ..checksum import crc32c, format_crc, parse_crc
from ..errors import ManifestError, SchemaError, VersionError
from ..fields import IMAGE_TYPES, Field, stored_image_type
from ..files import atomic_write_bytes, check_plain_name, read_regular
from .layout import FORMAT_NAME, MAX_ALIGNMENT, MIN_ALIGNMENT, index_sections
from .shard_table import SHARD_TABLE_NAME, ShardEntry, ShardTable

__all__ = [
    "MANIFEST_NAME",
    "MAX_MANIFEST_BYTES",
    "Manifest",
    "ShardEntry",
    "Written",
    "build_manifest",
    "decode_manifest",
    "manifest_files",
    "parse_manifest",
    "read_manifest",
    "read_manifest_bytes",
    "shard_table_ref",
    "write_manifest",
]

MANIFEST_NAME = "manifest.json"

# The manifest's version (FORMAT.md, §7): 2.0 moved the shard list into the shard
# table. Readers read 1.x and 2.x; writers write 2.0. The shard files themselves keep
# their own header version (formats.shard.layout.MAJOR).
MAJOR, MINOR = 2, 0
READS = (1, 2)

# A 2.x manifest holds no per-shard entry, so 16 MiB bounds only the schema and the
# classes. A 1.x manifest spends about 210 bytes a shard: some 80,000 shards, parsed
# in under a second; a larger file is refused before any of it is read.
MAX_MANIFEST_BYTES = 16 << 20
# Some 60 bytes a shard: 10^7 shards in 600 MB, mapped rather than read.
MAX_SHARD_TABLE_BYTES = 4 << 30
MAX_COUNT = (1 << 63) - 1  # every count and size is an int64 somewhere (numpy, file offsets)
MAX_NDARRAY_DIM = (1 << 31) - 1
_VERSION = re.compile(r"([0-9]{1,9})\.([0-9]{1,9})")
# Where a lone surrogate can come from in valid UTF-8 JSON: a \uD800-\uDFFF escape.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass(frozen=True)
class Manifest:
    """The parsed manifest. ``dictionaries`` maps field name to (file name, crc);
    ``class_info`` (optional, None when absent) an object per class, index = label."""

    fields: tuple[Field, ...]
    shards: ShardTable
    alignment: int
    classes: tuple[str, ...] | None = None
    class_info: tuple[dict[str, Any], ...] | None = None
    created_by: dict[str, Any] = field(default_factory=dict)
    dictionaries: dict[str, tuple[str, int]] = field(default_factory=dict)
    max_raw_size: dict[str, int] = field(default_factory=dict)
    major: int = MAJOR
    minor: int = MINOR
    # The shard table's file name (None: a 1.x manifest, which lists its shards itself).
    shard_table: str | None = SHARD_TABLE_NAME

    @property
    def version(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def records(self) -> int:
        return self.shards.total_records

    @property
    def data_bytes(self) -> int:
        return int(self.shards.data_bytes.sum())

    def to_json(self, table: bytes) -> dict[str, Any]:
        """The manifest's object, written (2.0) with ``table``, its shard table's bytes."""
        fields = []
        for f in self.fields:
            entry = f.to_json()
            if f.name in self.dictionaries:
                name, crc = self.dictionaries[f.name]
                entry["dictionary"] = name
                entry["dictionary_crc32c"] = format_crc(crc)
            if f.compression != "none":
                entry["max_raw_size"] = self.max_raw_size.get(f.name, 0)
            fields.append(entry)
        out = {
            "format": FORMAT_NAME,
            "format_version": f"{MAJOR}.{MINOR}",
            "alignment": self.alignment,
            "fields": fields,
            "shard_table": {"name": SHARD_TABLE_NAME, "bytes": len(table),
                            "crc32c": format_crc(crc32c(table))},
            "totals": {"records": self.records, "data_bytes": self.data_bytes, "shards": len(self.shards)},
            "classes": None if self.classes is None else list(self.classes),
            "created_by": self.created_by,
        }
        if self.class_info is not None:  # absent otherwise: older manifests keep their bytes
            out["class_info"] = list(self.class_info)
        return out


@dataclass(frozen=True)
class Written:
    """What one writer sealed, for :func:`build_manifest`.

    Attributes:
        shards: its shards, in order.
        alignment: their payload alignment.
        max_raw_size: per compressed field, the largest raw value it wrote.
        image_types: per image field, the formats of the payloads it wrote (``jpeg``,
            ``png``, anything else: :func:`formats.fields.stored_image_type`); absent
            or empty for a field it wrote nothing to.
    """

    shards: tuple[ShardEntry, ...]
    alignment: int
    max_raw_size: Mapping[str, int] = field(default_factory=dict)
    image_types: Mapping[str, Collection[str]] = field(default_factory=dict)


def build_manifest(fields: Sequence[Field], parts: Sequence[Written], *,
                   classes: tuple[str, ...] | None = None,
                   class_info: tuple[dict[str, Any], ...] | None = None,
                   created_by: dict[str, Any] | None = None,
                   dictionaries: dict[str, tuple[str, int]] | None = None) -> Manifest:
    """The manifest of the dataset ``parts`` wrote, in order: the one way a manifest is
    made from writing. A :class:`~formats.DatasetWriter` is one part; the packer's
    range driver joins a part per range (each written by a DatasetWriter of its own,
    its shards renamed).

    Each image field is typed by what every part stored (unchanged where none stored
    a payload), and each compressed field's ``max_raw_size`` is the largest of any part.

    Raises:
        SchemaError: no part, or parts of different alignments.
    """
    if not parts:
        raise SchemaError("a manifest needs the shards of at least one writer")
    alignment = parts[0].alignment
    if any(p.alignment != alignment for p in parts):
        raise SchemaError("the parts of a dataset were written with different alignments",
                          found=sorted({p.alignment for p in parts}))
    typed = []
    for f in fields:
        seen = set()
        if f.type in IMAGE_TYPES:
            for p in parts:
                seen.update(p.image_types.get(f.name, ()))
        typed.append(replace(f, type=stored_image_type(seen)) if seen else f)
    max_raw: dict[str, int] = {}
    for p in parts:
        for name, size in p.max_raw_size.items():
            max_raw[name] = max(max_raw.get(name, 0), size)
    return Manifest(fields=tuple(typed),
                    shards=ShardTable.from_entries([s for p in parts for s in p.shards]),
                    alignment=alignment, classes=classes, class_info=class_info,
                    created_by=dict(created_by or {}), dictionaries=dict(dictionaries or {}),
                    max_raw_size=max_raw)


def manifest_files(manifest: Manifest) -> list[tuple[str, bytes]]:
    """The dataset's closing files, in the order they must be written: the shard table,
    then ``manifest.json`` (last: its presence means complete, FORMAT.md §9). Sorted
    keys and no timestamps: the same dataset gives the same bytes.

    Raises:
        ManifestError: a manifest over :data:`MAX_MANIFEST_BYTES` (classes), which no
            reader opens.
    """
    table = manifest.shards.to_ipc()
    text = json.dumps(manifest.to_json(table), sort_keys=True, indent=1, ensure_ascii=False)
    data = (text + "\n").encode("utf-8")
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError("manifest would be larger than readers accept (too many classes)",
                            found=f"{len(data)} bytes", expected=f"at most {MAX_MANIFEST_BYTES}")
    return [(SHARD_TABLE_NAME, table), (MANIFEST_NAME, data)]


def write_manifest(root: Path, manifest: Manifest, *, durable: bool = True) -> None:
    """Write the shard table, then ``root/manifest.json``, each atomically (and, when
    ``durable``, flushed to disk before the next)."""
    for name, data in manifest_files(manifest):
        atomic_write_bytes(root / name, data, durable=durable)


def read_manifest(root: str | Path, *, follow_symlinks: bool = False) -> Manifest:
    """Read and validate ``root/manifest.json``.

    Raises:
        ManifestError: missing file, not a regular file, too large, bad JSON,
            missing keys, wrong types, counts that disagree, unsafe file names.
        VersionError: a major version this code does not know.
        UnsafePathError: the manifest is a symlink out of ``root`` (see
            :func:`formats.files.open_regular`).
    """
    return decode_manifest(read_manifest_bytes(root, follow_symlinks=follow_symlinks),
                           Path(root) / MANIFEST_NAME, follow_symlinks=follow_symlinks)


def read_manifest_bytes(root: str | Path, *, follow_symlinks: bool = False) -> bytes:
    """The bytes of ``root/manifest.json`` (a regular file of at most MAX_MANIFEST_BYTES)."""
    path = Path(root) / MANIFEST_NAME
    if not os.path.lexists(path):
        raise ManifestError(
            "no manifest.json: not a shardpack dataset, or one whose writing never finished",
            path=path,
        )
    return read_regular(path, root, limit=MAX_MANIFEST_BYTES, what="manifest",
                        error=ManifestError, follow_symlinks=follow_symlinks)


def decode_manifest(raw: bytes, path: str | Path, *, root: str | Path | None = None,
                    follow_symlinks: bool = False) -> Manifest:
    """Parse and validate a manifest's bytes; ``path`` names it in errors. A 2.x
    manifest's shard table is read from ``root`` (default: ``path``'s folder)."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError("manifest is larger than this reader accepts", path=path,
                            found=f"{len(raw)} bytes", expected=f"at most {MAX_MANIFEST_BYTES}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"manifest is not UTF-8 ({exc})", path=path) from None
    # Nesting, Python's integer digit limit and RecursionError: the one JSON policy.
    obj = parse_json(text, path=path, what="manifest", error=ManifestError,
                     max_bytes=MAX_MANIFEST_BYTES)
    if _SURROGATE_ESCAPE.search(raw):
        _refuse_surrogates(obj, path)
    return parse_manifest(obj, path, root=root, follow_symlinks=follow_symlinks)


def shard_table_ref(raw: bytes, path: str | Path) -> tuple[str, int, int] | None:
    """(name, size, crc32c) of the shard table a manifest's bytes name, or None (a 1.x
    manifest, or one too broken to say: decoding it then says what is wrong). For a
    remote dataset, whose table must be fetched before the manifest is decoded."""
    try:
        ref = parse_json(raw.decode("utf-8"), path=path, what="manifest", error=ManifestError,
                         max_bytes=MAX_MANIFEST_BYTES).get("shard_table")
        name, size = ref["name"], ref["bytes"]
        crc = parse_crc(ref["crc32c"])
    except (ManifestError, UnicodeDecodeError, AttributeError, KeyError, TypeError):
        return None
    if (not isinstance(name, str) or isinstance(size, bool) or not isinstance(size, int)
            or not 0 <= size <= MAX_SHARD_TABLE_BYTES or crc is None):
        return None
    return name, size, crc


def _refuse_surrogates(obj: Any, path: str | Path) -> None:
    """Refuse a string holding a lone surrogate: it is no file name, prints nowhere,
    and fails at some later encode; here the error says where it is."""
    stack = [(obj, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, dict):
            stack.extend((v, f"{where}.{k}" if where else k) for k, v in value.items())
            stack.extend((k, f"a key in {where or 'the top level'}") for k in value)
        elif isinstance(value, list):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(value))
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ManifestError(f"{where} holds a lone surrogate (\\ud800-\\udfff escape), "
                                    "which is not text", path=path, found=ascii(value)[:80]) from None




def _kind(value: Any) -> str:
    return f"a list of {len(value)}" if isinstance(value, list) else type(value).__name__


def _get(obj: dict, key: str, kind: type | tuple[type, ...], path: str | Path, where: str = "") -> Any:
    if key not in obj:
        raise ManifestError(f"missing key {where}{key!r}", path=path)
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ManifestError(f"key {where}{key!r} has the wrong type", path=path,
                            found=type(value).__name__, expected=names)
    return value


def _count(obj: dict, key: str, path: str | Path, where: str) -> int:
    value = _get(obj, key, int, path, where)
    if value < 0:
        raise ManifestError(f"key {where}{key!r} is negative", path=path, found=value)
    if value > MAX_COUNT:
        raise ManifestError(f"key {where}{key!r} does not fit 64 bits", path=path,
                            found=f"{value.bit_length()}-bit integer", expected=f"<= {MAX_COUNT}")
    return value


def _crc(obj: dict, key: str, path: str | Path, where: str) -> int:
    value = parse_crc(_get(obj, key, str, path, where))
    if value is None:
        raise ManifestError(f"key {where}{key!r} is not 8 hex digits", path=path, found=obj[key])
    return value


def parse_manifest(obj: Any, path: str | Path, *, root: str | Path | None = None,
                   follow_symlinks: bool = False) -> Manifest:
    """Validate a decoded manifest object (see :func:`read_manifest`), reading a 2.x
    manifest's shard table from ``root`` (default: ``path``'s folder)."""
    if not isinstance(obj, dict):
        raise ManifestError("manifest must be a JSON object", path=path, found=type(obj).__name__)
    if obj.get("format") != FORMAT_NAME:
        raise ManifestError("not a shardpack manifest", path=path, found=obj.get("format"),
                            expected=FORMAT_NAME)
    version = _get(obj, "format_version", str, path)
    match = _VERSION.fullmatch(version)
    if match is None:
        raise ManifestError("format_version must be 'MAJOR.MINOR' (non-negative decimal integers)",
                            path=path, found=version[:40])
    major, minor = int(match[1]), int(match[2])
    if major not in READS:
        raise VersionError(
            f"format version {version} is not supported by this shardpack (reads "
            f"{' and '.join(f'{m}.x' for m in READS)}); upgrade shardpack to read this dataset",
            path=path,
        )
    alignment = _count(obj, "alignment", path, "")
    if alignment < MIN_ALIGNMENT or alignment > MAX_ALIGNMENT or alignment & (alignment - 1):
        raise ManifestError("alignment must be a power of two in [8, 4096]", path=path, found=alignment)

    fields, dictionaries, max_raw = _parse_fields(_get(obj, "fields", list, path), path)
    if not fields:
        # Every record then has an index row of at least 20 bytes on disk, which is
        # what bounds the record counts a manifest can claim (see _parse_shard).
        raise ManifestError("a dataset has at least one field", path=path)
    totals = _get(obj, "totals", dict, path)
    records = _count(totals, "records", path, "totals.")
    if major == 1:
        entries = [_parse_shard(s, i, path, len(fields))
                   for i, s in enumerate(_get(obj, "shards", list, path))]
        names = [s.name for s in entries]
        if len(set(names)) != len(names):
            raise ManifestError("two shards share a name", path=path)
        shards, table_name = ShardTable.from_entries(entries), None
    else:
        ref = _get(obj, "shard_table", dict, path)
        table_name = _get(ref, "name", str, path, "shard_table.")
        size = _count(ref, "bytes", path, "shard_table.")
        if size > MAX_SHARD_TABLE_BYTES:
            raise ManifestError("shard table is larger than this reader accepts", path=path,
                                found=f"{size} bytes", expected=f"at most {MAX_SHARD_TABLE_BYTES}")
        shards = ShardTable.read(Path(path).parent if root is None else root, table_name,
                                 size=size, crc=_crc(ref, "crc32c", path, "shard_table."),
                                 rows=_count(totals, "shards", path, "totals."),
                                 num_fields=len(fields), follow_symlinks=follow_symlinks)
    if records != shards.total_records:
        raise ManifestError("totals.records disagrees with the shards", path=path, found=records,
                            expected=shards.total_records)
    classes = obj.get("classes")
    if classes is not None and (
        not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)
    ):
        raise ManifestError("classes must be a list of strings or null", path=path)
    class_info = obj.get("class_info")
    if class_info is not None and (
        not isinstance(class_info, list) or not all(isinstance(c, dict) for c in class_info)
        or len(class_info) != len(classes or ())
    ):
        raise ManifestError("class_info must be null or a list of objects, one per class",
                            path=path, found=_kind(class_info),
                            expected=f"{len(classes or ())} objects")
    created_by = obj.get("created_by", {})
    if not isinstance(created_by, dict):
        raise ManifestError("created_by must be an object", path=path)
    return Manifest(
        fields=fields,
        shards=shards,
        alignment=alignment,
        classes=None if classes is None else tuple(classes),
        class_info=None if class_info is None else tuple(class_info),
        created_by=created_by,
        dictionaries=dictionaries,
        max_raw_size=max_raw,
        major=major,
        minor=minor,
        shard_table=table_name,
    )


def _parse_fields(entries: list, path: str | Path):
    fields, dictionaries, max_raw = [], {}, {}
    for i, entry in enumerate(entries):
        try:
            f = Field.from_json(entry)
        except SchemaError as exc:
            raise ManifestError(f"fields[{i}]: {exc}", path=path) from None
        except (TypeError, ValueError, OverflowError) as exc:  # numpy refusing a dtype string
            raise ManifestError(f"fields[{i}]: bad field entry ({exc})", path=path) from None
        if f.shape is not None and any(
                isinstance(d, bool) or (d is not None and d > MAX_NDARRAY_DIM) for d in f.shape):
            raise ManifestError(f"fields[{i}]: shape dimensions must be integers below 2**31",
                                path=path, found=f.shape)
        if f.compression != "none":
            max_raw[f.name] = _count(entry, "max_raw_size", path, f"fields[{i}].")
        if "dictionary" in entry:
            if f.compression != "zstd":
                raise ManifestError(f"fields[{i}]: a dictionary needs zstd compression", path=path)
            name = _get(entry, "dictionary", str, path, f"fields[{i}].")
            check_plain_name(os.path.dirname(str(path)), name, what="dictionary file name")
            dictionaries[f.name] = (name, _crc(entry, "dictionary_crc32c", path, f"fields[{i}]."))
        fields.append(f)
    if len({f.name for f in fields}) != len(fields):
        raise ManifestError("two fields share a name", path=path)
    return tuple(fields), dictionaries, max_raw


def _parse_shard(obj: Any, i: int, path: str | Path, num_fields: int) -> ShardEntry:
    where = f"shards[{i}]."
    if not isinstance(obj, dict):
        raise ManifestError(f"shards[{i}] must be an object", path=path)
    name = _get(obj, "name", str, path, where)
    check_plain_name(os.path.dirname(str(path)), name, what="shard name")
    entry = ShardEntry(
        name=name,
        records=_count(obj, "records", path, where),
        data_bytes=_count(obj, "data_bytes", path, where),
        index_bytes=_count(obj, "index_bytes", path, where),
        meta_bytes=_count(obj, "meta_bytes", path, where),
        data_crc32c=_crc(obj, "data_crc32c", path, where),
        index_crc32c=_crc(obj, "index_crc32c", path, where),
        meta_crc32c=_crc(obj, "meta_crc32c", path, where),
    )
    # The index size is a function of the record count: checked here, a claimed
    # count is backed by an index file of that size on disk (checked at open).
    expected = index_sections(entry.records, num_fields)[3]
    if entry.index_bytes != expected:
        raise ManifestError(f"shards[{i}]: index size (index_bytes) does not fit its record count",
                            path=path,
                            found=entry.index_bytes, expected=expected)
    return entry
