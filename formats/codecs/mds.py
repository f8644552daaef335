"""MosaicML Streaming (MDS) datasets as a source (read only).

Layout (streaming ``format/mds``): ``index.json`` = ``{"version": 2, "shards": [...]}``,
each shard entry holding ``column_names``/``column_encodings``/``column_sizes``,
``samples``, ``compression`` and ``raw_data``/``zip_data`` (``basename``, ``bytes``).
A shard file is::

    uint32 n | uint32 offsets[n + 1] | config JSON | samples

each sample being uint32 sizes of its variable-size columns, then the columns'
bytes in order. Offsets are absolute in the file. Compressed shards
(``zstd``/``gz``) are decompressed with the raw size from the index as the bound.
Only encodings with a plain byte meaning are read; ``pkl`` never is.

Everything read is checked before it is trusted: ``index.json`` (at most
``_MAX_INDEX`` bytes) must have the types and shapes above, every entry, or a
:class:`FormatError` names the entry and key; an uncompressed shard is read one
sample at a time (memory is one sample, at most ``max_sample_bytes``); a
compressed one is decompressed whole (at most ``max_shard_bytes``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..base import Record
from ..bounded import (
    DEFAULT_MAX_MEMBER,
    DEFAULT_MAX_VALUE,
    gunzip_bounded,
    open_regular,
    parse_json,
    read_small_file,
    unzstd_bounded,
)
from ..errors import FormatError, SchemaError
from ..fields import Field
from ..files import safe_child

__all__ = ["INDEX_NAME", "MDS_TYPES", "MDSSource"]

#: The file that makes a folder an MDS dataset.
INDEX_NAME = "index.json"

_SCALARS = {f"{k}{n}": np.dtype(f"<{k[0]}{n // 8}") for k in ("int", "uint") for n in (8, 16, 32, 64)}
_SCALARS.update({"float16": np.dtype("<f2"), "float32": np.dtype("<f4"), "float64": np.dtype("<f8"),
                 "int": np.dtype("<i8")})
#: MDS encoding -> our field type.
MDS_TYPES = {"bytes": "bytes", "str": "str", "jpeg": "jpeg", "png": "png", "json": "json",
             "str_int": "int", "str_float": "float",
             **{k: ("float" if v.kind == "f" else "int") for k, v in _SCALARS.items()}}
_UNSAFE = {"pkl"}
_IMAGE_NAMES = ("image", "img", "jpg", "jpeg", "png", "x")
_LABEL_NAMES = ("label", "class", "cls", "target", "y")


_MAX_INDEX = 64 << 20  # index.json of 100k shards is about 50 MB
_MAX_SAMPLES = (1 << 32) - 2  # the shard header's sample count is a uint32
_OFFSETS_CHUNK = 1 << 16  # offsets read per step: memory stays small for any count


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class _Shard:
    """One ``index.json`` shard entry, checked."""

    columns: list[str]
    encodings: list[str]
    sizes: list[int | None]
    samples: int
    compression: str | None
    raw: tuple[str, int]  # (basename, bytes)
    zipped: tuple[str, int] | None


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_size(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _check_shard(path: Path, i: int, s: object) -> _Shard:
    def bad(key: str, expected: str) -> FormatError:
        found = s.get(key) if isinstance(s, dict) else s
        return FormatError(f"index.json shards[{i}].{key} is malformed", path=path,
                           found=_short(found), expected=expected)

    if not isinstance(s, dict) or s.get("format") != "mds":
        raise bad("format", "'mds' (an object per shard)")
    columns, encodings, sizes = s.get("column_names"), s.get("column_encodings"), s.get(
        "column_sizes")
    if not isinstance(columns, list) or not columns or not all(
            isinstance(c, str) and c and _is_text(c) for c in columns):
        # A lone surrogate (a JSON escape) would make a field name no manifest can hold.
        raise bad("column_names", "a non-empty list of names (text, no lone surrogates)")
    if len(set(columns)) != len(columns):
        raise bad("column_names", "distinct names")
    if not isinstance(encodings, list) or len(encodings) != len(columns) or not all(
            isinstance(e, str) for e in encodings):
        raise bad("column_encodings", f"a list of {len(columns)} encoding names")
    if not isinstance(sizes, list) or len(sizes) != len(columns) or not all(
            z is None or _is_size(z) for z in sizes):
        raise bad("column_sizes", f"a list of {len(columns)} sizes (a byte count or null)")
    samples = s.get("samples")
    if not _is_size(samples) or samples > _MAX_SAMPLES:
        raise bad("samples", f"a sample count from 0 to {_MAX_SAMPLES}")
    compression = s.get("compression")
    if compression is not None and not isinstance(compression, str):
        raise bad("compression", "null or a name such as 'zstd'")
    files = []
    for key in ("raw_data", "zip_data"):
        info = s.get(key)
        if info is None and key == "zip_data":
            files.append(None)
            continue
        if not isinstance(info, dict) or not isinstance(info.get("basename"), str) or not _is_size(
                info.get("bytes")):
            raise bad(key, "an object with a 'basename' and a byte count 'bytes'")
        files.append((info["basename"], info["bytes"]))
    if compression and files[1] is None:
        raise bad("zip_data", f"the compressed file's entry ({compression!r} is set)")
    return _Shard(columns, encodings, sizes, samples, compression or None, files[0],
                  files[1] if compression else None)


def _load_index(root: Path) -> list[_Shard]:
    path = root / INDEX_NAME
    try:
        data = read_small_file(path, _MAX_INDEX, INDEX_NAME)
    except FileNotFoundError:
        raise FormatError("no index.json: not an MDS dataset", path=path) from None
    except OSError as exc:
        raise FormatError(f"unreadable index.json ({exc.strerror})", path=path) from None
    obj = parse_json(data, path=path, what=INDEX_NAME, error=FormatError, max_bytes=_MAX_INDEX)
    if not isinstance(obj, dict) or obj.get("version") != 2 or not isinstance(obj.get("shards"), list):
        raise FormatError("index.json is not an MDS version 2 index", path=path,
                          found=_short(obj.get("version")) if isinstance(obj, dict)
                          else type(obj).__name__)
    return [_check_shard(path, i, s) for i, s in enumerate(obj["shards"])]


class _InMemory:
    """A decompressed shard."""

    def __init__(self, data: bytes) -> None:
        self.view = memoryview(data)

    def __len__(self) -> int:
        return len(self.view)

    def read(self, offset: int, n: int) -> memoryview:
        return self.view[offset:offset + n]

    def close(self) -> None:
        self.view.release()


class _OnDisk:
    """An uncompressed shard, read where needed (memory: what one read returns)."""

    def __init__(self, f, size: int, path: Path) -> None:
        self.f, self.size, self.path = f, size, path

    def __len__(self) -> int:
        return self.size

    def read(self, offset: int, n: int) -> memoryview:
        try:
            data = os.pread(self.f.fileno(), n, offset)
        except OSError as exc:
            raise FormatError(f"cannot read MDS shard ({exc.strerror})", path=self.path,
                              offset=offset) from None
        if len(data) != n:
            raise FormatError("MDS shard is shorter than when it was opened (truncated while "
                              "being read)", path=self.path, offset=offset)
        return memoryview(data)

    def close(self) -> None:
        self.f.close()


class MDSSource:
    """Samples of a local MDS dataset folder.

    Args:
        path: the folder holding ``index.json`` (or the index file itself).
        max_shard_bytes: the largest (decompressed) shard accepted.
        max_sample_bytes: the largest sample accepted.

    Columns become fields of the same name, except that a single image column is
    named ``image`` and an int column named like a label is named ``label``.

    Raises:
        FormatError: ``index.json`` is missing, too large, not JSON, or an entry
            has a wrong type or shape (names the entry and key).
        SchemaError: a column uses ``pkl`` (never unpickled) or another encoding
            without a plain byte meaning (``pil``, ``ndarray``, lists).
    """

    def __init__(self, path: str | Path, *, max_shard_bytes: int = DEFAULT_MAX_MEMBER,
                 max_sample_bytes: int = DEFAULT_MAX_VALUE) -> None:
        p = Path(path)
        self.root = p.parent if p.name == INDEX_NAME else p
        self.max_shard_bytes = max_shard_bytes
        self.max_sample_bytes = max_sample_bytes
        self.shards = _load_index(self.root)
        self.classes = None
        index = self.root / INDEX_NAME
        if not self.shards:
            raise FormatError("index.json lists no shards", path=index)
        first = self.shards[0]
        self.columns, self.encodings, self.sizes = first.columns, first.encodings, first.sizes
        for name, enc in zip(self.columns, self.encodings, strict=True):
            if enc in _UNSAFE:
                raise SchemaError(f"column {name!r} uses MDS encoding {enc!r}, which shardpack "
                                  "never unpickles", path=index)
            if enc not in MDS_TYPES:
                raise SchemaError(f"column {name!r} uses MDS encoding {_short(enc)}, which "
                                  f"shardpack does not read (supported: {sorted(MDS_TYPES)})",
                                  path=index)
        for i, s in enumerate(self.shards[1:], 1):
            if (s.columns, s.encodings, s.sizes) != (self.columns, self.encodings, self.sizes):
                raise SchemaError(f"shards[{i}] has other columns than shards[0]", path=index)
        self.fields = tuple(self._fields())

    def _fields(self) -> list[Field]:
        types = [MDS_TYPES[e] for e in self.encodings]
        names = list(self.columns)
        images = [i for i, t in enumerate(types) if t in ("jpeg", "png")]
        if "image" not in names and len(images) == 1:
            names[images[0]] = "image"
        if "label" not in names:
            for i, n in enumerate(names):
                if n.lower() in _LABEL_NAMES and types[i] == "int":
                    names[i] = "label"
                    break
        self.names = names
        return [Field(n, t) for n, t in zip(names, types, strict=True)]

    def __len__(self) -> int:
        return sum(s.samples for s in self.shards)

    def _open_shard(self, i: int, s: _Shard) -> tuple[Path, _InMemory | _OnDisk]:
        raw_size = s.raw[1]
        if raw_size > self.max_shard_bytes:
            raise FormatError(f"shards[{i}].raw_data.bytes is larger than the limit",
                              path=self.root / INDEX_NAME, found=raw_size,
                              expected=f"<= {self.max_shard_bytes}")
        path = safe_child(self.root, (s.zipped or s.raw)[0], what="MDS shard name")
        try:
            f = open_regular(path)
        except OSError as exc:
            raise FormatError(f"cannot read MDS shard ({exc.strerror})", path=path) from None
        size = os.fstat(f.fileno()).st_size
        if s.zipped is None:
            if size != raw_size:
                f.close()
                raise FormatError("MDS shard size disagrees with index.json", path=path,
                                  found=size, expected=raw_size)
            return path, _OnDisk(f, size, path)
        with f:
            if size > self.max_shard_bytes:
                raise FormatError("compressed MDS shard is larger than the limit", path=path,
                                  found=size, expected=f"<= {self.max_shard_bytes}")
            data = f.read()
        algo = s.compression.split(":")[0]
        if algo == "zstd":
            data = unzstd_bounded(data, raw_size, path)
        elif algo == "gz":
            data = gunzip_bounded(data, raw_size, path)
        else:
            raise FormatError(f"unsupported MDS compression {_short(algo)} (zstd, gz)", path=path)
        if len(data) != raw_size:
            raise FormatError("MDS shard size disagrees with index.json", path=path,
                              found=len(data), expected=raw_size)
        return path, _InMemory(data)

    def __iter__(self) -> Iterator[Record]:
        var = [j for j, s in enumerate(self.sizes) if s is None]
        for i, s in enumerate(self.shards):
            path, shard = self._open_shard(i, s)
            try:
                yield from self._shard_samples(path, shard, s.samples, var)
            finally:
                shard.close()

    def _shard_samples(self, path: Path, shard, samples: int, var: list[int]):
        size = len(shard)
        n = int(np.frombuffer(shard.read(0, 4), "<u4")[0]) if size >= 4 else -1
        if n < 0 or 4 * (n + 2) > size or n != samples:
            raise FormatError("MDS shard header: sample count", path=path, found=n,
                              expected=samples)
        if not n:
            return
        first = int(np.frombuffer(shard.read(4, 4), "<u4")[0])
        last = int(np.frombuffer(shard.read(4 + 4 * n, 4), "<u4")[0])
        if first < 4 * (n + 2) or last != size:
            raise FormatError("MDS shard offsets are not increasing within the file", path=path)
        for start in range(0, n, _OFFSETS_CHUNK):
            count = min(_OFFSETS_CHUNK, n - start)
            offsets = np.frombuffer(shard.read(4 + 4 * start, 4 * (count + 1)), "<u4").astype(
                np.int64)
            lengths = np.diff(offsets)
            if (lengths < 0).any():
                raise FormatError("MDS shard offsets are not increasing within the file",
                                  path=path)
            if (lengths > self.max_sample_bytes).any():
                k = int(np.argmax(lengths > self.max_sample_bytes))
                raise FormatError("MDS sample larger than the limit", path=path, record=start + k,
                                  offset=int(offsets[k]), found=f"{int(lengths[k])} bytes",
                                  expected=f"<= {self.max_sample_bytes} bytes")
            for k in range(count):
                base = int(offsets[k])
                yield self._sample(path, start + k, shard.read(base, int(lengths[k])), var, base)

    def _sample(self, path: Path, r: int, buf: memoryview, var: list[int], base: int) -> Record:
        head = 4 * len(var)
        if head > len(buf):
            raise FormatError("MDS sample shorter than its size header", path=path, record=r,
                              offset=base)
        var_sizes = np.frombuffer(buf, "<u4", len(var)).tolist()
        sizes = list(self.sizes)
        for j, size in zip(var, var_sizes, strict=True):
            sizes[j] = size
        if head + sum(sizes) != len(buf):
            raise FormatError("MDS sample sizes disagree with its length", path=path, record=r,
                              offset=base, found=head + sum(sizes), expected=len(buf))
        values, pos = {}, head
        for name, enc, size, f in zip(self.names, self.encodings, sizes, self.fields, strict=True):
            raw = buf[pos:pos + size]
            pos += size
            try:
                values[name] = self._decode(enc, f, raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise SchemaError(f"column {name!r} ({enc}): {exc}", path=path, record=r,
                                  offset=base + pos - size) from None
        return Record(values, {}, f"{path.name}:{r}")

    @staticmethod
    def _decode(enc: str, f: Field, raw: memoryview):
        if enc in _SCALARS:
            dt = _SCALARS[enc]
            if len(raw) != dt.itemsize:
                raise ValueError(f"{len(raw)} bytes, expected {dt.itemsize}")
            v = np.frombuffer(raw, dt, 1)[0]
            if f.type == "float":
                return float(v)
            if int(v) >= 1 << 63:
                raise ValueError(f"{int(v)} does not fit int64")
            return int(v)
        if enc in ("str", "str_int", "str_float"):
            text = str(raw, "utf-8")
            return text if enc == "str" else (int(text) if enc == "str_int" else float(text))
        if enc == "json":
            return parse_json(raw, what="JSON")
        return bytes(raw)
