"""``--from coco --engine ray``: the local engine's records, class_info and skip list."""

from __future__ import annotations

import json

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'shardpack[ray]'")

import formats  # noqa: E402
from packer import PackOptions, pack  # noqa: E402
from tests.helpers_coco import make_coco  # noqa: E402
from tests.packer.test_coco_options import values  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_ray_packs_the_records_the_local_engine_packs(tmp_path, rng):
    images_dir, ann = make_coco(tmp_path, rng, n=7, width=50, height=40)
    doc = json.loads(ann.read_text())
    doc["annotations"][0]["bbox"] = [-0.5, 1, 10, 10]  # clipped to the image, and counted
    ann.write_text(json.dumps(doc))
    o = {"durable": False, "workers": 0, "annotations": str(ann), "drop_empty": True,
         "max_side": 32, "shuffle": True, "seed": 1}
    local = pack(images_dir, tmp_path / "local", PackOptions(**o))
    remote = pack(images_dir, tmp_path / "ray", PackOptions(**o, engine="ray", task_records=3))
    assert remote.complete and dict(remote.skipped) == dict(local.skipped) == {"no-annotations": 1}
    assert remote.boxes_clipped == local.boxes_clipped == 1
    assert values(tmp_path / "ray") == values(tmp_path / "local")
    a, b = formats.open_shards(tmp_path / "ray"), formats.open_shards(tmp_path / "local")
    assert (a.classes, a.manifest.class_info) == (b.classes, b.manifest.class_info)
    assert (tmp_path / "ray" / "skipped.jsonl").read_text() == \
        (tmp_path / "local" / "skipped.jsonl").read_text()
