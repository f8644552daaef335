"""Workers that make no progress (stopped, slow, blocked) and processes forked from the loader's."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers_reader import SIDE, CropPipeline, make_dataset

from reader import Loader, LoaderTimeoutError
from reader.runtime import epoch as epoch_mod
from reader.runtime.proc import ProcState, describe, process_state
from tests.helpers_paths import TESTS


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("stuck") / "ds", 96, extra=False)


class SpinPipeline:
    """Burns ``seconds`` of CPU per record: a slow transform, never a stuck one."""

    output_shape = (SIDE, SIDE, 3)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def run(self, view, out, rng):
        end = time.process_time() + self.seconds
        while time.process_time() < end:
            pass
        out[...] = 7
        return 0.0, self.seconds


@pytest.fixture
def quick_deadline(monkeypatch):
    monkeypatch.setattr(epoch_mod, "LATE_FIRST_S", 0.5)
    monkeypatch.setattr(epoch_mod, "LATE_MIN_S", 0.5)
    monkeypatch.setattr(epoch_mod, "LATE_FACTOR", 1.0)


def test_process_state_reads_this_process():
    st = process_state(os.getpid())
    assert st is not None and st.state == "R" and st.cpu_s > 0 and not st.stopped
    assert st.wait_s is None or st.wait_s >= 0


def test_a_worker_waiting_for_a_cpu_is_busy_not_asleep():
    # On a loaded machine a spinning worker may get a fifth of a core: the time it was
    # runnable but not running (the run-queue wait) tells it from a sleeping one.
    before = ProcState("R", 10.0, 5.0)
    assert describe(before, ProcState("R", 10.2, 5.8), 1.0) == (
        "busy (0.2 s of CPU in the last 1.0 s, and 0.8 s waiting for one: the machine is "
        "loaded)")
    assert describe(before, ProcState("S", 10.1, 5.0), 1.0) == (
        "asleep or blocked (0.1 s of CPU in the last 1.0 s)")
    assert describe(before, ProcState("R", 10.9, 5.05), 1.0) == (
        "busy (0.9 s of CPU in the last 1.0 s)")
    # Where the kernel keeps no run-queue times, the CPU used alone decides, as before.
    assert describe(ProcState("R", 10.0), ProcState("R", 10.2), 1.0).startswith("asleep")
    assert describe(ProcState("R", 10.0), ProcState("R", 10.6), 1.0).startswith("busy")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity")
                    or process_state(os.getpid()).wait_s is None,
                    reason="needs CPU affinity and /proc/PID/schedstat (Linux)")
def test_a_starved_spinning_worker_is_reported_busy(ds_path):
    # The failure seen under a loaded `dev.sh test`, made on purpose: the spinning
    # worker shares one core with three spinning processes, so it gets about a quarter
    # of it (the CPU it used alone once said "asleep or blocked").
    cpu = min(os.sched_getaffinity(0))
    hog = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(3)]
    try:
        deadline = time.monotonic() + 20
        while not all((st := process_state(h.pid)) and st.cpu_s >= 0.05 for h in hogs):
            assert time.monotonic() < deadline, "the spinning processes did not start"
            time.sleep(0.05)
        # 3 s of CPU a batch: late past the timeout even if the worker got a whole core.
        with Loader(ds_path, 2, num_workers=1, transform=SpinPipeline(1.5), timeout=1.5) as lo:
            it = iter(lo)
            for p in it.workers:
                os.sched_setaffinity(p.pid, {cpu})
            with pytest.raises(LoaderTimeoutError) as info:
                next(it)
            it.shutdown()
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    msg = str(info.value)
    assert re.search(r"worker 0 \(pid \d+\), building batch 0, is busy \(0\.[0-6] s of CPU in "
                     r"the last \d\.\d s, and \d\.\d s waiting for one", msg), msg


def test_stopped_workers_are_an_error_by_default_naming_them(ds_path, quick_deadline):
    with Loader(ds_path, 8, num_workers=2, transform=CropPipeline()) as lo:
        it = iter(lo)
        next(it)
        for _ in range(len(it.ready) + 1):  # let the batches already built be taken
            pass
        pids = [p.pid for p in it.workers]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            t = time.monotonic()
            with pytest.raises(LoaderTimeoutError) as info:
                for _ in it:
                    pass
            assert time.monotonic() - t < 10
            msg = str(info.value)
            assert "stopped" in msg and f"kill -CONT {pids[0]} {pids[1]}" in msg
            assert f"pid {pids[0]}" in msg and "timeout=" in msg
        finally:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass


def test_a_timeout_says_what_each_worker_is_doing(ds_path):
    # One busy worker: "running" with the CPU it used, never "all workers are alive".
    with Loader(ds_path, 2, num_workers=1, transform=SpinPipeline(0.6), timeout=1.0) as lo, \
            pytest.raises(LoaderTimeoutError) as info:
        next(iter(lo))
    msg = str(info.value)
    assert "worker 0" in msg and "busy (" in msg and "s of CPU in the last" in msg
    assert "the timeout is 1.0 s" in msg and "alive" not in msg
    # An asleep one, building the batch waited for, and an idle one: told apart. The
    # window is long enough that a worker kept waiting for a CPU for a second after it
    # was forked (a loaded machine) has still slept most of it.
    with Loader(ds_path, 2, num_workers=2, prefetch=1, transform=CropPipeline(sleep=3.0),
                timeout=2.5) as lo, pytest.raises(LoaderTimeoutError) as info:
        next(iter(lo))
    msg = str(info.value)
    assert re.search(r"building batch 0, is asleep or blocked \(0\.[0-3] s of CPU", msg), msg
    assert "waiting for a task, is asleep or blocked" in msg


def test_slow_workers_are_reported_and_waited_for(ds_path, quick_deadline, caplog):
    with Loader(ds_path, 8, num_workers=1, transform=CropPipeline(sleep=0.1)) as lo:
        it = iter(lo)
        with caplog.at_level(logging.WARNING, logger="reader.runtime.epoch"):
            labels = [next(it)["label"].copy() for _ in range(2)]
        it.shutdown()
    assert np.concatenate(labels).tolist() == list(range(16))  # late, but they came
    assert any("no batch for" in r.getMessage() and "asleep or blocked" in r.getMessage()
               for r in caplog.records)


FORK_AND_EXIT = """
import os, sys
import numpy as np
sys.path.insert(0, {tests!r})
from helpers_reader import CropPipeline
from reader import Loader

with Loader({ds!r}, 8, num_workers=2, transform=CropPipeline(), persistent_workers={persistent}) as lo:
    it = iter(lo)
    first = next(it)["label"].copy()
    workers = list(it.workers)
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # as user code leaves: atexit handlers (multiprocessing's too), then GC
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    assert all(p.exitcode is None for p in workers), [p.exitcode for p in workers]
    rest = np.concatenate([b["label"] for b in it])
    assert np.array_equal(np.concatenate([first, rest]), np.arange(96))
print("parent ok")
"""


@pytest.mark.parametrize("persistent", [False, True])
def test_a_forked_child_exiting_leaves_the_parents_workers_alone(ds_path, persistent):
    script = FORK_AND_EXIT.format(tests=str(TESTS), ds=str(ds_path),
                                  persistent=persistent)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and "parent ok" in res.stdout, res.stderr[-3000:]


def test_a_forked_child_gets_its_own_workers(ds_path):
    with Loader(ds_path, 8, num_workers=2, transform=CropPipeline()) as lo:
        it = iter(lo)
        next(it)
        parent_ring = lo.ring
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                try:
                    next(it)
                except RuntimeError as exc:
                    assert "forked" in str(exc)
                    labels = np.concatenate([b["label"] for b in lo])  # its own workers, ring
                    ok = lo.ring is not parent_ring and labels.tolist() == list(range(96))
                    code = 0 if ok else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        labels = np.concatenate([b["label"].copy() for b in it])
        assert labels.tolist() == list(range(8, 96))


def test_time_this_process_spends_suspended_is_nobodys_lateness(ds_path):
    import queue

    # The whole process group stopped for 2 s (Ctrl-Z, then fg) while next() waited:
    # seen from the loop, one poll of the done queue took 2 s instead of 0.1 s.
    with Loader(ds_path, 8, num_workers=1, transform=CropPipeline(sleep=0.05),
                timeout=1.5) as lo:
        it = iter(lo)
        real_get, suspended = it.done_q.get, []

        def get(timeout=None):
            if not suspended:
                suspended.append(True)
                time.sleep(2.0)
                raise queue.Empty
            return real_get(timeout=timeout)

        it.done_q.get = get
        assert len(next(it)["label"]) == 8  # no LoaderTimeoutError for those 2 s
        it.shutdown()
