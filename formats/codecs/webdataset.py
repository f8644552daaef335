"""WebDataset tar shards: a source and a sink.

A sample is the run of consecutive tar members sharing a key: the member path up
to the first dot of its last component (``a/b.seg.png`` -> key ``a/b``, extension
``seg.png``), as ``webdataset`` groups them.

Tars from elsewhere: extensions map to fields. A sample's one image member, whatever
its extension (:data:`formats.media.WEBDATASET_IMAGE_EXTENSIONS`: ``jpg``, ``png``,
``webp``, ``tif``...), is the ``image`` field, so JPEGs and PNGs may mix; when the
first sample holds several image members, each extension is a field of its own. ``cls`` -> ``label`` (int);
``json`` -> json; ``txt`` -> str; anything else -> bytes under the extension's name.
The WebDataset key is the ``key`` field.

Tars we wrote (``schema.json`` beside them, see :mod:`formats.codecs.paths`): the exact
record key is the member ``<key>.key.txt`` (the WebDataset key must lose the
extension and dots of the record key's last component: ``bird/img_02.jpg`` is
the sample ``bird/img_02``, and ``key.txt`` says ``bird/img_02.jpg``); ``image``
is ``.jpg``, ``.png``... as each payload's bytes are (never PNG bytes under
``.jpg``); ``label`` is ``.cls``; every other field is ``.<name>``: ints and floats
as decimal text (``repr``, so a float reads back bit for bit), str as UTF-8, json
as JSON text, ndarrays as ``.npy`` (``<name>.npy``). The source reads each back as
the type ``schema.json`` records.

Reading never extracts: member names are only parsed, and absolute names, ``..``
components, links and members over ``max_member_bytes`` are refused from the header
alone. Extended headers (pax, GNU long names) are bounded too (``_MAX_TAR_HEADERS``
bytes before any member), so no header makes the reader buffer gigabytes. A tar
must end with its end-of-archive marker: one that stops before it, or inside a
member, is reported as truncated (an interrupted download, the commonest bad
input there is) with the byte offset and the last whole member. An ``.npy``
member's header is checked against its size before any array is made.
Written tars are deterministic: GNU format (no pax timestamps), mtime 0,
uid/gid 0, members of a sample sorted by name, samples in record order.
Written member names are made from the record key by the one rule for names that
become paths (:mod:`formats.names`: each part mapped, ``..`` and empty parts
dropped, within 255 bytes), field names must be safe as they are, and two samples of
one tar never share a name (the later one gets a numbered variant, as equal
consecutive keys always did): extracting a tar writes nothing outside its folder and
nothing twice. The exact key is in ``.key.txt``.

Speed: the headers writers emit (ustar or GNU, regular files and folders, octal
numbers, no prefix, an unsigned checksum) are parsed by :func:`_plain_header`
from the block itself; at the first header that is anything else, a truncation
included, the file is read again by ``tarfile`` from its start, the members
already given skipped, so every error and every odd archive is ``tarfile``'s to
decide, as before. The sink writes each member's header (``TarInfo.tobuf``), its
bytes and the end of the archive itself, without ``TarFile.addfile``'s copies.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..base import Record
from ..bounded import (
    DEFAULT_MAX_STREAM,
    DEFAULT_MAX_VALUE,
    BoundedReader,
    open_regular,
    parse_json,
    refuse_special_file,
)
from ..errors import FormatError, SchemaError, UnsafePathError
from ..fields import Field, ImageKinds, json_payload
from ..media import IMAGE_EXTENSION, WEBDATASET_IMAGE_EXTENSIONS
from ..names import MAPPED_BYTES, MAX_PART_BYTES, NameClaims, safe_name, safe_path, unsafe_reason
from ..npy import read_npy_header
from ..sniff import GZIP_MAGIC, sniff
from .outputs import AtomicFile, prepare_output_dir
from .paths import (
    CLASSES_FILE,
    SCHEMA_FILE,
    canonical_order,
    expand_inputs,
    read_classes_file,
    read_schema_file,
    write_classes_file,
    write_schema_file,
)

__all__ = ["KEY_MEMBER", "WebDatasetSink", "WebDatasetSource", "split_key"]

SUFFIXES = (".tar", ".tar.gz", ".tgz")
LABEL_EXTS = ("cls", "cls2", "class", "label", "index")
#: The member holding a record's exact key in tars we write.
KEY_MEMBER = "key.txt"
_ANY_IMAGE = "*"  # schema.json: this field is the sample's image member, any extension
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
    """The field a member of a tar from elsewhere becomes (see the module docstring)."""
    e = ext.lower()
    if e in WEBDATASET_IMAGE_EXTENSIONS:
        # Provisional when the first is a JPEG (writers type a field by what it holds).
        return Field("image", "jpeg" if sniff(data) == "jpeg" else "image")
    if e in LABEL_EXTS:
        return Field("label", "int")
    if e == "json":
        return Field("json", "json")
    if e == "txt":
        return Field("txt", "str")
    return Field(ext, "bytes")


def _read_npy(f: Field, data: bytes, path: Path, key: str) -> np.ndarray:
    """The array of an ``.npy`` member, its header checked against its size (no
    header makes numpy allocate what the member does not hold) and ``f``."""
    try:
        dtype, shape, fortran, offset = read_npy_header(data)
    except ValueError as exc:
        raise SchemaError(f"sample {key!r}: field {f.name!r}: {exc}", path=path) from None
    want = np.dtype(f.dtype)
    if dtype != want:
        raise SchemaError(f"sample {key!r}: field {f.name!r} holds another dtype", path=path,
                          found=str(dtype), expected=want.str)
    if len(shape) != len(f.shape) or any(
            d is not None and d != n for d, n in zip(f.shape, shape, strict=True)):
        raise SchemaError(f"sample {key!r}: field {f.name!r} holds another shape", path=path,
                          found=list(shape), expected=list(f.shape))
    count = int(np.prod(shape, dtype=np.int64))
    if len(data) - offset != count * dtype.itemsize:
        raise SchemaError(f"sample {key!r}: field {f.name!r}: .npy size does not match its "
                          "header", path=path, found=len(data) - offset,
                          expected=count * dtype.itemsize)
    arr = np.frombuffer(data, dtype, count, offset).reshape(shape, order="F" if fortran
                                                             else "C")
    return np.ascontiguousarray(arr)


def _check_name(tar_path: Path, info: tarfile.TarInfo) -> None:
    try:
        info.name.encode("utf-8")
    except UnicodeEncodeError:
        # tarfile hands undecodable bytes over as lone surrogates: no key or field
        # name may hold one (no manifest could), so such a name is refused here.
        raise FormatError("tar member name is not UTF-8", path=tar_path, offset=info.offset,
                          found=ascii(info.name)) from None
    # str.split, not PurePosixPath: this runs for every member (a measured 13 % of a read).
    parts = info.name.split("/")
    if info.name.startswith(("/", "\\")) or ".." in parts or "\x00" in info.name or (
            len(info.name) > 1 and info.name[1] == ":"):
        raise UnsafePathError("tar member name is absolute or leaves the archive folder",
                              path=tar_path, offset=info.offset, found=info.name)


_BLOCK = tarfile.BLOCKSIZE
_ZERO_BLOCK = bytes(_BLOCK)
#: A number field as tarfile's ``nti`` reads every plain one: octal digits between
#: spaces, up to the first NUL.
_OCTAL = re.compile(rb" *[0-7]* *")
#: The number fields (mode, uid, gid, size, mtime, devmajor, devminor).
_NUMBERS = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (329, 337), (337, 345))
#: Mode, uid, gid, size, mtime and checksum as writers spell them (zero-padded
#: octal), from byte 100: the size and the checksum are its groups.
_WRITTEN = re.compile(rb"[0-7]{7}\x00[0-7]{7}\x00[0-7]{7}\x00([0-7]{11})\x00[0-7]{11}\x00"
                      rb"([0-7]{6})\x00 ")
_NO_DEVICE = (bytes(16), b"0000000\x00" * 2)


class _Unusual(Exception):
    """A header (or the end of a file) the fast reader leaves to tarfile."""


def _number(block: bytes, start: int, end: int) -> int:
    field = block[start:end]
    cut = field.find(0)
    digits = field if cut < 0 else field[:cut]
    if not _OCTAL.fullmatch(digits):
        raise _Unusual  # base-256, or what tarfile may refuse: its call
    return int(digits.strip() or b"0", 8)


def _plain_header(block: bytes) -> tuple[str, int, bool]:
    """(name, size, is a folder) of a plain member header (module docstring), as
    ``tarfile.TarInfo.frombuf`` reads it; anything else raises _Unusual."""
    kind = block[156]
    if kind not in (0x30, 0x00, 0x35) or block[345]:  # file, folder; a ustar prefix
        raise _Unusual
    m = _WRITTEN.match(block, 100)
    if m is not None and block[329:345] in _NO_DEVICE:  # as tarfile and GNU tar write
        size, chksum = int(m[1], 8), int(m[2], 8)
    else:  # tarfile reads every number field: any it refuses is unusual here
        chksum = _number(block, 148, 156)
        size = [_number(block, a, b) for a, b in _NUMBERS][3]
    if chksum != 256 + sum(block) - sum(block[148:156]):
        raise _Unusual  # a bad (or signed) checksum
    raw = block[:100]
    cut = raw.find(0)
    try:
        name = (raw if cut < 0 else raw[:cut]).decode("utf-8")
    except UnicodeDecodeError:
        raise _Unusual from None
    folder = kind == 0x35 or (kind == 0x00 and name.endswith("/"))
    return (name.rstrip("/") if folder else name), size, folder


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

    The fields are those ``schema.json`` beside the tars records, when our sink
    wrote them; otherwise the first sample's (see the module docstring).

    Raises (while iterating) SchemaError naming the tar and key when a sample's
    fields differ from the schema's, or a member is not a valid value of its type.
    """

    def __init__(self, path: str | Path, *, max_member_bytes: int = DEFAULT_MAX_VALUE,
                 max_bytes: int = DEFAULT_MAX_STREAM) -> None:
        refuse_special_file(path)
        self.files = expand_inputs(path, SUFFIXES)
        self.max_member_bytes = max_member_bytes
        self.max_bytes = max_bytes
        self.classes = read_classes_file(self.files[0].parent)
        ours = read_schema_file(self.files[0].parent, "webdataset")
        #: ext -> field name; the field any image extension maps to; the key's field
        self._by_ext: dict[str, str] = {}
        self._image: str | None = None
        self._key: str | None = "key"
        if ours is not None:
            fields, names = ours
            self._key = next((n for n, e in names.items() if e == KEY_MEMBER), None)
            self._image = next((n for n, e in names.items() if e == _ANY_IMAGE), None)
            self._by_ext = {e: n for n, e in names.items() if e not in (KEY_MEMBER, _ANY_IMAGE)}
            if set(names) != {f.name for f in fields}:
                raise FormatError("schema file: not every field has a member name",
                                  path=self.files[0].parent / SCHEMA_FILE)
            self.fields = fields
            self._ours = True
            return
        self._ours = False
        first = next(self._samples(), None)
        if first is None:
            raise FormatError("no samples in any tar", path=self.files[0])
        tar, key, members = first
        images = [e for e, _ in members if e.lower() in WEBDATASET_IMAGE_EXTENSIONS]
        if len(images) == 1:
            self._image = "image"
        fields = [Field("key", "str")]
        for ext, data in members:
            f = _field_for(ext, data)
            if any(g.name == f.name for g in fields):
                f = Field(ext, f.type)  # e.g. both .jpg and .png: keep the second by ext
            if f.name != self._image:
                self._by_ext[ext] = f.name
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
            if raw.peek(2)[:2] == GZIP_MAGIC:
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
        """(key, extension, bytes) of every file member with an extension, in order
        (the fast reader, then tarfile from the first unusual header on)."""
        given = 0
        try:
            for member in self._plain_members(path):
                yield member
                given += 1
            return
        except _Unusual:
            pass
        yield from self._tar_members(path, skip=given)

    def _plain_members(self, path: Path) -> Iterator[tuple[str, str, bytes]]:
        """:meth:`_members` while every header is plain; _Unusual at the first that
        is not, or at anything tarfile would have to judge (module docstring)."""
        try:
            raw = open_regular(path)
        except (OSError, FormatError):
            raise _Unusual from None
        with raw:
            if raw.peek(2)[:2] == GZIP_MAGIC:
                raise _Unusual  # gzip: tarfile's stream
            read = raw.read
            while True:
                block = read(_BLOCK)
                if len(block) != _BLOCK:
                    raise _Unusual  # no end-of-archive marker: tarfile says where
                if block == _ZERO_BLOCK:
                    return
                name, size, folder = _plain_header(block)
                if name.startswith(("/", "\\")) or ".." in name.split("/") or (
                        len(name) > 1 and name[1] == ":"):
                    raise _Unusual  # refused by _check_name, with its words
                if folder:
                    continue  # tarfile skips no data after a folder
                if size > self.max_member_bytes:
                    raise _Unusual
                pad = -size % _BLOCK
                parts = split_key(name)
                if parts is None or name.rpartition("/")[2].startswith("."):
                    raw.seek(size + pad, 1)
                    continue
                data = read(size)
                if len(data) != size or (pad and len(read(pad)) != pad):
                    raise _Unusual
                yield parts[0], parts[1], data

    def _tar_members(self, path: Path, skip: int = 0) -> Iterator[tuple[str, str, bytes]]:
        """:meth:`_members` read by tarfile, the first ``skip`` of them not given."""
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
                if parts is None or info.name.rpartition("/")[2].startswith("."):
                    continue  # no extension, or a hidden file (e.g. macOS ._ files)
                if skip:  # given by the fast reader already
                    skip -= 1
                    last = info.name
                    continue
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

    def _field_of(self, ext: str) -> str | None:
        name = self._by_ext.get(ext)
        if name is None and self._image is not None \
                and ext.lower() in WEBDATASET_IMAGE_EXTENSIONS:
            return self._image
        if name is None and self._ours and ext == KEY_MEMBER:
            return self._key
        return name

    def __iter__(self) -> Iterator[Record]:
        by_name = {f.name: f for f in self.fields}
        want = set(by_name)
        for path, key, members in self._samples():
            values = {} if self._ours else {"key": key}
            for ext, data in members:
                name = self._field_of(ext)
                if name is None or name in values:
                    raise SchemaError(
                        f"sample {key!r} has other members than the first sample"
                        + (" (schema.json)" if self._ours else "")
                        + f": .{ext} is {'another member for ' + repr(name) if name else 'no field'}",
                        path=path, found=sorted(e for e, _ in members), expected=sorted(want))
                values[name] = self._value(by_name[name], ext, data, path, key)
            if set(values) != want:
                raise SchemaError(
                    f"sample {key!r} has other members than the first sample"
                    + (" (schema.json)" if self._ours else "") + ": no member for "
                    + ", ".join(sorted(want - set(values))), path=path,
                    found=sorted(e for e, _ in members), expected=sorted(want))
            yield Record(values, {}, f"{path.name}:{key}")

    def _value(self, f: Field, ext: str, data: bytes, path: Path, key: str):
        if f.type == "json":
            value = parse_json(data, path=path, what=f"sample {key!r}: .{ext}")
            try:
                json_payload(value)  # what a writer stores must exist
            except (TypeError, ValueError, RecursionError) as exc:
                raise SchemaError(f"sample {key!r}: .{ext} holds what JSON text cannot ({exc}: "
                                  "NaN, Infinity, a number beyond a float, or a lone "
                                  "surrogate)", path=path) from None
            return value
        if f.type == "ndarray":
            return _read_npy(f, data, path, key)
        try:
            if f.type == "int":
                value = int(data.decode("ascii").strip())
                if not _INT64[0] <= value <= _INT64[1]:
                    raise ValueError("beyond int64")
                return value
            if f.type == "float":
                return float(data.decode("ascii").strip())
            if f.type == "str":
                return data.decode("utf-8")
        except (UnicodeDecodeError, ValueError):
            raise SchemaError(f"sample {key!r}: .{ext} is not a valid {f.type}", path=path,
                              found=bytes(data[:20])) from None
        return data


def _member_names(fields) -> dict[str, str]:
    """Field -> member extension for the sink (``*``: the image's own, per payload).

    Raises:
        SchemaError: a field the tar cannot hold apart from the others (two fields
            on one extension, a ``key`` that is not text), or whose name cannot be
            part of a member name (:func:`formats.names.unsafe_reason`: a ``/``,
            ``..``, a control character...).
    """
    names: dict[str, str] = {}
    for f in fields:
        if f.name == "key":
            if f.type != "str":
                raise SchemaError("webdataset sink: field 'key' names the sample and must be "
                                  "str", found=f.type, expected="str")
            names[f.name] = KEY_MEMBER
        elif f.name == "image" and f.type in ("jpeg", "png", "image"):
            names[f.name] = _ANY_IMAGE
        elif f.name == "label" and f.type == "int":
            names[f.name] = "cls"
        elif f.type == "ndarray" and not f.name.endswith("npy"):
            names[f.name] = f"{f.name}.npy"
        else:
            names[f.name] = f.name
    taken = [e for e in names.values() if e != _ANY_IMAGE]
    if _ANY_IMAGE in names.values():
        taken += sorted(WEBDATASET_IMAGE_EXTENSIONS)
    for name, ext in names.items():
        unsafe = unsafe_reason(ext)
        if unsafe:
            raise SchemaError(f"webdataset sink cannot hold field {name!r}: its member "
                              f"extension {ext!r} cannot be part of a file name ({unsafe})",
                              found=ext)
        if taken.count(ext) > 1 or (ext == KEY_MEMBER and name != "key"):
            raise SchemaError(f"webdataset sink cannot hold field {name!r}: its member "
                              f"extension {ext!r} is another field's (or an image extension)",
                              found=ext)
    return names


def _member(f: Field, value) -> bytes:
    t = f.type
    if t == "int":
        return str(int(value)).encode("ascii")
    if t == "float":
        return repr(float(value)).encode("ascii")
    if t == "str":
        return value.encode("utf-8")
    if t == "json":
        return json.dumps(value, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode("utf-8")
    if t == "ndarray":
        buf = io.BytesIO()
        np.save(buf, np.asarray(value), allow_pickle=False)
        return buf.getvalue()
    return bytes(value)


# The fixed fields of a member header as tarfile writes them in GNU format for
# mode 0o644, uid/gid 0, mtime 0, no user or group names (TarInfo.tobuf).
_HEAD_IDS = b"0000644\x00" + b"0000000\x00" * 2
_HEAD_MTIME = b"00000000000\x00" + b" " * 8  # then the checksum, spaces while summed
_HEAD_REST = b"0" + bytes(100) + tarfile.GNU_MAGIC + bytes(64 + 16 + 167)  # no device numbers


def _member_header(name: str, size: int) -> bytes:
    """The bytes ``TarInfo.tobuf(GNU_FORMAT)`` gives for a member of the sink (module
    docstring), built directly when the name fits the header (100 bytes) and the
    size 11 octal digits; through ``tobuf`` otherwise (a GNU long name)."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > 100 or size >= 8 ** 11:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = size, 0, 0o644
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
    head = b"".join((raw, bytes(100 - len(raw)), _HEAD_IDS, b"%011o\x00" % size, _HEAD_MTIME,
                     _HEAD_REST))
    return b"%s%06o\x00 %s" % (head[:148], sum(head), head[156:])


_VARIANT_BYTES = 16


def _key_budget(names: dict[str, str]) -> int:
    """The most bytes of a sample key's last part that leave room, in every member
    name ``<last part>.<extension>``, within :data:`formats.names.MAX_PART_BYTES`.

    Raises:
        SchemaError: an extension so long that a key would keep too little of itself.
    """
    exts = [e for e in names.values() if e != _ANY_IMAGE]
    if _ANY_IMAGE in names.values():
        exts += [*IMAGE_EXTENSION.values(), "img"]
    longest = max((len(e.encode("utf-8")) for e in exts), default=0)
    # The dot, and room for a numbered variant (NameClaims.unique: "_00001234_2").
    budget = min(MAPPED_BYTES, MAX_PART_BYTES - 1 - _VARIANT_BYTES - longest)
    if budget < 16:
        raise SchemaError("webdataset sink: a field name is too long to be a tar member's "
                          "extension", found=longest,
                          expected=f"<= {MAX_PART_BYTES - 17 - _VARIANT_BYTES} bytes")
    return budget


def _tar_key(key: str, fallback: str, budget: int) -> str:
    """A member-name prefix made from ``key`` by the one rule (:func:`formats.names.safe_path`):
    relative, no ``..``, nothing unsafe; no dot in its last part (a dot starts the
    extension), which keeps at most ``budget`` bytes."""
    path = safe_path(key, "")
    head, _, last = path.rpartition("/")
    last = safe_name(last.split(".", 1)[0], fallback, limit=budget)  # one part, mapped already
    return f"{head}/{last}" if head else last


class WebDatasetSink:
    """Writes deterministic ``shard-NNNNN.tar`` files into a folder.

    Args:
        path: the output folder.
        fields: the schema; ``key`` names the sample (and is kept exactly in
            ``.key.txt``), ``image`` becomes ``.jpg``/``.png``/... as its bytes are,
            ``label`` ``.cls``, other fields ``.<name>`` (see the module docstring).
        classes: class names, written to ``classes.json`` beside the tars.
        shard_size: start a new tar after this many bytes.
        records_per_shard: or after this many samples.
        overwrite: replace tars of an earlier run.

    ``schema.json`` (the field types, see :mod:`formats.codecs.paths`) is written beside
    the tars when the sink closes without an error.

    Raises:
        SchemaError: at open, a field the tars cannot hold (see :func:`_member_names`).
    """

    def __init__(self, path: str | Path, fields, classes=None, *, shard_size: int | None = 256 << 20,
                 records_per_shard: int | None = None, overwrite: bool = False) -> None:
        self.fields = tuple(fields)
        self._names = _member_names(self.fields)
        self.root = prepare_output_dir(path, overwrite=overwrite,
                                       owned=("shard-", CLASSES_FILE, SCHEMA_FILE))
        self.classes = classes
        write_classes_file(self.root, classes)
        self.shard_size, self.records_per_shard = shard_size, records_per_shard
        self.files: list[Path] = []
        self._file: AtomicFile | None = None
        self._offset = 0  # bytes of the open tar so far (headers and padded members)
        self._count = 0
        self._claims = NameClaims()  # the sample keys of the open tar
        self._key_budget = _key_budget(self._names)
        self._kinds = ImageKinds(self.fields)

    def write(self, record: Record) -> None:
        fallback = f"{self._count:08d}"
        values = record.fields
        key = _tar_key(values["key"], fallback, self._key_budget) \
            if "key" in self._names else fallback
        # Two samples of one key would merge (consecutive) or overwrite each other's
        # files when the tar is extracted: the second gets a numbered variant.
        key = self._claims.unique(key, "", self._count)
        members = []
        for f in self.fields:
            ext, value = self._names[f.name], values[f.name]
            if f.type in ("jpeg", "png", "image"):
                kind = self._kinds.note(f.name, value)
                if ext == _ANY_IMAGE:
                    ext = IMAGE_EXTENSION.get(kind, "img")
            members.append((ext, _member(f, value)))
        members.sort()
        if self._file is None:
            self._file = AtomicFile(self.root / f"shard-{len(self.files):05d}.tar")
            self._offset = 0
        write = self._file.write
        for ext, data in members:
            head = _member_header(f"{key}.{ext}", len(data))
            pad = -len(data) % _BLOCK
            write(head)
            write(data)
            if pad:
                write(_ZERO_BLOCK[:pad])
            self._offset += len(head) + len(data) + pad
        self._file.records += 1
        self._count += 1
        if (self.records_per_shard and self._file.records >= self.records_per_shard) or (
                self.shard_size and self._offset >= self.shard_size):
            self._seal()

    def _seal(self) -> None:
        # The end of the archive as TarFile.close writes it: two zero blocks, then
        # zeros to a whole record.
        end = 2 * _BLOCK + -(self._offset + 2 * _BLOCK) % tarfile.RECORDSIZE
        self._file.write(bytes(end))
        self._file.commit()
        self.files.append(self._file.path)
        self._file = None
        self._claims = NameClaims()

    def __enter__(self) -> WebDatasetSink:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            if self._file is not None:
                self._file.abort()
            return
        if self._file is not None:
            self._seal()
        write_schema_file(self.root, "webdataset", self._kinds.typed(self.fields), self._names)
