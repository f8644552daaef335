"""formats.shard.lazy: JSON parsed when first read, in ds[i] and in raw batches."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import reader
from formats import CorruptRecordError, DatasetWriter, Field, open_shards
from formats.shard.lazy import LazyValues, Record

FIELDS = [Field("image", "bytes"), Field("key", "str"), Field("n", "int"), Field("x", "float"),
          Field("boxes", "ndarray", dtype="float32", shape=(None, 4)),
          Field("meta", "json"), Field("packed", "json", compression="zstd"),
          Field("blob", "bytes", compression="zstd")]


def _record(i: int) -> dict:
    return {"image": bytes([i]) * (i + 1), "key": f"k{i}", "n": i, "x": i / 2,
            "boxes": np.full((i % 3, 4), i, np.float32), "meta": {"i": i, "poly": [[i, i + 1]]},
            "packed": [i] * (i % 4), "blob": b"z" * i}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("lazy") / "ds"
    with DatasetWriter(root, FIELDS, shard_size=None, records_per_shard=7, durable=False) as w:
        for i in range(20):
            w.write(_record(i))
    return root


def _plain(value):
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def test_a_record_is_a_mapping_with_every_field_decoded_as_before(root):
    ds = open_shards(root, check_crc=True)
    for i in (0, 6, 7, 19):
        rec = ds[i]
        assert isinstance(rec, Record) and list(rec) == [f.name for f in FIELDS]
        assert len(rec) == len(FIELDS) and "meta" in rec and "nope" not in rec
        want = _record(i)
        assert {k: _plain(v) for k, v in rec.items()} == {k: _plain(v) for k, v in want.items()}
        assert dict(rec)["meta"] == want["meta"] and rec["meta"] is rec["meta"]  # parsed once
        with pytest.raises(KeyError):
            rec["nope"]
        assert "'meta'" in repr(rec)


def test_a_record_is_changed_as_a_dict_is(root):
    ds = open_shards(root)
    rec = ds[3]
    rec["image"] = "decoded"  # a map-style dataset's usual step
    rec["extra"] = 1
    del rec["blob"]
    assert list(rec) == [f.name for f in FIELDS if f.name != "blob"] + ["extra"]
    assert rec["image"] == "decoded" and rec.pop("n") == 3 and "n" not in rec
    assert rec.copy() == dict(rec) and type(rec.copy()) is dict
    assert (rec | {"x": 9})["x"] == 9 and ({"x": 9} | rec)["x"] == 1.5
    rec |= {"z": 0}
    assert rec["z"] == 0 and rec.setdefault("key") == "k3"
    assert list(ds[3]) == [f.name for f in FIELDS]  # other records keep every field
    with pytest.raises(KeyError):
        del rec["nope"]
    values = ds.values([1, 2], "meta")
    assert values + [0] == [{"i": 1, "poly": [[1, 2]]}, {"i": 2, "poly": [[2, 3]]}, 0]  # noqa: RUF005 (the operator is what is tested)
    assert ([0] + values)[0] == 0  # noqa: RUF005


def test_records_and_lazy_values_pickle_as_the_dict_and_list_they_read_as(tmp_path):
    with DatasetWriter(tmp_path / "p", [Field("n", "int"), Field("meta", "json")],
                       shard_size=None, records_per_shard=3, durable=False) as w:
        for i in range(5):
            w.write({"n": i, "meta": {"i": [i]}})
    ds = open_shards(tmp_path / "p")
    again = pickle.loads(pickle.dumps(ds[4]))
    assert type(again) is dict and again == {"n": 4, "meta": {"i": [4]}}
    values = pickle.loads(pickle.dumps(ds.values([0, 4], "meta")))
    assert type(values) is list and values == [{"i": [0]}, {"i": [4]}]


@pytest.mark.parametrize("check", [False, True])
def test_values_of_many_records_equal_one_record_at_a_time(root, check):
    ds = open_shards(root, check_crc=check)
    idx = np.array([19, 0, 7, 7, 13, 6, 2])
    for f in FIELDS:
        got = ds.values(idx, f.name)
        assert len(got) == len(idx)
        assert [_plain(v) for v in got] == [_plain(ds.get(int(i), f.name)) for i in idx]
        assert isinstance(got, LazyValues) == (f.type == "json")


def test_lazy_values_behave_as_a_read_only_sequence():
    calls = []

    def decode(i):
        calls.append(i)
        return {"v": i}

    values = LazyValues(decode, 5)
    assert len(values) == 5 and calls == []
    assert values[-1] == {"v": 4} and values[4] is values[-1] and calls == [4]
    assert values[1:3] == [{"v": 1}, {"v": 2}]
    assert values == [{"v": i} for i in range(5)] and values != [{"v": 0}]
    assert sorted(calls) == [0, 1, 2, 3, 4]  # each decoded once
    with pytest.raises(IndexError):
        values[5]


def _damage_json(root, ds, index: int, field: str) -> None:
    shard, offsets, _ = ds.spans([index], field)
    path = ds._ready(int(shard[0])).data_path
    with open(path, "r+b") as f:
        f.seek(int(offsets[0]))
        f.write(b"!")  # no JSON value starts with '!'


def test_malformed_json_raises_on_access_naming_shard_and_record(tmp_path):
    root = tmp_path / "bad"
    with DatasetWriter(root, FIELDS, shard_size=None, records_per_shard=7, durable=False) as w:
        for i in range(20):
            w.write(_record(i))
    _damage_json(root, open_shards(root), 9, "meta")  # shard 1, record 2
    ds = open_shards(root, check_crc=False)  # unchecked: the damage reaches the decoder
    rec = ds[9]
    assert rec["n"] == 9 and rec["key"] == "k9"  # the other fields read as ever
    for read in (lambda: rec["meta"], lambda: ds.values([3, 9], "meta")[1]):
        with pytest.raises(CorruptRecordError, match="invalid JSON") as info:
            read()
        assert info.value.path.endswith("shard-00001.rec") and info.value.record == 2
    assert ds.values([3, 9], "meta")[0] == _record(3)["meta"]
    batch = next(iter(reader.Loader(root, 20, decode=False, shuffle=False, check_crc=False)))
    assert batch["n"].tolist() == list(range(20)) and batch["meta"][3] == _record(3)["meta"]
    with pytest.raises(CorruptRecordError, match=r"invalid JSON") as info:
        batch["meta"][9]
    assert info.value.record == 2
    with pytest.raises(CorruptRecordError, match="checksum"):  # checked: found at once
        open_shards(root, check_crc=True)[9]
    with pytest.raises(CorruptRecordError, match="checksum"):
        next(iter(reader.Loader(root, 20, decode=False, shuffle=False)))


def _random_json(rng, depth=0):
    kind = int(rng.integers(0, 8 if depth < 3 else 5))
    if kind == 0:
        return int(rng.integers(-(2**62), 2**62)) * int(rng.choice([1, 2**40, -(2**70)]))
    if kind == 1:
        return float(rng.standard_normal() * 10.0 ** int(rng.integers(-300, 300)))
    if kind == 2:
        return "".join(chr(int(c)) for c in rng.integers(1, 0x2FFF, int(rng.integers(0, 6))))
    if kind == 3:
        return [None, True, False][int(rng.integers(0, 3))]
    if kind == 4:
        return int(rng.choice([2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**64), 0]))
    if kind in (5, 6):
        return [_random_json(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]
    return {f"k{i}": _random_json(rng, depth + 1) for i in range(int(rng.integers(0, 4)))}


def test_json_values_read_back_exactly_as_the_json_module_reads_them(rng):
    import json

    from formats.fields import decode_value, encode_value

    f = Field("m", "json")
    for _ in range(400):
        value = _random_json(rng)
        payload = memoryview(encode_value(f, value))
        got = decode_value(f, payload)
        assert repr(got) == repr(json.loads(bytes(payload))) == repr(value)
