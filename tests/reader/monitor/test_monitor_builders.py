"""What the monitor says about who builds a batch and what it carries, end to end.

Every kind of dataset (text, raw bytes, token arrays, images) counts the stored bytes
of every field a batch carries (``mb_per_s``), and ``read_mb_s`` only the bytes a
builder paged in (none where fields are served as views). Batches built in the main
process (``num_workers=0``, raw mode) are shown as the main process's, with the
worker count that actually builds, and advice that applies.
"""

from __future__ import annotations

import numpy as np
import pytest

import reader
from formats import DatasetWriter, Field, ShardDataset
from reader import Monitor
from reader.monitor.report import format_table
from tests.helpers_reader import CropPipeline, make_dataset

N = 96


class Recorder(Monitor):
    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("cpu", None)
        kwargs.setdefault("output", False)
        super().__init__(*args, **kwargs)
        self.timings = []

    def on_batch(self, timing) -> None:
        self.timings.append(timing)
        super().on_batch(timing)


def _write(root, fields, make):
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=40, durable=False) as w:
        for i in range(N):
            w.write(make(i))
    return root


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    base = tmp_path_factory.mktemp("kinds")
    rng = np.random.default_rng(5)
    return {
        # What `pack-dataset` makes of a folder of text files: txt and key, both str.
        "text": _write(base / "text", [Field("txt", "str"), Field("key", "str")],
                       lambda i: {"txt": f"line {i} " * (200 + 37 * i), "key": f"f{i}.txt"}),
        "bytes": _write(base / "bytes", [Field("raw", "bytes"), Field("label", "int")],
                        lambda i: {"raw": rng.bytes(1000 + 13 * i), "label": i}),
        "tokens": _write(base / "tokens", [Field("ids", "ndarray", dtype="int32", shape=(None,))],
                         lambda i: {"ids": np.arange(50 + i, dtype=np.int32)}),
        "images": make_dataset(base / "images", n=N, records_per_shard=40),
    }


def _stored(path) -> int:
    """Every field's stored bytes over the whole dataset, from the index."""
    ds = ShardDataset(path)
    every = np.arange(len(ds))
    return sum(int(ds.spans(every, f.name)[2].sum()) for f in ds.fields)


MODES = {"workers": {"num_workers": 2}, "in-process": {"num_workers": 0},
         "raw": {"decode": False}}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", ["text", "bytes", "tokens", "images"])
def test_every_field_s_stored_bytes_are_counted(datasets, kind, mode):
    """mb_per_s counts what the batches carry, whatever the fields (the trial: a text
    dataset showed mb_per_s 0.0 at 7453 samples/s of 60 KB files)."""
    kwargs = dict(MODES[mode])
    if kind == "images" and mode != "raw":
        kwargs["transform"] = CropPipeline()
    mon = Recorder(60.0)
    with reader.Loader(datasets[kind], 16, monitor=mon, **kwargs) as loader:
        for _batch in loader:
            pass
    mean = mon.stats()["mean"]
    assert mean["samples"] == N
    assert mean["bytes"] == _stored(datasets[kind]), (kind, mode)
    assert mean["mb_per_s"] > 0
    read = sum(t.read_bytes for t in mon.timings)
    if kind == "images" and mode != "raw":
        # The builder paged the JPEGs in (io_s): read_mb_s is their bytes over that time.
        ds = ShardDataset(datasets[kind])
        assert read == int(ds.spans(np.arange(N), "image")[2].sum())
        assert mean["read_mb_s"] is not None and mean["read_mb_s"] > 0
    else:
        # Served as views over the shards: read when the consumer touches them.
        assert read == 0 and mean["read_mb_s"] is None


def _run_for(loader, seconds: float) -> None:
    import time

    end = time.monotonic() + seconds
    with loader:
        epoch = 0
        while time.monotonic() < end:
            loader.set_epoch(epoch)
            for _batch in loader:
                pass
            epoch += 1


@pytest.mark.parametrize("mode", ["raw", "in-process"])
def test_batches_built_in_the_main_process_are_shown_as_its(datasets, mode):
    """The trial: Loader(decode=False) showed `workers 2`, a row `w-1 96` and the advice
    "raise prefetch so workers run ahead", for a loader with no workers at all."""
    kwargs = dict(MODES[mode])
    if mode == "in-process":
        kwargs["transform"] = CropPipeline()
    mon = Recorder(0.1)
    _run_for(reader.Loader(datasets["images"], 16, monitor=mon, **kwargs), 0.5)
    assert mon.reports >= 2
    stats = mon.stats()
    cur = stats["current"]
    assert cur["num_workers"] == 0 and stats["mean"]["num_workers"] == 0
    assert set(cur["per_worker"]) == {"main"}
    table = format_table(stats)
    assert "workers 0 (the main process builds the batches" in table
    assert "worker_busy_pct by builder: main " in table and "w-1" not in table
    d = stats["diagnosis"]
    assert "prefetch" not in d["message"] and "worker(s)" not in d["message"], d
    # Nothing but next() in the loop: the consumer waits for each build.
    assert d["kind"] == "cpu-bound" and "in the main process" in d["message"], d
    if mode == "raw":
        assert d["cause"] == "assemble" and "decode=False always reads" in d["message"]
    else:
        assert d["cause"] == "decode" and "num_workers > 0" in d["message"]


def test_in_process_advice_never_names_prefetch_or_workers_it_lacks():
    """A main process building half the time with nothing in flight: not "raise prefetch"
    (there is nothing to prefetch with), whatever the figures."""
    from reader.monitor.diagnosis import diagnose

    figures = {"batches": 50, "num_workers": 0, "queue_wait_pct": 48.0,
               "worker_busy_pct": 48.0, "prefetch_depth": 0.0, "assemble_share_pct": 100.0}
    d = diagnose(figures)
    assert d.kind == "cpu-bound" and d.cause == "assemble", d
    assert "prefetch" not in d.message and "fields=" in d.message
    d = diagnose({**figures, "assemble_share_pct": 10.0, "decode_share_pct": 85.0})
    assert d.cause == "decode" and "num_workers > 0" in d.message and "--max-side" in d.message


def test_cpu_split_of_a_real_run_sums_to_100_in_every_interval(datasets):
    """The trial's run: text, 2 workers restarted every epoch (each reaped into this
    process's children's time), short intervals: it read 105, 104, 133 % before."""
    from reader.monitor.monitor import PROC_CPU

    if PROC_CPU() is None:
        pytest.skip("no readable /proc: the machine's CPU figures are not available")
    records = []
    mon = Recorder(0.05, cpu=PROC_CPU, sinks=[records.append])
    _run_for(reader.Loader(datasets["text"], 16, num_workers=2, monitor=mon), 0.6)
    mon.flush()  # a last, short interval too
    split = [[r["current"][k] for k in ("loader_cpu_pct", "other_cpu_pct", "idle_cpu_pct")]
             for r in records]
    assert len(split) >= 5
    for parts in split:
        assert sum(parts) == pytest.approx(100.0), split
        assert all(0 <= p <= 100 for p in parts), split


def test_workers_started_every_epoch_are_named_as_the_wait(datasets):
    """The trial's text run: 7 batches an epoch, two workers started for each, workers
    0.08 % busy, and the verdict blamed a slow main process ("fewer workers"). The
    wait is for each epoch's first batch: the workers' start-up."""
    mon = Recorder(0.1)
    _run_for(reader.Loader(datasets["text"], 16, num_workers=2, monitor=mon), 0.6)
    stats = mon.stats()
    mean = stats["mean"]
    assert mean["epochs_started"] >= 3
    assert mean["first_batch_wait_pct"] >= 0.5 * mean["queue_wait_pct"], mean
    d = stats["diagnosis"]
    assert d["kind"] == "sync-bound" and d["cause"] == "startup", d
    assert "persistent_workers=True" in d["message"]


def test_first_batch_wait_counts_each_epoch_s_first_delivery():
    from dataclasses import replace

    from tests.helpers_monitor import HEALTHY, FakeClock, timing

    clock = FakeClock()
    mon = Monitor(10.0, clock=clock, output=False, num_workers=2, cpu=None)
    for epoch in range(3):
        for k in range(5):
            wait = 0.2 if k == 0 else 0.0  # the workers start: 200 ms for batch 0
            clock.advance(0.02 + wait)
            mon.on_batch(replace(timing(HEALTHY, k, k % 2), epoch=epoch, wait_s=wait,
                                 next_s=wait))
    mean = mon.stats()["mean"]
    assert mean["epochs_started"] == 3
    # Wall time runs from the first next() call: the first step is before it.
    assert mean["first_batch_wait_pct"] == pytest.approx(100 * 0.6 / (14 * 0.02 + 0.6))
    assert mean["first_batch_wait_pct"] == pytest.approx(mean["queue_wait_pct"])
    d = mon.diagnosis()
    assert d.cause == "startup" and "3 epoch(s)" in d.message, d
