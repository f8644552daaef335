"""Issue 18: conversions that never lie. Every record survives shards -> F -> shards
exactly (bytes, label, key, every extra field, its type), for each foreign format F
and each awkward dataset; where a hop cannot carry a field, the hop refuses.

The reference libraries judge where installed: ``webdataset`` reads our tars,
``datasets`` our Parquet (and writes the path-image Parquet we read), ``tfrecord``
our TFRecords and their DALI index.
"""

from __future__ import annotations

import io
import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest

from formats import DatasetWriter, Field, Record, SchemaError, open_shards, verify_dataset
from formats.codecs.registry import convert, open_sink, open_source
from formats.errors import DecompressionError, FormatError, UnsafePathError
from formats.fields import BYTES_TYPES
from tests.helpers_codecs import make_jpeg

FOREIGN = ("tfrecord", "webdataset", "parquet")


def make_png(rng: np.random.Generator, h: int = 9, w: int = 7) -> bytes:
    ok, buf = cv2.imencode(".png", rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
    assert ok
    return buf.tobytes()


@dataclass
class Variant:
    name: str
    fields: tuple[Field, ...]
    classes: list[str] | None
    records: list[dict]


BASE = (Field("image", "image"), Field("label", "int"), Field("key", "str"))
EXTRAS = (Field("n", "int"), Field("score", "float"), Field("caption", "str"),
          Field("emb", "ndarray", dtype="<f4", shape=(3,)), Field("meta", "json"),
          Field("tokens", "ndarray", dtype="<i4", shape=(None,)), Field("blob", "bytes"))


def _records(rng, labels, keys=None, png_every=0):
    out = []
    for i, label in enumerate(labels):
        png = png_every and i % png_every == 1
        out.append({"image": make_png(rng, 6 + i % 3) if png else make_jpeg(rng, 8, 8 + i % 3),
                    "label": label, "key": keys[i] if keys else f"c{label}/{i:03d}.jpg"})
    return out


def variants(rng) -> list[Variant]:
    extras = _records(rng, [i % 3 for i in range(7)])
    for i, r in enumerate(extras):
        r.update(n=-(i << 40) + 7, score=i / 4 - 1.5, caption=f"caption {i} é ✓",
                 emb=np.arange(3, dtype=np.float32) * i + 0.5,
                 meta={"i": i, "tags": ["a", "b"], "x": None},
                 tokens=np.arange(i, dtype=np.int32) - 2, blob=bytes([i]) * i)
    keys = ["a.b/c.d.jpg", "bird/img_00002.jpg", "s/c.d.jpg", "s/c.e.jpg", "plain",
            "x/y.tar.gz", "../up.png", "/abs/k.JPG", "ü/ñ.v2.jpeg", "s/c.d.jpg"]
    return [
        Variant("mixed", BASE, ["cat", "dog", "emu"], _records(rng, [0, 1, 2, 0, 1, 2, 1, 0],
                                                               png_every=2)),
        Variant("empty_class", BASE, ["a", "b", "c", "d"], _records(rng, [0, 2, 0, 2, 2])),
        Variant("unnamed12", BASE, None, _records(rng, [11, 0, 10, 1, 2, 9, 3, 4, 5, 6, 7, 8])),
        Variant("names", BASE, ["a b", "b/c", "b_c", " z", "é猫", "Ω/ω", "x.y"],
                _records(rng, [6, 5, 4, 3, 2, 1, 0, 1])),
        Variant("keys", BASE, ["k0", "k1"], _records(rng, [i % 2 for i in range(10)], keys=keys,
                                                     png_every=3)),
        Variant("extras", BASE + EXTRAS, ["x", "y", "z"], extras),
    ]


def _write_shards(root: Path, v: Variant) -> Path:
    with DatasetWriter(root, v.fields, classes=v.classes, records_per_shard=3,
                       durable=False) as w:
        for r in v.records:
            w.write({f.name: r[f.name] for f in v.fields})
    return root


def _same(f: Field, got, want) -> bool:
    if f.type in BYTES_TYPES:
        return isinstance(got, (bytes, bytearray, memoryview)) and bytes(got) == bytes(want)
    if f.type == "ndarray":
        return (isinstance(got, np.ndarray) and got.dtype == np.dtype(f.dtype)
                and got.shape == np.shape(want) and np.array_equal(got, want))
    if f.type == "float":
        return isinstance(got, float) and (got == want or (math.isnan(got) and math.isnan(want)))
    return type(got) is type(want) and got == want


def _stored(v: Variant) -> tuple[Field, ...]:
    """The schema as written: the image field typed by what it holds."""
    png = any(r["image"].startswith(b"\x89PNG") for r in v.records)
    return tuple(Field("image", "image" if png else "jpeg") if f.name == "image" else f
                 for f in v.fields)


def _check(label: str, fields, classes, records, v: Variant) -> None:
    want = _stored(v)
    assert [(f.name, f.type, f.dtype, f.shape) for f in fields] == [
        (f.name, f.type, f.dtype, f.shape) for f in want], label
    assert classes == (None if v.classes is None else tuple(v.classes)), label
    assert len(records) == len(v.records), label
    for i, (got, r) in enumerate(zip(records, v.records, strict=True)):
        assert set(got) == {f.name for f in want}, (label, i)
        for f in want:
            assert _same(f, got[f.name], r[f.name]), (label, i, f.name, got[f.name], r[f.name])


@pytest.mark.parametrize("fmt", FOREIGN)
def test_shards_to_foreign_and_back_is_exact(tmp_path, rng, fmt):
    for v in variants(rng):
        src = _write_shards(tmp_path / v.name / "a", v)
        _check(f"{v.name}: shards", open_shards(src).fields, open_shards(src).classes,
               [r.fields for r in open_source("shards", src)], v)
        out = tmp_path / v.name / fmt
        assert convert("shards", src, fmt, out, records_per_shard=4) == len(v.records)
        back = open_source(fmt, out)
        _check(f"{v.name}: {fmt}", back.fields, back.classes, [r.fields for r in back], v)
        convert(fmt, out, "shards", tmp_path / v.name / "b", durable=False)
        ds = open_shards(tmp_path / v.name / "b")
        _check(f"{v.name}: {fmt} -> shards", ds.fields, ds.classes,
               [ds[i] for i in range(len(ds))], v)
        assert verify_dataset(tmp_path / v.name / "b") == []


# -- what a hop cannot carry, it refuses ---------------------------------------------------


def _one(tmp_path, rng, fields, record, fmt):
    with open_sink(fmt, tmp_path / fmt, fields, None) as sink:
        sink.write(Record(record))


def test_tfrecord_refuses_a_float_that_float32_would_round(tmp_path, rng):
    fields = (Field("image", "jpeg"), Field("score", "float"))
    with pytest.raises(SchemaError, match=r"tfrecord sink: field 'score' \(float\) of record 0 "
                                          r"holds a value float32 does not hold exactly"):
        _one(tmp_path, rng, fields, {"image": make_jpeg(rng), "score": 0.1}, "tfrecord")
    assert not list((tmp_path / "tfrecord").glob("shard-*"))  # nothing half written
    arr = (Field("image", "jpeg"), Field("w", "ndarray", dtype="<f8", shape=(2,)))
    with pytest.raises(SchemaError, match=r"field 'w' .* float32 does not hold exactly"):
        _one(tmp_path / "2", rng, arr, {"image": make_jpeg(rng), "w": np.array([0.5, 0.1])},
             "tfrecord")
    for fmt in ("webdataset", "parquet"):  # these hold float64 exactly
        _one(tmp_path, rng, fields, {"image": make_jpeg(rng), "score": 0.1}, fmt)
        assert next(iter(open_source(fmt, tmp_path / fmt))).fields["score"] == 0.1


@pytest.mark.parametrize(("fmt", "fields", "match"), [
    ("tfrecord", (Field("image", "jpeg"), Field("m", "ndarray", dtype="<f4", shape=(None, None))),
     r"tfrecord sink cannot hold field 'm'"),
    ("parquet", (Field("image", "jpeg"), Field("c", "ndarray", dtype="<c8", shape=(2,))),
     r"parquet sink cannot hold field 'c': an ndarray of dtype <c8"),
    ("parquet", (Field("label", "int"),), r"parquet sink: .*no 'image' field"),
    ("parquet", (Field("image", "jpeg"), Field("key", "int")), r"field 'key' is the image's path"),
    ("webdataset", (Field("image", "jpeg"), Field("key", "int")), r"field 'key' names the sample"),
    ("webdataset", (Field("image", "jpeg"), Field("png", "bytes")),
     r"webdataset sink cannot hold field 'png'"),
    ("webdataset", (Field("image", "jpeg"), Field("a/b", "bytes")),
     r"webdataset sink cannot hold field 'a/b'"),
])
def test_a_sink_refuses_at_open_what_it_cannot_hold(tmp_path, fmt, fields, match):
    with pytest.raises(SchemaError, match=match):
        open_sink(fmt, tmp_path / "out", fields, None)
    assert not (tmp_path / "out").exists()  # refused before anything was made


def test_refusal_stops_a_conversion_before_it_writes(tmp_path, rng):
    v = Variant("c", (Field("image", "jpeg"), Field("c", "ndarray", dtype="<c8", shape=(2,))),
                None, [{"image": make_jpeg(rng), "c": np.array([1 + 2j, 3j], np.complex64)}])
    _write_shards(tmp_path / "a", v)
    with pytest.raises(SchemaError, match="parquet sink cannot hold field 'c'"):
        convert("shards", tmp_path / "a", "parquet", tmp_path / "pq")
    convert("shards", tmp_path / "a", "webdataset", tmp_path / "wds")  # .npy holds complex
    got = next(iter(open_source("webdataset", tmp_path / "wds"))).fields["c"]
    assert got.dtype == np.complex64 and got.tolist() == [1 + 2j, 3j]
    convert("shards", tmp_path / "a", "tfrecord", tmp_path / "tf")  # as the array's bytes
    assert next(iter(open_source("tfrecord", tmp_path / "tf"))).fields["c"].tolist() == [
        1 + 2j, 3j]


# -- mixed image formats from foreign writers -------------------------------------------------


def test_webdataset_mixed_jpg_png_from_the_reference_writer(tmp_path, rng):
    wds = pytest.importorskip("webdataset", reason="needs the webdataset package")
    images = [make_jpeg(rng), make_png(rng), make_jpeg(rng), make_png(rng)]
    exts = ["jpg", "png", "jpeg", "png"]
    with wds.TarWriter(str(tmp_path / "ref.tar")) as w:
        for i, (data, ext) in enumerate(zip(images, exts, strict=True)):
            w.write({"__key__": f"s{i}", ext: data, "cls": i % 2})
    src = open_source("webdataset", tmp_path / "ref.tar")
    assert [f.name for f in src.fields] == ["image", "label", "key"]
    got = list(src)
    assert [bytes(g.fields["image"]) for g in got] == images
    assert [g.fields["key"] for g in got] == ["s0", "s1", "s2", "s3"]  # a key of elsewhere
    convert("webdataset", tmp_path / "ref.tar", "shards", tmp_path / "sh", durable=False)
    ds = open_shards(tmp_path / "sh")
    assert {f.name: f.type for f in ds.fields}["image"] == "image"
    assert [bytes(ds[i]["image"]) for i in range(4)] == images


def test_webdataset_two_image_members_stay_two_fields(tmp_path, rng):
    """An image and a mask: each extension keeps its own field, as before."""
    wds = pytest.importorskip("webdataset", reason="needs the webdataset package")
    with wds.TarWriter(str(tmp_path / "seg.tar")) as w:
        for i in range(3):
            w.write({"__key__": f"s{i}", "jpg": make_jpeg(rng), "png": make_png(rng)})
    src = open_source("webdataset", tmp_path / "seg.tar")
    assert sorted(f.name for f in src.fields) == ["image", "key", "png"]
    assert len(list(src)) == 3


def test_parquet_mixed_formats_written_by_datasets(tmp_path, rng):
    datasets = pytest.importorskip("datasets", reason="needs the datasets package")
    images = [make_jpeg(rng), make_png(rng), make_png(rng), make_jpeg(rng)]
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=["b/c", " z", "é"])})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in images],
                                     "label": [0, 1, 2, 1]}, features=features)
    ds.to_parquet(str(tmp_path / "hf.parquet"))
    src = open_source("parquet", tmp_path / "hf.parquet")
    assert src.classes == ("b/c", " z", "é")
    assert [bytes(r.fields["image"]) for r in src] == images
    convert("parquet", tmp_path / "hf.parquet", "shards", tmp_path / "sh", durable=False)
    out = open_shards(tmp_path / "sh")
    assert {f.name: f.type for f in out.fields}["image"] == "image"
    assert [out[i]["label"] for i in range(4)] == [0, 1, 2, 1]


# -- the reference readers judge our output ---------------------------------------------------


def test_our_webdataset_read_by_webdataset(tmp_path, rng):
    wds = pytest.importorskip("webdataset", reason="needs the webdataset package")
    v = next(x for x in variants(rng) if x.name == "keys")
    _write_shards(tmp_path / "a", v)
    convert("shards", tmp_path / "a", "webdataset", tmp_path / "wds", records_per_shard=100)
    samples = list(wds.WebDataset(str(tmp_path / "wds" / "shard-00000.tar"), shardshuffle=False))
    assert len(samples) == len(v.records)
    for s, r in zip(samples, v.records, strict=True):
        ext = "png" if r["image"].startswith(b"\x89PNG") else "jpg"
        assert s[ext] == r["image"] and not ({"png", "jpg"} - {ext}) & set(s)  # never png as .jpg
        assert s["key.txt"].decode() == r["key"] and int(s["cls"]) == r["label"]
        assert "." not in s["__key__"].rsplit("/", 1)[-1]
    assert [s["__key__"] for s in samples[:4]] == ["a.b/c", "bird/img_00002", "s/c", "s/c_00000003"]
    assert json.loads((tmp_path / "wds" / "classes.json").read_text("utf-8")) == v.classes


def test_our_webdataset_types_read_by_webdataset(tmp_path, rng):
    wds = pytest.importorskip("webdataset", reason="needs the webdataset package")
    v = next(x for x in variants(rng) if x.name == "extras")
    _write_shards(tmp_path / "a", v)
    convert("shards", tmp_path / "a", "webdataset", tmp_path / "wds")
    samples = list(wds.WebDataset(str(tmp_path / "wds" / "shard-00000.tar"), shardshuffle=False))
    for s, r in zip(samples, v.records, strict=True):
        assert int(s["n"]) == r["n"] and float(s["score"]) == r["score"]
        assert s["caption"].decode() == r["caption"] and json.loads(s["meta"]) == r["meta"]
        assert np.array_equal(np.load(io.BytesIO(s["emb.npy"])), r["emb"])
        assert np.array_equal(np.load(io.BytesIO(s["tokens.npy"])), r["tokens"])
    schema = json.loads((tmp_path / "wds" / "schema.json").read_text())
    assert schema["names"]["key"] == "key.txt" and schema["names"]["emb"] == "emb.npy"


def test_our_parquet_read_by_datasets(tmp_path, rng):
    datasets = pytest.importorskip("datasets", reason="needs the datasets package")
    for v in variants(rng):
        if v.name not in ("extras", "empty_class", "names"):
            continue
        _write_shards(tmp_path / v.name, v)
        convert("shards", tmp_path / v.name, "parquet", tmp_path / f"{v.name}.pq")
        ds = datasets.Dataset.from_parquet(str(tmp_path / f"{v.name}.pq" / "shard-00000.parquet"))
        assert isinstance(ds.features["image"], datasets.Image)
        assert ds.features["label"].names == v.classes  # label i is name i, empty ones kept
        raw = ds.cast_column("image", datasets.Image(decode=False))
        assert [x["bytes"] for x in raw["image"]] == [r["image"] for r in v.records]
        assert [x["path"] for x in raw["image"]] == [r["key"] for r in v.records]
        assert raw["label"] == [r["label"] for r in v.records]
        if v.name == "extras":
            assert raw["emb"] == [r["emb"].tolist() for r in v.records]
            assert raw["tokens"] == [r["tokens"].tolist() for r in v.records]
            assert raw["score"] == [r["score"] for r in v.records]
            assert [json.loads(m) for m in raw["meta"]] == [r["meta"] for r in v.records]


def test_our_tfrecord_read_by_tfrecord_with_dali_index_by_default(tmp_path, rng):
    reader = pytest.importorskip("tfrecord.reader", reason="needs the tfrecord package")
    from tfrecord.tools.tfrecord2idx import create_index
    v = next(x for x in variants(rng) if x.name == "extras")
    _write_shards(tmp_path / "a", v)
    convert("shards", tmp_path / "a", "tfrecord", tmp_path / "tf", records_per_shard=4)
    files = sorted((tmp_path / "tf").glob("shard-*.tfrecord"))
    assert len(files) == 2
    for f in files:  # our index is byte for byte what tfrecord2idx writes
        create_index(str(f), str(tmp_path / "ref.idx"))
        assert f.with_suffix(".idx").read_bytes() == (tmp_path / "ref.idx").read_bytes()
    got = []
    for f in files:
        for ex in reader.tfrecord_loader(str(f), str(f.with_suffix(".idx")), shard=(0, 1)):
            got.append((bytes(ex["image/encoded"]), int(ex["image/class/label"][0]),
                        bytes(ex["image/filename"]).decode(), float(ex["score"][0]),
                        ex["emb"].tolist(), int(ex["n"][0])))
    assert got == [(r["image"], r["label"], r["key"], r["score"], r["emb"].tolist(), r["n"])
                   for r in v.records]


def test_tfrecord_index_can_be_turned_off(tmp_path, rng):
    v = next(x for x in variants(rng) if x.name == "empty_class")
    _write_shards(tmp_path / "a", v)
    convert("shards", tmp_path / "a", "tfrecord", tmp_path / "off", index=False)
    assert not list((tmp_path / "off").glob("*.idx"))
    convert("shards", tmp_path / "a", "tfrecord", tmp_path / "gz", compression="gzip")
    assert not list((tmp_path / "gz").glob("*.idx"))  # an index locates uncompressed bytes


# -- Hugging Face Parquet whose images are paths --------------------------------------------


def _hf_path_parquet(tmp_path, rng, datasets, paths, where):
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=["a", "b"])})
    ds = datasets.Dataset.from_dict({"image": paths, "label": [i % 2 for i in range(len(paths))]},
                                    features=features)
    where.parent.mkdir(parents=True, exist_ok=True)
    ds.to_parquet(str(where))
    return where


def test_parquet_image_paths_written_by_datasets(tmp_path, rng, monkeypatch):
    datasets = pytest.importorskip("datasets", reason="needs the datasets package")
    root = tmp_path / "hf"
    (root / "imgs").mkdir(parents=True)
    images = [make_jpeg(rng), make_png(rng), make_jpeg(rng)]
    for i, data in enumerate(images):
        (root / "imgs" / f"{i}.img").write_bytes(data)
    monkeypatch.chdir(root)  # datasets writes the paths as given: relative to here
    pq = _hf_path_parquet(tmp_path, rng, datasets, [f"imgs/{i}.img" for i in range(3)],
                          root / "data.parquet")
    src = open_source("parquet", pq)
    got = list(src)
    assert [bytes(g.fields["image"]) for g in got] == images
    assert [g.fields["key"] for g in got] == [f"imgs/{i}.img" for i in range(3)]
    assert src.classes == ("a", "b")
    convert("parquet", pq, "shards", tmp_path / "sh", durable=False)
    assert [bytes(r.fields["image"]) for r in open_source("shards", tmp_path / "sh")] == images


def test_parquet_image_path_outside_its_folder_needs_image_root(tmp_path, rng, monkeypatch):
    datasets = pytest.importorskip("datasets", reason="needs the datasets package")
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "0.jpg").write_bytes(make_jpeg(rng))
    monkeypatch.chdir(tmp_path / "imgs")
    up = _hf_path_parquet(tmp_path, rng, datasets, ["../imgs/0.jpg"], tmp_path / "meta" / "a.parquet")
    with pytest.raises(UnsafePathError, match=r"a.parquet record 0: image path leads outside the "
                                              r"Parquet file's folder: found '../imgs/0.jpg'"):
        list(open_source("parquet", up))
    assert len(list(open_source("parquet", up, image_root=tmp_path))) == 1
    absolute = _hf_path_parquet(tmp_path, rng, datasets, [str(tmp_path / "imgs" / "0.jpg")],
                                tmp_path / "imgs" / "b.parquet")
    with pytest.raises(UnsafePathError, match="record 0: image path leads outside"):
        open_source("parquet", absolute)  # even inside its folder: absolute needs image_root
    assert len(list(open_source("parquet", absolute, image_root=tmp_path / "imgs"))) == 1
    with pytest.raises(UnsafePathError, match="leads outside image_root"):
        open_source("parquet", up, image_root=tmp_path / "meta")
    (tmp_path / "imgs" / "0.jpg").unlink()
    with pytest.raises(FormatError, match=r"b.parquet record 0: image file of row 0"):
        open_source("parquet", absolute, image_root=tmp_path)


def test_parquet_image_symlink_out_of_its_folder_is_refused(tmp_path, rng, monkeypatch):
    datasets = pytest.importorskip("datasets", reason="needs the datasets package")
    (tmp_path / "secret.jpg").write_bytes(make_jpeg(rng))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.jpg").symlink_to(tmp_path / "secret.jpg")
    monkeypatch.chdir(tmp_path / "d")
    pq = _hf_path_parquet(tmp_path, rng, datasets, ["x.jpg"], tmp_path / "d" / "p.parquet")
    with pytest.raises(UnsafePathError, match=r"found 'x\.jpg'"):
        open_source("parquet", pq)


# -- TFRecords compressed as TensorFlow compresses them ----------------------------------------


def test_tfrecord_zlib_and_gzip_are_read(tmp_path, rng):
    v = next(x for x in variants(rng) if x.name == "mixed")
    _write_shards(tmp_path / "a", v)
    convert("shards", tmp_path / "a", "tfrecord", tmp_path / "tf", records_per_shard=100)
    plain = (tmp_path / "tf" / "shard-00000.tfrecord").read_bytes()
    (tmp_path / "z").mkdir()
    # TensorFlow's compression_type="ZLIB": one zlib stream of the framed records.
    (tmp_path / "z" / "data.tfrecord").write_bytes(zlib.compress(plain, 6))
    got = list(open_source("tfrecord", tmp_path / "z" / "data.tfrecord"))
    assert [bytes(g.fields["image"]) for g in got] == [r["image"] for r in v.records]
    assert [g.fields["label"] for g in got] == [r["label"] for r in v.records]
    gz = zlib.compressobj(9, zlib.DEFLATED, 31)
    (tmp_path / "z" / "g.tfrecord.gz").write_bytes(gz.compress(plain) + gz.flush())
    assert len(list(open_source("tfrecord", tmp_path / "z" / "g.tfrecord.gz"))) == len(v.records)
    (tmp_path / "z" / "cut.tfrecord").write_bytes(zlib.compress(plain)[:-40])
    with pytest.raises(DecompressionError, match=r"cut\.tfrecord.*truncated"):
        list(open_source("tfrecord", tmp_path / "z" / "cut.tfrecord"))
    with pytest.raises(DecompressionError, match="exceeds the limit"):
        list(open_source("tfrecord", tmp_path / "z" / "data.tfrecord", max_bytes=1000))


# -- verify: a jpeg field holds JPEGs only ------------------------------------------------------


def test_verify_reports_a_jpeg_field_holding_png(tmp_path, rng):
    v = next(x for x in variants(rng) if x.name == "mixed")
    root = _write_shards(tmp_path / "a", v)
    assert verify_dataset(root) == []
    manifest = json.loads((root / "manifest.json").read_text())
    for f in manifest["fields"]:
        if f["name"] == "image":
            assert f["type"] == "image"
            f["type"] = "jpeg"  # what a writer typing by the first record used to store
    (root / "manifest.json").write_text(json.dumps(manifest))
    problems = verify_dataset(root)
    pngs = [i for i, r in enumerate(v.records) if r["image"].startswith(b"\x89PNG")]
    assert len(problems) == len(pngs) and pngs
    assert all(p.field == "image" and p.what == "payload is png, but the field is jpeg"
               for p in problems)
    assert sorted(int(p.file[6:11]) * 3 + p.record for p in problems) == pngs


def test_parquet_types_its_image_from_the_first_file_and_writers_retype(tmp_path, rng):
    """Each file's footer types its own images; the source reads the first file's
    (a provisional ``jpeg``), and the writer types the field by what it holds."""
    images = [make_jpeg(rng), make_jpeg(rng), make_png(rng), make_jpeg(rng)]
    with open_sink("parquet", tmp_path / "pq", (Field("image", "image"),), None,
                   records_per_shard=2) as sink:
        for data in images:
            sink.write(Record({"image": data}))
    src = open_source("parquet", tmp_path / "pq")
    assert [(f.name, f.type) for f in src.fields] == [("image", "jpeg")]
    convert("parquet", tmp_path / "pq", "shards", tmp_path / "sh", durable=False)
    ds = open_shards(tmp_path / "sh")
    assert [(f.name, f.type) for f in ds.fields] == [("image", "image")]
    assert [bytes(ds[i]["image"]) for i in range(4)] == images
