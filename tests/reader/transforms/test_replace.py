"""on_error="replace": a damaged record is served as a record of its own source drawn
from (seed, record, attempt), so batches, resumes and step counts stay exact."""

from __future__ import annotations

import logging

import cv2
import numpy as np
import pytest
import simplejpeg

import formats
import reader
from formats import DatasetWriter, Field
from formats.errors import ArgumentError, CorruptRecordError
from reader import CenterCrop, Loader
from reader.errors import StateError
from reader.transforms import PadToMultiple, RandomHorizontalFlip, ResizeShortestEdge, bad_input
from reader.transforms.bad_input import REPLACE_ATTEMPTS, BadInput, Quarantine
from tests.helpers_reader import make_dataset, spy_rejects, tiny_jpeg

N = 80
UNDECODABLE = (3, 27, 61)  # images that are not JPEGs
CLASSIFY = [CenterCrop(16)]  # no randomness: a record's sample is the same wherever it lands


def flip(root, index: int, field: str, where: str = "middle") -> None:
    """Flip one byte of record ``index``'s ``field`` in its shard's data file (its
    checksum then fails; the dataset still opens)."""
    ds = formats.open_shards(root)
    path, _, offset = ds.where(index, field)
    _, _, lengths = ds.spans([index], field)
    at = offset + (int(lengths[0]) // 2 if where == "middle" else 0)
    ds.close()
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x10
    path.write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """80 records: three undecodable images, and one record each whose image, label or
    key (a field the main process reads) fails its checksum."""
    root = make_dataset(tmp_path_factory.mktemp("replace") / "ds", N, records_per_shard=20,
                        corrupt=UNDECODABLE)
    flip(root, 12, "image")
    flip(root, 45, "label", "start")
    flip(root, 70, "key")
    return root


BAD = sorted((*UNDECODABLE, 12, 45, 70))


def epoch_of(root, workers: int, **kw) -> tuple[list[dict], Loader]:
    kw.setdefault("transform", CLASSIFY)
    lo = Loader(root, 8, num_workers=workers, on_error="replace", copy=True, **kw)
    return list(lo), lo


def same(a: list[dict], b: list[dict]) -> bool:
    """Two runs' batches are equal, field by field, sample by sample."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.keys() != y.keys():
            return False
        for k in x:
            xs, ys = list(x[k]), list(y[k])
            if len(xs) != len(ys) or not all(np.array_equal(np.asarray(p), np.asarray(q))
                                             for p, q in zip(xs, ys, strict=True)):
                return False
    return True


# -- the policy ------------------------------------------------------------------------

def test_the_replacement_is_a_pure_draw_of_another_record_of_the_source(damaged):
    ds = formats.open_shards(damaged)
    p = BadInput("replace", seed=3)
    picks = [p.replacement(ds, 27, a) for a in range(1, 40)]
    assert picks == [BadInput("replace", seed=3).replacement(ds, 27, a) for a in range(1, 40)]
    assert 27 not in picks and all(0 <= c < N for c in picks)
    assert len(set(picks)) > 20, "attempts draw different records"
    assert picks != [BadInput("replace", seed=4).replacement(ds, 27, a) for a in range(1, 40)]
    ds.close()


def test_fail_and_skip_keep_their_meaning(damaged):
    with Loader(damaged, 8, transform=CLASSIFY, num_workers=0) as lo, \
            pytest.raises(CorruptRecordError, match="on_error='replace' to replace them"):
        list(lo)
    # skip marks what does not decode; a record failing its checksum still fails
    with Loader(damaged, 8, transform=CLASSIFY, num_workers=0, on_error="skip") as lo, \
            pytest.raises(CorruptRecordError, match="checksum"):
        list(lo)


# -- what a replaced batch is ----------------------------------------------------------

def test_bad_records_are_replaced_in_place_by_real_records(damaged):
    batches, lo = epoch_of(damaged, 0)
    assert [len(b["label"]) for b in batches] == [8] * (N // 8), "every batch stays full"
    assert all(b["valid"].all() for b in batches), "a replacement is real data"
    assert lo.replaced == len(BAD) and lo.skipped == 0
    assert sorted(r for _, r, _ in lo.quarantine) == BAD
    assert all(s is None for s, _, _ in lo.quarantine)
    labels = np.concatenate([b["label"] for b in batches])
    images = np.concatenate([b["image"] for b in batches])
    keys = [k for b in batches for k in b["key"]]
    scores = np.concatenate([b["score"] for b in batches])
    for _, record, replacement in lo.quarantine:
        assert replacement not in BAD
        # in the bad record's place, every field is the replacement's, its image too
        assert labels[record] == replacement and keys[record] == f"k{replacement}"
        assert scores[record] == replacement / 2
        assert np.array_equal(images[record], images[replacement])
    good = [i for i in range(N) if i not in BAD]
    assert labels[good].tolist() == good
    lo.close()


def test_the_same_records_replace_them_with_any_number_of_workers(damaged):
    one, lo0 = epoch_of(damaged, 0, shuffle=True, seed=11)
    two, lo2 = epoch_of(damaged, 2, shuffle=True, seed=11)
    assert same(one, two)
    assert lo0.quarantine == lo2.quarantine and lo0.replaced == lo2.replaced == len(BAD)
    # another seed draws other replacements (the seed keys the draw)
    _, lo9 = epoch_of(damaged, 0, shuffle=True, seed=9)
    assert sorted(r for _, r, _ in lo9.quarantine) == BAD
    assert {(r, c) for _, r, c in lo9.quarantine} != {(r, c) for _, r, c in lo0.quarantine}
    for lo in (lo0, lo2, lo9):
        lo.close()


@pytest.mark.parametrize("workers", [(0, 2), (2, 0)])
def test_a_resumed_run_serves_what_a_straight_one_does(damaged, workers):
    """10 steps straight against 5, a state, a new Loader and 5 more: the same batches
    and the same quarantine, which the state carries."""
    kw = dict(transform=CLASSIFY, shuffle=True, seed=2, on_error="replace", copy=True)
    with Loader(damaged, 8, num_workers=workers[0], **kw) as lo:
        straight = list(lo)
        whole = lo.quarantine
    with Loader(damaged, 8, num_workers=workers[0], **kw) as lo:
        it = iter(lo)
        first = [next(it) for _ in range(5)]
        state = lo.state_dict()
    assert 0 < len(state["quarantine"]["records"]) < len(BAD), "the cut falls between bad records"
    assert state["quarantine"]["replaced"] == len(state["quarantine"]["records"])
    with Loader(damaged, 8, num_workers=workers[1], **kw) as lo:
        lo.load_state_dict(state)
        assert lo.quarantine == [tuple(e) for e in state["quarantine"]["records"]]
        rest = list(lo)
        assert lo.quarantine == whole and lo.replaced == len(BAD)
        assert lo.state_dict()["quarantine"]["replaced"] == len(BAD)
    assert same(first + rest, straight)


def test_the_quarantine_counts_every_epoch_and_lists_each_record_once(damaged):
    with Loader(damaged, 8, transform=CLASSIFY, num_workers=0, on_error="replace") as lo:
        for _ in range(2):
            for _ in lo:
                pass
        assert lo.replaced == 2 * len(BAD) and len(lo.quarantine) == len(BAD)
        assert lo.stats()["replaced"] == 2 * len(BAD)


def test_the_quarantine_is_bounded(damaged, monkeypatch, caplog):
    monkeypatch.setattr(bad_input, "QUARANTINE_MAX", 2)
    with caplog.at_level(logging.WARNING, logger=bad_input.__name__):
        batches, lo = epoch_of(damaged, 0)
    assert len(lo.quarantine) == 2 and lo.replaced == len(BAD), "past the bound: counted"
    assert sum("lists no more" in r.getMessage() for r in caplog.records) == 1
    assert all(b["valid"].all() for b in batches)
    lo.close()


def test_a_state_without_a_quarantine_empties_it_and_a_bad_one_is_refused(damaged):
    with Loader(damaged, 8, transform=CLASSIFY, num_workers=0, on_error="replace") as lo:
        for _ in lo:
            pass
        assert lo.quarantine
        state = lo.state_dict()
        plain = {k: v for k, v in state.items() if k != "quarantine"}
        lo.load_state_dict(plain)
        assert lo.quarantine == [] and lo.replaced == 0
        for bad in ({"records": [[None, -1, 2]], "replaced": 1}, {"records": []},
                    [1, 2], {"records": [[3, 1, 2]], "replaced": 1}):
            with pytest.raises(StateError, match=r"state\['quarantine'\]"):
                lo.load_state_dict({**state, "quarantine": bad})
        assert lo.quarantine == [], "a refused state changes nothing"
    with Loader(damaged, 8, transform=CLASSIFY, num_workers=0) as lo:
        assert "quarantine" not in lo.state_dict()  # only where records are replaced
        lo.load_state_dict(state)  # a replacing run's state resumes a failing one
    q = Quarantine.from_state(state["quarantine"])
    assert q.state() == state["quarantine"]


# -- bounded attempts --------------------------------------------------------------------

def test_a_source_of_bad_records_fails_naming_every_record_tried(tmp_path):
    root = make_dataset(tmp_path / "all", 12, records_per_shard=6, corrupt=tuple(range(12)))
    with Loader(root, 4, transform=CLASSIFY, num_workers=0, on_error="replace") as lo, \
            pytest.raises(CorruptRecordError) as info:
        list(lo)
    msg = str(info.value)
    assert "dataset record 0 fails its checksum or does not decode" in msg
    assert f"so are the {REPLACE_ATTEMPTS} records drawn to replace it" in msg
    tried = msg.split("replace it (")[1].split(")")[0].split(", ")
    assert len(tried) == REPLACE_ATTEMPTS and "0" not in tried
    expected = [BadInput("replace").replacement(lo.dataset, 0, a)
                for a in range(1, REPLACE_ATTEMPTS + 1)]
    assert tried == [str(c) for c in expected]
    assert info.value.record == 0 and "shard-00000" in str(info.value.path)
    one = make_dataset(tmp_path / "one", 1, corrupt=(0,))
    with Loader(one, 1, transform=CLASSIFY, num_workers=2, on_error="replace") as lo, \
            pytest.raises(CorruptRecordError, match="no other record to replace it with"):
        list(lo)


def test_raw_mode_refuses_replace(damaged):
    with pytest.raises(ArgumentError, match="on_error would have no effect"):
        Loader(damaged, 8, decode=False, on_error="replace")


# -- a mixture: the replacement comes from the bad record's own source -------------------

@pytest.fixture(scope="module")
def mixture(tmp_path_factory, damaged):
    # The damaged source's image field is "image" (its writer saw bytes that are no JPEG):
    # the clean one holds a PNG among its JPEGs so that the sources store images alike.
    clean = tmp_path_factory.mktemp("clean") / "ds"
    rng = np.random.default_rng(7)
    fields = [Field("image", "image"), Field("label", "int"), Field("score", "float"),
              Field("key", "str")]
    with DatasetWriter(clean, fields, shard_size=None, records_per_shard=25, durable=False) as w:
        for i in range(50):
            image = tiny_jpeg(rng, i) if i else cv2.imencode(".png", np.zeros((40, 48, 3),
                                                                               np.uint8))[1]
            w.write({"image": bytes(image), "label": i, "score": i / 2, "key": f"k{i}"})
    return reader.Mix({"bad": str(damaged), "clean": str(clean)},
                      weights={"bad": 0.6, "clean": 0.4})


def test_a_mixture_replaces_from_the_same_source(mixture, damaged):
    with Loader(damaged, N, transform=CLASSIFY, num_workers=0, copy=True,
                on_error="replace") as lo:
        reference = next(iter(lo))["image"]  # every record of the source, in order
    kw = dict(transform=CLASSIFY, on_error="replace", copy=True, seed=1)
    with Loader(mixture, 8, num_workers=0, **kw) as lo:
        batches, ids = [], []
        for b in lo:
            batches.append(b)
            ids.append(lo.sampler.batch(lo.epoch, lo.position - 1))  # the plan's records
        ds = lo.dataset
        ids = np.concatenate(ids)
        quarantine = lo.quarantine
    assert quarantine and {s for s, _, _ in quarantine} == {"bad"}
    images = np.concatenate([b["image"] for b in batches])
    labels = np.concatenate([b["label"] for b in batches])
    for _, record, replacement in quarantine:
        assert 0 <= replacement < N and replacement not in BAD
        places = np.flatnonzero(ids == ds.offsets[0] + record)
        assert len(places)
        for p in places:
            assert labels[p] == replacement
            assert np.array_equal(images[p], reference[replacement]), "the bad source's record"
    with Loader(mixture, 8, num_workers=2, **kw) as lo:
        assert same(batches, list(lo))
        assert lo.quarantine == quarantine


def test_a_mixture_resumes_with_its_quarantine(mixture):
    kw = dict(transform=CLASSIFY, on_error="replace", copy=True, seed=4)
    with Loader(mixture, 8, num_workers=0, **kw) as lo:
        straight = [b for _, b in zip(range(16), lo, strict=False)]
        whole = lo.quarantine
    with Loader(mixture, 8, num_workers=2, **kw) as lo:
        it = iter(lo)
        first = [next(it) for _ in range(8)]
        state = lo.state_dict()
    assert state["quarantine"]["records"] and all(e[0] == "bad"
                                                  for e in state["quarantine"]["records"])
    with Loader(mixture, 8, num_workers=0, **kw) as lo:
        lo.load_state_dict(state)
        rest = [b for _, b in zip(range(8), lo, strict=False)]
        assert lo.quarantine == whole
    assert same(first + rest, straight)


# -- the sample path (whole images, detection) ------------------------------------------

def _det_record(rng, i: int) -> dict:
    h, w = int(rng.integers(5, 10)) * 8, int(rng.integers(5, 10)) * 8
    img = np.zeros((h, w, 3), np.uint8)
    img[: h // 2] = rng.integers(0, 256, (h // 2, w, 3), dtype=np.uint8)
    n = i % 3 + 1
    boxes = np.array([[j * 4, j * 4, j * 4 + 16, j * 4 + 12] for j in range(n)], np.float32)
    return {"image": simplejpeg.encode_jpeg(img, quality=95), "boxes": boxes,
            "labels": np.full(n, i, np.int64), "label": i}


DET_BAD = {2: "not an image", 9: "truncated png", 14: "checksum"}


@pytest.fixture(scope="module")
def det_path(tmp_path_factory):
    """24 records with boxes (record i: i % 3 + 1 boxes, labels all i); record 2 is not
    an image, record 9 a PNG whose header reads and whose body does not (it fails after
    the batch's layout), record 14's boxes fail their checksum."""
    root = tmp_path_factory.mktemp("det") / "ds"
    rng = np.random.default_rng(0)
    fields = [Field("image", "image"), Field("boxes", "ndarray", dtype="float32", shape=(None, 4)),
              Field("labels", "ndarray", dtype="int64", shape=(None,)), Field("label", "int")]
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=8, durable=False) as w:
        for i in range(24):
            rec = _det_record(rng, i)
            if i == 2:
                rec["image"] = b"not an image at all" * 4
            elif i == 9:
                png = cv2.imencode(".png", rng.integers(0, 255, (40, 48, 3), dtype=np.uint8))[1]
                rec["image"] = png.tobytes()[:200]
            w.write(rec)
    flip(root, 14, "boxes")
    return root


DETECTION = [ResizeShortestEdge((48, 64), max_size=100), RandomHorizontalFlip(), PadToMultiple(32)]


@pytest.mark.parametrize("transform", [DETECTION, None], ids=["detection", "whole-images"])
def test_the_sample_path_replaces_through_the_same_policy(det_path, transform, monkeypatch):
    calls = spy_rejects(monkeypatch)
    kw = dict(transform=transform, on_error="replace", copy=True, shuffle=True, seed=3)
    if transform is None:
        kw["collate"] = {"image": "ragged"}
    with Loader(det_path, 4, num_workers=0, **kw) as lo:
        batches = list(lo)
        quarantine = lo.quarantine
    assert calls, "what does not decode goes to the one policy"
    assert sorted(r for _, r, _ in quarantine) == sorted(DET_BAD)
    assert all(b["valid"].all() for b in batches) and [len(b["label"]) for b in batches] == [4] * 6
    labels = np.concatenate([b["label"] for b in batches])
    order = np.concatenate([lo.sampler.batch(0, k) for k in range(6)])
    for _, record, replacement in quarantine:
        p = int(np.flatnonzero(order == record)[0])
        b, i = batches[p // 4], p % 4
        assert labels[p] == replacement
        # the replacement's annotations follow its own image
        assert b["labels"][i].tolist() == [replacement] * (replacement % 3 + 1)
        assert len(b["boxes"][i]) == replacement % 3 + 1
        if transform is None:  # whole images: the replacement's own pixels
            q = int(np.flatnonzero(order == replacement)[0])
            assert np.array_equal(b["image"][i], batches[q // 4]["image"][q % 4])
    with Loader(det_path, 4, num_workers=2, **kw) as lo:
        assert same(batches, list(lo))
        assert lo.quarantine == quarantine


def test_the_torch_batch_dataset_serves_the_same_replaced_batches(damaged):
    pytest.importorskip("torch")
    from reader.torch_adapter import TorchBatchDataset

    batches, lo = epoch_of(damaged, 0, shuffle=True, seed=6)
    items = TorchBatchDataset(lo)
    items.set_epoch(0)  # the epoch read above (the loader has moved on to the next)
    for k, b in enumerate(batches):
        item = items[k]
        assert np.array_equal(item["image"].numpy(), b["image"])
        assert item["label"].tolist() == b["label"].tolist() and item["key"] == list(b["key"])
    lo.close()
