"""``pack_samples(..., engine="ray")`` on a local 2-CPU Ray cluster: the local engine's
records, bad inputs named by their index in the whole pack, a resume."""

from __future__ import annotations

import json

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'shardpack[ray]'")

import formats  # noqa: E402
from packer import PackInputError  # noqa: E402
from tests.helpers_packer import pack_fn  # noqa: E402
from tests.packer.test_pack_samples import clips, flaky, half_then_raise  # noqa: E402

FAST = {"durable": False, "progress": False}


def assert_same_records(a_path, b_path) -> None:
    a, b = formats.open_shards(a_path), formats.open_shards(b_path)
    assert (a.fields, len(a)) == (b.fields, len(b))
    for i in range(len(a)):
        assert a[i]["name"] == b[i]["name"]
        assert a[i]["clip"].tolist() == b[i]["clip"].tolist()
    assert formats.verify_dataset(b_path) == []


pytestmark = pytest.mark.usefixtures("ray_cluster")


def test_ray_packs_the_records_the_local_engine_packs(tmp_path):
    local = pack_fn(clips, range(120), tmp_path / "local", workers=0, **FAST)
    s = pack_fn(clips, range(120), tmp_path / "ray", engine="ray", task_records=25,
                     workers=2, **FAST)
    assert s.complete and s.records_written == local.records_written
    assert_same_records(tmp_path / "local", tmp_path / "ray")
    assert formats.open_shards(tmp_path / "ray").manifest.created_by["options"]["engine"] == "ray"


def test_ray_names_a_bad_input_by_its_index_and_skips_it(tmp_path):
    with pytest.raises(PackInputError, match=r"input 7 \(7\).*cannot read item 7"):
        pack_fn(flaky, range(20), tmp_path / "a", engine="ray", task_records=5, **FAST)
    s = pack_fn(flaky, range(20), tmp_path / "b", engine="ray", task_records=5,
                     on_error="skip", **FAST)
    assert s.records_in == 20 and dict(s.skipped) == {"raised": 1}
    line = json.loads((tmp_path / "b" / "skipped.jsonl").read_text())
    assert line["path"] == "input 7 (7)"


def test_ray_keeps_the_samples_a_generator_gave_before_it_raised(tmp_path):
    s = pack_fn(half_then_raise, range(6), tmp_path / "ds", engine="ray", task_records=2,
                     on_error="skip", **FAST)
    assert s.records_written == 11 and dict(s.skipped) == {"partial": 1}
    line = json.loads((tmp_path / "ds" / "skipped.jsonl").read_text())
    assert (line["kind"], line["path"]) == ("partial", "input 4 (4)")
    ds = formats.open_shards(tmp_path / "ds")
    assert [ds[k]["x"] for k in range(len(ds))] == [0, 0, 1, -1, 2, -2, 3, -3, 4, 5, -5]


def test_ray_takes_a_lambda_and_resumes_a_finished_pack(tmp_path):
    s = pack_fn(lambda i: {"x": i}, range(10), tmp_path / "ds", engine="ray",
                     task_records=4, **FAST)
    assert [formats.open_shards(tmp_path / "ds")[k]["x"] for k in range(10)] == list(range(10))
    assert s.shards == 3


def test_ray_packs_a_folder_of_any_files_like_the_local_engine(tmp_path):
    import numpy as np

    from packer import PackOptions, pack
    from tests.packer.test_files_any import mixed_tree

    mixed_tree(tmp_path / "src", np.random.default_rng(0), n=7)
    pack(tmp_path / "src", tmp_path / "local", PackOptions(durable=False, workers=0))
    pack(tmp_path / "src", tmp_path / "ray", PackOptions(durable=False, engine="ray",
                                                          task_records=3))
    a, b = formats.open_shards(tmp_path / "local"), formats.open_shards(tmp_path / "ray")
    assert a.fields == b.fields and len(a) == len(b) == 7
    for i in range(7):
        assert a[i]["key"] == b[i]["key"] and a[i]["txt"] == b[i]["txt"]
        assert a[i]["npy"].tolist() == b[i]["npy"].tolist()
