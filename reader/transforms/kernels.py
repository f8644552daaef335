"""How one geometric :class:`Plan` applies to each kind of field: one kernel per kind.

In the manner of torchvision's transforms v2: the plan is drawn once per sample
(:mod:`reader.transforms.transforms`), and each field of the sample is handed to the
kernel of its kind, found in :data:`KERNELS`. The batch plan
(:mod:`reader.runtime.plan`) says which field is of which kind (from
:class:`reader.Annotations`, or by name and shape) and sizes the slot through the
kernels; the per-sample code (:mod:`reader.transforms.sample`) walks the sample's
fields and dispatches on their kind, naming none.

There are two sorts of kernel:

* **decoded** (``image``, ``mask``): stored bytes decoded straight to the plan's
  output size (:meth:`Kernel.decode`), into a region of the slot or an array of
  :meth:`Kernel.shape`; an image of a fixed output size with nothing following its
  geometry (the classification path of :mod:`reader.runtime.worker`) goes through
  the same kernel's :meth:`Kernel.decode_fixed`, which draws its plan inside the
  fused decode;
* **moved** (``boxes``, ``keypoints``): an array of coordinates in source pixels,
  mapped to output pixels (:meth:`Kernel.move`). A kernel that ``filters`` drops
  rows (boxes cropped away) and says which rows it kept: the per-box fields lose
  the same rows.

Adding a kind of annotation is one :class:`Kernel` subclass registered in
:data:`KERNELS`: its :meth:`Kernel.finds` says which fields are of that kind, its
flags and methods how the plan applies to them. (Naming such fields explicitly, as
``reader.Annotations`` does for boxes, keypoints and masks, would be an option of
its own.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from formats.errors import ArgumentError
from formats.fields import BOXES_FIELD, IMAGE_TYPES

from ..errors import DecodeError
from .decode import check_header_budget, describe_bytes, target_region
from .geometry import Plan, move_boxes, move_keypoints

__all__ = ["KERNELS", "Kernel", "KernelParams", "is_mask_name", "var_rows"]


def is_mask_name(name: str) -> bool:
    return name == "mask" or name.endswith("_mask")


def var_rows(f) -> bool:
    """An ndarray field whose first dimension varies and the rest are fixed."""
    return (f.type == "ndarray" and f.shape and f.shape[0] is None
            and None not in f.shape[1:])


@dataclass(frozen=True)
class KernelParams:
    """What kernels need besides the plan, fixed for a loader's lifetime.

    Attributes:
        min_box_size: boxes smaller than this (output pixels) are dropped.
        keypoint_pairs: keypoint indices a horizontal flip swaps.
    """

    min_box_size: float = 1.0
    keypoint_pairs: tuple[tuple[int, int], ...] = ()


class Kernel:
    """How a plan applies to one kind of field (stateless: one instance per kind).

    Attributes:
        kind: the key in :data:`KERNELS`.
        decoded: the field's bytes are decoded at the plan's size (else an array is moved).
        filters: :meth:`move` drops rows, and returns which rows it kept.
        fractional: integer coordinates are read as float32 (moving makes them fractional).
    """

    kind = ""
    decoded = False
    filters = False
    fractional = False

    def finds(self, field) -> bool:
        """By its name and schema, ``field`` (a ``formats.Field``) is of this kind, where
        the Loader's ``annotations=`` does not say."""
        return False

    def check(self, field, pipeline) -> None:
        """Refuse a schema ``field`` of this kind that ``pipeline`` (an ImagePipeline, or
        None) cannot apply to, naming why (in the main process, before any worker runs).

        Raises:
            ValueError: the field and the pipeline do not fit.
        """

    def shape(self, pipeline, size: tuple[int, ...]) -> tuple[int, ...]:
        """A decoded field's array for an output ``size`` (height, width); with ``()``,
        the dimensions the kernel adds after the sides."""
        raise NotImplementedError

    def dtype(self, pipeline) -> np.dtype:
        raise NotImplementedError

    def size_of(self, array: np.ndarray, channels_first: bool) -> tuple[int, int]:
        """The (height, width) of a decoded field's array."""
        raise NotImplementedError

    def fixed_shape(self, pipeline) -> tuple[int, ...] | None:
        """The shape every array of a fixed-size pipeline must have, or None: not checked."""
        return None

    def decode(self, decoder, data, height: int, width: int, plan: Plan, out: np.ndarray,
               rng: np.random.Generator) -> float:
        """Decode ``data`` (its image is ``height`` x ``width``) through ``plan`` into
        ``out``; returns the seconds spent on user transforms (the rest is decoding).

        Raises:
            DecodeError: the bytes do not decode.
        """
        raise NotImplementedError

    def decode_fixed(self, pipeline, data, out: np.ndarray, rng: np.random.Generator,
                     cache=None, record: int = -1) -> tuple[float, float]:
        """Decode ``data`` into ``out`` (the pipeline's fixed ``output_shape``), drawing
        the plan from ``rng`` on the way, through ``cache`` (a
        :class:`reader.runtime.decoded_cache.DecodedCache`, keyed by ``record``) when
        given; returns ``(decode_s, transform_s)``.

        Raises:
            DecodeError: the bytes do not decode.
        """
        raise NotImplementedError

    def move(self, value: np.ndarray, plan: Plan, params: KernelParams
             ) -> tuple[np.ndarray, np.ndarray | None]:
        """``value`` in the plan's output pixels, and (``filters`` only) the rows kept."""
        raise NotImplementedError


class ImageKernel(Kernel):
    """The image: the fused decode (DCT scale, crop, resize, flip), then user callables."""

    kind = "image"
    decoded = True

    def finds(self, field):
        return field.type in IMAGE_TYPES and not is_mask_name(field.name)

    def shape(self, pipeline, size):
        return pipeline.output_for(*size)

    def dtype(self, pipeline):
        return pipeline.dtype

    def size_of(self, array, channels_first):
        return array.shape[1:] if channels_first else array.shape[:2]

    def fixed_shape(self, pipeline):
        return pipeline.output_shape

    def decode(self, decoder, data, height, width, plan, out, rng):
        return decoder.decode_plan(data, height, width, plan, out, rng)

    def decode_fixed(self, pipeline, data, out, rng, cache=None, record=-1):
        if cache is None:
            return pipeline.run(data, out, rng)
        return pipeline.run_cached(cache, record, data, out, rng)


class MaskKernel(Kernel):
    """A label image (PNG, 8-bit): resampled nearest-neighbour, a label is never blended."""

    kind = "mask"
    decoded = True

    def finds(self, field):
        return is_mask_name(field.name) and field.type in IMAGE_TYPES

    def shape(self, pipeline, size):
        return tuple(size)

    def dtype(self, pipeline):
        return np.dtype(np.uint8)

    def size_of(self, array, channels_first):
        return array.shape

    def decode(self, decoder, data, height, width, plan, out, rng):
        mask = _mask_decode(data, decoder.max_pixels)
        if mask.shape[:2] != (height, width):
            raise DecodeError(f"mask is {mask.shape[0]}x{mask.shape[1]}, its image is "
                              f"{height}x{width}")
        _resample_nearest(mask, plan.box, out, plan.flip)
        return 0.0


class BoxesKernel(Kernel):
    """``[N, 4]`` xyxy boxes: mapped, mirrored, clipped; those under ``min_box_size`` go."""

    kind = "boxes"
    filters = True
    fractional = True

    def finds(self, field):
        return (field.name == BOXES_FIELD and field.type == "ndarray"
                and tuple(field.shape) == (None, 4))

    def move(self, value, plan, params):
        return move_boxes(value, plan, params.min_box_size)


class KeypointsKernel(Kernel):
    """``[N, K, 2 or 3]`` keypoints: mapped, mirrored with their pairs swapped, visibility
    0 outside."""

    kind = "keypoints"
    fractional = True

    def finds(self, field):
        return field.name == "keypoints" and var_rows(field) and len(field.shape) == 3

    def check(self, field, pipeline):
        pairs = getattr(pipeline, "keypoint_pairs", ())
        k = field.shape[1]
        bad = [p for p in pairs if not (0 <= p[0] < k and 0 <= p[1] < k)]
        if bad:
            raise ArgumentError(f"RandomHorizontalFlip(keypoint_pairs=...) names keypoint "
                             f"{bad[0]}; {field.name!r} holds {k} per instance")

    def move(self, value, plan, params):
        return move_keypoints(value, plan, params.keypoint_pairs), None


#: The one table of field kinds: kind -> its kernel.
KERNELS: dict[str, Kernel] = {k.kind: k for k in (ImageKernel(), MaskKernel(), BoxesKernel(),
                                                   KeypointsKernel())}


def _mask_decode(data: memoryview | bytes, max_pixels: int | None) -> np.ndarray:
    """A label mask as stored (PNG, 8-bit, one channel; the first channel of a colour one)."""
    import cv2

    check_header_budget(data, max_pixels)  # before OpenCV allocates what the header declares
    try:
        arr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED) if len(data) else None
    except cv2.error:
        arr = None
    if arr is None:
        raise DecodeError(f"cannot decode mask ({describe_bytes(data)})")
    if arr.dtype != np.uint8:
        raise DecodeError(f"mask holds {arr.dtype} samples; masks are 8-bit label images")
    return arr if arr.ndim == 2 else arr[..., 0]


def _resample_nearest(image: np.ndarray, box, out: np.ndarray, flip: bool) -> None:
    """Nearest-neighbour resample of ``box`` into ``out``: every output pixel is one
    source pixel's label (sampled at its centre), zero outside the image."""
    import cv2

    (x0, y0, x1, y1), dst = target_region(image, box, out)
    if dst is None:
        return
    h, w = image.shape[:2]
    # Centres of the output pixels mapped into the source, as integer indices.
    ys = np.clip(np.floor(y0 + (np.arange(dst.shape[0]) + 0.5) * (y1 - y0) / dst.shape[0]),
                 0, h - 1).astype(np.intp)
    xs = np.clip(np.floor(x0 + (np.arange(dst.shape[1]) + 0.5) * (x1 - x0) / dst.shape[1]),
                 0, w - 1).astype(np.intp)
    dst[...] = image[ys[:, None], xs[None, :]]
    if flip:
        cv2.flip(out, 1, dst=out)
