"""formats.shard.shard_table: the shard list of a 2.0 manifest, as Arrow columns."""

from __future__ import annotations

import json

import pytest

from formats import DatasetWriter, Field, open_shards
from formats.errors import ManifestError
from formats.shard.arrow_strings import string_buffers
from formats.shard.manifest import read_manifest
from formats.shard.shard_table import ShardEntry, ShardTable, _duplicate
from tests.helpers_manifest import edit_manifest
from tests.helpers_paths import DATA


def _entries(names):
    return [ShardEntry(n, 0, 64, 64, 10, 1, 2, 3) for n in names]


def test_a_table_round_trips_through_its_file(tmp_path):
    table = ShardTable.from_entries([ShardEntry(f"s{i}", i, 10 * i, 64 + 0 * i, 5, i, 2 * i, 3)
                                     for i in range(5)])
    raw = table.to_ipc()
    assert raw == ShardTable.from_entries(list(table)).to_ipc()  # deterministic bytes
    assert table[3] == ShardEntry("s3", 3, 30, 64, 5, 3, 6, 3) and table[-1].name == "s4"
    assert table.records.tolist() == [0, 1, 2, 3, 4] and table.total_records == 10
    assert [e.name for e in table[1:3]] == ["s1", "s2"]
    with pytest.raises(IndexError):
        table[5]


@pytest.mark.parametrize("n", [2, 3, 1000, 300_000])
def test_duplicate_names_are_found_among_many(n):
    names = [f"shard-{i:07d}" for i in range(n)]
    table = ShardTable.from_entries(_entries(names))
    assert _duplicate(*string_buffers(table._names)[:2]) is None
    names[n // 2] = names[0]
    table = ShardTable.from_entries(_entries(names))
    assert _duplicate(*string_buffers(table._names)[:2]) == names[0]


def test_names_of_different_lengths_and_shared_prefixes_are_told_apart():
    names = ["a", "aa", "aaa", "ab", "ba", "a\u00e9", "\u00e9a", "shard-1", "shard-10"]
    table = ShardTable.from_entries(_entries(names))
    assert _duplicate(*string_buffers(table._names)[:2]) is None


def test_writers_write_2_0_and_a_1_0_manifest_reads_the_same(tmp_path):
    root = tmp_path / "ds"
    with DatasetWriter(root, [Field("label", "int")], shard_size=None, records_per_shard=3,
                       durable=False) as w:
        for i in range(8):
            w.write({"label": i})
    obj = json.loads((root / "manifest.json").read_text())
    assert obj["format_version"] == "2.0" and "shards" not in obj
    assert obj["totals"]["shards"] == 3
    new = read_manifest(root)
    edit_manifest(root, lambda m: None)  # the same dataset, its manifest 1.0
    old = read_manifest(root)
    assert (old.major, new.major) == (1, 2) and old.shards == new.shards
    with open_shards(root) as ds:
        assert [ds[i]["label"] for i in range(8)] == list(range(8))


def test_the_committed_1_0_dataset_still_reads():
    m = read_manifest(DATA / "golden-v1")
    assert m.version == "1.0" and m.shard_table is None and len(m.shards) == 1


def test_a_table_named_by_a_2_0_manifest_must_exist(tmp_path):
    root = tmp_path / "ds"
    with DatasetWriter(root, [Field("label", "int")], durable=False) as w:
        w.write({"label": 1})
    (root / "shards.arrow").unlink()
    with pytest.raises(ManifestError, match="shard table is missing"):
        open_shards(root)


def test_a_writer_stopped_between_table_and_manifest_resumes(tmp_path, monkeypatch):
    from formats.shard import manifest as manifest_module
    from formats.shard.ownership import survey

    root = tmp_path / "ds"
    fields = [Field("label", "int")]
    real = manifest_module.atomic_write_bytes

    def crash_at_the_manifest(path, data, **kw):
        if path.name == "manifest.json":
            raise OSError("power cut")
        real(path, data, **kw)

    w = DatasetWriter(root, fields, shard_size=None, records_per_shard=2, durable=False)
    for i in range(5):
        w.write({"label": i}, progress=i + 1)
    monkeypatch.setattr(manifest_module, "atomic_write_bytes", crash_at_the_manifest)
    with pytest.raises(OSError, match="power cut"):
        w.close(progress=5)
    monkeypatch.undo()
    assert (root / "shards.arrow").exists() and not (root / "manifest.json").exists()
    assert "shards.arrow" in survey(root).ours  # beside the journal: ours to replace
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=2, durable=False,
                       resume=True) as w:
        assert w.records_written == 5
    with open_shards(root) as ds:
        assert [ds[i]["label"] for i in range(5)] == list(range(5))
