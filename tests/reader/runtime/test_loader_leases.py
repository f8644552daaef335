"""Leased batches: a slot is refilled only once nothing refers to its batch (reader.runtime.leases)."""

from __future__ import annotations

import gc
import os
import warnings

import numpy as np
import pytest
from helpers_reader import CropPipeline, make_dataset

from reader import Loader
from reader.runtime.leases import MAX_LEASED


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("leases") / "ds", 200)


def owned(batches):
    return [{k: np.array(v) for k, v in b.items() if isinstance(v, np.ndarray)} for b in batches]


def expected(ds_path, **kw):
    with Loader(ds_path, 16, transform=CropPipeline(), copy=True, **kw) as lo:
        return owned(list(lo))


def same(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.keys() == w.keys()
        for k in w:
            assert np.array_equal(g[k], w[k]), f"batch {i} field {k!r} differs"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_list_of_a_loader_is_the_copied_batches_with_one_warning(ds_path, num_workers):
    kw = {"shuffle": True, "seed": 5, "num_workers": num_workers}
    want = expected(ds_path, **kw)
    with Loader(ds_path, 16, transform=CropPipeline(), **kw) as lo:
        with pytest.warns(RuntimeWarning, match="copy=True") as record:
            got = list(lo)
        assert len([w for w in record if "copy=True" in str(w.message)]) == 1
        same(owned(got), want)
        # MAX_LEASED batches stay zero-copy views; the rest were copied out of the ring.
        views = [b for b in got if np.shares_memory(b["image"], lo.ring.array)]
        assert len(views) == MAX_LEASED
        assert lo.ring.leases.copied == len(got) - MAX_LEASED


def test_a_plain_loop_stays_zero_copy_and_never_copies(ds_path):
    with Loader(ds_path, 16, num_workers=2, transform=CropPipeline()) as lo:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _warm in lo:  # a warm-up loop whose variable stays bound: one stray lease
                pass
            for _epoch in range(2):
                for b in lo:
                    image = b["image"]  # a second name for the same batch: the same lease
                    assert np.shares_memory(image, lo.ring.array)
        assert lo.ring.leases.copied == 0


@pytest.mark.filterwarnings("ignore:the consumer holds:RuntimeWarning")
def test_a_slice_keeps_its_batch_alive(ds_path):
    want = expected(ds_path, num_workers=2)
    with Loader(ds_path, 16, num_workers=2, transform=CropPipeline()) as lo:
        it = iter(lo)
        first = next(it)
        kept_images, kept_labels = first["image"][:4], first["label"][2:]
        del first
        for _ in it:
            pass
        assert np.array_equal(kept_images, want[0]["image"][:4])
        assert np.array_equal(kept_labels, want[0]["label"][2:])


@pytest.mark.filterwarnings("ignore:the consumer holds:RuntimeWarning")
def test_a_batch_kept_across_epochs_is_not_reused(ds_path):
    want = expected(ds_path, shuffle=True, num_workers=2)
    with Loader(ds_path, 16, num_workers=2, transform=CropPipeline(), shuffle=True,
                persistent_workers=True) as lo:
        last = None
        for b in lo:
            last = b  # the usual loop: the last batch outlives its epoch
        held = lo.ring.leases.held.copy()
        assert held  # its slot is still leased
        for _ in range(2):  # later epochs must build into other slots
            for _b in lo:
                pass
        assert np.array_equal(last["image"], want[-1]["image"])
        assert np.array_equal(last["label"], want[-1]["label"])
        del last, b, _b
        gc.collect()
        lo.ring.leases.collect()
        assert not held & lo.ring.leases.held


@pytest.mark.filterwarnings("ignore:the consumer holds:RuntimeWarning")
def test_slots_come_back_when_batches_are_freed(ds_path):
    with Loader(ds_path, 16, num_workers=2, transform=CropPipeline()) as lo:
        it = iter(lo)
        kept = [next(it) for _ in range(MAX_LEASED + 1)]
        leases = lo.ring.leases
        assert len(leases.held) == MAX_LEASED  # the last one was copied
        kept.clear()
        leases.collect()
        assert not leases.held
        next(it)
        it.shutdown()


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_batch_held_across_close_stays_readable_and_leaves_nothing(ds_path, start_method):

    want = expected(ds_path, num_workers=2)
    lo = Loader(ds_path, 16, transform=CropPipeline(),
                num_workers=2, start_method=start_method)
    it = iter(lo)
    b = next(it)
    name = lo.ring.name
    lo.close()
    del it
    gc.collect()
    assert np.array_equal(b["image"], want[0]["image"])
    assert np.array_equal(b["label"], want[0]["label"])
    if name is not None:
        assert not os.path.exists(f"/dev/shm/{name}")
    del b
    gc.collect()


def test_copy_true_returns_slots_at_once(ds_path):
    with Loader(ds_path, 16, num_workers=2, transform=CropPipeline(), copy=True) as lo:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = list(lo)
        assert not lo.ring.leases.held
        assert all(not np.shares_memory(b["image"], lo.ring.array) for b in got)


def test_torch_tensors_hold_their_batch(ds_path):
    torch = pytest.importorskip("torch", reason="the torch adapter needs torch")
    from reader.torch_adapter import TorchLoader

    want = expected(ds_path, num_workers=2)
    with Loader(ds_path, 16, num_workers=2, transform=CropPipeline()) as lo:
        with pytest.warns(RuntimeWarning, match="copy=True"):
            kept = [b["label"] for b in TorchLoader(lo)]  # a list of tensors, no copies asked
        assert all(isinstance(t, torch.Tensor) for t in kept)
        got = torch.cat(kept).numpy()
    assert np.array_equal(got, np.concatenate([w["label"] for w in want]))


def test_a_batch_handed_to_a_forked_process_never_changes_under_it(ds_path):
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    got = ctx.Queue()

    def child(images, labels):
        import time as _t

        _t.sleep(0.5)  # the parent reads on meanwhile
        got.put((int(images.astype(np.int64).sum()), labels.tolist()))

    with Loader(ds_path, 16, num_workers=2, transform=CropPipeline(), shuffle=True) as lo:
        with pytest.warns(RuntimeWarning, match="held when a process was forked"):
            for k, b in enumerate(lo):
                if k == 1:
                    want = (int(b["image"].astype(np.int64).sum()), b["label"].tolist())
                    p = ctx.Process(target=child, args=(b["image"], b["label"]))
                    p.start()
            for _ in range(2):  # more epochs: the slots would have been reused by now
                for _b in lo:
                    pass
        p.join(10)
        assert got.get(timeout=5) == want
        assert lo.ring.leases.pinned
