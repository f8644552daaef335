"""Round trips through DatasetWriter and ShardDataset: what goes in comes out."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import formats
from formats import DatasetWriter, Field, open_shards

SCALAR_STRATEGIES = {
    "bytes": st.binary(max_size=300),
    "jpeg": st.binary(max_size=300),
    "int": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(allow_nan=False),
    "str": st.text(max_size=40),
    "json": st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=4),
}


@st.composite
def schemas_and_records(draw):
    names = draw(st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=5, unique=True))
    fields = []
    for name in names:
        kind = draw(st.sampled_from([*SCALAR_STRATEGIES, "ndarray"]))
        compress = kind not in ("int", "float") and draw(st.booleans())
        if kind == "ndarray":
            shape = draw(st.sampled_from([(3,), (None, 2), (2, 2)]))
            dtype = draw(st.sampled_from(["<u1", "<i4", "<f8", "<f2"]))
            fields.append(Field(name, "ndarray", "zstd" if compress else "none", dtype, shape))
        else:
            fields.append(Field(name, kind, "zstd" if compress else "none"))
    n = draw(st.integers(0, 30))
    records = []
    for _ in range(n):
        rec = {}
        for f in fields:
            if f.type == "ndarray":
                rows = draw(st.integers(0, 4))
                shape = tuple(rows if d is None else d for d in f.shape)
                rec[f.name] = np.arange(int(np.prod(shape)), dtype=f.dtype).reshape(shape)
            else:
                rec[f.name] = draw(SCALAR_STRATEGIES[f.type])
        records.append(rec)
    return fields, records


def _same(field, got, want):
    if field.type in ("bytes", "jpeg"):
        return bytes(got) == want
    if field.type == "ndarray":
        return got.dtype == np.dtype(field.dtype) and np.array_equal(got, want)
    if field.type == "json":
        return got == json.loads(json.dumps(want))
    return got == want


@given(
    data=schemas_and_records(),
    per_shard=st.integers(1, 12),
    alignment=st.sampled_from([8, 64, 4096]),
)
def test_random_schemas_round_trip(tmp_path_factory, data, per_shard, alignment):
    fields, records = data
    root = tmp_path_factory.mktemp("ds")
    with DatasetWriter(root, fields, records_per_shard=per_shard, alignment=alignment,
                       durable=False) as w:
        for r in records:
            w.write(r)
    with open_shards(root, check_crc=True) as ds:
        assert len(ds) == len(records)
        assert [f.name for f in ds.fields] == [f.name for f in fields]
        for i, want in enumerate(records):
            got = ds[i]
            for f in fields:
                assert _same(f, got[f.name], want[f.name]), (i, f)
                if f.type in ("jpeg", "bytes", "ndarray") and f.compression == "none":
                    assert int(ds.spans([i], f.name)[1][0]) % alignment == 0
        assert formats.verify_dataset(root) == []


def test_empty_dataset(tmp_path):
    with DatasetWriter(tmp_path, [Field("x", "bytes")]):
        pass
    ds = open_shards(tmp_path)
    assert len(ds) == 0
    assert ds.metadata().num_rows == 0
    with pytest.raises(IndexError):
        ds[0]
    assert formats.verify_dataset(tmp_path) == []


def test_zero_length_fields_and_unicode_keys(tmp_path):
    fields = [Field("image", "jpeg"), Field("key", "str"), Field("note", "str", "zstd")]
    keys = ["普通话/猫.jpg", "emoji 🐱 file.jpg", "", "a" * 1000]
    with DatasetWriter(tmp_path, fields, records_per_shard=2) as w:
        for k in keys:
            w.write({"image": b"", "key": k, "note": ""})
    ds = open_shards(tmp_path, check_crc=True)
    assert [ds.get(i, "key") for i in range(len(keys))] == keys
    assert all(bytes(ds.get(i, "image")) == b"" for i in range(len(keys)))
    assert ds.metadata().column("key").to_pylist() == keys


def test_field_larger_than_64_mib(tmp_path):
    big = np.random.default_rng(0).integers(0, 256, (64 << 20) + 12345, np.uint8).tobytes()
    with DatasetWriter(tmp_path, [Field("blob", "bytes")], durable=False) as w:
        w.write({"blob": b"small"})
        w.write({"blob": big})
    ds = open_shards(tmp_path, check_crc=True)
    view = ds.get(1, "blob")
    assert isinstance(view, memoryview) and len(view) == len(big)
    assert view == big


def test_bytes_fields_are_zero_copy_views(tmp_path):
    with DatasetWriter(tmp_path, [Field("image", "jpeg"), Field("a", "ndarray", dtype="<f4",
                                                                shape=(4,))]) as w:
        w.write({"image": b"\xff\xd8hello", "a": np.arange(4, dtype=np.float32)})
    ds = open_shards(tmp_path)
    rec = ds[0]
    shard = ds.shards[0]
    assert isinstance(rec["image"], memoryview)
    assert rec["image"].obj is shard.view.obj  # a slice of the mmap, not a copy
    assert np.shares_memory(rec["a"], shard.data)
    assert not rec["a"].flags.writeable


def test_scalars_and_spans_vectorized(tmp_path, rng):
    fields = [Field("label", "int"), Field("score", "float"), Field("image", "bytes")]
    n = 500
    labels = rng.integers(-1000, 1000, n)
    scores = rng.random(n)
    with DatasetWriter(tmp_path, fields, records_per_shard=37, alignment=8) as w:
        for i in range(n):
            w.write({"label": int(labels[i]), "score": float(scores[i]), "image": bytes([i % 256]) * (i % 7)})
    ds = open_shards(tmp_path)
    idx = rng.integers(0, n, 2000)
    assert np.array_equal(ds.scalars(idx, "label"), labels[idx])
    assert np.array_equal(ds.scalars(idx, "score"), scores[idx])
    views = ds.payloads(idx, "image")
    assert [bytes(v) for v in views] == [bytes([i % 256]) * (i % 7) for i in idx.tolist()]
    with pytest.raises(IndexError):
        ds.scalars([n], "label")
    with pytest.raises(formats.SchemaError):
        ds.scalars([0], "image")


def test_metadata_table_without_data_files(tmp_path):
    with DatasetWriter(tmp_path, [Field("image", "jpeg"), Field("label", "int"), Field("key", "str")],
                       records_per_shard=3, classes=["cat", "dog"]) as w:
        for i in range(7):
            w.write({"image": b"x" * i, "label": i % 2, "key": f"k{i}"},
                    meta={"width": 100 + i, "height": 50})
    for p in tmp_path.glob("*.rec"):
        p.unlink()  # the metadata table must not need them
    table = formats.read_metadata(tmp_path)
    assert table.column("label").to_pylist() == [i % 2 for i in range(7)]
    assert table.column("width").to_pylist() == [100 + i for i in range(7)]
    assert table.column("key").to_pylist() == [f"k{i}" for i in range(7)]
    # size = stored bytes of the record: image (i) + label (8) + key (2)
    assert table.column("size").to_pylist() == [i + 8 + 2 for i in range(7)]


def test_manifest_records_how_it_was_made(tmp_path):
    made = {"tool": "shardpack 0.1.0", "source": "/data/x", "options": {"shuffle": True}}
    with DatasetWriter(tmp_path, [Field("x", "int")], created_by=made, classes=["a"]) as w:
        w.write({"x": 1})
    m = formats.read_manifest(tmp_path)
    assert m.created_by == made and m.classes == ("a",) and m.records == 1


def test_dataset_pickles_without_maps(tmp_path):
    import pickle

    with DatasetWriter(tmp_path, [Field("x", "bytes")]) as w:
        w.write({"x": b"abc"})
    ds = open_shards(tmp_path)
    blob = pickle.dumps(ds)
    assert len(blob) < 4096
    assert bytes(pickle.loads(blob).get(0, "x")) == b"abc"


def test_zstd_dictionary_field(tmp_path):
    import zstandard

    samples = [json.dumps({"caption": f"a photo of a cat number {i}"}).encode() for i in range(300)]
    dictionary = zstandard.train_dictionary(1024, samples).as_bytes()
    f = Field("meta", "json", "zstd")
    with DatasetWriter(tmp_path, [f], dictionaries={"meta": dictionary}) as w:
        for i in range(50):
            w.write({"meta": {"caption": f"a photo of a cat number {i}"}})
    ds = open_shards(tmp_path, check_crc=True)
    assert ds.get(49, "meta") == {"caption": "a photo of a cat number 49"}
    assert formats.verify_dataset(tmp_path) == []


@pytest.mark.slow
def test_a_million_tiny_records_open_and_lookup_do_not_scale(tmp_path):
    n = 1_000_000
    with DatasetWriter(tmp_path, [Field("label", "int")], records_per_shard=250_000,
                       alignment=8, durable=False) as w:
        for i in range(n):
            w.write({"label": i})
    t0 = time.perf_counter()
    ds = open_shards(tmp_path)
    opened = time.perf_counter() - t0
    assert len(ds) == n
    # Generous bound: opening maps 4 shards and reads a manifest, nothing per record.
    assert opened < 0.5, opened
    idx = np.random.default_rng(1).integers(0, n, 100_000)
    assert np.array_equal(ds.scalars(idx, "label"), idx)
    assert ds.get(n - 1, "label") == n - 1
