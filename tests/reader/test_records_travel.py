"""Records that travel: ``ds[i]`` pickles to plain Python values (bytes for bytes
fields, arrays for arrays), so a PyTorch map-style ``Dataset`` over ``ds`` works
with worker processes; and ``ds`` itself pickles without its maps and reopens them
lazily where it is unpickled."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from helpers_reader import tiny_jpeg

from formats import DatasetWriter, Field
from reader import open_dataset

# Every type the format has (formats.fields.FIELD_TYPES), stored plain and, where
# the type allows it, zstd-compressed.
ALL_FIELDS = (
    Field("raw", "bytes"), Field("raw_z", "bytes", "zstd"), Field("image", "jpeg"),
    Field("picture", "png"), Field("any_image", "image"), Field("label", "int"),
    Field("score", "float"), Field("key", "str"), Field("caption_z", "str", "zstd"),
    Field("meta", "json"), Field("meta_z", "json", "zstd"),
    Field("vec", "ndarray", dtype="float32", shape=(3,)),
    Field("seq", "ndarray", dtype="int16", shape=(None,)),
    Field("grid_z", "ndarray", "zstd", dtype="uint8", shape=(None, 2)),
)
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))

# Schemas of a few fields each (the usual image/label/key, a bytes-only one, text
# and JSON only, arrays only) beside the one with every type.
SCHEMAS = {
    "every-type": tuple(f.name for f in ALL_FIELDS),
    "image-label-key": ("image", "label", "key"),
    "bytes-only": ("raw",),
    "compressed-only": ("raw_z", "caption_z", "meta_z", "grid_z"),
    "text-and-json": ("key", "meta", "score"),
    "arrays-and-bytes": ("vec", "seq", "raw", "any_image"),
}


def _value(name: str, i: int, rng: np.random.Generator):
    """Record ``i``'s value of field ``name``: empty values and edge cases included."""
    n = int(rng.integers(0, 40)) if i else 0  # record 0: every variable size empty
    return {
        "raw": rng.bytes(n), "raw_z": b"z" * n, "image": tiny_jpeg(rng, i),
        "picture": PNG, "any_image": tiny_jpeg(rng, i + 1, 16, 16),
        "label": -i if i % 2 else 2**62 + i, "score": float("inf") if i == 3 else i / 7,
        "key": f"k{i}-\u00e9", "caption_z": "caption " * n,
        "meta": {"i": i, "boxes": [[1, 2, 3, 4]] * (i % 3), "none": None},
        "meta_z": [i, "x" * n, {"deep": [True, False]}],
        "vec": rng.standard_normal(3).astype(np.float32),
        "seq": rng.integers(-300, 300, n, dtype=np.int16),
        "grid_z": rng.integers(0, 255, (n, 2), dtype=np.uint8),
    }[name]


def _build(root, names, n=7, seed=0):
    rng = np.random.default_rng(seed)
    fields = [f for f in ALL_FIELDS if f.name in names]
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=3, durable=False) as w:
        for i in range(n):
            w.write({f.name: _value(f.name, i, rng) for f in fields})
    return root


def _plain(value):
    """What a field's value must travel as: bytes for a bytes view, else itself."""
    return bytes(value) if isinstance(value, memoryview) else value


def _assert_same(got: dict, want, context: str) -> None:
    assert list(got) == list(want), context
    for name in want:
        a, b = got[name], _plain(want[name])
        assert type(a) is type(b), f"{context} field {name}: {type(a).__name__} vs {type(b).__name__}"
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, f"{context} field {name}"
            np.testing.assert_array_equal(a, b, err_msg=f"{context} field {name}")
        else:
            assert a == b, f"{context} field {name}"


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    base = tmp_path_factory.mktemp("travel")
    return {name: _build(base / name, names) for name, names in SCHEMAS.items()}


@pytest.mark.parametrize("schema", list(SCHEMAS))
def test_every_record_pickles_to_a_dict_of_plain_values(datasets, schema):
    with open_dataset(datasets[schema]) as ds:
        for i in range(len(ds)):
            rec = ds[i]
            again = pickle.loads(pickle.dumps(rec))
            assert type(again) is dict
            _assert_same(again, rec, f"{schema} record {i}")
            for name, value in again.items():
                assert not isinstance(value, memoryview), name  # nothing holds the maps


def test_a_record_pickles_after_some_fields_were_read_or_changed(datasets):
    with open_dataset(datasets["every-type"]) as ds:
        rec = ds[4]
        rec["meta"]  # parsed now; the other JSON field is parsed by the pickling
        rec["extra"] = memoryview(b"user bytes")
        del rec["raw_z"]
        again = pickle.loads(pickle.dumps(rec, protocol=pickle.HIGHEST_PROTOCOL))
        assert again["extra"] == b"user bytes" and "raw_z" not in again
        assert again["meta"] == ds[4]["meta"] and again["meta_z"] == ds[4]["meta_z"]
        assert again["image"] == bytes(ds[4]["image"])


def test_the_dataset_pickles_without_its_maps_and_reopens_them_when_read(datasets):
    with open_dataset(datasets["every-type"]) as ds:
        want = [dict(ds[i]) for i in range(len(ds))]
        blob = pickle.dumps(ds)
        again = pickle.loads(blob)
    assert len(blob) < 20_000  # the manifest and the schema, no payloads
    assert all(s is None for s in again.shards)  # nothing mapped until a read needs it
    assert again.check_crc  # the checks travel with it
    for i, rec in enumerate(want):
        _assert_same(pickle.loads(pickle.dumps(again[i])), rec, f"record {i}")
    assert any(s is not None for s in again.shards)
    again.close()


# -- a PyTorch DataLoader with workers over the map-style dataset ----------------------

class _MapStyle:
    """What users write: a torch map-style Dataset that returns ``ds[i]``."""

    def __init__(self, ds) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        return self.ds[i]


def _as_list(batch):
    return batch  # leaves the records as the workers sent them


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_torch_dataloader_with_two_workers_serves_every_record(datasets, context):
    torch = pytest.importorskip("torch", reason="the DataLoader test needs PyTorch")
    with open_dataset(datasets["every-type"]) as ds:
        dl = torch.utils.data.DataLoader(
            _MapStyle(ds), batch_size=3, num_workers=2, collate_fn=_as_list,
            multiprocessing_context=context, timeout=120)  # a regression fails, never hangs
        seen = [rec for batch in dl for rec in batch]
        assert len(seen) == len(ds)
        for i, rec in enumerate(seen):
            assert type(rec) is dict
            _assert_same(rec, ds[i], f"{context} record {i}")
