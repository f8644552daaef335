"""The map-style dataset as users index it: ``ds[i]``, ``ds[a:b]``, ``ds[key]``,
``ds.values``; checked against CRC32C by default (as the Loader is); its refusals
typed, naming what they refuse, and short."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers_reader import CropPipeline, make_dataset
from hostile import run_case

from formats import open_shards
from formats.errors import (
    ArgumentTypeError,
    CorruptRecordError,
    FormatError,
    MissingFileError,
    RecordIndexError,
    ShardpackError,
    UnknownKeyError,
)
from reader import Loader, open_dataset
from reader.data.dataset import read_many
from tests.helpers_paths import TESTS


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("map") / "ds", 12, records_per_shard=5)


def _flip(root: Path, ds, index: int, field: str, at: int = 7) -> tuple[str, int, int]:
    """Flip one bit of a stored payload in place: (shard file, record in it, offset)."""
    s, r = ds.locate(index)
    shard = ds.shard(s)
    offset = int(shard.offsets[r, ds.field_index[field]])
    path = shard.data_path
    with open(path, "r+b") as f:
        f.seek(offset + at)
        byte = f.read(1)
        f.seek(offset + at)
        f.write(bytes([byte[0] ^ 0x10]))
    return path.name, r, offset


# -- checksums where data is read --------------------------------------------------------

@pytest.fixture
def damaged(tmp_path):
    """A dataset whose record 7's image has one bit flipped: (path, where it is)."""
    root = make_dataset(tmp_path / "ds", 12, records_per_shard=5)
    with open_shards(root, check_crc=False) as ds:
        where = _flip(root, ds, 7, "image")
    return root, where


def test_a_flipped_byte_in_a_stored_image_is_an_error_by_default(damaged):
    root, (name, record, offset) = damaged
    want = rf"{name} record {record} at byte {offset}: field 0 checksum mismatch"
    with open_dataset(root) as ds:
        assert ds.check_crc
        with pytest.raises(CorruptRecordError, match=want):
            ds[7]
        with pytest.raises(CorruptRecordError, match=want):
            ds[-5]
        with pytest.raises(CorruptRecordError, match=want):
            ds[5:9]
        with pytest.raises(CorruptRecordError, match=want):
            ds["k7"]
        for read in (lambda: ds.values([3, 7], "image"), lambda: ds.payloads([7], "image"),
                     lambda: ds.get(7, "image"), lambda: ds.payload(7, "image"),
                     lambda: read_many(ds, [0, 7])):
            with pytest.raises(CorruptRecordError, match=want):
                read()
        # The other records, and the damaged one's other fields, still read.
        assert ds[6]["label"] == 6 and ds.get(7, "label") == 7
        assert ds.values([7], "key") == ["k7"]


def test_every_read_path_and_the_loader_say_the_same_thing(damaged):
    root, _ = damaged
    messages = set()
    with open_dataset(root) as ds:
        for read in (lambda: ds[7], lambda: ds.values([7], "image"),
                     lambda: ds.payloads([7], "image"), lambda: ds.get(7, "image")):
            with pytest.raises(CorruptRecordError) as info:
                read()
            messages.add(str(info.value))
        with pytest.raises(CorruptRecordError) as info, \
                Loader(ds, batch_size=4, transform=CropPipeline()) as lo:
            for _ in lo:
                pass
        messages.add(str(info.value))
    assert len(messages) == 1, messages


def test_check_crc_false_opts_out(damaged):
    root, _ = damaged
    with open_dataset(root, check_crc=False) as ds:
        assert not ds.check_crc
        image = bytes(ds[7]["image"])  # the damage comes through, as asked
    with open_dataset(root) as ds:
        s, r = ds.locate(7)
        shard = ds.shard(s)
        o, n = int(shard.offsets[r, 0]), int(shard.lengths[r, 0])
        assert image == bytes(shard.view[o : o + n])


def test_a_damaged_scalar_or_json_field_is_named_too(tmp_path):
    root = make_dataset(tmp_path / "ds", 12, records_per_shard=5)
    with open_shards(root, check_crc=False) as ds:
        name, record, offset = _flip(root, ds, 2, "key", at=0)
        _flip(root, ds, 9, "score", at=0)
    with open_dataset(root) as ds:
        with pytest.raises(CorruptRecordError, match=rf"{name} record {record} at byte {offset}"):
            ds[2]
        with pytest.raises(CorruptRecordError, match=r"shard-00001.rec record 4 .*field 2 checksum"):
            ds.scalars([9], "score")
        with pytest.raises(CorruptRecordError, match=r"shard-00001.rec record 4 .*field 2 checksum"):
            ds[9]


def test_the_dataset_opened_with_checks_keeps_them_in_workers(damaged):
    root, _ = damaged
    again = pickle.loads(pickle.dumps(open_dataset(root)))
    with pytest.raises(CorruptRecordError):
        again[7]
    again.close()


def test_a_record_is_checked_once_per_mapping_and_again_when_reopened(tmp_path, monkeypatch):
    """ds[i] checks a record the first time it is read from its shard's mapping; the
    views it hands out are that mapping's bytes, so a second check would vouch for
    nothing more. Damage written in place afterwards (never by shardpack: data files
    are replaced whole) is found by any reopened mapping: a pickled dataset, a worker,
    a shard opened again."""
    from formats.shard import dataset as dataset_module

    root = make_dataset(tmp_path / "ds", 12, records_per_shard=5)
    calls = []
    real = dataset_module.crc32c
    monkeypatch.setattr(dataset_module, "crc32c", lambda b: calls.append(1) or real(b))
    with open_dataset(root) as ds:
        fields = len(ds.fields)
        ds[7]
        assert len(calls) == fields  # every field of the record, once
        ds[7], ds[-5], ds[5:9]
        assert len(calls) == fields * (1 + 3)  # record 7 not again: 5, 6 and 8 checked
        _flip(root, ds, 7, "image")
        ds[7]  # this mapping vouched for record 7 already: as documented
        again = pickle.loads(pickle.dumps(ds))
        with pytest.raises(FormatError, match="replaced since it was opened"):
            again[7]  # a worker's reopened shard: the file changed under the dataset
        again.close()
    with open_dataset(root) as ds, \
            pytest.raises(CorruptRecordError, match="field 0 checksum mismatch"):
        ds[7]


# -- indices ---------------------------------------------------------------------------

def test_a_float_index_is_refused_naming_it_never_truncated(ds_path):
    with open_dataset(ds_path) as ds:
        for bad in (1.7, 1.0, np.float64(2.0), None, b"k1", [1]):
            with pytest.raises(ArgumentTypeError, match=r"a record index is an int") as info:
                ds[bad]
            assert isinstance(info.value, TypeError) and repr(bad)[:3] in str(info.value)
        with pytest.raises(ArgumentTypeError, match=r"found 1\.7"):
            ds.get(1.7, "label")
        with pytest.raises(ArgumentTypeError, match=r"dtype float64"):
            ds.values([0.0, 1.7], "label")
        with pytest.raises(ArgumentTypeError, match=r"dtype float64"):
            read_many(ds, np.array([1.7]))
        with pytest.raises(ArgumentTypeError, match=r"dtype bool"):
            ds.payloads([True, False], "image")
        assert ds.values([], "label") == [] and len(read_many(ds, [])["label"]) == 0


def test_integer_like_indices_work_as_in_a_list(ds_path):
    with open_dataset(ds_path) as ds:
        assert ds[np.int64(3)]["label"] == 3 and ds[np.uint8(4)]["label"] == 4
        assert ds[-1]["label"] == 11 and ds[-12]["label"] == 0
        assert ds.get(-2, "key") == "k10"


def test_slices_give_a_list_of_records_as_a_list_does(ds_path):
    with open_dataset(ds_path) as ds:
        labels = list(range(12))
        for sl in (slice(0, 3), slice(None), slice(-3, None), slice(None, None, -1),
                   slice(1, 11, 4), slice(5, 2), slice(100, 200), slice(-100, 2)):
            got = ds[sl]
            assert isinstance(got, list)
            assert [r["label"] for r in got] == labels[sl], sl
        assert bytes(ds[4:6][1]["image"]) == bytes(ds[5]["image"])
        assert pickle.loads(pickle.dumps(ds[0:2]))[1]["key"] == "k1"


def test_an_index_out_of_range_names_the_length(ds_path):
    with open_dataset(ds_path) as ds:
        for bad in (12, -13, 10**20):
            with pytest.raises(RecordIndexError, match=r"out of range for a dataset of 12 records"):
                ds[bad]
        with pytest.raises(IndexError, match=r"record 12 out of range for a dataset of 12"):
            ds.values([0, 12], "label")
        with pytest.raises(ShardpackError):
            ds.scalars([-1], "label")
        assert isinstance(RecordIndexError("x"), IndexError)


# -- what an error quotes --------------------------------------------------------------

def test_a_missing_10_mb_key_makes_a_short_message(ds_path):
    key = "x" * (10 << 20)
    with open_dataset(ds_path) as ds, pytest.raises(UnknownKeyError) as info:
        ds.index_of(key)
    text = str(info.value)
    assert len(text) < 600, len(text)
    assert f"({10 << 20} characters)" in text and "xxxx..." in text
    assert info.value.key is key  # the whole key stays on the error, for code
    with open_dataset(ds_path) as ds, pytest.raises(ArgumentTypeError) as info:
        ds.index_of(b"y" * (10 << 20))
    assert len(str(info.value)) < 600 and f"({10 << 20} bytes)" in str(info.value)


def missing_huge_key(path: str) -> None:
    """(Run in a bounded child.) A user looks up a 10 MB key no record has."""
    with open_dataset(path) as ds:
        ds.index_of("x" * (10 << 20))


def read_after_shard_deleted(path: str) -> None:
    """(Run in a bounded child.) A shard file is deleted after the dataset was opened."""
    ds = open_shards(path, max_open=1)
    ds[0]
    os.unlink(Path(path) / "shard-00002.rec")
    ds[len(ds) - 1]


@pytest.mark.parametrize(("case", "error", "said"), [
    ("missing_huge_key", "UnknownKeyError", f"({10 << 20} characters)"),
    ("read_after_shard_deleted", "MissingFileError", "shard-00002.rec: data file is missing"),
])
def test_hostile_lookups_are_typed_short_and_bounded(tmp_path, case, error, said):
    root = make_dataset(tmp_path / "ds", 12, records_per_shard=5)
    outcome = run_case("test_map_style_reads", case, str(root), timeout=5.0)
    assert outcome.kind == "typed" and outcome.error == error, str(outcome)
    assert said in outcome.message and len(outcome.message) < 600, outcome.message
    assert outcome.peak_mb < 512, str(outcome)


def test_every_error_cuts_what_it_quotes():
    exc = FormatError("bad", path="/x", found="f" * 5000, expected=list(range(5000)))
    text = str(exc)
    assert len(text) < 600
    assert "(5000 characters)" in text and "[0, 1, 2," in text
    assert str(FormatError("bad", found="short", expected=3)) == "bad: found 'short', expected 3"
    again = pickle.loads(pickle.dumps(exc))
    assert again.found == "f" * 5000 and str(again) == text  # the fields stay whole


# -- local paths -----------------------------------------------------------------------

def test_a_file_uri_opens_the_local_dataset(ds_path):
    uri = "file://" + str(ds_path.resolve())
    with open_dataset(uri) as ds:
        assert len(ds) == 12 and ds[0]["key"] == "k0"
        assert ds.root == ds_path.resolve()
    with open_dataset(Path(ds_path)) as ds:  # a Path still works as before
        assert len(ds) == 12


@pytest.mark.parametrize("command", ["info", "verify", "ls", "show"])
def test_inspect_shards_takes_a_file_uri(ds_path, command):
    uri = "file://" + str(ds_path.resolve())
    extra = ["0"] if command == "show" else []
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent)}
    done = subprocess.run([sys.executable, "-m", "reader.inspect.cli", uri, command, *extra],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "does not exist" not in done.stderr


def test_a_shard_file_deleted_after_open_is_a_missing_file(tmp_path):
    root = make_dataset(tmp_path / "ds", 12, records_per_shard=4)
    ds = open_shards(root, max_open=1)  # each shard opened when a read needs it
    os.unlink(root / "shard-00001.rec")
    with pytest.raises(MissingFileError, match=r"shard-00001.rec: data file is missing") as info:
        ds[5]
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, FormatError)
    assert info.value.filename == str(root / "shard-00001.rec")
    assert ds[0]["label"] == 0  # the other shards still read
    with pytest.raises(MissingFileError, match=r"shard-00001.rec: data file is missing"):
        ds.values([0, 6], "image")
    with pytest.raises(FileNotFoundError, match=r"shard-00001.rec: data file is missing"):
        open_dataset(root)  # a few shards are all opened at once: refused there
