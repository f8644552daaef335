"""num_workers="auto": the seed's rule on measured rates, window decisions, live resizing."""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers_reader import CropPipeline, make_dataset

from reader import Loader, autoscale
from reader.autoscale import WindowFigures, decide, seed_rule


def figures(**kw) -> WindowFigures:
    base = dict(workers=2, wait_share=0.0, consumer_s=0.01, busy_s=0.01, busy_workers=1.0,
                cpu_per_busy=1.0, idle_cores=0.0, other_cores=0.0)
    return WindowFigures(**{**base, **kw})


def test_seed_rule_caps_cpu_bound_work_at_the_cores_and_lets_io_bound_work_past_them():
    # A worker needs 40 ms a batch, the consumer 10 ms: 4 workers' worth, x 1.5.
    cpu = figures(busy_s=0.04, consumer_s=0.01, cpu_per_busy=0.95)
    assert seed_rule(cpu, cores=4, hi=8)[0] == 4  # CPU-bound: never more than the cores
    io = figures(busy_s=0.04, consumer_s=0.01, cpu_per_busy=0.1, idle_cores=2.0)
    n, why = seed_rule(io, cores=4, hi=8)
    assert n == 6 and "min(4 cores, 4.0) x 1.5 = 6.0" in why and "waiting on IO" in why
    # Little CPU for the busy time but no idle core: starved by other programs, not IO.
    starved = figures(busy_s=0.04, consumer_s=0.01, cpu_per_busy=0.3, idle_cores=0.1)
    assert seed_rule(starved, cores=4, hi=8)[0] == 4
    slow_consumer = figures(busy_s=0.002, consumer_s=0.02)
    assert seed_rule(slow_consumer, cores=4, hi=8)[0] == 1
    assert seed_rule(figures(busy_s=0.04, consumer_s=0.01, cpu_per_busy=0.1, idle_cores=None),
                     4, hi=3)[0] == 3


@pytest.mark.parametrize(("kw", "change"), [
    # The consumer waits, workers busy, a core idle: one more.
    ({"wait_share": 0.3, "busy_workers": 1.9, "idle_cores": 1.0}, +1),
    # ...but not on a machine with no idle core, nor past the bound.
    ({"wait_share": 0.3, "busy_workers": 1.9, "idle_cores": 0.1}, None),
    ({"wait_share": 0.3, "busy_workers": 3.9, "idle_cores": 1.0, "workers": 4}, None),
    # Waiting while the workers idle is not theirs to fix.
    ({"wait_share": 0.3, "busy_workers": 0.5, "idle_cores": 1.0}, None),
    # Others over-subscribe the cores: one fewer.
    ({"wait_share": 0.3, "busy_workers": 1.9, "other_cores": 1.5}, -1),
    # ...but workers waiting on storage load no core: they are not shed for it.
    ({"wait_share": 0.9, "busy_workers": 2.9, "cpu_per_busy": 0.02, "other_cores": 1.0,
      "idle_cores": 0.9, "workers": 3}, +1),
    # No waiting and one worker fewer would do: one fewer.
    ({"wait_share": 0.0, "busy_workers": 0.3, "workers": 3}, -1),
    ({"wait_share": 0.0, "busy_workers": 1.5, "workers": 2}, None),
    ({"wait_share": 0.0, "busy_workers": 0.1, "workers": 1}, None),  # never below one
])
def test_window_decisions(kw, change):
    out = decide(figures(**kw), cores=2, hi=4)
    assert (out[0] if out else None) == change
    if out:
        assert out[1]  # every change says why


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("auto") / "ds", 480, extra=False)


@pytest.fixture
def short_windows(monkeypatch):
    monkeypatch.setattr(autoscale, "WINDOW_S", 0.3)


def labels_of(lo, consume_s: float = 0.0) -> np.ndarray:
    out = []
    for b in lo:
        out.append(b["label"].copy())
        if consume_s:
            time.sleep(consume_s)
    return np.concatenate(out)


def test_workers_waiting_on_io_grow_past_the_cores_and_batches_do_not_change(ds_path,
                                                                            short_windows,
                                                                            monkeypatch):
    # The machine's CPU unknown, as without /proc: other programs running the tests
    # alongside must not make these workers look starved.
    monkeypatch.setattr(autoscale, "machine_cpu", lambda: None)
    with Loader(ds_path, 8, num_workers=2, shuffle=True, seed=1, transform=CropPipeline()) as lo:
        want = labels_of(lo)
    with Loader(ds_path, 8, shuffle=True, seed=1, transform=CropPipeline(sleep=0.004)) as lo:
        got = labels_of(lo)
        grew = [c for c in lo.worker_changes if c.after > c.before]
        assert grew and max(c.after for c in lo.worker_changes) > autoscale.usable_cores()
        assert "waiting on IO" in lo.worker_changes[0].reason
    assert np.array_equal(got, want)


def test_a_slow_consumer_gets_fewer_workers_and_every_batch(ds_path, short_windows):
    with Loader(ds_path, 8, num_workers=2, transform=CropPipeline()) as lo:
        want = labels_of(lo)
    with Loader(ds_path, 8, transform=CropPipeline(), persistent_workers=True) as lo:
        got = labels_of(lo, consume_s=0.01)
        assert lo.num_workers == 1 and lo.worker_changes[-1].after == 1
        assert lo._pool.running == 1
        again = labels_of(lo)  # the shrunk persistent pool serves the next epoch
    assert np.array_equal(got, want) and np.array_equal(again, want)


def test_fixed_worker_counts_are_never_changed(ds_path, short_windows):
    with Loader(ds_path, 8, num_workers=2, transform=CropPipeline()) as lo:
        labels_of(lo, consume_s=0.005)
        assert lo.worker_changes == [] and lo.num_workers == 2


def test_the_monitor_shows_each_change_and_why(ds_path, short_windows, tmp_path):
    import io
    import json

    from reader.monitor import Monitor

    out = io.StringIO()
    record = tmp_path / "mon.jsonl"
    mon = Monitor(0.2, output=out, record=record)
    with Loader(ds_path, 8, transform=CropPipeline(), monitor=mon) as lo:
        labels_of(lo, consume_s=0.01)
        mon.flush()
        changes = lo.worker_changes
    assert changes
    text = out.getvalue()
    assert f"changed: workers {changes[0].before} -> {changes[0].after}: seed rule" in text
    notes = [n for line in record.read_text().splitlines() for n in json.loads(line)["notes"]]
    assert notes[0].startswith(f"workers {changes[0].before} -> {changes[0].after}")
    assert mon.num_workers == lo.num_workers


def test_epochs_shorter_than_a_window_add_up(ds_path, short_windows, monkeypatch):
    monkeypatch.setattr(autoscale, "WINDOW_S", 1.0)
    with Loader(ds_path, 8, transform=CropPipeline(), persistent_workers=True) as lo:
        for _ in range(6):  # six short iterations, each a fraction of the window
            it = iter(lo)
            for _, _b in zip(range(8), it, strict=False):
                time.sleep(0.03)
            it.shutdown()
        assert lo.worker_changes and "seed rule" in lo.worker_changes[0].reason
