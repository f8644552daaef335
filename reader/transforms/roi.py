"""Region-of-interest JPEG decode: libjpeg-turbo's TurboJPEG 3 API through ctypes.

:mod:`reader.transforms.decode` decodes only the part of a JPEG that a plan's crop
covers (``tj3SetCroppingRegion``), at the same DCT scale as its whole-image path.
The TurboJPEG 3 API (libjpeg-turbo 3.0 and later) is the one interface to that
which plain ctypes can drive safely: errors come back as return codes, not as the
``longjmp`` the libjpeg API needs.

The library is looked up once, lazily, in this order:

1. the libturbojpeg that the ``turbojpeg`` wheel bundles (libjpeg-turbo 3.0,
   ``pip install 'shardpack[roi]'``); the wheel's own module is never imported,
   only its shared library loaded;
2. the system's ``libturbojpeg`` (``ctypes.util.find_library``), if it has the
   TurboJPEG 3 API (Debian's libturbojpeg0 2.1.5 has only the older one).

Without either, :func:`available` is False and the decoder keeps its whole-image
path. A region's left edge must sit on the scaled iMCU grid; the region is
otherwise free (rows are skipped with ``jpeg_skip_scanlines``). What the region
path keeps exact and what it no longer checks: :mod:`reader.transforms.decode`.

*Library*, chosen by measurement (decode alone, same RandomResizedCrop(224) boxes,
120 JPEGs, CPU time on one core of a loaded machine, medians of 11 alternated
rounds; speed relative to today's path):

==================================================  ======  =====
decode of the crop's box, DCT-scaled                 µs/img  speed
==================================================  ======  =====
simplejpeg (libjpeg-turbo 3.1.2), whole image           905   1.00
libturbojpeg 3.0 from the ``turbojpeg`` wheel, whole    988   0.93
the same, only the box's region (ours, ctypes)         744   1.23
PyTurboJPEG 2.6 on that library, whole                  980   0.92
PyTurboJPEG lossless crop, then scaled decode          1539   0.59
==================================================  ======  =====

PyTurboJPEG 2.x ships no library and needs a libturbojpeg 3 (Debian's 2.1.5 has the
TurboJPEG 2 API, with no region decode; the rows above borrow the ``turbojpeg``
wheel's), and offers only a lossless crop (re-encoding the MCUs) before a decode;
the ``turbojpeg`` wheel's own pybind module, simplejpeg and imagecodecs'
``jpeg8_decode`` take neither a region nor a scale; Pillow's wheel bundles
libjpeg-turbo 3.2 but only its libjpeg API, whose errors ``longjmp`` (that needs a
compiled extension, and a compiler). So the library is the ``turbojpeg`` wheel's
libturbojpeg (CPython 3.10-3.13, x86-64 Linux): libjpeg-turbo 2.1.92, the 3.0 beta,
8% slower than simplejpeg's 3.1.2 and crashing on a cropped lossless decode, which
:meth:`RegionDecoder.header` therefore refuses.

*Its home* (issue 38, decided): it stays behind the optional ``roi`` extra, looked up
as above, with the whole-image path as the fallback; no binding of our own yet.
The facts weighed:

* licence: the code we load is libjpeg-turbo's, whose licence is the IJG licence,
  the Modified (3-clause) BSD licence and the zlib licence (libjpeg-turbo's
  LICENSE.md), all permissive. What is missing is the wrapper's paperwork: the
  ``turbojpeg`` 0.0.2 wheel (github.com/Dobatymo/turbojpeg-python, one author)
  declares no licence in its metadata and ships no licence file, so a
  redistributor of that wheel cannot show the notices libjpeg-turbo's BSD and IJG
  terms ask for. We never redistribute it (users ``pip install`` it) and never
  import its module, so the risk stays with an opt-in extra, not with shardpack;
* upkeep: it bundles the 3.0 *beta* (2.1.92) and its last release is 0.0.2: a
  reason not to make it a core dependency, not to drop the measured 1.23x;
* the alternatives, none of which offers the region decode: PyTurboJPEG (MIT,
  maintained) binds a libturbojpeg it does not ship and offers only a lossless
  crop (0.59x above); simplejpeg (MIT, libjpeg-turbo 3.1.2 linked in) exposes the
  DCT scale (``min_height``/``min_width``) but no crop; a binding of our own over
  a licence-clear libturbojpeg 3.x (conda-forge's ``libjpeg-turbo``, "IJG AND
  BSD-3-Clause AND Zlib"; Fedora's) is what step 2 of the lookup above already
  does, through ``find_library``, wherever such a library is installed; building
  and shipping our own wheel of libjpeg-turbo is upkeep this gain (0.82 against
  0.96 ms an image) does not yet pay for;
* on a GPU host the region decode moves to nvImageCodec
  (:mod:`reader.runtime.gpu_decode`, its own ``gpu-decode`` extra), so this one
  matters for CPU-only hosts.

Revisit when a maintained wheel ships libturbojpeg 3.x with its licence files
(then it goes first in the lookup), or when the 3.0 beta fails us.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import math
import os

import numpy as np

from formats.sniff import looks_complete

from ..errors import RegionError

__all__ = ["Frame", "RegionDecoder", "available", "library_path", "region_for",
           "unavailable_reason"]

#: ``(top, left, scaled height, scaled width)``: decoded pixels are rows ``top...`` and
#: columns ``left...`` of the original scaled to ``scaled height`` x ``scaled width``.
Frame = tuple[int, int, int, int]

_INIT_DECOMPRESS = 1
_STOPONWARNING, _SUBSAMP, _JPEGWIDTH, _JPEGHEIGHT, _PRECISION, _COLORSPACE = 0, 4, 5, 6, 7, 8
_LOSSLESS = 15
_PF_RGB = 0
# TJSAMP_444, 422, 420, GRAY, 440, 411, 441 -> iMCU (width, height) in pixels.
_MCU = {0: (8, 8), 1: (16, 8), 2: (16, 16), 3: (8, 8), 4: (8, 16), 5: (32, 8), 6: (8, 32)}
_CS_RGB, _CS_YCBCR, _CS_GRAY = 0, 1, 2


class _Scale(ctypes.Structure):
    _fields_ = [("num", ctypes.c_int), ("denom", ctypes.c_int)]


class _Region(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


_lib: ctypes.CDLL | None = None
_path: str | None = None
_why: str | None = None  # why there is no library, once looked for


def _candidates() -> list[str]:
    paths = []
    spec = importlib.util.find_spec("turbojpeg")
    if spec is not None and spec.origin:
        libs = os.path.join(os.path.dirname(spec.origin), "turbojpeg.libs")
        paths += sorted(glob.glob(os.path.join(libs, "libturbojpeg*.so*")))
    system = ctypes.util.find_library("turbojpeg")
    if system:
        paths.append(system)
    return paths


def _bind(lib: ctypes.CDLL) -> None:
    c_int, c_void_p, c_size_t = ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t
    signatures = {
        "tj3Init": (c_void_p, [c_int]),
        "tj3Destroy": (None, [c_void_p]),
        "tj3Set": (c_int, [c_void_p, c_int, c_int]),
        "tj3Get": (c_int, [c_void_p, c_int]),
        "tj3GetErrorStr": (ctypes.c_char_p, [c_void_p]),
        "tj3DecompressHeader": (c_int, [c_void_p, c_void_p, c_size_t]),
        "tj3SetScalingFactor": (c_int, [c_void_p, _Scale]),
        "tj3SetCroppingRegion": (c_int, [c_void_p, _Region]),
        "tj3Decompress8": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p, c_int, c_int]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)  # AttributeError: not the TurboJPEG 3 API
        fn.restype, fn.argtypes = restype, argtypes


def _load() -> ctypes.CDLL | None:
    global _lib, _path, _why
    if _lib is not None or _why is not None:
        return _lib
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            _bind(lib)
        except (OSError, AttributeError) as exc:
            tried.append(f"{path}: {exc}")
            continue
        _lib, _path = lib, path
        return lib
    _why = ("no libturbojpeg with the TurboJPEG 3 API (pip install 'shardpack[roi]')"
            + (f"; tried {'; '.join(tried)}" if tried else ""))
    return None


def available() -> bool:
    """Whether a region decode is possible here (loads the library on first call)."""
    return _load() is not None


def library_path() -> str | None:
    """The libturbojpeg in use, or None (then :func:`unavailable_reason` says why)."""
    _load()
    return _path


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (the libraries tried), None when it is True."""
    _load()
    return _why


def _address(data: memoryview | bytes) -> int:
    return np.frombuffer(data, np.uint8).ctypes.data


class RegionDecoder:
    """One TurboJPEG decompressor; not thread-safe (one per :class:`Decoder`).

    Raises:
        RuntimeError: from the constructor, when :func:`available` is False.
    """

    def __init__(self) -> None:
        lib = _load()
        if lib is None:
            raise RuntimeError(_why)
        self._lib = lib
        self._handle = lib.tj3Init(_INIT_DECOMPRESS)
        if not self._handle:
            raise RuntimeError("tj3Init failed")
        # simplejpeg decodes with strict=True: a warning (truncated data, a bad
        # Huffman code) is an error there, so it must be here too.
        lib.tj3Set(self._handle, _STOPONWARNING, 1)

    def __del__(self) -> None:
        handle, self._handle = getattr(self, "_handle", None), None
        if handle:
            self._lib.tj3Destroy(handle)

    def _error(self) -> RegionError:
        return RegionError(self._lib.tj3GetErrorStr(self._handle).decode("utf-8", "replace"))

    def header(self, data: memoryview | bytes) -> tuple[int, int, int, int] | None:
        """``(height, width, iMCU height, iMCU width)`` of ``data``, or None when it
        has no region decode here (CMYK, YCCK, an unusual sampling, lossless or
        12-bit): then decode it whole.

        Raises:
            RegionError: the header is damaged.
        """
        lib, handle = self._lib, self._handle
        if lib.tj3DecompressHeader(handle, _address(data), len(data)) < 0:
            raise self._error()
        mcu = _MCU.get(lib.tj3Get(handle, _SUBSAMP))
        if mcu is None or lib.tj3Get(handle, _COLORSPACE) not in (_CS_YCBCR, _CS_GRAY, _CS_RGB):
            return None
        # A cropped decode of a lossless JPEG crashes this libjpeg-turbo (3.0 beta):
        # lossless files, like 12-bit ones, are decoded whole, by simplejpeg.
        if lib.tj3Get(handle, _LOSSLESS) or lib.tj3Get(handle, _PRECISION) != 8:
            return None
        return lib.tj3Get(handle, _JPEGHEIGHT), lib.tj3Get(handle, _JPEGWIDTH), mcu[1], mcu[0]

    def decode(self, data: memoryview | bytes, factor: int,
               region: tuple[int, int, int, int], out: np.ndarray) -> np.ndarray:
        """Decode ``region`` = ``(x, y, w, h)`` of the image scaled by ``1/factor`` as
        RGB into the start of ``out`` (uint8, at least ``w * h * 3``); returns that
        ``(h, w, 3)`` view. Call right after :meth:`header` on the same ``data``;
        ``x`` must be a multiple of the iMCU width divided by ``factor``.

        Raises:
            RegionError: the data is damaged (anywhere libjpeg-turbo reads).
        """
        lib, handle = self._lib, self._handle
        x, y, w, h = region
        if lib.tj3SetScalingFactor(handle, _Scale(1, factor)) < 0:
            raise self._error()
        if lib.tj3SetCroppingRegion(handle, _Region(x, y, w, h)) < 0:
            raise self._error()
        image = out[: w * h * 3].reshape(h, w, 3)
        if lib.tj3Decompress8(handle, _address(data), len(data), image.ctypes.data,
                              w * 3, _PF_RGB) < 0:
            raise self._error()
        return image


# Measured on 40 4:2:0 JPEGs of 300-500 px, one core, 15 alternated rounds: the region
# decode's time for the whole image over simplejpeg's (1.08), and what a row above
# the region costs as a part of a decoded row (skipping the top quarter: 1.015).
_REGION_COST = 1.08
_ROWS_ABOVE_COST = 0.75


def region_for(dec: RegionDecoder, data: memoryview | bytes, height: int, width: int,
                factor: int, box: tuple[float, float, float, float]
               ) -> tuple[tuple[int, int, int, int], Frame] | None:
    """The region ``(x, y, w, h)`` of the ``1/factor`` image that :meth:`RegionDecoder.decode`
    should decode for ``box`` (source pixels, as a plan's) and the region's :data:`Frame`;
    None when only the whole image will do, or costs no more. Reads the header of
    ``data`` into ``dec`` (a :meth:`RegionDecoder.header` call).

    Raises:
        RegionError: the header is damaged.
    """
    x0, y0, x1, y1 = box
    eps = 1e-6
    if x0 < -eps or y0 < -eps or x1 > width + eps or y1 > height + eps:
        return None  # CenterCrop's zero padding: the resample sizes it from the whole image
    if not looks_complete(data, "jpeg"):
        # The region decode stops reading after the crop's last row, so it would miss
        # a truncation; the whole decode reports it as it always has.
        return None
    header = dec.header(data)
    if header is None:
        return None
    mcu_w = header[3]
    sh, sw = -(-height // factor), -(-width // factor)
    sy, sx = sh / height, sw / width
    # The resample reads whole pixels floor(x0)..ceil(x1) (Pillow) or round()ed ones
    # (cv2) of the scaled box; the region holds those and one column either side:
    # libjpeg's fancy upsampling treats a region's side columns as the image's edge
    # (a 4:2:0 or 4:2:2 chroma sample has no neighbour there), which changes them.
    # Rows need no margin: libjpeg decodes whole iMCU rows with their context.
    left = max(math.floor(x0 * sx) - 1, 0)
    right = min(math.ceil(x1 * sx) + 1, sw)
    top = max(math.floor(y0 * sy), 0)
    bottom = min(math.ceil(y1 * sy), sh)
    # The left edge must lie on the scaled iMCU grid, and the origin is kept even: the
    # cv2 resample round()s half to even, so moving the box by an odd number of pixels
    # could move its edge by one.
    align = math.lcm(max(mcu_w // factor, 1), 2)
    left -= left % align
    top -= top % 2
    # The region decode reads no entropy-coded data past its last row, but the rows
    # above it still cost about 3/4 of decoding them, and the bundled libjpeg-turbo
    # 3.0 decodes a whole image 8% slower than simplejpeg's 3.1: a region that
    # reaches the bottom rarely pays.
    if _REGION_COST * (bottom - _ROWS_ABOVE_COST * top) >= sh:
        return None
    return (left, top, right - left, bottom - top), (top, left, sh, sw)
