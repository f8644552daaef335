"""The monitor's timeline: a Chrome trace Perfetto opens, bounded, written atomically,
and never a reason for training to stop.

The trace is read back and checked the way Perfetto's JSON importer reads it: a
``traceEvents`` list; phases among B/E/X/i/M; integer pid and tid; every B closed by
its E; on each track, timestamps in order and complete events nested, never
overlapping partly; every track named by a metadata event. The schema half runs
with ``jsonschema`` (installed with the dev extra's ``moto[server]`` and ``ray``).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import pytest

import reader
from formats.errors import ArgumentError, ArgumentTypeError
from formats.files import temp_name
from reader import Monitor
from reader.monitor.trace import BUILDER, H2D, MAIN, WORKER0, Trace
from tests.helpers_monitor import HEALTHY, FakeClock, feed, timing
from tests.helpers_reader import CropPipeline, make_dataset
from tests.hostile import mount_tmpfs, umount

ROOT = Path(__file__).resolve().parents[3]

SCHEMA = {
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "traceEvents": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "ph", "pid", "tid"],
                "properties": {
                    "name": {"type": "string"},
                    "ph": {"enum": ["B", "E", "X", "i", "M"]},
                    "pid": {"type": "integer"},
                    "tid": {"type": "integer"},
                    "ts": {"type": "number", "minimum": 0},
                    "dur": {"type": "number", "minimum": 0},
                    "s": {"enum": ["g", "p", "t"]},
                    "args": {"type": "object"},
                },
                "allOf": [
                    {"if": {"properties": {"ph": {"const": "X"}}},
                     "then": {"required": ["ts", "dur"]}},
                    {"if": {"properties": {"ph": {"enum": ["B", "E", "i"]}}},
                     "then": {"required": ["ts"]}},
                    {"if": {"properties": {"ph": {"const": "M"}}},
                     "then": {"required": ["args"], "properties": {"name": {"enum": [
                         "process_name", "thread_name", "process_sort_index",
                         "thread_sort_index"]}}}},
                ],
            },
        },
    },
}  # fmt: skip


def check_chrome_trace(doc: dict) -> dict[tuple[int, int], list[dict]]:
    """Assert ``doc`` is a trace Perfetto imports whole; returns the spans by track."""
    jsonschema = pytest.importorskip("jsonschema", reason="the schema check needs jsonschema")
    jsonschema.validate(doc, SCHEMA)
    events = doc["traceEvents"]
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    processes = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    tracks: dict[tuple[int, int], list[dict]] = defaultdict(list)
    open_b: dict[tuple[int, int], list[str]] = defaultdict(list)
    last_ts: dict[tuple[int, int], float] = {}
    for e in events:
        if e["ph"] == "M":
            continue
        key = (e["pid"], e["tid"])
        assert key in named, f"track {key} has no thread_name metadata"
        assert e["pid"] in processes, f"process {e['pid']} has no process_name metadata"
        if e["ph"] == "i":
            continue
        assert e["ts"] >= last_ts.get(key, 0), f"time goes back on track {key}: {e}"
        last_ts[key] = e["ts"]
        if e["ph"] == "B":
            open_b[key].append(e["name"])
        elif e["ph"] == "E":
            assert open_b[key], f"E without B on {key}: {e}"
            open_b[key].pop()
        else:
            tracks[key].append(e)
    assert not any(open_b.values()), f"B events never closed: {dict(open_b)}"
    for key, spans in tracks.items():  # complete events nest: a stack, as Perfetto builds it
        stack: list[float] = []
        for e in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
            while stack and e["ts"] >= stack[-1]:
                stack.pop()
            end = e["ts"] + e["dur"]
            assert not stack or end <= stack[-1], f"span overlaps its parent's end on {key}: {e}"
            stack.append(end)
    return tracks


def read_trace(path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("trace") / "ds", n=240, records_per_shard=60)


def test_a_real_loader_traced_opens_in_perfetto(dataset, tmp_path):
    path = tmp_path / "trace.json"
    mon = Monitor(0.1, output=False, cpu=None, trace=path)
    with reader.Loader(dataset, 16, num_workers=2, transform=CropPipeline(sleep=0.0005),
                       monitor=mon) as loader:  # fmt: skip
        n = sum(1 for _ in loader)
    mon.close()
    doc = read_trace(path)
    tracks = check_chrome_trace(doc)
    pid = os.getpid()
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names[MAIN] == "main: next()"
    assert {names[WORKER0], names[WORKER0 + 1]} == {"worker 0", "worker 1"}
    main = tracks[(pid, MAIN)]
    calls = [e for e in main if e["name"] == "next()"]
    assert [e["args"]["batch"] for e in calls] == list(range(n))
    assert {e["name"] for e in main} >= {"next()", "wait", "deliver"}
    built = {}
    for w in (0, 1):
        spans = tracks[(pid, WORKER0 + w)]
        assert {e["name"] for e in spans} >= {"io", "decode", "transform"}
        built.update({e["args"]["batch"]: e for e in spans if e["name"].startswith("batch ")})
    assert sorted(built) == list(range(n))
    # One clock in every process: a worker finished each batch before next() returned it.
    for e in calls:
        b = built[e["args"]["batch"]]
        assert b["ts"] + b["dur"] <= e["ts"] + e["dur"], (b, e)
    assert doc["otherData"]["batches_kept"] == n


def test_batches_built_in_the_main_process_sit_inside_their_wait(dataset, tmp_path):
    path = tmp_path / "trace.json"
    mon = Monitor(0.1, output=False, cpu=None, trace=path)
    with reader.Loader(dataset, 16, num_workers=0, transform=CropPipeline(), monitor=mon) as loader:
        n = sum(1 for _ in loader)
    mon.close()
    tracks = check_chrome_trace(read_trace(path))
    waits = [e for e in tracks[(os.getpid(), MAIN)] if e["name"] == "wait"]
    builds = [e for e in tracks[(os.getpid(), BUILDER)] if e["name"].startswith("batch ")]
    assert len(waits) == len(builds) == n
    for w, b in zip(waits, builds, strict=True):
        assert w["ts"] <= b["ts"] and b["ts"] + b["dur"] <= w["ts"] + w["dur"] + 1, (w, b)


def test_device_copies_get_their_own_track(dataset, tmp_path, monkeypatch):
    from tests import fake_cupy  # numpy standing in for cupy: a copy takes its memmove's time

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    path = tmp_path / "trace.json"
    mon = Monitor(0.1, output=False, cpu=None, trace=path)
    with reader.Loader(dataset, 16, num_workers=1, transform=CropPipeline(), device="cuda",
                       monitor=mon) as loader:  # fmt: skip
        n = sum(1 for _ in loader)
    mon.close()
    doc = read_trace(path)
    tracks = check_chrome_trace(doc)
    copies = tracks[(os.getpid(), H2D)]
    assert len(copies) == n and {e["name"] for e in copies} == {"H2D copy"}
    assert all(e["dur"] > 0 and e["args"]["bytes"] > 0 for e in copies)
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names[H2D] == "main: H2D copy"


def test_notes_and_verdict_changes_are_markers(tmp_path):
    path = tmp_path / "trace.json"
    clock = FakeClock()
    mon = Monitor(0.5, output=False, cpu=None, clock=clock, trace=path)
    feed(mon, clock, HEALTHY, 60)
    mon.note("workers 2 -> 3: the consumer waited")
    feed(mon, clock, HEALTHY, 60, start=60)
    mon.close()
    doc = read_trace(path)
    check_chrome_trace(doc)
    marks = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert [e["args"]["kind"] for e in marks].count("note") == 1
    assert any(e["name"] == "workers 2 -> 3: the consumer waited" for e in marks)
    verdicts = [e for e in marks if e["args"]["kind"] == "diagnosis"]
    assert len(verdicts) == 1 and verdicts[0]["name"].startswith("verdict: ")


def test_the_file_stays_bounded_however_long_the_run(tmp_path):
    path = tmp_path / "trace.json"
    tr = Trace(path, batches=200, every=0.0)
    sizes = []
    for i in range(6000):
        t = timing(HEALTHY, i, i % 4)
        t.done_at = time.perf_counter()
        tr.on_batch(t)
        if i % 500 == 499:
            tr.mark(f"note {i}", "note")
            tr.tick()
            sizes.append(path.stat().st_size)
    doc = read_trace(path)
    check_chrome_trace(doc)
    assert doc["otherData"]["batches_kept"] == 200
    assert doc["otherData"]["batches_seen"] == 6000
    calls = [e for e in doc["traceEvents"] if e["name"] == "next()"]
    assert [e["args"]["batch"] for e in calls] == list(range(5800, 6000))
    # After the ring first filled (the first write holds 500 batches, 200 kept), the
    # size no longer grows with the run.
    assert max(sizes) <= 1.05 * min(sizes), sizes
    assert max(sizes) < 200 * 1500


_CRASH = textwrap.dedent("""
    import os, sys, time
    sys.path[:0] = [{root!r}]
    from reader.monitor import trace
    from tests.helpers_monitor import HEALTHY, timing
    tr = trace.Trace({path!r}, every=0.0)
    for i in range(50):
        tr.on_batch(timing(HEALTHY, i, 0))
    tr.write()                                    # a complete file of 50 batches
    for i in range(50, 100):
        tr.on_batch(timing(HEALTHY, i, 0))
    real = os.fdopen
    def dying_fdopen(fd, *args, **kwargs):        # the process dies halfway through a write
        fh = real(fd, *args, **kwargs)
        class Half:
            def __enter__(self): return self
            def __exit__(self, *exc): return False
            def write(self, text):
                fh.write(text[: len(text) // 2]); fh.flush(); os._exit(9)
        return Half()
    trace.os.fdopen = dying_fdopen
    tr.write()
""")


def test_a_crash_mid_write_leaves_the_last_complete_file(tmp_path):
    path = tmp_path / "trace.json"
    child = subprocess.run([sys.executable, "-c", _CRASH.format(root=str(ROOT), path=str(path))],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert child.returncode == 9, child.stderr
    doc = read_trace(path)  # whole, and the one before the crash
    check_chrome_trace(doc)
    assert doc["otherData"]["batches_kept"] == 50
    litter = [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert len(litter) == 1, litter  # the dead process's half-written temporary file...
    Trace(path)  # ...which the next trace of that path removes (its process is gone)
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("make", ["folder", "symlink", "missing-folder"])
def test_paths_that_are_not_a_trace_file_are_refused(tmp_path, make):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    path = tmp_path / "trace.json"
    if make == "folder":
        path.mkdir()
    elif make == "symlink":
        path.symlink_to(victim)
    else:
        path = tmp_path / "no" / "trace.json"
    with pytest.raises(ArgumentError, match=r"monitor trace .*(not a file|symlink|does not exist)"):
        Monitor(trace=path)
    assert victim.read_text() == "keep me"


def test_a_trace_or_ranks_path_of_the_wrong_type_is_refused():
    with pytest.raises(ArgumentTypeError, match="monitor trace: expected a file path, found 5"):
        Monitor(trace=5)
    with pytest.raises(ArgumentTypeError, match="monitor ranks: expected a folder path"):
        Monitor(ranks=b"/tmp")


def test_a_symlink_put_in_place_later_is_not_written_through(tmp_path, caplog):
    path = tmp_path / "trace.json"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    tr = Trace(path, every=0.0)
    path.unlink()
    path.symlink_to(victim)
    tr.on_batch(timing(HEALTHY, 0, 0))
    with caplog.at_level(logging.WARNING, logger="reader.monitor.trace"):
        assert tr.write() is False
        assert tr.write() is False
    assert victim.read_text() == "keep me" and path.is_symlink()
    assert len(caplog.records) == 1 and "no longer a file" in caplog.records[0].getMessage()


def test_a_planted_temporary_symlink_is_not_followed(tmp_path):
    path = tmp_path / "trace.json"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    temp_name(path).symlink_to(victim)  # where this process writes before renaming
    tr = Trace(path, every=0.0)
    tr.on_batch(timing(HEALTHY, 0, 0))
    assert tr.write()
    assert victim.read_text() == "keep me"
    check_chrome_trace(read_trace(path))



def test_a_read_only_folder_is_refused_when_the_monitor_is_made(tmp_path):
    point = tmp_path / "ro"
    if not mount_tmpfs(point, "1m", "ro"):
        pytest.skip("needs root and mount for a real read-only disk")
    try:
        with pytest.raises(ArgumentError, match=r"cannot be written there \(Read-only file system\)"):
            Monitor(trace=point / "trace.json")
    finally:
        umount(point)


def test_a_full_disk_stops_the_trace_not_training(dataset, small_disk, caplog):
    path = small_disk / "trace.json"
    mon = Monitor(0.05, output=False, cpu=None, trace=path)
    mon.trace.every = 0.0  # write at every report
    with caplog.at_level(logging.WARNING, logger="reader.monitor.trace"):
        with reader.Loader(dataset, 8, num_workers=1, transform=CropPipeline(sleep=0.002),
                           monitor=mon) as loader:  # fmt: skip
            for _ in range(3):
                n = sum(1 for _ in loader)  # the whole run, although the disk filled
        mon.close()
    assert n == 30 and mon.reports >= 2
    assert mon.trace.stopped == "No space left on device"
    warnings = [r for r in caplog.records if r.name == "reader.monitor.trace"]
    assert len(warnings) == 1 and "the trace stops here" in warnings[0].getMessage()
    check_chrome_trace(read_trace(path))  # the last complete write
    assert [p.name for p in small_disk.iterdir()] == ["trace.json"]  # no temporary file left


def test_a_folder_made_read_only_later_stops_the_trace(small_disk, caplog):
    path = small_disk / "trace.json"
    clock = FakeClock()
    mon = Monitor(0.5, output=False, cpu=None, clock=clock, trace=path)
    feed(mon, clock, HEALTHY, 10)
    mon.flush()
    before = path.read_bytes()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        with caplog.at_level(logging.WARNING, logger="reader.monitor.trace"):
            feed(mon, clock, HEALTHY, 100, start=10)
            mon.flush()
            mon.close()
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    assert mon.reports >= 2
    assert "Read-only" in mon.trace.stopped
    assert len([r for r in caplog.records if r.name == "reader.monitor.trace"]) == 1
    assert path.read_bytes() == before
    assert stat.S_ISREG(path.stat().st_mode)
