"""The runtime under a Loader: called downward, heard upward, never calling back."""

from __future__ import annotations

import dataclasses
import gc

import pytest
from helpers_reader import CropPipeline, make_dataset

from reader import Loader
from reader.runtime import epoch as epoch_module
from reader.runtime.runtime import Runtime


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("runtime") / "ds", n=64)


class Events:
    def __init__(self) -> None:
        self.batches: list = []
        self.changes: list = []

    def on_batch(self, timing) -> None:
        self.batches.append(timing.batch)

    def on_workers_changed(self, n, change) -> None:
        self.changes.append((n, change.before, change.after, change.reason))


def test_the_runtime_and_its_epochs_hold_no_reference_to_the_loader(ds_path):
    with Loader(ds_path, 16, num_workers=1, transform=CropPipeline()) as lo:
        it = iter(lo)
        next(it)
        assert it.owner is lo  # kept alive by its iterator, as a value: never called
        held = {k: v for k, v in vars(it).items() if k != "owner"}
        for obj in (lo.runtime, *vars(lo.runtime).values(), *held.values()):
            assert not any(r is lo for r in gc.get_referents(obj)), type(obj).__name__
        assert not hasattr(epoch_module, "EpochContext")
        assert isinstance(lo.runtime, Runtime)


def test_listeners_hear_every_batch_and_every_change_of_the_worker_count(ds_path):
    with Loader(ds_path, 16, num_workers=1, transform=CropPipeline(),
                persistent_workers=True) as lo:
        events = Events()
        lo.runtime.listeners.append(events)
        it = iter(lo)
        next(it)
        lo.runtime.resize(2)
        assert lo.num_workers == 2 and lo.runtime.pool.running == 2
        rest = list(it)
        assert len(rest) == 3 and events.batches == [0, 1, 2, 3]
        assert events.changes == [(2, 1, 2, "resized by its caller")]
        assert len(lo.runtime.worker_pids()) == 2


@pytest.mark.parametrize("workers", [0, 1])
def test_a_loop_over_an_unnamed_loader_reads_every_batch(ds_path, workers):
    # Nothing but the iterator refers to the Loader: it must not be closed under the loop.
    n = 0
    for b in Loader(ds_path, 16, num_workers=workers, transform=CropPipeline()):
        gc.collect()
        n += len(b["label"])
    assert n == 64


def test_a_closed_runtime_starts_no_epoch(ds_path):
    lo = Loader(ds_path, 16, num_workers=0, transform=CropPipeline())
    lo.close()
    with pytest.raises(RuntimeError, match="closed"):
        lo.runtime.epoch(0, 0)


def test_the_cursor_is_the_runtimes_and_the_loader_reads_it(ds_path):
    with Loader(ds_path, 16, num_workers=0, transform=CropPipeline()) as lo:
        assert lo.cursor is lo.runtime.cursor
        for _ in zip(range(2), lo, strict=False):
            pass
        assert dataclasses.astuple(lo.runtime.cursor)[:2] == (0, 2)
