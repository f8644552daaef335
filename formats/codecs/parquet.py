"""Parquet files: a source and a sink, in the layout Hugging Face ``datasets`` writes.

An image column is either the ``datasets.Image`` struct (``bytes``: binary, ``path``:
string) or a plain binary column named ``image``/``img``/``jpg``/``png``. Class names
come from the ``huggingface`` schema metadata (``info.features.<label>.names`` of a
``ClassLabel``). Files are read in row batches (``iter_batches``), never whole.
The sink writes that same layout, class names included, so ``datasets`` reads it
back with ``Image`` and ``ClassLabel`` features: ``int`` as int64, ``float`` as
float64, ``str`` and ``json`` as strings, bytes and images as binary, an ``ndarray``
as a nested list column of its dtype (``Sequence`` features; bool, integer and
float dtypes: any other is refused at open). Its ``shardpack`` schema metadata
records every field (FORMAT.md field entries), and each file's footer the type
of its image fields as their payloads are (``shardpack_image_types``), so our
source reads back each value as its type; files from elsewhere are typed from
the column types (an image column: ``jpeg`` if its first image is one, else
``image``, whatever the later rows hold; a bool column is ``int``, 0 and 1, as the
format has no bool scalar).

An ``Image`` struct with ``bytes`` null and a ``path`` (what ``Dataset.to_parquet``
writes for images loaded from files) is read from that file: a relative path is
resolved against the Parquet file's folder, and the file must lie inside that
folder (after symlinks), or inside ``image_root`` when the source is given one;
an absolute path only inside ``image_root``. Anything else is refused with an
:class:`UnsafePathError` naming the Parquet file, the row and the path.

A file is read within bounds, checked from its footer before any data: the
footer itself is at most ``_MAX_FOOTER`` bytes; a column chunk whose uncompressed
size means some value in it exceeds ``max_value_bytes`` is refused unread; row
groups are read in batches sized to about ``_BATCH_BYTES`` (from the footer's
sizes), and every binary or text value's length is checked before it becomes a
Python object. Schema metadata (``huggingface``, ``shardpack``) must be JSON of
the expected shape, or the error names the file and the key.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..base import Record
from ..bounded import (
    DEFAULT_MAX_VALUE,
    open_regular,
    parse_json,
    read_small_file,
    refuse_special_file,
)
from ..errors import FormatError, SchemaError, UnsafePathError
from ..fields import IMAGE_TYPES, Field, ImageKinds
from ..files import temp_name
from ..sniff import sniff
from .outputs import prepare_output_dir
from .paths import expand_inputs

__all__ = ["SUFFIXES", "ParquetSink", "ParquetSource"]

#: The file names this codec reads in a folder (and tells a Parquet file by).
SUFFIXES = (".parquet",)

IMAGE_NAMES = ("image", "img", "jpg", "jpeg", "png", "picture")
LABEL_NAMES = ("label", "labels", "class", "cls", "target")
_BATCH = 256
_BATCH_BYTES = 64 << 20  # rows per batch are cut so a batch holds about this much
_MAX_FOOTER = 64 << 20  # the footer of a file with 100k row groups is a few MB
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _is_binary(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def _is_image_struct(t: pa.DataType) -> bool:
    return (pa.types.is_struct(t) and t.get_field_index("bytes") >= 0
            and _is_binary(t.field("bytes").type))


def _metadata_json(schema: pa.Schema, key: bytes, path: Path) -> dict:
    raw = (schema.metadata or {}).get(key)
    if raw is None:
        return {}
    obj = parse_json(raw, path=path, what=f"the {key.decode()!r} schema metadata",
                     error=FormatError, max_bytes=_MAX_FOOTER)
    if not isinstance(obj, dict):
        raise FormatError(f"the {key.decode()!r} schema metadata is not a JSON object",
                          path=path, found=type(obj).__name__)
    return obj


def _hf_features(schema: pa.Schema, path: Path) -> dict:
    info = _metadata_json(schema, b"huggingface", path).get("info", {})
    features = info.get("features", {}) if isinstance(info, dict) else None
    if features is None:
        features = {}
    if not isinstance(features, dict):
        raise FormatError("the 'huggingface' schema metadata: info.features is not an object",
                          path=path, found=type(features).__name__)
    return features


def _json_columns(schema: pa.Schema, path: Path) -> set[str]:
    cols = _metadata_json(schema, b"shardpack", path).get("json_columns", [])
    if not isinstance(cols, list) or not all(isinstance(c, str) for c in cols):
        raise FormatError("the 'shardpack' schema metadata: json_columns is not a list of "
                          "names", path=path)
    return set(cols)


def _our_fields(schema: pa.Schema, footer: dict | None, path: Path) -> tuple[Field, ...] | None:
    """The fields our sink recorded (image types as the file's footer says), or None."""
    entries = _metadata_json(schema, b"shardpack", path).get("fields")
    if entries is None:
        return None
    try:
        if not isinstance(entries, list):
            raise SchemaError("not a list")
        fields = [Field.from_json(e) for e in entries]
    except SchemaError as exc:
        raise FormatError(f"the 'shardpack' schema metadata: fields ({exc})", path=path) from None
    raw = (footer or {}).get(b"shardpack_image_types")
    if raw is not None:
        types = parse_json(raw, path=path, what="the 'shardpack_image_types' metadata",
                           error=FormatError)
        if not isinstance(types, dict):
            raise FormatError("the 'shardpack_image_types' metadata is not an object", path=path)
        for i, f in enumerate(fields):
            t = types.get(f.name)
            if f.type in IMAGE_TYPES and t in IMAGE_TYPES:
                fields[i] = Field(f.name, t)
    names = [f.name for f in fields]
    if "image" not in names or len(set(names)) != len(names) or (
            set(names) - {"key"} != set(schema.names)):
        raise FormatError("the 'shardpack' schema metadata: fields do not match the columns",
                          path=path, found=names, expected=schema.names)
    return tuple(fields)


def _provisional_image_type(data) -> str:
    """A source's type for an image column from its first image: writers type the
    field by what it holds (``jpeg`` when the first is one may widen, never lie)."""
    return "jpeg" if sniff(data) == "jpeg" else "image"


def _ndarray(f: Field, v, path: Path, row: int) -> np.ndarray:
    try:
        arr = np.array(v, dtype=np.dtype(f.dtype))
    except (ValueError, TypeError, OverflowError) as exc:
        raise SchemaError(f"column {f.name!r} does not hold an array of {f.dtype} ({exc})",
                          path=path, record=row) from None
    if arr.size == 0 and arr.ndim == 1 and len(f.shape) > 1 and None not in f.shape[1:]:
        # A list of no rows (a [0, 4] array) keeps no inner size: the schema gives it back.
        arr = arr.reshape((0, *f.shape[1:]))
    if arr.ndim != len(f.shape) or any(
            d is not None and d != n for d, n in zip(f.shape, arr.shape, strict=True)):
        raise SchemaError(f"column {f.name!r} holds an array of another shape", path=path,
                          record=row, found=list(arr.shape), expected=list(f.shape))
    return arr


@contextmanager
def _parquet_file(path: Path):
    """A ParquetFile over a regular file whose footer is within ``_MAX_FOOTER``
    (checked from the file's last 8 bytes before pyarrow reads the footer)."""
    try:
        f = open_regular(path)
    except OSError as exc:
        raise FormatError(f"cannot read Parquet file ({exc.strerror})", path=path) from None
    with f:
        size = os.fstat(f.fileno()).st_size
        tail = os.pread(f.fileno(), 8, size - 8) if size >= 12 else b""
        if len(tail) != 8 or tail[4:] != b"PAR1":
            raise FormatError("not a Parquet file (no PAR1 footer)", path=path)
        footer = struct.unpack("<I", tail[:4])[0]
        if footer > min(_MAX_FOOTER, size - 12):
            raise FormatError("Parquet footer larger than the file or the limit", path=path,
                              found=f"{footer} bytes",
                              expected=f"<= {min(_MAX_FOOTER, size - 12)} bytes")
        try:
            # No pre-buffering: a whole row group's column chunks would be read at once.
            pf = pq.ParquetFile(f, pre_buffer=False, buffer_size=8 << 20)
        except (OSError, pa.ArrowException) as exc:
            raise FormatError(f"not a Parquet file ({exc})", path=path) from None
        yield pf


def _scalar_field(name: str, t: pa.DataType) -> Field:
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return Field(name, "int")
    if pa.types.is_floating(t):
        return Field(name, "float")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return Field(name, "str")
    if _is_binary(t):
        return Field(name, "bytes")
    return Field(name, "json")


class ParquetSource:
    """Rows of Parquet files (a file, a folder, a glob) as records.

    Args:
        path: where the files are.
        image_column: the column holding encoded images (auto-detected by default).
        label_column: the int column holding labels (``label`` and similar by default).
        batch_size: the most rows read at once (fewer where rows are large).
        max_value_bytes: the largest cell (an image, a text, a JSON text) accepted,
            and the largest image file read for a path.
        image_root: the folder image paths may lead into (see the module
            docstring); by default the Parquet file's own folder.

    Fields: as the ``shardpack`` metadata records them (our sink's files); else
    ``image`` (see the module docstring), ``label`` when present, ``key`` (a
    ``key`` column, else the image's ``path``, else ``file:row``), and every other
    column under its own name.

    Raises:
        SchemaError: no image column (the message lists the columns there are).
        FormatError: not a Parquet file, a footer or a value over its bound,
            malformed schema metadata (names the file, and the row where there is one).
        UnsafePathError: (while iterating) an image path outside the allowed folder.
    """

    def __init__(self, path: str | Path, *, image_column: str | None = None,
                 label_column: str | None = None, batch_size: int = _BATCH,
                 max_value_bytes: int = DEFAULT_MAX_VALUE,
                 image_root: str | Path | None = None) -> None:
        refuse_special_file(path)
        self.files = expand_inputs(path, SUFFIXES)
        self.batch_size = batch_size
        self.max_value_bytes = max_value_bytes
        self.image_root = None if image_root is None else Path(image_root)
        if self.image_root is not None and not self.image_root.is_dir():
            raise FormatError("image_root is not a folder", path=self.image_root)
        with _parquet_file(self.files[0]) as pf:
            self._schema = pf.schema_arrow
            footer = pf.metadata.metadata
        names = self._schema.names
        ours = None
        if image_column is None and label_column is None:
            ours = _our_fields(self._schema, footer, self.files[0])
        if ours is not None:
            image_column = "image"
            label_column = "label" if any(f.name == "label" for f in ours) else None
        if image_column is None:
            image_column = next((n for n in names if _is_image_struct(self._schema.field(n).type)),
                                None)
            if image_column is None:
                image_column = next((n for n in names if n.lower() in IMAGE_NAMES and
                    _is_binary(self._schema.field(n).type)), None)
        if image_column is None or image_column not in names:
            raise SchemaError("no image column (a datasets.Image struct or a binary column named "
                              f"one of {list(IMAGE_NAMES)}); its columns are {names}",
                              path=self.files[0], found=image_column)
        self.image_column = image_column
        self._struct = _is_image_struct(self._schema.field(image_column).type)
        hf = _hf_features(self._schema, self.files[0])
        if label_column is None and ours is None:
            label_column = next((n for n in names if n.lower() in LABEL_NAMES and (
                pa.types.is_integer(self._schema.field(n).type))), None)
        elif label_column is not None and label_column not in names:
            raise SchemaError(f"no column {label_column!r}; its columns are {names}",
                              path=self.files[0])
        self.label_column = label_column
        label_feature = hf.get(label_column, {}) if label_column else {}
        names_list = label_feature.get("names") if isinstance(label_feature, dict) else None
        if names_list is not None and not (isinstance(names_list, list) and all(
                isinstance(c, str) for c in names_list)):
            raise FormatError(f"the 'huggingface' schema metadata: the class names of "
                              f"{label_column!r} are not a list of strings", path=self.files[0])
        self.classes = None if names_list is None else tuple(names_list)
        self._others = [n for n in names if n not in (image_column, label_column)]
        self._key_column = "key" if "key" in self._others else None
        if ours is not None:
            self._want_key = any(f.name == "key" for f in ours)
            self.fields = ours
            return
        self._want_key = True
        fields = [Field("image", _provisional_image_type(self._first_image()))]
        if label_column:
            fields.append(Field("label", "int"))
        fields.append(Field("key", "str"))
        json_cols = _json_columns(self._schema, self.files[0])
        for n in self._others:
            if n != "key":
                f = _scalar_field(n, self._schema.field(n).type)
                fields.append(Field(n, "json") if n in json_cols and f.type == "str" else f)
        self.fields = tuple(fields)

    def _image_file(self, path: Path, row: int, name: str) -> bytes:
        """The bytes of the image file a row names (see the module docstring)."""
        try:
            given = Path(name)
            target = given if given.is_absolute() else path.parent / given
            top = os.path.realpath(self.image_root or path.parent)
            real = os.path.realpath(target)
        except (ValueError, OSError):  # NUL in the name, a loop of links
            raise UnsafePathError("image path is not a usable path", path=path, record=row,
                                  found=name) from None
        if (given.is_absolute() and self.image_root is None) or os.path.commonpath(
                [top, real]) != top:
            raise UnsafePathError(
                "image path leads outside the Parquet file's folder"
                if self.image_root is None else "image path leads outside image_root",
                path=path, record=row, found=name,
                expected=f"a file inside {top}" + ("" if self.image_root else
                                                   " (pass image_root to allow another folder)"))
        try:
            return read_small_file(real, self.max_value_bytes, "image file")
        except FormatError as exc:
            raise FormatError(f"image file of row {row}: {exc.message}", path=path, record=row,
                              found=name, expected=exc.expected) from None
        except OSError as exc:
            raise FormatError(f"cannot read the image file of row {row} ({exc.strerror})",
                              path=path, record=row, found=name) from None

    def _first_image(self) -> bytes:
        for path in self.files:
            for row, batch in self._batches(path, [self.image_column]):
                col = batch.column(0)
                if len(col):
                    value = col[0].as_py()
                    if not self._struct:
                        return value or b""
                    value = value or {}
                    if value.get("bytes") is None and value.get("path") is not None:
                        return self._image_file(path, row, value["path"])
                    return value.get("bytes") or b""
        raise FormatError("no rows in any Parquet file", path=self.files[0])

    def _check_footer(self, path: Path, md: pq.FileMetaData, leaves: list[int]) -> list[int]:
        """Rows per batch for each row group; refuses a column chunk that must hold a
        value over the bound (more bytes than its rows could hold), before reading it."""
        rows_per_batch = []
        for g in range(md.num_row_groups):
            group = md.row_group(g)
            rows, total = group.num_rows, 0
            for j in leaves:
                chunk = group.column(j)
                size = chunk.total_uncompressed_size
                total += size
                # Page headers and levels take a few bytes a row on top of the values.
                if size > rows * (self.max_value_bytes + 64) + (1 << 20):
                    raise FormatError(
                        f"column {chunk.path_in_schema!r} of row group {g} holds values larger "
                        "than the limit", path=path,
                        found=f"{size} bytes in {rows} row(s)",
                        expected=f"<= {self.max_value_bytes} bytes a value")
            per_row = max(1, total // max(rows, 1))
            rows_per_batch.append(max(1, min(self.batch_size, _BATCH_BYTES // per_row)))
        return rows_per_batch

    def _batches(self, path: Path, columns=None):
        """(first row, batch) of ``columns`` (all by default), every value bounded."""
        with _parquet_file(path) as pf:
            if pf.schema_arrow.names != self._schema.names:
                raise SchemaError("Parquet file has other columns than the first file", path=path,
                                  found=pf.schema_arrow.names[:20], expected=self._schema.names[:20])
            md = pf.metadata
            wanted = set(columns or self._schema.names)
            paths = [md.schema.column(j).path for j in range(md.num_columns)]
            leaves = [j for j, p in enumerate(paths)
                      if any(p == n or p.startswith(n + ".") for n in wanted)]
            row = 0
            for g, rows in enumerate(self._check_footer(path, md, leaves)):
                try:
                    for batch in pf.iter_batches(batch_size=rows, row_groups=[g], columns=columns):
                        self._check_values(path, row, batch)
                        yield row, batch
                        row += len(batch)
                except pa.ArrowException as exc:
                    raise FormatError(f"damaged Parquet data ({exc})", path=path,
                                      record=row) from None

    def _check_values(self, path: Path, row: int, batch: pa.RecordBatch) -> None:
        for name, col in zip(batch.schema.names, batch.columns, strict=True):
            if pa.types.is_struct(col.type) and col.type.get_field_index("bytes") >= 0:
                name, col = f"{name}.bytes", col.field("bytes")
            if not (_is_binary(col.type) or pa.types.is_string(col.type)
                    or pa.types.is_large_string(col.type)):
                continue
            lengths = pc.binary_length(col)
            longest = pc.max(lengths).as_py()
            if longest is not None and longest > self.max_value_bytes:
                at = pc.index(lengths, longest).as_py()
                raise FormatError(f"column {name!r} holds a value larger than the limit",
                                  path=path, record=row + at, found=f"{longest} bytes",
                                  expected=f"<= {self.max_value_bytes} bytes")

    @staticmethod
    def _cell(f: Field | str, v, path: Path, row: int, name: str):
        kind = f if isinstance(f, str) else f.type
        if v is None:
            raise SchemaError(f"column {name!r} is null", path=path, record=row)
        if kind == "ndarray":
            return _ndarray(f, v, path, row)
        if kind == "int":
            v = int(v)
            if not _INT64[0] <= v <= _INT64[1]:
                raise SchemaError(f"column {name!r} holds an integer beyond int64", path=path,
                                  record=row, found=v)
            return v
        if kind == "json" and isinstance(v, str):
            return parse_json(v, path=path, record=row, what=f"column {name!r}")
        return v

    def __len__(self) -> int:
        total = 0
        for p in self.files:
            with _parquet_file(p) as pf:
                total += pf.metadata.num_rows
        return total

    def __iter__(self) -> Iterator[Record]:
        fields = {f.name: f for f in self.fields}
        for path in self.files:
            for row, batch in self._batches(path):
                cols = {n: batch.column(n) for n in batch.schema.names}
                images = cols[self.image_column]
                if self._struct:
                    data_col = images.field("bytes").to_pylist()
                    path_col = images.field("path").to_pylist() if images.type.get_field_index(
                        "path") >= 0 else [None] * len(batch)
                else:
                    data_col, path_col = images.to_pylist(), [None] * len(batch)
                labels = cols[self.label_column].to_pylist() if self.label_column else None
                others = {n: cols[n].to_pylist() for n in self._others}
                for i in range(len(batch)):
                    origin = f"{path.name}:{row}"
                    data = data_col[i]
                    if data is None:
                        if path_col[i] is None:
                            raise SchemaError("row has no image bytes and no image path",
                                              path=path, record=row)
                        data = self._image_file(path, row, path_col[i])
                    values = {"image": data}
                    if labels is not None:
                        if labels[i] is None:
                            raise SchemaError("row has no label", path=path, record=row)
                        values["label"] = self._cell("int", labels[i], path, row,
                                                     self.label_column)
                    if self._want_key:
                        key = others["key"][i] if self._key_column else None
                        if key is None:
                            key = path_col[i] if path_col[i] is not None else origin
                        values["key"] = str(key)
                    for n in self._others:
                        if n != "key" or not self._want_key:
                            values[n] = self._cell(fields[n], others[n][i], path, row, n)
                    yield Record(values, {}, origin)
                    row += 1


_NUMPY_KINDS = "biuf"  # ndarray dtypes a nested list column holds (and ``datasets`` reads)


def _arrow_type(f: Field) -> pa.DataType:
    if f.type == "ndarray":
        t = pa.from_numpy_dtype(np.dtype(f.dtype))
        for _ in f.shape:
            t = pa.list_(t)
        return t
    return {"int": pa.int64(), "float": pa.float64(), "str": pa.string(),
            "json": pa.string()}.get(f.type, pa.binary())


def _hf_feature(f: Field) -> dict:
    if f.type == "ndarray":
        feature: dict = {"_type": "Value", "dtype": np.dtype(f.dtype).name}
        for _ in f.shape:
            # "Sequence": what every datasets version reads (5.x says "List").
            feature = {"_type": "Sequence", "feature": feature}
        return feature
    dtype = {"int": "int64", "float": "float64", "str": "string", "json": "string"}
    return {"_type": "Value", "dtype": dtype.get(f.type, "binary")}


def _check_sink_fields(fields) -> None:
    names = {f.name: f for f in fields}
    if "image" not in names or names["image"].type not in IMAGE_TYPES:
        raise SchemaError("parquet sink: it writes image datasets, and there is no 'image' "
                          "field of an image type", found=[f.name for f in fields])
    if "key" in names and names["key"].type != "str":
        raise SchemaError("parquet sink: field 'key' is the image's path and must be str",
                          found=names["key"].type, expected="str")
    for f in fields:
        if f.type == "ndarray" and (np.dtype(f.dtype).kind not in _NUMPY_KINDS
                                    or np.dtype(f.dtype).itemsize > 8):
            raise SchemaError(f"parquet sink cannot hold field {f.name!r}: an ndarray of dtype "
                              f"{f.dtype} (a list column holds bool, integer and float "
                              "dtypes)", found=f.dtype)


class ParquetSink:
    """Writes ``shard-NNNNN.parquet`` files in the ``datasets`` layout.

    Args:
        path: the output folder.
        fields: the schema; ``image`` becomes a ``{bytes, path}`` struct (path =
            the ``key``), ``label`` an int64 ClassLabel column, others native
            columns (see the module docstring).
        classes: class names, stored in the ``huggingface`` metadata.
        records_per_shard / shard_size: when to start a new file.
        row_group_size: rows per row group (and per write).
        overwrite: replace files of an earlier run.

    Raises:
        SchemaError: at open, a schema these files cannot hold: no ``image``
            field, a ``key`` that is not text, an ndarray of a dtype other than
            bool, integer or float.
    """

    def __init__(self, path: str | Path, fields, classes=None, *, shard_size: int | None = 256 << 20,
                 records_per_shard: int | None = None, row_group_size: int = 1024,
                 overwrite: bool = False) -> None:
        self.fields = tuple(fields)
        _check_sink_fields(self.fields)
        self.root = prepare_output_dir(path, overwrite=overwrite, owned=("shard-",))
        self.classes = None if classes is None else list(classes)
        self.shard_size, self.records_per_shard = shard_size, records_per_shard
        self.row_group_size = row_group_size
        self._columns = ["image"] + [f.name for f in self.fields if f.name not in ("image", "key")]
        self._schema = self._make_schema()
        self.files: list[Path] = []
        self._rows: list[Record] = []
        self._writer: pq.ParquetWriter | None = None
        self._tmp: Path | None = None
        self._records = self._bytes = 0
        self._kinds = ImageKinds(self.fields)
        self._images = [f.name for f in self.fields if f.type in IMAGE_TYPES]

    def _make_schema(self) -> pa.Schema:
        features: dict = {"image": {"_type": "Image"}}
        cols = [pa.field("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())]))]
        for f in self.fields:
            if f.name in ("image", "key"):
                continue
            cols.append(pa.field(f.name, _arrow_type(f)))
            if f.name == "label" and f.type == "int" and self.classes is not None:
                features["label"] = {"_type": "ClassLabel", "names": self.classes}
            else:
                features[f.name] = _hf_feature(f)
        meta = {"info": {"features": features}}
        # JSON fields are text columns to every other reader, ndarrays lists: this key
        # tells ours (json_columns: what files before "fields" recorded).
        fields = []
        for f in self.fields:
            entry = f.to_json()
            entry.pop("compression", None)
            fields.append(entry)
        ours = {"json_columns": [f.name for f in self.fields if f.type == "json"],
                "fields": fields}
        return pa.schema(cols, metadata={"huggingface": json.dumps(meta, sort_keys=True),
                                         "shardpack": json.dumps(ours, sort_keys=True)})

    def write(self, record: Record) -> None:
        self._rows.append(record)
        if len(self._rows) >= self.row_group_size or (
                self.records_per_shard and self._records + len(self._rows) >= self.records_per_shard):
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        types = {f.name: f.type for f in self.fields}
        for r in rows:
            for name in self._images:
                self._kinds.note(name, r.fields[name])
        data = {"image": [{"bytes": bytes(r.fields["image"]),
                           "path": r.fields["key"] if "key" in types else None} for r in rows]}
        for name in self._columns[1:]:
            t = types[name]
            if t == "json":
                data[name] = [json.dumps(r.fields[name], sort_keys=True) for r in rows]
            elif t in ("int", "float", "str"):
                data[name] = [r.fields[name] for r in rows]
            elif t == "ndarray":
                data[name] = [np.asarray(r.fields[name]).tolist() for r in rows]
            else:
                data[name] = [bytes(r.fields[name]) for r in rows]
        try:
            table = pa.Table.from_pydict(data, schema=self._schema)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise SchemaError(f"parquet sink: a record does not fit its columns ({exc})",
                              found=rows[0].origin or None) from None
        if self._writer is None:
            self._path = self.root / f"shard-{len(self.files):05d}.parquet"
            self._tmp = temp_name(self._path)
            self._writer = pq.ParquetWriter(self._tmp, self._schema)
        self._writer.write_table(table)
        self._records += len(rows)
        self._bytes += table.nbytes
        if (self.records_per_shard and self._records >= self.records_per_shard) or (
                self.shard_size and self._bytes >= self.shard_size):
            self._seal()

    def _seal(self) -> None:
        # What this file's image fields hold, payload by payload (the schema metadata,
        # written at open, has only the types declared).
        typed = {f.name: f.type for f in self._kinds.typed(self.fields) if f.name in self._images}
        self._writer.add_key_value_metadata(
            {"shardpack_image_types": json.dumps(typed, sort_keys=True)})
        self._writer.close()
        os.replace(self._tmp, self._path)
        self.files.append(self._path)
        self._writer, self._tmp, self._records, self._bytes = None, None, 0, 0
        self._kinds = ImageKinds(self.fields)

    def __enter__(self) -> ParquetSink:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self._flush()
            if self._writer is not None:
                self._seal()
        elif self._writer is not None:
            self._writer.close()
            self._tmp.unlink(missing_ok=True)
