"""``packer.pack_samples``: a user's function over inputs, through the one pack loop."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import formats
from formats import Field
from packer import (
    DestinationError,
    PackError,
    PackInputError,
    PackInterrupted,
    PackOptions,
    UsageError,
    pack_samples,
)
from packer.work_names import STATE_DIR
from tests.helpers_packer import StopAfter, dataset_files, jpeg, pack_fn
from tests.helpers_paths import ROOT

FAST = {"durable": False, "progress": False}


def make(i):
    """One sample per input, every field type; the array's length varies."""
    r = np.random.default_rng(i)
    return {"tokens": r.integers(0, 257, int(r.integers(3, 40))).astype(np.int32),
            "text": f"doc {i} \u00e9", "n": i, "score": i / 3, "blob": bytes([i % 256]) * 5,
            "meta": {"i": i, "tags": ["a", "b"][: i % 3]},
            "grid": np.full((2, 3), i, np.float32)}


def clips(i):
    """A generator: input i yields i % 3 samples (0, 1 or 2)."""
    for j in range(i % 3):
        yield {"clip": np.arange(j + 1, dtype=np.int16) + i, "name": f"{i}-{j}"}


def flaky(i):
    if i == 7:
        raise ValueError(f"cannot read item {i}")
    return {"x": i}


def half_then_raise(i):
    yield {"x": i}
    if i == 4:
        raise OSError("disk went away")
    yield {"x": -i}


def not_a_dict(i):
    return [i] if i == 5 else {"x": i}


def wrong_type(i):
    return {"x": "five" if i == 5 else i}


def wrong_dtype(i):
    return {"a": np.zeros(3, np.int64 if i == 5 else np.int32)}


def surrogate(i):
    return {"t": "bad \udc80 text" if i == 5 else f"text {i}"}


def big(i):
    return {"b": bytes(5000 if i == 5 else 100)}


def images(i):
    return {"image": jpeg(np.random.default_rng(i), 20 + i, 16), "label": i % 2}


def test_schema_is_inferred_and_values_come_back(tmp_path):
    s = pack_fn(make, range(30), tmp_path / "ds", workers=0, **FAST)
    assert s.complete and s.records_in == s.records_written == 30 and s.source == "function"
    ds = formats.open_shards(tmp_path / "ds")
    types = {f.name: (f.type, f.dtype, f.shape) for f in ds.fields}
    assert types == {"tokens": ("ndarray", "<i4", (None,)), "text": ("str", None, None),
                     "n": ("int", None, None), "score": ("float", None, None),
                     "blob": ("bytes", None, None), "meta": ("json", None, None),
                     "grid": ("ndarray", "<f4", (2, 3))}
    for i in (0, 17, 29):
        want, got = make(i), ds[i]
        np.testing.assert_array_equal(got["tokens"], want["tokens"])
        np.testing.assert_array_equal(got["grid"], want["grid"])
        assert (got["text"], got["n"], got["score"], bytes(got["blob"]), got["meta"]) == \
            (want["text"], want["n"], want["score"], want["blob"], want["meta"])
    made = ds.manifest.created_by
    assert made["source"]["function"].endswith("test_pack_samples.make")
    assert made["schema"]["tokens"] == "<i4[None]"


def test_images_are_typed_by_content_and_labels_reach_the_metadata(tmp_path):
    s = pack_fn(images, range(6), tmp_path / "ds", workers=0, **FAST)
    ds = formats.open_shards(tmp_path / "ds")
    assert [(f.name, f.type) for f in ds.fields] == [("image", "jpeg"), ("label", "int")]
    assert s.image_type == "jpeg"  # the summary's "image field" line
    meta = ds.metadata()
    assert meta.column("label").to_pylist() == [0, 1, 0, 1, 0, 1]
    assert meta.column("width").to_pylist() == [20, 21, 22, 23, 24, 25]


@pytest.mark.parametrize("fn", [make, clips])
def test_bytes_do_not_depend_on_workers(tmp_path, fn):
    outs = []
    for w in (0, 1, 2):
        pack_fn(fn, range(300), tmp_path / f"w{w}", workers=w, records_per_shard=37,
                     shard_size=None, task_records=70, **FAST)
        outs.append(dataset_files(tmp_path / f"w{w}"))
    assert outs[0] == outs[1] == outs[2]


def test_generators_give_their_samples_in_order(tmp_path):
    s = pack_fn(clips, range(10), tmp_path / "ds", workers=2, **FAST)
    ds = formats.open_shards(tmp_path / "ds")
    names = [ds[k]["name"] for k in range(len(ds))]
    assert names == [f"{i}-{j}" for i in range(10) for j in range(i % 3)]
    assert s.records_written == len(names) and s.records_skipped == 0
    assert ds.fields[0].shape == (None,) and ds.fields[0].dtype == "<i2"


def test_an_explicit_schema_in_both_spellings(tmp_path):
    spec = {"clip": "int16[None]", "name": "str"}
    pack_fn(clips, range(20), tmp_path / "a", schema=spec, workers=0, **FAST)
    fields = [Field("clip", "ndarray", dtype="<i2", shape=(None,)), Field("name", "str")]
    pack_fn(clips, range(20), tmp_path / "b", schema=fields, workers=0, **FAST)
    assert formats.open_shards(tmp_path / "a").fields == tuple(fields)
    assert dataset_files(tmp_path / "a") == dataset_files(tmp_path / "b")


@pytest.mark.parametrize("schema, words", [
    ({"x": "int33"}, "'x'"), ({"x": "float32[two]"}, "'x'"), ("x:int", "dict"),
    ({}, "no fields"), ({"x": 3}, "'x'"),
])
def test_a_bad_schema_is_a_usage_error(tmp_path, schema, words):
    with pytest.raises(UsageError, match=words):
        pack_fn(flaky, range(3), tmp_path / "ds", schema=schema, workers=0, **FAST)
    assert not (tmp_path / "ds").exists()


# name -> (function, kind, words in the reason)
BAD = {
    "raises": (flaky, "raised", "ValueError: cannot read item 7"),
    "not-a-dict": (not_a_dict, "not-a-dict", "list"),
    "wrong-type": (wrong_type, "type", "'x': a str, where the schema says int"),
    "wrong-dtype": (wrong_dtype, "dtype", "<i8, where the schema says <i4[3]"),
    "surrogate": (surrogate, "not-utf8", "not valid UTF-8"),
    "over-shard-size": (big, "over-shard-size", "more than the shard size"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_samples_fail_naming_the_input(tmp_path, case):
    fn, kind, words = BAD[case]
    with pytest.raises(PackInputError) as e:
        pack_fn(fn, list(range(10)), tmp_path / "ds", workers=2, shard_size=4096, **FAST)
    i = 7 if case == "raises" else 5
    assert e.value.kind == kind and words in str(e.value)
    assert f"input {i} ({i})" in str(e.value)
    assert not (tmp_path / "ds" / "manifest.json").exists()


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_samples_are_skipped_and_listed(tmp_path, case):
    fn, kind, words = BAD[case]
    s = pack_fn(fn, list(range(10)), tmp_path / "ds", workers=2, shard_size=4096,
                     on_error="skip", **FAST)
    assert s.records_in == s.records_written + s.records_skipped == 10
    assert dict(s.skipped) == {kind: 1}
    lines = [json.loads(x) for x in (tmp_path / "ds" / "skipped.jsonl").read_text().splitlines()]
    i = 7 if case == "raises" else 5
    assert lines == [{"kind": kind, "path": f"input {i} ({i})", "reason": lines[0]["reason"]}]
    assert words in lines[0]["reason"]
    assert len(formats.open_shards(tmp_path / "ds")) == 9


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("run_samples", [4096, 3])
def test_a_generator_that_raises_midway_keeps_its_samples_and_is_listed_as_partial(
        tmp_path, monkeypatch, workers, run_samples):
    """The samples an input gave before its function raised are written (runs of 3
    samples: some were handed to the writer before it raised, others not yet)."""
    monkeypatch.setattr("packer.sample_runs.RUN_SAMPLES", run_samples)
    s = pack_fn(half_then_raise, range(6), tmp_path / "ds", workers=workers,
                     on_error="skip", task_records=2, **FAST)
    assert s.records_written == 11 and dict(s.skipped) == {"partial": 1}
    assert s.records_in == 12 and s.to_json()["skipped_by_kind"] == {"partial": 1}
    line = json.loads((tmp_path / "ds" / "skipped.jsonl").read_text())
    assert line["kind"] == "partial" and line["path"] == "input 4 (4)"
    assert "OSError: disk went away" in line["reason"]
    assert "after 1 sample(s); they are written" in line["reason"]
    ds = formats.open_shards(tmp_path / "ds")
    assert [ds[k]["x"] for k in range(len(ds))] == [0, 0, 1, -1, 2, -2, 3, -3, 4, 5, -5]


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_generator_that_raises_midway_fails_the_pack_naming_it(tmp_path, workers):
    with pytest.raises(PackInputError) as e:
        pack_fn(half_then_raise, range(6), tmp_path / "ds", workers=workers,
                     task_records=2, **FAST)
    assert e.value.kind == "partial" and "input 4 (4)" in str(e.value)
    assert "OSError: disk went away" in str(e.value) and "after 1 sample(s)" in str(e.value)
    assert "written" not in str(e.value)  # a failed pack publishes nothing of the range
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_run_boundaries_change_no_byte(tmp_path, monkeypatch):
    pack_fn(clips, range(300), tmp_path / "a", workers=0, records_per_shard=37,
                 shard_size=None, **FAST)
    monkeypatch.setattr("packer.sample_runs.RUN_SAMPLES", 5)
    monkeypatch.setattr("packer.sample_runs.RUN_BYTES", 64)
    pack_fn(clips, range(300), tmp_path / "b", workers=0, records_per_shard=37,
                 shard_size=None, **FAST)
    assert dataset_files(tmp_path / "a") == dataset_files(tmp_path / "b")


def endless(i):
    """Samples of 4 KB without end; at sample 3000 it raises, saying how many shards the
    pack had sealed by then in its range's scratch folder (DST in the environment)."""
    j = 0
    while True:
        if j == 3000:
            sealed = list(Path(os.environ["SHARDPACK_TEST_DST"]).glob(
                f"{STATE_DIR}/work-*/shard-*.rec"))
            raise RuntimeError(f"{len(sealed)} shards sealed")
        yield {"t": np.full(1024, j, np.int32)}
        j += 1


@pytest.mark.parametrize("workers", [0, 2])
def test_an_input_without_end_is_written_as_it_goes(tmp_path, monkeypatch, workers):
    """The schema is inferred from its first samples (the generator is left there), and
    its samples reach the shards while it runs: memory does not hold them."""
    monkeypatch.setenv("SHARDPACK_TEST_DST", str(tmp_path / "ds"))
    with pytest.raises(PackInputError, match="after 3000 sample") as e:
        pack_fn(endless, [0], tmp_path / "ds", workers=workers, records_per_shard=100,
                     shard_size=None, **FAST)
    sealed = int(re.search(r"RuntimeError: (\d+) shards sealed", str(e.value))[1])
    assert sealed >= 20  # runs of 1024 samples (4 MB): two of them in shards of 100


def kb_each(i):
    """Input ``(n, _)`` yields ``n`` samples of 1 KB."""
    for j in range(i[0]):
        yield {"t": np.full(256, j, np.int32)}


def test_memory_is_bounded_whatever_one_input_yields(tmp_path, monkeypatch):
    """8 MB of samples from one input: the traced peak stays near a run's bytes, as for
    the same samples over many inputs."""
    import tracemalloc

    monkeypatch.setattr("packer.sample_runs.RUN_BYTES", 256 << 10)
    peaks = {}
    for name, inputs in (("one", [(8000, 0)]), ("many", [(80, k) for k in range(100)])):
        tracemalloc.start()
        s = pack_fn(kb_each, inputs, tmp_path / name, workers=0, shard_size="1MB", **FAST)
        peaks[name] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert s.records_written == 8000
    assert peaks["one"] < 3 << 20 and peaks["many"] < 3 << 20, peaks


def long_inputs(i):
    """Input i yields 400 samples; with SHARDPACK_TEST_KILL=I:FLAG in the environment,
    input I kills the pack's whole process group at its sample 300 (once: FLAG)."""
    kill = os.environ.get("SHARDPACK_TEST_KILL")
    for j in range(400):
        if kill and j == 300 and int(kill.split(":")[0]) == i:
            try:
                os.close(os.open(kill.split(":", 1)[1], os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os.killpg(os.getpgid(0), signal.SIGKILL)
        yield {"x": np.arange(j % 7, dtype=np.int32) + i, "n": 1000 * i + j}


_KILLED_PACK = """
import sys
import packer.sample_runs
from packer import PackOptions, pack_samples
sys.path[:0] = ["tests/packer", "tests"]  # the module's name under pytest: the fingerprint names fn by it
from test_pack_samples import long_inputs
packer.sample_runs.RUN_SAMPLES = 64  # small samples: runs of 64 reach the writer as they come
pack_samples(long_inputs, range(6), sys.argv[1],
             PackOptions(workers=int(sys.argv[2]), records_per_shard=50, shard_size=None,
                         task_records=2, durable=False), progress=False)
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pack_killed_mid_input_resumes_byte_identical(tmp_path, workers):
    """Killed (SIGKILL, the whole process group) at a sample in the middle of input 5,
    after shards of that input were sealed: the resume keeps the ranges whose
    done-markers are in DST and packs input 4 and 5's range again from input 4."""
    o = {"records_per_shard": 50, "shard_size": None, "task_records": 2, "durable": False,
         "progress": False, "workers": workers}
    full = pack_fn(long_inputs, range(6), tmp_path / "full", **o)
    env = {**os.environ, "SHARDPACK_TEST_KILL": f"5:{tmp_path / 'killed'}"}
    root = ROOT
    res = subprocess.run([sys.executable, "-c", _KILLED_PACK, str(tmp_path / "cut"), str(workers)],
                         cwd=root, env=env, start_new_session=True, capture_output=True,
                         timeout=120)
    assert res.returncode == -signal.SIGKILL, res.stderr
    cut = tmp_path / "cut"
    assert not (cut / "manifest.json").exists()
    # Input 5's first 300 samples were streamed into shards of 50 before the kill.
    assert len(list(cut.glob(f"{STATE_DIR}/work-000000000004-*/shard-*.rec"))) >= 5
    markers = sorted(p.name for p in cut.glob(f"{STATE_DIR}/range-*.json"))
    assert "range-000000000004-000000000006.json" not in markers and markers
    again = pack_fn(long_inputs, range(6), cut, resume=True, **o)
    assert dataset_files(cut) == dataset_files(tmp_path / "full")
    assert again.resumed_records == 400 * 2 * len(markers)
    assert again.records_written == full.records_written == 2400


def slow_inputs(i):
    for j in range(10):
        time.sleep(0.005)
        yield {"n": 100 * i + j}


_PARENT_KILLED = """
import sys
from packer import PackOptions, pack_samples
sys.path[:0] = ["tests/packer", "tests"]
from test_pack_samples import slow_inputs
pack_samples(slow_inputs, range(80), sys.argv[1],
             PackOptions(workers=2, task_records=2, durable=False), progress=False)
"""


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_bytes()
        except (OSError, ValueError):
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] != b"Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_workers_die_with_a_pack_killed_outright_and_the_resume_is_not_refused(tmp_path):
    # SIGKILL to the parent alone (the OOM killer's way): its workers must not go on
    # writing into DST and holding its lock, which would refuse the resume.
    dst = tmp_path / "ds"
    proc = subprocess.Popen([sys.executable, "-c", _PARENT_KILLED, str(dst)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while len(workers := _children(proc.pid)) < 2 and proc.poll() is None:
        assert time.monotonic() < deadline, "the pack never started its workers"
        time.sleep(0.01)
    assert proc.poll() is None, proc.stderr.read().decode()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in workers):
        assert time.monotonic() < deadline, "the workers outlived their killed parent"
        time.sleep(0.05)
    s = pack_fn(slow_inputs, range(80), dst, workers=2, task_records=2, durable=False,
                resume=True)
    assert s.complete and s.records_written == 800


def fails_when_told(i):
    if i == 3 and os.environ.get("SHARDPACK_TEST_FAIL"):
        raise ValueError("told to fail")
    return {"x": np.arange(i % 5, dtype=np.int32), "n": i}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failed_overwrite_says_resume_continues_it(tmp_path, monkeypatch, workers):
    """As ``pack-dataset --overwrite``: the staging folder beside DST stays for resume=True
    (the message says so), the old dataset is untouched; a pack without resume starts over."""
    dst = tmp_path / "ds"
    pack_fn(make, range(5), dst, workers=0, **FAST)
    old = dataset_files(dst)
    o = {"workers": workers, "overwrite": True, "records_per_shard": 2, "shard_size": None,
         "task_records": 2, **FAST}
    monkeypatch.setenv("SHARDPACK_TEST_FAIL", "1")
    with pytest.raises(PackInputError, match=r"input 3 .*told to fail.*resume=True") as e:
        pack_fn(fails_when_told, range(10), dst, **o)
    staging = tmp_path / ".ds.shardpack-new"
    assert str(staging) in str(e.value) and staging.is_dir()
    assert dataset_files(dst) == old
    monkeypatch.delenv("SHARDPACK_TEST_FAIL")
    s = pack_fn(fails_when_told, range(10), dst, resume=True,
                     **{k: v for k, v in o.items() if k != "overwrite"})
    assert s.complete and s.resumed_records > 0 and not staging.exists()
    assert [formats.open_shards(dst)[k]["n"] for k in range(10)] == list(range(10))
    monkeypatch.setenv("SHARDPACK_TEST_FAIL", "1")
    with pytest.raises(PackInputError):
        pack_fn(fails_when_told, range(10), dst, **o)
    monkeypatch.delenv("SHARDPACK_TEST_FAIL")
    s = pack_fn(fails_when_told, range(10), dst, **o)  # without resume: starts over
    assert s.complete and s.resumed_records == 0 and not staging.exists()


def test_a_function_that_does_not_pickle_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(UsageError, match=r"cannot be sent to worker processes.*workers=0"):
        pack_fn(lambda i: {"x": i}, range(3), tmp_path / "ds", workers=2, **FAST)
    assert not (tmp_path / "ds").exists()
    s = pack_fn(lambda i: {"x": i}, range(3), tmp_path / "ds", workers=0, **FAST)
    assert s.records_written == 3


def test_inputs_that_do_not_pickle_are_refused_with_workers(tmp_path):
    import threading

    with pytest.raises(UsageError, match=r"input 0 .*cannot be sent to worker processes"):
        pack_fn(flaky, [threading.Lock()], tmp_path / "ds", workers=2, **FAST)
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("inputs, words", [("abc", "sequence"), (range(0), "empty"),
                                           (5, "sequence")])
def test_bad_arguments_are_usage_errors(tmp_path, inputs, words):
    with pytest.raises(UsageError, match=words):
        pack_fn(flaky, inputs, tmp_path / "ds", workers=0, **FAST)
    with pytest.raises(UsageError, match="on_error"):
        pack_fn(flaky, range(3), tmp_path / "ds", on_error="ignore", **FAST)
    with pytest.raises(UsageError, match="callable"):
        pack_fn("flaky", range(3), tmp_path / "ds", **FAST)


def test_no_sample_to_infer_from(tmp_path):
    with pytest.raises(PackError, match="no sample to infer the schema"):
        pack_fn(not_a_dict, [5], tmp_path / "ds", workers=0, **FAST)


def test_dst_is_claimed_like_the_command_line(tmp_path):
    dst = tmp_path / "ds"
    dst.mkdir()
    (dst / "notes.txt").write_text("mine")
    with pytest.raises(DestinationError, match="did not write"):
        pack_fn(flaky, range(3), dst, schema={"x": "int"}, workers=0, **FAST)
    pack_fn(make, range(3), dst, workers=0, overwrite=True, **FAST)
    assert (dst / "notes.txt").read_text() == "mine"
    with pytest.raises(DestinationError, match="already a dataset"):
        pack_fn(make, range(3), dst, workers=0, **FAST)



@pytest.mark.parametrize("workers", [0, 2])
def test_interrupt_then_resume_is_byte_identical(tmp_path, workers):
    """The ranges finished before Ctrl-C are kept; the others are packed again."""
    o = {"workers": workers, "records_per_shard": 7, "shard_size": None, "on_error": "skip",
         "durable": False, "task_records": 30}
    full = pack_fn(clips, range(400), tmp_path / "full", progress=False, **o)
    with pytest.raises(PackInterrupted):
        pack_fn(clips, range(400), tmp_path / "cut", progress=StopAfter(150), **o)
    assert not (tmp_path / "cut" / "manifest.json").exists()
    again = pack_fn(clips, range(400), tmp_path / "cut", progress=False, resume=True, **o)
    assert dataset_files(tmp_path / "cut") == dataset_files(tmp_path / "full")
    assert again.resumed_records > 0
    assert again.records_written == full.records_written == len(formats.open_shards(tmp_path / "cut"))


def test_resume_refuses_other_inputs(tmp_path):
    o = {"workers": 0, "records_per_shard": 5, "shard_size": None, "durable": False,
         "task_records": 10}
    with pytest.raises(PackInterrupted):
        pack_fn(make, range(100), tmp_path / "cut", progress=StopAfter(40), **o)
    with pytest.raises(PackError, match="cannot resume"):
        pack_fn(make, range(1, 101), tmp_path / "cut", progress=False, resume=True, **o)


def _die_in_a_worker(i):
    if i == 5 and os.getpid() != _PARENT:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"x": i}


_PARENT = os.getpid()


def test_a_worker_that_dies_is_an_error_not_a_hang(tmp_path):
    with pytest.raises(PackError, match="worker process died"):
        pack_fn(_die_in_a_worker, range(50), tmp_path / "ds", schema={"x": "int"},
                     workers=2, **FAST)


def two_each(i):
    """Two samples an input (a range's records are never its inputs' count)."""
    yield {"x": np.arange(3, dtype=np.int32) + i, "n": 2 * i}
    yield {"x": np.arange(2, dtype=np.int32) - i, "n": 2 * i + 1}


def test_a_resume_keeps_the_ranges_of_inputs_that_give_several_samples(tmp_path):
    o = {"workers": 0, "records_per_shard": 7, "shard_size": None, "durable": False,
         "task_records": 10}
    pack_fn(two_each, range(100), tmp_path / "full", progress=False, **o)
    with pytest.raises(PackInterrupted):
        pack_fn(two_each, range(100), tmp_path / "cut", progress=StopAfter(45), **o)
    again = pack_fn(two_each, range(100), tmp_path / "cut", progress=False, resume=True,
                         **o)
    assert again.resumed_records >= 80  # four ranges of ten inputs, two samples each
    assert dataset_files(tmp_path / "cut") == dataset_files(tmp_path / "full")


_BUF = np.zeros(4, np.int32)
_RAW = bytearray(3)


def reuses_its_buffers(i):
    """Returns the same array and buffer every time, and a generator's one dict."""
    _BUF[:] = i
    _RAW[:] = bytes([i % 256]) * 3
    return {"a": _BUF, "b": _RAW, "m": {"i": [i]}}


def reuses_its_dict(i):
    d = {"n": 0, "tags": []}
    for j in range(3):
        d["n"] = 10 * i + j
        d["tags"].append(j)
        yield d


@pytest.mark.parametrize("workers", [0, 2])
def test_a_function_that_reuses_its_buffers_and_dicts_loses_nothing(tmp_path, workers):
    pack_fn(reuses_its_buffers, range(100), tmp_path / "a", workers=workers, **FAST)
    ds = formats.open_shards(tmp_path / "a")
    assert [int(ds[i]["a"][0]) for i in range(100)] == list(range(100))
    assert [bytes(ds[i]["b"]) for i in range(100)] == [bytes([i]) * 3 for i in range(100)]
    assert [ds[i]["m"] for i in range(100)] == [{"i": [i]} for i in range(100)]
    pack_fn(reuses_its_dict, range(30), tmp_path / "b", workers=workers, **FAST)
    ds = formats.open_shards(tmp_path / "b")
    assert [ds[k]["n"] for k in range(90)] == [10 * i + j for i in range(30) for j in range(3)]
    assert [ds[k]["tags"] for k in range(3)] == [[0], [0, 1], [0, 1, 2]]


def test_arrays_in_either_byte_order_are_stored_as_little_endian(tmp_path):
    def fn(i):
        return {"a": np.array([1.5, i], ">f8" if i % 2 else "<f8")}

    pack_fn(fn, range(10), tmp_path / "ds", workers=0, **FAST)
    ds = formats.open_shards(tmp_path / "ds")
    assert ds.fields[0].dtype == "<f8"
    assert [float(ds[i]["a"][1]) for i in range(10)] == list(range(10))


def structured(i):
    return {"a": np.zeros(2, [("x", "<f4"), ("y", "<f4")])}


def test_a_structured_array_is_refused_with_the_way_out(tmp_path):
    with pytest.raises(PackError, match=r"structured dtype.*array of its own"):
        pack_fn(structured, range(5), tmp_path / "ds", workers=0, **FAST)


def test_an_input_that_does_not_pickle_is_named_before_anything_is_written(tmp_path):
    import threading

    inputs = [1, 2, threading.Lock(), 4]
    with pytest.raises(UsageError, match=r"input 2 \(.*lock.*\) cannot be sent"):
        pack_fn(flaky, inputs, tmp_path / "ds", workers=2, **FAST)
    assert not (tmp_path / "ds").exists()


def test_a_file_uri_is_the_local_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pack_fn(flaky, range(3), f"file://{tmp_path}/ds", workers=0, on_error="skip", **FAST)
    assert (tmp_path / "ds" / "manifest.json").exists() and not (tmp_path / "file:").exists()


def reordered(i):
    return {"a": i, "b": 0.5} if i % 2 else {"b": 1, "a": i}


def test_samples_with_their_keys_in_another_order_are_alike(tmp_path):
    pack_fn(reordered, range(10), tmp_path / "ds", workers=0, **FAST)
    ds = formats.open_shards(tmp_path / "ds")
    assert {f.name: f.type for f in ds.fields} == {"b": "float", "a": "int"}
    assert len(ds) == 10 and ds[1]["b"] == 0.5 and ds[0]["b"] == 1.0


@pytest.mark.parametrize("kw, words", [
    ({"schema": {"x": "float32[None, 4,]"}}, "not a type"),
    ({"workers": True}, "workers must be an integer"),
    ({"workers": 1.5}, "workers must be an integer"),
    ({"records_per_shard": True, "shard_size": None}, "records_per_shard must be a positive"),
    ({"task_records": True}, "task_records must be a positive"),
])
def test_odd_arguments_are_usage_errors(tmp_path, kw, words):
    with pytest.raises(UsageError, match=words):
        pack_fn(flaky, range(3), tmp_path / "ds", **{**FAST, **kw})
    assert not (tmp_path / "ds").exists()


def test_options_come_as_pack_takes_them(tmp_path):
    # One way for both entry points: pack(src, dst, PackOptions) and
    # pack_samples(fn, inputs, dst, PackOptions), sizes written as the CLI takes them.
    assert PackOptions(shard_size="64MB").shard_size == 64_000_000
    with pytest.raises(UsageError, match=r"shard_size: not a size: '64XB'"):
        PackOptions(shard_size="64XB")
    opts = PackOptions(workers=0, records_per_shard=7, shard_size=None, durable=False)
    s = pack_samples(make, range(30), tmp_path / "ds", opts, progress=False)
    assert s.records_written == 30 and s.shards == 5
    with pytest.raises(UsageError, match=r"PackOptions\(max_side=64, shuffle=True\): "
                                         r"pack_samples packs the samples fn returns"):
        pack_samples(make, range(3), tmp_path / "x", PackOptions(max_side=64, shuffle=True))
    with pytest.raises(UsageError, match=r"options must be a packer\.PackOptions, not dict"):
        pack_samples(make, range(3), tmp_path / "y", {"workers": 0})
    with pytest.raises(TypeError, match=r"pass packer\.PackOptions\(workers=0, durable=False\) "
                                        r"after dst"):
        pack_samples(make, range(3), tmp_path / "z", workers=0, durable=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'wrokers'"):
        pack_samples(make, range(3), tmp_path / "z", wrokers=0)
    with pytest.raises(UsageError, match=r"not set \(whose order is not defined: sort it\)"):
        pack_samples(make, {1, 2, 3}, tmp_path / "z", opts)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def slow_then_bad(i):
    import time

    if 60 <= i < 69:
        time.sleep(0.04)  # the range holding input 69 is the slower to fail
    if i in (69, 75):
        raise ValueError(f"bad input {i}")
    return {"x": i}


def test_the_bad_input_named_is_the_first_in_input_order_with_workers(tmp_path):
    with pytest.raises(PackInputError, match=r"input 69 \(69\)"):
        pack_fn(slow_then_bad, range(100), tmp_path / "ds", workers=2, task_records=10,
                     schema={"x": "int"}, **FAST)
