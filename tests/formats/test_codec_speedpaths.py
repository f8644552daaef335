"""The fast paths of issue 18 against the general ones they shortcut.

* The Example decoder's common-layout parser and the general parser accept and
  refuse the same bytes, with the same values and errors.
* The tar reader's plain-header path and tarfile give the same members and errors.
* The tar sink's member headers are ``TarInfo.tobuf``'s bytes.
* Packs from container sources through them: the same bytes for any worker
  count, errors naming file and record, exact resumes.
"""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest

from formats.base import Record
from formats.codecs import tfexample, webdataset
from formats.codecs.tfexample import _put_len, _put_varint, decode_example
from formats.codecs.webdataset import WebDatasetSource, _member_header
from formats.errors import CorruptRecordError, ExampleError
from packer import PackOptions, pack
from packer.errors import PackInterrupted
from tests.helpers_codecs import make_dataset, make_records
from tests.helpers_packer import StopAfter, dataset_files

# -- the Example decoder ---------------------------------------------------------------


def _random_features(rng) -> dict:
    out = {}
    for i in range(int(rng.integers(0, 5))):
        kind = int(rng.integers(0, 3))
        name = ["image/encoded", "label", "é", "k" * int(rng.integers(0, 200)), f"f{i}"][i]
        if kind == 0:
            out[name] = [rng.bytes(int(rng.choice([0, 1, 127, 128, 3000])))
                         for _ in range(int(rng.integers(0, 3)))]
        elif kind == 1:
            out[name] = rng.choice([0, 1, 127, 128, -1, 2**62, -(2**63)],
                                   int(rng.integers(0, 4))).astype(np.int64)
        else:
            out[name] = rng.random(int(rng.integers(0, 4))).astype(np.float32)
    return out


def _unusual_example() -> bytes:
    """An Example with an unpacked int list, an unknown field and a repeated name:
    valid protobuf the common-layout parser hands to the general one."""
    ints = bytearray()
    for v in (3, 300):
        _put_varint(ints, 1 << 3)  # Int64List.value, unpacked
        _put_varint(ints, v)
    feat = bytearray()
    _put_len(feat, 3, ints)
    _put_len(feat, 9, b"junk")  # unknown Feature field
    entry = bytearray()
    _put_len(entry, 1, b"n")
    _put_len(entry, 2, feat)
    feats = bytearray()
    _put_len(feats, 1, entry)
    _put_len(feats, 1, entry)
    example = bytearray()
    _put_len(example, 1, feats)
    return bytes(example)


def _outcome(fn, data):
    try:
        return "ok", fn(data)
    except ExampleError as exc:
        return "error", str(exc)


def _same(a, b) -> bool:
    if a[0] != b[0] or a[0] == "error":
        return a == b
    x, y = a[1], b[1]
    if x.keys() != y.keys():
        return False
    for k in x:
        if isinstance(x[k], np.ndarray):
            if not (isinstance(y[k], np.ndarray) and x[k].dtype == y[k].dtype
                    and np.array_equal(x[k], y[k])):
                return False
        elif x[k] != y[k] or any(type(v) is not bytes for v in x[k]):
            return False
    return True


def test_example_common_parser_agrees_with_the_general_one(rng):
    fast = 0
    for _ in range(300):
        data = tfexample.encode_example(_random_features(rng))
        fast += tfexample._decode_common(data, memoryview(data)) is not None
        cases = [data]
        for _ in range(3):  # damaged copies: flipped bytes, cuts, insertions
            d = bytearray(data)
            if d:
                j = int(rng.integers(0, len(d)))
                [d.__setitem__(j, int(rng.integers(0, 256))), d.__delitem__(slice(j, None)),
                 d.__setitem__(slice(j, j), b"\x0a\x80")][int(rng.integers(0, 3))]
            cases.append(bytes(d))
        for case in cases:
            general = _outcome(lambda b: tfexample._decode_general(memoryview(b)), case)
            assert _same(_outcome(decode_example, case), general), case
    assert fast == 300  # every Example our encoder writes takes the fast path


def test_example_unusual_layout_goes_to_the_general_parser():
    data = _unusual_example()
    assert tfexample._decode_common(data, memoryview(data)) is None
    got = decode_example(data)
    assert list(got) == ["n"] and got["n"].tolist() == [3, 300]


def test_example_encoder_leaves_large_byte_strings_uncopied(rng):
    image = rng.bytes(5000)
    feats = {"image/encoded": [image], "label": np.array([7]), "key": [b"a/b.jpg"]}
    parts = tfexample.encode_example_parts(feats)
    assert any(p is image for p in parts) and len(parts) == 3
    whole = b"".join(parts)
    assert whole == tfexample.encode_example(feats)
    got = decode_example(whole)
    assert got["image/encoded"] == [image] and got["label"].tolist() == [7]


def test_tfrecord_sink_frames_are_the_joined_example(tmp_path, rng):
    """Pieces CRC'd and written in batches (writev) make the frames of the whole
    Example, across batch and file boundaries, the DALI index agreeing."""
    import struct

    from formats.codecs.tfrecord import TFRecordSink, masked_crc
    from tests.helpers_codecs import IMAGE_FIELDS

    sizes = [600_000, 10, 3_000, 700_000, 1, 0, 2_500]  # some over the 1 MB batch together
    recs = [Record({"image": rng.bytes(n), "label": i, "key": f"k/{i}.jpg"}, {}, str(i))
            for i, n in enumerate(sizes)]
    with TFRecordSink(tmp_path / "out", IMAGE_FIELDS, records_per_shard=3) as sink:
        for r in recs:
            sink.write(r)
    files = sorted((tmp_path / "out").glob("*.tfrecord"))
    assert len(files) == 3
    for k, path in enumerate(files):
        want, index = b"", []
        for r in recs[3 * k:3 * k + 3]:
            data = tfexample.encode_example({
                "image/encoded": [r.fields["image"]], "image/class/label": np.array([r.fields["label"]]),
                "image/filename": [r.fields["key"].encode()]})
            head = struct.pack("<Q", len(data))
            frame = head + struct.pack("<I", masked_crc(head)) + data + struct.pack(
                "<I", masked_crc(data))
            index.append(f"{len(want)} {len(frame)}")
            want += frame
        assert path.read_bytes() == want
        assert path.with_suffix(".idx").read_text().split("\n")[:-1] == index


# -- tar reading and writing -----------------------------------------------------------


def _random_tar(rng) -> bytes:
    buf = io.BytesIO()
    fmt = [tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT][int(rng.integers(0, 3))]
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for i in range(int(rng.integers(1, 6))):
            long = "p/" * 30 + "y" if fmt == tarfile.USTAR_FORMAT else "x" * 120
            name = [f"s{i}.jpg", f"d/s{i}.cls", f".hidden{i}.jpg", f"noext{i}", long + ".jpg",
                    "é/ü.jpg"][int(rng.integers(0, 6))]
            info = tarfile.TarInfo(name)
            if rng.random() < 0.15:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                continue
            data = rng.bytes(int(rng.choice([0, 1, 512, 513, 2000])))
            info.size, info.mtime = len(data), int(rng.choice([0, 1_700_000_000]))
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _members(fn):
    try:
        return "ok", [(k, e, bytes(d)) for k, e, d in fn()]
    except Exception as exc:  # compared: type and words
        return "error", type(exc).__name__, str(exc)


def test_tar_plain_reader_agrees_with_tarfile(tmp_path, rng):
    path = tmp_path / "a.tar"
    src = WebDatasetSource.__new__(WebDatasetSource)
    src.max_member_bytes, src.max_bytes = 1 << 20, 1 << 30
    for _ in range(300):
        data = bytearray(_random_tar(rng))
        for _ in range(int(rng.integers(0, 3))):  # damage: flips, cuts, odd type flags
            j = int(rng.integers(0, len(data)))
            op = int(rng.integers(0, 3))
            if op == 0:
                data[j] = int(rng.integers(0, 256))
            elif op == 1:
                del data[j:]
                break
            else:
                data[j] = int(rng.choice([0, 0x30, 0x35]))
        path.write_bytes(bytes(data))
        assert _members(lambda: src._members(path)) == _members(lambda: src._tar_members(path))


def _respelled(tar: bytes) -> bytes:
    """``tar`` with its first header's mode written the old way (spaces, no padding
    zeros) and its checksum made right again: plain, though not as tarfile writes."""
    head = bytearray(tar[:512])
    head[100:108] = b"   644 \x00"
    head[148:156] = b" " * 8
    head[148:156] = b"%06o\x00 " % sum(head)
    return bytes(head) + tar[512:]


def test_tar_plain_reader_reads_numbers_spelled_otherwise(tmp_path, rng):
    path = tmp_path / "a.tar"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("k.jpg")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    path.write_bytes(_respelled(buf.getvalue()))
    src = WebDatasetSource.__new__(WebDatasetSource)
    src.max_member_bytes, src.max_bytes = 1 << 20, 1 << 30
    assert list(src._plain_members(path)) == [("k", "jpg", b"abc")]
    assert list(src._tar_members(path)) == [("k", "jpg", b"abc")]


def test_tar_plain_reader_reads_plain_tars_without_tarfile(tmp_path, rng, monkeypatch):
    recs = make_records(rng, 6)
    pack(make_dataset(tmp_path / "ds", recs), tmp_path / "wds",
         PackOptions(source="shards", sink="webdataset", workers=0, durable=False))
    monkeypatch.setattr(WebDatasetSource, "_tar_members", None)  # any fallback would fail
    got = list(webdataset.WebDatasetSource(tmp_path / "wds"))
    assert [bytes(r.fields["image"]) for r in got] == [r["image"] for r in recs]


def test_tar_member_headers_are_tarfiles(rng):
    for name in ["a.jpg", "é" * 50, "x" * 100, "y" * 101, "\udcff.cls", "a/" * 60 + "b.jpg"]:
        for size in (0, 511, 54_321, 8**11 - 1, 8**11):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = size, 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            assert _member_header(name, size) == info.tobuf(tarfile.GNU_FORMAT, "utf-8",
                                                            "surrogateescape"), (name, size)


# -- packs from container sources ---------------------------------------------------


@pytest.fixture
def sources(tmp_path, rng):
    """The same 10 records as TFRecord, WebDataset and Parquet files of 3 records."""
    recs = make_records(rng, 10)
    ds = make_dataset(tmp_path / "ds", recs)
    for fmt in ("tfrecord", "webdataset", "parquet"):
        pack(ds, tmp_path / fmt, PackOptions(source="shards", sink=fmt, records_per_shard=3,
                                             shard_size=None, workers=0, durable=False))
    return tmp_path, recs


@pytest.mark.parametrize("max_side", [None, 9])  # 9: most images re-encoded, in a pool
@pytest.mark.parametrize("fmt", ["tfrecord", "webdataset", "parquet"])
def test_container_packs_give_the_same_bytes_for_any_workers(sources, fmt, max_side):
    root, recs = sources
    outs = {}
    for workers in (0, 2, 3):
        out = root / f"{fmt}-{workers}"
        s = pack(root / fmt, out, PackOptions(source=fmt, workers=workers, records_per_shard=4,
                                              max_side=max_side, durable=False))
        assert s.records_written == len(recs)
        outs[workers] = dataset_files(out)
    assert outs[0] == outs[2] == outs[3]


def test_container_pack_error_names_file_and_record_for_any_workers(sources):
    root, _ = sources
    bad = sorted((root / "tfrecord").glob("*.tfrecord"))[2]
    data = bytearray(bad.read_bytes())
    data[40] ^= 0xFF  # inside the first record's payload: its data CRC fails
    bad.write_bytes(bytes(data))
    errors = []
    for workers in (0, 2):
        with pytest.raises(CorruptRecordError) as e:
            pack(root / "tfrecord", root / f"out-{workers}",
                 PackOptions(source="tfrecord", workers=workers, durable=False))
        errors.append(str(e.value))
    assert errors[0] == errors[1]
    assert bad.name in errors[0] and "record 0" in errors[0]



@pytest.mark.parametrize("fmt", ["tfrecord", "webdataset", "parquet"])
def test_container_pack_interrupt_then_resume_is_byte_identical(sources, fmt, monkeypatch):
    root, recs = sources
    monkeypatch.setattr("packer.loop._ADVANCE_EVERY", 1)
    o = PackOptions(source=fmt, workers=2, records_per_shard=2, durable=False)
    pack(root / fmt, root / "full", o)
    with pytest.raises(PackInterrupted):
        pack(root / fmt, root / "cut", o, progress=StopAfter(7))
    again = pack(root / fmt, root / "cut", PackOptions(**{**o.__dict__, "resume": True}))
    assert again.resumed_records >= 4 and again.records_written == len(recs)
    assert dataset_files(root / "cut") == dataset_files(root / "full")
