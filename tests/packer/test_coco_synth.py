"""scripts.synth.coco_detection: a deterministic COCO detection set whose boxes fit their shapes."""

from __future__ import annotations

import json

import numpy as np
import simplejpeg

from scripts.synth import DETECTION_CLASSES, coco_detection


def test_coco_detection_is_deterministic_and_consistent(tmp_path):
    images, ann = coco_detection(tmp_path / "a", 6, seed=4, min_side=60, max_side=90,
                                 max_objects=5)
    again = coco_detection(tmp_path / "b", 6, seed=4, min_side=60, max_side=90, max_objects=5,
                           workers=2)
    assert ann.read_bytes() == again[1].read_bytes()
    assert all((images / p.name).read_bytes() == p.read_bytes() for p in again[0].iterdir())
    other = coco_detection(tmp_path / "c", 6, seed=5, min_side=60, max_side=90, max_objects=5)
    assert other[1].read_bytes() != ann.read_bytes()

    doc = json.loads(ann.read_text())
    ids = [c["id"] for c in doc["categories"]]
    assert ids == [1, 3, 7, 13, 21, 31, 43, 57] and [c["name"] for c in doc["categories"]] == \
        list(DETECTION_CLASSES)
    assert [im["id"] for im in doc["images"]] == list(range(1, 7))
    per_image = {im["id"]: 0 for im in doc["images"]}
    for a in doc["annotations"]:
        im = doc["images"][a["image_id"] - 1]
        x, y, w, h = a["bbox"]
        assert a["category_id"] in ids and a["iscrowd"] == 0 and w > 0 and h > 0
        assert x >= 0 and y >= 0 and x + w <= im["width"] and y + h <= im["height"]
        poly = np.array(a["segmentation"][0]).reshape(-1, 2)
        assert poly[:, 0].min() >= x - 1e-6 and poly[:, 0].max() <= x + w + 1e-6
        assert poly[:, 1].min() >= y - 1e-6 and poly[:, 1].max() <= y + h + 1e-6
        assert 0.7 * w * h <= a["area"] <= w * h
        per_image[a["image_id"]] += 1
    assert all(1 <= n <= 5 for n in per_image.values())
    for im in doc["images"]:
        h, w = simplejpeg.decode_jpeg_header((images / im["file_name"]).read_bytes())[:2]
        assert (w, h) == (im["width"], im["height"]) and 60 <= min(w, h) <= max(w, h) <= 90


def test_an_object_is_drawn_in_its_class_colour(tmp_path):
    images, ann = coco_detection(tmp_path, 3, seed=1, min_side=120, max_side=160, max_objects=1)
    doc = json.loads(ann.read_text())
    colours = list(DETECTION_CLASSES.values())
    for a in doc["annotations"]:
        x, y, w, h = a["bbox"]
        img = simplejpeg.decode_jpeg((images / f"{a['image_id'] - 1:06d}.jpg").read_bytes())
        centre = img[y + h // 2 - 2 : y + h // 2 + 2, x + w // 2 - 2 : x + w // 2 + 2]
        k = [c["id"] for c in doc["categories"]].index(a["category_id"])
        assert np.abs(centre.reshape(-1, 3).mean(0) - colours[k]).max() < 40


def test_coco_shapes_are_cocos_photo_shapes(tmp_path):
    import json

    _, ann = coco_detection(tmp_path, 40, seed=2, min_side=48, max_side=64, max_objects=1,
                            shapes="coco")
    sizes = [(im["width"], im["height"]) for im in json.loads(ann.read_text())["images"]]
    assert all(max(s) == 64 and 48 <= min(s) <= 64 for s in sizes)
    landscape = sum(w > h for w, h in sizes)
    assert 0 < landscape < len(sizes)  # both orientations, mostly landscape
    assert landscape > len(sizes) // 2
