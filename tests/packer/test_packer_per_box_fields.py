"""Detection fields inferred by pack_samples have a variable first dimension, so the
Loader reads them as boxes; where a dataset's boxes are fixed, its hint names the schema."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import simplejpeg

import formats
import reader
from formats import DatasetWriter, Field
from formats.fields import BOXES_FIELD, PER_BOX_NAMES
from packer import format_summary
from packer.schema import infer_fields
from reader.transforms import Resize
from tests.helpers_packer import pack_fn

FAST = {"durable": False, "progress": False, "workers": 0}


def three_boxes(i):
    """Every sample has exactly 3 boxes (and their per-box fields); emb is not per box."""
    img = np.full((32, 48, 3), 40 * (i % 5), np.uint8)
    return {"image": simplejpeg.encode_jpeg(img), "boxes": np.float32([[0, 0, 8, 8],
                                                                       [4, 4, 20, 16],
                                                                       [10, 2, 40, 30]]) + i,
            "labels": np.int64([1, 2, 3]), "area": np.float32([64, 192, 840]),
            "keypoints": np.zeros((3, 5, 3), np.float32), "emb": np.zeros((3, 4), np.float32)}


def test_every_default_annotation_name_is_inferred_with_a_variable_first_dimension():
    names = sorted(PER_BOX_NAMES | {BOXES_FIELD})
    sample = {n: np.zeros((3, 2), np.float32) for n in names} | {"other": np.zeros((3, 2))}
    fields = {f.name: f.shape for f in infer_fields([("input 0", sample), ("input 1", sample)])}
    assert fields == {**{n: (None, 2) for n in names}, "other": (3, 2)}
    # A scalar array has no first dimension to widen; other types are left as they are.
    scalars = {"area": np.float32(2.5), "labels": [1, 2], "scores": np.array(0.5)}
    assert [(f.name, f.type, f.shape) for f in infer_fields([("input 0", scalars)])] == [
        ("area", "float", None), ("labels", "json", None), ("scores", "ndarray", ())]


def test_three_boxes_everywhere_pack_as_boxes_the_loader_moves_with_the_image(tmp_path):
    s = pack_fn(three_boxes, range(6), tmp_path / "ds", **FAST)
    ds = formats.open_shards(tmp_path / "ds")
    shapes = {f.name: f.shape for f in ds.fields if f.type == "ndarray"}
    assert shapes == {"boxes": (None, 4), "labels": (None,), "area": (None,),
                      "keypoints": (None, 5, 3), "emb": (3, 4)}
    assert s.per_box_fields == ("boxes", "labels", "area", "keypoints")
    assert s.to_json()["per_box_fields"] == ["boxes", "labels", "area", "keypoints"]
    assert re.search(r"^per-box fields +boxes, labels, area, keypoints \(inferred with a "
                     r"variable first dimension", format_summary(s), re.M)
    with reader.Loader(tmp_path / "ds", 2, num_workers=0, transform=[Resize((16, 24))], fields=("image", "boxes", "labels")) as lo:
        batch = next(iter(lo))
    np.testing.assert_allclose(batch["boxes"][0], np.float32([[0, 0, 4, 4], [2, 2, 10, 8],
                                                              [5, 1, 20, 15]]))
    assert batch["labels"][0].tolist() == [1, 2, 3]


def test_a_given_schema_is_kept_and_not_reported(tmp_path):
    schema = {"image": "jpeg", "boxes": "float32[3,4]", "labels": "int64[None]",
              "area": "float32[None]", "keypoints": "float32[None,5,3]", "emb": "float32[3,4]"}
    s = pack_fn(three_boxes, range(2), tmp_path / "ds", schema=schema, **FAST)
    assert s.per_box_fields == () and "per-box" not in format_summary(s)
    shapes = {f.name: f.shape for f in formats.open_shards(tmp_path / "ds").fields}
    assert shapes["boxes"] == (3, 4)  # as declared: the user said so


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fixed_boxes_get_a_hint_that_names_the_schema_fix(tmp_path, dtype):
    root = tmp_path / "fixed"
    fields = [Field("image", "jpeg"), Field("boxes", "ndarray", dtype=dtype, shape=(3, 4))]
    with DatasetWriter(root, fields, records_per_shard=4, durable=False) as w:
        w.write({"image": three_boxes(0)["image"], "boxes": np.zeros((3, 4), dtype)})
    with pytest.raises(ValueError) as info:
        reader.Loader(root, 1, transform=[Resize((16, 16))], num_workers=0)
    text = str(info.value)
    assert "first dimension is fixed (3 boxes in every record)" in text
    assert f"schema={{'boxes': '{dtype}[None,4]', ...}}" in text
    assert "Annotations(boxes='')" in text  # the other way: read it untransformed
    json.dumps(text)  # plain text, nothing odd in it
