"""Bad foreign input: each case fails with an error naming the file and what is wrong,
and nothing is ever written outside the destination."""

from __future__ import annotations

import gzip
import io
import struct
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from formats import (
    CorruptRecordError,
    DecompressionError,
    FormatError,
    Record,
    SchemaError,
    UnsafePathError,
)
from formats.codecs.registry import convert, open_sink, open_source
from formats.codecs.tfrecord import masked_crc
from tests.helpers_codecs import CLASSES, IMAGE_FIELDS, make_jpeg, make_records


def _tfrecords(tmp_path, rng, n=4):
    recs = make_records(rng, n)
    with open_sink("tfrecord", tmp_path / "tf", IMAGE_FIELDS, CLASSES) as sink:
        for r in recs:
            sink.write(Record({f.name: r[f.name] for f in IMAGE_FIELDS}))
    return tmp_path / "tf" / "shard-00000.tfrecord"


def _frame(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


# -- TFRecord ----------------------------------------------------------------------------


def test_tfrecord_wrong_data_crc(tmp_path, rng):
    path = _tfrecords(tmp_path, rng)
    data = bytearray(path.read_bytes())
    first = int.from_bytes(data[:8], "little") + 16
    data[first + 40] ^= 0xFF  # inside record 1's Example
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match=r"shard-00000.tfrecord record 1 at byte "
                                                 rf"{first}: TFRecord data checksum mismatch"):
        list(open_source("tfrecord", path))


def test_tfrecord_wrong_length_crc(tmp_path, rng):
    path = _tfrecords(tmp_path, rng)
    data = bytearray(path.read_bytes())
    data[9] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="record 0 at byte 0: TFRecord length checksum"):
        open_source("tfrecord", path)


def test_tfrecord_crc_check_can_be_disabled(tmp_path, rng):
    path = _tfrecords(tmp_path, rng)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # the last record's data CRC
    path.write_bytes(bytes(data))
    assert len(list(open_source("tfrecord", path, check_crc=False))) == 4


@pytest.mark.parametrize("cut", [3, 10, 200])
def test_tfrecord_truncated_tail(tmp_path, rng, cut):
    path = _tfrecords(tmp_path, rng)
    path.write_bytes(path.read_bytes()[:-cut])
    with pytest.raises(DecompressionError, match=r"record 3 .*truncated"):
        list(open_source("tfrecord", path))


def test_tfrecord_huge_length_refused_before_reading(tmp_path):
    length = struct.pack("<Q", 5 << 30)
    (tmp_path / "x.tfrecord").write_bytes(length + struct.pack("<I", masked_crc(length)) + b"abc")
    with pytest.raises(FormatError, match="longer than the limit"):
        open_source("tfrecord", tmp_path / "x.tfrecord")


def test_tfrecord_garbage_example(tmp_path):
    (tmp_path / "x.tfrecord").write_bytes(_frame(b"\x0a\xff\xff\xff\x0f"))
    with pytest.raises(CorruptRecordError, match=r"x\.tfrecord record 0 .*not a tf\.train\.Example"):
        open_source("tfrecord", tmp_path / "x.tfrecord")


def test_tfrecord_gzip_bomb(tmp_path):
    # a valid frame of 30 MB of zeros: a tiny file that expands far
    payload = _frame(b"") + _frame(b"\0" * (30 << 20))
    (tmp_path / "bomb.tfrecord.gz").write_bytes(gzip.compress(payload, 9))
    assert (tmp_path / "bomb.tfrecord.gz").stat().st_size < 100_000
    src = open_source("tfrecord", tmp_path / "bomb.tfrecord.gz", max_bytes=1 << 20)
    with pytest.raises(DecompressionError, match="exceeds the limit"):
        list(src)


def test_tfrecord_schema_drift(tmp_path, rng):
    from formats.codecs.tfexample import encode_example
    img = make_jpeg(rng)
    frames = [_frame(encode_example({"image": [img], "label": np.array([1])})),
              _frame(encode_example({"image": [img], "label": np.array([1, 2])}))]
    (tmp_path / "d.tfrecord").write_bytes(b"".join(frames))
    with pytest.raises(SchemaError, match=r"d\.tfrecord record 1 .*not one number"):
        list(open_source("tfrecord", tmp_path / "d.tfrecord"))


# -- WebDataset --------------------------------------------------------------------------


def _tar(path, members: list[tuple[str, bytes]], *, size_override=None):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", ["/etc/evil.jpg", "../../evil.jpg", "a/../../evil.jpg"])
@pytest.mark.parametrize("sink", ["imagefolder", "shards"])
def test_tar_unsafe_member_names(tmp_path, rng, name, sink):
    img = make_jpeg(rng)
    tar = _tar(tmp_path / "in.tar", [("ok.jpg", img), ("ok.cls", b"0"), (name, img)])
    dst = tmp_path / "deep" / "dst"
    with pytest.raises(UnsafePathError, match=r"in.tar at byte \d+: tar member name is absolute"):
        convert("webdataset", tar, sink, dst, durable=False) if sink == "shards" else \
            convert("webdataset", tar, sink, dst)
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and dst not in p.parents]
    assert outside == [tar]


def test_tar_symlink_member_refused(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("x.jpg")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(info)
    (tmp_path / "l.tar").write_bytes(buf.getvalue())
    with pytest.raises(UnsafePathError, match="link"):
        open_source("webdataset", tmp_path / "l.tar")


def test_tar_member_claiming_huge_size(tmp_path):
    info = tarfile.TarInfo("a.jpg")
    info.size = 8 << 30  # claims 8 GiB; the file holds a few bytes
    (tmp_path / "h.tar").write_bytes(info.tobuf(tarfile.GNU_FORMAT) + b"\xff\xd8\xff" + b"\0" * 509)
    with pytest.raises(FormatError, match=r"h.tar at byte 0: tar member larger than the limit: "
                                          r"found 'a.jpg: 8589934592 bytes'"):
        open_source("webdataset", tmp_path / "h.tar")


def test_tar_gzip_bomb(tmp_path, rng):
    raw = io.BytesIO()
    _tar(tmp_path / "plain.tar", [("a.jpg", make_jpeg(rng)), ("b.bin", b"\0" * (20 << 20))])
    raw.write((tmp_path / "plain.tar").read_bytes())
    (tmp_path / "b.tar.gz").write_bytes(gzip.compress(raw.getvalue(), 9))
    with pytest.raises(DecompressionError, match="exceeds the limit"):
        list(open_source("webdataset", tmp_path / "b.tar.gz", max_bytes=1 << 20))


def test_webdataset_png_under_jpg_is_carried_as_it_is(tmp_path, rng):
    """A name is no type: the bytes are carried exactly, and writers type the field by
    what it holds (issue 18; this used to be refused)."""
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 20
    tar = _tar(tmp_path / "mixed.tar", [("s1.jpg", make_jpeg(rng)), ("s1.cls", b"1"),
                                        ("s2.jpg", png), ("s2.cls", b"2")])
    got = list(open_source("webdataset", tar))
    assert bytes(got[1].fields["image"]) == png and got[1].fields["label"] == 2


def test_webdataset_members_differ(tmp_path, rng):
    tar = _tar(tmp_path / "m.tar", [("s1.jpg", make_jpeg(rng)), ("s1.cls", b"1"),
                                    ("s2.jpg", make_jpeg(rng)), ("s2.txt", b"hi")])
    with pytest.raises(SchemaError, match=r"m.tar: sample 's2' has other members"):
        list(open_source("webdataset", tar))


def test_webdataset_bad_label(tmp_path, rng):
    tar = _tar(tmp_path / "c.tar", [("s1.jpg", make_jpeg(rng)), ("s1.cls", b"one")])
    with pytest.raises(SchemaError, match=r"c.tar: sample 's1': .cls is not a valid int"):
        list(open_source("webdataset", tar))


def test_not_a_tar(tmp_path):
    (tmp_path / "x.tar").write_bytes(b"hello" * 200)
    with pytest.raises(FormatError, match=r"x\.tar"):
        open_source("webdataset", tmp_path / "x.tar")


# -- Parquet -----------------------------------------------------------------------------


def test_parquet_without_image_column(tmp_path):
    pq.write_table(pa.table({"text": ["a", "b"], "label": [0, 1]}), tmp_path / "t.parquet")
    with pytest.raises(SchemaError, match=r"no image column .* its columns are \['text', 'label'\]"):
        open_source("parquet", tmp_path / "t.parquet")


def test_parquet_not_parquet(tmp_path):
    (tmp_path / "t.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(FormatError, match="not a Parquet file"):
        open_source("parquet", tmp_path / "t.parquet")


def test_missing_input(tmp_path):
    with pytest.raises(FormatError, match="not found"):
        open_source("webdataset", str(tmp_path / "shard-{000..003}.tar"))


def test_a_webdataset_json_member_holding_nan_is_named_not_a_writer_crash(tmp_path):
    from packer import PackOptions, pack

    with tarfile.open(tmp_path / "a.tar", "w") as t:
        for key, body in (("s0", b'{"x": 1}'), ("s1", b'{"x": NaN}')):
            for ext, data in (("json", body), ("txt", b"hello")):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    with pytest.raises(Exception, match=r"a\.tar.*sample 's1': \.json holds what JSON text cannot"):
        pack(tmp_path / "a.tar", tmp_path / "out", PackOptions(source="webdataset", workers=0,
                                                                durable=False))
