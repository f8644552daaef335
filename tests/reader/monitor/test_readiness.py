"""Data readiness: the share of next() calls that found their batch already built.

Synthetic timings check the figure's arithmetic and that it appears wherever the
figures do (table, stats, JSONL); real Loaders check what "ready" means: a batch
finished before next() was called.
"""

from __future__ import annotations

import io
import json
import time

import pytest

import reader
from reader import Monitor
from reader.monitor.report import METRICS
from tests.helpers_monitor import HEALTHY, FakeClock, timing
from tests.helpers_reader import CropPipeline, make_dataset

N = 800


def feed_ready(monitor, clock, flags) -> None:
    """One batch per flag: ready (found waiting) or not."""
    for i, ready in enumerate(flags):
        clock.advance(0.02)
        t = timing(HEALTHY, i, i % 2)
        t.ready = ready
        monitor.on_batch(t)


def test_readiness_is_the_share_of_batches_found_waiting_in_every_output(tmp_path):
    clock, out, path = FakeClock(), io.StringIO(), tmp_path / "run.jsonl"
    mon = Monitor(10.0, output=out, record=path, clock=clock, cpu=None, num_workers=2)
    feed_ready(mon, clock, [True, True, True, False] * 12)  # 36 of 48 ready
    mon.flush()
    feed_ready(mon, clock, [True, False, False, False] * 13)  # 13 of 52
    mon.flush()
    assert mon.reports == 2
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["current"]["data_readiness_pct"] for r in records] == [75.0, 25.0]
    stats = mon.stats()
    assert stats["current"]["data_readiness_pct"] == 25.0
    assert stats["mean"]["data_readiness_pct"] == 49.0
    row = next(line for line in out.getvalue().splitlines()[-25:]
               if line.startswith("data_readiness_pct"))  # fmt: skip
    assert row.split()[1:] == ["25.0", "49.0"]
    assert "data_readiness_pct" in {m.key for m in METRICS}


def test_no_batch_no_readiness():
    mon = Monitor(1.0, output=False, clock=FakeClock(), cpu=None)
    assert mon.stats()["current"]["data_readiness_pct"] is None


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("ready") / "ds", n=N, records_per_shard=200)


class Recorder(Monitor):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, cpu=None, output=False, **kwargs)
        self.timings = []

    def on_batch(self, t) -> None:
        self.timings.append(t)
        super().on_batch(t)


def consume(loader, batches: int, step: float = 0.0) -> None:
    with loader:
        for n, _batch in enumerate(loader, 1):
            if step:
                time.sleep(step)
            if n >= batches:
                break


def test_a_slow_consumer_finds_every_batch_ready(dataset):
    mon = Recorder(0.25)
    loader = reader.Loader(dataset, 16, num_workers=2, prefetch=4, transform=CropPipeline(),
                           monitor=mon)  # fmt: skip
    consume(loader, 25, step=0.05)  # 50 ms a step against a few ms a batch
    # The first batches are requested before the workers have built anything.
    later = mon.timings[5:]
    assert sum(t.ready for t in later) >= 0.9 * len(later), [t.ready for t in mon.timings]
    assert mon.stats()["current"]["data_readiness_pct"] > 80
    # Found waiting: next() only takes the message off the queue.
    assert max(t.wait_s for t in later if t.ready) < 0.05


def test_a_busy_worker_leaves_the_consumer_waiting(dataset):
    mon = Recorder(0.25)
    # One worker spending 3 ms an image, a consumer that does nothing: every batch is
    # requested before it is built.
    loader = reader.Loader(dataset, 8, num_workers=1, prefetch=2,
                           transform=CropPipeline(sleep=0.003), monitor=mon)  # fmt: skip
    consume(loader, 40)
    assert sum(t.ready for t in mon.timings) <= 0.2 * len(mon.timings)
    assert mon.stats()["mean"]["data_readiness_pct"] < 20
    assert all(t.wait_s > 0 for t in mon.timings if not t.ready)


def test_in_process_batches_are_never_ready(dataset):
    mon = Recorder(0.25)
    consume(reader.Loader(dataset, 16, num_workers=0, monitor=mon), 10, step=0.01)
    assert not any(t.ready for t in mon.timings)
    assert mon.stats()["mean"]["data_readiness_pct"] == 0.0
