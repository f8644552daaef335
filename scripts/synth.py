"""Synthetic, natural-looking JPEGs for the demo, the tests and the benchmarks.

Flat noise compresses badly and smooth gradients compress too well; neither looks
like a photo to libjpeg, so neither gives realistic decode costs. An image here is
the sum of layers that each mimic one band of a photo's spectrum:

* a low-frequency "scene": a tiny random colour grid upsampled bicubically;
* mid-frequency "texture": a random crop of a multi-octave noise tile, with a
  random per-channel gain (tiles are built once per process from a fixed seed);
* hard edges: a few filled polygons and ellipses in random colours, some textured;
* fine grain: a random crop of a precomputed sensor-noise tile.

Everything per image is drawn from the caller's ``numpy.random.Generator``, and
each file of :func:`make_image_folder` gets its own generator derived from
``(seed, class, index)``, so output bytes depend only on the seed, never on the
number of workers. With the defaults the mean file is about 100 KB for sides of
300 to 500 pixels, like ImageNet's training set.

Only the core dependencies are used (numpy, OpenCV, simplejpeg), so the demo runs
on a bare ``pip install .``. Upsampling is OpenCV's bicubic; shapes are drawn
with sub-pixel precision (``shift``) so that edges are placed as finely as a
float-coordinate drawing would place them.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import time
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import simplejpeg

__all__ = ["DETECTION_CLASSES", "cached_image_folder", "coco_detection", "make_image_folder",
           "make_jpeg", "make_tiny_jpeg", "synth_image"]

_TILE = 640  # tiles are cropped, so images larger than this are tiled by wrapping
_NUM_TILES = 4
_BANK_SEED = 0x5EED  # fixed: the bank is part of the generator, not of a dataset
_TEXTURE_AMPLITUDE = 40.0
# (grid cells across a tile, weight): a 1/f-like falloff, but with enough fine detail
# that the JPEG size resembles a photo's rather than a cartoon's.
_OCTAVES = ((8, 1.0), (24, 0.8), (64, 0.8), (160, 1.0), (320, 1.2))
_GRAIN_AMPLITUDE = 14.0
_SHIFT = 4  # fractional bits of the shape coordinates given to OpenCV's drawing
_ONE = 1 << _SHIFT


def _upsample(small: np.ndarray, width: int, height: int) -> np.ndarray:
    """``small`` resized to (height, width) by bicubic interpolation."""
    return cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)


@functools.lru_cache(maxsize=1)
def _texture_bank() -> tuple[np.ndarray, np.ndarray]:
    """Build the shared texture and grain tiles (int16, HWC), once per process."""
    rng = np.random.default_rng(_BANK_SEED)
    textures = np.empty((_NUM_TILES, _TILE, _TILE, 3), np.int16)
    for t in range(_NUM_TILES):
        acc = np.zeros((_TILE, _TILE, 3), np.float32)
        # Octaves with a 1/f-like falloff; the finest ones carry the "detail".
        for cells, weight in _OCTAVES:
            small = rng.normal(0.0, 1.0, (cells, cells, 3)).astype(np.float32)
            acc += weight * _upsample(small, _TILE, _TILE)
        # Mostly luminance, like real texture; chroma noise would be lost to 4:2:0 anyway.
        acc = acc[..., :1] + 0.3 * acc
        acc *= _TEXTURE_AMPLITUDE / acc.std()
        textures[t] = np.clip(acc, -127, 127).astype(np.int16)
    grain = rng.normal(0.0, _GRAIN_AMPLITUDE, (_TILE, _TILE, 1)) + rng.normal(
        0.0, _GRAIN_AMPLITUDE / 3, (_TILE, _TILE, 3)
    )
    grain = grain.astype(np.int16)
    return textures, grain


def _tile_crop(tile: np.ndarray, rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A random (height, width) window of ``tile``, wrapping when it is too small."""
    y = int(rng.integers(0, tile.shape[0]))
    x = int(rng.integers(0, tile.shape[1]))
    if y + height <= tile.shape[0] and x + width <= tile.shape[1]:
        return tile[y : y + height, x : x + width]
    rows = np.arange(y, y + height) % tile.shape[0]
    cols = np.arange(x, x + width) % tile.shape[1]
    return tile[np.ix_(rows, cols)]


def _fixed(value: float | np.ndarray) -> int | np.ndarray:
    """Pixel coordinates as OpenCV's fixed point (``_SHIFT`` fractional bits)."""
    scaled = np.round(np.asarray(value, np.float64) * _ONE).astype(np.int32)
    return int(scaled) if scaled.ndim == 0 else scaled


def _draw_shapes(rng: np.random.Generator, width: int, height: int) -> tuple[np.ndarray, list]:
    """A uint8 mask of 2 to 6 shapes and the RGB colour of each (mask value = index + 1)."""
    mask = np.zeros((height, width), np.uint8)
    colours = []
    for i in range(int(rng.integers(2, 7))):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        r = rng.uniform(0.08, 0.35) * min(width, height)
        if rng.random() < 0.5:
            # An ellipse in the box (cx - r, cy - r * stretch, cx + r, cy + r).
            top = cy - r * rng.uniform(0.5, 1.5)
            centre = (_fixed(cx), _fixed((top + cy + r) / 2))
            axes = (_fixed(r), _fixed((cy + r - top) / 2))
            cv2.ellipse(mask, centre, axes, 0, 0, 360, i + 1, cv2.FILLED, cv2.LINE_8, _SHIFT)
        else:
            n = int(rng.integers(3, 7))
            angles = np.sort(rng.uniform(0, 2 * np.pi, n))
            radii = r * rng.uniform(0.5, 1.2, n)
            points = np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], 1)
            cv2.fillPoly(mask, [_fixed(points)], i + 1, cv2.LINE_8, _SHIFT)
        colours.append(rng.integers(0, 256, 3))
    return mask, colours


def synth_image(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """Generate one natural-looking RGB image.

    Args:
        rng: Source of all randomness for this image.
        width: Image width in pixels.
        height: Image height in pixels.

    Returns:
        A C-contiguous ``(height, width, 3)`` uint8 array.
    """
    textures, grain = _texture_bank()
    grid = rng.integers(0, 256, (int(rng.integers(2, 6)), int(rng.integers(2, 6)), 3), np.uint8)
    img = _upsample(grid, width, height).astype(np.int16)

    labels, colours = _draw_shapes(rng, width, height)
    palette = np.zeros((len(colours) + 1, 3), np.int16)
    palette[1:] = np.asarray(colours, np.int16)
    inside = labels > 0
    # Shapes replace the scene where they are opaque, so their edges are sharp.
    img[inside] = palette[labels[inside]]

    texture = textures[int(rng.integers(0, _NUM_TILES))]
    gain = rng.uniform(0.4, 1.4, 3).astype(np.float32)
    img += (_tile_crop(texture, rng, height, width) * gain).astype(np.int16)
    img += _tile_crop(grain, rng, height, width)
    return np.clip(img, 0, 255).astype(np.uint8)


def make_jpeg(rng: np.random.Generator, width: int, height: int, quality: int = 90) -> bytes:
    """Encode a :func:`synth_image` as a 4:2:0 JPEG (the common camera/web layout).

    Args:
        rng: Source of all randomness for this image.
        width: Image width in pixels.
        height: Image height in pixels.
        quality: JPEG quality, 1 to 100.

    Returns:
        The JPEG file bytes.
    """
    return simplejpeg.encode_jpeg(
        synth_image(rng, width, height), quality=quality, colorsubsampling="420"
    )


def make_tiny_jpeg(rng: np.random.Generator, width: int = 32, height: int = 24) -> bytes:
    """A small JPEG for fast tests (same generator, just small)."""
    return make_jpeg(rng, width, height, quality=90)


def _write_one(job: tuple[Path, int, int, int, int, int, int]) -> int:
    """Write one file of the tree; returns its size. Module-level so it pickles."""
    path, seed, label, index, min_side, max_side, quality = job
    rng = np.random.default_rng([seed, label, index])
    width, height = (int(s) for s in rng.integers(min_side, max_side + 1, 2))
    data = make_jpeg(rng, width, height, quality)
    path.write_bytes(data)
    return len(data)


def make_image_folder(
    root: str | Path,
    num_classes: int,
    per_class: int,
    *,
    min_side: int = 300,
    max_side: int = 500,
    seed: int = 0,
    quality: int = 90,
    workers: int = 1,
) -> list[Path]:
    """Write an ImageFolder tree ``root/class_XXX/img_XXXXX.jpg``.

    Files are byte-identical for the same arguments whatever ``workers`` is.

    Args:
        root: Directory to create (existing files with the same names are replaced).
        num_classes: Number of class folders.
        per_class: Images per class.
        min_side: Smallest width or height, in pixels.
        max_side: Largest width or height, in pixels.
        seed: Seed for all content and sizes.
        quality: JPEG quality.
        workers: Processes to generate with; 1 generates in this process.

    Returns:
        The paths written, sorted by class then index.
    """
    if not 1 <= min_side <= max_side:
        raise ValueError(f"need 1 <= min_side <= max_side, got {min_side}, {max_side}")
    root = Path(root)
    jobs = []
    for label in range(num_classes):
        folder = root / f"class_{label:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            path = folder / f"img_{index:05d}.jpg"
            jobs.append((path, seed, label, index, min_side, max_side, quality))
    if workers > 1 and len(jobs) > 1:
        with mp.get_context("spawn").Pool(workers) as pool:
            list(pool.imap_unordered(_write_one, jobs, chunksize=64))
    else:
        for job in jobs:
            _write_one(job)
    return [job[0] for job in jobs]


def cached_image_folder(root: str | Path, num_classes: int, per_class: int, **kwargs) -> Path:
    """:func:`make_image_folder` into ``root`` unless a complete one is there already
    (a ``.complete`` marker, written last), for benchmarks that keep their data."""
    import os
    import sys

    root = Path(root)
    marker = root / ".complete"
    if not marker.exists():
        t = time.perf_counter()
        print(f"generating {num_classes * per_class} JPEGs in {root} ...", file=sys.stderr)
        make_image_folder(root, num_classes, per_class, workers=os.cpu_count() or 1, **kwargs)
        marker.write_text(f"{num_classes} {per_class} {kwargs.get('seed', 0)}")
        print(f"  done in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return root


# -- a detection dataset ----------------------------------------------------------------

#: Default class names of :func:`coco_detection`, each drawn in its own colour (RGB).
DETECTION_CLASSES = {
    "red": (220, 30, 30), "green": (30, 190, 60), "blue": (40, 70, 230),
    "yellow": (240, 220, 40), "magenta": (210, 40, 200), "cyan": (40, 210, 220),
    "orange": (245, 140, 20), "white": (245, 245, 245),
}


def _category_id(k: int) -> int:
    """Category ids 1, 3, 7, 13, ...: not contiguous, as COCO's are not."""
    return k * k + k + 1


def _background(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """A scene with texture (no shapes: every object drawn later is annotated), int16."""
    textures, _ = _texture_bank()
    grid = rng.integers(40, 216, (int(rng.integers(2, 6)), int(rng.integers(2, 6)), 3), np.uint8)
    img = _upsample(grid, width, height).astype(np.int16)
    gain = rng.uniform(0.4, 1.0, 3).astype(np.float32)
    texture = textures[int(rng.integers(0, _NUM_TILES))]
    img += (_tile_crop(texture, rng, height, width) * gain).astype(np.int16)
    return img


def _detection_image(job: tuple) -> tuple[int, int, list]:
    """Draw and write one image of :func:`coco_detection`; returns (width, height,
    [(class index, [x, y, w, h], area, polygon), ...]). Module-level so it pickles."""
    path, seed, index, min_side, max_side, max_objects, colours, quality, shapes = job
    rng = np.random.default_rng([seed, index])
    width, height = (int(s) for s in rng.integers(min_side, max_side + 1, 2))
    if shapes == "coco":
        # COCO's photos: the long side max_side, the short one mostly 3/4 of it (here
        # min_side or more), seven in ten landscape.
        short = min_side if rng.random() < 0.6 else int(rng.integers(min_side, max_side + 1))
        width, height = (max_side, short) if rng.random() < 0.7 else (short, max_side)
    img = _background(rng, width, height)
    objects = []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        k = int(rng.integers(0, len(colours)))
        short = min(width, height)
        w, h = (int(v) for v in rng.integers(short // 12, short // 3 + 1, 2))
        x, y = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
        colour = np.asarray(colours[k], np.int16)
        if rng.random() < 0.5:
            img[y : y + h, x : x + w] = colour
            polygon = [x, y, x + w, y, x + w, y + h, x, y + h]
            area = float(w * h)
        else:
            # The ellipse inscribed in the box: its pixels span exactly [x, x + w) x [y, y + h).
            mask = np.zeros((h, w), np.uint8)
            centre, axes = (_fixed((w - 1) / 2), _fixed((h - 1) / 2)), (_fixed(w / 2), _fixed(h / 2))
            cv2.ellipse(mask, centre, axes, 0, 0, 360, 1, cv2.FILLED, cv2.LINE_8, _SHIFT)
            img[y : y + h, x : x + w][mask > 0] = colour
            angles = np.linspace(0, 2 * np.pi, 24, endpoint=False)
            points = np.stack([x + w / 2 + w / 2 * np.cos(angles),
                               y + h / 2 + h / 2 * np.sin(angles)], 1)
            polygon = [round(float(v), 2) for v in points.ravel()]
            area = float(mask.sum())
        objects.append((k, [x, y, w, h], area, polygon))
    _, grain = _texture_bank()
    img += _tile_crop(grain, rng, height, width)
    data = simplejpeg.encode_jpeg(np.clip(img, 0, 255).astype(np.uint8), quality=quality,
                                  colorsubsampling="420")
    path.write_bytes(data)
    return width, height, objects


def coco_detection(root: str | Path, n_images: int = 200, *, seed: int = 0,
                   min_side: int = 480, max_side: int = 640, max_objects: int = 20,
                   classes: Sequence[str] | None = None, quality: int = 90,
                   workers: int = 1, shapes: str = "any") -> tuple[Path, Path]:
    """Write a COCO-style detection dataset: ``root/images/NNNNNN.jpg`` and
    ``root/annotations.json``.

    Each image (sides drawn from ``[min_side, max_side]``, so the aspect ratio varies)
    is a textured scene with 1 to ``max_objects`` filled rectangles and ellipses,
    each in its class's colour (objects may overlap; every box is the whole shape).
    The JSON is COCO's detection format: ``images`` (id = index + 1, file_name,
    height, width), ``annotations`` (id, image_id, category_id, ``bbox`` [x, y, w, h]
    in pixels, area = the shape's pixel count, ``iscrowd`` 0, ``segmentation`` one
    polygon: the rectangle's corners, or 24 points on the ellipse) and
    ``categories`` with the ids 1, 3, 7, 13, ... (not contiguous, like COCO's).
    Bytes depend only on the arguments, never on ``workers``. About 17 ms an image
    on one core at the default sizes, 160 KB on average (2,000 images: some 35 s
    with ``workers=1``, 18 s with ``workers=2`` on the 2-core reference machine).

    Args:
        root: folder to write into (created; files of the same names are replaced).
        n_images: number of images.
        seed: seed of every size, position, class and pixel.
        min_side, max_side: the range of each side, in pixels.
        max_objects: most objects per image (at least one).
        shapes: ``"any"``: both sides drawn from the range (mostly near-square);
            ``"coco"``: COCO's photo shapes, the long side ``max_side``, the short one
            ``min_side`` six times in ten (else drawn from the range), seven in ten
            landscape (what aspect-ratio grouping is for).
        classes: class names (at most 8 unless you want repeated colours); default
            the names of :data:`DETECTION_CLASSES`, which are their colours.
        quality: JPEG quality.
        workers: processes to draw with; 1 draws in this process.

    Returns:
        (images folder, annotation file).
    """
    import json

    if shapes not in ("any", "coco"):
        raise ValueError(f"shapes must be 'any' or 'coco', not {shapes!r}")
    if not 1 <= min_side <= max_side or max_objects < 1 or n_images < 0:
        raise ValueError(f"need 1 <= min_side <= max_side and max_objects >= 1, got "
                         f"{min_side}, {max_side}, {max_objects}")
    names = list(DETECTION_CLASSES) if classes is None else list(classes)
    palette = list(DETECTION_CLASSES.values())
    colours = [palette[k % len(palette)] for k in range(len(names))]
    root = Path(root)
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    jobs = [(images / f"{i:06d}.jpg", seed, i, min_side, max_side, max_objects, colours, quality,
             shapes) for i in range(n_images)]
    if workers > 1 and len(jobs) > 1:
        with mp.get_context("spawn").Pool(workers) as pool:
            drawn = pool.map(_detection_image, jobs, chunksize=32)
    else:
        drawn = [_detection_image(job) for job in jobs]
    out_images, annotations = [], []
    for i, (width, height, objects) in enumerate(drawn):
        out_images.append({"id": i + 1, "file_name": jobs[i][0].name, "height": height,
                           "width": width})
        for k, bbox, area, polygon in objects:
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1,
                                "category_id": _category_id(k), "bbox": bbox, "area": area,
                                "iscrowd": 0, "segmentation": [polygon]})
    categories = [{"id": _category_id(k), "name": n, "supercategory": "shape"}
                  for k, n in enumerate(names)]
    path = root / "annotations.json"
    path.write_text(json.dumps({"images": out_images, "annotations": annotations,
                                "categories": categories}))
    return images, path


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m scripts.synth OUT --classes 10 --per-class 100``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write the ImageFolder tree into")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--min-side", type=int, default=300)
    parser.add_argument("--max-side", type=int, default=500)
    parser.add_argument("--quality", type=int, default=90)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    paths = make_image_folder(
        args.out,
        args.classes,
        args.per_class,
        min_side=args.min_side,
        max_side=args.max_side,
        seed=args.seed,
        quality=args.quality,
        workers=args.workers,
    )
    total = sum(p.stat().st_size for p in paths)
    seconds = time.perf_counter() - start
    print(
        f"{len(paths)} images, {total / 1e6:.1f} MB, mean {total / max(len(paths), 1) / 1e3:.1f} KB, "
        f"{seconds:.1f} s ({len(paths) / seconds:.0f} img/s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
