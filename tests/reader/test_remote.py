"""Object storage end to end against a real S3 server on loopback (moto's server mode):
pack to it, read from it through a cache smaller than the dataset, survive a dropped
download, refuse a corrupted object, share one cache folder between processes."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers_packer import image_folder
from helpers_reader import CropPipeline, make_dataset
from helpers_s3 import DroppingProxy, new_bucket, s3_endpoint, s3_uri

import reader
from formats import StorageError, open_shards
from formats.shard.verify import ALL_MATCH
from formats.storage import Location, Retry, open_location
from formats.storage.cache import CacheOptions, ShardCache
from packer import PackOptions, pack
from packer.remote import open_remote_source
from reader import Loader, open_dataset
from reader.data.remote import RemoteDataset
from reader.options import SamplerOptions


@pytest.fixture(scope="module")
def endpoint():
    with s3_endpoint() as url:
        yield url


@pytest.fixture(scope="module")
def local_ds(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("local") / "ds", 200, records_per_shard=25)


def upload(folder: Path, uri: str) -> Location:
    loc = open_location(uri)
    for p in sorted(folder.iterdir()):
        loc.upload(p, p.name)
    return loc


@pytest.fixture(scope="module")
def remote_uri(endpoint, local_ds) -> str:
    uri = s3_uri(endpoint, new_bucket(endpoint), "ds")
    upload(local_ds, uri)
    return uri


def plain(record: dict) -> dict:
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in record.items()}


def shard_bytes(ds) -> int:
    e = ds.manifest.shards[0]
    return e.data_bytes + e.index_bytes


def test_random_access_through_a_cache_smaller_than_the_dataset(remote_uri, local_ds, tmp_path):
    local = open_shards(local_ds)
    cache = CacheOptions(tmp_path / "cache", max_bytes=int(shard_bytes(local) * 2.5))
    ds = open_dataset(remote_uri, cache=cache)
    assert len(ds) == len(local) and ds.max_open == 2
    rng = np.random.default_rng(0)
    for i in [*range(len(local)), *rng.integers(0, len(local), 100).tolist()]:
        assert plain(ds[i]) == plain(local[i])
    assert ds.cache.evictions > 0
    ds.close()
    assert ds.cache.usage() <= cache.max_bytes
    assert ds.metadata().equals(local.metadata())


def test_a_lookup_by_key_reads_metadata_tables_never_a_data_file(remote_uri, local_ds, tmp_path):
    ds = open_dataset(remote_uri, cache=CacheOptions(tmp_path / "cache"))
    assert not ds.local_files
    for i in (0, 77, 199):
        assert ds.index_of(f"k{i}") == i
    assert not ds.key_index().by_field  # a remote key field would download its shard
    assert not list((tmp_path / "cache").rglob("*.rec"))
    with pytest.raises(KeyError, match="close matches"):
        ds.index_of("k2000")
    assert not list((tmp_path / "cache").rglob("*.rec"))


def test_loader_over_s3_matches_local_and_second_epoch_is_warm(remote_uri, local_ds, tmp_path):
    cache = CacheOptions(tmp_path / "cache")
    kw = dict(batch_size=16, num_workers=2, shuffle="block", seed=3, copy=True,
              transform=CropPipeline())
    with Loader(local_ds, **kw) as a, Loader(remote_uri, cache=cache, monitor=reader.Monitor(3600),
                                             **kw) as b:
        for epoch in range(2):
            a.set_epoch(epoch)
            b.set_epoch(epoch)
            for x, y in zip(a, b, strict=True):
                assert x.keys() == y.keys()
                for k in x:
                    assert np.array_equal(np.asarray(x[k]), np.asarray(y[k])), k
            files = {p.name: p.stat().st_ino for p in b.dataset.root.glob("*.rec")}
            if epoch == 0:
                cold = files
        assert len(cold) == len(b.dataset.manifest.shards)
        assert b.stats()["current"]["storage"] == "remote"
        assert files == cold, "the warm epoch downloaded shards again"


def test_block_ranks_download_only_the_shards_they_read(remote_uri, local_ds, tmp_path):
    n_shards = len(open_shards(local_ds).manifest.shards)
    seen: list[int] = []
    for rank in range(2):
        cache = CacheOptions(tmp_path / f"cache{rank}", prefetch_shards=0)
        with Loader(remote_uri, batch_size=10, decode=False, cache=cache, shuffle="block",
                    seed=1, shuffle_window=10, rank=rank, world_size=2) as loader:
            for batch in loader:
                seen += batch["label"].tolist()
            got = loader.dataset.cache.downloads
        assert got <= n_shards // 2 + 1, "a rank fetched shards it never reads"
    assert sorted(seen) == list(range(200))


def test_rank_and_world_size_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert (SamplerOptions().rank, SamplerOptions().world_size) == (3, 4)
    assert SamplerOptions(rank=0, world_size=1).world_size == 1
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        SamplerOptions()


class FlakyFS:
    """The real S3 filesystem, but the first ``failures`` reads of ``.rec`` objects
    drop the connection half-way (an ``OSError`` after some bytes arrived)."""

    def __init__(self, fs, failures: int) -> None:
        self.fs = fs
        self.failures = failures

    def __getattr__(self, name):
        return getattr(self.fs, name)

    def open_input_stream(self, path):
        stream = self.fs.open_input_stream(path)
        if path.endswith(".rec") and self.failures > 0:
            self.failures -= 1
            return _Dropping(stream)
        return stream


class _Dropping:
    def __init__(self, stream) -> None:
        self.stream = stream
        self.sent = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stream.close()

    def read(self, n):
        if self.sent:
            raise ConnectionResetError("connection reset by peer (injected)")
        data = self.stream.read(min(n, 1000))
        self.sent += len(data)
        return data


def _flaky_location(uri: str, failures: int, attempts: int = 5) -> tuple:
    loc = open_location(uri)
    return FlakyFS(loc.fs, failures), loc.root, Retry(attempts=attempts, backoff=0.01)


def test_dropped_download_is_retried_and_never_used_half_done(remote_uri, local_ds, tmp_path):
    fs, root, retry = _flaky_location(remote_uri, failures=2)
    loc = Location(fs, root, remote_uri.split("?")[0], retry)
    cache = ShardCache(tmp_path / "cache")
    entry = open_shards(local_ds).manifest.shards[0]
    folder = cache.dataset_dir(loc.uri, b"m")
    pin = cache.acquire(loc, folder, entry)
    pin.release()
    assert fs.failures == 0, "both injected failures were met"
    assert (folder / entry.data_file).read_bytes() == (local_ds / entry.data_file).read_bytes()
    assert not list(folder.glob(".*tmp*")), "a partial download was left behind"


def test_download_that_keeps_failing_names_the_object_and_leaves_nothing(remote_uri, local_ds,
                                                                         tmp_path):
    fs, root, retry = _flaky_location(remote_uri, failures=10, attempts=3)
    loc = Location(fs, root, remote_uri.split("?")[0], retry)
    cache = ShardCache(tmp_path / "cache")
    entry = open_shards(local_ds).manifest.shards[1]
    folder = cache.dataset_dir(loc.uri, b"m")
    with pytest.raises(StorageError, match=r"shard-00001\.rec.*after 3 tries") as err:
        cache.acquire(loc, folder, entry)
    assert err.value.path.startswith("s3://")
    assert not cache.present(folder, entry)
    assert not list(folder.glob("*.rec")) and not list(folder.glob(".*tmp*"))


def test_corrupted_object_is_refused_with_its_name(endpoint, local_ds, tmp_path):
    uri = s3_uri(endpoint, new_bucket(endpoint), "bad")
    loc = upload(local_ds, uri)
    data = bytearray((local_ds / "shard-00002.rec").read_bytes())
    data[len(data) // 2] ^= 0xFF
    loc.write_bytes("shard-00002.rec", bytes(data))
    ds = open_dataset(uri, cache=CacheOptions(tmp_path / "cache"))
    assert ds[0]["label"] == 0  # the good shards read fine
    with pytest.raises(StorageError, match=r"shard-00002\.rec: object checksum differs"):
        ds[60]
    assert not ShardCache.present(ds.root, ds.manifest.shards[2])


def test_the_shard_table_is_fetched_checked_and_fetched_again_when_its_copy_went_bad(
        endpoint, local_ds, tmp_path):
    uri = s3_uri(endpoint, new_bucket(endpoint), "table")
    loc = upload(local_ds, uri)
    ds = open_dataset(uri, cache=CacheOptions(tmp_path / "cache"))
    cached = ds.root / "shards.arrow"
    assert cached.read_bytes() == (local_ds / "shards.arrow").read_bytes()
    ds.close()
    cached.write_bytes(cached.read_bytes()[:50])  # the cached copy damaged: fetched again
    ds = open_dataset(uri, cache=CacheOptions(tmp_path / "cache"))
    assert ds[len(ds) - 1]["label"] == open_shards(local_ds)[len(ds) - 1]["label"]
    ds.close()
    raw = bytearray((local_ds / "shards.arrow").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    loc.write_bytes("shards.arrow", bytes(raw))  # the stored table damaged: refused, named
    with pytest.raises(StorageError, match=r"shards\.arrow"):
        open_dataset(uri, cache=CacheOptions(tmp_path / "other"))


def test_truncated_and_missing_objects(endpoint, local_ds, tmp_path):
    uri = s3_uri(endpoint, new_bucket(endpoint), "cut")
    loc = upload(local_ds, uri)
    loc.write_bytes("shard-00001.idx", (local_ds / "shard-00001.idx").read_bytes()[:100])
    loc.delete("shard-00003.rec")
    ds = open_dataset(uri, cache=CacheOptions(tmp_path / "cache"))
    with pytest.raises(StorageError, match=r"shard-00001\.idx: object size differs"):
        ds[30]
    with pytest.raises(StorageError, match=r"shard-00003\.rec: download: no such object"):
        ds[80]
    with pytest.raises(StorageError, match=r"manifest\.json"):
        open_dataset(s3_uri(endpoint, new_bucket(endpoint), "nothing-here"),
                     cache=CacheOptions(tmp_path / "cache"))


def test_a_pinned_shard_is_never_evicted(remote_uri, tmp_path):
    folder = tmp_path / "cache"
    ds = open_dataset(remote_uri, cache=CacheOptions(folder))
    ds[0]  # shard 0 mapped and pinned: the only shard in the cache
    entry = ds.manifest.shards[0]
    other = ShardCache(folder, max_bytes=entry.data_bytes + entry.index_bytes)
    assert not other.make_room(1), "room was made by evicting a pinned shard"
    assert ShardCache.present(ds.root, entry)
    ds.close()  # unpinned: now it can go
    assert other.make_room(1)
    assert not ShardCache.present(ds.root, entry)


def _read_all(uri: str, folder: str, max_bytes: int, out) -> None:
    ds = open_dataset(uri, cache=CacheOptions(folder, max_bytes=max_bytes))
    labels = [int(ds[i]["label"]) for i in range(len(ds))]
    keys = [ds[i]["key"] for i in range(len(ds))]
    out.put((labels, keys, ds.cache.evictions, ds.cache.overflows))


def test_two_processes_share_one_small_cache(remote_uri, local_ds, tmp_path):
    bound = 5 * max(e.data_bytes + e.index_bytes for e in open_shards(local_ds).manifest.shards)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_read_all, args=(remote_uri, str(tmp_path / "cache"), bound, q))
             for _ in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    for labels, keys, _, overflows in results:
        assert labels == list(range(200)) and keys == [f"k{i}" for i in range(200)]
        assert overflows == 0  # 2 processes x 2 mapped shards always leave room for one more
    assert sum(r[2] for r in results) > 0, "8 shards through a 5-shard cache without evicting"
    assert ShardCache(tmp_path / "cache").usage() <= bound


def test_prefetch_runs_ahead_by_its_window_and_stops(remote_uri, tmp_path):
    ds = open_dataset(remote_uri, cache=CacheOptions(tmp_path / "cache", prefetch_shards=2))
    per = int(ds.starts[1])  # records per shard; batch = one shard
    batches = -(-len(ds) // per)
    fetcher = ds.prefetcher(lambda k: np.arange(k * per, min((k + 1) * per, len(ds))), batches, 0)
    present = lambda: sum(ShardCache.present(ds.root, e) for e in ds.manifest.shards)  # noqa: E731
    deadline = time.monotonic() + 20
    while present() < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    assert present() == 3, "batch 0's shard and the 2 after it, no more"
    fetcher.advance(4)  # batches 0..3 issued: shards up to 4 + 2 may come
    deadline = time.monotonic() + 20
    while present() < 7 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert present() == 7
    fetcher.close()
    assert not fetcher._thread.is_alive()
    assert not any(t.name.startswith("shardpack-fetch") for t in threading.enumerate())


def test_an_abandoned_raw_epoch_stops_its_prefetcher(remote_uri, tmp_path):
    with Loader(remote_uri, batch_size=5, decode=False,
                cache=CacheOptions(tmp_path / "cache", prefetch_shards=1)) as loader:
        for _ in range(2):
            it = iter(loader)
            next(it)
            del it
            gc.collect()
    assert not any(t.name.startswith("shardpack-") for t in threading.enumerate())


def _hold_for(seconds: float) -> None:
    time.sleep(seconds)


def test_a_forked_child_does_not_keep_a_download_lock(tmp_path):
    import fcntl

    from formats.storage.cache import _locked

    path = tmp_path / "x.dl"
    with _locked(path, fcntl.LOCK_EX):
        child = mp.get_context("fork").Process(target=_hold_for, args=(5,))
        child.start()
    try:
        fd = os.open(path, os.O_RDWR)
        try:
            deadline = time.monotonic() + 3  # the child may not have run its fork hook yet
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    assert time.monotonic() < deadline, "the forked child kept the lock"
                    time.sleep(0.01)
        finally:
            os.close(fd)
        assert child.is_alive()
    finally:
        child.terminate()
        child.join()


def test_pack_to_s3_and_back(endpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDPACK_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    image_folder(src, np.random.default_rng(0), per_class=6)
    dst = s3_uri(endpoint, new_bucket(endpoint), "packed")
    options = PackOptions(records_per_shard=4, workers=0, durable=False)
    summary = pack(src, dst, options)
    assert summary.complete and summary.records_written == 12
    pack(src, tmp_path / "local", options)
    local = open_shards(tmp_path / "local")
    remote = open_dataset(dst, cache=CacheOptions(tmp_path / "cache"))
    assert [plain(remote[i]) for i in range(12)] == [plain(local[i]) for i in range(12)]
    with pytest.raises(Exception, match="already a dataset"):
        pack(src, dst, options)
    from packer.cli import main

    assert main([str(src), dst, "--quiet"]) == 1  # found in DST: it is a dataset
    gone = s3_uri(endpoint, "no-such-bucket", "x")
    assert main([str(src), gone, "--quiet", "--records-per-shard", "4"]) == 1  # cannot write
    mine = {"notes.rec": b"mine", "part-1.pdf": b"%PDF", "shard-notes.idx": b"idx"}
    for name, data in mine.items():  # a user's objects beside the dataset
        open_location(dst).write_bytes(name, data)
    pack(src, dst, PackOptions(records_per_shard=6, workers=0, durable=False, overwrite=True))
    names = {f.name for f in open_location(dst).list_files()}
    assert "shard-00002.rec" not in names, "--overwrite left the old dataset's shards behind"
    for name, data in mine.items():  # never deleted: no manifest listed them
        assert open_location(dst).read_bytes(name, 100) == data
    assert len(open_dataset(dst, cache=CacheOptions(tmp_path / "cache"))) == 12


def test_pack_from_an_image_folder_on_s3(endpoint, tmp_path):
    src = tmp_path / "src"
    image_folder(src, np.random.default_rng(1), per_class=5)
    (src / "cat" / "broken.jpg").write_bytes(b"not an image")
    uri = s3_uri(endpoint, new_bucket(endpoint), "images")
    loc = open_location(uri)
    for p in sorted(src.rglob("*")):
        if p.is_file():
            loc.upload(p, p.relative_to(src).as_posix())
    options = PackOptions(records_per_shard=4, workers=0, durable=False, on_error="skip")
    remote = pack(uri, tmp_path / "from-s3", options)
    local = pack(src, tmp_path / "from-disk", options)
    assert (remote.records_written, dict(remote.skipped)) == (local.records_written,
                                                              dict(local.skipped))
    a, b = open_shards(tmp_path / "from-s3"), open_shards(tmp_path / "from-disk")
    assert a.classes == b.classes
    assert [plain(a[i]) for i in range(len(a))] == [plain(b[i]) for i in range(len(b))]


def test_inspect_shards_reads_a_remote_dataset(remote_uri, local_ds, tmp_path, monkeypatch,
                                               capsys):
    from reader.inspect.cli import main

    monkeypatch.setenv("SHARDPACK_CACHE", str(tmp_path / "cache"))
    for command in (["info"], ["ls", "--limit", "3"], ["show", "57"], ["stats"]):
        assert main([remote_uri, *command, "--json"]) == 0, command
        remote = capsys.readouterr().out
        assert main([str(local_ds), *command, "--json"]) == 0
        local = capsys.readouterr().out
        if command != ["info"]:  # info names the folder it read
            assert remote == local, command
    assert main([remote_uri, "verify", "--quiet"]) == 0
    assert ALL_MATCH in capsys.readouterr().out
    out = tmp_path / "img.jpg"
    assert main([remote_uri, "extract", "57", "--field", "image", "--out", str(out)]) == 0
    assert out.read_bytes() == bytes(open_shards(local_ds)[57]["image"])


def test_connection_reset_mid_download_is_survived(endpoint, remote_uri, local_ds, tmp_path):
    proxy = DroppingProxy(endpoint)
    try:
        uri = remote_uri.replace(endpoint.split("://")[1], proxy.endpoint.split("://")[1])
        ds = open_dataset(uri, cache=CacheOptions(tmp_path / "cache"))
        proxy.armed = 3
        got = [plain(ds[i]) for i in range(0, 200, 7)]
        assert proxy.dropped >= 1, "no connection was reset: the test tested nothing"
        local = open_shards(local_ds)
        assert got == [plain(local[i]) for i in range(0, 200, 7)]
        assert not list(ds.root.glob(".*tmp*"))
    finally:
        proxy.close()


def test_uris_shown_without_secrets_and_file_uris_are_paths(tmp_path):
    from formats.storage import display_uri

    assert display_uri("s3://AK:SECRET@bkt/ds/x?endpoint_override=h:9&scheme=http") == \
        "s3://bkt/ds/x"
    # AWS secrets may hold "/": the userinfo must still go, whole.
    assert display_uri("s3://AK:SE/CR/ET@bkt/ds") == "s3://bkt/ds"
    assert display_uri("s3://token@bkt/ds") == "s3://bkt/ds"
    # An "@" in an object's name, or a port, is not userinfo.
    assert display_uri("s3://bkt/me@home.jpg") == "s3://bkt/me@home.jpg"
    assert display_uri("hdfs://nn:8020/a/b@c") == "hdfs://nn:8020/a/b@c"
    assert display_uri(tmp_path) == str(tmp_path)
    (tmp_path / "a.txt").write_bytes(b"hi")
    assert open_location(f"file://{tmp_path}").read_bytes("a.txt", 10) == b"hi"
    with pytest.raises(Exception, match="unsafe object name"):
        open_location(tmp_path).path("../etc/passwd")


def test_a_remote_folder_lists_and_detects_like_a_local_one(endpoint, tmp_path):
    from packer.resolve import detect_builtin, list_source
    from packer.sources.folders import detect_remote, list_remote

    src = tmp_path / "src"
    for name in ("a/x.jpg", "a-c.jpg", "a.b/y.jpg", "README.md"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(b"\xff\xd8\xff")
    loc = open_location(s3_uri(endpoint, new_bucket(endpoint), "tree"))
    for f in sorted(src.rglob("*")):
        if f.is_file():
            loc.upload(f, f.relative_to(src).as_posix())

    def names():
        return [f.name for f in loc.list_files()]

    assert detect_remote(names()) == detect_builtin(src) == "files"
    assert list_remote("files", loc).keys == list_source("files", src).keys
    (src / "a-c.jpg").unlink()
    loc.delete("a-c.jpg")
    assert detect_remote(names()) == detect_builtin(src) == "imagefolder"  # README: no image
    remote, local = list_remote("imagefolder", loc), list_source("imagefolder", src)
    assert (remote.keys, remote.classes, remote.columns) == (local.keys, local.classes,
                                                             local.columns)


def test_storage_that_keeps_failing_stops_a_pack_instead_of_skipping(remote_uri, tmp_path):
    from packer.work import WorkOptions, load

    fs, root, retry = _flaky_location(remote_uri, failures=0, attempts=2)
    good = WorkOptions(location=Location(fs, root, "s3://x", retry))
    assert load("no-such-file.jpg", good).kind == "missing"
    down = WorkOptions(location=Location(_Down(), root, "s3://x", retry))
    with pytest.raises(StorageError, match="after 2 tries"):
        load("shard-00000.rec", down)


class _Down:
    def open_input_stream(self, path):
        raise ConnectionRefusedError("connection refused (injected)")


def test_resume_refuses_a_staged_pack_of_another_source(endpoint, tmp_path, monkeypatch):
    from packer import PackError
    from packer.remote import staging_folder

    monkeypatch.setenv("SHARDPACK_CACHE", str(tmp_path / "cache"))
    for name in ("a", "b"):
        image_folder(tmp_path / name, np.random.default_rng(len(name)), per_class=2)
    dst = s3_uri(endpoint, new_bucket(endpoint), "staged")
    options = PackOptions(workers=0, durable=False)
    pack(tmp_path / "a", staging_folder(dst), options)  # as if killed while publishing
    with pytest.raises(PackError, match="another source"):
        pack(tmp_path / "b", dst, PackOptions(workers=0, durable=False, resume=True))
    summary = pack(tmp_path / "a", dst, PackOptions(workers=0, durable=False, resume=True))
    assert summary.complete and summary.records_written == 4
    assert len(open_dataset(dst, cache=CacheOptions(tmp_path / "cache"))) == 4


def test_two_packs_to_one_destination_do_not_share_its_staging_folder(endpoint, tmp_path,
                                                                      monkeypatch):
    from formats.files import try_lock
    from packer import PackError
    from packer.remote import staging_folder

    monkeypatch.setenv("SHARDPACK_CACHE", str(tmp_path / "cache"))
    image_folder(tmp_path / "a", np.random.default_rng(9), per_class=2)
    dst = s3_uri(endpoint, new_bucket(endpoint), "busy")
    stage = staging_folder(dst)
    stage.parent.mkdir(parents=True)
    other = try_lock(stage.with_name(stage.name + ".lock"))  # the other pack, running
    options = PackOptions(workers=0, durable=False)
    try:
        with pytest.raises(PackError, match="another pack to this DST"):
            pack(tmp_path / "a", dst, options)
    finally:
        os.close(other)
    assert pack(tmp_path / "a", dst, options).records_written == 4


def _upload_tree(folder: Path, uri: str) -> None:
    loc = open_location(uri)
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            loc.upload(f, f.relative_to(folder).as_posix())


@pytest.mark.parametrize("to", ["parquet", "webdataset"])
def test_pack_a_container_format_from_s3(endpoint, tmp_path, monkeypatch, to):
    monkeypatch.setenv("SHARDPACK_CACHE", str(tmp_path / "cache"))
    image_folder(tmp_path / "img", np.random.default_rng(3), per_class=4)
    fast = dict(workers=0, durable=False)
    pack(tmp_path / "img", tmp_path / to, PackOptions(sink=to, records_per_shard=3, **fast))
    uri = s3_uri(endpoint, new_bucket(endpoint), to)
    _upload_tree(tmp_path / to, uri)
    # Told by the names alone (as the Ray engine asks, to refuse it): nothing fetched.
    assert open_remote_source(uri, PackOptions(), copy=False) == (to, None, None)
    assert not (tmp_path / "cache" / "sources").exists()
    remote = pack(uri, tmp_path / "from-s3", PackOptions(**fast))
    local = pack(tmp_path / to, tmp_path / "from-disk", PackOptions(**fast))
    assert remote.source == local.source == to
    a, b = open_shards(tmp_path / "from-s3"), open_shards(tmp_path / "from-disk")
    assert len(a) == 8 and [plain(a[i]) for i in range(8)] == [plain(b[i]) for i in range(8)]
    copies = tmp_path / "cache" / "sources"
    assert not any(p.is_dir() for p in copies.iterdir()), "the fetched copy was kept"


def test_pack_from_a_file_list_on_s3(endpoint, tmp_path):
    image_folder(tmp_path / "img", np.random.default_rng(4), per_class=3)
    rows = "path,label,weight\n" + "".join(
        f"{c}/{i:03d}.jpg,{c},{i / 2}\n" for c in ("dog", "cat") for i in range(3))
    (tmp_path / "img" / "list.csv").write_text(rows)
    uri = s3_uri(endpoint, new_bucket(endpoint), "listed")
    _upload_tree(tmp_path / "img", uri)
    list_uri = uri.replace("/listed?", "/listed/list.csv?")
    fast = PackOptions(workers=0, durable=False)
    remote = pack(list_uri, tmp_path / "from-s3", fast)
    local = pack(tmp_path / "img" / "list.csv", tmp_path / "from-disk", fast)
    assert remote.source == local.source == "filelist"
    a, b = open_shards(tmp_path / "from-s3"), open_shards(tmp_path / "from-disk")
    assert (a.fields, a.classes) == (b.fields, b.classes)
    assert [plain(a[i]) for i in range(6)] == [plain(b[i]) for i in range(6)]


def test_a_remote_file_list_naming_an_object_outside_its_folder_is_refused(endpoint,
                                                                           tmp_path):
    from formats.errors import InputError

    uri = s3_uri(endpoint, new_bucket(endpoint), "listed")
    open_location(uri).write_bytes("list.csv", b"path,label\nok.jpg,1\n../secret.jpg,2\n")
    list_uri = uri.replace("/listed?", "/listed/list.csv?")
    with pytest.raises(InputError, match="beside the list") as e:
        pack(list_uri, tmp_path / "out", PackOptions(workers=0, durable=False))
    assert e.value.record == 1 and "/listed/list.csv" in str(e.value)
    assert "?" not in str(e.value)  # the URI is shown without its query
    assert not (tmp_path / "out").exists()


def test_a_remote_folder_is_listed_once_per_pack(endpoint, tmp_path, monkeypatch):
    image_folder(tmp_path / "img", np.random.default_rng(5), per_class=2)
    uri = s3_uri(endpoint, new_bucket(endpoint), "img")
    _upload_tree(tmp_path / "img", uri)
    calls = []
    real = Location.list_files
    monkeypatch.setattr(Location, "list_files", lambda self: calls.append(1) or real(self))
    summary = pack(uri, tmp_path / "out", PackOptions(workers=0, durable=False))
    assert summary.records_written == 4 and len(calls) == 1


def test_a_destination_that_refuses_deletes_still_takes_a_pack(endpoint, tmp_path, caplog):
    from packer.remote import _probe

    class NoDelete(Location):
        def delete(self, name):
            raise StorageError("delete failed (ACCESS_DENIED)", path=self.uri_of(name))

    loc = open_location(s3_uri(endpoint, new_bucket(endpoint), "wo"))
    with caplog.at_level("WARNING", logger="shardpack.packer"):
        _probe(NoDelete(loc.fs, loc.root, loc.uri, loc.retry))
    assert "cannot delete the empty object" in caplog.text


@pytest.mark.parametrize("read", ["record", "payload", "get"])
def test_the_least_recently_read_shard_is_the_one_unmapped(remote_uri, tmp_path, read):
    ds = RemoteDataset(remote_uri, cache=CacheOptions(tmp_path / "cache"), max_open=2)
    field = ds.fields[0].name
    fetch = {"record": ds.__getitem__, "payload": lambda i: ds.payload(i, field),
             "get": lambda i: ds.get(i, field)}[read]
    per = int(ds.starts[1])
    for i in (0, per, 1, 2 * per):  # shards 0, 1, 0 again, then 2
        fetch(i)
    assert [s is not None for s in ds.shards[:3]] == [True, False, True]
    ds.close()
