"""Failure handling: dead workers, user errors, corrupt data, and releasing everything."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from helpers_reader import CropPipeline, make_dataset

from formats.errors import CorruptRecordError
from reader import Loader, WorkerDiedError, WorkerError
from reader.runtime.slots import SlotLayout, SlotRing, reclaim_stale_segments
from tests.helpers_paths import TESTS


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("fail") / "ds", 120, extra=False)


@pytest.fixture(scope="module")
def corrupt_path(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("bad") / "ds", 60, records_per_shard=20,
                        corrupt=(27, 41), extra=False)


def children() -> set[int]:
    me = str(os.getpid())
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me and b"resource_tracker" not in _cmdline(d):
                out.add(int(d.name))
    return out


def _cmdline(d: Path) -> bytes:
    try:
        return (d / "cmdline").read_bytes()
    except OSError:
        return b""


# What this process can leave in /dev/shm: our named rings, multiprocessing's
# semaphores and default-named segments. Other names belong to other programs
# (e.g. a benchmark of MosaicML Streaming running alongside) and are not ours to judge.
OUR_SHM = ("shardpack_", "sem.mp-", "psm_")


def shm_names() -> set[str]:
    d = Path("/dev/shm")
    return {p.name for p in d.iterdir() if p.name.startswith(OUR_SHM)} if d.is_dir() else set()


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves a child process or a /dev/shm entry behind."""
    before_c, before_s = children(), shm_names()
    yield
    gc.collect()
    deadline = time.monotonic() + 5
    while children() - before_c and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children() - before_c == set(), "worker processes left behind"
    assert {n for n in shm_names() - before_s if not _foreign(n)} == set(), \
        "shared memory left behind"


def _foreign(name: str) -> bool:
    """Whether a /dev/shm entry that appeared during a test belongs to another program
    running alongside (another test run on the same machine): a ring named after a
    process other than this one, or an entry that a live process outside this one maps
    (ours are gone once the Loader is; a leaked one is mapped by nobody)."""
    if name.startswith("shardpack_"):
        owner = name.split("_")[1]
        return owner.isdigit() and int(owner) != os.getpid()
    me = os.getpid()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        if int(maps.parent.name) == me:
            continue
        try:
            if f"/dev/shm/{name}" in maps.read_text():
                return True
        except OSError:
            continue  # a process that ended, or one we may not read
    return False


persistent = pytest.mark.parametrize("persistent", [False, True],
                                     ids=["per-epoch", "persistent"])


def loader(path, **kw):
    kw.setdefault("num_workers", 2)
    kw.setdefault("transform", CropPipeline())
    return Loader(path, 8, **kw)


@persistent
def test_sigkilled_worker_raises_quickly_naming_it(ds_path, no_leaks, persistent):
    lo = loader(ds_path, transform=CropPipeline(sleep=0.01), persistent_workers=persistent)
    it = iter(lo)
    next(it)
    victim = it.workers[1]
    os.kill(victim.pid, signal.SIGKILL)
    t = time.monotonic()
    with pytest.raises(WorkerDiedError, match=rf"worker 1 \(pid {victim.pid}\).*SIGKILL"):
        for _ in it:
            pass
    assert time.monotonic() - t < 5
    assert not it.workers and lo.runtime.pool is None
    if persistent:  # the next loop (the epoch from its first batch) starts fresh workers
        assert sum(1 for _ in lo) == 15 and lo.runtime.pool.alive()
        lo.close()
    del it, lo


@persistent
def test_user_transform_error_names_record_with_traceback(ds_path, no_leaks, persistent):
    lo = loader(ds_path, transform=CropPipeline(fail_on=37), shuffle=True,
                persistent_workers=persistent)
    with pytest.raises(WorkerError) as info:
        for _ in lo:
            pass
    err = info.value
    assert err.record == 37 and err.exc_type == "ZeroDivisionError"
    assert "record 37" in str(err) and "user transform failed on label 37" in str(err)
    assert "Traceback" in err.traceback and "helpers_reader.py" in err.traceback
    assert isinstance(err.__cause__, ZeroDivisionError)
    assert lo.runtime.pool is None
    del info, err, lo


def test_user_error_in_process_names_record(ds_path):
    with loader(ds_path, num_workers=0, transform=CropPipeline(fail_on=5)) as lo, \
            pytest.raises(WorkerError, match="record 5"):
        for _ in lo:
            pass


def test_corrupt_image_fails_naming_shard_and_record(corrupt_path, no_leaks):
    lo = loader(corrupt_path)
    with pytest.raises(CorruptRecordError) as info:
        for _ in lo:
            pass
    err = info.value
    assert err.path.endswith("shard-00001.rec") or "shard-00001" in err.path
    assert err.record == 7 and "dataset record 27" in str(err) and "on_error='skip'" in str(err)
    assert any("worker" in n for n in err.__notes__)
    del info, err, lo


def test_corrupt_image_skipped_with_valid_mask(corrupt_path, no_leaks):
    lo = loader(corrupt_path, on_error="skip", copy=True)
    batches = list(lo)
    valid = np.concatenate([b["valid"] for b in batches])
    labels = np.concatenate([b["label"] for b in batches])
    images = np.concatenate([b["image"] for b in batches])
    assert sorted(labels[~valid].tolist()) == [27, 41]
    assert lo.skipped == 2
    assert not images[~valid].any(), "a skipped sample must not leave garbage"
    assert images[valid].reshape(int(valid.sum()), -1).any(axis=1).all()
    lo.close()


@persistent
def test_break_releases_workers(ds_path, no_leaks, persistent):
    lo = loader(ds_path, persistent_workers=persistent)
    for i, _ in enumerate(lo):
        if i == 2:
            break
    gc.collect()
    assert lo.position == 3
    assert (lo.runtime.pool is not None and lo.runtime.pool.alive()) == persistent
    lo.close()


@persistent
def test_exception_in_training_loop_releases_workers(ds_path, no_leaks, persistent):
    lo = loader(ds_path, persistent_workers=persistent)
    with pytest.raises(RuntimeError, match="training bug"):
        for _ in lo:
            raise RuntimeError("training bug")
    del lo


@persistent
def test_keyboard_interrupt_while_waiting_releases_workers(ds_path, no_leaks, persistent):
    lo = loader(ds_path, transform=CropPipeline(sleep=0.05), persistent_workers=persistent)
    it = iter(lo)
    next(it)
    # Deliver SIGINT to ourselves while next() waits on the workers.
    timer = __import__("threading").Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        for _ in it:
            pass
    timer.join()
    assert it.closed and not it.workers and lo.runtime.pool is None
    del it, lo


@persistent
def test_garbage_collected_loader_releases_everything(ds_path, no_leaks, persistent):
    lo = loader(ds_path, persistent_workers=persistent)
    it = iter(lo)
    next(it)
    assert len(it.workers) == 2
    del it, lo
    gc.collect()


def test_named_ring_released_and_stale_segments_reclaimed(no_leaks):
    layout = SlotLayout.build([("x", np.uint8, (4, 8)), ("y", np.int64, (4,))])
    ring = SlotRing(layout, 3, backend="shm")
    assert (Path("/dev/shm") / ring.name).exists()
    ring.slot_view(2)["y"][:] = 7
    ring.close()
    assert not (Path("/dev/shm") / ring.name).exists()
    # A segment whose owner died (a pid that is not running) is reclaimed.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = Path("/dev/shm") / f"shardpack_{int(dead.stdout)}_0"
    stale.write_bytes(b"x" * 4096)
    assert stale.name in reclaim_stale_segments()
    assert not stale.exists()


def test_loader_after_sigkilled_loader_starts_normally(ds_path, no_leaks):
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(TESTS)!r})
        from reader import Loader
        from helpers_reader import CropPipeline
        for method in ("fork", "spawn"):
            lo = Loader({str(ds_path)!r}, 8, transform=CropPipeline(),
                        num_workers=1, start_method=method)
            it = iter(lo); next(it)
            print(method, lo.ring.name, it.workers[0].pid, flush=True)
            if method == "fork":
                fork_it = it
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    lines = [proc.stdout.readline().split() for _ in range(2)]
    names = [ln[1] for ln in lines]
    worker_pids = [int(ln[2]) for ln in lines]
    assert names[0] == "None" and names[1].startswith("shardpack_")
    assert (Path("/dev/shm") / names[1]).exists()
    proc.kill()
    proc.wait()
    # Orphaned workers notice their parent died and exit by themselves.
    deadline = time.monotonic() + 5
    while any(Path(f"/proc/{p}").exists() and "Z" not in _state(p) for p in worker_pids):
        assert time.monotonic() < deadline, "workers outlived their parent"
        time.sleep(0.1)
    with loader(ds_path) as lo:
        assert sum(1 for _ in lo) == 15
    # The spawn-mode segment of the killed loader is reclaimed by the next named ring.
    SlotRing(SlotLayout.build([("x", np.uint8, (1,))]), 1, backend="shm").close()
    assert not (Path("/dev/shm") / names[1]).exists()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_flipped_label_bit_is_an_error_by_default_not_a_wrong_label(tmp_path, workers):
    """Checksums are on by default: a damaged label is named, never served; the user's
    own dataset object is not changed by the loader's setting."""
    import formats

    root = make_dataset(tmp_path / "ds", n=20, records_per_shard=10, extra=False)
    ds = formats.open_shards(root)
    _, offsets, _ = ds.spans([13], "label")
    data = root / "shard-00001.rec"
    raw = bytearray(data.read_bytes())
    raw[int(offsets[0])] ^= 1
    data.write_bytes(bytes(raw))
    for source in (root, formats.open_shards(root)):
        with pytest.raises(CorruptRecordError, match=r"shard-00001.rec record 3 .*checksum"), \
                Loader(source, batch_size=5, num_workers=workers,
                       transform=CropPipeline()) as lo:
            for _ in lo:
                pass
    mine = formats.open_shards(root)
    with Loader(mine, batch_size=5, num_workers=workers, transform=CropPipeline(),
                check_crc=False) as lo:
        labels = [x for b in lo for x in b["label"].tolist()]
    # unchecked: the damage comes through (label 13 read as 12)
    assert labels.count(12) == 2 and 13 not in labels and mine.check_crc
