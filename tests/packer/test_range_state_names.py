"""The range state's folder has an engine-neutral name (``.shardpack-ranges``), and a
pack interrupted when it was still ``.ray`` (for the local engine too) resumes: in
DST, in the staging folder of an overwrite, and on object storage."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import formats
from formats.errors import InputError
from packer import PackInputError, PackOptions, pack
from packer.engines.ranges import Output, RangeResult, prepare
from packer.work_names import (
    LEGACY_STATE_DIR,
    PLAN_NAME,
    STATE_DIR,
    WORK,
    adopt_legacy_state,
    marker_name,
)
from tests.helpers_packer import dataset_files, image_folder, pack_fn
from tests.helpers_s3 import new_bucket, s3_endpoint, s3_uri

FAST = {"durable": False, "progress": False, "workers": 0, "task_records": 2,
        "records_per_shard": 2, "shard_size": None}


def fails_when_told(i):
    if i == 5 and os.environ.get("SHARDPACK_TEST_FAIL"):
        raise ValueError("told to fail")
    return {"x": np.arange(i % 5, dtype=np.int32), "n": i}


def _interrupt(folder_of, dst, monkeypatch, **kw):
    """Pack 8 inputs into ``dst`` failing at input 5 (ranges [0, 2) and [2, 4) done);
    then move the range state in ``folder_of(dst)`` to its old name, as an earlier
    pack would have left it."""
    monkeypatch.setenv("SHARDPACK_TEST_FAIL", "1")
    with pytest.raises(PackInputError, match="told to fail"):
        pack_fn(fails_when_told, range(8), dst, **FAST, **kw)
    monkeypatch.delenv("SHARDPACK_TEST_FAIL")
    folder = folder_of(dst)
    assert (folder / marker_name(2, 4)).is_file()
    os.rename(folder / STATE_DIR, folder / LEGACY_STATE_DIR)
    return folder


def test_the_range_state_folder_names_no_engine(tmp_path, monkeypatch):
    assert STATE_DIR == ".shardpack-ranges" and WORK.state_dir == STATE_DIR
    monkeypatch.setenv("SHARDPACK_TEST_FAIL", "1")
    with pytest.raises(PackInputError):
        pack_fn(fails_when_told, range(8), tmp_path / "ds", **FAST)
    assert (tmp_path / "ds" / PLAN_NAME).is_file()
    assert not (tmp_path / "ds" / ".ray").exists()


def test_a_pack_interrupted_under_the_old_name_resumes_in_place(tmp_path, monkeypatch):
    dst = tmp_path / "ds"
    _interrupt(lambda d: d, dst, monkeypatch)
    s = pack_fn(fails_when_told, range(8), dst, resume=True, **FAST)
    assert s.complete and s.resumed_records == 4  # the two ranges done before the failure
    assert not (dst / LEGACY_STATE_DIR).exists() and not (dst / STATE_DIR).exists()
    pack_fn(fails_when_told, range(8), tmp_path / "full", **FAST)
    assert dataset_files(dst) == dataset_files(tmp_path / "full")


def test_a_pack_interrupted_under_the_old_name_resumes_in_the_staging_folder(
        tmp_path, monkeypatch):
    dst = tmp_path / "ds"
    pack_fn(fails_when_told, range(3), dst, **FAST)
    staging = _interrupt(lambda d: d.with_name(".ds.shardpack-new"), dst, monkeypatch,
                         overwrite=True)
    s = pack_fn(fails_when_told, range(8), dst, resume=True, **FAST)
    assert s.complete and s.resumed_records == 4 and not staging.exists()
    assert [formats.open_shards(dst)[k]["n"] for k in range(8)] == list(range(8))


def test_a_fresh_pack_clears_state_left_under_the_old_name(tmp_path, monkeypatch):
    dst = tmp_path / "ds"
    _interrupt(lambda d: d, dst, monkeypatch)
    s = pack_fn(fails_when_told, range(8), dst, **FAST)
    assert s.complete and s.resumed_records == 0
    assert sorted(p.name for p in dst.iterdir() if p.name.startswith(".")) == []


def test_an_unfinished_pack_under_the_old_name_is_not_packed_as_a_folder_of_files(
        tmp_path, rng):
    image_folder(tmp_path / "half", rng, per_class=1)
    (tmp_path / "half" / LEGACY_STATE_DIR).mkdir()
    (tmp_path / "half" / LEGACY_STATE_DIR / "plan.json").write_text("{}")
    with pytest.raises(InputError, match=r"did not finish.*--resume"):
        pack(tmp_path / "half", tmp_path / "out", PackOptions(workers=0, durable=False))


def test_only_a_folder_of_the_old_name_that_holds_its_plan_is_adopted(tmp_path):
    """A user's ``.ray`` (Ray's own name) without our plan stays foreign, untouched;
    a linked one is never followed; today's folder is never overwritten."""
    (tmp_path / "a" / ".ray").mkdir(parents=True)
    (tmp_path / "a" / ".ray" / "session.json").write_text("{}")
    assert not adopt_legacy_state(tmp_path / "a")
    assert (tmp_path / "a" / ".ray" / "session.json").is_file()

    (tmp_path / "b").mkdir()
    (tmp_path / "b" / ".ray").symlink_to(tmp_path / "a" / ".ray")
    (tmp_path / "a" / ".ray" / "plan.json").write_text("{}")
    assert not adopt_legacy_state(tmp_path / "b")

    (tmp_path / "a" / STATE_DIR).mkdir()
    assert not adopt_legacy_state(tmp_path / "a")
    (tmp_path / "a" / STATE_DIR).rmdir()
    assert adopt_legacy_state(tmp_path / "a", durable=False)
    assert (tmp_path / "a" / STATE_DIR / "plan.json").is_file()
    assert not (tmp_path / "a" / ".ray").exists()


def _legacy_state_on(uri: str) -> tuple[Output, str, list[tuple[int, int]]]:
    """Object storage holding an earlier pack's range state: its plan, a marker for
    range [0, 3) (three inputs skipped: no shard files to check) and a torn marker."""
    out = Output(uri)
    plan, ranges = "p" * 16, [(0, 3), (3, 6)]
    expected = {"plan": plan, "ranges": 2, "task_records": 3}
    out.write_bytes(".ray/plan.json", json.dumps(expected, sort_keys=True).encode())
    done = RangeResult(0, 3, plan, [], skipped={"corrupt": 3})
    out.write_bytes(".ray/range-000000000000-000000000003.json",
                    json.dumps(done.to_json()).encode())
    out.write_bytes(".ray/range-000000000003-000000000006.json", b"{")
    return out, plan, ranges


def test_range_state_under_the_old_name_on_object_storage_is_moved_for_a_resume(tmp_path):
    with s3_endpoint() as endpoint:
        bucket = new_bucket(endpoint)
        out, plan, ranges = _legacy_state_on(s3_uri(endpoint, bucket, "resume"))
        done = prepare(out, plan, ranges, resume=True)
        assert list(done) == [0] and done[0].skipped == {"corrupt": 3}
        assert sorted(out.files()) == [PLAN_NAME, marker_name(0, 3)]

        out, plan, ranges = _legacy_state_on(s3_uri(endpoint, bucket, "fresh"))
        assert prepare(out, plan, ranges, resume=False) == {}
        assert sorted(out.files()) == [PLAN_NAME]
