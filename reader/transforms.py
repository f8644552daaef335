"""Transform specs and the geometry planner of the per-sample decode path.

The specs mirror torchvision's (same names, arguments and random sampling), but
nothing here touches pixels. :meth:`ImagePipeline.plan` folds every geometric
spec into one :class:`Plan`: a box in *source* pixel coordinates, an output size
and a flip flag. :mod:`reader.decode` then decodes only as much resolution as
the box needs (libjpeg-turbo DCT scaling), resamples the box once, straight into
the caller's output slot, and finally runs any user callables on it.

Invariant: geometric specs come first and the last one fixes the output size, so
``ImagePipeline.output_shape`` is known before any image is seen (the loader
sizes its shared-memory slots with it). User callables come last and must keep
that shape unless they declare another one.

Coordinates are continuous: pixel ``i`` covers ``[i, i + 1)``. A box may reach
outside the image (CenterCrop larger than the image); that part is zero, as in
torchvision's padding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CenterCrop",
    "ImagePipeline",
    "Pipeline",
    "Plan",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "UserTransform",
]

Size = tuple[int, int]  # (height, width)


def _as_size(size: int | Sequence[int]) -> Size:
    pair = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
    if len(pair) != 2 or min(pair) <= 0:
        raise ValueError(f"size must be a positive int or (height, width), got {size!r}")
    return pair  # type: ignore[return-value]


@dataclass(frozen=True)
class _View:
    """The image as the pipeline currently sees it: a box over the source, shown at a size."""

    box: tuple[float, float, float, float]  # x0, y0, x1, y1 in source pixels
    height: int
    width: int
    flip: bool = False

    def crop(self, top: int, left: int, height: int, width: int) -> _View:
        """Crop in the current view's pixels; the result keeps that pixel size."""
        if self.flip:
            # A crop of the mirrored view is the mirrored crop of the unmirrored one.
            left = self.width - left - width
        x0, y0, x1, y1 = self.box
        sx, sy = (x1 - x0) / self.width, (y1 - y0) / self.height
        box = (x0 + left * sx, y0 + top * sy, x0 + (left + width) * sx, y0 + (top + height) * sy)
        return _View(box, height, width, self.flip)

    def resize(self, height: int, width: int) -> _View:
        return _View(self.box, height, width, self.flip)


@dataclass(frozen=True)
class Plan:
    """What to do to one image: resample ``box`` (source pixels) to ``size``, maybe mirrored.

    Attributes:
        box: ``(x0, y0, x1, y1)`` in source pixel coordinates; may be fractional
            and may reach outside the image.
        size: Output ``(height, width)``.
        flip: Mirror left-right after resampling.
    """

    box: tuple[float, float, float, float]
    size: Size
    flip: bool


@dataclass(frozen=True)
class RandomResizedCrop:
    """Crop a random area and aspect ratio, resized to ``size`` (torchvision's sampling).

    Attributes:
        size: Output ``(height, width)``; an int means a square.
        scale: Range of the crop's area as a fraction of the image's.
        ratio: Range of the crop's aspect ratio (width / height), sampled log-uniformly.
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _as_size(self.size))
        if self.scale[0] > self.scale[1] or self.ratio[0] > self.ratio[1]:
            raise ValueError(f"scale and ratio must be (min, max), got {self.scale}, {self.ratio}")

    def get_params(
        self, height: int, width: int, rng: np.random.Generator
    ) -> tuple[int, int, int, int]:
        """Sample ``(top, left, crop_height, crop_width)`` exactly as torchvision does.

        Ten tries at a random area and log-uniform aspect ratio; if none fits, the
        largest centred crop whose ratio is clamped into ``ratio``.
        """
        area = height * width
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_lo, log_hi))
            w = round(math.sqrt(target_area * aspect))
            h = round(math.sqrt(target_area / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                return top, left, h, w
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w, h = width, round(width / min(self.ratio))
        elif in_ratio > max(self.ratio):
            w, h = round(height * max(self.ratio)), height
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def _apply(self, view: _View, rng: np.random.Generator) -> _View:
        top, left, h, w = self.get_params(view.height, view.width, rng)
        return view.crop(top, left, h, w).resize(*self.size)


@dataclass(frozen=True)
class CenterCrop:
    """Crop the centre to ``size``, zero-padding an image smaller than it (torchvision's rounding)."""

    size: int | tuple[int, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _as_size(self.size))

    def _apply(self, view: _View, rng: np.random.Generator) -> _View:
        ch, cw = self.size
        # torchvision pads (floor on the left/top) then crops; as a box that is the
        # same as a crop at a negative offset.
        top = -((ch - view.height) // 2) if ch > view.height else round((view.height - ch) / 2)
        left = -((cw - view.width) // 2) if cw > view.width else round((view.width - cw) / 2)
        return view.crop(int(top), int(left), ch, cw)


@dataclass(frozen=True)
class Resize:
    """Resize so the shorter side is ``size`` (int), or to exactly ``(height, width)``."""

    size: int | tuple[int, int]

    def __post_init__(self) -> None:
        if not isinstance(self.size, int):
            object.__setattr__(self, "size", _as_size(self.size))
        elif self.size <= 0:
            raise ValueError(f"size must be positive, got {self.size}")

    def _apply(self, view: _View, rng: np.random.Generator) -> _View:
        if not isinstance(self.size, int):
            return view.resize(*self.size)
        short, long = sorted((view.height, view.width))
        new_long = int(self.size * long / short)  # torchvision truncates here too
        if view.height <= view.width:
            return view.resize(self.size, new_long)
        return view.resize(new_long, self.size)


@dataclass(frozen=True)
class RandomHorizontalFlip:
    """Mirror left-right with probability ``p``; costs nothing (folded into the resample)."""

    p: float = 0.5

    def _apply(self, view: _View, rng: np.random.Generator) -> _View:
        if rng.random() < self.p:
            return _View(view.box, view.height, view.width, not view.flip)
        return view


@dataclass(frozen=True)
class UserTransform:
    """A user callable on HWC uint8 arrays, run after the geometric specs.

    Attributes:
        fn: ``fn(image, rng) -> image`` if ``takes_rng`` else ``fn(image) -> image``.
            It may modify and return its input; it must return an HWC uint8 array of
            ``output_shape`` (or of the incoming shape when that is None).
        output_shape: The ``(height, width, 3)`` it returns, if it changes the shape.
        takes_rng: Pass the per-sample generator as a second argument.
    """

    fn: Callable[..., np.ndarray]
    output_shape: tuple[int, int, int] | None = None
    takes_rng: bool = False

    def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self.fn(image, rng) if self.takes_rng else self.fn(image)


_GEOMETRIC = (RandomResizedCrop, CenterCrop, Resize, RandomHorizontalFlip)
Transform = RandomResizedCrop | CenterCrop | Resize | RandomHorizontalFlip | UserTransform


class ImagePipeline:
    """An ordered list of transform specs with a fixed output shape; call it per sample.

    Plain callables in ``transforms`` are wrapped in :class:`UserTransform`. Calling
    the pipeline decodes through a lazily built :class:`reader.decode.Decoder`
    (one per process: it is dropped when the pipeline is pickled to a worker).

    Args:
        transforms: Geometric specs first, then user callables.
        backend: Resize backend for the decoder: ``"auto"``, ``"cv2"`` or ``"pillow"``.

    Attributes:
        transforms: The specs, callables wrapped.
        geometric: The geometric specs.
        user: The user callables.
        resample_shape: ``(height, width, 3)`` after the geometric specs.
        output_shape: ``(height, width, 3)`` of every output.

    Raises:
        ValueError: If a geometric spec follows a user callable, or the output
            size is not fixed (e.g. only ``Resize(int)``).
    """

    def __init__(
        self,
        transforms: Sequence[Transform | Callable[..., np.ndarray]],
        *,
        backend: str = "auto",
    ) -> None:
        specs = tuple(
            t if isinstance(t, (*_GEOMETRIC, UserTransform)) else UserTransform(t)
            for t in transforms
        )
        geometric = tuple(t for t in specs if isinstance(t, _GEOMETRIC))
        user = tuple(t for t in specs if isinstance(t, UserTransform))
        if specs != geometric + user:
            raise ValueError("geometric transforms must come before user callables")
        size = None
        for t in geometric:
            if isinstance(t, (RandomResizedCrop, CenterCrop)) or (
                isinstance(t, Resize) and not isinstance(t.size, int)
            ):
                size = t.size
            elif isinstance(t, Resize):
                size = None
        if size is None:
            raise ValueError(
                "the output size must be fixed: end the geometric transforms with "
                "RandomResizedCrop, CenterCrop or Resize((h, w))"
            )
        shape = (*size, 3)
        for t in user:
            shape = t.output_shape or shape
        self.transforms = specs
        self.geometric = geometric
        self.user = user
        self.backend = backend
        self.resample_shape: tuple[int, int, int] = (*size, 3)
        self.output_shape: tuple[int, int, int] = shape
        self._decoder = None

    def __repr__(self) -> str:
        return f"ImagePipeline({list(self.transforms)!r}, backend={self.backend!r})"

    def __getstate__(self) -> dict:
        # The decoder's scratch buffer is per process; workers build their own.
        return {**self.__dict__, "_decoder": None}

    def plan(self, height: int, width: int, rng: np.random.Generator) -> Plan:
        """Fold the geometric specs into one :class:`Plan` for a ``height`` x ``width`` image."""
        view = _View((0.0, 0.0, float(width), float(height)), height, width)
        for t in self.geometric:
            view = t._apply(view, rng)
        return Plan(view.box, (view.height, view.width), view.flip)

    def __call__(
        self,
        data: bytes | memoryview,
        out: np.ndarray | None = None,
        rng: np.random.Generator | None = None,
    ) -> np.ndarray:
        """Decode and transform one encoded image (see :meth:`reader.decode.Decoder.decode_into`).

        Args:
            data: Encoded image bytes.
            out: Destination of ``output_shape``; a new array when None.
            rng: Generator for the random transforms; a fresh unseeded one when None.

        Returns:
            ``out``, filled.
        """
        if self._decoder is None:
            from reader.decode import Decoder

            self._decoder = Decoder(self, backend=self.backend)
        if out is None:
            out = np.empty(self.output_shape, np.uint8)
        return self._decoder.decode_into(data, out, rng or np.random.default_rng())


Pipeline = ImagePipeline  # the name reader.imaging and torchvision users reach for
