"""formats.shard.column_cache: per-record columns built once per node, mapped by every process."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import time
import warnings

import numpy as np
import pytest

from formats import DatasetWriter, Field, open_shards
from formats.shard import column_cache, column_file, column_locks
from formats.shard.column_cache import columns_folder, mapped_column
from reader.batching.batching import field_sizes, known_image_sizes


def _write(root, n=10, per_shard=4, scale=1):
    fields = [Field("tokens", "ndarray", dtype="int32", shape=(None,)), Field("n", "int")]
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=per_shard,
                       durable=False, overwrite=True) as w:
        for i in range(n):
            w.write({"tokens": np.arange(i * scale, dtype=np.int32), "n": i},
                    meta={"width": 10 + i, "height": 20 + i})
    return open_shards(root)


def test_a_column_is_built_once_and_mapped_read_only(tmp_path):
    ds = _write(tmp_path / "ds")
    calls = []

    def per_shard(s):
        calls.append(s)
        return np.full(int(ds.starts[s + 1] - ds.starts[s]), s, np.int64)

    a = mapped_column(ds, "shard_of", np.int64, per_shard)
    b = mapped_column(ds, "shard_of", np.int64, per_shard)
    assert calls == [0, 1, 2]  # once per shard, on the first call only
    assert a.tolist() == b.tolist() == [0] * 4 + [1] * 4 + [2] * 2
    assert isinstance(a, np.memmap) and not a.flags.writeable  # mapped, not copied
    assert str(columns_folder(ds)).startswith(os.environ["SHARDPACK_CACHE"])


def test_sizes_come_from_the_columns_and_equal_what_the_shards_say(tmp_path):
    ds = _write(tmp_path / "ds")
    hw = known_image_sizes(ds)
    assert hw.tolist() == [[20 + i, 10 + i] for i in range(10)]
    assert field_sizes(ds, "tokens").tolist() == list(range(10))
    assert field_sizes(ds, "n").tolist() == list(range(10))
    names = sorted(p.name for p in columns_folder(ds).iterdir() if p.suffix == ".col")
    assert len(names) == 3 and "image_hw.col" in names


def test_a_dataset_rewritten_in_place_gets_new_columns_and_the_old_go(tmp_path):
    ds = _write(tmp_path / "ds")
    assert field_sizes(ds, "tokens").tolist() == list(range(10))
    old = columns_folder(ds)
    ds.close()
    ds = _write(tmp_path / "ds", scale=2)  # the same path, other records
    assert field_sizes(ds, "tokens").tolist() == [2 * i for i in range(10)]
    assert columns_folder(ds) != old and not old.exists()


def test_a_damaged_column_file_is_rebuilt(tmp_path):
    ds = _write(tmp_path / "ds")
    field_sizes(ds, "n")
    (path,) = columns_folder(ds).glob("size-*.col")
    path.write_bytes(path.read_bytes()[:100])  # truncated
    with pytest.warns(RuntimeWarning, match="damaged .*100 bytes.*: rebuilding it"):
        assert field_sizes(ds, "n").tolist() == list(range(10))


def _build_in_child(root, out, go):
    ds = open_shards(root)
    go.wait()

    def per_shard(s):
        with open(out, "a") as f:
            f.write(f"{os.getpid()} {s}\n")
        time.sleep(0.05)
        return np.arange(ds.starts[s], ds.starts[s + 1], dtype=np.int64)

    col = mapped_column(ds, "positions", np.int64, per_shard)
    assert col.tolist() == list(range(len(ds)))


def test_one_process_builds_while_the_others_wait(tmp_path):
    ds = _write(tmp_path / "ds")
    ctx = mp.get_context("fork")
    go = ctx.Event()
    out = tmp_path / "calls.txt"
    procs = [ctx.Process(target=_build_in_child, args=(ds.root, out, go)) for _ in range(3)]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    lines = out.read_text().split()
    assert len(lines) == 2 * 3 and len(set(lines[0::2])) == 1  # three shards, one builder


def test_a_failing_build_writes_nothing(tmp_path):
    ds = _write(tmp_path / "ds")

    def per_shard(s):
        if s == 2:
            raise ValueError("bad shard")
        return np.zeros(4, np.int64)

    with pytest.raises(ValueError, match="bad shard"):
        mapped_column(ds, "broken", np.int64, per_shard)
    assert not list(columns_folder(ds).glob("*broken*"))


def _build_slowly(root, out, started):
    ds = open_shards(root)

    def per_shard(s):
        started.set()
        with open(out, "a") as f:
            f.write(f"{os.getpid()} {s}\n")
        time.sleep(0.4)
        return np.arange(ds.starts[s], ds.starts[s + 1], dtype=np.int64)

    mapped_column(ds, "slow", np.int64, per_shard)


def test_a_builder_that_shows_progress_is_waited_for_past_the_stall_bound(tmp_path, monkeypatch):
    # The stall bound (0.3 s) is shorter than the build (1.2 s); the heartbeat (0.05 s) is not.
    monkeypatch.setattr(column_locks, "STALL_S", 0.3)
    monkeypatch.setattr(column_locks, "LOG_AFTER_S", 0.1)
    monkeypatch.setattr(column_locks, "_BEAT_S", 0.05)
    ds = _write(tmp_path / "ds")
    out = tmp_path / "calls.txt"
    ctx = mp.get_context("fork")  # the patched bounds go with it
    started = ctx.Event()
    builder = ctx.Process(target=_build_slowly, args=(ds.root, out, started))
    builder.start()
    try:
        assert started.wait(30)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback, no rebuild
            col = mapped_column(ds, "slow", np.int64, lambda s: 1 / 0)  # never called here
        assert col.tolist() == list(range(10))
    finally:
        builder.join(30)
    assert builder.exitcode == 0
    assert {line.split()[0] for line in out.read_text().splitlines()} == {str(builder.pid)}


def test_no_room_for_the_key_index_scratch_falls_back_and_leaves_nothing(tmp_path, monkeypatch):
    real = column_file.reserve

    def reserve(path, shape, dtype):
        if "key-unsorted" in path.name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, shape, dtype)

    monkeypatch.setattr(column_file, "reserve", reserve)
    monkeypatch.setattr(column_cache, "_warned", set())
    with DatasetWriter(tmp_path / "ds", [Field("key", "str")], records_per_shard=4,
                       durable=False) as w:
        for i in range(10):
            w.write({"key": f"k{i}"})
    ds = open_shards(tmp_path / "ds")
    with pytest.warns(RuntimeWarning, match=r"No space left.*\$SHARDPACK_CACHE"):
        assert ds.index_of("k3") == 3
    assert sorted(p.name for p in columns_folder(ds).iterdir()) == [".inuse", ".lock"]
