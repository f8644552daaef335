"""Every codec with a sink and a source: records survive sink -> source unchanged.

One base class, subclassed per format (zarr's store conformance tests are the model).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from formats import Field, Record, open_shards
from formats.codecs.registry import SINKS, SOURCES, convert, detect, open_sink, open_source
from tests.helpers_codecs import CLASSES, IMAGE_FIELDS, make_dataset, make_records


class CodecConformance:
    name: str
    keeps_classes = True
    extra_fields: tuple[Field, ...] = ()
    #: field type -> the type it comes back as, where the format cannot tell them apart
    read_back_as: ClassVar[dict[str, str]] = {}

    def expect(self, f: Field, value):
        if self.read_back_as.get(f.type) == "bytes":
            return value.encode("utf-8")
        return value

    def same(self, f: Field, got, value) -> bool:
        want = self.expect(f, value)
        if f.type == "ndarray":
            return (isinstance(got, np.ndarray) and got.dtype == want.dtype
                    and np.array_equal(got, want))
        return type(got) is type(want) and got == want

    def records(self, rng):
        recs = make_records(rng, 11)
        for i, r in enumerate(recs):
            for f in self.extra_fields:
                r[f.name] = {"str": f"caption {i} é", "float": i / 4, "int": -(i << 40),
                             "json": {"i": i, "tags": ["a", "b"]}, "bytes": bytes([i]) * 5,
                             "ndarray": np.arange(3, dtype=np.float32) * i}[f.type]
        return recs

    def roundtrip(self, tmp_path, rng, **sink_options):
        recs = self.records(rng)
        fields = IMAGE_FIELDS + self.extra_fields
        with open_sink(self.name, tmp_path / "out", fields, CLASSES, **sink_options) as sink:
            for r in recs:
                sink.write(Record({f.name: r[f.name] for f in fields}, {}, r["key"]))
        return recs, open_source(self.name, tmp_path / "out")

    def test_roundtrip_keeps_bytes_and_labels(self, tmp_path, rng):
        recs, src = self.roundtrip(tmp_path, rng, records_per_shard=4)
        got = list(src)
        assert len(got) == len(recs)
        assert [f.name for f in src.fields][:3] == ["image", "label", "key"]
        for r, g in zip(recs, got, strict=True):
            assert bytes(g.fields["image"]) == r["image"]
            assert g.fields["label"] == r["label"]
            for f in self.extra_fields:
                assert self.same(f, g.fields[f.name], r[f.name]), f.name

    def test_schema_types(self, tmp_path, rng):
        _, src = self.roundtrip(tmp_path, rng)
        types = {f.name: f.type for f in src.fields}
        assert types["image"] == "jpeg" and types["label"] == "int" and types["key"] == "str"
        for f in self.extra_fields:
            assert types[f.name] == self.read_back_as.get(f.type, f.type)

    def test_classes(self, tmp_path, rng):
        _, src = self.roundtrip(tmp_path, rng)
        assert src.classes == (tuple(CLASSES) if self.keeps_classes else None)

    def test_detect(self, tmp_path, rng):
        self.roundtrip(tmp_path, rng)
        assert detect(tmp_path / "out") == self.name

    def test_refuses_to_overwrite(self, tmp_path, rng):
        self.roundtrip(tmp_path, rng)
        with pytest.raises(ValueError, match=r"already|overwrite"):
            open_sink(self.name, tmp_path / "out", IMAGE_FIELDS, CLASSES)

    def test_through_shards_and_back(self, tmp_path, rng):
        """foreign -> shards -> the same foreign format keeps every field's bytes and label."""
        recs, _ = self.roundtrip(tmp_path, rng)
        convert(self.name, tmp_path / "out", "shards", tmp_path / "shards", records_per_shard=5,
                durable=False)
        ds = open_shards(tmp_path / "shards")
        assert len(ds) == len(recs) and ds.classes == (tuple(CLASSES) if self.keeps_classes else None)
        convert("shards", tmp_path / "shards", self.name, tmp_path / "again")
        again = list(open_source(self.name, tmp_path / "again"))
        for r, g in zip(recs, again, strict=True):
            assert bytes(g.fields["image"]) == r["image"] and g.fields["label"] == r["label"]


class TestTFRecord(CodecConformance):
    name = "tfrecord"
    # A BytesList does not say whether it holds text: schema.json beside the files does.
    extra_fields = (Field("caption", "str"), Field("score", "float"), Field("blob", "bytes"),
                    Field("n", "int"), Field("meta", "json"),
                    Field("emb", "ndarray", dtype="<f4", shape=(3,)))

    def test_str_without_schema_file_reads_back_as_bytes(self, tmp_path, rng):
        """A file from elsewhere says nothing of text (``features=...:str`` asks for it)."""
        recs, _ = self.roundtrip(tmp_path, rng)
        (tmp_path / "out" / "schema.json").unlink()
        src = open_source("tfrecord", tmp_path / "out")
        types = {f.name: f.type for f in src.fields}
        assert types["caption"] == "bytes" and types["emb"] == "ndarray"
        assert next(iter(src)).fields["caption"] == recs[0]["caption"].encode()

    def test_gzip_and_index(self, tmp_path, rng):
        recs, src = self.roundtrip(tmp_path, rng, compression="gzip")
        assert all(p.name.endswith(".tfrecord.gz") for p in src.files)
        assert [g.fields["label"] for g in src] == [r["label"] for r in recs]
        with pytest.raises(ValueError, match="uncompressed"):
            open_sink("tfrecord", tmp_path / "x", IMAGE_FIELDS, compression="gzip", index=True)

    def test_index_lines_point_at_frames(self, tmp_path, rng):
        recs, _src = self.roundtrip(tmp_path, rng, records_per_shard=100)  # index by default
        data = (tmp_path / "out" / "shard-00000.tfrecord").read_bytes()
        lines = (tmp_path / "out" / "shard-00000.idx").read_text().splitlines()
        assert len(lines) == len(recs)
        pos = 0
        for line in lines:
            off, size = map(int, line.split())
            assert off == pos and int.from_bytes(data[off:off + 8], "little") + 16 == size
            pos += size
        assert pos == len(data)

    def test_feature_map_option(self, tmp_path, rng):
        self.roundtrip(tmp_path, rng)
        src = open_source("tfrecord", tmp_path / "out",
                          features="image/encoded=picture:jpeg,image/class/label=y")
        assert [f.name for f in src.fields] == ["picture", "y"]
        assert isinstance(next(iter(src)).fields["y"], int)


class TestWebDataset(CodecConformance):
    name = "webdataset"
    extra_fields = (Field("txt", "str"), Field("json", "json"), Field("bin", "bytes"),
                    Field("score", "float"), Field("n", "int"),
                    Field("emb", "ndarray", dtype="<f4", shape=(3,)))

    def test_tars_are_deterministic(self, tmp_path, rng):
        recs = self.records(rng)
        for out in ("a", "b"):
            with open_sink("webdataset", tmp_path / out, IMAGE_FIELDS, CLASSES) as sink:
                for r in recs:
                    sink.write(Record({f.name: r[f.name] for f in IMAGE_FIELDS}))
        a = (tmp_path / "a" / "shard-00000.tar").read_bytes()
        assert a == (tmp_path / "b" / "shard-00000.tar").read_bytes()
        import tarfile
        with tarfile.open(tmp_path / "a" / "shard-00000.tar") as t:
            infos = t.getmembers()
        assert all(i.mtime == 0 and i.uid == 0 and i.gid == 0 and not i.pax_headers for i in infos)
        assert [i.name for i in infos[:4]] == ["cat/000.cls", "cat/000.jpg", "cat/000.key.txt",
                                               "dog/001.cls"]


class TestParquet(CodecConformance):
    name = "parquet"
    extra_fields = (Field("caption", "str"), Field("score", "float"), Field("meta", "json"),
                    Field("n", "int"), Field("emb", "ndarray", dtype="<f4", shape=(3,)))

    def test_hf_metadata_written(self, tmp_path, rng):
        import json

        import pyarrow.parquet as pq
        self.roundtrip(tmp_path, rng)
        schema = pq.read_schema(tmp_path / "out" / "shard-00000.parquet")
        hf = json.loads(schema.metadata[b"huggingface"])["info"]["features"]
        assert hf["image"] == {"_type": "Image"}
        assert hf["label"] == {"_type": "ClassLabel", "names": CLASSES}
        assert schema.field("image").type.names == ["bytes", "path"]


class TestShards(CodecConformance):
    name = "shards"
    extra_fields = (Field("caption", "str"), Field("meta", "json"))

    def test_reshard_recompress_keeps_metadata(self, tmp_path, rng):
        recs = self.records(rng)
        fields = IMAGE_FIELDS + self.extra_fields
        src_dir = make_dataset(tmp_path / "a", recs, fields=fields)
        n = convert("shards", src_dir, "shards", tmp_path / "b", records_per_shard=2,
                    compression="zstd", durable=False)
        ds = open_shards(tmp_path / "b")
        assert n == len(recs) and len(ds.shards) == 6
        comp = {f.name: f.compression for f in ds.fields}
        assert comp == {"image": "none", "label": "none", "key": "zstd", "caption": "zstd",
                        "meta": "zstd"}
        meta = ds.metadata()
        assert meta.column("width").to_pylist() == [r["width"] for r in recs]
        assert ds[3]["meta"] == recs[3]["meta"]


def test_names_match_the_brief():
    assert set(SOURCES) == {"tfrecord", "webdataset", "parquet", "mds", "shards"}
    assert set(SINKS) == {"shards", "tfrecord", "webdataset", "parquet", "imagefolder"}


def test_unknown_names_and_options_are_usage_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown source format 'zip'"):
        open_source("zip", tmp_path)
    with pytest.raises(ValueError, match="does not take option"):
        open_sink("webdataset", tmp_path / "o", IMAGE_FIELDS, bogus=1)
    # options every sink may be handed are dropped where they mean nothing
    sink = open_sink("imagefolder", tmp_path / "if", IMAGE_FIELDS, CLASSES, shard_size=10)
    assert sink.root == tmp_path / "if"


def test_imagefolder_sink(tmp_path, rng):
    recs = make_records(rng, 7)
    make_dataset(tmp_path / "a", recs)
    convert("shards", tmp_path / "a", "imagefolder", tmp_path / "if")
    files = sorted(p.relative_to(tmp_path / "if").as_posix() for p in (tmp_path / "if").rglob("*.jpg"))
    assert files == sorted(r["key"] for r in recs)
    assert (tmp_path / "if" / recs[4]["key"]).read_bytes() == recs[4]["image"]


def test_imagefolder_sink_never_escapes(tmp_path, rng):
    img = make_records(rng, 1)[0]["image"]
    fields = IMAGE_FIELDS
    evil_classes = ["../../escape", "/abs", ".."]
    with open_sink("imagefolder", tmp_path / "dst", fields, evil_classes) as sink:
        for i, key in enumerate(["../../../x.jpg", "/etc/passwd", "a/../../b.jpg"]):
            sink.write(Record({"image": img, "label": i, "key": key}))
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len([p for p in written if p.name != "classes.json"]) == 3  # and the label order
    assert all((tmp_path / "dst") in p.parents for p in written)


def test_detect_unknown(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"\xff\xd8\xff")
    assert detect(tmp_path) is None
    assert detect(tmp_path / "nothing-*.tar") is None


def test_ndarray_field_through_tfrecord(tmp_path, rng):
    fields = (Field("image", "jpeg"), Field("label", "int"),
              Field("box", "ndarray", dtype="<f4", shape=(None,)))
    img = make_records(rng, 1)[0]["image"]
    with open_sink("tfrecord", tmp_path / "t", fields) as sink:
        for i in range(3):
            sink.write(Record({"image": img, "label": i,
                               "box": np.arange(4 + i, dtype=np.float32)}))
    src = open_source("tfrecord", tmp_path / "t")
    box = {f.name: f for f in src.fields}["box"]
    assert box.type == "ndarray" and box.dtype == "<f4"
    assert [g.fields["box"].tolist() for g in src] == [list(range(4 + i)) for i in range(3)]
