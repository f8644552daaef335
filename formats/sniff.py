"""Telling encoded images apart by their first bytes (never by trusting a file name),
and reading an image's size from its header without decoding a pixel.

This module holds the project's one table of magic bytes; the packer, the sinks and
``inspect-shards`` all ask it (what names say is in :mod:`formats.media`). Header rules, per format (all integers unsigned):

====  ==========================================================================
png   signature, then the IHDR chunk: length 13, width and height big-endian u32
      at bytes 16 and 20, its CRC-32 checked; complete when the IEND chunk is in
      the last 4 KiB
gif   width and height little-endian u16 at bytes 6 and 8
bmp   ``BM``, DIB header size (12, 40, 52, 56, 64, 108 or 124) at byte 14; width
      and height at 18 (u16 for the 12-byte core header, else i32; a negative
      height means top-down rows)
webp  RIFF ``WEBP``, then ``VP8 `` (the frame's 14-bit sizes after its start
      code ``9d 01 2a``), ``VP8L`` (14-bit sizes minus one after the byte 0x2f) or
      ``VP8X`` (24-bit canvas sizes minus one at bytes 24 and 27)
tiff  the first IFD's ImageWidth (256) and ImageLength (257) entries, SHORT or
      LONG, in the file's byte order
====  ==========================================================================

jpeg  the frame header (SOF segment) the header segments lead to: precision,
      height and width big-endian u16, then per component its sampling factors
      (:func:`jpeg_frame`; what the decoder reads: :func:`jpeg_unsupported`)
"""

from __future__ import annotations

import functools
import struct
import zlib
from typing import NamedTuple

from .media import IMAGE_KINDS

__all__ = ["GZIP_MAGIC", "JpegFrame", "image_kind", "image_size", "image_type", "is_gray",
           "jpeg_dct_scalable", "jpeg_frame", "jpeg_unsupported", "looks_complete", "sniff"]

#: The first bytes of a gzip stream (RFC 1952).
GZIP_MAGIC = b"\x1f\x8b"

_MAGIC = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"), (b"GIF89a", "gif"),
    (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"),
    (b"\x93NUMPY", "npy"),
    (GZIP_MAGIC, "gzip"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"PAR1", "parquet"),
)
# "BM" alone is two letters of text: a BMP also needs a known DIB header size.
_BMP_HEADERS = frozenset({12, 40, 52, 56, 64, 108, 124})
# How far from the end a format's end marker may sit (the padding some writers append).
_TAIL = 4096


def sniff(data) -> str:
    """A short name for the content of ``data``: an image kind (jpeg, png, webp, gif,
    bmp, tiff), npy, gzip, zstd, parquet, json, text or bytes."""
    head = bytes(data[:32])
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:2] == b"BM" and len(head) >= 18 and \
            int.from_bytes(head[14:18], "little") in _BMP_HEADERS:
        return "bmp"
    try:
        text = bytes(data[:256]).decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < 252:  # not just a multi-byte character cut at the window's end
            return "bytes"
        text = ""
    stripped = text.lstrip()
    if stripped[:1] in ("{", "["):
        return "json"
    return "text" if text or not head else "bytes"


def image_kind(data) -> str | None:
    """The image format of ``data`` (one of :data:`IMAGE_KINDS`), or None."""
    if data[:3] == b"\xff\xd8\xff":  # the common case first: one slice, one compare
        return "jpeg"
    kind = sniff(data)
    return kind if kind in IMAGE_KINDS else None


def image_type(data) -> str:
    """The field type for an encoded image: ``jpeg``, ``png`` or (any other) ``image``."""
    kind = sniff(data)
    return kind if kind in ("jpeg", "png") else "image"


def image_size(data, kind: str) -> tuple[int, int]:
    """``(height, width)`` of an image of format ``kind`` (as :func:`image_kind` named
    it), read from its header alone: the order of an array's shape, as every
    ``image_size`` in shardpack has it.

    Raises:
        ValueError: the header is short, inconsistent or names a zero size (the
            message says which).
    """
    if kind not in ("tiff", "jpeg"):  # their headers may sit anywhere in the file
        data = bytes(data[:_HEADER_BYTES])
    try:
        width, height = _SIZE[kind](data)
    except (struct.error, IndexError):
        raise ValueError("header is cut short") from None
    except KeyError:
        raise ValueError(f"no header rule for {kind!r}") from None
    if width <= 0 or height <= 0:
        raise ValueError(f"header says {width}x{height} pixels")
    return height, width


def is_gray(data, kind: str) -> bool:
    """Whether the header says gray samples: a PNG of colour type 0 (gray) or 4 (gray
    and alpha). False for other formats, whose decoders give one channel when gray."""
    return kind == "png" and len(data) > 25 and data[25] in (0, 4)


def looks_complete(data, kind: str) -> bool:
    """False when ``data`` (a ``kind`` image) provably lacks its end: a JPEG without
    its end-of-image marker, a PNG without IEND, a RIFF (WebP) or BMP shorter than
    its header says. True for formats with no cheap check (GIF, TIFF)."""
    n = len(data)
    if kind == "jpeg":
        # FF D9 cannot occur inside entropy-coded data (FF is stuffed or a restart
        # marker there), so its absence near the end means truncation.
        return bytes(data[max(2, n - _TAIL):]).rfind(b"\xff\xd9") >= 0
    if kind == "png":
        return bytes(data[max(8, n - _TAIL):]).rfind(b"IEND\xaeB`\x82") >= 0
    if kind == "webp":
        return n >= 8 + int.from_bytes(bytes(data[4:8]), "little")
    if kind == "bmp":
        return n >= int.from_bytes(bytes(data[2:6]), "little")
    return True


# -- one header rule per format ----------------------------------------------------------

_HEADER_BYTES = 64  # enough for every rule but TIFF's (whose IFD may sit anywhere)


def _png(d: bytes) -> tuple[int, int]:
    if d[8:16] != b"\x00\x00\x00\x0dIHDR":
        raise ValueError("first chunk is not a 13-byte IHDR")
    if len(d) < 33 or zlib.crc32(d[12:29]) != int.from_bytes(d[29:33], "big"):
        raise ValueError("IHDR checksum mismatch")
    return struct.unpack_from(">II", d, 16)


def _gif(d: bytes) -> tuple[int, int]:
    return struct.unpack_from("<HH", d, 6)


def _bmp(d: bytes) -> tuple[int, int]:
    (header,) = struct.unpack_from("<I", d, 14)
    if header == 12:
        return struct.unpack_from("<HH", d, 18)
    width, height = struct.unpack_from("<ii", d, 18)
    return width, abs(height)


def _webp(d: bytes) -> tuple[int, int]:
    chunk = d[12:16]
    if chunk == b"VP8 ":
        if d[23:26] != b"\x9d\x01\x2a":
            raise ValueError("VP8 frame has no start code")
        width, height = struct.unpack_from("<HH", d, 26)
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L":
        if d[20] != 0x2F:
            raise ValueError("VP8L chunk has no signature byte")
        (bits,) = struct.unpack_from("<I", d, 21)
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        return (int.from_bytes(d[24:27], "little") + 1,
                int.from_bytes(d[27:30], "little") + 1)
    raise ValueError(f"unknown first WebP chunk {chunk!r}")


def _tiff(d) -> tuple[int, int]:
    order = "<" if bytes(d[:2]) == b"II" else ">"
    (ifd,) = struct.unpack_from(order + "I", d, 4)
    (count,) = struct.unpack_from(order + "H", d, ifd)
    found: dict[int, int] = {}
    for i in range(count):
        tag, type_ = struct.unpack_from(order + "HH", d, ifd + 2 + 12 * i)
        if tag in (256, 257):
            if type_ == 3:    # SHORT
                (found[tag],) = struct.unpack_from(order + "H", d, ifd + 10 + 12 * i)
            elif type_ == 4:  # LONG
                (found[tag],) = struct.unpack_from(order + "I", d, ifd + 10 + 12 * i)
            else:
                raise ValueError(f"TIFF tag {tag} has type {type_}, not SHORT or LONG")
            if len(found) == 2:
                break
    if len(found) != 2:
        raise ValueError("first IFD has no ImageWidth and ImageLength")
    return found[256], found[257]


def _jpeg(d) -> tuple[int, int]:
    frame = jpeg_frame(d)
    return frame.width, frame.height


# -- JPEG frames ---------------------------------------------------------------------------
#
# What libjpeg-turbo (simplejpeg's decoder, and so the Loader's) decodes, found by
# trying files of every kind (tests/formats/test_jpeg_admission.py writes them):
#
# * frames: baseline, extended and progressive DCT (SOF0-2), Huffman or arithmetic
#   coded (SOF9-10); lossless (SOF3, SOF11) when the decode needs no colour
#   conversion (checked by decoding: it depends on JFIF/Adobe markers and component
#   ids). Hierarchical frames (SOF5-7, SOF13-15): never.
# * precision: 8 bits (lossless: 2 to 8). 12- and 16-bit samples need the 12/16-bit
#   API, which simplejpeg does not use ("Unsupported JPEG data precision 12").
# * sampling: what TurboJPEG classifies (its getSubsamp, ported in _subsampling) as
#   4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1 or gray. 4:4:1 it classifies too, but simplejpeg
#   1.9's header call has no name for it (a raw ``KeyError: 6``), and the others (two
#   components, 3x1, chroma sampled above luma...) it refuses.

# SOF markers of lossless (predictive) JPEG: C3, C7, CB, CF. They have no DCT, so no
# DCT-domain scale: simplejpeg's scaled decode of one corrupts memory and crashes.
_LOSSLESS_SOF = frozenset((0xC3, 0xC7, 0xCB, 0xCF))
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # DHT, JPG and DAC are not frames
_HIERARCHICAL_SOF = frozenset((0xC5, 0xC6, 0xC7, 0xCD, 0xCE, 0xCF))
_SOF_NAMES = {0xC0: "baseline", 0xC1: "extended", 0xC2: "progressive", 0xC3: "lossless",
              0xC5: "differential sequential", 0xC6: "differential progressive",
              0xC7: "differential lossless", 0xC9: "arithmetic extended",
              0xCA: "arithmetic progressive", 0xCB: "arithmetic lossless",
              0xCD: "arithmetic differential sequential",
              0xCE: "arithmetic differential progressive",
              0xCF: "arithmetic differential lossless"}
# TurboJPEG's subsampling kinds, as luma's (h, v) over 1x1 chroma, in its order
# (TJSAMP_444, 422, 420, 440, 411, 441); the 4:4:1 entry is named, then refused.
_SUBSAMPLING = (("4:4:4", 1, 1), ("4:2:2", 2, 1), ("4:2:0", 2, 2), ("4:4:0", 1, 2),
                ("4:1:1", 4, 1), ("4:4:1", 1, 4))
_DECODED_SUBSAMPLING = frozenset(("4:4:4", "4:2:2", "4:2:0", "4:4:0", "4:1:1", "gray"))


_FRAME_HEAD = struct.Struct(">HBHHB")  # length, precision, height, width, components


class JpegFrame(NamedTuple):
    """A JPEG's frame header (its SOF segment), as :func:`jpeg_frame` reads it.

    Attributes:
        marker: the SOF marker's second byte (0xC0 baseline ... 0xCF).
        precision: bits per sample.
        height, width: the declared size (height 0: set later by a DNL marker).
        sampling: each component's (horizontal, vertical) sampling factors.
    """

    marker: int
    precision: int
    height: int
    width: int
    sampling: tuple[tuple[int, int], ...]

    @property
    def kind(self) -> str:
        """The frame's kind in words (``baseline``, ``progressive``, ``lossless``...)."""
        return _SOF_NAMES.get(self.marker, f"SOF 0x{self.marker:02X}")

    @property
    def lossless(self) -> bool:
        return self.marker in _LOSSLESS_SOF


def _frame_at(data) -> int:
    """Where the SOF marker is (its 0xFF), or -1 when the header segments cannot be
    followed to one before the scan or the end (each step moves at least two
    bytes: bounded by the data)."""
    at, n = 2, len(data)
    while True:
        while at + 1 < n and data[at] == 0xFF and data[at + 1] == 0xFF:
            at += 1  # fill bytes before a marker
        if at + 4 > n or data[at] != 0xFF:
            return -1
        marker = data[at + 1]
        if marker in _SOF:
            return at
        if marker == 0xDA:  # the scan starts: no frame header before it
            return -1
        at += 2 + ((data[at + 2] << 8) | data[at + 3])


def jpeg_frame(data) -> JpegFrame:
    """The frame header of a JPEG (``data`` starting with its SOI marker).

    Raises:
        ValueError: no frame header where the header segments lead, or one that is
            cut short or inconsistent (its length against its component count).
    """
    at = _frame_at(data)
    if at < 0:
        raise ValueError("no frame header (SOF) where the header segments lead")
    segment = bytes(data[at + 2 : at + 22])  # long enough for four components
    if len(segment) < 8:
        raise ValueError("frame header is cut short")
    length, precision, height, width, count = _FRAME_HEAD.unpack_from(segment)
    if count > 4:
        segment = bytes(data[at + 2 : at + 10 + 3 * count])
    comps = segment[8 : 8 + 3 * count]
    if count == 0 or length != 8 + 3 * count or len(comps) < 3 * count:
        raise ValueError(f"frame header of {length} bytes for {count} components")
    return JpegFrame(data[at + 1], precision, height, width, _sampling(comps[1::3]))


@functools.lru_cache(maxsize=256)
def _sampling(factors: bytes) -> tuple[tuple[int, int], ...]:
    # A dataset holds a handful of samplings: decoded once each (the pack reads a
    # frame header per JPEG, a few µs against the tens a file costs to copy).
    return tuple((b >> 4, b & 15) for b in factors)


def _subsampling(sampling: tuple[tuple[int, int], ...]) -> str | None:
    """TurboJPEG's name for the sampling factors (getSubsamp in turbojpeg.c), or None.

    One component is gray whatever its factors. Three (and four: CMYK/YCCK, whose
    K follows luma) match a kind when luma is its (h, v) and chroma 1x1; or, as
    4:2:2 / 4:4:0, luma 2x2 with chroma 1x2 / 2x1; or, as 4:4:4, every component
    alike with at most 3 blocks each (an MCU holds at most 10)."""
    n = len(sampling)
    if n == 1:
        return "gray"
    if n not in (3, 4):
        return None
    luma = sampling[0]
    for name, h, v in _SUBSAMPLING:
        refs = [(1, 1), (1, 1), (h, v)][: n - 1]
        if luma == (h, v) and list(sampling[1:]) == refs:
            return name
        if luma == (2, 2) and name in ("4:2:2", "4:4:0"):
            chroma = (1, 2) if name == "4:2:2" else (2, 1)
            if list(sampling[1:]) == [chroma, chroma, (2, 2)][: n - 1]:
                return name
        if name == "4:4:4" and luma[0] * luma[1] <= 3 and all(s == luma for s in sampling):
            return name
    return None


def jpeg_unsupported(frame: JpegFrame) -> str | None:
    """Why the Loader's decoder (simplejpeg, 8-bit libjpeg-turbo) cannot decode a
    JPEG of this frame, in words; None when it can (the notes above).

    A lossless frame it may decode depends on its colour transform too, which the
    frame does not say: decode it to know (``packer`` does, for those alone)."""
    return _unsupported(frame.marker, frame.precision, frame.height == 0, frame.sampling)


@functools.lru_cache(maxsize=256)
def _unsupported(marker: int, precision: int, dnl: bool,
                 sampling: tuple[tuple[int, int], ...]) -> str | None:
    frame = JpegFrame(marker, precision, 0 if dnl else 1, 1, sampling)
    if frame.marker in _HIERARCHICAL_SOF:
        return f"a {frame.kind} (hierarchical) frame, which libjpeg does not decode"
    if frame.precision != 8 and not (frame.lossless and 2 <= frame.precision <= 8):
        return f"{frame.precision}-bit samples ({frame.kind} frame; the decoder reads 8-bit ones)"
    if frame.height == 0:
        return "height 0 in the frame header (set by a DNL marker, which libjpeg does not read)"
    if any(not (1 <= h <= 4 and 1 <= v <= 4) for h, v in frame.sampling):
        return None  # not a frame at all: the header parse calls it corrupt
    name = _subsampling(frame.sampling)
    if name not in _DECODED_SUBSAMPLING:
        factors = ", ".join(f"{h}x{v}" for h, v in frame.sampling)
        what = f"{name} sampling" if name else f"{len(frame.sampling)} components sampled"
        return f"{what} ({factors}), which the decoder does not read"
    return None


def jpeg_dct_scalable(data) -> bool:
    """Whether a JPEG's frame header (its SOF marker) names a DCT frame, which a
    DCT-domain scale may decode; False for a lossless frame and for a file whose
    header segments the walk cannot follow to a frame before the scan or the end,
    so what it cannot read is decoded whole."""
    at = _frame_at(data)
    return at >= 0 and data[at + 1] not in _LOSSLESS_SOF


_SIZE = {"png": _png, "gif": _gif, "bmp": _bmp, "webp": _webp, "tiff": _tiff, "jpeg": _jpeg}
