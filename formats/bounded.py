"""Reading foreign inputs with a ceiling: no input expands, allocates or blocks past a stated bound.

Every compressed foreign input (gzip or zlib TFRecords, zstd/gzip MDS shards, gzip tars)
is read through these helpers, so a small file that claims or expands to a huge
size fails with a :class:`DecompressionError` naming the file instead of filling
memory. Bounds are checked before the bytes are produced, not after.

The caps, one per kind of thing read (each source takes its own as an argument):

* :data:`DEFAULT_MAX_VALUE` (256 MiB): one record or value: a TFRecord record, a
  tar member, a Parquet cell, an MDS sample, a JSON text. Reading a value costs a
  small multiple of its size in memory, so this is what bounds a source's memory.
* :data:`DEFAULT_MAX_MEMBER` (1 GiB): a unit read whole that holds many values: a
  (decompressed) MDS shard.
* :data:`DEFAULT_MAX_STREAM` (64 GiB): what one compressed file may expand to.
* :data:`MAX_JSON_DEPTH` (128): nesting of any JSON read from a foreign input,
  so no parser or writer downstream ever meets a ``RecursionError``.

Foreign files are opened with :func:`open_regular`: a FIFO, device or socket
given as a source would block a reader forever, so only regular files are read.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
import zlib
from pathlib import Path

import zstandard

from . import files
from .errors import DecompressionError, FormatError, SchemaError, ShardpackError
from .sniff import GZIP_MAGIC

__all__ = [
    "DEFAULT_MAX_MEMBER",
    "DEFAULT_MAX_STREAM",
    "DEFAULT_MAX_VALUE",
    "MAX_JSON_DEPTH",
    "BoundedReader",
    "gunzip_bounded",
    "open_input",
    "open_regular",
    "parse_json",
    "read_exact",
    "read_small_file",
    "refuse_special_file",
    "unzstd_bounded",
]

#: The largest single record or value a foreign source accepts (256 MiB): a TFRecord
#: record, a tar member, a Parquet cell, an MDS sample, a JSON text.
DEFAULT_MAX_VALUE = 256 << 20
#: The largest unit holding many values that a foreign source reads whole (1 GiB):
#: a decompressed MDS shard.
DEFAULT_MAX_MEMBER = 1 << 30
#: How deeply JSON read from a foreign input may nest (as serde_json's default).
MAX_JSON_DEPTH = 128
#: The most bytes one compressed file may expand to (64 GiB).
DEFAULT_MAX_STREAM = 64 << 30


class BoundedReader(io.RawIOBase):
    """A read-only stream that fails once more than ``limit`` bytes came out of it.

    Args:
        raw: the (decompressing) stream to read from.
        limit: the most bytes that may be read in total.
        path: the file, for error messages.
    """

    def __init__(self, raw, limit: int, path: str | Path) -> None:
        super().__init__()
        self._raw = raw
        self.limit = limit
        self.path = str(path)
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        view = memoryview(buf)
        # Asking for one byte past the limit is how an over-long stream is told apart
        # from one that ends exactly at it.
        room = self.limit - self.count + 1
        if room <= 0:
            self._overflow()
        view = view[: min(len(view), room)]
        try:
            n = self._raw.readinto(view)
        except EOFError:
            raise DecompressionError("compressed stream ends early: the file is truncated (an "
                                     "interrupted download?)", path=self.path,
                                     offset=self.count) from None
        except (OSError, zlib.error, zstandard.ZstdError) as exc:
            raise DecompressionError(f"damaged compressed stream ({exc})", path=self.path,
                                     offset=self.count) from None
        n = n or 0
        self.count += n
        if self.count > self.limit:
            self._overflow()
        return n

    def _overflow(self) -> None:
        raise DecompressionError(
            "decompressed data exceeds the limit (a decompression bomb, or raise the limit)",
            path=self.path, found=f"> {self.limit} bytes", expected=f"<= {self.limit} bytes",
        )

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


def open_regular(path: str | Path):
    """Open a foreign input for binary reading: a regular file only (a FIFO would
    block a reader forever); :func:`formats.files.open_regular` decides, following
    symlinks (the user named this file; nothing read from a dataset did).

    Raises:
        FormatError: missing, unreadable, or a FIFO, device, socket or folder.
        OSError: only when the descriptor table is full.
    """
    fd, _ = files.open_regular(path, Path(path).parent, what="input file",
                               follow_symlinks=True)
    return os.fdopen(fd, "rb")


def refuse_special_file(path: str | Path) -> None:
    """Refuse a FIFO, device or socket named as an input, before anything opens it
    (folders, regular files and paths that do not exist, patterns, pass).

    Raises:
        FormatError: naming the path and what it is.
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # missing, or a pattern: the caller says so
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise FormatError(f"not a regular file ({files.describe_mode(mode)}); only regular "
                          "files are read", path=path)


def read_small_file(path: str | Path, limit: int, what: str) -> bytes:
    """The whole content of a small foreign file (an index, a metadata file).

    Raises:
        OSError: the file cannot be opened.
        FormatError: not a regular file, or larger than ``limit`` bytes (checked
            before anything is read).
    """
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise FormatError(f"{what} is larger than the limit for it", path=path,
                              found=f"{size} bytes", expected=f"<= {limit} bytes")
        data = f.read(limit + 1)
    if len(data) > limit:  # grew while being read
        raise FormatError(f"{what} is larger than the limit for it", path=path,
                          found=f"> {limit} bytes", expected=f"<= {limit} bytes")
    return data


def _nested_deeper(obj, limit: int) -> bool:
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def parse_json(data, *, path: str | Path | None = None, record: int | None = None,
               offset: int | None = None, what: str = "JSON",
               error: type[ShardpackError] = SchemaError, max_bytes: int = DEFAULT_MAX_VALUE,
               max_depth: int = MAX_JSON_DEPTH):
    """Parse JSON from a foreign input, within a size and a nesting bound.

    Args:
        data: the text (str, bytes or a buffer).
        path, record, offset: where it came from, for the error.
        what: what it is, for the error ("column 'meta'", "index.json").
        error: the error type raised (a ShardpackError subclass).

    Raises:
        ``error``: not valid JSON (or not UTF-8), longer than ``max_bytes``,
            nested deeper than ``max_depth``, or an integer beyond Python's digit
            limit.
    """
    if isinstance(data, memoryview):
        data = bytes(data)
    if len(data) > max_bytes:
        raise error(f"{what} is longer than the limit", path=path, record=record, offset=offset,
                    found=f"{len(data)} bytes", expected=f"<= {max_bytes} bytes")
    try:
        obj = json.loads(data)
    except RecursionError:
        obj = None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise error(f"{what} is not valid JSON ({exc})", path=path, record=record,
                    offset=offset) from None
    else:
        if not isinstance(obj, (dict, list)):
            return obj
        # Counting brackets is cheap and bounds the depth: most texts skip the walk.
        opened = (data.count("[") + data.count("{") if isinstance(data, str)
                  else data.count(b"[") + data.count(b"{"))
        if opened <= max_depth or not _nested_deeper(obj, max_depth):
            return obj
    raise error(f"{what} is nested deeper than the limit", path=path, record=record,
                offset=offset, expected=f"<= {max_depth} levels")


class _ZlibStream(io.RawIOBase):
    """One zlib stream (RFC 1950: what TensorFlow writes for ``compression_type="ZLIB"``)
    decompressed as it is read, never more than the caller asks for at once."""

    def __init__(self, raw, path: str | Path) -> None:
        super().__init__()
        self._raw = raw
        self._path = str(path)
        self._d = zlib.decompressobj()

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while True:
            if self._d.eof:
                if self._d.unused_data or self._raw.read(1):
                    raise DecompressionError("data after the end of the zlib stream",
                                             path=self._path)
                return 0
            src = self._d.unconsumed_tail or self._raw.read(1 << 16)
            if not src:
                raise EOFError
            out = self._d.decompress(src, len(buf))
            if out:
                buf[:len(out)] = out
                return len(out)

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


def open_input(path: str | Path, *, compression: str | None = "auto",
               max_bytes: int = DEFAULT_MAX_STREAM) -> io.BufferedReader:
    """Open a foreign input file for reading, transparently gunzipping it.

    Args:
        path: the file.
        compression: ``"auto"`` (gzip when the file starts with the gzip magic),
            ``"gzip"``, ``"zlib"`` (one zlib stream; never guessed here: a zlib
            header is two bytes any format may start with), or ``None``.
        max_bytes: the most bytes a compressed file may expand to.

    Returns:
        A buffered binary stream; for compressed files every read is bounded.

    Raises:
        OSError: the file cannot be opened.
        FormatError: not a regular file (see :func:`open_regular`).
    """
    f = open_regular(path)
    if compression == "auto":
        compression = "gzip" if f.peek(2)[:2] == GZIP_MAGIC else None
    if compression is None:
        return f
    if compression == "gzip":
        stream = gzip.GzipFile(fileobj=f, mode="rb")
    elif compression == "zlib":
        stream = _ZlibStream(f, path)
    else:
        f.close()
        raise ValueError(f"unknown compression {compression!r} (gzip, zlib or None)")
    return io.BufferedReader(BoundedReader(stream, max_bytes, path), buffer_size=1 << 20)


def read_exact(stream, n: int, path: str | Path, what: str, offset: int) -> bytes:
    """Read exactly ``n`` bytes, or fail naming a truncated file."""
    data = stream.read(n)
    if len(data) != n:
        raise DecompressionError(f"file ends inside {what} (truncated)", path=path, offset=offset,
                                 found=f"{len(data)} bytes", expected=f"{n} bytes")
    return data


def gunzip_bounded(data, limit: int, path: str | Path) -> bytes:
    """Gunzip a whole buffer; fail if the output would exceed ``limit`` bytes."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise DecompressionError(f"damaged gzip data ({exc})", path=path) from None
    if len(out) > limit:
        raise DecompressionError("gzip data expands beyond its bound (a decompression bomb?)",
                                 path=path, found=f"> {limit} bytes", expected=f"<= {limit} bytes")
    if not d.eof:
        raise DecompressionError("gzip data is truncated", path=path)
    return out


def unzstd_bounded(data, limit: int, path: str | Path) -> bytes:
    """Decompress one zstd frame; fail if the output would exceed ``limit`` bytes.

    The frame's declared content size is checked before anything is allocated;
    frames without one are streamed with the same ceiling.
    """
    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise DecompressionError(f"not a zstd frame ({exc})", path=path) from None
    if size > limit:
        raise DecompressionError("zstd frame declares a size beyond its bound (a decompression bomb?)",
                                 path=path, found=size, expected=f"<= {limit} bytes")
    d = zstandard.ZstdDecompressor()
    try:
        if size >= 0:
            return d.decompress(data, max_output_size=limit)
        reader = BoundedReader(d.stream_reader(io.BytesIO(data)), limit, path)
        return io.BufferedReader(reader).read()
    except zstandard.ZstdError as exc:
        raise DecompressionError(f"damaged zstd data ({exc})", path=path) from None
