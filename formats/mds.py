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
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .base import Record
from .bounded import DEFAULT_MAX_MEMBER, gunzip_bounded, unzstd_bounded
from .errors import FormatError, SchemaError
from .fields import Field
from .files import safe_child

__all__ = ["MDS_TYPES", "MDSSource"]

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


def _load_index(root: Path) -> list[dict]:
    path = root / "index.json"
    try:
        obj = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise FormatError("no index.json: not an MDS dataset", path=path) from None
    except (OSError, ValueError) as exc:
        raise FormatError(f"unreadable index.json ({exc})", path=path) from None
    if not isinstance(obj, dict) or obj.get("version") != 2 or not isinstance(obj.get("shards"), list):
        raise FormatError("index.json is not an MDS version 2 index", path=path,
                          found=obj.get("version") if isinstance(obj, dict) else type(obj).__name__)
    for i, s in enumerate(obj["shards"]):
        if not isinstance(s, dict) or s.get("format") != "mds":
            raise FormatError(f"shards[{i}] is not an 'mds' shard", path=path,
                              found=s.get("format") if isinstance(s, dict) else s)
    return obj["shards"]


class MDSSource:
    """Samples of a local MDS dataset folder.

    Args:
        path: the folder holding ``index.json`` (or the index file itself).
        max_shard_bytes: the largest (decompressed) shard accepted.

    Columns become fields of the same name, except that a single image column is
    named ``image`` and an int column named like a label is named ``label``.

    Raises:
        SchemaError: a column uses ``pkl`` (never unpickled) or another encoding
            without a plain byte meaning (``pil``, ``ndarray``, lists).
    """

    def __init__(self, path: str | Path, *, max_shard_bytes: int = DEFAULT_MAX_MEMBER) -> None:
        p = Path(path)
        self.root = p.parent if p.name == "index.json" else p
        self.max_shard_bytes = max_shard_bytes
        self.shards = _load_index(self.root)
        self.classes = None
        if not self.shards:
            raise FormatError("index.json lists no shards", path=self.root / "index.json")
        first = self.shards[0]
        self.columns = list(first.get("column_names", []))
        self.encodings = list(first.get("column_encodings", []))
        self.sizes = list(first.get("column_sizes", []))
        if not (len(self.columns) == len(self.encodings) == len(self.sizes)) or not self.columns:
            raise FormatError("shards[0] column lists are missing or of unequal length",
                              path=self.root / "index.json")
        for name, enc in zip(self.columns, self.encodings, strict=True):
            if enc in _UNSAFE:
                raise SchemaError(f"column {name!r} uses MDS encoding {enc!r}, which shardpack "
                                  "never unpickles", path=self.root / "index.json")
            if enc not in MDS_TYPES:
                raise SchemaError(f"column {name!r} uses MDS encoding {enc!r}, which shardpack "
                                  f"does not read (supported: {sorted(MDS_TYPES)})",
                                  path=self.root / "index.json")
        for i, s in enumerate(self.shards[1:], 1):
            if (s.get("column_names"), s.get("column_encodings")) != (self.columns, self.encodings):
                raise SchemaError(f"shards[{i}] has other columns than shards[0]",
                                  path=self.root / "index.json")
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
        return sum(int(s.get("samples", 0)) for s in self.shards)

    def _shard_bytes(self, i: int, s: dict) -> tuple[Path, bytes]:
        raw = s.get("raw_data") or {}
        zipped = s.get("zip_data")
        raw_size = raw.get("bytes")
        if not isinstance(raw_size, int) or not 0 <= raw_size <= self.max_shard_bytes:
            raise FormatError(f"shards[{i}].raw_data.bytes is not a size within the limit",
                              path=self.root / "index.json", found=raw_size,
                              expected=f"<= {self.max_shard_bytes}")
        info = zipped or raw
        path = safe_child(self.root, info.get("basename"), what="MDS shard name")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise FormatError(f"cannot read MDS shard ({exc.strerror})", path=path) from None
        if zipped:
            algo = (s.get("compression") or "").split(":")[0]
            if algo == "zstd":
                data = unzstd_bounded(data, raw_size, path)
            elif algo == "gz":
                data = gunzip_bounded(data, raw_size, path)
            else:
                raise FormatError(f"unsupported MDS compression {algo!r} (zstd, gz)", path=path)
        if len(data) != raw_size:
            raise FormatError("MDS shard size disagrees with index.json", path=path,
                              found=len(data), expected=raw_size)
        return path, data

    def __iter__(self) -> Iterator[Record]:
        var = [j for j, s in enumerate(self.sizes) if s is None]
        for i, s in enumerate(self.shards):
            path, data = self._shard_bytes(i, s)
            n = int(np.frombuffer(data, "<u4", 1)[0]) if len(data) >= 4 else -1
            if n < 0 or 4 * (n + 2) > len(data) or n != s.get("samples"):
                raise FormatError("MDS shard header: sample count", path=path, found=n,
                                  expected=s.get("samples"))
            offsets = np.frombuffer(data, "<u4", n + 1, 4).astype(np.int64)
            if n and ((np.diff(offsets) < 0).any() or offsets[-1] != len(data)
                      or offsets[0] < 4 * (n + 2)):
                raise FormatError("MDS shard offsets are not increasing within the file", path=path)
            view = memoryview(data)
            for r in range(n):
                yield self._sample(path, r, view[offsets[r]:offsets[r + 1]], var, int(offsets[r]))

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
            return json.loads(str(raw, "utf-8"))
        return bytes(raw)
