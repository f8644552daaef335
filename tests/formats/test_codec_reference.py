"""Conformance against the reference implementations (tfrecord, webdataset, datasets, MDS).

Those packages are test-only (``pip install tfrecord webdataset datasets``); each
test skips with the reason when its package is missing.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from formats import Field, Record
from formats.codecs.registry import convert, open_sink, open_source
from tests.helpers_codecs import CLASSES, IMAGE_FIELDS, make_records

# -- TFRecord ----------------------------------------------------------------------------


def test_tfrecord_reference_writer_to_ours(tmp_path, rng):
    tfw = pytest.importorskip("tfrecord.writer", reason="needs the tfrecord package")
    recs = make_records(rng, 6)
    w = tfw.TFRecordWriter(str(tmp_path / "ref.tfrecord"))
    for i, r in enumerate(recs):
        w.write({"image/encoded": (r["image"], "byte"), "image/class/label": (r["label"], "int"),
                 "bbox": ([0.5, 0.25, i / 8], "float"), "ids": ([1, -2, 2**40], "int"),
                 "weight": (i / 2, "float")})
    w.close()
    src = open_source("tfrecord", tmp_path / "ref.tfrecord")
    types = {f.name: (f.type, f.dtype) for f in src.fields}
    assert types == {"image": ("jpeg", None), "label": ("int", None), "bbox": ("ndarray", "<f4"),
                     "ids": ("ndarray", "<i8"), "weight": ("float", None)}
    got = list(src)
    for i, (r, g) in enumerate(zip(recs, got, strict=True)):
        assert bytes(g.fields["image"]) == r["image"] and g.fields["label"] == r["label"]
        assert g.fields["ids"].tolist() == [1, -2, 2**40]
        assert g.fields["bbox"].tolist() == [0.5, 0.25, i / 8] and g.fields["weight"] == i / 2


def test_ours_to_tfrecord_reference_loader(tmp_path, rng):
    reader = pytest.importorskip("tfrecord.reader", reason="needs the tfrecord package")
    recs = make_records(rng, 5)
    fields = (*IMAGE_FIELDS, Field("vec", "ndarray", dtype="<i8", shape=(3,)))
    with open_sink("tfrecord", tmp_path / "out", fields, CLASSES, index=True) as sink:
        for i, r in enumerate(recs):
            sink.write(Record({"image": r["image"], "label": r["label"], "key": r["key"],
                               "vec": np.array([i, -i, 7])}))
    loader = reader.tfrecord_loader(str(tmp_path / "out" / "shard-00000.tfrecord"),
                                    str(tmp_path / "out" / "shard-00000.idx"), shard=(0, 1))
    n = 0
    # shard=(0, 1) reads through our index; without it the loader starts at a random
    # record. It reuses one buffer for every record: compare each before the next.
    for i, (r, ex) in enumerate(zip(recs, loader, strict=True)):
        n += 1
        assert bytes(ex["image/encoded"]) == r["image"]
        assert ex["image/class/label"].tolist() == [r["label"]]
        assert bytes(ex["image/filename"]).decode() == r["key"]
        assert ex["vec"].tolist() == [i, -i, 7]
    assert n == len(recs)


def test_tfrecord_reference_gzip(tmp_path, rng):
    reader = pytest.importorskip("tfrecord.reader", reason="needs the tfrecord package")
    recs = make_records(rng, 4)
    with open_sink("tfrecord", tmp_path / "gz", IMAGE_FIELDS, compression="gzip") as sink:
        for r in recs:
            sink.write(Record({f.name: r[f.name] for f in IMAGE_FIELDS}))
    loader = reader.tfrecord_loader(str(tmp_path / "gz" / "shard-00000.tfrecord.gz"), None,
                                    compression_type="gzip")
    assert [int(x["image/class/label"][0]) for x in loader] == [r["label"] for r in recs]


def test_unpacked_repeated_fields(rng):
    """proto2-style writers emit repeated scalars unpacked; the decoder takes both."""
    pytest.importorskip("google.protobuf", reason="needs protobuf to write unpacked fields")
    from formats.codecs.tfexample import decode_example

    def varint(v):
        v &= (1 << 64) - 1
        out = bytearray()
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        return bytes(out + bytes([v]))

    def ld(num, payload):
        return varint(num << 3 | 2) + varint(len(payload)) + payload

    ints = b"".join(varint(1 << 3 | 0) + varint(v) for v in (3, -1))
    floats = b"".join(varint(1 << 3 | 5) + struct.pack("<f", v) for v in (1.5, -2.0))
    feats = (ld(1, ld(1, b"n") + ld(2, ld(3, ints)))
             + ld(1, ld(1, b"f") + ld(2, ld(2, floats))))
    ex = decode_example(ld(1, feats))
    assert ex["n"].tolist() == [3, -1] and ex["f"].tolist() == [1.5, -2.0]


# -- WebDataset --------------------------------------------------------------------------


def test_webdataset_reference_writer_to_ours_and_back(tmp_path, rng):
    wds = pytest.importorskip("webdataset", reason="needs the webdataset package")
    recs = make_records(rng, 7)
    with wds.TarWriter(str(tmp_path / "ref-000.tar")) as w:
        for i, r in enumerate(recs):
            w.write({"__key__": f"s{i:04d}", "jpg": r["image"], "cls": r["label"],
                     "json": {"i": i}, "txt": f"text {i}"})
    src = open_source("webdataset", str(tmp_path / "ref-{000..000}.tar"))
    assert {f.name: f.type for f in src.fields} == {
        "image": "jpeg", "label": "int", "key": "str", "json": "json", "txt": "str"}
    got = list(src)
    assert [g.fields["key"] for g in got] == [f"s{i:04d}" for i in range(7)]
    assert all(bytes(g.fields["image"]) == r["image"] for g, r in zip(got, recs, strict=True))

    convert("webdataset", tmp_path / "ref-000.tar", "shards", tmp_path / "sh", durable=False)
    convert("shards", tmp_path / "sh", "webdataset", tmp_path / "out")
    ds = wds.WebDataset(str(tmp_path / "out" / "shard-00000.tar"), shardshuffle=False)
    back = list(ds)
    assert [b["__key__"] for b in back] == [f"s{i:04d}" for i in range(7)]
    for i, (b, r) in enumerate(zip(back, recs, strict=True)):
        assert b["jpg"] == r["image"] and int(b["cls"]) == r["label"]
        assert json.loads(b["json"]) == {"i": i} and b["txt"].decode() == f"text {i}"


# -- Parquet / Hugging Face datasets -----------------------------------------------------


def test_hf_datasets_parquet_to_ours(tmp_path, rng):
    datasets = pytest.importorskip("datasets", reason="needs the datasets package")
    recs = make_records(rng, 6)
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=CLASSES)})
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": r["image"], "path": None} for r in recs],
         "label": [r["label"] for r in recs]}, features=features)
    ds = ds.cast_column("image", datasets.Image())
    ds.to_parquet(str(tmp_path / "hf.parquet"))
    src = open_source("parquet", tmp_path / "hf.parquet")
    assert src.classes == tuple(CLASSES)
    got = list(src)
    assert [g.fields["label"] for g in got] == [r["label"] for r in recs]
    assert [bytes(g.fields["image"]) for g in got] == [r["image"] for r in recs]


def test_ours_parquet_read_by_hf_datasets(tmp_path, rng):
    datasets = pytest.importorskip("datasets", reason="needs the datasets package")
    recs = make_records(rng, 5)
    with open_sink("parquet", tmp_path / "out", IMAGE_FIELDS, CLASSES) as sink:
        for r in recs:
            sink.write(Record({f.name: r[f.name] for f in IMAGE_FIELDS}))
    ds = datasets.Dataset.from_parquet(str(tmp_path / "out" / "shard-00000.parquet"))
    assert isinstance(ds.features["image"], datasets.Image)
    assert ds.features["label"].names == CLASSES
    raw = ds.cast_column("image", datasets.Image(decode=False))
    assert [x["bytes"] for x in raw["image"]] == [r["image"] for r in recs]
    assert raw["label"] == [r["label"] for r in recs]


# -- MDS -----------------------------------------------------------------------------------


def test_mds_reference_writer(tmp_path, rng):
    """Runs where mosaicml-streaming imports (its pins clash with this environment's
    numpy/huggingface-hub, so here it usually skips; tests/formats/test_codec_mds.py covers the
    layout with files crafted byte for byte as its MDSWriter writes them)."""
    streaming = pytest.importorskip("streaming", reason="needs an importable mosaicml-streaming")
    recs = make_records(rng, 5)
    cols = {"jpg": "bytes", "label": "int", "name": "str", "w": "float32", "meta": "json"}
    with streaming.MDSWriter(out=str(tmp_path / "mds"), columns=cols, compression="zstd") as w:
        for i, r in enumerate(recs):
            w.write({"jpg": r["image"], "label": r["label"], "name": r["key"], "w": np.float32(i),
                     "meta": {"i": i}})
    got = list(open_source("mds", tmp_path / "mds"))
    assert [g.fields["label"] for g in got] == [r["label"] for r in recs]
    assert [g.fields["jpg"] for g in got] == [r["image"] for r in recs]
