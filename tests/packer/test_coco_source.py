"""``--from coco``: one record per image, boxes as xyxy pixels, labels by sorted category id."""

from __future__ import annotations

import json

import numpy as np
import pytest
import simplejpeg

import formats
from formats.errors import InputError
from formats.shard.manifest import decode_manifest, manifest_files
from packer import PackOptions, UsageError, pack
from packer.cli import main
from tests.helpers_coco import CATEGORIES, LABEL_OF, coco_json, make_coco
from tests.helpers_packer import jpeg


def opts(ann, **kw) -> PackOptions:
    return PackOptions(**{"durable": False, "workers": 0, "annotations": str(ann), **kw})


def records(dst) -> list[dict]:
    ds = formats.open_shards(dst)
    return [ds[i] for i in range(len(ds))]


def test_record_fields_follow_the_json(tmp_path, rng):
    images_dir, ann = make_coco(tmp_path, rng, n=5)
    doc = json.loads(ann.read_text())
    s = pack(images_dir, tmp_path / "dst", opts(ann))
    assert s.complete and s.source == "coco" and s.records_written == 5 and not s.skipped
    ds = formats.open_shards(tmp_path / "dst")
    assert [(f.name, f.type, f.dtype, f.shape) for f in ds.fields] == [
        ("image", "jpeg", None, None), ("key", "str", None, None), ("image_id", "int", None, None),
        ("height", "int", None, None), ("width", "int", None, None),
        ("boxes", "ndarray", "<f4", (None, 4)), ("labels", "ndarray", "<i8", (None,)),
        ("iscrowd", "ndarray", "|u1", (None,)), ("area", "ndarray", "<f4", (None,)),
        ("segmentation", "json", None, None)]
    # Names in the order of the sorted category ids; the categories themselves beside them.
    assert ds.classes == ("cat", "dog", "car")
    assert ds.manifest.class_info == tuple(sorted(CATEGORIES, key=lambda c: c["id"]))
    for img, rec, meta in zip(doc["images"], records(tmp_path / "dst"),
                              ds.metadata(["width", "height", "key"]).to_pylist(), strict=True):
        mine = [a for a in doc["annotations"] if a["image_id"] == img["id"]]
        assert rec["key"] == img["file_name"] == meta["key"]
        assert bytes(rec["image"]) == (images_dir / img["file_name"]).read_bytes()
        assert (rec["image_id"], rec["height"], rec["width"]) == (img["id"], img["height"],
                                                                  img["width"])
        assert (meta["width"], meta["height"]) == (img["width"], img["height"])
        want = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in mine)],
                        np.float64).reshape(-1, 4).astype(np.float32)
        np.testing.assert_array_equal(rec["boxes"], want)
        assert rec["labels"].tolist() == [LABEL_OF[a["category_id"]] for a in mine]
        assert rec["iscrowd"].tolist() == [0] * len(mine)
        np.testing.assert_array_equal(rec["area"], np.float32([a["area"] for a in mine]))
        assert rec["segmentation"] == [a["segmentation"] for a in mine]
    empty = records(tmp_path / "dst")[2]  # make_coco leaves the third image unannotated
    assert empty["boxes"].shape == (0, 4) and empty["labels"].shape == (0,)


def test_images_without_annotations_are_dropped_on_request_and_counted(tmp_path, rng):
    images_dir, ann = make_coco(tmp_path, rng, n=5)
    s = pack(images_dir, tmp_path / "dst", opts(ann, drop_empty=True))  # on_error fail
    assert s.complete and s.records_written == 4 and dict(s.skipped) == {"no-annotations": 1}
    assert s.records_in == 5
    line = json.loads((tmp_path / "dst" / "skipped.jsonl").read_text())
    assert line["kind"] == "no-annotations" and line["path"] == "002.jpg"
    assert "image id 106" in line["reason"] and "annotations.json" in line["reason"]
    assert [r["image_id"] for r in records(tmp_path / "dst")] == [100, 103, 109, 112]
    assert formats.open_shards(tmp_path / "dst").manifest.created_by["options"]["drop_empty"]


def _doc(tmp_path, rng, n=3):
    images_dir = tmp_path / "images"
    images_dir.mkdir()
    images = []
    for i in range(n):
        (images_dir / f"{i}.jpg").write_bytes(jpeg(rng, 40, 30))
        images.append({"id": i + 1, "file_name": f"{i}.jpg", "height": 30, "width": 40})
    anns = [{"id": 10 + i, "image_id": i + 1, "category_id": 3, "bbox": [1, 2, 10, 8],
             "area": 80.0, "iscrowd": 0, "segmentation": [[1, 2, 11, 2, 11, 10]]}
            for i in range(n)]
    return images_dir, coco_json(images, anns)


def _bad_box(doc):
    doc["annotations"][1]["bbox"] = [35, 2, 6.5, 8]  # x1 = 41.5: 1.5 px past the width


def _zero_box(doc):
    doc["annotations"][1]["bbox"] = [5, 2, 0, 8]


def _negative_box(doc):
    doc["annotations"][1]["bbox"] = [5, 2, 4, -1]


def _text_in_box(doc):
    doc["annotations"][1]["bbox"] = [5, "a", 4, 3]


def _three_values_box(doc):
    doc["annotations"][1]["bbox"] = [5, 2, 4]


def _unknown_category(doc):
    doc["annotations"][1]["category_id"] = 4


def _reused_annotation_id(doc):
    doc["annotations"][1]["id"] = doc["annotations"][2]["id"]  # images 2 and 3 both bad


def _rle_of_other_size(doc):
    doc["annotations"][1]["segmentation"] = {"counts": "abc", "size": [31, 40]}


def _listed_twice(doc):
    doc["images"][2]["id"] = 2  # images[1] and images[2] both claim id 2
    doc["annotations"].pop()


def _outside_path(doc):
    doc["images"][1]["file_name"] = "../outside.jpg"


def _absolute_path(doc):
    doc["images"][1]["file_name"] = "/etc/passwd"


def _height_of_another(doc):
    doc["images"][1]["height"] = 31


# case -> (edit of the document, skip kind, words the message holds)
CASES = {
    "box outside the image": (_bad_box, "bad-box", ["annotation id 11", "outside"]),
    "box of zero width": (_zero_box, "bad-box", ["annotation id 11", "width 0"]),
    "box of negative height": (_negative_box, "bad-box", ["annotation id 11", "height -1"]),
    "box holding text": (_text_in_box, "bad-box", ["annotation id 11", "[5, 'a', 4, 3]",
                                                   "holds 'a' at [1], not a number"]),
    "box of three values": (_three_values_box, "bad-box", ["annotation id 11",
                                                           "has 3 values, not four numbers"]),
    "undeclared category": (_unknown_category, "unknown-category", ["annotation id 11",
                                                                   "category id 4"]),
    "annotation id used twice": (_reused_annotation_id, "bad-annotation", ["annotation id 12"]),
    "mask of another size": (_rle_of_other_size, "bad-annotation", ["RLE", "[31, 40]"]),
    "image id listed twice": (_listed_twice, "duplicate-image-id", ["listed 2 times"]),
    "file_name leaving the folder": (_outside_path, "unsafe-path", ["../outside.jpg"]),
    "absolute file_name": (_absolute_path, "unsafe-path", ["/etc/passwd"]),
    "size that is not the image's": (_height_of_another, "size-mismatch", ["40x31", "40x30"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_annotations_fail_naming_file_and_ids_or_are_skipped(tmp_path, rng, case):
    edit, kind, words = CASES[case]
    images_dir, doc = _doc(tmp_path, rng)
    (tmp_path / "outside.jpg").write_bytes(jpeg(rng, 40, 30))
    edit(doc)
    ann = tmp_path / "instances.json"
    ann.write_text(json.dumps(doc))
    with pytest.raises(formats.ShardpackError) as info:
        pack(images_dir, tmp_path / "fail", opts(ann))
    text = str(info.value)
    assert getattr(info.value, "kind", None) == kind
    assert "instances.json" in text and "image id 2" in text, text
    assert all(w in text for w in words), text
    assert not (tmp_path / "fail" / "manifest.json").exists()

    s = pack(images_dir, tmp_path / "skip", opts(ann, on_error="skip"))
    bad = sum(s.skipped.values())
    assert s.complete and dict(s.skipped) == {kind: bad} and bad in (1, 2)
    assert s.records_in == s.records_written + bad == 3
    lines = [json.loads(x) for x in (tmp_path / "skip" / "skipped.jsonl").read_text().splitlines()]
    assert [x["kind"] for x in lines] == [kind] * bad and "image id 2" in lines[0]["reason"]
    kept = records(tmp_path / "skip")
    assert 2 not in [r["image_id"] for r in kept]
    assert all(bytes(r["image"]) != (tmp_path / "outside.jpg").read_bytes() for r in kept)


def test_a_box_within_the_tolerance_is_clipped_to_the_image(tmp_path, rng):
    images_dir, doc = _doc(tmp_path, rng)
    doc["annotations"][0]["bbox"] = [-0.75, 0, 40.5, 30.9]
    ann = tmp_path / "a.json"
    ann.write_text(json.dumps(doc))
    s = pack(images_dir, tmp_path / "dst", opts(ann))
    np.testing.assert_array_equal(records(tmp_path / "dst")[0]["boxes"],
                                  np.float32([[0, 0, 39.75, 30]]))
    assert s.boxes_clipped == 1


def test_an_annotation_of_no_image_is_an_input_of_its_own(tmp_path, rng):
    images_dir, doc = _doc(tmp_path, rng)
    doc["annotations"].append({"id": 99, "image_id": 77, "category_id": 3, "bbox": [1, 1, 2, 2]})
    ann = tmp_path / "a.json"
    ann.write_text(json.dumps(doc))
    with pytest.raises(formats.ShardpackError, match=r"annotation id 99 .*image id 77") as info:
        pack(images_dir, tmp_path / "fail", opts(ann))
    assert str(info.value).count("a.json") == 1, str(info.value)  # its path, said once
    s = pack(images_dir, tmp_path / "skip", opts(ann, on_error="skip"))
    assert (s.records_written, dict(s.skipped), s.records_in) == (3, {"no-such-image": 1}, 4)
    line = json.loads((tmp_path / "skip" / "skipped.jsonl").read_text())
    assert line["path"] == "annotations[3]"


def test_a_missing_image_file_names_its_image_id(tmp_path, rng):
    images_dir, doc = _doc(tmp_path, rng)
    (images_dir / "1.jpg").unlink()
    ann = tmp_path / "a.json"
    ann.write_text(json.dumps(doc))
    with pytest.raises(formats.ShardpackError) as info:
        pack(images_dir, tmp_path / "fail", opts(ann))
    assert info.value.kind == "missing" and "1.jpg" in str(info.value)
    assert "image id 2 in" in str(info.value)


@pytest.mark.parametrize("edit, where", [
    (lambda d: [1, 2], "the top level"),
    (lambda d: {"annotations": []}, "'images'"),
    (lambda d: {**d, "images": {}}, "images"),
    (lambda d: {**d, "images": [*d["images"][:2], {"id": "3", "file_name": "2.jpg",
                                                    "height": 30, "width": 40}]}, "images[2].id"),
    (lambda d: {**d, "annotations": [*d["annotations"][:1], {**d["annotations"][1],
                                                              "bbox": "1 2 3 4"}]},
     "annotations[1].bbox"),
    (lambda d: {**d, "annotations": [{**d["annotations"][0], "segmentation": [[1, "x"]]}]},
     "annotations[0].segmentation[0]"),
    (lambda d: {**d, "categories": [{"id": 3}]}, "categories[0] has no 'name'"),
])
def test_a_file_not_in_coco_shape_fails_at_once_naming_the_json_path(tmp_path, rng, edit, where):
    images_dir, doc = _doc(tmp_path, rng)
    ann = tmp_path / "bad.json"
    ann.write_text(json.dumps(edit(doc)))
    with pytest.raises(InputError) as info:
        pack(images_dir, tmp_path / "dst", opts(ann, on_error="skip"))
    assert "bad.json" in str(info.value) and where in str(info.value)
    assert not (tmp_path / "dst" / "manifest.json").exists()


def test_max_side_scales_boxes_polygons_area_and_size_with_the_image(tmp_path, rng):
    images_dir = tmp_path / "images"
    images_dir.mkdir()
    (images_dir / "big.jpg").write_bytes(jpeg(rng, 200, 120))
    (images_dir / "small.jpg").write_bytes(jpeg(rng, 50, 40))
    doc = coco_json(
        [{"id": 1, "file_name": "big.jpg", "height": 120, "width": 200},
         {"id": 2, "file_name": "small.jpg", "height": 40, "width": 50}],
        [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [20, 10, 100, 60], "area": 5000.0,
          "segmentation": [[20, 10, 120, 10, 120, 70]]},
         {"id": 2, "image_id": 2, "category_id": 7, "bbox": [1, 1, 10, 10], "area": 100.0,
          "segmentation": {"counts": "`n1", "size": [40, 50]}}])  # small: never shrunk
    ann = tmp_path / "a.json"
    ann.write_text(json.dumps(doc))
    pack(images_dir, tmp_path / "dst", opts(ann, max_side=64))
    big, small = records(tmp_path / "dst")
    h, w = simplejpeg.decode_jpeg_header(bytes(big["image"]))[:2]
    assert (w, h) == (big["width"], big["height"]) == (64, 38)
    sx, sy = 64 / 200, 38 / 120  # each axis by its own factor
    np.testing.assert_allclose(big["boxes"], [[20 * sx, 10 * sy, 120 * sx, 70 * sy]], rtol=1e-6)
    np.testing.assert_allclose(big["area"], [5000 * sx * sy], rtol=1e-6)
    np.testing.assert_allclose(big["segmentation"][0][0],
                               [20 * sx, 10 * sy, 120 * sx, 10 * sy, 120 * sx, 70 * sy])
    assert (small["width"], small["height"]) == (50, 40)
    assert small["segmentation"] == [{"counts": "`n1", "size": [40, 50]}]
    # An RLE mask on an image --max-side would shrink: refused before anything is written.
    doc["annotations"][0]["segmentation"] = {"counts": [24000], "size": [120, 200]}
    ann.write_text(json.dumps(doc))
    with pytest.raises(formats.ShardpackError, match=r"annotation id 1 .*RLE mask"):
        pack(images_dir, tmp_path / "rle", opts(ann, max_side=64))
    assert not (tmp_path / "rle" / "manifest.json").exists()
    assert main([str(images_dir), str(tmp_path / "rle"), "--annotations", str(ann),
                 "--max-side", "64", "-q"]) == 1  # found in SRC: a data error


def test_the_command_line_names_coco_options_and_refuses_misuse(tmp_path, rng, capsys):
    images_dir, ann = make_coco(tmp_path, rng, n=3)
    # --annotations alone means --from coco.
    assert main([str(images_dir), str(tmp_path / "dst"), "--annotations", str(ann), "--json",
                 "--drop-empty"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records_written"] == 2 and out["skipped_by_kind"] == {"no-annotations": 1}
    for argv in (["--from", "coco"], ["--drop-empty"], ["--from", "files", "--annotations", str(ann)],
                 ["--annotations", str(ann), "--field", "boxes=float32"],
                 ["--annotations", str(ann), "--to", "imagefolder"]):
        assert main([str(images_dir), str(tmp_path / "x"), "-q", *argv]) == 2, argv
        assert "error:" in capsys.readouterr().err
    # A missing file is found by looking, as a missing SRC is: a data error.
    assert main([str(images_dir), str(tmp_path / "x"), "-q", "--annotations",
                 str(tmp_path / "nope.json")]) == 1
    assert "nope.json: --annotations: no such file" in capsys.readouterr().err
    ann.write_text('{"images": 3}')
    assert main([str(images_dir), str(tmp_path / "y"), "-q", "--annotations", str(ann)]) == 1
    assert "annotations.json" in capsys.readouterr().err


def test_class_info_round_trips_through_the_manifest_and_is_checked(tmp_path, rng):
    images_dir, ann = make_coco(tmp_path, rng, n=2)
    pack(images_dir, tmp_path / "dst", opts(ann))
    dst = tmp_path / "dst"
    raw = (dst / "manifest.json").read_bytes()
    m = decode_manifest(raw, dst / "manifest.json")
    assert dict(manifest_files(m))["manifest.json"] == raw
    assert json.loads(raw)["class_info"][0]["id"] == 3
    obj = json.loads(raw)
    obj["class_info"] = obj["class_info"][:2]
    with pytest.raises(formats.ShardpackError, match="class_info"):
        decode_manifest(json.dumps(obj).encode(), dst / "manifest.json")
    del obj["class_info"]  # optional: a reader of older manifests finds none
    assert decode_manifest(json.dumps(obj).encode(), dst / "manifest.json").class_info is None


def test_coco_option_misuse_in_the_library_is_a_usage_error():
    with pytest.raises(UsageError, match="needs --annotations"):
        PackOptions(source="coco")
    with pytest.raises(UsageError, match="--annotations is for --from coco"):
        PackOptions(source="parquet", annotations="a.json")
    assert PackOptions(annotations="a.json").source == "coco"
