"""COCO detection annotations as a listed source: one record per entry of ``images``.

``pack-dataset IMAGES_DIR DST --from coco --annotations instances.json`` lists the
images in the order of the JSON's ``images`` (``--shuffle`` permutes that list) and
gives each record these fields:

========================  ===========================  ===================================
field                     type                         value
========================  ===========================  ===================================
``image``                 ``jpeg``/``png``/``image``   the file as it is (typed by content)
``key``                   ``str``                      the image's ``file_name``
``image_id``              ``int``                      the COCO image id
``height``, ``width``     ``int``                      as the JSON says, checked against
                                                       the image's header
``boxes``                 ``ndarray <f4 [None, 4]``    ``x0, y0, x1, y1`` in pixels: COCO's
                                                       ``[x, y, w, h]`` as ``[x, y, x+w,
                                                       y+h]`` (what torchvision's detection
                                                       models take), clipped to the image
``labels``                ``ndarray <i8 [None]``       the category's index among the
                                                       categories sorted by id (0..K-1,
                                                       detectron2's rule)
``iscrowd``               ``ndarray |u1 [None]``       0 or 1 (0 when absent)
``area``                  ``ndarray <f4 [None]``       as given (the stored box's w*h when
                                                       absent)
``segmentation``          ``json``                     per box, its ``segmentation`` as
                                                       given (polygons or RLE; null when
                                                       absent)
========================  ===========================  ===================================

The per-box arrays hold the image's annotations in the order of the JSON's
``annotations`` (pycocotools' ``imgToAnns`` order). The dataset's ``classes`` are
the category names sorted by category id, so ``classes[labels[i]]`` names box i,
and its ``class_info`` the category objects in that order (with their COCO ``id``).
Boxes are clipped to their image: a box may reach up to :data:`BOX_TOLERANCE` pixel
past an edge (exporters round corners outwards), and is stored with that part cut
off (``[194, 5, 204.9, 10]`` on a 204-wide image becomes ``[194, 5, 204, 10]``, and
``x = -0.9`` becomes 0); an absent ``area`` is the clipped box's. The listing counts
the boxes it clipped (``Listing.boxes_clipped``, in the pack's summary; the boxes
of an image skipped later, for its file, are counted too). An image without
annotations is kept, with ``[0, 4]`` boxes, unless ``--drop-empty`` (then it is
listed as skipped, kind ``no-annotations``, and counted, but never fails a pack).

Bad input is the record's (its image's) problem: the pack fails naming the
annotation file, the image id and the annotation id, or skips the image with
``--on-error skip`` (``skipped.jsonl``, kind in brackets): a ``bbox`` that is not
four numbers, a box with a side <= 0, not finite, reaching more than
:data:`BOX_TOLERANCE` pixel outside the image, or with nothing inside it
(``bad-box``); a category id that ``categories`` does not declare
(``unknown-category``); an annotation id used twice, an area or polygon
coordinate that is not finite, an RLE mask whose size is not the image's, whose
compact ``counts`` string does not decode, or whose counts do not sum to height x
width (``bad-annotation``); an image id listed twice (every entry of it:
``duplicate-image-id``); a ``file_name`` that is absolute or holds ``..``, ``.``,
an empty part, a backslash or NUL (``unsafe-path``: never opened, whatever
``--on-error``); a header whose size differs from ``height``/``width``
(``size-mismatch``); and a missing or broken image file (the kinds of every
source). An annotation whose ``image_id`` no image has is an input of its own,
named ``annotations[K]`` (``no-such-image``). A file that is not COCO's shape
(not an object, no ``images`` list, a value of the wrong type) fails at once
naming the JSON path, e.g. ``annotations[12].bbox`` (not a list).

``--max-side`` scales what is in pixels with the image it shrinks: boxes,
polygon coordinates, area, height and width, each axis by its own factor
(stored size / header size). RLE masks cannot be scaled: a ``--max-side`` that
would shrink an image with an RLE mask is refused before anything is written.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from formats.bounded import parse_json, read_small_file
from formats.errors import InputError, InputUsageError
from formats.fields import Field

from .listing import Listing, image_field

__all__ = ["BOX_TOLERANCE", "FIELDS", "MAX_ANNOTATIONS_BYTES", "NO_ANNOTATIONS", "ImageCheck",
           "list_coco"]

#: The largest annotation file read (2 GiB; COCO's train2017 instances file is 448 MB
#: and parses to about 8 times its size in Python objects).
MAX_ANNOTATIONS_BYTES = 2 << 30
#: How far (pixels) a box may reach past the image's edges: exporters round box
#: corners outwards, and COCO's own files hold boxes a fraction of a pixel out.
BOX_TOLERANCE = 1.0
#: The skip kind of an image ``--drop-empty`` drops.
NO_ANNOTATIONS = "no-annotations"

#: The fields after ``image`` and ``key``, in schema order.
FIELDS = (
    Field("image_id", "int"),
    Field("height", "int"),
    Field("width", "int"),
    Field("boxes", "ndarray", dtype="<f4", shape=(None, 4)),
    Field("labels", "ndarray", dtype="<i8", shape=(None,)),
    Field("iscrowd", "ndarray", dtype="|u1", shape=(None,)),
    Field("area", "ndarray", dtype="<f4", shape=(None,)),
    Field("segmentation", "json"),
)


class _Json:
    """Typed reads from the parsed file; a wrong shape is an InputError naming its JSON path."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, expected: str, value: Any = None) -> InputError:
        return InputError(f"{where}: expected {expected}", path=self.path, found=_what(value))

    def get(self, obj: dict, key: str, where: str, kind: str, *, required: bool = True):
        if key not in obj:
            if required:
                raise InputError(f"{where} has no {key!r}", path=self.path)
            return None
        value = obj[key]
        ok = {"int": lambda v: type(v) is int, "str": lambda v: type(v) is str,
              "list": lambda v: type(v) is list, "number": _number}[kind](value)
        if not ok:
            raise self.fail(f"{where}.{key}" if where != "the top level" else key,
                            {"int": "an integer", "str": "text", "list": "a list",
                             "number": "a number"}[kind], value)
        return value


def _number(v: Any) -> bool:
    return type(v) is int or type(v) is float


def _what(v: Any) -> Any:
    """A value short enough for a message."""
    if type(v) is list:
        return f"a list of {len(v)}"
    if type(v) is dict:
        return "an object"
    if type(v) is str and len(v) > 60:
        return v[:60] + "..."
    return v


@dataclass(frozen=True)
class _Ann:
    index: int  # in the JSON's annotations list
    id: int
    image_id: int
    category_id: int
    bbox: tuple  # [x, y, w, h] as given: four numbers unless _box_problem says otherwise
    area: float | None  # None: absent (then the stored box's area)
    iscrowd: int
    segmentation: Any


def _categories(j: _Json, cats: list) -> list[dict]:
    seen: dict[int, int] = {}
    for i, c in enumerate(cats):
        where = f"categories[{i}]"
        if type(c) is not dict:
            raise j.fail(where, "an object", c)
        cid = j.get(c, "id", where, "int")
        j.get(c, "name", where, "str")
        if cid in seen:
            raise InputError(f"{where}.id: category id {cid} is declared twice (first in "
                             f"categories[{seen[cid]}])", path=j.path)
        seen[cid] = i
    return sorted(cats, key=lambda c: c["id"])


def _segmentation(j: _Json, seg: Any, where: str) -> Any:
    if seg is None:
        return None
    if type(seg) is list:
        for p, poly in enumerate(seg):
            if type(poly) is not list or not all(_number(v) for v in poly):
                raise j.fail(f"{where}[{p}]", "a polygon (a list of numbers)", poly)
            if len(poly) % 2:
                raise j.fail(f"{where}[{p}]", "an even number of coordinates (x, y pairs)", poly)
        return seg
    if type(seg) is dict:
        counts, size = seg.get("counts"), seg.get("size")
        if not (type(counts) is str or (type(counts) is list and
                                         all(type(v) is int and v >= 0 for v in counts))):
            raise j.fail(f"{where}.counts", "an RLE's counts (text, or a list of integers >= 0)",
                         counts)
        if not (type(size) is list and len(size) == 2 and all(type(v) is int for v in size)):
            raise j.fail(f"{where}.size", "an RLE's size [height, width]", size)
        return seg
    raise j.fail(where, "polygons (a list) or an RLE (an object)", seg)


def _annotation(j: _Json, a: Any, k: int) -> _Ann:
    where = f"annotations[{k}]"
    if type(a) is not dict:
        raise j.fail(where, "an object", a)
    # A list whose values are not four numbers is its image's bad box (_box_problem),
    # named with the image and annotation ids, and skippable.
    bbox = j.get(a, "bbox", where, "list")
    area = j.get(a, "area", where, "number", required=False)
    iscrowd = a.get("iscrowd", 0)
    if iscrowd not in (0, 1) or type(iscrowd) not in (int, bool):
        raise j.fail(f"{where}.iscrowd", "0 or 1", iscrowd)
    if len(bbox) == 4 and all(_number(v) for v in bbox):
        bbox = [float(v) for v in bbox]
    return _Ann(k, j.get(a, "id", where, "int"), j.get(a, "image_id", where, "int"),
                j.get(a, "category_id", where, "int"), tuple(bbox),
                None if area is None else float(area), int(iscrowd),
                _segmentation(j, a.get("segmentation"), f"{where}.segmentation"))


def _unsafe(name: str) -> str | None:
    """Why ``file_name`` may not be opened under IMAGES_DIR (None: it may)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "holds a lone surrogate (\\ud800-\\udfff escape), which is not text"
    if not name or name.startswith("/") or "\\" in name or "\0" in name:
        return "is empty, absolute, or holds a backslash or NUL"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "holds a '..', '.' or empty part"
    return None


def _box_problem(a: _Ann, width: int, height: int) -> str | None:
    if len(a.bbox) != 4:
        return f"has {len(a.bbox)} values, not four numbers"
    odd = next((i for i, v in enumerate(a.bbox) if not _number(v)), None)
    if odd is not None:
        return f"holds {_what(a.bbox[odd])!r} at [{odd}], not a number"
    x, y, w, h = a.bbox
    if not all(math.isfinite(v) for v in a.bbox):
        return "is not finite"
    if w <= 0 or h <= 0:
        return f"has width {w:g} and height {h:g}: a box needs both > 0"
    t = BOX_TOLERANCE
    if x < -t or y < -t or x + w > width + t or y + h > height + t:
        return (f"reaches outside the {width}x{height} image (corners ({x:g}, {y:g}) and "
                f"({x + w:g}, {y + h:g})) by more than the {t:g} px tolerance")
    if x >= width or y >= height or x + w <= 0 or y + h <= 0:
        return f"lies outside the {width}x{height} image: nothing is left once clipped to it"
    return None


def _annotation_problem(a: _Ann, width: int, height: int, labels: dict[int, int],
                        reused: set[int]) -> tuple[str, str] | None:
    bad = _box_problem(a, width, height)
    if bad:
        shown = list(a.bbox) if len(a.bbox) <= 8 else _what(list(a.bbox))
        return "bad-box", f"box [x, y, w, h] = {shown} {bad}"
    if a.category_id not in labels:
        return "unknown-category", f"category id {a.category_id} is not in categories"
    if a.id in reused:
        return "bad-annotation", f"annotation id {a.id} is used by more than one annotation"
    if a.area is not None and (not math.isfinite(a.area) or a.area < 0):
        return "bad-annotation", f"area {a.area} is not a finite number >= 0"
    seg = a.segmentation
    if type(seg) is dict and seg["size"] != [height, width]:
        return "bad-annotation", (f"RLE mask of size {seg['size']} (height, width) differs from "
                                  f"its {height}x{width} image")
    if type(seg) is dict:
        bad = _rle_problem(seg["counts"], height * width)
        if bad:
            return "bad-annotation", f"RLE mask {bad}"
    if type(seg) is list and not all(math.isfinite(v) for poly in seg for v in poly):
        return "bad-annotation", "a polygon coordinate is not finite"
    return None


def _rle_problem(counts: str | list[int], pixels: int) -> str | None:
    """Why an RLE's ``counts`` cannot be its image's mask (None: they can): the runs
    must cover the ``pixels`` (height x width) exactly, the compact string once decoded."""
    if type(counts) is str:
        counts = _decode_rle_string(counts)
        if type(counts) is str:
            return counts
    total = sum(counts)
    if total != pixels:
        return (f"counts sum to {total:,} pixels, not the image's {pixels:,} "
                "(height x width)")
    return None


def _decode_rle_string(text: str) -> list[int] | str:
    """The run lengths of a compact RLE string, or why it is not one.

    The form is pycocotools' (``rleToString``/``rleFrString``): each count in 5-bit
    groups, least significant first, written as the character ``'0' + group``, with
    0x20 set on every group but the last and 0x10 of the last group the sign; from
    the fourth count on, each is stored as its difference from the count two before.
    """
    counts: list[int] = []
    x = shift = 0
    for p, ch in enumerate(text):
        c = ord(ch) - 48
        if not 0 <= c < 64:
            return (f"counts string holds {ch!r} at {p}: not a compact RLE (its characters "
                    "run from '0' to 'o')")
        x |= (c & 0x1F) << shift
        shift += 5
        if c & 0x20:
            continue
        if c & 0x10:
            x -= 1 << shift  # the sign: the value is negative
        if len(counts) > 2:
            x += counts[-2]
        if x < 0:
            return f"counts string decodes to a negative run ({x}) as count {len(counts)}"
        counts.append(x)
        x = shift = 0
    if shift:
        return "counts string ends in the middle of a count (a cut string)"
    return counts


def _arrays(anns: list[_Ann], labels: dict[int, int], width: int = 0,
            height: int = 0) -> tuple[dict[str, Any], int]:
    """The per-box columns of one image, its boxes clipped to ``width`` x ``height``;
    and how many boxes the clipping changed."""
    n = len(anns)
    given = np.array([a.bbox for a in anns], np.float64).reshape(n, 4)
    given[:, 2:] += given[:, :2]  # computed in float64, then stored as float32
    xyxy = np.clip(given, 0, [width, height, width, height])
    side = xyxy[:, 2:] - xyxy[:, :2]
    given_area = [a.area for a in anns]
    area = np.array([math.nan if v is None else v for v in given_area], np.float64)
    area = np.where([v is None for v in given_area], side[:, 0] * side[:, 1], area)
    return {
        "boxes": xyxy.astype(np.float32),
        "labels": np.array([labels[a.category_id] for a in anns], np.int64),
        "iscrowd": np.array([a.iscrowd for a in anns], np.uint8),
        "area": area.astype(np.float32),
        "segmentation": [a.segmentation for a in anns],
    }, int((xyxy != given).any(axis=1).sum())


def _placeholder(image_id: int) -> dict[str, Any]:
    """Column values of a record that is never written (a skipped input)."""
    return {"image_id": image_id, "height": 0, "width": 0, **_arrays([], {})[0]}


def list_coco(images_dir: str | Path, annotations: str | Path | None, *, to_jpeg: bool = False,
              drop_empty: bool = False, max_side: int | None = None) -> Listing:
    """List a COCO detection dataset (see the module docstring).

    Args:
        images_dir: the folder that ``file_name`` values are relative to.
        annotations: the COCO JSON (``instances_*.json``).
        to_jpeg: images will be converted to JPEG (the image field's provisional type).
        drop_empty: images without annotations are dropped (counted as skipped).
        max_side: the ``--max-side`` the pack will shrink images to, if any.

    Raises:
        InputUsageError: no such folder or file, or ``max_side`` would shrink an
            image that has an RLE mask.
        InputError: the file is not COCO's shape (names the JSON path), or too large.
    """
    images_dir = Path(images_dir)
    if annotations is None:
        raise InputUsageError("--from coco needs --annotations FILE (the COCO detection JSON)")
    annotations = Path(annotations)
    if not images_dir.is_dir():
        raise InputUsageError("--from coco reads an images folder (SRC)", path=images_dir)
    if not annotations.is_file():
        raise InputUsageError("--annotations: no such file", path=annotations)
    raw = read_small_file(annotations, MAX_ANNOTATIONS_BYTES, "COCO annotation file")
    top = parse_json(raw, path=annotations, what="COCO annotation file", error=InputError,
                     max_bytes=MAX_ANNOTATIONS_BYTES)
    del raw
    j = _Json(annotations)
    if type(top) is not dict:
        raise j.fail("the top level", "an object with 'images'", top)
    images = j.get(top, "images", "the top level", "list")
    cats = _categories(j, j.get(top, "categories", "the top level", "list", required=False) or [])
    anns = [_annotation(j, a, k) for k, a in
            enumerate(j.get(top, "annotations", "the top level", "list", required=False) or [])]
    entries = []
    for i, img in enumerate(images):
        where = f"images[{i}]"
        if type(img) is not dict:
            raise j.fail(where, "an object", img)
        entry = (j.get(img, "id", where, "int"), j.get(img, "file_name", where, "str"),
                 j.get(img, "height", where, "int"), j.get(img, "width", where, "int"))
        if entry[2] <= 0 or entry[3] <= 0:
            raise j.fail(f"{where}.height/width", "positive integers", f"{entry[2]}x{entry[3]}")
        entries.append(entry)
    del top

    labels = {c["id"]: i for i, c in enumerate(cats)}
    listed = Counter(e[0] for e in entries)
    reused = {k for k, n in Counter(a.id for a in anns).items() if n > 1}
    by_image: dict[int, list[_Ann]] = {}
    for a in anns:
        by_image.setdefault(a.image_id, []).append(a)
    _refuse_unscalable(entries, by_image, max_side, annotations)

    name = str(annotations)
    paths, keys, problems, clipped = [], [], {}, 0
    columns: dict[str, list] = {f.name: [] for f in FIELDS}
    for i, (iid, file_name, height, width) in enumerate(entries):
        mine = by_image.get(iid, [])
        paths.append(os.path.join(images_dir, file_name))
        keys.append(file_name)
        about = f"{name}: image id {iid} (images[{i}])"
        problem = None
        unsafe = _unsafe(file_name)
        if unsafe:
            problem = "unsafe-path", f"{about}: file_name {file_name!r} {unsafe}; not opened"
        elif listed[iid] > 1:
            problem = ("duplicate-image-id", f"{about}: image id {iid} is listed {listed[iid]} "
                       "times in images; its annotations cannot be told apart")
        else:
            for a in mine:
                bad = _annotation_problem(a, width, height, labels, reused)
                if bad:
                    problem = bad[0], f"{about}, annotation id {a.id} (annotations[{a.index}]): {bad[1]}"
                    break
        if problem is None and drop_empty and not mine:
            problem = NO_ANNOTATIONS, f"{about}: no annotations (--drop-empty)"
        if problem is None:
            arrays, n = _arrays(mine, labels, width, height)
            values = {"image_id": iid, "height": height, "width": width, **arrays}
            clipped += n
        else:
            problems[i] = problem
            values = _placeholder(iid)
        for k, v in values.items():
            columns[k].append(v)
    image = image_field(paths, to_jpeg)
    known = set(listed)
    for a in anns:  # an annotation of no listed image: an input of its own
        if a.image_id not in known:
            # Its input is the annotation file itself: the error names it once, as its path.
            problems[len(paths)] = ("no-such-image", f"annotation id {a.id} "
                                    f"(annotations[{a.index}]) is for image id {a.image_id}, "
                                    "which images does not list")
            paths.append(name)
            keys.append(f"annotations[{a.index}]")
            for k, v in _placeholder(a.image_id).items():
                columns[k].append(v)
    return Listing("coco", images_dir, paths, keys, columns, (image, Field("key", "str"), *FIELDS),
                   classes=tuple(c["name"] for c in cats), problems=problems,
                   class_info=tuple(cats), check=ImageCheck(name), boxes_clipped=clipped,
                   drop_kinds=frozenset({NO_ANNOTATIONS}) if drop_empty else frozenset())


def _refuse_unscalable(entries, by_image: dict, max_side: int | None, annotations: Path) -> None:
    """An RLE mask cannot follow its image through --max-side: refuse before writing."""
    if max_side is None:
        return
    for iid, _, height, width in entries:
        if max(height, width) <= max_side:
            continue
        for a in by_image.get(iid, ()):
            if type(a.segmentation) is dict:
                raise InputUsageError(
                    f"--max-side {max_side} would shrink image id {iid} ({width}x{height}), "
                    f"whose annotation id {a.id} (annotations[{a.index}]) is an RLE mask, which "
                    "cannot be scaled with it; pack without --max-side (or resize the masks "
                    "yourself)", path=annotations)


@dataclass(frozen=True)
class ImageCheck:
    """A COCO record's check once its image is read (:attr:`Listing.check`).

    Args:
        annotations: the annotation file, as messages name it.
    """

    annotations: str

    def where(self, record: dict) -> str:
        return f"image id {record['image_id']} in {self.annotations}"

    def fit(self, record: dict, stored: tuple[int, int], header: tuple[int, int]
            ) -> tuple[str, str] | None:
        """Check ``record``'s height and width against the image's ``header`` (width,
        height) and, when the image was shrunk to ``stored``, scale its geometry."""
        size = (record["width"], record["height"])
        if size != header:
            return "size-mismatch", (f"{self.where(record)}: the JSON says width x height "
                                     f"{size[0]}x{size[1]}, the image's header "
                                     f"{header[0]}x{header[1]}")
        if stored == header:
            return None
        sx, sy = stored[0] / header[0], stored[1] / header[1]
        record["boxes"] = (record["boxes"] * np.array([sx, sy, sx, sy])).astype(np.float32)
        record["area"] = (record["area"].astype(np.float64) * (sx * sy)).astype(np.float32)
        segs = []
        for seg in record["segmentation"]:
            if type(seg) is dict:  # _refuse_unscalable keeps these from here
                return "bad-annotation", f"{self.where(record)}: an RLE mask cannot be scaled"
            segs.append(None if seg is None else
                        [[v * (sy if k % 2 else sx) for k, v in enumerate(p)] for p in seg])
        record["segmentation"] = segs
        record["width"], record["height"] = stored
        return None
