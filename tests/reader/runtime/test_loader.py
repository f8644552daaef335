"""Loader behaviour: determinism, zero-copy slots, copies, raw mode, resume, options."""

from __future__ import annotations

import time

import numpy as np
import pytest
from helpers_reader import SIDE, CropPipeline, make_dataset

import reader
from reader import Loader
from reader.runtime.sinks import CpuSink
from reader.runtime.slots import PAGE, SlotRing
from reader.runtime.timing import BatchTiming


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("reader") / "ds", 200)


def collect(loader, copy=True):
    out = []
    for b in loader:
        out.append({k: (v.copy() if isinstance(v, np.ndarray) else list(v)) if copy else v
                    for k, v in b.items()})
    return out


def test_open_dataset_random_access(ds_path):
    ds = reader.open_dataset(ds_path)
    assert len(ds) == 200
    rec = ds[7]
    assert rec["label"] == 7 and rec["key"] == "k7" and isinstance(rec["image"], memoryview)
    many = reader.read_many(ds, [3, 150, 7])
    assert many["label"].tolist() == [3, 150, 7]
    assert many["key"] == ["k3", "k150", "k7"]
    assert bytes(many["image"][2]) == bytes(rec["image"])
    assert ds.metadata().num_rows == 200


@pytest.mark.parametrize("shuffle", [False, "block", "full"])
def test_same_batches_for_any_num_workers(ds_path, shuffle):
    runs = []
    for nw in (0, 1, 3):
        with Loader(ds_path, 16, num_workers=nw, shuffle=shuffle, seed=5,
                    transform=CropPipeline()) as lo:
            runs.append(collect(lo))
    for other in runs[1:]:
        assert len(other) == len(runs[0]) == 13
        for a, b in zip(runs[0], other, strict=True):
            assert np.array_equal(a["label"], b["label"])
            assert np.array_equal(a["image"], b["image"])  # the random flips too
            assert a["key"] == b["key"]
    labels = np.concatenate([b["label"] for b in runs[0]])
    assert sorted(labels.tolist()) == list(range(200))
    assert (labels.tolist() == list(range(200))) == (shuffle is False)
    b = runs[0][0]
    assert b["image"].shape == (16, SIDE, SIDE, 3) and b["image"].dtype == np.uint8
    assert b["label"].dtype == np.int64 and b["score"].dtype == np.float64
    assert np.allclose(b["score"], b["label"] / 2)
    assert b["key"] == [f"k{i}" for i in b["label"]]


def test_batches_are_views_of_the_ring_until_next(ds_path):
    with Loader(ds_path, 32, num_workers=2, transform=CropPipeline()) as lo:
        it = iter(lo)
        b = next(it)
        ring = lo.ring
        assert isinstance(ring, SlotRing)
        assert np.shares_memory(b["image"], ring.array)
        assert np.shares_memory(b["label"], ring.array)
        assert ring.address % PAGE == 0 and ring.slot_bytes % PAGE == 0
        for f in ring.layout.fields:
            assert f.offset % PAGE == 0
        offsets = {ring.slot_offset(i) + ring.layout.field("image").offset
                   for i in range(ring.num_slots)}
        assert b["image"].ctypes.data - ring.address in offsets
        next(it)
        it.shutdown()


def test_copy_gives_owned_arrays(ds_path):
    with Loader(ds_path, 32, num_workers=2, transform=CropPipeline(), copy=True) as lo:
        batches = [b for b in lo]  # kept across next(): must stay intact
        for b in batches:
            assert b["image"].flags.owndata and not np.shares_memory(b["image"], lo.ring.array)
        labels = np.concatenate([b["label"] for b in batches])
        assert labels.tolist() == list(range(200))
        first = batches[0]["image"]
    with Loader(ds_path, 32, num_workers=0, transform=CropPipeline()) as lo:
        assert np.array_equal(next(iter(lo))["image"], first)


def test_raw_mode_gives_zero_copy_bytes_without_workers(ds_path):
    ds = reader.open_dataset(ds_path)
    with Loader(ds, 50, decode=False, shuffle="full", seed=1) as lo:
        batches = list(lo)
        assert lo.ring is None
        assert lo.num_workers == 0 and lo.stats()["num_workers"] == 0  # none, not "auto"'s 2
    assert len(batches) == 4
    b = batches[0]
    assert isinstance(b["image"], list) and isinstance(b["image"][0], memoryview)
    for lab, img in zip(b["label"].tolist(), b["image"], strict=True):
        assert bytes(img) == bytes(ds[lab]["image"])
    labels = np.concatenate([b["label"] for b in batches])
    assert sorted(labels.tolist()) == list(range(200))
    with Loader(ds, 50, decode=False, copy=True) as lo:
        assert isinstance(next(iter(lo))["image"][0], bytes)


def test_partial_last_batch_and_drop_last(ds_path):
    with Loader(ds_path, 64, num_workers=2, transform=CropPipeline()) as lo:
        sizes = [len(b["label"]) for b in lo]
    assert sizes == [64, 64, 64, 8]
    with Loader(ds_path, 64, num_workers=2, transform=CropPipeline(), drop_last=True) as lo:
        assert [len(b["label"]) for b in lo] == [64, 64, 64] and len(lo) == 3


def test_resume_mid_epoch_is_exact(ds_path):
    kw = dict(num_workers=2, shuffle="full", seed=9, transform=CropPipeline())
    with Loader(ds_path, 16, **kw) as lo:
        lo.set_epoch(3)
        full = [b["label"].copy() for b in lo]
    with Loader(ds_path, 16, **kw) as lo:
        lo.set_epoch(3)
        first = []
        for b in lo:
            first.append(b["label"].copy())
            if len(first) == 5:
                break
        state = lo.state_dict()
    assert state["epoch"] == 3 and state["batch"] == 5
    with Loader(ds_path, 16, **kw) as lo:
        lo.load_state_dict(state)
        lo.set_epoch(3)  # the usual call at the top of a loop keeps the position
        second = [b["label"].copy() for b in lo]
        assert lo.state_dict()["epoch"] == 4 and lo.state_dict()["batch"] == 0
    both = np.concatenate(first + second)
    assert np.array_equal(both, np.concatenate(full))
    assert len(np.unique(both)) == 200
    with Loader(ds_path, 16, num_workers=0, shuffle="full", seed=10,
                transform=CropPipeline()) as lo, pytest.raises(ValueError, match="seed"):
        lo.load_state_dict(state)


def test_a_state_from_the_numpy_drawn_orders_is_refused_when_shuffled(ds_path):
    old = {"epoch": 0, "batch": 2, "seed": 0, "shuffle": "block", "window": 4096, "rank": 1,
           "world_size": 2, "drop_last": False, "batch_size": 16, "num_records": 200,
           "num_batches": 7, "partition": "contiguous"}
    with Loader(ds_path, 16, num_workers=0, shuffle="block", rank=1, world_size=2,
                transform=CropPipeline()) as lo, pytest.raises(ValueError, match="set_epoch"):
        lo.load_state_dict(old)
    with Loader(ds_path, 16, num_workers=0, rank=1, world_size=2,
                transform=CropPipeline()) as lo:
        # Unshuffled orders did not change: such a state still resumes exactly.
        lo.load_state_dict({k: v for k, v in old.items() if k != "partition"}
                           | {"shuffle": False})
        assert lo.state_dict()["batch"] == 2


def test_epochs_advance_and_differ(ds_path):
    with Loader(ds_path, 50, num_workers=1, shuffle="block", seed=2,
                transform=CropPipeline()) as lo:
        e0 = np.concatenate([b["label"] for b in collect(lo)])
        e1 = np.concatenate([b["label"] for b in collect(lo)])
        assert lo.epoch == 2
    assert sorted(e0.tolist()) == sorted(e1.tolist()) == list(range(200))
    assert not np.array_equal(e0, e1)


def test_ranks_split_the_data(ds_path):
    seen = []
    counts = set()
    for rank in range(3):
        with Loader(ds_path, 16, num_workers=1, rank=rank, world_size=3, shuffle=True,
                    transform=CropPipeline()) as lo:
            got = [b["label"].copy() for b in lo]
            counts.add(len(got))
            seen.append(np.concatenate(got))
    assert len(counts) == 1
    assert set(np.concatenate(seen).tolist()) == set(range(200))


class RecordingMonitor(reader.Monitor):
    """A hook of our own: a Monitor that keeps each batch's timing (no report)."""

    def __init__(self):
        super().__init__(3600.0, output=False, cpu=None)
        self.timings = []

    def on_batch(self, timing):
        self.timings.append(timing)

    def stats(self):
        return {"batches": len(self.timings)}


def test_monitor_hook_gets_one_timing_per_batch(ds_path):
    mon = RecordingMonitor()
    with Loader(ds_path, 32, num_workers=2, transform=CropPipeline(), monitor=mon) as lo:
        n = sum(1 for _ in lo)
        assert lo.stats() == {"batches": n}
    assert [t.batch for t in mon.timings] == list(range(n))
    t = mon.timings[0]
    assert isinstance(t, BatchTiming)
    assert t.records == 32 and t.bytes > 0 and t.worker in (0, 1) and t.h2d_s is None
    assert t.busy_s >= t.io_s + t.decode_s and t.latency_s > 0 and t.next_s >= t.wait_s
    assert sum(x.records for x in mon.timings) == 200
    with Loader(ds_path, 32, num_workers=0, transform=CropPipeline()) as lo:
        assert lo.monitor is None and lo.stats()["num_workers"] == 0


def test_prefetch_auto_stays_within_bounds(ds_path):
    with Loader(ds_path, 8, num_workers=2, transform=CropPipeline(), prefetch="auto") as lo:
        it = iter(lo)
        depths = []
        for _ in it:
            depths.append(it.depth)
        assert all(it.lo_depth <= d <= it.hi_depth for d in depths)
        assert lo.ring.num_slots == it.hi_depth + CpuSink.hold  # the batches a consumer may hold
    with Loader(ds_path, 8, num_workers=2, transform=CropPipeline(), prefetch=3) as lo:
        it = iter(lo)
        next(it)
        assert it.depth == 3 and lo.ring.num_slots == 3 + CpuSink.hold
        it.shutdown()


def test_options_and_errors(ds_path):
    # No transform: whole images, each of its own size, padded to the batch's largest.
    with Loader(ds_path, 8, num_workers=0) as lo:
        b = next(iter(lo))
        sizes = b["image_size"]
        assert b["image"].shape == (8, sizes[:, 0].max(), sizes[:, 1].max(), 3)
    with pytest.raises(ValueError, match="no field"):
        Loader(ds_path, 8, decode=False, fields=("nope",))
    with pytest.raises(ValueError, match="num_workers"):
        Loader(ds_path, 8, num_workers=-1, transform=CropPipeline())
    with Loader(ds_path, 8, transform=CropPipeline(), fields=("image", "label")) as lo:
        assert set(next(iter(lo))) == {"image", "label"}
    assert reader.options.resolve_num_workers("auto") >= 1


def test_batch_size_has_one_meaning_per_spelling(ds_path):
    from reader.batching import AspectRatioBatches, BudgetBatches

    kw = dict(num_workers=0, transform=CropPipeline())
    with Loader(ds_path, **kw) as lo:  # left out: 256
        assert lo.batch_size == 256 and [len(b["label"]) for b in lo] == [200]
        assert type(lo.state_dict()["batch_size"]) is int
    with Loader(ds_path, None, **kw) as lo:  # None is "left out": 256, no sentinel types
        assert lo.batch_size == 256
    budget = BudgetBatches(40 * 48 * 10, size="pixels")
    with Loader(ds_path, batch_sampler=budget, **kw) as lo:  # left out: the budget's size
        assert lo.batch_size == 10
    with pytest.raises(ValueError, match=r"batch_size=256 with BudgetBatches.*leave the Loader's"):
        Loader(ds_path, 256, batch_sampler=budget, **kw)  # given, even as 256: not left out
    with Loader(ds_path, 16, batch_sampler=AspectRatioBatches(), **kw) as lo:
        assert lo.batch_size == 16
    with Loader(ds_path, batch_sampler=AspectRatioBatches(), **kw) as lo:
        assert lo.batch_size == 256  # the Loader's, left out
    # One way to size a batch of records: the Loader's keyword, never the sampler's.
    with pytest.raises(ValueError, match=r"Loader\(path, 16, batch_sampler=AspectRatioBatches\(\)\)"):
        AspectRatioBatches(batch_size=16)
    assert type(reader.loader.DEFAULT_BATCH_SIZE) is int


@pytest.mark.parametrize(("kw", "error", "words"), [
    ({"batch_size": "32"}, TypeError, "batch_size must be an int >= 1, not str '32'"),
    ({"batch_size": True}, TypeError, "not bool True"),
    ({"batch_size": 0}, ValueError, "batch_size must be an int >= 1, not 0"),
    ({"image_field": "img"}, ValueError, "image_field: no field 'img'.*did you mean 'image'"),
    ({"fields": ("lable",)}, ValueError, "fields: no field 'lable'.*did you mean 'label'"),
    ({"fields": "label"}, TypeError, r"one field: fields=\('label',\)"),
    ({"shuffle_window": 0}, ValueError, "shuffle_window must be an int >= 1, not 0"),
    ({"shuffle_window": 64}, ValueError, "shuffle_window=64 would have no effect"),
    ({"shuffle": True, "shuffle_window": 64}, ValueError, "and shuffle='full'"),
    ({"decode": False, "transform": None, "max_ring_bytes": 1 << 20}, ValueError,
     "max_ring_bytes would have no effect: decode=False"),
    ({"decode": False, "transform": None, "image_field": "image"}, ValueError,
     "image_field would have no effect: decode=False"),
    ({"num_workers": 0, "max_prefetch": 8}, ValueError, "max_prefetch would have no effect"),
    ({"prefetch": 8, "max_prefetch": 2}, ValueError, "prefetch=8 is more than max_prefetch=2"),
    ({"fields": ("label",), "image_field": "image"}, ValueError,
     r"image_field='image' is not among fields=\('label',\)"),
    ({"max_prefetch": 0}, ValueError, "max_prefetch must be an int >= 1"),
    ({"max_ring_bytes": "2G"}, TypeError, "max_ring_bytes must be an int"),
    ({"start_method": "thread"}, ValueError, "start_method must be one of"),
    ({"shuffle": "yes"}, ValueError, "shuffle"),
    ({"timeout": "5"}, TypeError, "timeout"),
    ({"device": "gpu"}, ValueError, "device must be 'cpu' or 'cuda'"),
    ({"device_options": object()}, ValueError, "device_options apply to device='cuda' only"),
    ({"decode": False, "transform": None, "num_workers": 4, "timeout": 5.0}, ValueError,
     "num_workers, timeout would have no effect: decode=False reads raw bytes"),
    ({"num_workers": 0, "persistent_workers": True}, ValueError,
     "persistent_workers would have no effect: num_workers=0 builds each batch"),
    ({"monitor": 5}, TypeError, r"for a report every 5 s, pass monitor=reader.Monitor\(5\)"),
    ({"monitor": print}, TypeError, "monitor must be a reader.Monitor, True, None or False"),
    # One way per option: the option groups of old are no Loader arguments.
    ({"decode_options": None}, TypeError, "unexpected keyword argument 'decode_options'"),
    ({"worker_options": None}, TypeError, "unexpected keyword argument 'worker_options'"),
])
def test_every_loader_argument_is_checked_naming_it(ds_path, kw, error, words):
    kw = {"batch_size": 8, **kw}
    kw.setdefault("transform", CropPipeline())
    with pytest.raises(error, match=words):
        Loader(ds_path, **kw)


def test_a_ring_bound_below_one_batch_is_refused_at_the_first_loop(ds_path):
    lo = Loader(ds_path, 8, num_workers=1, transform=CropPipeline(), max_ring_bytes=1000)
    with lo, pytest.raises(ValueError, match=r"max_ring_bytes=1,000 cannot hold one batch in "
                                             r"flight and the \d+ the consumer may hold"):
        next(iter(lo))


def test_spawn_start_method_uses_a_named_ring(ds_path):
    with Loader(ds_path, 50, transform=CropPipeline(),
                num_workers=1, start_method="spawn") as lo:
        labels = np.concatenate([b["label"].copy() for b in lo])
        assert lo.ring.backend == "shm" and lo.ring.name.startswith("shardpack_")
        name = lo.ring.name
    assert labels.tolist() == list(range(200))
    import os

    assert not os.path.exists(f"/dev/shm/{name}")


def test_real_decode_pipeline_specs(ds_path):
    from reader.transforms import CenterCrop, RandomHorizontalFlip, RandomResizedCrop

    runs = []
    for nw in (0, 2):
        with Loader(ds_path, 16, num_workers=nw, shuffle=True, seed=1,
                    transform=[RandomResizedCrop(24, scale=(0.3, 1.0)),
                               RandomHorizontalFlip()]) as lo:
            runs.append(collect(lo))
    assert runs[0][0]["image"].shape == (16, 24, 24, 3)
    for a, b in zip(*runs, strict=True):
        assert np.array_equal(a["image"], b["image"]) and np.array_equal(a["label"], b["label"])
    with Loader(ds_path, 16, num_workers=1, transform=CenterCrop(20)) as lo:
        b = next(iter(lo))
        assert b["image"].shape == (16, 20, 20, 3) and b["image"].any()
        # Exactly the center of the decoded image.
        from reader.transforms.decode import decode_full

        full = decode_full(reader.open_dataset(ds_path)[0]["image"])
        assert np.array_equal(b["image"][0], full[10:30, 14:34])


def test_user_callable_error_in_real_pipeline(ds_path):
    from reader.transforms import CenterCrop

    def bad(img):
        if img[-1, 0, 0] == (3 * 37) % 256:
            raise KeyError("bad user code")
        return img

    with Loader(ds_path, 16, num_workers=2, transform=[CenterCrop(20), bad]) as lo, \
            pytest.raises(reader.WorkerError, match=r"record 3.*KeyError"):
        for _ in lo:
            pass


def test_latency_ends_when_the_worker_finishes_not_when_the_consumer_reads(ds_path):
    """A slow consumer leaves finished batches in the done queue; that is not latency."""
    mon = RecordingMonitor()
    step = 0.05
    with Loader(ds_path, 8, num_workers=2, prefetch=4, transform=CropPipeline(),
                monitor=mon) as lo:
        for i, _ in enumerate(lo):
            time.sleep(step)
            if i == 8:
                break
    later = mon.timings[2:]  # past worker start-up
    assert len(later) == 7
    # Before the fix each of these read ~3 consumer steps (150 ms) of queueing.
    assert np.median([t.latency_s for t in later]) < step / 2, [t.latency_s for t in later]
    for t in mon.timings:
        # The build is part of the latency: the worker's clock is comparable to ours.
        assert t.busy_s - 1e-4 <= t.latency_s <= t.next_s + 3 * step


def test_in_process_wait_is_the_build_time(ds_path):
    mon = RecordingMonitor()
    with Loader(ds_path, 8, num_workers=0, transform=CropPipeline(sleep=0.002),
                monitor=mon) as lo:
        for i, _ in enumerate(lo):
            if i == 4:
                break
    for t in mon.timings:
        assert t.worker == -1 and t.busy_s >= 8 * 0.002
        assert t.busy_s <= t.wait_s <= t.next_s
        assert t.busy_s <= t.latency_s <= t.next_s


def test_raw_mode_timing_counts_every_field_s_bytes(ds_path):
    mon = RecordingMonitor()
    ds = reader.open_dataset(ds_path)
    with Loader(ds, 50, decode=False, monitor=mon) as lo:
        batches = list(lo)
    every = np.arange(200)
    # Every field's stored bytes (the image, label, score and key).
    assert sum(t.bytes for t in mon.timings) == sum(int(ds.spans(every, f.name)[2].sum())
                                                    for f in ds.fields)
    assert all(t.read_bytes == 0 for t in mon.timings)  # views: read when touched
    assert [t.records for t in mon.timings] == [len(b["label"]) for b in batches]
    assert all(t.wait_s == t.busy_s > 0 for t in mon.timings)


def _pids(lo):
    return [p.pid for p in lo.runtime.pool.processes]


def test_persistent_workers_are_reused_and_give_the_same_batches(ds_path):
    kw = dict(num_workers=2, shuffle="full", seed=4, transform=CropPipeline())
    with Loader(ds_path, 16, **kw) as lo:
        want = [collect(lo) for _ in range(2)]
        assert lo.runtime.pool is None
    with Loader(ds_path, 16, persistent_workers=True, **kw) as lo:
        got = [collect(lo)]
        pids = _pids(lo)
        assert len(pids) == 2
        got.append(collect(lo))
        assert _pids(lo) == pids, "workers were restarted between epochs"
        pool = lo.runtime.pool
    assert pool.processes == [] and pool.stopped
    for we, ge in zip(want, got, strict=True):
        for a, b in zip(we, ge, strict=True):
            assert np.array_equal(a["label"], b["label"]) and np.array_equal(a["image"], b["image"])


def test_persistent_workers_after_break_serve_the_next_loop_exactly(ds_path):
    kw = dict(num_workers=2, prefetch=6, shuffle="full", seed=9, transform=CropPipeline(sleep=0.001))
    with Loader(ds_path, 8, **kw) as lo:
        full = [np.concatenate([b["label"] for b in collect(lo)]) for _ in range(2)]
    with Loader(ds_path, 8, persistent_workers=True, **kw) as lo:
        first = []
        for b in lo:
            first.append(b["label"].copy())
            if len(first) == 3:
                break  # batches still queued and being built: drained, not mixed in
        del b  # else it holds its batch (a lease) through the next loop
        pids = _pids(lo)
        rest = [b["label"].copy() for b in lo]
        assert _pids(lo) == pids
        state = lo.state_dict()
        second = np.concatenate([b["label"] for b in collect(lo)])
    assert state == {**state, "epoch": 1, "batch": 0}
    assert np.array_equal(np.concatenate(first), full[0][:24])
    assert np.array_equal(np.concatenate(rest), full[0])  # a new loop: the epoch from its start
    assert np.array_equal(second, full[1])


def test_persistent_worker_dead_between_epochs_is_replaced(ds_path):
    import os
    import signal

    with Loader(ds_path, 16, num_workers=2, transform=CropPipeline(),
                persistent_workers=True) as lo:
        n = len(collect(lo))
        victim = lo.runtime.pool.processes[0]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(5)
        assert len(collect(lo)) == n
        assert victim.pid not in _pids(lo) and len(_pids(lo)) == 2


def test_a_shard_cache_for_a_local_dataset_is_refused(ds_path, tmp_path):
    with pytest.raises(ValueError, match="object storage"):
        Loader(ds_path, 8, decode=False, cache=reader.CacheOptions(folder=tmp_path))


@pytest.mark.parametrize("decode", [True, False])
def test_an_iterator_replaced_mid_epoch_says_so_instead_of_ending_quietly(ds_path, decode):
    kw = {"transform": CropPipeline(), "num_workers": 2} if decode else {"decode": False}
    with Loader(ds_path, 8, **kw) as lo:
        with pytest.raises(RuntimeError, match="one iterator at a time"):
            list(zip(lo, lo, strict=False))
        with pytest.raises(RuntimeError, match="one iterator at a time"):
            for _b in lo:
                next(iter(lo))  # "log a sample": a second stream over the same Loader
        it = iter(lo)
        next(it)
        lo.set_epoch(lo.epoch + 1)
        with pytest.raises(RuntimeError, match=r"set_epoch\(\d+\) moved this Loader"):
            next(it)
        done = iter(lo)
        for _ in done:
            pass
        iter(lo)  # an iterator that ended its epoch stays ended
        with pytest.raises(StopIteration):
            next(done)
