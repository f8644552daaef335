"""``--from coco`` against pycocotools reading the same JSON, image by image."""

from __future__ import annotations

import json

import numpy as np
import pytest

import formats
from packer import PackOptions, pack
from scripts.synth import coco_detection

coco_api = pytest.importorskip("pycocotools.coco", reason="pip install 'shardpack[dev]'")
mask_api = pytest.importorskip("pycocotools.mask")


def _with_crowd(ann_path, images_dir) -> None:
    """Add what the generator never draws: a crowd RLE mask (COCO's compressed
    counts, as text), an annotation without area or segmentation, and an image
    without annotations; shuffle the annotations so the order is not by image."""
    doc = json.loads(ann_path.read_text())
    img = doc["images"][1]
    mask = np.zeros((img["height"], img["width"]), np.uint8, order="F")
    mask[5:25, 10:40] = 1
    rle = mask_api.encode(np.asfortranarray(mask))
    rle["counts"] = rle["counts"].decode("ascii")
    doc["annotations"].append({"id": 90001, "image_id": img["id"], "category_id": 7,
                               "bbox": [10, 5, 30, 20], "area": 600.0, "iscrowd": 1,
                               "segmentation": rle})
    doc["annotations"].append({"id": 90002, "image_id": doc["images"][0]["id"],
                               "category_id": 3, "bbox": [1.5, 2.25, 7.125, 9.5]})
    first = doc["images"][0]
    doc["images"].append({"id": 5000, "file_name": "copy.jpg", "height": first["height"],
                          "width": first["width"]})
    (images_dir / "copy.jpg").write_bytes((images_dir / "000000.jpg").read_bytes())
    doc["annotations"] = [doc["annotations"][i] for i in
                          np.random.default_rng(0).permutation(len(doc["annotations"]))]
    doc["categories"] = doc["categories"][::-1]  # declared in descending id order
    ann_path.write_text(json.dumps(doc))


@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")
def test_shards_hold_what_pycocotools_reads(tmp_path):
    images_dir, ann = coco_detection(tmp_path / "coco", 12, seed=3, min_side=48, max_side=80,
                                     max_objects=6)
    _with_crowd(ann, images_dir)
    pack(images_dir, tmp_path / "dst", PackOptions(annotations=str(ann), workers=0,
                                                   durable=False))
    ds = formats.open_shards(tmp_path / "dst")
    coco = coco_api.COCO(str(ann))
    cat_ids = sorted(coco.getCatIds())
    assert ds.classes == tuple(coco.loadCats(c)[0]["name"] for c in cat_ids)
    assert [c["id"] for c in ds.manifest.class_info] == cat_ids
    assert [ds[i]["image_id"] for i in range(len(ds))] == [im["id"] for im in coco.dataset["images"]]
    crowd = 0
    for i in range(len(ds)):
        rec = ds[i]
        info = coco.loadImgs(rec["image_id"])[0]
        assert (rec["key"], rec["height"], rec["width"]) == (info["file_name"], info["height"],
                                                             info["width"])
        anns = coco.imgToAnns[rec["image_id"]]  # pycocotools' own per-image order
        assert len(rec["boxes"]) == len(anns)
        for j, a in enumerate(anns):
            x, y, w, h = a["bbox"]
            np.testing.assert_array_equal(rec["boxes"][j], np.float32([x, y, x + w, y + h]))
            assert cat_ids[rec["labels"][j]] == a["category_id"]
            assert rec["iscrowd"][j] == a.get("iscrowd", 0)
            assert rec["area"][j] == np.float32(a.get("area", w * h))
            assert rec["segmentation"][j] == a.get("segmentation")
            if a.get("iscrowd"):
                crowd += 1
                # The stored RLE decodes to the mask pycocotools makes of the annotation.
                np.testing.assert_array_equal(mask_api.decode(rec["segmentation"][j]),
                                              coco.annToMask(a))
    assert crowd == 1 and any(len(ds[i]["boxes"]) == 0 for i in range(len(ds)))
