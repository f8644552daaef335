"""``DatasetWriter.write_run``: records given column by column make exactly the files
``write`` makes record by record, for every field type and shard option; and
``pack_samples``, which writes runs, makes exactly the files of its per-sample path."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

import formats
import packer.sample_runs
from formats import DatasetWriter, Field
from formats.errors import SchemaError
from formats.shard.dataset_writer import JOURNAL_NAME
from packer.errors import _Bad as Bad
from packer.schema import check_run, check_sample
from tests.helpers_packer import dataset_files, jpeg, pack_fn, png

FIELDS = (
    Field("text", "str"),
    Field("tokens", "ndarray", dtype="<i4", shape=(None,)),
    Field("label", "int"),
    Field("score", "float"),
    Field("blob", "bytes"),
    Field("grid", "ndarray", dtype="<f4", shape=(3, 2)),
    Field("meta", "json"),
    Field("packed", "bytes", compression="zstd"),
    Field("rows", "ndarray", dtype="|u1", shape=(None, 3)),
    Field("key", "str"),
    Field("zgrid", "ndarray", dtype="<i2", shape=(2, 2), compression="zstd"),
    Field("ztokens", "ndarray", dtype="<i8", shape=(None,), compression="zstd"),
    Field("ztext", "str", compression="zstd"),
)


def record(i: int, rng: np.random.Generator) -> dict:
    """Record ``i``: lengths vary, empty payloads included, and the values come in the
    types a column path must not treat as its fast case (numpy ints, a bytearray, a
    non-contiguous array, ints in a float field)."""
    tokens = rng.integers(0, 1000, int(rng.integers(0, 300))).astype(np.int32)
    return {
        "text": "é" * (i % 7) + "a" * int(rng.integers(0, 60)),
        "tokens": tokens[::2] if i % 11 == 3 else tokens,
        "label": np.int64(i) if i % 13 == 5 else i,
        "score": i if i % 17 == 2 else i / 7,
        "blob": bytearray(i % 50) if i % 19 == 4 else bytes(i % 100),
        "grid": np.full((3, 2), i, np.float32),
        "meta": {"i": i, "tags": ["x"] * (i % 3)},
        "packed": b"ab" * int(rng.integers(0, 500)),
        "rows": np.zeros((i % 5, 3), np.uint8),
        "key": f"k{i:05d}",
        "zgrid": np.full((2, 2), i, np.int16),
        "ztokens": np.arange(i % 40, dtype=np.int64),
        "ztext": "z" * (i % 90),
    }


RECORDS = [record(i, np.random.default_rng(i)) for i in range(700)]

SHARDING = [
    {"shard_size": 40_000},
    {"shard_size": None, "records_per_shard": 97},
    {"shard_size": 1 << 30},
    {"shard_size": 9_000, "alignment": 4096},
    {"shard_size": 1, "alignment": 8},  # every record seals its shard
]


def _by_record(root, records, **kw):
    with DatasetWriter(root, FIELDS, durable=False, **kw) as w:
        for r in records:
            w.write(r)


def _by_run(root, records, lengths, **kw):
    runs = itertools.cycle(lengths)
    with DatasetWriter(root, FIELDS, durable=False, **kw) as w:
        i = 0
        while i < len(records):
            part = records[i:i + next(runs)]
            w.write_run({f.name: [r[f.name] for r in part] for f in FIELDS})
            i += len(part)


@pytest.mark.parametrize("kw", SHARDING, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
@pytest.mark.parametrize("lengths", [(64,), (1, 5, 200, 3), (700,)], ids=str)
def test_runs_make_the_files_records_make(tmp_path, kw, lengths):
    _by_record(tmp_path / "a", RECORDS, **kw)
    _by_run(tmp_path / "b", RECORDS, lengths, **kw)
    a, b = dataset_files(tmp_path / "a"), dataset_files(tmp_path / "b")
    assert a.keys() == b.keys() and len(a) > 3
    assert a == b
    ds = formats.open_shards(tmp_path / "b")
    assert len(ds) == len(RECORDS)
    got = ds[len(RECORDS) - 1]
    assert got["key"] == RECORDS[-1]["key"] and np.array_equal(got["tokens"], RECORDS[-1]["tokens"])
    assert ds.manifest.max_raw_size["zgrid"] == 8  # bytes, not the array's len()
    assert ds.manifest.max_raw_size["ztokens"] == 16 + 8 * 39  # shape header + data


def test_a_long_run_of_small_shards_is_written_in_bounded_windows(tmp_path, monkeypatch):
    import formats.shard.dataset_writer as dw

    monkeypatch.setattr(dw, "_RUN_WINDOW", 50)
    _by_record(tmp_path / "a", RECORDS, shard_size=30_000)
    _by_run(tmp_path / "b", RECORDS, (700,), shard_size=30_000)
    assert dataset_files(tmp_path / "a") == dataset_files(tmp_path / "b")


def test_image_columns_are_typed_by_content_and_sized_from_headers(tmp_path):
    rng = np.random.default_rng(0)
    fields = (Field("image", "image"), Field("label", "int"))
    images = [jpeg(rng, 20 + i, 10 + i) if i % 3 else png(rng, 8 + i, 6) for i in range(12)]
    labels = list(range(12))
    with DatasetWriter(tmp_path / "a", fields, durable=False, records_per_shard=5) as w:
        for im, lab in zip(images, labels, strict=True):
            w.write({"image": im, "label": lab})
    with DatasetWriter(tmp_path / "b", fields, durable=False, records_per_shard=5) as w:
        w.write_run({"image": images[:7], "label": labels[:7]})
        w.write_run({"image": images[7:], "label": labels[7:]})
    assert dataset_files(tmp_path / "a") == dataset_files(tmp_path / "b")
    ds = formats.open_shards(tmp_path / "b")
    assert ds.fields[0].type == "image"  # both formats held
    assert ds.metadata(["width"]).column("width").to_pylist()[:2] == [8, 21]


def test_a_bad_value_names_its_record_and_writes_nothing_of_the_run(tmp_path):
    fields = (Field("x", "int"), Field("t", "str"))
    with DatasetWriter(tmp_path / "ds", fields, durable=False) as w:
        w.write_run({"x": [1, 2], "t": ["a", "b"]})
        with pytest.raises(SchemaError, match=r"record 4: field 't' \(str\)"):
            w.write_run({"x": [3, 4, 5], "t": ["c", "d", 6]})
        with pytest.raises(SchemaError, match="record 2: field 't'"):
            w.write_run({"x": [3], "t": ["bad \udc80"]})
        with pytest.raises(SchemaError, match="columns of different lengths"):
            w.write_run({"x": [3, 4], "t": ["c"]})
        with pytest.raises(SchemaError, match=r"missing \['t'\]"):
            w.write_run({"x": [3]})
        w.write_run({"x": [3], "t": ["c"]})
    ds = formats.open_shards(tmp_path / "ds")
    assert [ds[i]["x"] for i in range(len(ds))] == [1, 2, 3]


def test_buffers_reused_after_the_call_do_not_change_what_was_written(tmp_path):
    fields = (Field("a", "ndarray", dtype="<i4", shape=(None,)), Field("b", "bytes"))
    buf, raw = np.arange(50, dtype=np.int32), bytearray(b"x" * 30)
    with DatasetWriter(tmp_path / "ds", fields, durable=False) as w:
        for _ in range(3):
            w.write_run({"a": [buf], "b": [raw]})
            buf[:] = -1
            raw[:] = b"y" * 30
    ds = formats.open_shards(tmp_path / "ds")
    assert np.array_equal(ds[0]["a"], np.arange(50)) and bytes(ds[0]["b"]) == b"x" * 30
    assert (ds[1]["a"] == -1).all() and bytes(ds[2]["b"]) == b"y" * 30


def test_progress_is_asked_for_at_each_seal_as_write_stores_it(tmp_path):
    fields = (Field("x", "int"),)
    for name, runs in (("a", None), ("b", [3, 10, 1, 40])):
        w = DatasetWriter(tmp_path / name, fields, durable=False, records_per_shard=7)
        if runs is None:
            for i in range(54):
                w.write({"x": i}, progress={"next": i + 1})
        else:
            start = 0
            for n in runs:
                w.write_run({"x": list(range(start, start + n))},
                            progress=lambda k, s=start: {"next": s + k})
                start += n
        w.abort()  # as a crash would: the journal keeps each seal's progress
    journal = [(tmp_path / n / JOURNAL_NAME).read_text() for n in "ab"]
    assert journal[0] == journal[1]
    assert [json.loads(x)["progress"]["next"] for x in journal[0].splitlines()[1:]] == \
        [7, 14, 21, 28, 35, 42, 49]


# -- pack_samples: the run path against the per-sample path ----------------------------

def odd(i):
    """Samples in every type, the exact ones and those only the per-sample path takes."""
    r = record(i, np.random.default_rng(i))
    r["label"] = int(r["label"])
    r["score"] = float(r["score"])
    r["blob"] = bytes(r["blob"])
    for k in ("packed", "zgrid", "ztokens", "ztext"):
        del r[k]
    return r


def several(i):
    for j in range(i % 4):  # 0 to 3 samples an input
        yield {"x": np.arange(j + i % 5, dtype=np.int16), "name": f"{i}-{j}"}


def mixed(i):
    """Mostly exact types, some inputs with values only the per-sample path checks."""
    return {"n": np.int32(i) if i in (70, 200) else i, "t": f"t{i}",
            "a": np.zeros(i % 9, np.float64)[:: 1 + (i % 31 == 0)]}


@pytest.mark.parametrize("fn", [odd, several, mixed])
@pytest.mark.parametrize("shard_size", [3000, "256MB"])
def test_pack_samples_writes_the_files_of_its_per_sample_path(tmp_path, monkeypatch, fn,
                                                              shard_size):
    opts = {"durable": False, "progress": False, "workers": 0, "shard_size": shard_size}
    monkeypatch.setattr(packer.sample_runs, "RUN_SAMPLES", 64)  # several runs of small samples
    runs = []
    write_run = DatasetWriter.write_run
    monkeypatch.setattr(DatasetWriter, "write_run",
                        lambda self, columns, *a: runs.append(1) or write_run(self, columns, *a))
    pack_fn(fn, range(300), tmp_path / "runs", **opts)
    assert len(runs) >= 3  # the run path was taken (for some chunks at least)
    monkeypatch.setattr(packer.sample_runs, "check_run", lambda *a: None)
    pack_fn(fn, range(300), tmp_path / "items", **opts)
    a, b = dataset_files(tmp_path / "runs"), dataset_files(tmp_path / "items")
    assert a == b and any(k.endswith(".rec") for k in a)


VALUES = {
    "int": [1, -5, True, np.int64(3), 2.0, 1 << 63, -(1 << 63), None],
    "float": [1.5, 2, np.float32(1), True, "x"],
    "str": ["a", "é", "\udc80", b"a", None],
    "bytes": [b"a", bytearray(b"b"), memoryview(b"c"), "a", np.zeros(2, np.uint8)],
    "json": [{"a": 1}, [1, 2], float("nan"), {1, 2}, None],
    "ndarray": [np.zeros(3, np.int32), np.zeros(3, np.int64), np.zeros((3, 1), np.int32),
                np.zeros(6, np.int32)[::2], [1, 2], np.zeros(0, np.int32)],
}


@pytest.mark.parametrize("type_", sorted(VALUES))
def test_check_run_takes_only_what_check_sample_takes_unchanged(type_):
    f = Field("v", type_, dtype="<i4", shape=(None,)) if type_ == "ndarray" else Field("v", type_)
    fields = (f,)
    for value in VALUES[type_]:
        sample = {"v": value}
        got = check_run([sample], fields, 1 << 20)
        try:
            record, nbytes = check_sample(sample, fields, 1 << 20, "")
        except Bad:
            assert got is None, f"check_run took {value!r}, which check_sample refuses"
            continue
        if got is not None:  # taken as is: the same value, the same size
            columns, sizes = got
            assert columns["v"][0] is record["v"] and sizes == [nbytes], value
    assert check_run([{"v": VALUES[type_][0]}, {"w": 1}], fields, None) is None
    assert check_run([{"v": VALUES[type_][0]}], fields, 0) is None  # too large


def test_a_view_of_ints_in_a_bytes_field_is_stored_as_its_bytes(tmp_path):
    fields = (Field("b", "bytes"), Field("z", "bytes", compression="zstd"))
    ints = np.arange(3, dtype="<i4")
    grid = np.arange(6, dtype=np.uint8).reshape(2, 3)
    values = {"b": [memoryview(ints), memoryview(grid), b"hi"],
              "z": [memoryview(ints).toreadonly(), memoryview(grid), b"zz"]}
    with DatasetWriter(tmp_path / "a", fields, durable=False) as w:
        for j in range(3):
            w.write({k: v[j] for k, v in values.items()})
    with DatasetWriter(tmp_path / "b", fields, durable=False) as w:
        w.write_run(values)
    assert dataset_files(tmp_path / "a") == dataset_files(tmp_path / "b")
    ds = formats.open_shards(tmp_path / "b")
    assert [bytes(ds[j]["b"]) for j in range(3)] == [ints.tobytes(), grid.tobytes(), b"hi"]
    assert bytes(ds[0]["z"]) == ints.tobytes() and ds.manifest.max_raw_size["z"] == 12


def test_runs_of_large_records_are_joined_a_few_megabytes_at_a_time(tmp_path, monkeypatch):
    import formats.shard.dataset_writer as dw
    from formats.shard.shard_writer import ShardWriter

    monkeypatch.setattr(dw, "_RUN_BYTES", 20_000)
    windows = []
    append_run = ShardWriter.append_run

    def counted(self, columns, meta, lengths, offsets):
        windows.append(int(lengths.sum()))
        return append_run(self, columns, meta, lengths, offsets)

    monkeypatch.setattr(ShardWriter, "append_run", counted)
    _by_run(tmp_path / "b", RECORDS, (700,), shard_size=1 << 30)
    _by_record(tmp_path / "a", RECORDS, shard_size=1 << 30)
    assert dataset_files(tmp_path / "a") == dataset_files(tmp_path / "b")
    biggest = max(sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in r.values())
                  for r in RECORDS) + 10_000  # a generous bound on one record's payloads
    assert len(windows) > 10 and max(windows) <= 20_000 + biggest


def test_meta_columns_of_another_length_are_refused_before_anything_is_written(tmp_path):
    with DatasetWriter(tmp_path / "ds", (Field("x", "int"),), records_per_shard=3,
                       durable=False) as w:
        with pytest.raises(SchemaError, match="columns of different lengths"):
            w.write_run({"x": [1, 2, 3, 4]}, meta={"label": [10, 11]})
        w.write_run({"x": [1, 2]}, meta={"label": [10, 11]})
    ds = formats.open_shards(tmp_path / "ds")
    assert len(ds) == 2 and ds.metadata(["label"]).column("label").to_pylist() == [10, 11]


def test_a_run_states_its_progress_at_any_seal_from_one_running_total():
    from collections import Counter

    from packer.loop import Run, _run_state

    sizes = list(range(1, 2001))
    state = _run_state(Run({"x": sizes}, sizes), 100, Counter(a=2), 7, "p")
    for k in (1, 2, 999, 2000):
        assert state(k) == {"next": 100 + k, "skipped": {"a": 2}, "bytes_in": 7 + sum(sizes[:k]),
                            "plan": "p"}


def _deep(depth: int) -> list:
    top = node = []
    for _ in range(depth):
        node.append([])
        node = node[0]
    return top


@pytest.mark.parametrize("value, words", [({1: 1, "a": 2}, "not JSON"), (_deep(5000), "not JSON")],
                         ids=["mixed-keys", "too-deep"])
def test_json_the_writer_cannot_encode_is_bad_input_not_a_crash(tmp_path, value, words):
    def fn(i):
        return {"m": value if i == 70 else {"i": i}}

    s = pack_fn(fn, range(100), tmp_path / "ds", workers=0, durable=False, progress=False,
                     on_error="skip")
    assert s.records_written == 99 and dict(s.skipped) == {"not-json": 1}
    assert words in (tmp_path / "ds" / "skipped.jsonl").read_text()
    with pytest.raises(SchemaError, match="field 'm'"):
        formats.fields.encode_value(Field("m", "json"), value)
