"""Damaged datasets get our own errors, naming file, record and offset; never garbage."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import formats
from formats import (
    CorruptRecordError,
    DatasetWriter,
    Field,
    FormatError,
    ManifestError,
    ShardpackError,
    UnsafePathError,
    VersionError,
    open_shards,
)
from formats.shard.layout import index_sections
from tests.helpers_manifest import edit_manifest, write_shard_table_bytes

FIELDS = [Field("image", "jpeg"), Field("label", "int"), Field("key", "str"),
          Field("meta", "json", "zstd")]


def make(root, n=20, per_shard=8):
    with DatasetWriter(root, FIELDS, records_per_shard=per_shard, durable=False) as w:
        for i in range(n):
            w.write({"image": bytes([i]) * (100 + i), "label": i, "key": f"k{i}",
                     "meta": {"i": i}})
    return root


def read_all(root, check_crc=True, max_open=None):
    """Every field of every record, the scalars batched, the metadata table. By type, not
    name: a mutated manifest may rename a field (a valid manifest all the same). With
    ``max_open`` below the shards, each shard is opened on first use and its records
    read one by one before it is mapped."""
    with open_shards(root, check_crc=check_crc, max_open=max_open) as ds:
        for i in range(len(ds)):
            for value in ds[i].values():
                if isinstance(value, memoryview):
                    bytes(value)
        for f in ds.fields:
            if f.type in ("int", "float"):
                ds.scalars(range(len(ds)), f.name)
        ds.metadata()


def test_bit_flip_in_payload_caught_by_crc_and_verify(tmp_path):
    root = make(tmp_path)
    ds = open_shards(root)
    _, offsets, _ = ds.spans([10], "image")
    shard_file = root / "shard-00001.rec"
    ds.close()
    data = bytearray(shard_file.read_bytes())
    data[int(offsets[0]) + 5] ^= 0x10
    shard_file.write_bytes(data)

    with pytest.raises(CorruptRecordError) as err:
        open_shards(root, check_crc=True).get(10, "image")
    assert "shard-00001.rec" in str(err.value) and "record 2" in str(err.value)
    assert f"at byte {int(offsets[0])}" in str(err.value)
    assert "checksum" in str(err.value)
    # The batch path (one CRC pass over the batch) names the same record, wherever it sits.
    batched = open_shards(root, check_crc=True)
    batched.payloads([0, 5, 9], "image")  # no damaged record: no error
    with pytest.raises(CorruptRecordError) as err:
        batched.payloads([3, 17, 10, 11], "image")
    assert "shard-00001.rec" in str(err.value) and "record 2" in str(err.value)
    assert f"at byte {int(offsets[0])}" in str(err.value)
    batched.close()

    problems = formats.verify_dataset(root)
    kinds = {(p.file, p.record, p.field) for p in problems}
    assert ("shard-00001.rec", 2, "image") in kinds
    assert any(p.record is None and "file checksum" in p.what for p in problems)


def test_truncated_data_file(tmp_path):
    root = make(tmp_path)
    f = root / "shard-00000.rec"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(FormatError, match=r"shard-00000.rec.*truncated"):
        open_shards(root)
    assert any("size" in p.what for p in formats.verify_dataset(root))


@pytest.mark.parametrize("cut", [1, 64, 200])
def test_truncated_index(tmp_path, cut):
    root = make(tmp_path)
    f = root / "shard-00000.idx"
    f.write_bytes(f.read_bytes()[:-cut])
    with pytest.raises(FormatError, match=r"shard-00000.idx.*truncated"):
        open_shards(root)


def test_index_of_wrong_size_in_manifest(tmp_path):
    root = make(tmp_path)
    edit_manifest(root, lambda m: m["shards"][0].update(index_bytes=m["shards"][0]["index_bytes"] + 8))
    with pytest.raises(FormatError, match="index size"):
        open_shards(root)


def test_record_count_disagrees_with_index(tmp_path):
    root = make(tmp_path)

    def change(m):
        m["shards"][0]["records"] += 1
        m["totals"]["records"] += 1

    edit_manifest(root, change)
    with pytest.raises(FormatError):
        open_shards(root)


def test_totals_disagree_with_shards(tmp_path):
    root = make(tmp_path)
    edit_manifest(root, lambda m: m["totals"].update(records=999))
    with pytest.raises(ManifestError, match=r"totals\.records"):
        open_shards(root)


@pytest.mark.parametrize("key", ["format_version", "fields", "shards", "alignment", "totals"])
def test_manifest_missing_key(tmp_path, key):
    root = make(tmp_path)
    edit_manifest(root, lambda m: m.pop(key))
    with pytest.raises(ManifestError, match=key):
        open_shards(root)


@pytest.mark.parametrize(
    ("path", "value"),
    [(("alignment",), "64"), (("shards", 0, "records"), "8"), (("shards", 0, "name"), 3),
     (("fields", 0, "type"), "video"), (("shards", 0, "data_crc32c"), "xyz"),
     (("classes",), "cat"), (("alignment",), 48)],
)
def test_manifest_wrong_types(tmp_path, path, value):
    root = make(tmp_path)

    def change(m):
        obj = m
        for p in path[:-1]:
            obj = obj[p]
        obj[path[-1]] = value

    edit_manifest(root, change)
    with pytest.raises(ManifestError):
        open_shards(root)


def test_unknown_major_version_is_refused(tmp_path):
    root = make(tmp_path)
    edit_manifest(root, lambda m: m.update(format_version="3.0"))
    with pytest.raises(VersionError, match=r"reads 1\.x and 2\.x.*upgrade shardpack"):
        open_shards(root)


def test_unknown_major_version_in_file_header(tmp_path):
    root = make(tmp_path)
    f = root / "shard-00000.rec"
    data = bytearray(f.read_bytes())
    data[8] = 9  # major version, little-endian u16 at byte 8
    f.write_bytes(data)
    with pytest.raises(VersionError, match=r"shard-00000.rec.*9\.0"):
        open_shards(root)


def test_newer_minor_version_is_read(tmp_path):
    root = make(tmp_path)
    edit_manifest(root, lambda m: m.update(format_version="1.7"))
    assert len(open_shards(root)) == 20


@pytest.mark.parametrize("name", ["../evil", "sub/shard", "/etc/passwd", "..", "a\\b", ""])
def test_shard_names_cannot_escape(tmp_path, name):
    root = make(tmp_path / "ds")
    edit_manifest(root, lambda m: m["shards"][0].update(name=name))
    with pytest.raises(UnsafePathError):
        open_shards(root)


def test_data_file_of_another_format(tmp_path):
    root = make(tmp_path)
    f = root / "shard-00000.rec"
    size = f.stat().st_size
    f.write_bytes((b"PK\x03\x04" + b"\x00" * size)[:size])  # a zip file, same size
    with pytest.raises(FormatError, match="bad magic"):
        open_shards(root)


def test_no_manifest_is_not_a_dataset(tmp_path):
    root = make(tmp_path)
    (root / "manifest.json").unlink()
    with pytest.raises(ManifestError, match="never finished"):
        open_shards(root)


def test_index_pointing_outside_the_data_file(tmp_path):
    root = make(tmp_path)
    f = root / "shard-00000.idx"
    data = bytearray(f.read_bytes())
    offsets_at = index_sections(8, len(FIELDS))[0]
    data[offsets_at : offsets_at + 8] = (10**12).to_bytes(8, "little")
    f.write_bytes(data)
    ds = open_shards(root)  # header and sizes are fine: opening stays O(1)
    with pytest.raises(FormatError, match="record 0"):
        ds.get(0, "image")


def test_overwrite_and_existing_dataset(tmp_path):
    root = make(tmp_path)
    with pytest.raises(ManifestError, match="already a dataset"):
        DatasetWriter(root, FIELDS)
    with DatasetWriter(root, FIELDS, overwrite=True, durable=False) as w:
        w.write({"image": b"", "label": 0, "key": "", "meta": None})
    assert len(open_shards(root)) == 1
    assert sorted(p.name for p in root.iterdir()) == [
        "manifest.json", "shard-00000.idx", "shard-00000.meta.parquet", "shard-00000.rec",
        "shards.arrow"]


def test_schema_violations_name_the_field(tmp_path):
    with DatasetWriter(tmp_path, FIELDS, durable=False) as w:
        with pytest.raises(formats.SchemaError, match="label"):
            w.write({"image": b"", "label": "seven", "key": "", "meta": {}})
        with pytest.raises(formats.SchemaError, match="missing"):
            w.write({"image": b""})
        w.write({"image": b"", "label": 1, "key": "", "meta": {}})


def test_failed_writer_leaves_no_dataset(tmp_path):
    with pytest.raises(RuntimeError), DatasetWriter(tmp_path, FIELDS, records_per_shard=4) as w:
        for i in range(10):
            w.write({"image": b"x", "label": i, "key": "", "meta": {}})
        raise RuntimeError("the packer died")
    assert not (tmp_path / "manifest.json").exists()
    assert not list(tmp_path.glob(".*tmp*"))
    with pytest.raises(ManifestError):
        open_shards(tmp_path)


def test_resume_keeps_sealed_shards_and_is_byte_identical(tmp_path):
    def run(root, stop_at=None):
        resume = stop_at is None and (root / "_journal.jsonl").exists()
        w = DatasetWriter(root, FIELDS, records_per_shard=4, resume=resume, durable=False)
        start = w.resumed[-1]["next"] if w.resumed else 0
        for i in range(start, 18):
            if i == stop_at:
                w.abort()
                return w
            w.write({"image": bytes([i]) * i, "label": i, "key": str(i), "meta": {}},
                    progress={"next": i + 1})
        w.close()
        return w

    full, part = tmp_path / "full", tmp_path / "part"
    run(full)
    run(part, stop_at=10)
    assert not (part / "manifest.json").exists()
    w = run(part)
    assert w.resumed == [{"next": 4}, {"next": 8}]
    for p in full.iterdir():
        assert (part / p.name).read_bytes() == p.read_bytes(), p.name
    assert sorted(os.listdir(full)) == sorted(os.listdir(part))


def test_resume_with_other_options_is_refused(tmp_path):
    with pytest.raises(RuntimeError), DatasetWriter(tmp_path, FIELDS, records_per_shard=2) as w:
        for i in range(5):
            w.write({"image": b"", "label": i, "key": "", "meta": {}})
        raise RuntimeError
    with pytest.raises(ManifestError, match="cannot resume"):
        DatasetWriter(tmp_path, FIELDS, records_per_shard=3, resume=True)


def test_decompression_is_bounded(tmp_path):
    import zstandard

    noise = os.urandom(3000).hex()  # incompressible: a payload large enough to hold a bomb
    with DatasetWriter(tmp_path, FIELDS, durable=False) as w:
        w.write({"image": b"", "label": 0, "key": "", "meta": {"noise": noise}})
    bomb = zstandard.ZstdCompressor().compress(b"0" * (50 << 20))
    ds = open_shards(tmp_path)
    _, offsets, lengths = ds.spans([0], "meta")
    ds.close()
    assert len(bomb) <= int(lengths[0])
    f = tmp_path / "shard-00000.rec"
    data = bytearray(f.read_bytes())
    data[int(offsets[0]) : int(offsets[0]) + len(bomb)] = bomb
    f.write_bytes(data)
    with pytest.raises(formats.DecompressionError, match="content size"):
        open_shards(tmp_path, check_crc=False).get(0, "meta")


# -- fuzzing: random and mutated bytes reach only our own exception types -------------


def _only_our_errors(fn):
    try:
        fn()
    except ShardpackError:
        pass


@given(st.binary(max_size=400))
def test_fuzz_manifest_bytes(tmp_path_factory, blob):
    root = tmp_path_factory.mktemp("fz")
    (root / "manifest.json").write_bytes(blob)
    with pytest.raises(ShardpackError):
        open_shards(root)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c,
                                                                         max_size=4),
                    max_leaves=12))
def test_fuzz_manifest_json_values(tmp_path_factory, value):
    root = tmp_path_factory.mktemp("fz")
    (root / "manifest.json").write_text(json.dumps({"format": "shardpack", "format_version": "1.0",
                                                     "x": value}))
    with pytest.raises(ShardpackError):
        open_shards(root)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return make(tmp_path_factory.mktemp("pristine"), n=12, per_shard=12)


@pytest.fixture(scope="module")
def three_shards(tmp_path_factory):
    return make(tmp_path_factory.mktemp("three"), n=12, per_shard=4)


@given(st.data())
def test_fuzz_shard_table_bytes(tmp_path_factory, three_shards, data):
    # A valid table with bytes changed, cut or appended, its checksum made to agree:
    # what the table checks must catch, with a typed error, never Arrow's own.
    root = tmp_path_factory.mktemp("fz")
    shutil.copytree(three_shards, root, dirs_exist_ok=True)
    raw = bytearray((root / "shards.arrow").read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    raw = raw[: data.draw(st.integers(0, len(raw)))] + data.draw(st.binary(max_size=16))
    write_shard_table_bytes(root, bytes(raw))
    try:
        ds = open_shards(root)
    except ShardpackError:
        return
    with ds:  # the change left the table valid: it must then read as it says
        assert [ds[i]["label"] for i in range(len(ds))] == list(range(len(ds)))


def _mutated_copy(tmp_path_factory, src, which, edits, truncate):
    """A copy of dataset ``src`` whose file ``which`` has bytes set by ``edits``
    ((position, value), positions wrapped) and is cut at ``truncate`` (wrapped)."""
    root = tmp_path_factory.mktemp("mut")
    shutil.copytree(src, root, dirs_exist_ok=True)
    f = root / which
    data = bytearray(f.read_bytes())
    for pos, val in edits:
        data[pos % len(data)] = val
    if truncate is not None:
        data = data[: truncate % (len(data) + 1)]
    f.write_bytes(data)
    return root


@given(which=st.sampled_from(["shard-00000.rec", "shard-00000.idx", "manifest.json",
                              "shard-00000.meta.parquet"]),
       edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8),
       truncate=st.none() | st.integers(0, 10**6))
def test_fuzz_mutated_files(tmp_path_factory, pristine, which, edits, truncate):
    root = _mutated_copy(tmp_path_factory, pristine, which, edits, truncate)

    _only_our_errors(lambda: read_all(root))
    _only_our_errors(lambda: formats.verify_dataset(root))


@given(which=st.sampled_from(["shard-00000.rec", "shard-00000.idx"]),
       edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=8),
       truncate=st.none() | st.integers(0, 10**6))
def test_fuzz_mutated_files_read_unmapped(tmp_path_factory, three_shards, which, edits, truncate):
    root = _mutated_copy(tmp_path_factory, three_shards, which, edits, truncate)

    _only_our_errors(lambda: read_all(root, max_open=1))


def test_bit_flip_in_a_scalar_caught_by_batched_reads(tmp_path):
    root = make(tmp_path)
    ds = open_shards(root)
    _, offsets, _ = ds.spans([5], "label")
    ds.close()
    f = root / "shard-00000.rec"
    data = bytearray(f.read_bytes())
    data[int(offsets[0])] ^= 0x01
    f.write_bytes(data)
    assert open_shards(root, check_crc=False).scalars([5], "label")[0] == 5 ^ 0x01  # as stored
    with pytest.raises(CorruptRecordError, match="record 5"):
        open_shards(root).scalars([4, 5], "label")  # checked by default
    with pytest.raises(CorruptRecordError, match="record 5"):
        open_shards(root).payloads([5], "label")


def test_checksums_of_many_payloads_match_one_at_a_time():
    from formats.checksum import crc32c, crc32c_many, crc32c_words

    rng = np.random.default_rng(3)
    words = rng.integers(-2**63, 2**63 - 1, 300, dtype=np.int64)
    assert crc32c_words(words).tolist() == [crc32c(w.tobytes()) for w in words]
    floats = rng.random(50) * 1e9
    assert crc32c_words(floats).tolist() == [crc32c(f.tobytes()) for f in floats]
    assert crc32c_words(np.zeros(0, np.int64)).shape == (0,)
    blobs = [rng.bytes(int(n)) for n in rng.integers(0, 5000, 20)]
    assert crc32c_many(blobs).tolist() == [crc32c(b) for b in blobs]
