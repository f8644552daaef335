"""Tiny JPEG writer for the rare kinds no library here writes: any precision (8, 12,
16), any sampling factors, 1 to 4 components, baseline / extended / progressive
(a DC-only first scan) / lossless frames, and a free choice of SOF marker.

(:func:`encode_kind` writes the common kinds, through simplejpeg and Pillow.)

The scans are consistent with the frame header (valid files, not fuzz), so a decoder
that supports a file's kind decodes it; what a decoder refuses, it refuses for the
kind. DCT frames carry DC coefficients only (every AC is zero: each block is a flat
tile of a random level); lossless frames carry random samples (predictor 1).
"""

from __future__ import annotations

import io

import numpy as np

__all__ = ["encode_kind", "jpeg_file"]


def encode_kind(img: np.ndarray, kind: str) -> bytes:
    """``img`` (RGB uint8) as a JPEG of a common kind, through the usual encoders:
    ``"gray"``, ``"progressive"`` (Pillow, 4:2:0) or a simplejpeg subsampling name
    (``"420"``, ``"422"``, ``"444"``, ``"440"``, ``"411"``)."""
    import simplejpeg

    if kind == "gray":
        return simplejpeg.encode_jpeg(np.ascontiguousarray(img[..., :1]), 90, colorspace="GRAY")
    if kind == "progressive":
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90, progressive=True, subsampling=2)
        return buf.getvalue()
    return simplejpeg.encode_jpeg(img, 90, colorsubsampling=kind)

# One Huffman table for every magnitude category: 0..15 for DCT frames (14 codes of
# 4 bits, 2 of 5), 0..16 for lossless ones (14 and 3): never the all-ones code.
_DC_COUNTS = [0, 0, 0, 14, 2] + [0] * 11
_DC_SYMBOLS = list(range(16))
_LL_COUNTS = [0, 0, 0, 14, 3] + [0] * 11
_LL_SYMBOLS = list(range(17))
# AC: EOB (0x00) only, plus a filler symbol (a table of one code is legal but odd).
_AC_COUNTS = [0, 2] + [0] * 14
_AC_SYMBOLS = [0x00, 0x01]


def _codes(counts: list[int], symbols: list[int]) -> dict[int, tuple[int, int]]:
    out, code, k = {}, 0, 0
    for length, n in enumerate(counts, 1):
        for _ in range(n):
            out[symbols[k]] = (code, length)
            code += 1
            k += 1
        code <<= 1
    return out


_DC = _codes(_DC_COUNTS, _DC_SYMBOLS)
_LL = _codes(_LL_COUNTS, _LL_SYMBOLS)
_AC = _codes(_AC_COUNTS, _AC_SYMBOLS)


class _Bits:
    def __init__(self) -> None:
        self.out = bytearray()
        self.acc = 0
        self.n = 0

    def put(self, value: int, length: int) -> None:
        for i in range(length - 1, -1, -1):
            self.acc = (self.acc << 1) | ((value >> i) & 1)
            self.n += 1
            if self.n == 8:
                self.out.append(self.acc)
                if self.acc == 0xFF:
                    self.out.append(0)  # byte stuffing
                self.acc = self.n = 0

    def diff(self, table: dict, value: int, lossless: bool = False) -> None:
        if lossless:
            value = ((value + 32768) & 0xFFFF) - 32768  # modulo 2^16
            if value == -32768:
                self.put(*table[16])
                return
        cat = abs(value).bit_length()
        self.put(*table[cat])
        if cat:
            self.put(value if value > 0 else value + (1 << cat) - 1, cat)

    def done(self) -> bytes:
        if self.n:
            self.put((1 << (8 - self.n)) - 1, 8 - self.n)
        return bytes(self.out)


def _segment(marker: int, body: bytes) -> bytes:
    return bytes([0xFF, marker]) + (len(body) + 2).to_bytes(2, "big") + body


def jpeg_file(rng: np.random.Generator, width: int = 24, height: int = 16, *,
              precision: int = 8, sampling: tuple[tuple[int, int], ...] = ((1, 1),) * 3,
              sof: int | None = None, lossless: bool = False, progressive: bool = False,
              adobe: int | None = None) -> bytes:
    """A JPEG of ``len(sampling)`` components with these (h, v) sampling factors.

    Args:
        sof: the frame marker byte (default: 0xC3 lossless, 0xC2 progressive, 0xC0
            baseline for 8 bits, else 0xC1 extended); the scan is coded the default's
            way whatever it says.
    """
    nc = len(sampling)
    hmax = max(h for h, _ in sampling)
    vmax = max(v for _, v in sampling)
    if sof is None:
        sof = 0xC3 if lossless else 0xC2 if progressive else 0xC0 if precision == 8 else 0xC1
    out = bytearray(b"\xff\xd8")
    out += _segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00") \
        if nc in (1, 3) and adobe is None else b""
    if adobe is not None:  # Adobe APP14: the colour transform (0 none, 1 YCbCr, 2 YCCK)
        out += _segment(0xEE, b"Adobe\x00\x64\x00\x00\x00\x00" + bytes([adobe]))
    if not lossless:
        out += _segment(0xDB, b"\x00" + b"\x01" * 64)  # quantizer 1 everywhere
    comps = b"".join(bytes([i + 1, (h << 4) | v, 0]) for i, (h, v) in enumerate(sampling))
    out += _segment(sof, bytes([precision]) + height.to_bytes(2, "big") +
                    width.to_bytes(2, "big") + bytes([nc]) + comps)
    out += _segment(0xC4, b"\x00" + (bytes(_LL_COUNTS) + bytes(_LL_SYMBOLS) if lossless
                                      else bytes(_DC_COUNTS) + bytes(_DC_SYMBOLS)))
    if not lossless and not progressive:
        out += _segment(0xC4, b"\x10" + bytes(_AC_COUNTS) + bytes(_AC_SYMBOLS))
    spectral = bytes([1, 0, 0]) if lossless else bytes([0, 0, 0]) if progressive \
        else bytes([0, 63, 0])
    out += _segment(0xDA, bytes([nc]) + b"".join(bytes([i + 1, 0]) for i in range(nc)) + spectral)
    bits = _Bits()
    if lossless:
        _lossless_scan(bits, rng, width, height, precision, sampling, hmax, vmax)
    else:
        _dct_scan(bits, rng, width, height, precision, sampling, hmax, vmax, progressive)
    out += bits.done() + b"\xff\xd9"
    return bytes(out)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _blocks(width, height, sampling, hmax, vmax, unit):
    """Per component, for each MCU in order, the (row, col) units it holds."""
    if len(sampling) == 1:  # non-interleaved: units of the component's own plane
        h, v = sampling[0]
        cols = _ceil(_ceil(width * h, hmax), unit)
        rows = _ceil(_ceil(height * v, vmax), unit)
        return [[[(r, c)]] for r in range(rows) for c in range(cols)]
    mcus_x = -(-width // (unit * hmax))
    mcus_y = -(-height // (unit * vmax))
    out = []
    for my in range(mcus_y):
        for mx in range(mcus_x):
            out.append([[(my * v + y, mx * h + x) for y in range(v) for x in range(h)]
                        for h, v in sampling])
    return out


def _dct_scan(bits, rng, width, height, precision, sampling, hmax, vmax, progressive):
    pred = [0] * len(sampling)
    span = 200 if precision == 8 else 3000
    for mcu in _blocks(width, height, sampling, hmax, vmax, 8):
        for c, units in enumerate(mcu):
            for _ in units:
                dc = int(rng.integers(-span, span))
                bits.diff(_DC, dc - pred[c])
                pred[c] = dc
                if not progressive:
                    bits.put(*_AC[0])  # EOB


def _lossless_scan(bits, rng, width, height, precision, sampling, hmax, vmax):
    planes = {}
    units = _blocks(width, height, sampling, hmax, vmax, 1)
    for c in range(len(sampling)):
        rows = 1 + max(u[c][-1][0] if len(sampling) > 1 else u[0][0][0] for u in units)
        cols = 1 + max(u[c][-1][1] if len(sampling) > 1 else u[0][0][1] for u in units)
        planes[c] = rng.integers(0, 1 << precision, (rows, cols))
    for mcu in units:
        for c, cell in enumerate(mcu):
            p = planes[c]
            for r, col in cell:
                if r == 0 and col == 0:
                    pred = 1 << (precision - 1)
                elif r == 0:
                    pred = p[r, col - 1]
                elif col == 0:
                    pred = p[r - 1, col]
                else:
                    pred = p[r, col - 1]
                bits.diff(_LL, int(p[r, col]) - int(pred), lossless=True)
