"""Small COCO detection inputs for the packer tests: tiny JPEGs and their JSON."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers_packer import jpeg

# Declared out of id order: labels follow the sorted ids (3 -> 0, 7 -> 1, 12 -> 2).
CATEGORIES = [{"id": 7, "name": "dog", "supercategory": "animal"},
              {"id": 3, "name": "cat", "supercategory": "animal"},
              {"id": 12, "name": "car", "supercategory": "vehicle"}]
LABEL_OF = {3: 0, 7: 1, 12: 2}


def coco_json(images: list[dict], annotations: list[dict], categories=None) -> dict:
    return {"images": images, "annotations": annotations,
            "categories": CATEGORIES if categories is None else categories}


def make_coco(root: Path, rng, n: int = 9, corrupt: int | None = None, width: int = 40,
              height: int = 30) -> tuple[Path, Path]:
    """``root/images`` with ``n`` JPEGs (image ids 100, 103, ...; the third has no
    annotation), and ``root/annotations.json``; returns both.

    Args:
        corrupt: the index of an image whose JPEG is cut in half (truncated).
    """
    images_dir = root / "images"
    images_dir.mkdir(parents=True)
    images, anns = [], []
    for i in range(n):
        w, h = width + i, height + (i % 3)
        data = jpeg(rng, w, h)
        if i == corrupt:
            data = data[: len(data) // 2]
        (images_dir / f"{i:03d}.jpg").write_bytes(data)
        iid = 100 + 3 * i
        images.append({"id": iid, "file_name": f"{i:03d}.jpg", "height": h, "width": w})
        for k in range(0 if i == 2 else 1 + i % 3):
            x, y = float(rng.uniform(0, w / 2)), float(rng.uniform(0, h / 2))
            bw, bh = float(rng.uniform(1, w - x)), float(rng.uniform(1, h - y))
            anns.append({"id": 1000 + len(anns), "image_id": iid,
                         "category_id": [3, 7, 12][(i + k) % 3], "bbox": [x, y, bw, bh],
                         "area": bw * bh * 0.8, "iscrowd": 0,
                         "segmentation": [[x, y, x + bw, y, x + bw, y + bh]]})
    path = root / "annotations.json"
    path.write_text(json.dumps(coco_json(images, anns)))
    return images_dir, path
