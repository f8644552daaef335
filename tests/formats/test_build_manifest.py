"""One manifest builder for every writer: a DatasetWriter's shards are one part, a
range pack joins a part per range."""

from __future__ import annotations

import pytest

from formats import DatasetWriter, Field, ShardEntry, read_manifest
from formats.errors import SchemaError
from formats.shard.manifest import Written, build_manifest

FIELDS = (Field("image", "jpeg"), Field("text", "str", compression="zstd"), Field("n", "int"))


def _entry(name: str, records: int) -> ShardEntry:
    return ShardEntry(name=name, records=records, data_bytes=1, index_bytes=1, meta_bytes=1,
                      data_crc32c=0, index_crc32c=0, meta_crc32c=0)


@pytest.mark.parametrize(("seen", "stored"), [
    ([{"jpeg"}, {"jpeg"}], "jpeg"),
    ([{"png"}, set()], "png"),          # a part that stored no image says nothing
    ([{"jpeg"}, {"png"}], "image"),     # two formats across parts
    ([{"jpeg"}, {"other"}], "image"),
    ([set(), set()], "jpeg"),           # nothing stored: the declared type stays
])
def test_each_image_field_is_typed_by_what_every_part_stored(seen, stored):
    parts = [Written((_entry(f"part-{i}", 1),), 64, {"text": 10 * (i + 1)},
                     {"image": types} if types else {}) for i, types in enumerate(seen)]
    m = build_manifest(FIELDS, parts, classes=("a",), created_by={"tool": "t"})
    assert [f.type for f in m.fields] == [stored, "str", "int"]
    assert [s.name for s in m.shards] == ["part-0", "part-1"]
    assert m.max_raw_size == {"text": 20} and m.alignment == 64 and m.classes == ("a",)


def test_parts_of_different_alignments_or_none_are_refused():
    with pytest.raises(SchemaError, match="different alignments"):
        build_manifest(FIELDS, [Written((), 64), Written((), 4096)])
    with pytest.raises(SchemaError, match="at least one"):
        build_manifest(FIELDS, [])


def test_the_dataset_writer_types_and_sizes_through_the_builder(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + bytes(64)
    with DatasetWriter(tmp_path, FIELDS, records_per_shard=1, durable=False) as w:
        w.write({"image": png, "text": "hello", "n": 1}, {"width": 1, "height": 1})
        w.write({"image": png, "text": "hi", "n": 2}, {"width": 1, "height": 1})
    m = read_manifest(tmp_path)
    built = build_manifest(FIELDS, [Written(m.shards, m.alignment, {"text": 5},
                                            {"image": ["png"]})])
    assert [f.type for f in m.fields] == [f.type for f in built.fields] == ["png", "str", "int"]
    assert m.max_raw_size == built.max_raw_size == {"text": 5}
    assert m.shards == built.shards and len(m.shards) == 2
