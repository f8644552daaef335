"""WebDataset tar shards: a source and a sink.

A sample is the run of consecutive tar members sharing a key: the member path up
to the first dot of its last component (``a/b.seg.png`` -> key ``a/b``, extension
``seg.png``), as ``webdataset`` groups them. Extensions map to fields: ``jpg``/
``jpeg``/``png``/``webp`` -> ``image``; ``cls`` -> ``label`` (int); ``json`` -> json;
``txt`` -> str; anything else -> bytes under the extension's name. The key is the
``key`` field.

Reading never extracts: member names are only parsed, and absolute names, ``..``
components, links and members over ``max_member_bytes`` are refused from the header
alone. Extended headers (pax, GNU long names) are bounded too (``_MAX_TAR_HEADERS``
bytes before any member), so no header makes the reader buffer gigabytes. A tar
must end with its end-of-archive marker: one that stops before it, or inside a
member, is reported as truncated (an interrupted download, the commonest bad
input there is) with the byte offset and the last whole member.
Written tars are deterministic: GNU format (no pax timestamps), mtime 0,
uid/gid 0, members of a sample sorted by name, samples in record order.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections import deque
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import numpy as np

from .base import Record
from .bounded import (
    DEFAULT_MAX_STREAM,
    DEFAULT_MAX_VALUE,
    BoundedReader,
    open_regular,
    parse_json,
    refuse_special_file,
)
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
#: The most bytes of extended headers (pax records, GNU long names) before one member.
_MAX_TAR_HEADERS = 1 << 20
_TAIL = 4 * tarfile.RECORDSIZE  # what _TarInput keeps: tarfile reads ahead one record
_INT64 = (-(1 << 63), (1 << 63) - 1)


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
    try:
        info.name.encode("utf-8")
    except UnicodeEncodeError:
        # tarfile hands undecodable bytes over as lone surrogates: no key or field
        # name may hold one (no manifest could), so such a name is refused here.
        raise FormatError("tar member name is not UTF-8", path=tar_path, offset=info.offset,
                          found=ascii(info.name)) from None
    parts = PurePosixPath(info.name).parts
    if info.name.startswith(("/", "\\")) or ".." in parts or "\x00" in info.name or (
            len(info.name) > 1 and info.name[1] == ":"):
        raise UnsafePathError("tar member name is absolute or leaves the archive folder",
                              path=tar_path, offset=info.offset, found=info.name)


class _TarInput:
    """The stream tarfile reads: counts what it delivered, keeps the last few blocks
    (to tell an end-of-archive marker from a truncation) and stops at ``limit``
    (so a header claiming gigabytes is refused before tarfile buffers it)."""

    def __init__(self, stream, path: Path) -> None:
        self.stream, self.path = stream, path
        self.count = 0
        self.limit: int | None = _MAX_TAR_HEADERS + 2 * tarfile.RECORDSIZE
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n)
        self.count += len(data)
        if self.limit is not None and self.count > self.limit:
            raise FormatError("tar extended headers (pax records or GNU long names) are larger "
                              "than the limit", path=self.path, offset=self.count,
                              expected=f"<= {_MAX_TAR_HEADERS} bytes before a member")
        if data:
            self._tail.append(data)
            self._tail_bytes += len(data)
            while self._tail_bytes - len(self._tail[0]) >= _TAIL:
                self._tail_bytes -= len(self._tail.popleft())
        return data

    def block_at(self, pos: int) -> bytes | None:
        """The (up to) 512 bytes delivered at ``pos``, or None if no longer kept."""
        start = self.count - self._tail_bytes
        if pos < start:
            return None
        return b"".join(self._tail)[pos - start:pos - start + tarfile.BLOCKSIZE]


def _truncated(path: Path, offset: int, last: str | None, where: str) -> FormatError:
    after = f"after member {last!r}" if last else "before its first member"
    return FormatError(f"tar is truncated ({where}, {after}): an interrupted download? "
                       "fetch it again", path=path, offset=offset)


def _check_end(path: Path, src: _TarInput, pos: int, last: str | None) -> None:
    """tarfile reads a missing, short or invalid header after the first as the end
    of the archive; only an end-of-archive marker (a zero block) is one."""
    block = src.block_at(pos)
    if block is None:
        return  # not kept: tarfile read far past it, so it was a header that parsed
    if not block:
        raise _truncated(path, pos, last, "it ends without its end-of-archive marker")
    if len(block) < tarfile.BLOCKSIZE:
        raise _truncated(path, pos, last, "it ends inside a member header")
    if block.count(0) != tarfile.BLOCKSIZE:
        after = f" after member {last!r}" if last else ""
        raise FormatError(f"damaged tar: not a valid member header{after}", path=path,
                          offset=pos)


class WebDatasetSource:
    """Samples of WebDataset tars (a file, folder, glob or ``{000..009}`` pattern).

    Args:
        path: where the tars are.
        max_member_bytes: refuse members that claim more than this (from the header).
        max_bytes: the most a ``.tar.gz`` may expand to.

    Raises (while iterating) SchemaError naming the tar and key when a sample's
    fields or types differ from the first sample's.
    """

    def __init__(self, path: str | Path, *, max_member_bytes: int = DEFAULT_MAX_VALUE,
                 max_bytes: int = DEFAULT_MAX_STREAM) -> None:
        refuse_special_file(path)
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

    def _open_tar(self, path: Path) -> tuple[tarfile.TarFile, _TarInput, object]:
        try:
            raw = open_regular(path)
        except OSError as exc:
            raise FormatError(f"cannot read tar ({exc.strerror})", path=path) from None
        try:
            stream = raw
            if raw.peek(2)[:2] == b"\x1f\x8b":
                import gzip
                stream = io.BufferedReader(
                    BoundedReader(gzip.GzipFile(fileobj=raw, mode="rb"), self.max_bytes, path))
            src = _TarInput(stream, path)
            try:
                return tarfile.open(fileobj=src, mode="r|"), src, raw
            except tarfile.TarError as exc:
                raise FormatError(f"not a tar file ({exc})", path=path) from None
        except BaseException:
            raw.close()
            raise

    def _members(self, path: Path) -> Iterator[tuple[str, str, bytes]]:
        tar, src, raw = self._open_tar(path)
        last = None  # the last whole member, for messages about truncation
        try:
            while True:
                src.limit = tar.offset + _MAX_TAR_HEADERS + 2 * tarfile.RECORDSIZE
                try:
                    info = tar.next()
                except tarfile.TarError as exc:
                    if "unexpected end of data" in str(exc):
                        raise _truncated(path, src.count, last, "it ends inside a member") from None
                    raise FormatError(f"damaged tar ({exc})", path=path, offset=tar.offset) from None
                src.limit = None
                # tarfile keeps every member it read; a stream of millions would fill memory.
                tar.members.clear()
                if info is None:
                    _check_end(path, src, tar.offset, last)
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
                try:
                    data = f.read() if f is not None else b""
                except tarfile.TarError:
                    raise _truncated(path, src.count, last,
                                     f"it ends inside member {info.name!r}") from None
                if len(data) != info.size:
                    raise _truncated(path, info.offset_data + len(data), last,
                                     f"it ends inside member {info.name!r}")
                last = info.name
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
        if f.type == "json":
            return parse_json(data, path=path, what=f"sample {key!r}: .{ext}")
        try:
            if f.type == "int":
                value = int(data.decode("ascii").strip())
                if not _INT64[0] <= value <= _INT64[1]:
                    raise ValueError("beyond int64")
                return value
            if f.type == "str":
                return data.decode("utf-8")
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
