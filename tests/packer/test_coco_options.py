"""Every pack option with ``--from coco``: honoured through the one pack loop, or refused."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

import formats
from packer import PackOptions, UsageError, pack
from packer.plan import shuffle_order
from tests.helpers_coco import make_coco
from tests.packer.test_pack_safety import Stop, dataset_files, stop_after


def opts(ann, **kw) -> PackOptions:
    return PackOptions(**{"durable": False, "workers": 0, "annotations": str(ann),
                          "records_per_shard": 2, **kw})


def values(dst) -> list[dict]:
    """Every record, bytes-like values as bytes and arrays as (dtype, shape, values)."""
    ds = formats.open_shards(dst)
    out = []
    for i in range(len(ds)):
        rec = {}
        for k, v in ds[i].items():
            if isinstance(v, memoryview):
                v = bytes(v)
            elif isinstance(v, np.ndarray):
                v = (v.dtype.str, v.shape, v.tolist())
            rec[k] = v
        out.append(rec)
    return out


def test_shuffle_writes_the_seeded_permutation_of_the_images(tmp_path, rng):
    images_dir, ann = make_coco(tmp_path, rng, n=8)
    pack(images_dir, tmp_path / "plain", opts(ann))
    pack(images_dir, tmp_path / "mixed", opts(ann, shuffle=True, seed=7))
    plain, mixed = values(tmp_path / "plain"), values(tmp_path / "mixed")
    assert mixed == [plain[i] for i in shuffle_order(8, 7)] and mixed != plain


def test_an_interrupted_pack_resumes_byte_identical(tmp_path, rng):
    images_dir, ann = make_coco(tmp_path, rng, n=9)
    o = opts(ann, records_per_shard=1, shuffle=True, seed=2)
    with pytest.raises(Stop):
        pack(images_dir, tmp_path / "cut", o, stop_after(4))
    resumed = pack(images_dir, tmp_path / "cut", PackOptions(**{**o.__dict__, "resume": True}))
    assert resumed.complete and resumed.resumed_records > 0
    pack(images_dir, tmp_path / "full", o)
    assert dataset_files(tmp_path / "cut") == dataset_files(tmp_path / "full")
    # Other annotations are another source: the resume is refused.
    doc = json.loads(ann.read_text())
    doc["annotations"][0]["bbox"][0] += 1
    ann.write_text(json.dumps(doc))
    with pytest.raises(Stop):
        pack(images_dir, tmp_path / "cut2", o, stop_after(4))
    doc["annotations"][0]["bbox"][0] -= 2
    ann.write_text(json.dumps(doc))
    with pytest.raises(formats.ShardpackError, match="cannot resume"):
        pack(images_dir, tmp_path / "cut2", PackOptions(**{**o.__dict__, "resume": True}))


def test_workers_change_no_byte_when_images_are_shrunk(tmp_path, rng):
    images_dir, ann = make_coco(tmp_path, rng, n=6, width=60, height=44)
    pack(images_dir, tmp_path / "one", opts(ann, max_side=32))
    pack(images_dir, tmp_path / "two", opts(ann, max_side=32, workers=2))
    assert dataset_files(tmp_path / "one") == dataset_files(tmp_path / "two")
    assert all(max(r["width"], r["height"]) == 32 for r in values(tmp_path / "one"))


def test_to_jpeg_converts_png_images_and_keeps_their_annotations(tmp_path, rng):
    images_dir, ann = make_coco(tmp_path, rng, n=3)
    doc = json.loads(ann.read_text())
    for img in doc["images"]:
        pixels = rng.integers(0, 256, (img["height"], img["width"], 3), dtype=np.uint8)
        name = img["file_name"].replace(".jpg", ".png")
        cv2.imwrite(str(images_dir / name), pixels)
        img["file_name"] = name
    ann.write_text(json.dumps(doc))
    pack(images_dir, tmp_path / "png", opts(ann))
    assert formats.open_shards(tmp_path / "png").fields[0].type == "png"
    pack(images_dir, tmp_path / "jpg", opts(ann, to_jpeg=True))
    ds = formats.open_shards(tmp_path / "jpg")
    assert ds.fields[0].type == "jpeg"
    for a, b in zip(values(tmp_path / "png"), values(tmp_path / "jpg"), strict=True):
        assert {k: v for k, v in a.items() if k != "image"} == \
            {k: v for k, v in b.items() if k != "image"}


@pytest.mark.parametrize("sink", ["webdataset", "tfrecord"])
def test_other_formats_carry_every_field_back_exactly(tmp_path, rng, sink):
    images_dir, ann = make_coco(tmp_path, rng, n=5)
    doc = json.loads(ann.read_text())
    doc["annotations"][0]["iscrowd"] = 1
    doc["annotations"][0]["segmentation"] = {"counts": [3, 4, 1193], "size": [30, 40]}
    ann.write_text(json.dumps(doc))
    pack(images_dir, tmp_path / "direct", opts(ann))
    s = pack(images_dir, tmp_path / sink, opts(ann, sink=sink))
    assert s.complete and s.records_written == 5
    pack(tmp_path / sink, tmp_path / "back", PackOptions(durable=False, workers=0, source=sink))
    assert values(tmp_path / "back") == values(tmp_path / "direct")
    assert formats.open_shards(tmp_path / "back").classes == ("cat", "dog", "car")


@pytest.mark.parametrize("sink", ["parquet", "imagefolder"])
def test_formats_that_would_lose_the_annotations_or_class_names_are_refused(tmp_path, rng, sink):
    images_dir, ann = make_coco(tmp_path, rng, n=2)
    with pytest.raises(UsageError, match=f"--to {sink} keeps"):
        pack(images_dir, tmp_path / "out", opts(ann, sink=sink))
    assert not (tmp_path / "out").exists()


def test_a_reshard_keeps_the_class_info(tmp_path, rng):
    images_dir, ann = make_coco(tmp_path, rng, n=4)
    pack(images_dir, tmp_path / "dst", opts(ann))
    pack(tmp_path / "dst", tmp_path / "again", PackOptions(durable=False, workers=0,
                                                            shuffle=True, seed=1))
    a, b = formats.open_shards(tmp_path / "dst"), formats.open_shards(tmp_path / "again")
    assert b.manifest.class_info == a.manifest.class_info and b.classes == a.classes
