"""``--from coco``: boxes within the tolerance are clipped to their image and counted; an
RLE mask's runs must cover its image (both forms of ``counts``), else it is bad input."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import formats
from packer import PackInputError, PackOptions, format_summary, pack
from packer.cli import main
from packer.sources.coco import _decode_rle_string
from tests.helpers_coco import coco_json
from tests.helpers_packer import jpeg


def opts(ann, **kw) -> PackOptions:
    return PackOptions(**{"durable": False, "workers": 0, "annotations": str(ann), **kw})


def rle_string(counts: list[int]) -> str:
    """pycocotools' compact form of ``counts`` (its rleToString), written out here so the
    tests need no pycocotools: 5-bit groups, 0x20 to go on, 0x10 of the last the sign,
    counts from the fourth on as differences from the one two before."""
    out = []
    for i, c in enumerate(counts):
        x = c - counts[i - 2] if i > 2 else c
        more = True
        while more:
            g = x & 0x1F
            x >>= 5
            more = x != -1 if g & 0x10 else x != 0
            out.append(chr(48 + (g | 0x20 if more else g)))
    return "".join(out)


def coco(tmp_path, rng, annotations, size=(204, 30)):
    """Two images of ``size`` (w, h), ids 1 and 2; ``annotations`` are image 1's."""
    images_dir = tmp_path / "images"
    images_dir.mkdir()
    w, h = size
    for i in (1, 2):
        (images_dir / f"{i}.jpg").write_bytes(jpeg(rng, w, h))
    anns = [{"id": 10 + k, "image_id": 1, "category_id": 3, **a}
            for k, a in enumerate(annotations)]
    anns.append({"id": 99, "image_id": 2, "category_id": 7, "bbox": [1, 1, 5, 5], "area": 25.0})
    ann = tmp_path / "instances.json"
    ann.write_text(json.dumps(coco_json(
        [{"id": i, "file_name": f"{i}.jpg", "height": h, "width": w} for i in (1, 2)], anns)))
    return images_dir, ann


def boxes_of(dst, image_id):
    ds = formats.open_shards(dst)
    return next(ds[i] for i in range(len(ds)) if ds[i]["image_id"] == image_id)


def test_boxes_within_the_tolerance_are_clipped_and_counted(tmp_path, rng, capsys):
    images_dir, ann = coco(tmp_path, rng, [
        {"bbox": [194, 5, 10.9, 5], "area": 40.0},  # x1 = 204.9 on a 204-wide image
        {"bbox": [-0.9, 2, 10, 8]},                 # x = -0.9; no area: the stored box's
        {"bbox": [3, 29.5, 4, 1.4]},                # y1 = 30.9 on a 30-high image
        {"bbox": [20, 4, 10, 10]}])                 # inside: as given
    s = pack(images_dir, tmp_path / "dst", opts(ann))
    rec = boxes_of(tmp_path / "dst", 1)
    np.testing.assert_array_equal(rec["boxes"], np.float32(
        [[194, 5, 204, 10], [0, 2, 9.1, 10], [3, 29.5, 7, 30], [20, 4, 30, 14]]))
    np.testing.assert_allclose(rec["area"], np.float32([40, 9.1 * 8, 4 * 0.5, 100]), rtol=1e-6)
    assert (rec["boxes"] >= 0).all() and (rec["boxes"][:, 0::2] <= 204).all()
    assert s.boxes_clipped == 3 and s.to_json()["boxes_clipped"] == 3
    assert re.search(r"^boxes clipped +3 ", format_summary(s), re.M)
    # The command line's table and --json say the same.
    assert main([str(images_dir), str(tmp_path / "cli"), "--annotations", str(ann)]) == 0
    assert re.search(r"^boxes clipped +3 ", capsys.readouterr().out, re.M)
    assert main([str(images_dir), str(tmp_path / "json"), "--annotations", str(ann), "--json",
                 "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["boxes_clipped"] == 3


def test_clipping_comes_before_max_side_and_a_skipped_image_is_not_counted(tmp_path, rng):
    images_dir, ann = coco(tmp_path, rng, [{"bbox": [194, 5, 10.9, 5]},
                                           {"bbox": [-0.9, 2, 10, 8]}])
    s = pack(images_dir, tmp_path / "half", opts(ann, max_side=102))
    np.testing.assert_allclose(boxes_of(tmp_path / "half", 1)["boxes"],
                               np.float32([[97, 2.5, 102, 5], [0, 1, 4.55, 5]]), rtol=1e-6)
    assert s.boxes_clipped == 2
    # A bad box beside them skips image 1: nothing of it is written, nothing counted.
    doc = json.loads(ann.read_text())
    doc["annotations"].insert(0, {"id": 5, "image_id": 1, "category_id": 3,
                                  "bbox": [204.5, 2, 0.4, 5]})  # within 1 px, all outside
    ann.write_text(json.dumps(doc))
    with pytest.raises(PackInputError, match=r"annotation id 5 .*nothing is left once clipped"):
        pack(images_dir, tmp_path / "fail", opts(ann))
    s = pack(images_dir, tmp_path / "skip", opts(ann, on_error="skip", shuffle=True))
    assert dict(s.skipped) == {"bad-box": 1} and s.records_written == 1
    assert s.boxes_clipped == 0 and "boxes clipped" not in format_summary(s)


W, H = 40, 30


@pytest.mark.parametrize("counts", [[W * H], [3, 4, W * H - 7], [0, 5, 10, 20, W * H - 35],
                                    rle_string([W * H]), rle_string([0, 5, 10, 20, W * H - 35]),
                                    rle_string([700, 3, 2, 400, 95])])
def test_rle_masks_that_cover_the_image_pack(tmp_path, rng, counts):
    images_dir, ann = coco(tmp_path, rng, [{"bbox": [1, 1, 5, 5], "iscrowd": 1,
                                            "segmentation": {"counts": counts,
                                                             "size": [H, W]}}], size=(W, H))
    s = pack(images_dir, tmp_path / "dst", opts(ann))
    assert s.records_written == 2 and not s.skipped
    assert boxes_of(tmp_path / "dst", 1)["segmentation"][0]["counts"] == counts


BAD_RLE = {
    "list summing short": ([3, 4, 5], "counts sum to 12 pixels, not the image's 1,200"),
    "list summing long": ([600, 601], "counts sum to 1,201 pixels"),
    "string summing short": (rle_string([5, 7]), "counts sum to 12 pixels"),
    "string with a character out of range": ("`n1!", "holds '!' at 3: not a compact RLE"),
    "string cut in a count": (rle_string([W * H])[:-1], "ends in the middle of a count"),
    "string with a negative run": (rle_string([10, 5, 1, -20]), "negative run (-20)"),
    "string of one negative count": ("@", "negative run (-16)"),
}


@pytest.mark.parametrize("case", sorted(BAD_RLE))
def test_rle_masks_that_do_not_cover_the_image_are_bad_input(tmp_path, rng, case):
    counts, words = BAD_RLE[case]
    images_dir, ann = coco(tmp_path, rng, [
        {"bbox": [1, 1, 5, 5]},
        {"bbox": [1, 1, 5, 5], "iscrowd": 1, "segmentation": {"counts": counts,
                                                              "size": [H, W]}}], size=(W, H))
    with pytest.raises(PackInputError) as info:
        pack(images_dir, tmp_path / "fail", opts(ann))
    text = str(info.value)
    assert info.value.kind == "bad-annotation" and words in text, text
    assert "instances.json" in text and "image id 1" in text and "annotation id 11" in text
    assert not (tmp_path / "fail" / "manifest.json").exists()
    s = pack(images_dir, tmp_path / "skip", opts(ann, on_error="skip"))
    assert (s.records_written, dict(s.skipped)) == (1, {"bad-annotation": 1})
    line = json.loads((tmp_path / "skip" / "skipped.jsonl").read_text())
    assert line["kind"] == "bad-annotation" and "annotation id 11" in line["reason"]
    assert [formats.open_shards(tmp_path / "skip")[0]["image_id"]] == [2]


def test_the_compact_form_decodes_as_pycocotools_writes_it():
    mask_api = pytest.importorskip("pycocotools.mask", reason="pip install 'shardpack[dev]'")
    rng = np.random.default_rng(5)
    for t in range(200):
        h, w = (int(v) for v in rng.integers(1, 50, 2))
        mask = (rng.random((h, w)) < rng.random()).astype(np.uint8)
        if t % 7 == 0:
            mask[:] = t % 2
        rle = mask_api.encode(np.asfortranarray(mask))
        counts = _decode_rle_string(rle["counts"].decode("ascii"))
        runs = np.repeat(np.arange(len(counts)) % 2, counts).astype(np.uint8)
        np.testing.assert_array_equal(runs.reshape(w, h).T, mask, err_msg=f"mask {t}")
        assert rle_string(counts) == rle["counts"].decode("ascii")
