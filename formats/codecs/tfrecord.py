"""TFRecord files of ``tf.train.Example`` records: a source and a sink.

Framing of each record (little-endian)::

    uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)

with ``masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (mod 2**32)``. Both CRCs are
verified on read; the length is trusted only after its CRC matched, and never
beyond ``max_record_bytes``. Files may be compressed as TensorFlow writes them:
``GZIP`` (magic ``1f 8b``) or ``ZLIB`` (one zlib stream: ``78 01``/``5e``/``9c``/``da``,
taken as zlib only when the first 12 bytes are not a valid frame header), read
within ``max_bytes``. DALI-style index files (``tfrecord2idx``'s bytes) hold one
``offset size`` line per record, ``size`` being the whole framed record; the sink
writes one beside each uncompressed file by default.

Types: an Example holds byte strings, int64 and float32 lists only. The sink
writes ``int`` as a one-number Int64List, ``float`` as a one-number FloatList
(float32: a value float32 does not hold exactly is refused, never rounded),
``ndarray`` flattened (C order) as an Int64List (bool and integer dtypes; uint64
by its bits), a FloatList (float16/32, and float64 whose values float32 holds
exactly) or one byte string of the little-endian array bytes (other dtypes);
str and json as UTF-8 byte strings. It records the field types and feature names
in ``schema.json`` (see :mod:`formats.codecs.paths`) and the source reads every value
back as its type from it; files from elsewhere are typed from their first record.
"""

from __future__ import annotations

import gzip
import json
import math
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from ..base import Record
from ..bounded import (
    DEFAULT_MAX_STREAM,
    DEFAULT_MAX_VALUE,
    open_input,
    open_regular,
    parse_json,
    refuse_special_file,
)
from ..checksum import crc32c
from ..errors import CorruptRecordError, DecompressionError, ExampleError, FormatError, SchemaError
from ..fields import IMAGE_TYPES, Field, ImageKinds
from ..files import atomic_write_bytes, writev_all
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
from .tfexample import decode_example, encode_example_parts

__all__ = [
    "TFRecordSink",
    "TFRecordSource",
    "iter_frames",
    "looks_like_tfrecord",
    "masked_crc",
    "parse_feature_map",
    "tfrecord_compression",
]

SUFFIXES = (".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz", ".tfrecords.gz", ".tfrec.gz")
_HEAD = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
# The sink gathers frames' pieces and writes them with one writev per batch.
_GATHER_BYTES = 1 << 20
_GATHER_PIECES = 512

#: Feature names read as our conventional fields (ImageNet/TF-slim and TFDS spellings).
DEFAULT_FEATURES = {
    "image/encoded": "image", "image": "image",
    "image/class/label": "label", "label": "label",
    "image/filename": "key", "key": "key", "__key__": "key",
}
#: Feature names the sink writes for our conventional fields.
DEFAULT_SINK_FEATURES = {"image": "image/encoded", "label": "image/class/label",
                         "key": "image/filename"}


def _mask(c: int) -> int:
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def masked_crc(data) -> int:
    return _mask(crc32c(data))


def _is_frame_header(head: bytes) -> bool:
    return len(head) == 12 and masked_crc(head[:8]) == _HEAD.unpack(head)[1]


def tfrecord_compression(path: str | Path) -> str | None:
    """``"gzip"``, ``"zlib"`` or None (uncompressed, or not a TFRecord at all), from
    the first bytes of ``path``.

    Raises:
        OSError, FormatError: as for :func:`formats.bounded.open_regular`.
    """
    with open_regular(path) as f:
        head = f.read(12)
    if _is_frame_header(head):
        return None  # a first record of 376 bytes starts 78 01, one of 35615 1f 8b
    if head[:2] == GZIP_MAGIC:
        return "gzip"
    if len(head) >= 2 and head[0] == 0x78 and (head[0] << 8 | head[1]) % 31 == 0:
        return "zlib"
    return None


def looks_like_tfrecord(path: str | Path) -> bool:
    """Whether ``path`` starts with a valid TFRecord frame header (gzip or zlib allowed)."""
    try:
        with open_input(path, compression=tfrecord_compression(path)) as f:
            head = f.read(12)
    except (OSError, ValueError, EOFError):
        return False
    return _is_frame_header(head)


def _short(path, offset: int, what: str, found: int, expected: int) -> DecompressionError:
    """The error :func:`formats.bounded.read_exact` raises, for a read made otherwise."""
    return DecompressionError(f"file ends inside {what} (truncated)", path=path, offset=offset,
                              found=f"{found} bytes", expected=f"{expected} bytes")


def _fill(f, view: memoryview) -> int:
    """Read into ``view`` until it is full or the stream ends; the bytes read."""
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def iter_frames(path: str | Path, *, check_crc: bool = True, compression: str | None = "auto",
                max_record_bytes: int = DEFAULT_MAX_VALUE,
                max_bytes: int = DEFAULT_MAX_STREAM) -> Iterator[tuple[int, int, memoryview]]:
    """Yield (record index, byte offset, data) of every record in one file.

    ``data`` is a read-only view of a buffer reused from record to record (valid
    until the next record is read: copy what must outlive it), filled by one read
    with the payload, its checksum and the next record's header. The payload is
    copied once, from the file into a buffer still in the CPU's cache, and checked
    where it lies.

    ``compression`` is ``"auto"`` (see :func:`tfrecord_compression`), ``"gzip"``,
    ``"zlib"`` or None. Offsets are in the uncompressed stream. Raises
    CorruptRecordError (a CRC does not match), DecompressionError (truncated or over
    a bound) or FormatError (a record length over ``max_record_bytes``, or not a
    regular file), naming the file, record and offset.
    """
    try:
        if compression == "auto":
            compression = tfrecord_compression(path)
        f = open_input(path, compression=compression, max_bytes=max_bytes)
    except OSError as exc:
        raise FormatError(f"cannot read TFRecord file ({exc.strerror})", path=path) from None
    with f:
        index = offset = 0
        buf = memoryview(bytearray(1 << 17))
        head = f.read(12)
        while True:
            if not head:
                return
            if len(head) < 12:
                more = f.read(12 - len(head))
                if len(more) != 12 - len(head):
                    raise _short(path, offset, f"the header of record {index}",
                                 len(more), 12 - len(head))
                head += more
            length, length_crc = _HEAD.unpack(head)
            if check_crc and masked_crc(head[:8]) != length_crc:
                hint = "" if index or compression else (
                    " (not a TFRecord file, or compressed some other way than GZIP or ZLIB)")
                raise CorruptRecordError("TFRecord length checksum mismatch" + hint, path=path,
                                         record=index, offset=offset,
                                         found=f"0x{masked_crc(head[:8]):08x}",
                                         expected=f"0x{length_crc:08x}")
            if length > max_record_bytes:
                raise FormatError("TFRecord record longer than the limit", path=path, record=index,
                                  offset=offset, found=length, expected=f"<= {max_record_bytes}")
            if length + 16 > len(buf):  # views handed out before keep the old one
                buf = memoryview(bytearray(length + 16))
            got = _fill(f, buf[:length + 16])  # the payload, its CRC and the next header
            if got < length + 4:
                if got < length:
                    raise _short(path, offset, f"record {index}", got, length)
                raise _short(path, offset, f"the checksum of record {index}",
                             got - length, 4)
            data = buf[:length].toreadonly()
            if check_crc:
                want = _CRC.unpack_from(buf, length)[0]
                got_crc = masked_crc(data)
                if got_crc != want:
                    raise CorruptRecordError("TFRecord data checksum mismatch", path=path,
                                             record=index, offset=offset,
                                             found=f"0x{got_crc:08x}", expected=f"0x{want:08x}")
            yield index, offset, data
            head = bytes(buf[length + 4:got])
            index += 1
            offset += 16 + length


def parse_feature_map(spec: str | Mapping[str, str] | None) -> dict[str, str] | None:
    """``"image/encoded=image,image/class/label=label"`` (or a dict) -> {feature: field}.

    A field may carry a type, ``feature=field:type`` (e.g. ``:png``, ``:str``).
    """
    if spec is None or isinstance(spec, Mapping):
        return None if spec is None else dict(spec)
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, field = part.partition("=")
        if not name:
            raise SchemaError("bad feature mapping entry (want feature=field[:type])", found=part)
        out[name] = field if sep else name
    return out


def _infer(name: str, field_spec: str, value, *, where: str) -> Field:
    fname, _, ftype = field_spec.partition(":")
    if ftype:
        return Field(fname, ftype, dtype="<i8" if ftype == "ndarray" else None,
                     shape=(None,) if ftype == "ndarray" else None)
    if isinstance(value, np.ndarray):
        if value.size == 1:
            return Field(fname, "int" if value.dtype.kind == "i" else "float")
        return Field(fname, "ndarray", dtype=value.dtype.str, shape=(None,))
    if len(value) > 1:
        raise SchemaError(f"{where}: feature {name!r} holds {len(value)} byte strings; "
                          "one per record is supported")
    if fname == "key":
        return Field(fname, "str")
    if fname == "image":
        # Provisional when the first is a JPEG (writers type a field by what it holds).
        return Field(fname, "jpeg" if value and sniff(value[0]) == "jpeg" else "image")
    return Field(fname, "bytes")


def _shape_for(shape: tuple, size: int) -> tuple[int, ...] | None:
    """``shape`` with its one varying dimension (if any) filled in for ``size``
    values, or None when ``size`` values cannot have that shape."""
    known = math.prod(d for d in shape if d is not None)
    varying = shape.count(None)
    if varying == 0:
        return shape if known == size else None
    if varying == 1 and known > 0 and size % known == 0:
        return tuple(size // known if d is None else d for d in shape)
    return None


def _array(f: Field, value, path, index, offset) -> np.ndarray:
    """An ndarray field's value from its feature (a number list, or one byte string
    of the array's bytes), in the field's dtype and shape."""
    dt = np.dtype(f.dtype)
    if isinstance(value, np.ndarray):
        ok = (value.dtype.kind == "f") == (dt.kind == "f") and dt.kind in "biuf"
        flat = value.astype(dt) if ok else None
    elif len(value) == 1 and len(value[0]) % dt.itemsize == 0:
        flat = np.frombuffer(value[0], dt)
    else:
        flat = None
    shape = None if flat is None else _shape_for(f.shape, flat.size)
    if shape is None:
        found = (f"{value.size} {value.dtype} numbers" if isinstance(value, np.ndarray)
                 else f"{len(value)} byte strings")
        raise SchemaError(f"feature for field {f.name!r} is not an array of {dt.str}, shape "
                          f"{list(f.shape)}", path=path, record=index, offset=offset,
                          found=found)
    return flat.reshape(shape)


class TFRecordSource:
    """Records of TFRecord files (a file, a folder, a glob or a brace pattern).

    Args:
        path: where the files are.
        features: ``{feature: field[:type]}`` or its string form (see
            :func:`parse_feature_map`); only these features are read. By default
            every feature is read, with :data:`DEFAULT_FEATURES` renamed.
        check_crc: verify both CRCs of every record.
        max_record_bytes: refuse records longer than this.
        max_bytes: the most a gzip file may expand to.

    With ``schema.json`` beside the files (our sink wrote them) and no
    ``features``, the fields are the ones it records, each value read back as its
    type. Otherwise int64/float lists of length 1 in the first record become
    ``int``/``float`` fields, longer ones ``ndarray`` fields; later records must agree.
    """

    def __init__(self, path: str | Path, *, features: str | Mapping[str, str] | None = None,
                 check_crc: bool = True, max_record_bytes: int = DEFAULT_MAX_VALUE,
                 max_bytes: int = DEFAULT_MAX_STREAM) -> None:
        refuse_special_file(path)
        try:
            self.files = expand_inputs(path, SUFFIXES)
        except FormatError:
            p = Path(path)
            if not p.is_dir():
                raise
            self.files = [q for q in sorted(p.iterdir()) if q.is_file() and looks_like_tfrecord(q)]
            if not self.files:
                raise
        self.check_crc = check_crc
        self.max_record_bytes = max_record_bytes
        self.max_bytes = max_bytes
        self.classes = read_classes_file(self.files[0].parent)
        self._explicit = parse_feature_map(features)
        self._map: dict[str, str] = {}
        self._ours = None if features is not None else read_schema_file(self.files[0].parent,
                                                                        "tfrecord")
        self.fields = self._schema()

    def _frames(self, path: Path):
        return iter_frames(path, check_crc=self.check_crc, max_record_bytes=self.max_record_bytes,
                           max_bytes=self.max_bytes)

    def _decode(self, path: Path, index: int, offset: int, data: bytes) -> dict:
        try:
            return decode_example(data)
        except ExampleError as exc:
            raise CorruptRecordError(f"not a tf.train.Example ({exc})", path=path, record=index,
                                     offset=offset) from None

    def _schema(self) -> tuple[Field, ...]:
        for path in self.files:
            for index, offset, data in self._frames(path):
                example = self._decode(path, index, offset, data)
                where = f"{path.name} record {index}"
                if self._ours is not None:
                    fields, names = self._ours
                    self._map = {names.get(f.name, f.name): f.name for f in fields}
                    missing = sorted(set(self._map) - set(example))
                    if missing:
                        raise SchemaError(f"{where}: features {missing} of schema.json not "
                                          "found", found=sorted(example))
                    return fields
                if self._explicit is not None:
                    missing = sorted(set(self._explicit) - set(example))
                    if missing:
                        raise SchemaError(f"{where}: features {missing} not found",
                                          found=sorted(example))
                    specs = self._explicit
                else:
                    specs, taken = {}, set()
                    for name in sorted(example, key=lambda n: (n not in DEFAULT_FEATURES, n)):
                        target = DEFAULT_FEATURES.get(name, name)
                        specs[name] = name if target in taken else target
                        taken.add(specs[name])
                fields = tuple(_infer(n, s, example[n], where=where) for n, s in specs.items())
                self._map = {n: f.name for n, f in zip(specs, fields, strict=True)}
                return canonical_order(fields)
        raise FormatError("no records in any input file", path=self.files[0])

    def __iter__(self) -> Iterator[Record]:
        by_name = {f.name: f for f in self.fields}
        for path in self.files:
            for index, offset, data in self._frames(path):
                example = self._decode(path, index, offset, data)
                if self._explicit is None and len(example) != len(self._map):
                    extra = sorted(set(example) - set(self._map))
                    if extra:
                        raise SchemaError(f"features {extra} are not in the first record's schema",
                                          path=path, record=index, offset=offset)
                values = {}
                for name, fname in self._map.items():
                    if name not in example:
                        raise SchemaError(f"feature {name!r} is missing", path=path, record=index,
                                          offset=offset)
                    values[fname] = self._value(by_name[fname], example[name], path, index, offset)
                yield Record(values, {}, f"{path.name}:{index}")

    @staticmethod
    def _value(f: Field, value, path, index, offset):
        kind = f.type
        if kind in ("int", "float"):
            if not isinstance(value, np.ndarray) or value.size != 1:
                raise SchemaError(f"feature for field {f.name!r} ({kind}) is not one number",
                                  path=path, record=index, offset=offset,
                                  found=getattr(value, "size", "bytes"), expected=1)
            return int(value[0]) if kind == "int" else float(value[0])
        if kind == "ndarray":
            return _array(f, value, path, index, offset)
        if isinstance(value, np.ndarray) or len(value) > 1:
            raise SchemaError(f"field {f.name!r} expects one byte string", path=path, record=index,
                              offset=offset)
        raw = value[0] if value else b""
        if kind == "json":
            return parse_json(raw, path=path, record=index, offset=offset,
                              what=f"field {f.name!r}")
        if kind == "str":
            try:
                return raw.decode("utf-8")
            except (UnicodeDecodeError, ValueError):
                raise SchemaError(f"field {f.name!r} is not valid {kind}", path=path, record=index,
                                  offset=offset) from None
        return raw


def _lossy(f: Field, count: int, value) -> SchemaError:
    return SchemaError(f"tfrecord sink: field {f.name!r} ({f.type}) of record {count} holds "
                       "a value float32 does not hold exactly; a TFRecord float list is float32, "
                       "and the value is never rounded", found=value, expected="a float32 value")


def _numbers(f: Field, value, count: int):
    """An ndarray value as its feature (see the module docstring)."""
    dt = np.dtype(f.dtype)
    arr = np.asarray(value)
    if arr.dtype != dt:
        if not np.can_cast(arr.dtype, dt, casting="same_kind"):
            raise SchemaError(f"tfrecord sink: field {f.name!r} of record {count}: dtype "
                              f"{arr.dtype} does not cast safely", found=str(arr.dtype),
                              expected=dt.str)
        arr = arr.astype(dt)
    if _shape_for(f.shape, arr.size) is None or arr.ndim != len(f.shape):
        raise SchemaError(f"tfrecord sink: field {f.name!r} of record {count}: shape",
                          found=list(arr.shape), expected=list(f.shape))
    flat = arr.reshape(-1)
    if dt.kind in "biu":
        return flat.astype(np.int64)  # uint64 by its bits: the source casts back
    if dt.kind == "f" and dt.itemsize <= 8:
        out = flat.astype(np.float32)
        if dt.itemsize == 8 and not np.array_equal(out, flat, equal_nan=True):
            bad = flat[out != flat]
            raise _lossy(f, count, float(bad[~np.isnan(bad)][0]))
        return out
    return [np.ascontiguousarray(flat).tobytes()]


def _feature_value(f: Field, value, count: int):
    t = f.type
    if t == "int":
        return np.array([int(value)], np.int64)
    if t == "float":
        v = float(value)
        with np.errstate(over="ignore"):
            if not (math.isnan(v) or float(np.float32(v)) == v):
                raise _lossy(f, count, v)
        return np.array([v], np.float32)
    if t == "ndarray":
        return _numbers(f, value, count)
    if t == "str":
        return [value.encode("utf-8")]
    if t == "json":
        return [json.dumps(value, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False).encode("utf-8")]
    if type(value) is bytes or (isinstance(value, memoryview) and value.c_contiguous):
        return [value]  # written from where it lies (encode_example_parts)
    return [bytes(value)]


class TFRecordSink:
    """Writes ``shard-NNNNN.tfrecord[.gz]`` files of Examples into a folder.

    Args:
        path: the output folder.
        fields: the schema of the records written.
        classes: class names, written to ``classes.json`` beside the files (the
            source reads them back; TFRecord itself has no place for them).
        features: ``{field: feature name}``; by default :data:`DEFAULT_SINK_FEATURES`
            for ``image``/``label``/``key`` and the field name otherwise.
        shard_size: start a new file after this many bytes.
        records_per_shard: or after this many records.
        compression: ``None`` or ``"gzip"``.
        index: write a DALI index ``shard-NNNNN.idx`` beside each file (the bytes
            ``tfrecord2idx`` writes; DALI's reader needs them). By default (None)
            for uncompressed files; ``False`` opts out; ``True`` with gzip is
            refused (an index locates records in the uncompressed file).
        overwrite: replace files of an earlier run.

    Types as in the module docstring; ``schema.json`` records them when the sink
    closes without an error.

    Raises:
        SchemaError: at open, a field an Example cannot hold (an ndarray with more
            than one varying dimension: lists are flat); at write, a float value
            float32 does not hold exactly.
    """

    def __init__(self, path: str | Path, fields, classes=None, *,
                 features: Mapping[str, str] | None = None, shard_size: int | None = 256 << 20,
                 records_per_shard: int | None = None, compression: str | None = None,
                 index: bool | None = None, overwrite: bool = False) -> None:
        if compression not in (None, "gzip"):
            raise SchemaError("TFRecord compression must be None or 'gzip'", found=compression)
        if index and compression:
            raise SchemaError("index files describe uncompressed TFRecords only")
        self.fields = tuple(fields)
        for f in self.fields:
            if f.type == "ndarray" and f.shape.count(None) and _shape_for(
                    f.shape, math.prod(d or 1 for d in f.shape)) is None:
                raise SchemaError(f"tfrecord sink cannot hold field {f.name!r}: an ndarray of "
                                  "shape {list(f.shape)} (a flat list keeps one varying "
                                  "dimension at most)", found=list(f.shape))
        names = dict(DEFAULT_SINK_FEATURES)
        names.update(features or {})
        self._names = {f.name: names.get(f.name, f.name) for f in self.fields}
        if len(set(self._names.values())) != len(self._names):
            raise SchemaError("tfrecord sink: two fields on one feature name",
                              found=self._names)
        self.root = prepare_output_dir(path, overwrite=overwrite,
                                       owned=("shard-", CLASSES_FILE, SCHEMA_FILE))
        self.classes = classes
        write_classes_file(self.root, classes)
        self.shard_size, self.records_per_shard = shard_size, records_per_shard
        self.compression = compression
        self.index = not compression if index is None else index
        self.files: list[Path] = []
        self._file: AtomicFile | None = None
        self._gz = None
        self._pending: list = []  # pieces not yet written (uncompressed files)
        self._pending_bytes = 0
        self._offsets: list[tuple[int, int]] = []
        self._count = 0
        self._kinds = ImageKinds(self.fields)
        self._images = [f.name for f in self.fields if f.type in IMAGE_TYPES]

    def _open(self) -> None:
        suffix = ".tfrecord.gz" if self.compression else ".tfrecord"
        self._file = AtomicFile(self.root / f"shard-{len(self.files):05d}{suffix}")
        if self.compression:
            # mtime=0 and no file name: the same records give the same bytes.
            self._gz = gzip.GzipFile(filename="", fileobj=self._file.file, mode="wb", mtime=0)
        self._offsets = []

    def write(self, record: Record) -> None:
        values = record.fields
        feats = {self._names[f.name]: _feature_value(f, values[f.name], self._count)
                 for f in self.fields}
        for name in self._images:
            self._kinds.note(name, values[name])
        self._count += 1
        # The Example in pieces, its byte strings uncopied: the CRC runs over the
        # pieces and they are written in turn, never joined into one frame.
        parts = encode_example_parts(feats)
        n = crc = 0
        for p in parts:
            n += len(p)
            crc = crc32c(p, crc)
        if self._file is None:
            self._open()
        length = _HEAD.pack(n, 0)[:8]
        parts[0] = length + _CRC.pack(masked_crc(length)) + parts[0]
        parts[-1] = parts[-1] + _CRC.pack(_mask(crc))  # the first and last are short bytes
        start = self._file.nbytes
        if self._gz is not None:
            for p in parts:
                self._gz.write(p)
        else:
            for p in parts:  # kept until written: only what cannot change (see _flush)
                self._pending.append(p if type(p) is bytes or p.readonly else bytes(p))
            self._pending_bytes += n + 16
            if self._pending_bytes >= _GATHER_BYTES or len(self._pending) >= _GATHER_PIECES:
                self._flush()
        self._file.nbytes += n + 16
        self._offsets.append((start, n + 16))
        self._file.records += 1
        if (self.records_per_shard and self._file.records >= self.records_per_shard) or (
                self.shard_size and self._file.nbytes >= self.shard_size):
            self._seal()

    def _flush(self) -> None:
        """Write the pending pieces with writev (no copy into a file buffer; a short
        write, rare, leaves a tail to write again)."""
        writev_all(self._file.file.fileno(), self._pending)
        self._pending, self._pending_bytes = [], 0

    def _seal(self) -> None:
        if self._gz is not None:
            self._gz.close()
            self._gz = None
        self._flush()
        self._file.commit()
        self.files.append(self._file.path)
        if self.index:
            text = "".join(f"{o} {n}\n" for o, n in self._offsets)
            atomic_write_bytes(self._file.path.with_name(self._file.path.name.split(".")[0]
                                                         + ".idx"), text.encode(), durable=False)
        self._file = None

    def __enter__(self) -> TFRecordSink:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._pending = []
            if self._file is not None:
                if self._gz is not None:
                    self._gz.close()
                self._file.abort()
            return
        if self._file is not None:
            self._seal()
        write_schema_file(self.root, "tfrecord", self._kinds.typed(self.fields), self._names)
