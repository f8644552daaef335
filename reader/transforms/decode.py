"""Decode one encoded image and write its transformed pixels into a caller's buffer.

This is the per-sample CPU path of the loader workers. For a JPEG it runs:

1. ``simplejpeg.decode_jpeg_header`` (about 1.5 µs) and
   :meth:`reader.transforms.ImagePipeline.plan`: the crop box and output size are
   fixed before any pixel is decoded.
2. libjpeg-turbo's DCT-domain downscale by the largest power of two (1/2, 1/4,
   1/8) that leaves the box at least as large as the output. Only powers of two:
   libjpeg-turbo's other factors (3/4, 5/8, 7/8, ...) are *slower* than a full
   decode. simplejpeg picks the smallest factor whose output is at least
   ``min_height`` x ``min_width``, so asking for ``ceil(side / f)`` yields exactly
   ``1/f`` (its ``min_factor`` argument does not help: a factor below it just
   falls back to a full decode). The decode writes into a per-decoder scratch
   buffer that only grows, so steady state allocates nothing. With the ``roi``
   extra only the region the box covers is decoded (below).
3. One resample of the box (a numpy view; crop *before* resize) straight into
   ``out``; the flip is an in-place mirror of ``out`` (``cv2.flip``, 4 µs).
4. User callables, in place when they return their input. :meth:`Decoder.decode_timed`
   times them apart from steps 1-3: the monitor's ``transform`` stage, not ``decode``.

Other formats (PNG, WebP, ...) take a slower, correct path through OpenCV's
``imdecode`` (Pillow only where OpenCV cannot decode them).

Resize backend, measured on this machine (``python -m scripts.bench_decode``: one
core, 300 synthetic 95 KB JPEGs of 300-500 px, RandomResizedCrop(224); Pillow 13,
OpenCV 5.1, simplejpeg 1.9):

==========================================  ======  =====================
resize of the crop to 224x224               µs/img  PSNR vs Pillow, dB
==========================================  ======  =====================
Pillow BILINEAR (antialiased, torchvision)     586  reference
cv2 INTER_AREA (FFCV), linear to enlarge       305  46.5
cv2 INTER_LINEAR                                92  42.7
==========================================  ======  =====================

==============================================  =====  =======  ===========
whole path, images/s                            img/s  / naive  / decode
==============================================  =====  =======  ===========
simplejpeg full decode only                      1104     1.76         1.00
naive: decode, Pillow crop+resize, flip, CHW      626     1.00         0.57
ours, backend="pillow"                            618     0.99         0.56
ours, backend="cv2"                               978     1.56         0.89
==============================================  =====  =======  ===========

So ``backend="cv2"`` (the ``"auto"`` choice when OpenCV is installed) resizes with
INTER_LINEAR below 2x (the DCT scale has done the rest) and INTER_AREA beyond;
Pillow remains the fallback, matching torchvision's PIL path exactly.

Region of interest (``pip install 'shardpack[roi]'``, :mod:`reader.transforms.roi`).
Step 2 then decodes only the rows and columns of the DCT-scaled image that the box
covers (``tj3SetCroppingRegion``). Where the time goes decides what it saves: the
entropy decoding is about 85% of a decode of these images and cannot start midway
(no restart markers), so rows above the region still cost three quarters of
decoding them and columns beside it a little; rows below it are never read. So a
region that reaches the bottom from near the top goes the whole-image way (the
rule: :func:`reader.transforms.roi.region_for`), as do CMYK/YCCK files, unusual
samplings, boxes reaching outside the image (CenterCrop's padding) and files
without an end-of-image marker near their end.

*Exact.* The output is byte-identical to the whole-image path, both backends, for
4:2:0, 4:2:2, 4:4:4, 4:4:0, grayscale and progressive files, at every DCT scale, for
corner, center, tiny, fractional and whole boxes, flipped or not
(``tests/reader/transforms/test_roi.py``). Two details make it so: a one-column margin
either side (fancy upsampling treats a region's side columns as the image's edge:
without the margin they differ by a few levels), and an even origin (cv2's resample
``round()``s half to even, so an odd shift could move a box edge by one pixel).

*Bad data.* Truncation, a missing end-of-image marker, and damage that libjpeg
notices where it lies (a stray marker, an impossible Huffman code) before or within
the crop's last iMCU row raise the same ``DecodeError("corrupt JPEG ...")`` as
before. What the region path no longer sees is damage that libjpeg notices only
later, since it stops reading after that row: damage below the crop, and most
damage above or in it too, because a flipped bit usually desynchronises the Huffman
decode silently and shows only at the next marker or at the end of the scan
("extraneous bytes before marker"). Measured over 1,500 single-bit flips in the
entropy-coded data of 256x256 4:2:0 files, with a random band crop: of the 1,066
flips before the crop's bottom, today's path raised on 420 and returned wrong
pixels without error on 281; the region path raised on 35 and returned wrong pixels
on 666 (on the rest both return the undamaged pixels). Of the 434 flips below the
crop, today's raised on 157, the region path on none (and returned the undamaged
pixels for 408). So the decode is a weak check of a file's integrity either way;
the record's CRC32C is the real one for any change after packing, while
``pack-dataset`` checks a JPEG's header and end marker, not its entropy-coded data.
``ImagePipeline(..., roi=False)`` keeps today's checks.

*Library*: :mod:`reader.transforms.roi` says which and why (measured).

Classification pipeline, ``python -m scripts.bench_decode --roi-only --count 300
--rounds 9`` pinned to one core (CPU time, alternated rounds; the machine was shared,
load average 3 on 2 cores, so the ratio is the figure to keep: today's total ran
1.18x the 0.96 ms measured for issue 29). A second run on the other core: 0.86.

================================  ======  ========  ====  =====  ======  ======
RRC 224 + flip, cv2, CPU µs/img   decode  resample  rest  total  /today  spread
================================  ======  ========  ====  =====  ======  ======
whole image (today)                  952       118    50   1131    1.00    0.12
region of interest                   790       111    51    952    0.85    0.08
================================  ======  ========  ====  =====  ======  ======

So from 0.96 ms an image the region decode brings the pipeline to about 0.82 ms,
short of 0.76, because the entropy decoding down to the crop's last row is a floor
that only a decoder able to start mid-scan (restart markers) could go below.
"""

from __future__ import annotations

import io
import math
import struct
import time
from typing import Literal

import numpy as np
import simplejpeg

from formats import media
from formats.sniff import image_kind, jpeg_dct_scalable, jpeg_frame, jpeg_unsupported
from formats.sniff import image_size as header_size  # the same (height, width), from a header

from ..errors import DecodeError, RegionError
from . import roi
from .geometry import Plan
from .resample import integer_box, uses_area
from .roi import Frame

__all__ = ["Decoder", "check_backend", "decode_full", "image_size"]

Backend = Literal["auto", "cv2", "pillow"]
Box = tuple[float, float, float, float]

_JPEG_SOI = b"\xff\xd8"
_PIL_ERRORS = (OSError, ValueError, EOFError, SyntaxError, struct.error, MemoryError)


def describe_bytes(data: memoryview | bytes) -> str:
    """Bad input as decode errors name it (here and in the mask kernel): length and first bytes."""
    head = bytes(data[:8])
    return f"{len(data)} bytes starting {head!r}"


def pixel_budget(max_pixels: int | None) -> int:
    """The pixel budget in force: ``max_pixels`` (the Loader's option), or
    :data:`formats.media.MAX_PIXELS` read now when it is None."""
    return media.MAX_PIXELS if max_pixels is None else max_pixels


def _header_hw(data: memoryview | bytes) -> tuple[int, int] | None:
    """``(height, width)`` from a non-JPEG image's header, or None where the bytes are
    no image kind we know or the header does not parse (its decoder then says why)."""
    kind = image_kind(data)
    if kind is None:
        return None
    try:
        return header_size(data, kind)
    except ValueError:
        return None


def within_budget(height: int, width: int, data: memoryview | bytes,
                  max_pixels: int | None = None) -> tuple[int, int]:
    """``(height, width)``, once the header's size is within the pixel budget
    (``max_pixels``, the Loader's option; None: :data:`formats.media.MAX_PIXELS`,
    read when called): checked before any pixel buffer is allocated, since a header
    of a few bytes may declare 10^10 pixels (a dataset packed before ``pack-dataset``
    checked it, or with a larger ``--max-pixels``). The budget is the reader's, never
    the dataset's: a hostile manifest cannot raise it.

    Raises:
        DecodeError: more pixels than the budget (the worker adds shard and record).
    """
    budget = pixel_budget(max_pixels)
    if height * width > budget:
        raise DecodeError(f"image header declares {width}x{height} = {width * height:,} "
                          f"pixels, more than the {budget:,}-pixel budget (Loader("
                          f"max_pixels=...), to match pack-dataset --max-pixels); nothing "
                          f"was decoded ({describe_bytes(data)})")
    return height, width


def check_header_budget(data: memoryview | bytes, max_pixels: int | None = None) -> None:
    """:func:`within_budget` for a non-JPEG image whose header gives its size (one
    whose header does not parse is left to its decoder to refuse)."""
    hw = _header_hw(data)
    if hw is not None:
        within_budget(*hw, data, max_pixels)


def _other_decode(data: memoryview | bytes, max_pixels: int | None = None) -> np.ndarray:
    """Decode a non-JPEG image as RGB, alpha dropped like torchvision's loader: OpenCV
    (a core dependency: PNG, WebP, BMP, TIFF, GIF from 4.11), else Pillow when it is
    installed; 16-bit samples come out as their high bytes."""
    import cv2

    check_header_budget(data, max_pixels)

    try:
        arr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR) if len(data) else None
    except cv2.error:  # OpenCV asserts on some damaged inputs instead of returning None
        arr = None
    if arr is not None:
        return cv2.cvtColor(arr, cv2.COLOR_BGR2RGB)
    try:
        from PIL import Image
    except ImportError:
        raise DecodeError(f"cannot decode image ({describe_bytes(data)}): OpenCV cannot, and "
                          "Pillow (pip install pillow) is not installed to try") from None
    try:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))
    except (*_PIL_ERRORS, Image.DecompressionBombError) as exc:
        raise DecodeError(f"cannot decode image ({describe_bytes(data)}): {exc}") from exc


def _is_jpeg(data: memoryview | bytes) -> bool:
    return bytes(data[:2]) == _JPEG_SOI


def _jpeg_error(data: memoryview | bytes, exc: Exception, what: str = "JPEG") -> DecodeError:
    """The error for a JPEG the decoder refused: ``unsupported JPEG`` with the reason
    where its frame header is one the decoder cannot read (a 12-bit or 4:4:1 file kept
    by ``pack-dataset --keep-unsupported``, or packed before it checked), else
    ``corrupt``. The frame is read only here, on the error path."""
    try:
        why = jpeg_unsupported(jpeg_frame(data))
    except ValueError:
        why = None
    if why is not None:
        return DecodeError(f"unsupported JPEG ({describe_bytes(data)}): {why}; "
                           "pack-dataset refuses such files unless --keep-unsupported")
    return DecodeError(f"corrupt {what} ({describe_bytes(data)}): {exc}")


def _jpeg_header(data: memoryview | bytes, max_pixels: int | None = None,
                 **scale: int) -> tuple[int, int]:
    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(data, **scale)
    except (ValueError, KeyError) as exc:  # KeyError: simplejpeg 1.9 cannot name 4:4:1
        raise _jpeg_error(data, exc, "JPEG header") from exc
    return within_budget(height, width, data, max_pixels)


def decode_full(data: memoryview | bytes, max_pixels: int | None = None) -> np.ndarray:
    """Decode a whole image to RGB, for users who want it untransformed.

    Args:
        data: Encoded image (JPEG fast; PNG, WebP, BMP, TIFF... through OpenCV).
        max_pixels: the pixel budget (:func:`within_budget`).

    Returns:
        A new ``(height, width, 3)`` uint8 array.

    Raises:
        DecodeError: If the bytes are not a decodable image.
    """
    if not _is_jpeg(data):
        return _other_decode(data, max_pixels)
    _jpeg_header(data, max_pixels)
    try:
        return simplejpeg.decode_jpeg(data, colorspace="RGB")
    except ValueError as exc:
        raise _jpeg_error(data, exc) from exc


def image_size(data: memoryview | bytes, max_pixels: int | None = None) -> tuple[int, int]:
    """``(height, width)`` of an encoded image, from its header alone when it is a JPEG
    (within the pixel budget ``max_pixels``, :func:`within_budget`)."""
    if _is_jpeg(data):
        return _jpeg_header(data, max_pixels)
    hw = _header_hw(data)
    if hw is not None:
        return within_budget(*hw, data, max_pixels)
    return _other_decode(data, max_pixels).shape[:2]  # decoding says what is wrong


def _dct_factor(plan: Plan) -> int:
    """Largest power-of-two reduction that keeps the box at least the output size."""
    x0, y0, x1, y1 = plan.box
    ratio = min((x1 - x0) / plan.size[1], (y1 - y0) / plan.size[0])
    for factor in (8, 4, 2):
        if ratio >= factor:
            return factor
    return 1


def _region_decoder(roi_: bool | None) -> roi.RegionDecoder | None:
    if roi_ is False or (roi_ is None and not roi.available()):
        return None
    if not roi.available():
        raise ImportError(f"roi=True: {roi.unavailable_reason()}")
    return roi.RegionDecoder()


def check_backend(backend: Backend) -> str:
    """The resize backend ``backend`` resolves to here (``"cv2"`` or ``"pillow"``).

    Raises:
        ValueError: not one of ``"auto"``, ``"cv2"``, ``"pillow"``.
        ImportError: the library it needs cannot be imported, saying why (for
            ``"auto"``: why OpenCV could not, when Pillow is missing too).
    """
    if backend not in ("auto", "cv2", "pillow"):
        raise ValueError(f"backend must be 'auto', 'cv2' or 'pillow', not {backend!r}")
    if backend != "pillow":
        try:
            import cv2  # noqa: F401
        except ImportError as exc:
            if backend == "cv2":
                raise ImportError(f"backend='cv2' needs OpenCV, which cannot be imported "
                                  f"({exc}): pip install opencv-python-headless") from exc
            cv2_error = exc
        else:
            return "cv2"
    try:
        import PIL.Image  # noqa: F401
    except ImportError as exc:
        if backend == "pillow":
            raise ImportError(f"backend='pillow' needs Pillow, which cannot be imported ({exc}): "
                              "pip install pillow") from exc
        raise ImportError(f"backend='auto' found no resize library: OpenCV cannot be imported "
                          f"({cv2_error}) and Pillow neither ({exc}); pip install "
                          "opencv-python-headless (a core dependency of shardpack)") from cv2_error
    return "pillow"


def _resolve_backend(backend: Backend) -> str:
    resolved = check_backend(backend)
    if resolved == "cv2":
        import cv2

        # Loader workers are one per core; OpenCV's own thread pool would oversubscribe
        # them (and fork with live threads). This is process-wide, hence only in workers'
        # decoders, which is where Decoder objects are built.
        cv2.setNumThreads(0)
    return resolved


class Decoder:
    """Per-worker decoder: owns a scratch buffer, runs a pipeline into caller buffers.

    Not thread-safe (the scratch buffer is shared between calls); build one per
    worker process.

    Args:
        pipeline: an :class:`reader.transforms.ImagePipeline` (its plan, specs and
            shapes); ``pipeline.output_shape`` is the shape of ``out``.
        backend: ``"cv2"`` (OpenCV, fast), ``"pillow"`` (torchvision's exact
            antialiased bilinear) or ``"auto"`` (cv2 when installed).
        roi: decode only the crop's region of a JPEG (:mod:`reader.transforms.roi`):
            None, when its library is installed; False, never (the whole image,
            as before); True, always (ImportError when it cannot). Callers pass
            the pipeline's ``roi``.
        max_pixels: the pixel budget of every image it decodes (:func:`within_budget`;
            None: :data:`formats.media.MAX_PIXELS`).
    """

    def __init__(self, pipeline, backend: Backend = "auto", *, roi: bool | None = None,
                 max_pixels: int | None = None) -> None:
        self.pipeline = pipeline
        self.max_pixels = max_pixels
        self.backend = _resolve_backend(backend)
        self._region = _region_decoder(roi)
        self._resample = _resample_cv2 if self.backend == "cv2" else _resample_pillow
        self._scratch = np.empty(0, np.uint8)
        self._sample = np.empty(0, np.uint8)  # a varying-size image before step 4
        shape = pipeline.resample_shape
        # User callables or Normalize may change the shape or type; then resample into a
        # reused temporary. (A pipeline whose size varies resamples per sample, see
        # decode_plan.)
        self._staging = None
        if shape is not None and (shape != pipeline.output_shape or pipeline.normalize):
            self._staging = np.empty(shape, np.uint8)

    def decode_into(
        self, data: memoryview | bytes, out: np.ndarray | None, rng: np.random.Generator
    ) -> np.ndarray:
        """Decode ``data``, transform it and write the result into ``out``.

        Args:
            data: Encoded image bytes (a zero-copy view over the shard is fine).
            out: C-contiguous array of ``pipeline.output_shape`` and ``pipeline.dtype``,
                typically a view of a shared-memory batch slot; None: a new array
                (the only choice when the pipeline's output size varies).
            rng: Generator for this sample's random transforms.

        Returns:
            ``out``, filled (or the new array).

        Raises:
            DecodeError: If the bytes are not a decodable image.
            ValueError: If ``out`` has the wrong shape or dtype.
        """
        if not self.pipeline.fixed:
            height, width = self.size_of(data)
            plan = self.pipeline.plan(height, width, rng)
            shape = self.pipeline.output_for(*plan.size)
            if out is None:
                out = np.empty(shape, self.pipeline.dtype)
            elif out.shape != shape or out.dtype != self.pipeline.dtype:
                raise ValueError(f"out must be {self.pipeline.dtype} {shape} for this image, "
                                 f"got {out.dtype} {out.shape}")
            self.decode_plan(data, height, width, plan, out, rng)
            return out
        if out is None:
            out = np.empty(self.pipeline.output_shape, self.pipeline.dtype)
        self._apply_user(self._decode_resample(data, out, rng), out, rng)
        return out

    def size_of(self, data: memoryview | bytes) -> tuple[int, int]:
        """``(height, width)`` of an encoded image, from its header where the format has one."""
        return image_size(data, self.max_pixels)

    def decode_plan(self, data: memoryview | bytes, height: int, width: int, plan: Plan,
                    out: np.ndarray, rng: np.random.Generator) -> float:
        """Decode ``data`` (``height`` x ``width``, from :meth:`size_of`) resampled to
        ``plan`` into ``out``: uint8 ``(*plan.size, 3)`` or, after Normalize, float32
        (rows may be strided: a region of a padded batch). Steps 1-4; returns the
        seconds of step 4 (user callables and Normalize), the rest being decoding."""
        target = out
        if self.pipeline.user or self.pipeline.normalize:
            need = plan.size[0] * plan.size[1] * 3
            self._sample = _grown(self._sample, need)
            target = self._sample[:need].reshape(*plan.size, 3)
        if _is_jpeg(data):
            image, frame = self._decode_box(data, height, width, plan)
        else:
            image, frame = _other_decode(data, self.max_pixels), None
        self._resample_plan(image, height, width, plan, target, frame)
        if target is out:
            return 0.0
        t = time.perf_counter()
        self._apply_user(target, out, rng)
        return time.perf_counter() - t

    def decode_timed(
        self, data: memoryview | bytes, out: np.ndarray, rng: np.random.Generator
    ) -> tuple[float, float]:
        """:meth:`decode_into`, timed as ``(decode_s, transform_s)``.

        ``decode_s`` is the fused decode, crop, resize and flip (steps 1-3 of the
        module docstring: they cannot be told apart, the DCT scale does part of the
        resize); ``transform_s`` is the user callables that run on the result
        (step 4), and exactly 0 when there are none. The loader's monitor reports
        the two as its ``decode`` and ``transform`` stages.

        Raises:
            DecodeError, ValueError: as :meth:`decode_into`.
        """
        t0 = time.perf_counter()
        target = self._decode_resample(data, out, rng)
        if not self.pipeline.user and target is out:
            return time.perf_counter() - t0, 0.0
        t1 = time.perf_counter()
        self._apply_user(target, out, rng)
        return t1 - t0, time.perf_counter() - t1

    def _decode_resample(
        self, data: memoryview | bytes, out: np.ndarray, rng: np.random.Generator
    ) -> np.ndarray:
        """Steps 1-3: decode and resample into ``out`` (or the staging buffer); returns it."""
        if out.shape != self.pipeline.output_shape or out.dtype != self.pipeline.dtype:
            raise ValueError(f"out must be {self.pipeline.dtype} {self.pipeline.output_shape}, "
                             f"got {out.dtype} {out.shape}")
        target = out if self._staging is None else self._staging
        if _is_jpeg(data):
            height, width = _jpeg_header(data, self.max_pixels)
            plan = self.pipeline.plan(height, width, rng)
            image, frame = self._decode_box(data, height, width, plan)
        else:
            image, frame = _other_decode(data, self.max_pixels), None
            height, width = image.shape[:2]
            plan = self.pipeline.plan(height, width, rng)
        self._resample_plan(image, height, width, plan, target, frame)
        return target

    def _resample_plan(self, image: np.ndarray, height: int, width: int, plan,
                       target: np.ndarray, frame: Frame | None = None) -> None:
        """Resample ``plan`` (in the coordinates of the ``height`` x ``width`` original)
        from ``image``: the original at whatever scale it was decoded or, with
        ``frame``, the part of it that :meth:`_decode_box` decoded."""
        top, left, scaled_h, scaled_w = frame or (0, 0, *image.shape[:2])
        # libjpeg rounds scaled sides up, so use the actual ratio, not 1/factor.
        sy, sx = scaled_h / height, scaled_w / width
        x0, y0, x1, y1 = plan.box
        box = (x0 * sx - left, y0 * sy - top, x1 * sx - left, y1 * sy - top)
        self._resample(image, box, target, plan.flip)

    def _decode_box(self, data: memoryview | bytes, height: int, width: int,
                    plan: Plan) -> tuple[np.ndarray, Frame | None]:
        """Step 2: the pixels the plan's box needs, at its DCT scale, and their frame
        for :meth:`_resample_plan` (None: the whole image)."""
        factor = _dct_factor(plan)
        if self._region is not None:
            try:
                found = roi.region_for(self._region, data, height, width, factor, plan.box)
                if found is not None:
                    region, frame = found
                    self._scratch = _grown(self._scratch, region[2] * region[3] * 3)
                    return self._region.decode(data, factor, region, self._scratch), frame
            except RegionError as exc:
                raise _jpeg_error(data, exc) from exc
        return self._decode_scaled(data, height, width, factor), None

    def decode_for_cache(self, data: memoryview | bytes, short_side: int | None
                         ) -> tuple[np.ndarray, int, int, int]:
        """The whole image for a decoded-sample cache: ``(pixels, height, width, scale)``.

        ``height`` x ``width`` is the original size (the geometry is planned on it,
        as on the fused path); the pixels are decoded at the largest DCT scale (1/2,
        1/4, 1/8) that keeps their short side at least ``short_side`` (None: full
        size), and ``scale`` says which (1, 2, 4 or 8), or is 0 when every plan
        decodes this image whole (not a JPEG, or a lossless one: no DCT to scale).
        :meth:`from_cache` needs it. The pixels live in this decoder's scratch
        buffer: copy them before the next call.
        """
        if not _is_jpeg(data):
            image = _other_decode(data, self.max_pixels)
            return image, image.shape[0], image.shape[1], 0
        height, width = _jpeg_header(data, self.max_pixels)
        if not jpeg_dct_scalable(data):
            return self._decode_scaled(data, height, width, 1), height, width, 0
        factor = 1
        if short_side:
            for f in (8, 4, 2):
                if min(height, width) // f >= short_side:
                    factor = f
                    break
        return self._decode_scaled(data, height, width, factor), height, width, factor

    def from_cache(self, data: memoryview | bytes, image: np.ndarray, height: int, width: int,
                   scale: int, out: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
        """Steps 1-4 for a record whose decoded pixels ``image`` are at hand (a cache
        hit, or a miss just decoded by :meth:`decode_for_cache`, with its ``height``,
        ``width`` and ``scale``) into ``out``: exactly the pixels :meth:`decode_timed`
        writes for ``data``.

        The plan is drawn from ``rng`` as the fused path draws it, so the same crop
        and flip. The fused path then decodes the box at :func:`_dct_factor`'s scale,
        and a DCT-scaled decode is not a resample of any other scale's pixels: so the
        crop is resampled from ``image`` only where that scale is ``scale`` (or the
        image is always decoded whole, ``scale`` 0); any other crop is decoded from
        ``data`` as the fused path decodes it (a box at least twice the output each
        way on an image cached at full size; a finer crop of one pre-shrunk to
        ``short_side``).

        Returns:
            ``(decode_s, transform_s)``: seconds decoding (0 when served from
            ``image``) and seconds resampling from ``image`` and in user callables.
        """
        t0 = time.perf_counter()
        target = out if self._staging is None else self._staging
        plan = self.pipeline.plan(height, width, rng)
        decode_s = 0.0
        if scale == 0 or scale == _dct_factor(plan):
            self._resample_plan(image, height, width, plan, target)
        else:
            decoded, frame = self._decode_box(data, height, width, plan)
            self._resample_plan(decoded, height, width, plan, target, frame)
            decode_s = time.perf_counter() - t0
            t0 = time.perf_counter()
        self._apply_user(target, out, rng)
        return decode_s, time.perf_counter() - t0

    def _apply_user(self, result: np.ndarray, out: np.ndarray, rng: np.random.Generator) -> None:
        """Step 4: the user callables and Normalize on the resampled image, into ``out``."""
        for transform in self.pipeline.user:
            result = transform(result, rng)
        norm = self.pipeline.normalize
        if norm is not None:
            size = out.shape[1:] if norm.channels_first else out.shape[:2]
            if result.shape[:2] != size:
                raise ValueError(f"user transforms returned {result.shape}, expected "
                                 f"{out.shape} before Normalize")
            norm(result, out)
        elif result is not out:
            if result.shape != out.shape:
                raise ValueError(f"user transforms returned {result.shape}, expected {out.shape}")
            np.copyto(out, result)

    def _decode_scaled(
        self, data: memoryview | bytes, height: int, width: int, factor: int
    ) -> np.ndarray:
        """Decode at ``1/factor`` of each side into the scratch buffer (whole for a
        lossless JPEG, which has no DCT to scale: callers resample from the shape)."""
        scale = {}
        if factor > 1 and jpeg_dct_scalable(data):
            scale = {"min_height": -(-height // factor), "min_width": -(-width // factor)}
            height, width = _jpeg_header(data, self.max_pixels, **scale)
        self._scratch = _grown(self._scratch, height * width * 3)
        try:
            return simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=self._scratch, **scale)
        except ValueError as exc:
            raise _jpeg_error(data, exc) from exc


def _grown(buffer: np.ndarray, need: int) -> np.ndarray:
    """``buffer`` if it holds ``need`` bytes, else a new one a quarter larger: the
    decoder's buffers only grow, so steady state allocates nothing."""
    return buffer if buffer.size >= need else np.empty(need + need // 4, np.uint8)


def _split_box(box: Box, height: int, width: int, size: tuple[int, int]):
    """Clip ``box`` to the image; returns the clipped box and the ``out`` rows/cols it fills.

    Only CenterCrop on an image smaller than the crop reaches outside; the rest of
    ``out`` is then zero (torchvision pads with zeros).
    """
    x0, y0, x1, y1 = box
    oh, ow = size
    eps = 1e-6  # box coordinates went through float scaling
    if x0 > -eps and y0 > -eps and x1 < width + eps and y1 < height + eps:
        return (max(x0, 0.0), max(y0, 0.0), min(x1, width), min(y1, height)), None
    cx0, cy0, cx1, cy1 = max(x0, 0.0), max(y0, 0.0), min(x1, width), min(y1, height)
    fx, fy = ow / (x1 - x0), oh / (y1 - y0)
    rows = slice(round((cy0 - y0) * fy), round((cy1 - y0) * fy))
    cols = slice(round((cx0 - x0) * fx), round((cx1 - x0) * fx))
    return (cx0, cy0, cx1, cy1), (rows, cols)


def target_region(image: np.ndarray, box: Box, out: np.ndarray):
    """The clipped box and the part of ``out`` it maps to (None when they do not overlap)."""
    clipped, region = _split_box(box, image.shape[0], image.shape[1], out.shape[:2])
    if region is None:
        return clipped, out
    rows, cols = region
    if rows.stop <= rows.start or cols.stop <= cols.start:
        out[...] = 0
        return clipped, None
    # Zero only what the resample will not write: a PadToMultiple or Pad makes this the
    # common case, and zeroing the whole image first cost 6% of the decode.
    out[:rows.start] = 0
    out[rows.stop:] = 0
    out[rows, :cols.start] = 0
    out[rows, cols.stop:] = 0
    return clipped, out[rows, cols]


def _resample_cv2(image: np.ndarray, box: Box, out: np.ndarray, flip: bool) -> None:
    """Integer-crop the box (a view), resize it into ``out`` with OpenCV, mirror in place."""
    import cv2

    (x0, y0, x1, y1), dst = target_region(image, box, out)
    if dst is None:
        return
    # Rounding to whole pixels moves an edge by at most half a decoded pixel; the
    # box is integral anyway unless the DCT scale or a Resize made it fractional.
    ix0, iy0, ix1, iy1 = integer_box((x0, y0, x1, y1), *image.shape[:2])
    src = image[iy0:iy1, ix0:ix1]
    if src.shape == dst.shape:
        np.copyto(dst, src)
    else:
        # Below 2x the DCT scale already did the heavy shrinking: bilinear; past 2x
        # (the 1/8 limit) area averaging (the rule: reader.transforms.resample).
        area = uses_area(src.shape[:2], dst.shape[:2])
        interpolation = cv2.INTER_AREA if area else cv2.INTER_LINEAR
        size = (dst.shape[1], dst.shape[0])
        result = cv2.resize(src, size, dst=dst, interpolation=interpolation)
        if not np.may_share_memory(result, dst):  # OpenCV reallocates on any mismatch
            np.copyto(dst, result)
    if flip:
        cv2.flip(out, 1, dst=out)  # in place, ~4 µs for 224x224


def _resample_pillow(image: np.ndarray, box: Box, out: np.ndarray, flip: bool) -> None:
    """Resize the exact (fractional) box into ``out`` with Pillow's antialiased bilinear."""
    from PIL import Image

    (x0, y0, x1, y1), dst = target_region(image, box, out)
    if dst is not None:
        wx0, wy0 = math.floor(x0), math.floor(y0)
        wx1, wy1 = max(math.ceil(x1), wx0 + 1), max(math.ceil(y1), wy0 + 1)
        # fromarray of a non-contiguous view is ~20x slower than of a contiguous copy.
        src = Image.fromarray(np.ascontiguousarray(image[wy0:wy1, wx0:wx1]))
        resized = src.resize(
            (dst.shape[1], dst.shape[0]),
            Image.Resampling.BILINEAR,
            box=(x0 - wx0, y0 - wy0, x1 - wx0, y1 - wy0),
        )
        if flip and dst is out:
            # Mirror during the one copy out of Pillow instead of a second pass.
            np.copyto(out, np.asarray(resized)[:, ::-1])
            return
        np.copyto(dst, np.asarray(resized))
    if flip:
        out[...] = out[:, ::-1].copy()
