"""manifest.json: the one file that says a dataset is complete (FORMAT.md, "Manifest").

Parsing checks every key and type before anything else is opened, and every
file name it yields is a plain name inside the dataset folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checksum import format_crc, parse_crc
from .errors import ManifestError, SchemaError, VersionError
from .fields import Field
from .files import atomic_write_bytes, safe_child
from .layout import FORMAT_NAME, MAJOR, MAX_ALIGNMENT, MIN_ALIGNMENT, MINOR

__all__ = ["MANIFEST_NAME", "Manifest", "ShardEntry", "manifest_bytes", "parse_manifest",
           "read_manifest", "write_manifest"]

MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class ShardEntry:
    """One shard as the manifest lists it."""

    name: str
    records: int
    data_bytes: int
    index_bytes: int
    meta_bytes: int
    data_crc32c: int
    index_crc32c: int
    meta_crc32c: int

    @property
    def data_file(self) -> str:
        return f"{self.name}.rec"

    @property
    def index_file(self) -> str:
        return f"{self.name}.idx"

    @property
    def meta_file(self) -> str:
        return f"{self.name}.meta.parquet"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "records": self.records,
            "data_bytes": self.data_bytes,
            "index_bytes": self.index_bytes,
            "meta_bytes": self.meta_bytes,
            "data_crc32c": format_crc(self.data_crc32c),
            "index_crc32c": format_crc(self.index_crc32c),
            "meta_crc32c": format_crc(self.meta_crc32c),
        }


@dataclass(frozen=True)
class Manifest:
    """The parsed manifest. ``dictionaries`` maps field name to (file name, crc)."""

    fields: tuple[Field, ...]
    shards: tuple[ShardEntry, ...]
    alignment: int
    classes: tuple[str, ...] | None = None
    created_by: dict[str, Any] = field(default_factory=dict)
    dictionaries: dict[str, tuple[str, int]] = field(default_factory=dict)
    max_raw_size: dict[str, int] = field(default_factory=dict)
    minor: int = MINOR

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def data_bytes(self) -> int:
        return sum(s.data_bytes for s in self.shards)

    def to_json(self) -> dict[str, Any]:
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
        return {
            "format": FORMAT_NAME,
            "format_version": f"{MAJOR}.{MINOR}",
            "alignment": self.alignment,
            "fields": fields,
            "shards": [s.to_json() for s in self.shards],
            "totals": {"records": self.records, "data_bytes": self.data_bytes, "shards": len(self.shards)},
            "classes": None if self.classes is None else list(self.classes),
            "created_by": self.created_by,
        }


def manifest_bytes(manifest: Manifest) -> bytes:
    """The manifest file's bytes (sorted keys: deterministic)."""
    text = json.dumps(manifest.to_json(), sort_keys=True, indent=1, ensure_ascii=False) + "\n"
    return text.encode("utf-8")


def write_manifest(root: Path, manifest: Manifest) -> None:
    """Write ``root/manifest.json`` atomically."""
    atomic_write_bytes(root / MANIFEST_NAME, manifest_bytes(manifest))


def read_manifest(root: str | Path) -> Manifest:
    """Read and validate ``root/manifest.json``.

    Raises:
        ManifestError: missing file, bad JSON, missing keys, wrong types, counts
            that disagree, unsafe file names.
        VersionError: a major version this code does not know.
    """
    path = Path(root) / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(
            "no manifest.json: not a shardpack dataset, or one whose writing never finished",
            path=path,
        ) from None
    except OSError as exc:
        raise ManifestError(f"cannot read manifest ({exc.strerror})", path=path) from None
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"manifest is not valid JSON ({exc})", path=path) from None
    return parse_manifest(obj, path)


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
    return value


def _crc(obj: dict, key: str, path: str | Path, where: str) -> int:
    value = parse_crc(_get(obj, key, str, path, where))
    if value is None:
        raise ManifestError(f"key {where}{key!r} is not 8 hex digits", path=path, found=obj[key])
    return value


def parse_manifest(obj: Any, path: str | Path) -> Manifest:
    """Validate a decoded manifest object (see :func:`read_manifest`)."""
    if not isinstance(obj, dict):
        raise ManifestError("manifest must be a JSON object", path=path, found=type(obj).__name__)
    if obj.get("format") != FORMAT_NAME:
        raise ManifestError("not a shardpack manifest", path=path, found=obj.get("format"),
                            expected=FORMAT_NAME)
    version = _get(obj, "format_version", str, path)
    try:
        major, minor = (int(p) for p in version.split("."))
    except ValueError:
        raise ManifestError("format_version must be 'MAJOR.MINOR'", path=path, found=version) from None
    if major != MAJOR:
        raise VersionError(
            f"format version {version} is not supported by this shardpack (reads {MAJOR}.x); "
            "upgrade shardpack to read this dataset",
            path=path,
        )
    alignment = _count(obj, "alignment", path, "")
    if alignment < MIN_ALIGNMENT or alignment > MAX_ALIGNMENT or alignment & (alignment - 1):
        raise ManifestError("alignment must be a power of two in [8, 4096]", path=path, found=alignment)

    fields, dictionaries, max_raw = _parse_fields(_get(obj, "fields", list, path), path)
    shards = tuple(
        _parse_shard(s, i, path) for i, s in enumerate(_get(obj, "shards", list, path))
    )
    names = [s.name for s in shards]
    if len(set(names)) != len(names):
        raise ManifestError("two shards share a name", path=path)

    totals = _get(obj, "totals", dict, path)
    records = _count(totals, "records", path, "totals.")
    if records != sum(s.records for s in shards):
        raise ManifestError("totals.records disagrees with the shards", path=path, found=records,
                            expected=sum(s.records for s in shards))
    classes = obj.get("classes")
    if classes is not None and (
        not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)
    ):
        raise ManifestError("classes must be a list of strings or null", path=path)
    created_by = obj.get("created_by", {})
    if not isinstance(created_by, dict):
        raise ManifestError("created_by must be an object", path=path)
    return Manifest(
        fields=fields,
        shards=shards,
        alignment=alignment,
        classes=None if classes is None else tuple(classes),
        created_by=created_by,
        dictionaries=dictionaries,
        max_raw_size=max_raw,
        minor=minor,
    )


def _parse_fields(entries: list, path: str | Path):
    fields, dictionaries, max_raw = [], {}, {}
    for i, entry in enumerate(entries):
        try:
            f = Field.from_json(entry)
        except SchemaError as exc:
            raise ManifestError(f"fields[{i}]: {exc}", path=path) from None
        if f.compression != "none":
            max_raw[f.name] = _count(entry, "max_raw_size", path, f"fields[{i}].")
        if "dictionary" in entry:
            if f.compression != "zstd":
                raise ManifestError(f"fields[{i}]: a dictionary needs zstd compression", path=path)
            name = _get(entry, "dictionary", str, path, f"fields[{i}].")
            safe_child(os.path.dirname(str(path)), name, what="dictionary file name")
            dictionaries[f.name] = (name, _crc(entry, "dictionary_crc32c", path, f"fields[{i}]."))
        fields.append(f)
    if len({f.name for f in fields}) != len(fields):
        raise ManifestError("two fields share a name", path=path)
    return tuple(fields), dictionaries, max_raw


def _parse_shard(obj: Any, i: int, path: str | Path) -> ShardEntry:
    where = f"shards[{i}]."
    if not isinstance(obj, dict):
        raise ManifestError(f"shards[{i}] must be an object", path=path)
    name = _get(obj, "name", str, path, where)
    safe_child(os.path.dirname(str(path)), name, what="shard name")
    return ShardEntry(
        name=name,
        records=_count(obj, "records", path, where),
        data_bytes=_count(obj, "data_bytes", path, where),
        index_bytes=_count(obj, "index_bytes", path, where),
        meta_bytes=_count(obj, "meta_bytes", path, where),
        data_crc32c=_crc(obj, "data_crc32c", path, where),
        index_crc32c=_crc(obj, "index_crc32c", path, where),
        meta_crc32c=_crc(obj, "meta_crc32c", path, where),
    )
