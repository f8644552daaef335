"""Decompression with a ceiling: foreign inputs never expand past a stated bound.

Every compressed foreign input (gzip TFRecords, zstd/gzip MDS shards, gzip tars)
is read through these helpers, so a small file that claims or expands to a huge
size fails with a :class:`DecompressionError` naming the file instead of filling
memory. Bounds are checked before the bytes are produced, not after.
"""

from __future__ import annotations

import gzip
import io
import zlib
from pathlib import Path

import zstandard

from .errors import DecompressionError

__all__ = [
    "DEFAULT_MAX_MEMBER",
    "DEFAULT_MAX_STREAM",
    "BoundedReader",
    "gunzip_bounded",
    "open_input",
    "read_exact",
    "unzstd_bounded",
]

#: The largest single record, tar member or MDS shard a foreign source accepts (1 GiB).
DEFAULT_MAX_MEMBER = 1 << 30
#: The most bytes one compressed file may expand to (64 GiB).
DEFAULT_MAX_STREAM = 64 << 30

_GZIP_MAGIC = b"\x1f\x8b"


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
        except (OSError, EOFError, zlib.error, zstandard.ZstdError) as exc:
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


def open_input(path: str | Path, *, compression: str | None = "auto",
               max_bytes: int = DEFAULT_MAX_STREAM) -> io.BufferedReader:
    """Open a foreign input file for reading, transparently gunzipping it.

    Args:
        path: the file.
        compression: ``"auto"`` (gzip when the file starts with the gzip magic),
            ``"gzip"``, or ``None``.
        max_bytes: the most bytes a gzip file may expand to.

    Returns:
        A buffered binary stream; for gzip files every read is bounded.
    """
    f = open(path, "rb")  # noqa: SIM115 (returned to the caller, who closes it)
    if compression == "auto":
        compression = "gzip" if f.peek(2)[:2] == _GZIP_MAGIC else None
    if compression is None:
        return f
    if compression != "gzip":
        f.close()
        raise ValueError(f"unknown compression {compression!r} (gzip or None)")
    return io.BufferedReader(BoundedReader(gzip.GzipFile(fileobj=f, mode="rb"), max_bytes, path),
                             buffer_size=1 << 20)


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
