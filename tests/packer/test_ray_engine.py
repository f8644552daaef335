"""``--engine ray`` on a local 2-CPU Ray cluster: same records as the local engine,
retries, failures, resume, the command line."""

from __future__ import annotations

import json
import logging
import os

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'shardpack[ray]'")

import formats  # noqa: E402
from packer import (  # noqa: E402
    PackInputError,
    PackInterrupted,
    PackOptions,
    PackProgress,
    UsageError,
    pack,
)
from packer.cli import main  # noqa: E402
from packer.work_names import STATE_DIR, marker_name, part_name  # noqa: E402
from tests.helpers_packer import dataset_files, image_folder, jpeg  # noqa: E402
from tests.helpers_s3 import CREDENTIALS, moto_server, new_bucket, s3_uri  # noqa: E402

FAST = {"durable": False, "workers": 0}


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """One local cluster for the module: starting Ray costs seconds. Workers take
    the environment at start, so the local S3 server's test credentials go in now."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in CREDENTIALS.items():
            mp.setenv(k, v)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR)
        yield
        ray.shutdown()


def local(**kw) -> PackOptions:
    return PackOptions(**{**FAST, **kw})


def on_ray(**kw) -> PackOptions:
    return PackOptions(**{**FAST, "engine": "ray", **kw})


def _value(v):
    return bytes(v) if isinstance(v, memoryview) else v


def assert_same_records(a_path, b_path) -> None:
    """Every field of every record, the metadata table, the schema and the classes."""
    a, b = formats.open_shards(a_path), formats.open_shards(b_path)
    assert (a.fields, a.classes, len(a)) == (b.fields, b.classes, len(b))
    for i in range(len(a)):
        ra, rb = a[i], b[i]
        assert {k: _value(v) for k, v in ra.items()} == {k: _value(v) for k, v in rb.items()}, i
    assert a.metadata().equals(b.metadata())
    assert formats.verify_dataset(b_path) == []


def corpus(root, rng, per_class=40, bad=()):
    files = image_folder(root, rng, classes=("cat", "dog", "emu"), per_class=per_class)
    for key, data in bad:
        (root / key).write_bytes(data)
    return files


class Counting(PackProgress):
    def __init__(self):
        self.total = self.done = self.bytes = 0

    def start(self, total, done=0):
        self.total, self.done = total, done

    def advance(self, records, nbytes):
        self.done += records
        self.bytes += nbytes


@pytest.mark.parametrize("shuffle", [False, True])
def test_same_records_as_local_engine(tmp_path, rng, shuffle):
    src = tmp_path / "src"
    corpus(src, rng, bad=[("dog/bad.jpg", b""), ("emu/x.jpg", b"not an image")])
    kw = {"records_per_shard": 7, "on_error": "skip", "shuffle": shuffle, "seed": 5}
    here = pack(src, tmp_path / "local", local(**kw))
    bar = Counting()
    there = pack(src, tmp_path / "ray", on_ray(task_records=25, **kw), bar)
    assert_same_records(tmp_path / "local", tmp_path / "ray")
    for k in ("records_in", "records_written", "skipped", "bytes_in", "complete"):
        assert getattr(there, k) == getattr(here, k), k
    assert there.records_skipped == 2
    assert (tmp_path / "ray" / "skipped.jsonl").read_bytes() == \
        (tmp_path / "local" / "skipped.jsonl").read_bytes()
    # The driver's bar counted every input the tasks did, once.
    assert (bar.total, bar.done, bar.bytes) == (122, 122, here.bytes_in)
    ds = formats.open_shards(tmp_path / "ray")
    assert [s.name for s in ds.manifest.shards][:5] == [
        part_name(0, 0), part_name(0, 1), part_name(0, 2), part_name(0, 3), part_name(25, 0)]
    opts = ds.manifest.created_by["options"]
    assert (opts["engine"], opts["task_records"]) == ("ray", 25)
    assert not (tmp_path / "ray" / STATE_DIR).exists()


def test_file_list_source(tmp_path, rng):
    (tmp_path / "img").mkdir()
    rows = []
    for i in range(30):
        (tmp_path / "img" / f"{i}.jpg").write_bytes(jpeg(rng))
        rows.append({"path": f"img/{i}.jpg", "label": ["a", "b"][i % 2], "score": i / 4})
    src = tmp_path / "list.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pack(src, tmp_path / "local", local())
    s = pack(src, tmp_path / "ray", on_ray(task_records=8))
    assert s.records_written == 30 and s.shards == 4
    assert_same_records(tmp_path / "local", tmp_path / "ray")


def dying_once(marker):
    """A stand-in for the engine's Ray task (``packer.engines.ray._pack_range``) whose
    worker dies halfway through its range, in the first task to create ``marker``
    (O_EXCL); every other task packs as the engine's own does. Built in a function, so
    Ray ships it by value: the workers never import this test module."""
    import packer.engines.ray as engine

    path = str(marker)

    class Dying(engine._RangeProgress):
        armed = True

        def advance(self, records, nbytes):
            super().advance(records, nbytes)
            if self.armed and 2 * self.records >= self.n:
                self.armed = False
                try:
                    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    return
                os._exit(1)  # the worker process dies mid-range, as a killed one does

    def task(job, listing, start, tally):
        return engine.pack_range(job, listing, start, Dying(tally, start, len(listing)))

    return task


def test_killed_worker_is_retried(tmp_path, rng, monkeypatch):
    import packer.engines.ray

    src = tmp_path / "src"
    corpus(src, rng, per_class=100)
    marker = tmp_path / "killed-once"
    monkeypatch.setattr(packer.engines.ray, "_pack_range", dying_once(marker))
    s = pack(src, tmp_path / "ray", on_ray(task_records=100, records_per_shard=30))
    assert marker.exists(), "no task was killed: the stand-in task did not run"
    assert s.complete and s.records_written == 300
    pack(src, tmp_path / "local", local(records_per_shard=30))
    assert_same_records(tmp_path / "local", tmp_path / "ray")


def test_bad_input_fails_naming_it_then_resume_skips_it(tmp_path, rng):
    src = tmp_path / "src"
    corpus(src, rng, per_class=20, bad=[("emu/zz-bad.jpg", b"\xff\xd8\xff junk")])
    dst = tmp_path / "ray"
    kw = {"task_records": 15, "records_per_shard": 4}
    # One task at a time, so every range before the bad file's is done for sure.
    with pytest.raises(PackInputError, match="corrupt") as e:
        pack(src, dst, on_ray(workers=1, **kw))
    assert e.value.path.endswith("zz-bad.jpg")
    assert not (dst / "manifest.json").exists()
    done = sorted(p.name for p in (dst / STATE_DIR).glob("range-*.json"))
    assert len(done) == 4  # records 0..59; the bad one is record 60, in the last range
    # Lose one finished range: its marker and its shards.
    (dst / marker_name(15, 30)).unlink()
    for p in dst.glob(f"{part_name(15, 0)[:-6]}*"):
        p.unlink()
    with pytest.raises(formats.ShardpackError, match="cannot resume"):
        pack(src, dst, on_ray(resume=True, on_error="skip", task_records=16,
                              records_per_shard=4))
    s = pack(src, dst, on_ray(resume=True, on_error="skip", **kw))
    assert s.resumed_records == 45 and s.records_in == 61 and s.records_skipped == 1
    pack(src, tmp_path / "full", on_ray(on_error="skip", **kw))
    assert dataset_files(dst) == dataset_files(tmp_path / "full")
    assert not (dst / STATE_DIR).exists()


class _CtrlC(Counting):
    """Ctrl-C on the driver once the bar passes ``n`` records."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def advance(self, records, nbytes):
        super().advance(records, nbytes)
        if self.done >= self.n:
            raise KeyboardInterrupt


def test_ctrl_c_then_resume(tmp_path, rng):
    src = tmp_path / "src"
    corpus(src, rng, per_class=20)
    dst = tmp_path / "ray"
    kw = {"task_records": 10, "records_per_shard": 3, "workers": 1}
    with pytest.raises(PackInterrupted) as e:
        pack(src, dst, on_ray(**kw), _CtrlC(25))
    assert not e.value.summary.complete and e.value.summary.shards >= 8  # 2 ranges, 4 each
    assert not (dst / "manifest.json").exists()
    s = pack(src, dst, on_ray(resume=True, **kw))
    assert s.complete and s.resumed_records >= 20 and s.records_written == 60
    pack(src, tmp_path / "full", on_ray(**kw))
    assert dataset_files(dst) == dataset_files(tmp_path / "full")


def test_command_line(tmp_path, rng, capsys):
    src = tmp_path / "src"
    corpus(src, rng, per_class=10)
    dst = tmp_path / "out"
    assert main([str(src), str(dst), "--quiet", "--workers", "0"]) == 0  # a local dataset
    args = [str(src), str(dst), "--engine", "ray", "--task-records", "12", "--json"]
    assert main(args) == 1  # already a dataset: found in DST
    assert "--overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["complete"] and out["records_written"] == 30 and out["shards"] == 3
    assert not list(dst.glob("shard-*")), "the local pack's shards were left behind"
    pack(src, tmp_path / "local", local())
    assert_same_records(tmp_path / "local", dst)

    assert main([str(src), str(tmp_path / "x"), "--ray-address", "127.0.0.1:1"]) == 2
    assert "--engine ray" in capsys.readouterr().err
    assert main([str(dst), str(tmp_path / "y"), "--from", "shards", "--engine", "ray"]) == 2
    assert "--engine local" in capsys.readouterr().err


def test_codec_sources_and_sinks_are_refused(tmp_path, rng):
    src = tmp_path / "src"
    corpus(src, rng, per_class=2)
    with pytest.raises(UsageError, match="--engine local"):
        pack(src, tmp_path / "a", on_ray(source="tfrecord"))
    with pytest.raises(UsageError, match="--to shards only"):
        pack(src, tmp_path / "b", on_ray(sink="webdataset"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_worker_dying_every_try_fails_naming_the_range(tmp_path, rng, monkeypatch):
    import packer.engines.ray

    src = tmp_path / "src"
    corpus(src, rng, per_class=10)
    monkeypatch.setattr(packer.engines.ray, "_pack_range", dying_once(tmp_path / "killed"))
    monkeypatch.setattr(packer.engines.ray, "MAX_RETRIES", 0)  # the one death is final
    with pytest.raises(formats.ShardpackError, match=r"records 0\.\.29 failed for good") as e:
        pack(src, tmp_path / "ray", on_ray())
    assert "cat/000.jpg" in str(e.value) and "emu/009.jpg" in str(e.value)
    assert not (tmp_path / "ray" / "manifest.json").exists()


def test_destination_on_object_storage(tmp_path, rng):
    from formats.storage import open_location

    src = tmp_path / "src"
    corpus(src, rng, per_class=10, bad=[("cat/empty.jpg", b"")])
    with moto_server() as endpoint:
        uri = s3_uri(endpoint, new_bucket(endpoint), "ds")
        s = pack(src, uri, on_ray(task_records=12, records_per_shard=5, on_error="skip"))
        assert s.complete and s.records_written == 30 and s.records_skipped == 1
        location = open_location(uri)
        names = [f.name for f in location.list_files()]
        assert not [n for n in names if n.startswith(STATE_DIR)]
        for n in names:  # the tasks uploaded their shards; the driver the rest
            location.download(n, tmp_path / n)
        # And the source on object storage too: tasks read their objects themselves.
        images = s3_uri(endpoint, new_bucket(endpoint), "images")
        store = open_location(images)
        for f in sorted(src.rglob("*")):
            if f.is_file():
                store.upload(f, f.relative_to(src).as_posix())
        s = pack(images, tmp_path / "from-s3", on_ray(task_records=12, on_error="skip"))
        assert s.records_written == 30 and s.records_skipped == 1
    pack(src, tmp_path / "local", local(on_error="skip"))
    assert_same_records(tmp_path / "local", tmp_path)
    assert (tmp_path / "skipped.jsonl").read_bytes() == \
        (tmp_path / "local" / "skipped.jsonl").read_bytes()
    assert_same_records(tmp_path / "local", tmp_path / "from-s3")
