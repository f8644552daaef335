"""The node's cache folder ($SHARDPACK_CACHE) never kills or wedges a reader (issue 35).

Each case below is a module-level function that does what a user does with the
columns the cache holds: ``ds.index_of(key)`` for every key (the key index), a
Loader epoch with ``BudgetBatches(size="field:tokens")`` (the size column), and an
epoch of ``TokenBlocks`` (the token columns), each checked against the dataset. It
runs through ``tests/hostile.py`` in a child bounded in time and memory, with
``$SHARDPACK_CACHE`` pointing at the hostile folder. The tests assert: no signal
death, no raw traceback, no hang over 10 s, no file left outside the cache and the
dataset, and nothing half-written left in the cache.

A full disk is a real one where this machine lets a test mount a 64 KiB tmpfs (as
root), else that test is skipped with the reason; a second test simulates ENOSPC by
making ``os.posix_fallocate`` fail in the child, and runs everywhere. A read-only
folder is a tmpfs remounted read-only (root ignores permission bits), else a
``chmod 555`` folder when not root.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from hostile import mount_tmpfs, run_case, umount

from formats import DatasetWriter, Field, open_shards
from formats.shard import column_file, column_locks
from formats.shard.column_cache import columns_folder

MODULE = "test_hostile_cache"
SECONDS = 10.0
PEAK_MB = 512
RECORDS = 4000  # a key index of 64 KB: more than the full disk's free 40 KB
FIELDS = [Field("tokens", "ndarray", dtype="int32", shape=(None,)), Field("key", "str")]


def make(root: Path, n: int = RECORDS, scale: int = 1) -> Path:
    with DatasetWriter(root, FIELDS, records_per_shard=500, durable=False,
                       overwrite=True) as w:
        for i in range(n):
            w.write({"tokens": np.arange(1 + (i * scale) % 7, dtype=np.int32), "key": f"k{i}"})
    return root


# -- what users do (run in the child) ---------------------------------------------------

def use_columns(path: str, warned: str = "", keys: int = 200) -> None:
    """Look up keys, a BudgetBatches epoch and a TokenBlocks epoch, every answer checked;
    then the warnings: none when ``warned`` is empty, else exactly one that holds it."""
    from reader import Loader
    from reader.batching import BudgetBatches
    from reader.batching.tokens import TokenBlocks

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ds = open_shards(path)
        n = len(ds)
        for i in np.linspace(0, n - 1, min(keys, n)).astype(int).tolist():
            got = ds.index_of(f"k{i}")
            if got != i:
                raise AssertionError(f"index_of('k{i}') gave {got}")
        want = [len(ds[i]["tokens"]) for i in range(n)]
        seen = []
        spec = BudgetBatches(64, size="field:tokens", padded=False)
        with Loader(path, batch_sampler=spec, collate={"tokens": "ragged"}, num_workers=0,
                    fields=("tokens",), shuffle=True, seed=1, copy=True) as lo:
            for b in lo:
                seen += [len(t) for t in b["tokens"]]
        if sorted(seen) != sorted(want):
            raise AssertionError("BudgetBatches served other records than the dataset holds")
        with TokenBlocks(ds, 5, 16, shuffle=False) as tb:
            blocks = sum(len(np.atleast_2d(b)) for b in tb)
        if blocks != (sum(want) - 1) // 5:
            raise AssertionError(f"TokenBlocks served {blocks} blocks of {sum(want)} tokens")
    texts = [str(w.message) for w in said if issubclass(w.category, RuntimeWarning)]
    if not warned and texts:
        raise AssertionError(f"unexpected warnings: {texts}")
    if warned and (len(texts) != 1 or warned not in texts[0]
                   or ("$SHARDPACK_CACHE" not in texts[0] and warned != "damaged")):
        raise AssertionError(f"expected one warning with {warned!r}: {texts}")


def use_columns_without_fallocate(path: str) -> None:
    """:func:`use_columns` where every ``posix_fallocate`` reports a full disk (ENOSPC):
    the simulated full disk, for machines where no tmpfs can be mounted."""
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    os.posix_fallocate = full
    use_columns(path, warned="No space left on device")


def use_columns_logging_waits(path: str, warned: str) -> None:
    """:func:`use_columns`, with the lock wait's log message required too."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("formats.shard.column_cache").addHandler(handler)
    use_columns(path, warned=warned)
    if not any("waiting" in r.getMessage() for r in records):
        raise AssertionError("no log message while waiting for the held lock")


def damage_index_while_mapped(path: str) -> None:
    """Map the key index, then damage its body in place (the mapping sees it), then look up."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ds = open_shards(path)
        assert ds.index_of("k0") == 0
        folder = columns_folder(ds)
        for name, at in (("key-sorted-record", 8 * 100), ("key-sorted-hash", 8 * 300)):
            with open(folder / f"{name}.col", "r+b") as f:
                f.seek(column_file.HEADER.itemsize + at)
                f.write(b"\xff" * 16)  # a record number far out of range; hashes out of order
        for i in range(len(ds)):
            if ds.index_of(f"k{i}") != i:
                raise AssertionError(f"k{i} not found at {i}")
    if not any("damaged" in str(w.message) for w in said):
        raise AssertionError("the damage went unreported")


def too_large_to_map(path: str) -> None:
    """A column of 256 MB under an address-space limit of 64 MB more than is mapped now."""
    import resource

    from formats.shard.column_cache import mapped_column

    ds = open_shards(path)
    with open("/proc/self/statm") as f:
        vsize = int(f.read().split()[0]) * resource.getpagesize()
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (vsize + (64 << 20), hard))
    width = (256 << 20) // 8 // len(ds)
    mapped_column(ds, "huge", np.int64, lambda s: 0, width=width)


def hold_open(path: str, ready: str, go: str) -> None:
    """A reader of the old dataset: map its columns, say so, wait, map them again."""
    from reader.batching.batching import field_sizes

    ds = open_shards(path)
    assert ds.index_of("k3") == 3
    first = field_sizes(ds, "tokens")
    Path(ready).touch()
    deadline = time.monotonic() + 20
    while not Path(go).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if field_sizes(ds, "tokens").tolist() != first.tolist() or ds.index_of("k5") != 5:
        raise AssertionError("the old reader's columns changed")


def read_remote(path: str) -> None:
    """Every record of ``path`` read as a remote dataset (``file://``), through the shard
    cache in ``$SHARDPACK_CACHE``."""
    from reader.data.remote import RemoteDataset

    ds = RemoteDataset(Path(path).as_uri())
    for i in range(len(ds)):
        ds[i]


# -- the tests ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return make(tmp_path_factory.mktemp("hostile-cache") / "ds")


def _run(func: str, *args, cache: Path, timeout: float = SECONDS):
    outcome = run_case(MODULE, func, *args, timeout=timeout, env={"SHARDPACK_CACHE": str(cache)})
    assert outcome.kind == "ok", str(outcome)
    assert outcome.seconds < SECONDS and outcome.peak_mb < PEAK_MB, str(outcome)
    return outcome


def _left_behind(cache: Path) -> list[str]:
    """Files in ``cache`` that are neither a lock, nor a column file that loads."""
    out = []
    for p in cache.rglob("*"):
        if p.is_dir() or p.name in (".lock", ".inuse", "fill"):
            continue
        if p.suffix != ".col" or p.name.startswith("."):
            out.append(str(p))
            continue
        head = np.fromfile(p, column_file.HEADER, count=1)
        if not len(head):
            out.append(str(p))
            continue
        ndim = int(head["ndim"][0])
        shape = tuple(int(d) for d in head["shape"][0][:ndim])
        dtype = np.dtype(bytes(head["dtype"][0]).decode())
        try:
            column_file.load(p, shape, dtype)
        except column_file.Bad:
            out.append(str(p))
    return sorted(out)


def _outside(tmp: Path, allowed: set[str]) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name not in allowed)


@pytest.fixture
def tmpfs(tmp_path):
    """A 64 KiB tmpfs of the test's own (skipped where mount is not permitted)."""
    point = tmp_path / "mnt"
    if not mount_tmpfs(point, "64k"):
        pytest.skip("cannot mount a tmpfs here (not root, or mount not permitted): the "
                    "simulated full disk runs instead")
    yield point
    umount(point)


def _fill(point: Path, leave: int) -> None:
    """Fill ``point`` up to ``leave`` bytes free."""
    st = os.statvfs(point)
    free = st.f_bavail * st.f_frsize
    with open(point / "fill", "wb") as f:
        f.write(b"\0" * max(0, free - leave))


def _free(point: Path) -> int:
    st = os.statvfs(point)
    return st.f_bavail * st.f_frsize


def test_a_full_disk_falls_back_to_memory_with_one_warning(dataset, tmpfs, tmp_path):
    _fill(tmpfs, 40 << 10)  # room for the small columns' headers, not for the key index
    before = _free(tmpfs)
    _run("use_columns", str(dataset), "No space left on device", cache=tmpfs)
    assert _left_behind(tmpfs) == []
    kept = sum(p.stat().st_blocks * 512 for p in tmpfs.rglob("*.col"))  # those that fit
    assert _free(tmpfs) + kept >= before - 8192  # and the lock files at most
    assert _outside(tmp_path, {"mnt"}) == []


def test_a_simulated_full_disk_falls_back_to_memory_with_one_warning(dataset, tmp_path):
    cache = tmp_path / "cache"
    _run("use_columns_without_fallocate", str(dataset), cache=cache)
    assert _left_behind(cache) == []
    assert not list(cache.rglob("*.col"))


def test_a_read_only_cache_falls_back_and_its_columns_still_serve(dataset, tmp_path):
    cache = tmp_path / "ro"
    if mount_tmpfs(cache, "8m"):
        try:
            subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
            _run("use_columns", str(dataset), "Read-only file system", cache=cache)
            # columns built while it was writable serve read-only, with no warning
            subprocess.run(["mount", "-o", "remount,rw", str(cache)], check=True)
            _run("use_columns", str(dataset), cache=cache)
            subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
            _run("use_columns", str(dataset), cache=cache)
            assert _left_behind(cache) == []
        finally:
            umount(cache)
    elif os.geteuid() != 0:
        cache.mkdir()
        cache.chmod(0o555)
        _run("use_columns", str(dataset), "Permission denied", cache=cache)
    else:
        pytest.skip("root cannot mount a tmpfs here, and ignores permission bits")


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_cache_path_that_is_a_file_falls_back(dataset, tmp_path, where):
    (tmp_path / "f").write_bytes(b"not a folder")
    cache = tmp_path / "f" if where == "a file" else tmp_path / "f" / "cache"
    _run("use_columns", str(dataset), "is a file, not a folder", cache=cache)
    assert (tmp_path / "f").read_bytes() == b"not a folder"
    assert _outside(tmp_path, {"f"}) == []


def test_a_column_folder_deleted_mid_epoch(dataset, tmp_path):
    cache = tmp_path / "cache"
    _run("delete_mid_epoch", str(dataset), str(cache), cache=cache)
    assert _left_behind(cache) == []


def delete_mid_epoch(path: str, cache: str) -> None:
    """A BudgetBatches Loader (two workers) and TokenBlocks, the columns deleted after
    their first batch; then everything again (rebuilt)."""
    from reader import Loader
    from reader.batching import BudgetBatches
    from reader.batching.tokens import TokenBlocks

    spec = BudgetBatches(64, size="field:tokens", padded=False)
    with Loader(path, batch_sampler=spec, collate={"tokens": "ragged"}, num_workers=2,
                fields=("tokens",), seed=1, copy=True) as lo:
        n = 0
        for k, b in enumerate(lo):
            if k == 0:
                shutil.rmtree(Path(cache) / "columns")
            n += len(b["tokens"])
    assert n == RECORDS, n
    with TokenBlocks(path, 5, 16, shuffle=True) as tb:
        for k, _ in enumerate(tb):
            if k == 0:
                shutil.rmtree(Path(cache) / "columns")
    use_columns(path)


def test_a_corrupt_column_body_is_rebuilt_with_a_warning(dataset, tmp_path):
    cache = tmp_path / "cache"
    _run("use_columns", str(dataset), cache=cache)
    (size,) = cache.rglob("size-*.col")
    raw = bytearray(size.read_bytes())
    raw[column_file.HEADER.itemsize + 8 * 10] ^= 0x40  # record 10's size, header left valid
    size.write_bytes(bytes(raw))
    _run("use_columns", str(dataset), "damaged", cache=cache)
    assert _left_behind(cache) == []


@pytest.mark.parametrize("name", ["key-sorted-hash", "key-sorted-record"])
def test_a_corrupt_key_index_body_is_rebuilt_never_missing_a_key(dataset, tmp_path, name):
    cache = tmp_path / "cache"
    _run("use_columns", str(dataset), cache=cache)
    (path,) = cache.rglob(f"{name}.col")
    raw = bytearray(path.read_bytes())
    body = column_file.HEADER.itemsize
    raw[body + 8 * 1000:body + 8 * 1000 + 64] = b"\xff" * 64  # hashes, or records far out of range
    path.write_bytes(bytes(raw))
    _run("use_columns", str(dataset), "damaged", RECORDS, cache=cache)
    assert _left_behind(cache) == []


def test_a_key_index_damaged_while_mapped_is_rebuilt(dataset, tmp_path):
    _run("damage_index_while_mapped", str(dataset), cache=tmp_path / "cache")


def test_a_held_lock_is_waited_for_with_a_message_then_given_up(dataset, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("SHARDPACK_CACHE", str(cache))
    folder = columns_folder(open_shards(dataset))
    folder.mkdir(parents=True)
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held by a live process that builds nothing
        os.utime(fd, (time.time() - 60, time.time() - 60))
        out = _run("use_columns_logging_waits", str(dataset), "no sign of progress", cache=cache)
        assert column_locks.STALL_S <= out.seconds < SECONDS
    finally:
        os.close(fd)
    assert _left_behind(cache) == []


def test_too_large_to_map_is_a_typed_error_leaving_nothing(dataset, tmp_path):
    cache = tmp_path / "cache"
    outcome = run_case(MODULE, "too_large_to_map", str(dataset), timeout=SECONDS,
                       env={"SHARDPACK_CACHE": str(cache)})
    assert outcome.kind == "typed" and outcome.error == "CacheError", str(outcome)
    assert "too large" in outcome.message and "huge" in outcome.message
    assert _left_behind(cache) == []


def test_readers_of_an_old_and_a_new_dataset_keep_each_others_columns(tmp_path):
    path = make(tmp_path / "ds", n=600)
    cache = tmp_path / "cache"
    ready, go = tmp_path / "ready", tmp_path / "go"
    code = (f"import sys; sys.path[:0] = {[str(Path(__file__).parent), str(Path(__file__).parents[1]), str(Path(__file__).parents[2])]!r}; "
            f"import {MODULE} as m; m.hold_open({str(path)!r}, {str(ready)!r}, {str(go)!r})")
    old = subprocess.Popen([sys.executable, "-c", code], env={**os.environ,
                           "SHARDPACK_CACHE": str(cache)}, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and old.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), old.stderr.read() if old.poll() is not None else "not ready"
        (old_folder,) = [p for p in (cache / "columns").glob("*/*")]
        before = {p.name: p.stat().st_ino for p in old_folder.glob("*.col")}
        make(path, n=600, scale=2)  # rewritten in place, as pack-dataset --overwrite does
        _run("use_columns", str(path), cache=cache)
        assert old_folder.exists(), "the new dataset's reader deleted the old one's columns"
        go.touch()
        assert old.wait(30) == 0, old.stderr.read()
    finally:
        if old.poll() is None:
            old.kill()
    assert {p.name: p.stat().st_ino for p in old_folder.glob("*.col")} == before  # not rebuilt
    # the old reader gone, the next reader of the new dataset drops the old columns
    _run("use_columns", str(path), cache=cache)
    assert not old_folder.exists()
    assert len(list((cache / "columns").glob("*/*"))) == 1


def _remote_refused(dataset: Path, cache: Path, words: str) -> None:
    outcome = run_case(MODULE, "read_remote", str(dataset), timeout=SECONDS,
                       env={"SHARDPACK_CACHE": str(cache)})
    assert outcome.kind == "typed" and outcome.error == "CacheError", str(outcome)
    for said in (words, "$SHARDPACK_CACHE", str(cache), "no fallback to memory"):
        assert said in outcome.message, outcome.message


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_shard_cache_that_is_a_file_is_a_typed_error(dataset, tmp_path, where):
    (tmp_path / "f").write_bytes(b"not a folder")
    cache = tmp_path / "f" if where == "a file" else tmp_path / "f" / "cache"
    _remote_refused(dataset, cache, "is a file, not a folder")
    assert _outside(tmp_path, {"f"}) == []


def test_a_full_shard_cache_is_a_typed_error_leaving_nothing(dataset, tmpfs):
    _fill(tmpfs, 40 << 10)
    _remote_refused(dataset, tmpfs, "No space left on device")
    assert _left_behind(tmpfs) == []


def test_a_read_only_shard_cache_is_a_typed_error(dataset, tmp_path):
    cache = tmp_path / "ro"
    if not mount_tmpfs(cache, "1m", "ro"):
        pytest.skip("cannot mount a read-only tmpfs here")
    try:
        _remote_refused(dataset, cache, "Read-only file system")
    finally:
        umount(cache)
