"""Transform specs and the geometry planner of the per-sample decode path.

The specs mirror torchvision's (same names, arguments and random sampling), but
nothing here touches pixels. :meth:`ImagePipeline.plan` folds every geometric
spec into one :class:`Plan`: a box in *source* pixel coordinates, an output size
and a flip flag. :mod:`reader.transforms.decode` then decodes only as much resolution as
the box needs (libjpeg-turbo DCT scaling), resamples the box once, straight into
the caller's output slot, and finally runs any user callables on it.

Order: geometric specs first, then user callables on the image, then at most
one :class:`Normalize`, then :class:`SampleTransform` callables on the whole
sample. When the last geometric spec fixes the output size (RandomResizedCrop,
CenterCrop, ``Resize((h, w))``), ``ImagePipeline.output_shape`` is known before
any image is seen; otherwise (``Resize(int)``, :class:`ResizeShortestEdge`,
:class:`PadToMultiple`, no spec at all) each sample has its own size and the
loader bounds it with :meth:`ImagePipeline.max_output` over the dataset's image
sizes, then pads or concatenates the batch (:mod:`reader.transforms.collate`).

Annotations follow the image: the same :class:`Plan` maps boxes, keypoints and
masks (:mod:`reader.transforms.geometry`), so an image and its boxes can never disagree.

Coordinates are continuous: pixel ``i`` covers ``[i, i + 1)``. A box may reach
outside the image (CenterCrop larger than the image); that part is zero, as in
torchvision's padding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from formats.errors import ArgumentError, ArgumentTypeError

from .decode import Decoder
from .geometry import Plan, Size
from .roi import available as region_decode_available
from .roi import unavailable_reason

__all__ = [
    "CenterCrop",
    "ImagePipeline",
    "Normalize",
    "Pad",
    "PadToMultiple",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "ResizeShortestEdge",
    "SampleTransform",
    "UserTransform",
]


def _as_size(size: int | Sequence[int]) -> Size:
    pair = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
    if len(pair) != 2 or min(pair) <= 0:
        raise ArgumentError(f"size must be a positive int or (height, width), got {size!r}")
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
            raise ArgumentError(f"scale and ratio must be (min, max), got {self.scale}, {self.ratio}")

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

    def _bound(self, h: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.full_like(h, self.size[0]), np.full_like(w, self.size[1])


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

    def _bound(self, h: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.full_like(h, self.size[0]), np.full_like(w, self.size[1])


@dataclass(frozen=True)
class Resize:
    """Resize so the shorter side is ``size`` (int), or to exactly ``(height, width)``.

    Attributes:
        size: the shorter side (int), or the output ``(height, width)``.
        max_size: with an int ``size``, the longer side's bound: an image whose
            longer side would exceed it is resized so that it equals it instead
            (the shorter side then ends up below ``size``), as in torchvision.
    """

    size: int | tuple[int, int]
    max_size: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.size, int):
            object.__setattr__(self, "size", _as_size(self.size))
            if self.max_size is not None:
                raise ArgumentError("max_size applies to Resize(int) only (the shorter side); "
                                 f"Resize({self.size}) has a fixed size")
        elif self.size <= 0:
            raise ArgumentError(f"size must be positive, got {self.size}")
        elif self.max_size is not None and self.max_size <= self.size:
            raise ArgumentError(f"max_size must be larger than size, got {self.max_size} <= {self.size}")

    def _sides(self, short, long):
        new_long = (self.size * long / short).astype(np.int64)  # torchvision truncates too
        new_short = np.full_like(new_long, self.size)
        if self.max_size is not None:
            over = new_long > self.max_size
            new_short = np.where(over, (self.max_size * new_short / np.maximum(new_long, 1))
                                 .astype(np.int64), new_short)
            new_long = np.where(over, self.max_size, new_long)
        return new_short, new_long

    def _apply(self, view: _View, rng: np.random.Generator) -> _View:
        if not isinstance(self.size, int):
            return view.resize(*self.size)
        h, w = view.height, view.width
        s, lg = self._sides(np.array(min(h, w)), np.array(max(h, w)))
        s, lg = int(s), int(lg)
        return view.resize(s, lg) if h <= w else view.resize(lg, s)

    def _bound(self, h: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not isinstance(self.size, int):
            return np.full_like(h, self.size[0]), np.full_like(w, self.size[1])
        s, lg = self._sides(np.minimum(h, w), np.maximum(h, w))
        return np.where(h <= w, s, lg), np.where(h <= w, lg, s)


@dataclass(frozen=True)
class ResizeShortestEdge:
    """detectron2's ``ResizeShortestEdge``: a random shorter side, the longer one bounded.

    Attributes:
        short_edge_length: the shorter side's choices: an int, or a tuple.
        max_size: the longer side's bound (the image is scaled down to it).
        sample_style: ``"choice"`` picks one of ``short_edge_length``;
            ``"range"`` draws an int uniformly from ``[min, max]`` of a pair.
        per_batch: draw one shorter side per batch instead of per image (YOLO-style
            multi-scale training): the images of a batch then differ only by their
            aspect ratio, so padded batches carry far less padding.
    """

    short_edge_length: int | tuple[int, ...]
    max_size: int | None = None
    sample_style: str = "choice"
    per_batch: bool = False

    def __post_init__(self) -> None:
        lengths = ((self.short_edge_length,) if isinstance(self.short_edge_length, int)
                   else tuple(int(x) for x in self.short_edge_length))
        if not lengths or min(lengths) <= 0:
            raise ArgumentError(f"short_edge_length must be positive ints, got {self.short_edge_length!r}")
        if self.sample_style not in ("choice", "range"):
            raise ArgumentError(f"sample_style must be 'choice' or 'range', not {self.sample_style!r}")
        if self.sample_style == "range" and len(lengths) != 2:
            raise ArgumentError(f"sample_style='range' needs (min, max), got {lengths!r}")
        if self.max_size is not None and self.max_size <= 0:
            raise ArgumentError(f"max_size must be positive, got {self.max_size}")
        object.__setattr__(self, "short_edge_length", lengths)

    def _draw(self, rng: np.random.Generator) -> int:
        lengths = self.short_edge_length
        if self.sample_style == "range":
            return int(rng.integers(min(lengths), max(lengths) + 1))
        return lengths[int(rng.integers(len(lengths)))] if len(lengths) > 1 else lengths[0]

    def _sides(self, h, w, size):
        # A record whose header failed has 0 x 0 here (it goes to the bad-input policy):
        # its sides come out 0, without a division by zero.
        scale = size / np.maximum(np.minimum(h, w), 1)
        nh, nw = h * scale, w * scale
        if self.max_size is not None:
            over = np.maximum(nh, nw) / self.max_size
            shrink = np.where(over > 1, over, 1.0)
            nh, nw = nh / shrink, nw / shrink
        return (nh + 0.5).astype(np.int64), (nw + 0.5).astype(np.int64)

    def _apply(self, view: _View, rng: np.random.Generator, drawn: int | None = None) -> _View:
        size = self._draw(rng) if drawn is None else drawn
        nh, nw = self._sides(np.array(view.height, np.float64), np.array(view.width, np.float64),
                             size)
        return view.resize(int(nh), int(nw))

    def _bound(self, h: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # Both sides grow with the drawn length: the largest one bounds them.
        return self._sides(h.astype(np.float64), w.astype(np.float64), max(self.short_edge_length))


@dataclass(frozen=True)
class Pad:
    """Zero-pad the borders: an int pads every side, ``(horizontal, vertical)`` or
    ``(left, top, right, bottom)`` as in torchvision. Boxes and keypoints move with it."""

    padding: int | tuple[int, ...]

    def __post_init__(self) -> None:
        p = self.padding
        p = (p,) * 4 if isinstance(p, int) else tuple(int(x) for x in p)
        if len(p) == 2:
            p = (p[0], p[1], p[0], p[1])
        if len(p) != 4 or min(p) < 0:
            raise ArgumentError(f"padding must be an int >= 0, (horizontal, vertical) or "
                             f"(left, top, right, bottom), got {self.padding!r}")
        object.__setattr__(self, "padding", p)

    def _apply(self, view: _View, rng: np.random.Generator) -> _View:
        left, top, right, bottom = self.padding
        return view.crop(-top, -left, view.height + top + bottom, view.width + left + right)

    def _bound(self, h: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        left, top, right, bottom = self.padding
        return h + top + bottom, w + left + right


@dataclass(frozen=True)
class PadToMultiple:
    """Zero-pad the bottom and right so both sides are multiples of ``multiple`` (the
    ``size_divisibility`` of detectron2's batching; backbones with stride 32 need it)."""

    multiple: int

    def __post_init__(self) -> None:
        if not isinstance(self.multiple, int) or self.multiple < 1:
            raise ArgumentError(f"multiple must be an int >= 1, got {self.multiple!r}")

    def _apply(self, view: _View, rng: np.random.Generator) -> _View:
        m = self.multiple
        return view.crop(0, 0, -(-view.height // m) * m, -(-view.width // m) * m)

    def _bound(self, h: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        m = self.multiple
        return -(-h // m) * m, -(-w // m) * m


@dataclass(frozen=True)
class RandomHorizontalFlip:
    """Mirror left-right with probability ``p``; costs nothing (folded into the resample).

    Attributes:
        p: the probability.
        keypoint_pairs: pairs of keypoint indices that swap roles when mirrored
            (left eye and right eye: ``((1, 2), (3, 4), ...)``); boxes and masks
            need nothing.
    """

    p: float = 0.5
    keypoint_pairs: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        pairs = tuple((int(a), int(b)) for a, b in self.keypoint_pairs)
        object.__setattr__(self, "keypoint_pairs", pairs)

    def _apply(self, view: _View, rng: np.random.Generator) -> _View:
        if rng.random() < self.p:
            return _View(view.box, view.height, view.width, not view.flip)
        return view

    def _bound(self, h: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return h, w


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


@dataclass(frozen=True)
class Normalize:
    """``(pixel / 255 - mean) / std`` as float32, for trainers that take normalized images
    from the CPU (a GPU trainer normalizes on the device: ``reader.DeviceOptions``).

    Attributes:
        mean, std: per channel, on the 0..1 scale (torchvision's ImageNet values by default).
        channels_first: write ``(3, height, width)`` instead of ``(height, width, 3)``.
    """

    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    channels_first: bool = False

    def __post_init__(self) -> None:
        mean, std = tuple(float(x) for x in self.mean), tuple(float(x) for x in self.std)
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ArgumentError(f"mean and std need 3 values, std > 0; got {self.mean}, {self.std}")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)

    def __call__(self, image: np.ndarray, out: np.ndarray) -> None:
        """Write normalized ``image`` (HWC uint8) into ``out`` (float32, HWC or CHW)."""
        scale = np.array([1 / (255 * s) for s in self.std], np.float32)
        shift = np.array([-m / s for m, s in zip(self.mean, self.std, strict=True)], np.float32)
        dst = out.transpose(1, 2, 0) if self.channels_first else out
        np.multiply(image, scale, out=dst)
        dst += shift

    def shape(self, height: int, width: int) -> tuple[int, int, int]:
        return (3, height, width) if self.channels_first else (height, width, 3)


@dataclass(frozen=True)
class SampleTransform:
    """A user callable on the whole sample, run in the workers after the image transforms.

    The sample is a dict of the decoded fields: the image (HWC uint8, or float32
    after :class:`Normalize`) and every annotation and array field of the record
    (``boxes`` already moved with the image). ``fn`` returns the sample (the same
    dict or a new one) with the same fields; arrays may change size (within what
    the loader's batch slots hold), not type. It runs in the worker processes, so
    it must be picklable (a module-level function or a ``functools.partial`` of
    one); the monitor counts its time as ``transform``.

    Attributes:
        fn: ``fn(sample, rng) -> sample`` if ``takes_rng`` else ``fn(sample) -> sample``.
        takes_rng: pass the per-sample generator as a second argument.
    """

    fn: Callable[..., dict]
    takes_rng: bool = False

    def __call__(self, sample: dict, rng: np.random.Generator) -> dict:
        return self.fn(sample, rng) if self.takes_rng else self.fn(sample)


# The geometric specs (fused into one Plan per sample); reader.options checks a
# transform list against them.
GEOMETRIC = (RandomResizedCrop, CenterCrop, Resize, ResizeShortestEdge, Pad, PadToMultiple,
             RandomHorizontalFlip)
_FIXING = (RandomResizedCrop, CenterCrop)  # specs whose output size is fixed (and Resize((h, w)))
Transform = (RandomResizedCrop | CenterCrop | Resize | ResizeShortestEdge | Pad | PadToMultiple
             | RandomHorizontalFlip | UserTransform | Normalize | SampleTransform)


def _fixed_size(geometric) -> Size | None:
    """The output size the geometric specs always give, or None when it depends on the image."""
    size = None
    for t in geometric:
        if isinstance(t, _FIXING) or (isinstance(t, Resize) and not isinstance(t.size, int)):
            size = t.size
        elif isinstance(t, Pad) and size is not None:
            left, top, right, bottom = t.padding
            size = (size[0] + top + bottom, size[1] + left + right)
        elif isinstance(t, PadToMultiple) and size is not None:
            m = t.multiple
            size = (-(-size[0] // m) * m, -(-size[1] // m) * m)
        elif not isinstance(t, RandomHorizontalFlip):
            size = None
    return size


class ImagePipeline:
    """An ordered list of transform specs; call it per sample.

    Plain callables in ``transforms`` are wrapped in :class:`UserTransform` (they
    take and return the image). Calling the pipeline decodes through a lazily
    built :class:`reader.transforms.decode.Decoder` (one per process: it is dropped when the
    pipeline is pickled to a worker).

    Args:
        transforms: geometric specs, then user callables on the image, then at most
            one :class:`Normalize`, then :class:`SampleTransform` callables.
        backend: resize backend for the decoder: ``"auto"``, ``"cv2"`` or ``"pillow"``.
        roi: decode only the region of a JPEG that the crop covers (the same pixels):
            None, when the ``roi`` extra is installed; False, never (every byte of
            the file is then checked, see :mod:`reader.transforms.decode`); True,
            always (ImportError where it cannot).

    Attributes:
        transforms: the specs, callables wrapped.
        geometric, user, samples: the geometric specs, the image callables and the
            whole-sample callables.
        normalize: the :class:`Normalize`, or None.
        resample_shape: ``(height, width, 3)`` after the geometric specs, or None
            when it depends on the image.
        output_shape: the shape of every output image, or None when it varies
            (then :meth:`max_output` bounds it).
        dtype: ``uint8``, or ``float32`` after :class:`Normalize`.
        keypoint_pairs: the keypoint indices a horizontal flip swaps.

    Raises:
        ValueError: the specs are out of order (geometric, image callables,
            Normalize, sample callables), or a callable that changes the image's
            shape follows specs whose output size varies.
    """

    def __init__(
        self,
        transforms: Sequence[Transform | Callable[..., np.ndarray]],
        *,
        backend: str = "auto",
        roi: bool | None = None,
    ) -> None:
        specs = tuple(
            t if isinstance(t, (*GEOMETRIC, UserTransform, Normalize, SampleTransform))
            else UserTransform(t)
            for t in transforms
        )
        geometric = tuple(t for t in specs if isinstance(t, GEOMETRIC))
        user = tuple(t for t in specs if isinstance(t, UserTransform))
        norm = tuple(t for t in specs if isinstance(t, Normalize))
        samples = tuple(t for t in specs if isinstance(t, SampleTransform))
        if specs != geometric + user + norm + samples or len(norm) > 1:
            raise ArgumentError("transforms go in this order: geometric specs (crops, resizes, "
                             "flips, pads), then callables on the image, then at most one "
                             "Normalize, then SampleTransform callables")
        size = _fixed_size(geometric)
        if size is None and any(t.output_shape for t in user):
            raise ArgumentError("a callable that changes the image's shape (output_shape=) needs "
                             "geometric specs with a fixed output size before it")
        self.transforms = specs
        self.geometric = geometric
        self.user = user
        self.normalize = norm[0] if norm else None
        self.samples = samples
        self.backend = backend
        if roi is not None and not isinstance(roi, bool):
            raise ArgumentTypeError(f"roi must be None, True or False, not {roi!r}")
        if roi and not region_decode_available():  # here, not in a worker at its first image
            raise ImportError(f"roi=True: {unavailable_reason()}")
        self.roi = roi
        self.keypoint_pairs = tuple(p for t in geometric if isinstance(t, RandomHorizontalFlip)
                                    for p in t.keypoint_pairs)
        self.dtype = np.dtype(np.float32 if self.normalize else np.uint8)
        self.resample_shape: tuple[int, int, int] | None = None
        self.output_shape: tuple[int, ...] | None = None
        if size is not None:
            self.resample_shape = (*size, 3)
            shape = (*size, 3)
            for t in user:
                shape = t.output_shape or shape
            self.output_shape = (self.normalize.shape(*shape[:2]) if self.normalize
                                 else shape)
        self._decoder = None

    @property
    def fixed(self) -> bool:
        """Every output image has the same shape (:attr:`output_shape`)."""
        return self.output_shape is not None

    def output_for(self, height: int, width: int) -> tuple[int, ...]:
        """The output shape of an image the geometric specs made ``height`` x ``width``."""
        return self.normalize.shape(height, width) if self.normalize else (height, width, 3)

    def max_output(self, heights, widths) -> tuple[int, int]:
        """The largest output ``(height, width)`` over source images of these sizes
        (arrays), whatever the random draws."""
        h = np.asarray(heights, np.int64)
        w = np.asarray(widths, np.int64)
        for t in self.geometric:
            h, w = t._bound(h, w)
        if h.size == 0:
            return 1, 1
        return int(h.max()), int(w.max())

    def __repr__(self) -> str:
        roi = "" if self.roi is None else f", roi={self.roi!r}"
        return f"ImagePipeline({list(self.transforms)!r}, backend={self.backend!r}{roi})"

    def __getstate__(self) -> dict:
        # The decoder's scratch buffer is per process; workers build their own.
        return {**self.__dict__, "_decoder": None}

    @property
    def per_batch(self) -> bool:
        """Some spec draws once per batch (:meth:`batch_draws`), not per image."""
        return any(getattr(t, "per_batch", False) for t in self.geometric)

    def batch_draws(self, rng: np.random.Generator) -> tuple:
        """The draws of the specs that draw once per batch (None for the others), from
        the batch's stream, before any image's plan."""
        return tuple(t._draw(rng) if getattr(t, "per_batch", False) else None
                     for t in self.geometric)

    def plan(self, height: int, width: int, rng: np.random.Generator,
             draws: tuple | None = None) -> Plan:
        """Fold the geometric specs into one :class:`Plan` for a ``height`` x ``width`` image.

        ``draws``: the batch's :meth:`batch_draws`; without them, an image is a batch of
        its own (its per-batch specs draw here)."""
        if draws is None and self.per_batch:
            draws = self.batch_draws(rng)
        view = _View((0.0, 0.0, float(width), float(height)), height, width)
        for i, t in enumerate(self.geometric):
            if draws is not None and draws[i] is not None:
                view = t._apply(view, rng, draws[i])
            else:
                view = t._apply(view, rng)
        return Plan(view.box, (view.height, view.width), view.flip)

    def __call__(
        self,
        data: bytes | memoryview,
        out: np.ndarray | None = None,
        rng: np.random.Generator | None = None,
    ) -> np.ndarray:
        """Decode and transform one encoded image (see :meth:`reader.transforms.decode.Decoder.decode_into`).

        Args:
            data: Encoded image bytes.
            out: Destination of ``output_shape``; a new array when None (needed
                when the output size varies).
            rng: Generator for the random transforms; a fresh unseeded one when None.

        Returns:
            ``out``, filled (or the new array).
        """
        if self._decoder is None:
            self._decoder = Decoder(self, backend=self.backend, roi=self.roi)
        return self._decoder.decode_into(data, out, rng or np.random.default_rng())
