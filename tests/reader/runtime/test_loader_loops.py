"""Loops over one Loader, as PyTorch users know them: every ``iter()`` starts the current
epoch at its first batch, unless ``load_state_dict()`` was called since the last one;
a loop left early (break, an exception, Ctrl-C) does not move the epoch, and the state
taken then names the next unseen batch."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers_reader import CropPipeline, make_dataset

import reader
from reader import DecodedCacheOptions, Loader
from reader.transforms import CenterCrop, RandomHorizontalFlip

STOP_AT = 3  # batches a stopped loop has delivered


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("loops") / "ds", 120, records_per_shard=40)


class Stop(Exception):
    """The training loop's own error."""


def loader(path, num_workers=2, **kw):
    if kw.get("decode", True):
        kw.setdefault("transform", CropPipeline())
        kw["num_workers"] = num_workers
    return Loader(path, 16, **kw)


def labels(batches) -> list[list[int]]:
    return [b["label"].tolist() for b in batches]


def stop_early(lo, how: str, at: int = STOP_AT) -> list[list[int]]:
    """Loop over ``lo`` and leave it after ``at`` batches, the way ``how`` says."""
    seen = []
    try:
        for b in lo:
            seen.append(b["label"].tolist())
            if len(seen) == at:
                if how == "break":
                    break
                raise {"exception": Stop, "interrupt": KeyboardInterrupt}[how]()
    except (Stop, KeyboardInterrupt):
        pass
    return seen


def one_epoch(path, epoch=0, **kw) -> list[list[int]]:
    with loader(path, **kw) as lo:
        lo.set_epoch(epoch)
        return labels(lo)


ORDERS = [dict(), dict(shuffle="full", seed=3, drop_last=True),
          dict(shuffle="block", seed=5, rank=1, world_size=3)]


@pytest.mark.parametrize("how", ["break", "exception", "interrupt"])
@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_a_new_loop_after_one_left_early_reads_the_whole_epoch(ds_path, how, num_workers):
    want = one_epoch(ds_path, num_workers=num_workers, shuffle="full", seed=1)
    with loader(ds_path, num_workers, shuffle="full", seed=1) as lo:
        assert stop_early(lo, how) == want[:STOP_AT]
        state = lo.state_dict()
        assert (state["epoch"], state["batch"]) == (0, STOP_AT)  # the next unseen batch
        assert lo.epoch == 0
        it = iter(lo)
        assert lo.state_dict()["batch"] == 0  # the state is the new loop's
        assert labels(it) == want
        assert (lo.epoch, lo.position) == (1, 0)
    # The state taken after the loop was left resumes a new Loader at the next unseen batch.
    with loader(ds_path, num_workers, shuffle="full", seed=1) as lo:
        lo.load_state_dict(state)
        assert labels(lo) == want[STOP_AT:]


@pytest.mark.parametrize("order", ORDERS, ids=["plain", "full-droplast", "block-rank1of3"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_orders_ranks_and_drop_last_restart_and_resume_exactly(ds_path, order, num_workers):
    want = [one_epoch(ds_path, e, num_workers=num_workers, **order) for e in (2, 3)]
    with loader(ds_path, num_workers, **order) as lo:
        lo.set_epoch(2)
        seen = stop_early(lo, "break", 2)
        state = lo.state_dict()
        lo.set_epoch(2)  # the usual call at the top of a loop: still from the first batch
        assert labels(lo) == want[0]
        assert labels(lo) == want[1]  # the finished epoch moved to the next one
    assert seen == want[0][:2] and state["batch"] == 2
    with loader(ds_path, num_workers, **order) as lo:
        lo.load_state_dict(state)
        lo.set_epoch(2)  # keeps the loaded position
        assert seen + labels(lo) == want[0]
        assert labels(lo) == want[1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_state_taken_mid_loop_resumes_a_new_loader_exactly(ds_path, num_workers):
    kw = dict(shuffle="full", seed=9)
    want = one_epoch(ds_path, 1, num_workers=num_workers, **kw)
    with loader(ds_path, num_workers, **kw) as lo:
        lo.set_epoch(1)
        first = []
        for b in lo:
            first.append(b["label"].tolist())
            if len(first) == 4:
                state = lo.state_dict()  # taken inside the loop, which goes on
        assert first == want
    assert (state["epoch"], state["batch"]) == (1, 4)
    with loader(ds_path, num_workers, **kw) as lo:
        lo.load_state_dict(state)
        rest = []
        for b in lo:
            rest.append(b["label"].tolist())
            if len(rest) == 2:
                break
        assert lo.state_dict()["batch"] == 6
        # The loaded state served its one loop: a new loop starts the epoch again.
        assert labels(lo) == want
    assert first[:4] + rest == want[:6]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_interrupt_inside_next_leaves_its_batch_unseen(ds_path, num_workers):
    class Interrupting(reader.Monitor):
        """A monitor hook: Ctrl-C arriving while ``next()`` is handing out batch 2."""

        def __init__(self):
            super().__init__(3600.0, output=False, cpu=None)

        def on_batch(self, timing):
            if timing.batch == 2:
                raise KeyboardInterrupt

        def stats(self):
            return {}

    want = one_epoch(ds_path, num_workers=num_workers)
    with loader(ds_path, num_workers, monitor=Interrupting()) as lo:
        seen = []
        with pytest.raises(KeyboardInterrupt):
            for b in lo:
                seen.append(b["label"].tolist())
        state = lo.state_dict()
    assert seen == want[:2] and (state["epoch"], state["batch"]) == (0, 2)
    with loader(ds_path, num_workers) as lo:
        lo.load_state_dict(state)
        assert seen + labels(lo) == want


def test_raw_mode_follows_the_same_rule(ds_path):
    want = one_epoch(ds_path, decode=False, shuffle="full", seed=4)
    with loader(ds_path, decode=False, shuffle="full", seed=4) as lo:
        assert stop_early(lo, "interrupt") == want[:STOP_AT]
        state = lo.state_dict()
        assert labels(lo) == want and lo.epoch == 1
    with loader(ds_path, decode=False, shuffle="full", seed=4) as lo:
        lo.load_state_dict(state)
        assert labels(lo) == want[STOP_AT:]


def test_a_loop_that_took_every_batch_finishes_its_epoch(ds_path):
    want = [one_epoch(ds_path, e, num_workers=1, shuffle=True) for e in (0, 1)]
    with loader(ds_path, 1, shuffle=True) as lo:
        n = len(lo)
        # A fixed number of steps per epoch: the loop never asks for the end of the data.
        assert labels(itertools.islice(lo, n)) == want[0]
        state = lo.state_dict()  # the next unseen batch is the next epoch's first
        assert (lo.epoch, state["epoch"], state["batch"]) == (0, 1, 0)
        assert labels(lo) == want[1]
    for saved in (state, {**state, "epoch": 0, "batch": n}):  # the latter as older versions saved it
        with loader(ds_path, 1, shuffle=True) as lo:
            lo.load_state_dict(saved)
            # The README's loop after a resume: no epoch is read twice.
            assert lo.epoch == 1
            seen = []
            for epoch in range(lo.epoch, 2):
                lo.set_epoch(epoch)
                seen.append(labels(lo))
            assert seen == [want[1]]


def test_set_epoch_between_loops(ds_path):
    want = {e: one_epoch(ds_path, e, num_workers=2, shuffle=True) for e in (0, 5)}
    with loader(ds_path, 2, shuffle=True) as lo:
        stop_early(lo, "break")
        lo.set_epoch(5)
        assert stop_early(lo, "break") == want[5][:STOP_AT]
        lo.set_epoch(5)  # the same epoch: a new loop still starts it at its first batch
        assert labels(lo) == want[5]
        lo.set_epoch(0)
        assert labels(lo) == want[0]
        # load_state_dict, then set_epoch to another epoch: that epoch, from its start.
        lo.load_state_dict({**lo.state_dict(), "epoch": 0, "batch": 4})
        lo.set_epoch(5)
        assert labels(lo) == want[5]


def test_persistent_workers_serve_the_new_loop_whole(ds_path):
    kw = dict(shuffle="full", seed=9, prefetch=6, transform=CropPipeline(sleep=0.001))
    want = [one_epoch(ds_path, e, **kw) for e in (0, 1)]
    with loader(ds_path, persistent_workers=True, **kw) as lo:
        # Batches still queued and being built when the loop is left: drained, not mixed in.
        assert stop_early(lo, "break") == want[0][:STOP_AT]
        pids = [p.pid for p in lo.runtime.pool.processes]
        assert labels(lo) == want[0]
        assert stop_early(lo, "exception", 1) == want[1][:1]
        assert labels(lo) == want[1]
        assert [p.pid for p in lo.runtime.pool.processes] == pids, "workers were restarted"


@pytest.mark.parametrize("how", ["break", "exception", "interrupt"])
def test_the_workers_of_a_loop_left_early_are_gone_once_a_new_one_starts(ds_path, how):
    with loader(ds_path, 2, transform=CropPipeline(sleep=0.002)) as lo:
        it = iter(lo)
        next(it)
        workers = list(it.pool.processes)
        assert workers and all(p.is_alive() for p in workers)
        del it
        stop_early(lo, how, 1)
        second = lo._active().pool.processes if lo._active() is not None else []
        again = iter(lo)
        next(again)
        assert not any(p.is_alive() for p in workers + list(second))
        assert labels(again) and lo.epoch == 1


def test_the_decoded_cache_serves_a_restarted_epoch_the_same(ds_path):
    kw = dict(shuffle=True, seed=2, transform=[CenterCrop(24), RandomHorizontalFlip()])

    def images(batches):
        return [(b["label"].tolist(), b["image"].copy()) for b in batches]

    with loader(ds_path, 2, **kw) as lo:
        want = images(lo)
    with loader(ds_path, 2, decoded_cache=DecodedCacheOptions(max_bytes=1 << 24), **kw) as lo:
        first = []
        for b in lo:
            first.append(b["label"].tolist())
            if len(first) == STOP_AT:
                break
        del b
        got = images(lo)  # partly from the cache the first loop filled
        assert lo.decoded_cache.stats()["records"] == 120
    assert len(got) == len(want)
    for (gl, gi), (wl, wi) in zip(got, want, strict=True):
        assert gl == wl and np.array_equal(gi, wi)


@pytest.mark.parametrize("how", ["break", "interrupt"])
def test_the_gpu_sink_serves_a_restarted_epoch_whole(ds_path, monkeypatch, how):
    import sys

    from tests import (
        fake_cupy,  # numpy standing in for cupy (see tests/reader/runtime/test_device.py)
    )

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    kw = dict(shuffle=True, seed=2, transform=[CenterCrop(24)], num_workers=2)
    want = one_epoch(ds_path, **kw)
    with loader(ds_path, device="cuda", **kw) as lo:
        assert stop_early(lo, how) == want[:STOP_AT]  # labels: device arrays, here numpy
        assert lo.state_dict()["batch"] == STOP_AT
        assert labels(lo) == want and lo.epoch == 1

