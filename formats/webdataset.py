"""WebDataset tar shards: a source and a sink.

A sample is the run of consecutive tar members sharing a key: the member path up
to the first dot of its last component (``a/b.seg.png`` -> key ``a/b``, extension
``seg.png``), as ``webdataset`` groups them. Extensions map to fields: ``jpg``/
``jpeg``/``png``/``webp`` -> ``image``; ``cls`` -> ``label`` (int); ``json`` -> json;
``txt`` -> str; anything else -> bytes under the extension's name. The key is the
``key`` field.

Reading never extracts: member names are only parsed, and absolute names, ``..``
components, links and members over ``max_member_bytes`` are refused from the header
alone. Written tars are deterministic: GNU format (no pax timestamps), mtime 0,
uid/gid 0, members of a sample sorted by name, samples in record order.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import numpy as np

from .base import Record
from .bounded import DEFAULT_MAX_MEMBER, DEFAULT_MAX_STREAM, BoundedReader
from .errors import FormatError, SchemaError, UnsafePathError
from .fields import Field
from .outputs import AtomicFile, prepare_output_dir
from .paths import canonical_order, expand_inputs, read_classes_file, write_classes_file
from .sniff import image_type, sniff

__all__ = ["WebDatasetSink", "WebDatasetSource", "split_key"]

SUFFIXES = (".tar", ".tar.gz", ".tgz")
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
LABEL_EXTS = ("cls", "cls2", "class", "label", "index")
_IMAGE_EXT = {"jpeg": "jpg", "png": "png", "webp": "webp", "gif": "gif", "bmp": "bmp"}
_KEY_RE = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")


def split_key(name: str) -> tuple[str, str] | None:
    """(key, extension) of a member name, or None for a name without an extension."""
    m = _KEY_RE.match(name)
    return (m.group(1), m.group(2)) if m else None


def _field_for(ext: str, data: bytes) -> Field:
    e = ext.lower()
    if e in IMAGE_EXTS:
        return Field("image", image_type(data))
    if e in LABEL_EXTS:
        return Field("label", "int")
    if e == "json":
        return Field("json", "json")
    if e == "txt":
        return Field("txt", "str")
    return Field(e, "bytes")


def _check_name(tar_path: Path, info: tarfile.TarInfo) -> None:
    parts = PurePosixPath(info.name).parts
    if info.name.startswith(("/", "\\")) or ".." in parts or "\x00" in info.name or (
            len(info.name) > 1 and info.name[1] == ":"):
        raise UnsafePathError("tar member name is absolute or leaves the archive folder",
                              path=tar_path, offset=info.offset, found=info.name)


class WebDatasetSource:
    """Samples of WebDataset tars (a file, folder, glob or ``{000..009}`` pattern).

    Args:
        path: where the tars are.
        max_member_bytes: refuse members that claim more than this (from the header).
        max_bytes: the most a ``.tar.gz`` may expand to.

    Raises (while iterating) SchemaError naming the tar and key when a sample's
    fields or types differ from the first sample's.
    """

    def __init__(self, path: str | Path, *, max_member_bytes: int = DEFAULT_MAX_MEMBER,
                 max_bytes: int = DEFAULT_MAX_STREAM) -> None:
        self.files = expand_inputs(path, SUFFIXES)
        self.max_member_bytes = max_member_bytes
        self.max_bytes = max_bytes
        self.classes = read_classes_file(self.files[0].parent)
        first = next(self._samples(), None)
        if first is None:
            raise FormatError("no samples in any tar", path=self.files[0])
        tar, key, members = first
        self._ext_field = {}
        fields = [Field("key", "str")]
        for ext, data in members:
            f = _field_for(ext, data)
            if any(g.name == f.name for g in fields):
                f = Field(ext.lower(), f.type)  # e.g. both .jpg and .png: keep the second by ext
            self._ext_field[ext] = f
            fields.append(f)
        if len({f.name for f in fields}) != len(fields):
            raise SchemaError(f"{tar.name} key {key!r}: two members map to one field",
                              found=[e for e, _ in members])
        self.fields = canonical_order(fields)

    def _open_tar(self, path: Path):
        raw = open(path, "rb")  # noqa: SIM115 (closed with the tar)
        stream = raw
        if raw.peek(2)[:2] == b"\x1f\x8b":
            import gzip
            stream = io.BufferedReader(
                BoundedReader(gzip.GzipFile(fileobj=raw, mode="rb"), self.max_bytes, path))
        try:
            return tarfile.open(fileobj=stream, mode="r|"), raw
        except tarfile.TarError as exc:
            raw.close()
            raise FormatError(f"not a tar file ({exc})", path=path) from None

    def _members(self, path: Path) -> Iterator[tuple[str, str, bytes]]:
        tar, raw = self._open_tar(path)
        try:
            while True:
                try:
                    info = tar.next()
                except tarfile.TarError as exc:
                    raise FormatError(f"damaged tar ({exc})", path=path) from None
                if info is None:
                    return
                _check_name(path, info)
                if info.isdir():
                    continue
                if not info.isfile():
                    raise UnsafePathError("tar member is a link or device, not a file",
                                          path=path, offset=info.offset, found=info.name)
                if info.size > self.max_member_bytes:
                    raise FormatError("tar member larger than the limit", path=path,
                                      offset=info.offset, found=f"{info.name}: {info.size} bytes",
                                      expected=f"<= {self.max_member_bytes} bytes")
                parts = split_key(info.name)
                if parts is None or PurePosixPath(info.name).name.startswith("."):
                    continue  # no extension, or a hidden file (e.g. macOS ._ files)
                f = tar.extractfile(info)
                data = f.read() if f is not None else b""
                if len(data) != info.size:
                    raise FormatError("tar member is truncated", path=path, offset=info.offset,
                                      found=len(data), expected=info.size)
                yield parts[0], parts[1], data
        finally:
            tar.close()
            raw.close()

    def _samples(self) -> Iterator[tuple[Path, str, list[tuple[str, bytes]]]]:
        for path in self.files:
            key, members = None, []
            for k, ext, data in self._members(path):
                if k != key and members:
                    yield path, key, members
                    members = []
                key = k
                if any(e == ext for e, _ in members):
                    raise SchemaError(f"key {k!r}: two members with extension {ext!r}", path=path)
                members.append((ext, data))
            if members:
                yield path, key, members

    def __iter__(self) -> Iterator[Record]:
        want = set(self._ext_field)
        for path, key, members in self._samples():
            exts = {e for e, _ in members}
            if exts != want:
                raise SchemaError(
                    f"sample {key!r} has other members than the first sample",
                    path=path, found=sorted(exts), expected=sorted(want))
            values = {"key": key}
            for ext, data in members:
                f = self._ext_field[ext]
                values[f.name] = self._value(f, ext, data, path, key)
            yield Record(values, {}, f"{path.name}:{key}")

    @staticmethod
    def _value(f: Field, ext: str, data: bytes, path: Path, key: str):
        if f.type in ("jpeg", "png"):
            found = image_type(data)
            if found != f.type:
                raise SchemaError(f"sample {key!r}: .{ext} holds {found}, but the field "
                                  f"{f.name!r} is {f.type} (mixed types in one dataset)",
                                  path=path, found=found, expected=f.type)
            return data
        try:
            if f.type == "int":
                return int(data.decode("ascii").strip())
            if f.type == "str":
                return data.decode("utf-8")
            if f.type == "json":
                return json.loads(data)
        except (UnicodeDecodeError, ValueError):
            raise SchemaError(f"sample {key!r}: .{ext} is not a valid {f.type}", path=path,
                              found=bytes(data[:20])) from None
        return data


def _ext_and_bytes(f: Field, value) -> tuple[str, bytes]:
    t = f.type
    if f.name == "image":
        kind = t if t in ("jpeg", "png") else sniff(value)
        return _IMAGE_EXT.get(kind, "img"), bytes(value)
    if f.name == "label" and t == "int":
        return "cls", str(int(value)).encode("ascii")
    ext = f.name.lower()
    if t == "int":
        return ext, str(int(value)).encode("ascii")
    if t == "float":
        return ext, repr(float(value)).encode("ascii")
    if t == "str":
        return ext, value.encode("utf-8")
    if t == "json":
        return ext, json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")
    if t == "ndarray":
        buf = io.BytesIO()
        np.save(buf, np.asarray(value), allow_pickle=False)
        return ext if ext.endswith("npy") else f"{ext}.npy", buf.getvalue()
    return ext, bytes(value)


def _tar_key(key: str, fallback: str) -> str:
    """A member-name prefix: relative, no ``..``, no dot in its last component."""
    parts = [p for p in PurePosixPath(key.replace("\\", "/")).parts if p not in ("", ".", "..", "/")]
    if not parts:
        return fallback
    parts[-1] = parts[-1].split(".", 1)[0] or fallback
    return "/".join(p.replace("\x00", "_") for p in parts)


class WebDatasetSink:
    """Writes deterministic ``shard-NNNNN.tar`` files into a folder.

    Args:
        path: the output folder.
        fields: the schema; ``key`` names the sample, ``image`` becomes ``.jpg``/
            ``.png``, ``label`` ``.cls``, other fields ``.<name>``.
        classes: class names, written to ``classes.json`` beside the tars.
        shard_size: start a new tar after this many bytes.
        records_per_shard: or after this many samples.
        overwrite: replace tars of an earlier run.
    """

    def __init__(self, path: str | Path, fields, classes=None, *, shard_size: int | None = 256 << 20,
                 records_per_shard: int | None = None, overwrite: bool = False) -> None:
        self.root = prepare_output_dir(path, overwrite=overwrite, owned=("shard-", "classes.json"))
        self.fields = tuple(fields)
        self.classes = classes
        write_classes_file(self.root, classes)
        self.shard_size, self.records_per_shard = shard_size, records_per_shard
        self.files: list[Path] = []
        self._file: AtomicFile | None = None
        self._tar: tarfile.TarFile | None = None
        self._count = 0
        self._last_key = None

    def write(self, record: Record) -> None:
        fallback = f"{self._count:08d}"
        key = _tar_key(str(record.fields.get("key", fallback)), fallback)
        if key == self._last_key:  # consecutive equal keys would merge into one sample
            key = f"{key}_{self._count:08d}"
        self._last_key = key
        members = sorted(_ext_and_bytes(f, record.fields[f.name])
                         for f in self.fields if f.name != "key")
        if self._tar is None:
            self._file = AtomicFile(self.root / f"shard-{len(self.files):05d}.tar")
            self._tar = tarfile.TarFile(fileobj=self._file.file, mode="w", format=tarfile.GNU_FORMAT)
        for ext, data in members:
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            self._tar.addfile(info, io.BytesIO(data))
        self._file.records += 1
        self._count += 1
        if (self.records_per_shard and self._file.records >= self.records_per_shard) or (
                self.shard_size and self._tar.offset >= self.shard_size):
            self._seal()

    def _seal(self) -> None:
        self._tar.close()
        self._tar = None
        self._file.commit()
        self.files.append(self._file.path)
        self._file = None

    def __enter__(self) -> WebDatasetSink:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._file is None:
            return
        if exc_type is None:
            self._seal()
        else:
            self._tar = None
            self._file.abort()
