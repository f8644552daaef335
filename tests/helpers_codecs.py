"""Fixtures for codec, conversion and inspect-shards tests: tiny JPEG datasets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import simplejpeg

from formats import DatasetWriter, Field

CLASSES = ["cat", "dog", "emu"]
IMAGE_FIELDS = (Field("image", "jpeg"), Field("label", "int"), Field("key", "str"))


def make_jpeg(rng: np.random.Generator, h: int = 12, w: int = 16) -> bytes:
    return simplejpeg.encode_jpeg(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), quality=80)


def make_records(rng: np.random.Generator, n: int = 9) -> list[dict]:
    """Records with distinct images, labels cycling over CLASSES, keys like cat/003.jpg."""
    out = []
    for i in range(n):
        h, w = 8 + i % 5, 10 + i % 3
        label = i % len(CLASSES)
        out.append({"image": make_jpeg(rng, h, w), "label": label,
                    "key": f"{CLASSES[label]}/{i:03d}.jpg", "width": w, "height": h})
    return out


def make_dataset(root: Path, records: list[dict], *, records_per_shard: int = 4,
                 fields=IMAGE_FIELDS) -> Path:
    with DatasetWriter(root, fields, classes=CLASSES, records_per_shard=records_per_shard,
                       created_by={"tool": "tests"}, durable=False) as w:
        for r in records:
            w.write({f.name: r[f.name] for f in fields}, {"width": r["width"], "height": r["height"]})
    return root
