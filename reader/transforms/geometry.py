"""Annotations that follow their image: boxes and keypoints through a :class:`Plan`.

A plan resamples the source box ``(x0, y0, x1, y1)`` to ``size`` and maybe mirrors
it (:mod:`reader.transforms`). The same map takes every annotation coordinate
from source pixels to output pixels::

    x' = (x - x0) * width / (x1 - x0)        y' = (y - y0) * height / (y1 - y0)
    x' = width - x'                          (when the plan mirrors)

Coordinates are continuous (pixel ``i`` covers ``[i, i + 1)``), as in the plan,
so a box covering a whole image maps to one covering the whole output. Boxes are
``xyxy`` in pixels, the convention of torchvision's detection models and of the
``boxes`` field ``pack-dataset --from coco`` writes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Plan", "Size", "move_boxes", "move_keypoints"]

Size = tuple[int, int]  # (height, width)


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


def _affine(plan: Plan) -> tuple[float, float, float, float]:
    x0, y0, x1, y1 = plan.box
    height, width = plan.size
    return width / (x1 - x0), height / (y1 - y0), x0, y0


def move_boxes(boxes: np.ndarray, plan: Plan, min_size: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Boxes of the source image as boxes of the plan's output.

    Each box is mapped, mirrored with the image, and clipped to the output; a box
    narrower or lower than ``min_size`` output pixels afterwards (cropped away, or
    degenerate from the start) is dropped, as torchvision's ``SanitizeBoundingBoxes``
    does.

    Args:
        boxes: ``[N, 4]`` xyxy in source pixels.
        plan: the image's plan.
        min_size: the smallest side a kept box has, in output pixels.

    Returns:
        ``(moved, keep)``: the kept boxes ``[M, 4]`` float32 and the ``[N]`` mask of
        which input boxes they are (apply it to every per-box field).
    """
    sx, sy, x0, y0 = _affine(plan)
    height, width = plan.size
    b = np.asarray(boxes, np.float32).reshape(-1, 4)
    out = np.empty_like(b)
    out[:, 0::2] = (b[:, 0::2] - x0) * sx
    out[:, 1::2] = (b[:, 1::2] - y0) * sy
    if plan.flip:
        out[:, 0::2] = width - out[:, 2::-2]
    np.clip(out[:, 0::2], 0, width, out=out[:, 0::2])
    np.clip(out[:, 1::2], 0, height, out=out[:, 1::2])
    keep = (out[:, 2] - out[:, 0] >= min_size) & (out[:, 3] - out[:, 1] >= min_size)
    return out[keep], keep


def move_keypoints(points: np.ndarray, plan: Plan, pairs: tuple[tuple[int, int], ...] = ()
                   ) -> np.ndarray:
    """Keypoints ``[N, K, 2 or 3]`` (x, y, visibility) of the source as keypoints of the output.

    A point that lands outside the output gets visibility 0 (it stays in place:
    the keypoints of one instance keep their count). When the plan mirrors, the
    points of each pair in ``pairs`` swap (a left eye becomes the right eye).
    """
    sx, sy, x0, y0 = _affine(plan)
    height, width = plan.size
    p = np.array(points, np.float32, copy=True)
    p[..., 0] = (p[..., 0] - x0) * sx
    p[..., 1] = (p[..., 1] - y0) * sy
    if plan.flip:
        p[..., 0] = width - p[..., 0]
        if pairs:
            a, b = np.array(pairs, np.intp).T
            p[:, np.concatenate([a, b])] = p[:, np.concatenate([b, a])]
    if p.shape[-1] > 2:
        # The far edges count as inside: a box corner keypoint lies exactly there.
        outside = (p[..., 0] < 0) | (p[..., 0] > width) | (p[..., 1] < 0) | (p[..., 1] > height)
        p[..., 2][outside] = 0
    return p
