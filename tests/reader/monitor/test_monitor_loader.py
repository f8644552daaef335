"""Monitor end to end: induce each bottleneck in a real Loader and check the diagnosis.

Each case runs a few hundred milliseconds of batches with a short report
interval and judges the last complete interval (so worker start-up, which lands
in the first batch's wait, does not colour it). The inductions use the loader's
public surface: a pipeline object (``output_shape`` + ``run``), a
``ShardDataset`` subclass as the source, and ``prefetch``. They leave the
machine's CPU figures out (``cpu=None``): the test machine is shared, and a
busy neighbour would rightly turn any of them into "other processes"; one case
starts such neighbours on purpose.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from formats import ShardDataset
from reader import Monitor
from reader.monitor.diagnosis import Thresholds
from reader.runtime.proc import ProcCpu
from reader.transforms import CenterCrop
from tests.helpers_reader import CropPipeline, make_dataset

reader = pytest.importorskip("reader")
if not hasattr(reader, "Loader"):
    pytest.skip("reader.Loader not available", allow_module_level=True)


N = 1000


class Recorder(Monitor):
    """A Monitor that also keeps every BatchTiming, to check the figures add up
    (no machine CPU figures unless ``cpu`` is given)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("cpu", None)
        super().__init__(*args, **kwargs)
        self.timings = []

    def on_batch(self, timing) -> None:
        self.timings.append(timing)
        super().on_batch(timing)


class BusyPipeline(CropPipeline):
    """Decode, then burn CPU for ``spin`` seconds per image (a CPU-heavy decode)."""

    def __init__(self, spin: float) -> None:
        super().__init__()
        self.spin = spin

    def run(self, view, out, rng):
        t = time.perf_counter()
        _decode_s, tr = super().run(view, out, rng)
        x = 0
        while time.perf_counter() - t < self.spin:
            x += 1
        return time.perf_counter() - t, tr


class SlowBytes(bytes):
    """Record bytes whose length takes ``DELAY`` s to learn: the worker asks for it
    while paging records in, so the delay lands in the IO stage like slow storage."""

    DELAY = 0.0015

    def __len__(self) -> int:
        time.sleep(self.DELAY)
        return super().__len__()


class SlowStorage(ShardDataset):
    """A dataset whose image payloads come as :class:`SlowBytes`."""

    def payloads(self, indices, field):
        views = super().payloads(indices, field)
        return [SlowBytes(v) for v in views] if field == "image" else views


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    # Large enough that no induced run crosses an epoch: the loader restarts its
    # workers per epoch, and that start-up wait would colour the interval.
    return make_dataset(tmp_path_factory.mktemp("monitor") / "ds", n=N, records_per_shard=250)


def run(loader, monitor, *, batches: int, step: float = 0.0, burst: int = 0) -> None:
    """Consume ``batches`` batches, sleeping ``step`` s after each (after each
    ``burst`` batches, when bursty)."""
    assert batches * loader.batch_size <= N, "stay within one epoch"
    n = 0
    with loader:
        while n < batches:
            for _batch in loader:
                n += 1
                if step and (not burst or n % burst == 0):
                    time.sleep(step)
                if n >= batches:
                    break
    assert monitor.reports >= 2, "the run was too short to judge a complete interval"


def last_interval(monitor: Monitor) -> tuple[str, dict]:
    stats = monitor.stats()
    return stats["diagnosis"]["kind"], stats


def test_slow_consumer_is_healthy(dataset):
    mon = Recorder(0.25, output=False)
    loader = reader.Loader(dataset, 16, num_workers=2, prefetch=4, transform=CropPipeline(),
                           monitor=mon)  # fmt: skip
    # 80 ms a batch against a few ms to build one: a scheduling delay of a loaded
    # machine (tens of ms) stays well under the waiting limit.
    run(loader, mon, batches=30, step=0.08)
    kind, stats = last_interval(mon)
    assert kind == "healthy", stats["diagnosis"]["message"]
    # Below the limit, or within the band that keeps a healthy verdict (a shared
    # machine's hiccup can push one 0.25 s interval just past it).
    th = Thresholds()
    assert stats["current"]["queue_wait_pct"] < th.max_queue_wait_pct * (1 + th.hysteresis)


def test_cpu_heavy_decode_is_cpu_bound(dataset):
    mon = Recorder(0.25, output=False)
    # One worker, so on a 2-core machine the main process keeps a core to dispatch.
    loader = reader.Loader(dataset, 8, num_workers=1, prefetch=4, transform=BusyPipeline(0.002),
                           monitor=mon)  # fmt: skip
    run(loader, mon, batches=40)
    kind, stats = last_interval(mon)
    assert kind == "cpu-bound", stats["diagnosis"]["message"]
    assert "decode" in stats["diagnosis"]["message"]
    assert stats["current"]["decode_share_pct"] > 80


def test_in_process_cpu_heavy_is_cpu_bound(dataset):
    """With no workers the consumer builds each batch inside next(): that is waiting."""
    mon = Recorder(0.25, output=False)
    loader = reader.Loader(dataset, 8, num_workers=0, transform=BusyPipeline(0.002),
                           monitor=mon)  # fmt: skip
    run(loader, mon, batches=40)
    kind, stats = last_interval(mon)
    assert kind == "cpu-bound", stats["diagnosis"]["message"]
    assert "num_workers=0" in stats["diagnosis"]["message"]
    assert stats["current"]["queue_wait_pct"] > 80
    assert {t.worker for t in mon.timings} == {-1}


def spin(image):
    """A user transform that spins for 3 ms per sample (an expensive augmentation)."""
    end = time.perf_counter() + 0.003
    while time.perf_counter() < end:
        pass
    return image


def test_user_callable_time_is_transform_not_decode(dataset):
    """The fused decode + crop stays ``decode``; the callable after it is ``transform``."""
    mon = Recorder(0.25, output=False)
    loader = reader.Loader(dataset, 8, num_workers=1, prefetch=4, transform=[CenterCrop(32), spin],
                           monitor=mon)  # fmt: skip
    run(loader, mon, batches=40)
    kind, stats = last_interval(mon)
    assert all(t.transform_s >= 8 * 0.003 * 0.9 for t in mon.timings)
    # (The first batch's decode also builds the decoder: imports OpenCV.)
    assert all(t.decode_s < t.transform_s for t in mon.timings[1:])
    assert stats["current"]["transform_share_pct"] > 80
    assert kind == "cpu-bound" and stats["diagnosis"]["cause"] == "transform", stats["diagnosis"]
    assert "--max-side" not in stats["diagnosis"]["message"]


def test_other_processes_taking_the_cores_are_named(dataset):
    """Busy programs outside the loader (not its children by multiprocessing) hold every
    core: the verdict names them instead of the loader's own stages."""
    cpu = ProcCpu()
    if cpu() is None:
        pytest.skip("no readable /proc: the machine's CPU figures are not available")
    cores = min(os.cpu_count() or 1, 16)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        time.sleep(0.2)  # let them start
        mon = Recorder(0.25, output=False, cpu=cpu)
        loader = reader.Loader(dataset, 8, num_workers=1, prefetch=4,
                               transform=CropPipeline(sleep=0.001), monitor=mon)  # fmt: skip
        run(loader, mon, batches=80)
        kind, stats = last_interval(mon)
    finally:
        for p in burners:
            p.kill()
        for p in burners:
            p.wait()
    cur = stats["current"]
    assert cur["other_cpu_pct"] > 40 and cur["idle_cpu_pct"] < 10, cur
    assert kind == "cpu-bound" and stats["diagnosis"]["cause"] == "other-processes", stats
    assert "other processes use" in stats["diagnosis"]["message"]


def test_slow_storage_is_io_bound(dataset):
    mon = Recorder(0.25, output=False)
    ds = SlowStorage(dataset)
    loader = reader.Loader(ds, 8, num_workers=2, prefetch=4, transform=CropPipeline(),
                           monitor=mon)  # fmt: skip
    run(loader, mon, batches=60)
    kind, stats = last_interval(mon)
    assert kind == "io-bound", stats["diagnosis"]["message"]
    assert stats["current"]["io_share_pct"] > 60


def test_little_prefetch_with_bursty_consumer_is_sync_bound(dataset):
    mon = Recorder(0.25, output=False)
    loader = reader.Loader(dataset, 8, num_workers=2, prefetch=1,
                           transform=CropPipeline(sleep=0.0005), monitor=mon)  # fmt: skip
    run(loader, mon, batches=48, step=0.04, burst=4)
    kind, stats = last_interval(mon)
    assert kind == "sync-bound", stats["diagnosis"]["message"]
    assert stats["current"]["worker_busy_pct"] < 75
    assert stats["current"]["prefetch_depth"] < 2  # fewer batches in flight than workers
    assert "raise prefetch" in stats["diagnosis"]["message"]


def test_figures_add_up(dataset):
    """Stage times fit in each batch's worker time; bytes and samples match the data."""
    mon = Recorder(60.0, output=False)
    loader = reader.Loader(dataset, 16, num_workers=2, prefetch=2, transform=CropPipeline(),
                           monitor=mon)  # fmt: skip
    with loader:
        seen = sum(len(b["label"]) for b in loader)
    ds = ShardDataset(dataset)
    every = np.arange(len(ds))
    _, _, lengths = ds.spans(every, "image")
    stats = loader.stats()
    mean = stats["mean"]
    assert seen == len(ds) == mean["samples"] == sum(t.records for t in mon.timings)
    # Every field's stored bytes; of them the JPEGs were paged in (read_mb_s).
    assert mean["bytes"] == sum(int(ds.spans(every, f.name)[2].sum()) for f in ds.fields)
    assert sum(t.read_bytes for t in mon.timings) == int(lengths.sum())
    assert {t.worker for t in mon.timings} <= {0, 1}
    for t in mon.timings:
        stages = t.io_s + t.decode_s + t.transform_s + t.assemble_s
        assert 0 <= stages <= t.busy_s + 1e-6, t
        assert t.wait_s >= 0 and t.latency_s >= 0
        assert t.h2d_s is None
    assert mean["h2d_gb_s"] is None
    assert 0 < mean["queue_wait_pct"] <= 100
    shares = sum(mean[f"{s}_share_pct"] for s in ("io", "decode", "transform", "assemble"))
    assert shares <= 100.0 + 1e-6
    assert mean["samples_per_s"] > 0 and mean["mb_per_s"] > 0
    assert stats["diagnosis"]["kind"] in ("healthy", "cpu-bound", "io-bound", "sync-bound")


def test_enable_monitor_reaches_every_loader(dataset, capsys):
    from reader import disable_monitor

    try:
        reader.enable_monitor(interval=0.05)
        loaders = [
            reader.Loader(dataset, 50, num_workers=0, transform=CropPipeline()),
            reader.Loader(dataset, 50, num_workers=0, transform=CropPipeline()),
        ]
    finally:
        disable_monitor()
    assert reader.Loader(dataset, 50, num_workers=0, transform=CropPipeline()).monitor is None
    for loader in loaders:
        assert isinstance(loader.monitor, Monitor)
        with loader:
            for _batch in loader:
                time.sleep(0.01)
        loader.monitor.flush()
        assert loader.stats()["mean"]["samples"] == N
    err = capsys.readouterr().err
    names = {loader.monitor.name for loader in loaders}
    assert len(names) == 2 and all(f"[shardpack monitor {n}]" in err for n in names)
    assert "queue_wait_pct" in err and "diagnosis:" in err


def test_loader_monitor_number(dataset):
    loader = reader.Loader(dataset, 50, num_workers=0, transform=CropPipeline(), monitor=reader.Monitor(7))
    assert isinstance(loader.monitor, Monitor) and loader.monitor.config.interval == 7
    assert reader.Loader(dataset, 50, decode=False, monitor=False).monitor is None
