"""The reader's smaller API: lookup by key, "no such path", option checks, __version__."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import pickle
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from helpers_reader import CropPipeline, make_dataset

import reader
from formats import DatasetWriter, Field, ManifestError, SchemaError, ShardpackError
from formats.errors import DatasetNotFoundError, DuplicateKeyError, UnknownKeyError
from formats.shard import key_index
from formats.shard.column_cache import columns_folder
from formats.shard.key_index import key_hash, key_hashes
from formats.version import package_version
from reader import Loader
from reader.options import (
    DecodeOptions,
    SamplerOptions,
    WorkerOptions,
    check_batch_size,
    check_fields,
)
from reader.transforms import RandomResizedCrop
from reader.transforms.checks import check_pipeline_options
from tests.helpers_paths import ROOT


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    """200 records in 4 shards, key "k<index>"."""
    return make_dataset(tmp_path_factory.mktemp("api") / "pets.shards", 200)


def write(root, keys):
    with DatasetWriter(root, [Field("label", "int"), Field("key", "str")], shard_size=None,
                       records_per_shard=3, durable=False) as w:
        for i, k in enumerate(keys):
            w.write({"label": i, "key": k})
    return root


# -- lookup by key ---------------------------------------------------------------------

def test_a_record_is_found_by_its_key_in_any_shard(ds_path):
    ds = reader.open_dataset(ds_path)
    for i in (0, 17, 49, 50, 199):
        assert ds.index_of(f"k{i}") == i
        rec = ds[f"k{i}"]
        assert rec["label"] == i and rec["key"] == f"k{i}"
        assert bytes(rec["image"]) == bytes(ds[i]["image"])
    assert ds[np.str_("k3")]["label"] == 3  # numpy strings are str


def test_the_key_index_is_built_once_and_not_pickled(ds_path):
    ds = reader.open_dataset(ds_path)
    assert ds._keys is None, "opening a dataset must not read its keys"
    index = ds.key_index()
    ds.index_of("k5")
    assert ds.key_index() is index and index.size == 200 and index.records == 200
    names = sorted(p.name for p in columns_folder(ds).iterdir())
    assert names == [".inuse", ".lock", "key-in-field.col", "key-sorted-hash.col", "key-sorted-record.col"]
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._keys is None
    assert copy["k150"]["label"] == 150


def test_an_unknown_key_is_a_key_error_naming_key_dataset_and_close_matches(ds_path):
    ds = reader.open_dataset(ds_path)
    with pytest.raises(UnknownKeyError) as info:
        ds["K17"]
    err = info.value
    assert isinstance(err, KeyError) and isinstance(err, ShardpackError)
    text = str(err)
    assert "'K17'" in text and str(ds_path) in text and "'k17'" in text
    assert err.key == "K17" and "k17" in err.matches
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is UnknownKeyError and str(again) == text and again.key == "K17"
    with pytest.raises(KeyError, match="close matches") as info:
        ds.index_of("k2000")
    with pytest.raises(KeyError) as info:
        ds.index_of("completely different")
    assert "close matches" not in str(info.value) and info.value.matches == ()


def test_a_key_is_a_str(ds_path):
    ds = reader.open_dataset(ds_path)
    with pytest.raises(TypeError, match="str, not bytes"):
        ds.index_of(b"k1")
    assert ds[5]["key"] == "k5" and ds[np.int64(5)]["key"] == "k5"


def test_a_dataset_without_keys_says_so(tmp_path):
    root = make_dataset(tmp_path / "nokeys", 20, records_per_shard=10, extra=False)
    ds = reader.open_dataset(root)
    for lookup in (ds.index_of, ds.__getitem__):
        with pytest.raises(SchemaError, match=r"no record keys.*str field named 'key'") as info:
            lookup("k1")
        assert "image: jpeg" in str(info.value) and str(root) in str(info.value)
    assert ds[3]["label"] == 3


def test_a_duplicated_key_names_its_records_and_indices_of_gives_them_all(tmp_path):
    keys = [f"r{i}" for i in range(10)]
    keys[7] = keys[1] = keys[8] = "twice"  # in shards 0, 2, 2
    ds = reader.open_dataset(write(tmp_path / "dup", keys))
    with pytest.raises(DuplicateKeyError, match=r"3 records have key 'twice': records \[1, 7, 8\]") \
            as info:
        ds["twice"]
    assert isinstance(info.value, KeyError) and info.value.matches == (1, 7, 8)
    assert ds.indices_of("twice").tolist() == [1, 7, 8]
    assert ds.indices_of("absent").tolist() == []
    assert ds.index_of("r9") == 9  # the other keys still name one record each


KEYS = ["z", "ä", "日本/猫.jpg", "a", "😀", "ab", "", "Z", "a\x00", "é", "ä"[0] + "x",
        "exactly8", "sixteen-bytes-16", "a key longer than three words of eight bytes"]


def test_every_key_is_found_whatever_its_bytes_and_length(tmp_path):
    ds = reader.open_dataset(write(tmp_path / "keys", KEYS))
    for i, k in enumerate(KEYS):
        assert ds.indices_of(k).tolist() == [i], k
    for absent in ("\ud800", "y", "exactly", "exactly8\x00", "a key longer than three words of "
                   "eight byteS"):  # a lone surrogate matches nothing and raises nothing
        assert ds.indices_of(absent).tolist() == []


def test_key_hashes_depend_on_every_byte_and_the_length():
    keys = ["", "\x00", "\x00\x00", "a" * 8, "a" * 9, "a" * 7 + "b", "b" + "a" * 7,
            "x" * 17, "x" * 16 + "y", None]
    h = key_hashes(pa.array(keys))
    assert h[-1] == 0 and (h[:-1] != 0).all()
    assert len(set(h[:-1].tolist())) == len(keys) - 1
    chunked = key_hashes(pa.chunked_array([pa.array(keys[:4]), pa.array(keys[4:])]))
    assert chunked.tolist() == h.tolist()  # chunks, offsets: the same hashes
    assert key_hashes(pa.array(keys).slice(3, 4)).tolist() == h[3:7].tolist()
    one = [key_hash(k.encode()) for k in keys[:-1]]  # a lookup's hash: the same values
    assert one == h[:-1].tolist()


@pytest.mark.parametrize("bucket", [1 << 20, 4])  # one sort; the build's buckets
def test_colliding_hashes_and_duplicates_never_give_a_wrong_record(tmp_path, monkeypatch,
                                                                    rng, bucket):
    monkeypatch.setattr(key_index, "_BUCKET", bucket)
    monkeypatch.setattr(key_index, "_CHUNK", 7)  # chunks that split buckets
    keys = [f"cls{i % 7}/img_{i:05d}.jpg" for i in rng.permutation(300)]
    keys[10] = keys[250] = keys[299] = "twice"
    ds = reader.open_dataset(write(tmp_path / f"many{bucket}", keys))
    for j in rng.integers(0, 300, 40).tolist():
        assert ds.indices_of(keys[j]).tolist() == [i for i, k in enumerate(keys) if k == keys[j]]
    assert ds.indices_of("twice").tolist() == [10, 250, 299]
    # every key hashing alike: the checks against the metadata still find only the right one
    other = reader.open_dataset(write(tmp_path / f"same{bucket}", keys[:40]))
    monkeypatch.setattr(key_index, "_hash", lambda off, raw, valid: np.where(valid, 7, 0)
                        .astype(np.uint64))
    monkeypatch.setattr(key_index, "key_hash", lambda key: 7)
    for j in (0, 5, 39):
        assert other.indices_of(keys[j]).tolist() == [j]
    assert other.indices_of("absent").tolist() == []


@pytest.mark.parametrize("bits", [1, 3])
@pytest.mark.parametrize("nulls", [0.0, 0.5, 1.0])
def test_the_bucketed_sort_is_a_stable_argsort(monkeypatch, rng, bits, nulls):
    monkeypatch.setattr(key_index, "_CHUNK", 37)  # chunks that split every bucket
    for n in (1, 100, 3000):
        h = rng.integers(1, 2**63, n, dtype=np.uint64) * np.uint64(2)
        h[rng.random(n) < nulls] = 0  # records without a key: hash 0, never sorted
        h[: n // 5] = h[n // 2]  # a key many records share
        got_hash, got_record = np.zeros(n, np.uint64), np.zeros(n, np.int64)
        key_index._sort(h, got_hash, got_record, bits)
        order = np.argsort(h, kind="stable")
        assert got_hash.tolist() == h[order].tolist() and got_record.tolist() == order.tolist()


def test_records_without_a_key_are_never_found(tmp_path):
    with DatasetWriter(tmp_path / "some", [Field("label", "int")], shard_size=None,
                       records_per_shard=4, durable=False) as w:
        for i in range(10):
            w.write({"label": i}, meta={"key": f"k{i}"} if i % 3 else {})
    ds = reader.open_dataset(tmp_path / "some")
    assert ds.key_index().size == 6 and ds.key_index().records == 10
    assert [ds.index_of(f"k{i}") for i in range(10) if i % 3] == [1, 2, 4, 5, 7, 8]
    assert ds.indices_of("").tolist() == [] and ds.indices_of("k3").tolist() == []
    assert not ds.key_index().by_field  # no key field: checked against the metadata


def test_a_closed_dataset_still_finds_its_keys(ds_path):
    ds = reader.open_dataset(ds_path)
    assert ds.index_of("k3") == 3 and ds.key_index().by_field
    ds.close()
    assert ds.index_of("k150") == 150  # from the metadata tables: the shards are closed


def test_keys_are_checked_against_the_metadata_where_the_key_field_disagrees(tmp_path):
    with DatasetWriter(tmp_path / "two", [Field("key", "str")], shard_size=None,
                       records_per_shard=4, durable=False) as w:
        for i in range(10):  # the metadata's key is the lookup key (FORMAT.md, 6.4)
            w.write({"key": f"field{i}"}, meta={"key": f"meta{i}"} if i == 6 else {})
    ds = reader.open_dataset(tmp_path / "two")
    assert ds.index_of("meta6") == 6 and ds.indices_of("field6").tolist() == []
    assert ds.index_of("field7") == 7 and not ds.key_index().by_field
    assert reader.open_dataset(write(tmp_path / "one", ["a", "b"])).key_index().by_field


def test_close_matches_are_sought_near_the_key_among_the_first_keys(tmp_path, monkeypatch):
    monkeypatch.setattr(key_index, "CLOSE_MATCH_SCAN", 900)
    monkeypatch.setattr(key_index, "CLOSE_MATCH_NEAR", 20)
    with DatasetWriter(tmp_path / "birds", [Field("key", "str")], shard_size=None,
                       records_per_shard=250, durable=False) as w:
        for i in range(1200):
            w.write({"key": f"bird/img_{i:06d}.jpg"})
    index = reader.open_dataset(tmp_path / "birds").key_index()
    assert index.close_matches("bird/img_000345.jpgg")[0] == "bird/img_000345.jpg"
    assert index.close_matches("bird/img_000345.jpg", n=1) == ["bird/img_000345.jpg"]
    assert "bird/img_001100.jpg" not in index.close_matches("bird/img_001100.jpgg")  # past 900


# -- no such path ----------------------------------------------------------------------

def test_a_missing_path_says_so_and_suggests_a_neighbour(ds_path):
    missing = ds_path.parent / "pets.shardz"
    for open_ in (reader.open_dataset, lambda p: Loader(p, 8, decode=False)):
        with pytest.raises(DatasetNotFoundError) as info:
            open_(missing)
        text = str(info.value)
        assert "does not exist" in text and "manifest" not in text
        assert f"did you mean {str(ds_path)!r}" in text
    err = info.value
    assert isinstance(err, FileNotFoundError) and isinstance(err, ManifestError)
    assert err.filename == str(missing)
    with pytest.raises(FileNotFoundError, match=r"'.*nope' does not exist either"):
        reader.open_dataset(ds_path.parent / "nope" / "deeper" / "ds")


def test_a_file_is_not_a_dataset_folder(ds_path):
    with pytest.raises(DatasetNotFoundError, match=f"not a folder.*pass its folder, '{ds_path}'"):
        reader.open_dataset(ds_path / "manifest.json")


def test_a_folder_without_manifest_keeps_its_message(tmp_path):
    with pytest.raises(ManifestError, match=r"no manifest.json") as info:
        reader.open_dataset(tmp_path)
    assert not isinstance(info.value, DatasetNotFoundError)


def test_open_dataset_checks_its_argument_types(ds_path):
    with pytest.raises(TypeError, match=r"path must be a str or os.PathLike.*int"):
        reader.open_dataset(123)
    with pytest.raises(TypeError, match=r"cache must be a reader.CacheOptions"):
        reader.open_dataset(ds_path, cache="/tmp/cache")
    with pytest.raises(TypeError, match="check_crc must be True or False, not 'yes'"):
        reader.open_dataset(ds_path, check_crc="yes")


# -- option checks ---------------------------------------------------------------------

def test_check_batch_size():
    assert check_batch_size(32) == 32
    assert type(check_batch_size(np.int64(8))) is int
    for bad, exc, match in (("32", TypeError, "batch_size must be an int >= 1, not str '32'"),
                            (True, TypeError, "not bool True"),
                            (32.0, TypeError, "not float 32.0"),
                            (None, TypeError, "not NoneType None"),
                            (0, ValueError, "batch_size must be an int >= 1, not 0")):
        with pytest.raises(exc, match=match):
            check_batch_size(bad)


BAD_OPTIONS = [
    (WorkerOptions, {"num_workers": True}, TypeError, "num_workers .* not bool True"),
    (WorkerOptions, {"num_workers": "4"}, ValueError, "num_workers .* or 'auto', not '4'"),
    (WorkerOptions, {"num_workers": -1}, ValueError, "num_workers must be an int >= 0"),
    (WorkerOptions, {"num_workers": 2.0}, TypeError, "num_workers .* not float 2.0"),
    (WorkerOptions, {"prefetch": 0}, ValueError, "prefetch must be an int >= 1 or 'auto', not 0"),
    (WorkerOptions, {"prefetch": "2"}, ValueError, "prefetch .* not '2'"),
    (WorkerOptions, {"max_prefetch": 0}, ValueError, "max_prefetch"),
    (WorkerOptions, {"max_ring_bytes": "2G"}, TypeError, "max_ring_bytes .* str '2G'"),
    (WorkerOptions, {"timeout": 0}, ValueError, "timeout .* > 0 or None, not 0"),
    (WorkerOptions, {"timeout": -1.5}, ValueError, "timeout .* not -1.5"),
    (WorkerOptions, {"timeout": math.nan}, ValueError, "timeout .* not nan"),
    (WorkerOptions, {"timeout": "5"}, TypeError, "timeout .* not str '5'"),
    (WorkerOptions, {"timeout": True}, TypeError, "timeout .* not bool True"),
    (WorkerOptions, {"start_method": "thread"}, ValueError, "start_method .* not 'thread'"),
    (WorkerOptions, {"start_method": 1}, TypeError, "start_method"),
    (WorkerOptions, {"copy": "yes"}, TypeError, "copy must be True or False, not str 'yes'"),
    (WorkerOptions, {"persistent_workers": 1}, TypeError, "persistent_workers .* int 1"),
    (SamplerOptions, {"shuffle": 1}, TypeError, "shuffle must be .* not 1"),
    (SamplerOptions, {"shuffle": "sometimes"}, ValueError, "shuffle .* not 'sometimes'"),
    (SamplerOptions, {"shuffle": None}, TypeError, "shuffle"),
    (SamplerOptions, {"seed": -1}, ValueError, "seed must be an int >= 0, not -1"),
    (SamplerOptions, {"seed": 1.5}, TypeError, "seed .* float 1.5"),
    (SamplerOptions, {"seed": "0"}, TypeError, "seed .* str '0'"),
    (SamplerOptions, {"seed": True}, TypeError, "seed .* bool True"),
    (SamplerOptions, {"drop_last": "no"}, TypeError, "drop_last must be True or False"),
    (SamplerOptions, {"rank": "0", "world_size": 2}, TypeError, "rank .* str '0'"),
    (SamplerOptions, {"rank": 0, "world_size": 0}, ValueError, "world_size must be an int >= 1"),
    (SamplerOptions, {"rank": 2, "world_size": 2}, ValueError, r"rank 2 is not in \[0"),
    (SamplerOptions, {"shuffle_window": 0}, ValueError, "shuffle_window must be an int >= 1, not 0"),
    (DecodeOptions, {"fields": "image"}, TypeError, r"fields must be a tuple .*fields=\('image',\)"),
    (DecodeOptions, {"fields": ()}, ValueError, "at least one field"),
    (DecodeOptions, {"fields": ("label", "label")}, ValueError, "'label' more than once"),
    (DecodeOptions, {"fields": ["label", 3]}, TypeError, "field names .* not 3"),
    (DecodeOptions, {"fields": 3}, TypeError, "fields must be a tuple .* int 3"),
    (DecodeOptions, {"on_error": "ignore"}, ValueError, "on_error must be one of 'fail', 'skip'"),
    (DecodeOptions, {"on_error": None}, TypeError, "on_error .* not None"),
    (DecodeOptions, {"image_field": 0}, TypeError, "image_field .* int 0"),
    (DecodeOptions, {"decode": "false"}, TypeError, "decode must be True or False, not str"),
    (DecodeOptions, {"check_crc": None}, TypeError, "check_crc must be True or False"),
    (check_pipeline_options, {"transform": "RandomResizedCrop(224)"}, TypeError, "transform must be a"),
    (check_pipeline_options, {"transform": [RandomResizedCrop(32), 5]}, TypeError, r"transform\[1\] .* int 5"),
    (check_pipeline_options, {"transform": RandomResizedCrop}, TypeError, "transform must be"),
]


@pytest.mark.parametrize(("cls", "kwargs", "exc", "match"), BAD_OPTIONS,
                         ids=[f"{c.__name__}-{next(iter(k))}={k[next(iter(k))]!r}"
                              for c, k, _, _ in BAD_OPTIONS])
def test_a_wrong_option_is_refused_naming_it_and_its_value(cls, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        cls(**kwargs)


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    ({"transform": "RandomResizedCrop(224)"}, TypeError, "transform must be a"),
    ({"annotations": {"boxes": "boxes"}}, TypeError, "annotations must be a reader.Annotations"),
    ({"decoders": {"label": len}}, TypeError, "decoders must be a dict of field name -> "),
    ({"collate": ["image"]}, TypeError, "collate must be a dict"),
    ({"collate": {"image": "stacked"}}, ValueError, r"collate\['image'\] must be"),
], ids=lambda v: next(iter(v)) if isinstance(v, dict) else None)
def test_the_loader_checks_its_pipeline_keywords_at_construction(ds_path, kwargs, exc, match):
    # The checks that need the pipeline's types (reader.transforms.checks) run when
    # the Loader is built, as the records' own checks do, never later in a worker.
    with pytest.raises(exc, match=match):
        Loader(ds_path, batch_size=4, num_workers=0, **kwargs)


def test_good_options_are_kept_and_normalized():
    w = WorkerOptions(num_workers=np.int64(2), prefetch="auto", timeout=5, copy=np.True_)
    assert (w.num_workers, w.timeout, w.copy) == (2, 5.0, True)
    assert type(w.num_workers) is int and type(w.copy) is bool
    assert WorkerOptions(timeout=math.inf).timeout == math.inf
    assert WorkerOptions(num_workers=0, prefetch=1, start_method="spawn").prefetch == 1
    s = SamplerOptions(shuffle=True, seed=np.uint32(7), rank=1, world_size=2)
    assert (s.shuffle, s.seed, type(s.seed)) == ("full", 7, int)
    assert SamplerOptions(shuffle=np.False_).shuffle is False
    assert SamplerOptions(shuffle="block").shuffle == "block"
    d = DecodeOptions(fields=["image", "label"], transform=[RandomResizedCrop(32), lambda im: im])
    assert d.fields == ("image", "label")
    assert DecodeOptions(transform=CropPipeline()).on_error == "fail"
    assert DecodeOptions(transform=RandomResizedCrop(32), on_error="skip").on_error == "skip"


def test_check_fields_names_the_unknown_field_the_dataset_and_its_fields(ds_path):
    ds = reader.open_dataset(ds_path)
    schema = {f.name: f.type for f in ds.fields}
    check_fields(DecodeOptions(fields=("image", "label"), image_field="image"), schema, ds.root)
    check_fields(DecodeOptions(), schema, ds.root)
    with pytest.raises(ValueError) as info:
        check_fields(DecodeOptions(image_field="img"), schema, ds.root)
    text = str(info.value)
    assert text.startswith("image_field: no field 'img'") and str(ds_path) in text
    assert "image (jpeg), label (int), score (float), key (str)" in text
    assert "did you mean 'image'?" in text
    with pytest.raises(ValueError, match=r"fields: no field 'lable'.*did you mean 'label'"):
        check_fields(DecodeOptions(fields=("image", "lable")), schema, ds.root)
    with pytest.raises(ValueError, match="no field 'zzz'") as info:
        check_fields(DecodeOptions(fields=("zzz",)), schema, ds.root)
    assert "did you mean" not in str(info.value)


def test_every_option_is_one_loader_keyword_and_reaches_its_record(ds_path):
    # One way per option: each field of the records the order, the pipeline and the
    # workers read is a Loader keyword of the same name and default, and nothing else.
    params = inspect.signature(Loader).parameters
    records = (SamplerOptions, DecodeOptions, WorkerOptions)
    for cls in records:
        for f in dataclasses.fields(cls):
            assert f.name in params, f"{cls.__name__}.{f.name} has no Loader keyword"
            assert params[f.name].default == f.default, (f.name, params[f.name].default)
    assert not [p for p in params if p.endswith("_options") and p != "device_options"]
    chosen = {"shuffle": "block", "seed": 3, "drop_last": True, "rank": 1, "world_size": 2,
              "shuffle_window": 5, "fields": ("image", "label"), "image_field": "image",
              "on_error": "skip", "check_crc": False, "num_workers": 1, "prefetch": 2,
              "max_prefetch": 3, "max_ring_bytes": 1 << 28, "timeout": 9.0,
              "start_method": "spawn", "copy": True, "persistent_workers": True}
    with Loader(ds_path, 8, transform=CropPipeline(), **chosen) as lo:
        got = {f.name: getattr(getattr(lo, name), f.name)
               for name, cls in zip(("sampler_options", "decode_options", "worker_options"),
                                    records, strict=True)
               for f in dataclasses.fields(cls) if f.name in chosen}
    assert got == chosen


# -- version ---------------------------------------------------------------------------

def test_reader_version_is_the_one_the_command_lines_print(capsys):
    from packer.cli import main

    assert reader.__version__ == package_version() and reader.__version__
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.split()[-1] == reader.__version__


# -- the face: what `import reader` offers -----------------------------------------------

README = ROOT / "README.md"
INTERNAL = ("SlotRing", "SlotLayout", "FieldLayout", "CpuSink", "Sampler", "BatchTiming",
            "SamplerOptions", "DecodeOptions", "WorkerOptions")


def test_the_top_level_exports_what_the_readme_teaches_and_nothing_internal():
    text = README.read_text()
    taught = set(re.findall(r"(?<![\w.])reader\.([A-Z]\w*|open_dataset|enable_monitor)\b", text))
    assert {"Loader", "open_dataset", "enable_monitor"} <= taught  # the sweep reads the README
    taught |= {"AspectRatioBatches", "BudgetBatches", "TorchLoader", "DeviceOptions", "Monitor",
               "RandomResizedCrop", "ResizeShortestEdge", "PadToMultiple", "Normalize",
               "LoaderError"}
    assert taught <= set(reader.__all__), taught - set(reader.__all__)
    assert all(hasattr(reader, name) for name in reader.__all__)
    assert not set(INTERNAL) & set(vars(reader)), set(INTERNAL) & set(vars(reader))


def test_the_readme_faces_are_subpackages_and_no_shim_repeats_their_names():
    """``reader.transforms`` and ``reader.batching`` are the pipeline's and the order's
    own packages (no module beside a subpackage of another name re-exports them), and
    the GPU options are ``reader.DeviceOptions``, the one spelling besides their home."""
    for face in ("transforms", "batching"):
        mod = importlib.import_module(f"reader.{face}")
        assert hasattr(mod, "__path__"), f"reader.{face} is a module, not a subpackage"
        assert mod.__all__ and all(hasattr(mod, n) for n in mod.__all__)
    # Read from the tree, not by importing: an editable install may map old names elsewhere.
    package = Path(reader.__file__).parent
    for gone in ("device.py", "transforms.py", "batching.py", "order", "pipeline"):
        assert not (package / gone).exists(), f"reader/{gone} is back"
    assert {"AspectRatioBatches", "BudgetBatches", "TokenBlocks"} <= set(
        importlib.import_module("reader.batching").__all__)
    assert reader.DeviceOptions is importlib.import_module("reader.options").DeviceOptions


def test_every_module_path_the_readme_teaches_is_importable():
    text = README.read_text()
    lines = re.findall(r"^from (reader(?:\.\w+)*) import ([\w, ]+)$", text, re.M)
    dotted = re.findall(r"(?<![\w.])reader\.(\w+)\.([A-Z]\w*)", text)
    assert lines  # from reader.transforms import ...; reader.batching import ...
    for module, names in lines + [(f"reader.{m}", n) for m, n in dotted]:
        mod = importlib.import_module(module)
        for name in names.replace(" ", "").split(","):
            assert hasattr(mod, name), f"{module}.{name}"


# -- errors: under the one root, keeping the standard bases ------------------------------

def test_every_error_the_reader_defines_is_a_shardpack_error_keeping_its_standard_base():
    from reader import MonitorRecordError

    found = {}
    for path in sorted((README.parent / "reader").rglob("*.py")):
        parts = list(path.relative_to(README.parent).with_suffix("").parts)
        module = importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        for name, obj in vars(module).items():
            if isinstance(obj, type) and issubclass(obj, BaseException) \
                    and obj.__module__ == module.__name__:
                found[name] = obj
    assert {"LoaderError", "WorkerError", "DecodeError", "MonitorRecordError"} <= set(found)
    assert all(issubclass(cls, ShardpackError) for cls in found.values()), found
    bases = {reader.LoaderError: RuntimeError, reader.WorkerError: RuntimeError,
             reader.WorkerDiedError: RuntimeError, reader.LoaderTimeoutError: RuntimeError,
             reader.DecodeError: ValueError, MonitorRecordError: ValueError}
    for cls, base in bases.items():
        assert issubclass(cls, base), f"{cls.__name__} is no longer a {base.__name__}"
    assert not issubclass(reader.LoaderError, ValueError)  # a loader failure is not bad data


def test_a_worker_error_renders_and_pickles_as_before():
    err = reader.WorkerError("worker 1 failed", worker=1, pid=42, record=7, exc_type="KeyError",
                             traceback="tb")
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is reader.WorkerError and str(again) == str(err) == "worker 1 failed"
    assert (again.worker, again.pid, again.record, again.exc_type, again.traceback) == \
        (1, 42, 7, "KeyError", "tb")
    decode = pickle.loads(pickle.dumps(reader.DecodeError("corrupt JPEG")))
    assert type(decode) is reader.DecodeError and str(decode) == "corrupt JPEG"


def test_the_monitor_subpackage_is_a_face_too():
    from reader.monitor import Monitor, Thresholds, enable_monitor

    assert (Monitor, Thresholds, enable_monitor) == (reader.Monitor, reader.Thresholds,
                                                     reader.enable_monitor)
