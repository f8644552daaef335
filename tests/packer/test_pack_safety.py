"""A pack never deletes, overwrites or mixes what is not provably its own.

Matrices over every source kind and every sink: a DST holding a user's files is
refused (and, with --overwrite, packed beside them untouched); --overwrite swaps the
new output in whole; one writer per DST; a resume of another source is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import formats
from formats.codecs.registry import convert, open_source
from formats.shard.ownership import LEDGER_NAME, survey
from packer import DestinationError, PackError, PackOptions, pack
from packer.cli import main
from packer.destination import _lock, claim
from tests.helpers_codecs import make_dataset, make_records
from tests.helpers_packer import dataset_files as _all_files
from tests.helpers_paths import ROOT
from tests.helpers_sources import SOURCES, make_source

SINKS = ("shards", "tfrecord", "webdataset", "parquet", "imagefolder")
# What a user keeps in a folder, named so that a writer clearing by prefix would take it.
USER_FILES = {"part-2-photos/img.txt": b"photo", "part-1.pdf": b"%PDF", "dict-en.txt": b"en",
              "shard-notes.txt": b"notes", ".ray/mine": b"ray", "manifest.json.bak": b"{}",
              "shard-00000.rec.orig": b"orig"}


def dataset_files(root: Path) -> dict[str, bytes]:
    """The files of a dataset folder, without the lock file a pack holds while it runs."""
    return {k: v for k, v in _all_files(root).items() if k != ".shardpack.lock"}


class Stop(Exception):
    """Raised by :class:`Calls` to interrupt a pack the way Ctrl-C does."""


class Calls:
    """A progress callback that calls ``each(records)`` as records are done."""

    def __init__(self, each) -> None:
        self.each = each

    def start(self, total, done=0):
        pass

    def advance(self, records, nbytes):
        self.each(records)

    def close(self):
        pass


def stop_after(n: int) -> Calls:
    left = [n]

    def each(records):
        left[0] -= records
        if left[0] <= 0:
            raise Stop

    return Calls(each)


def plant(dst: Path) -> None:
    for name, data in USER_FILES.items():
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        (dst / name).write_bytes(data)


def user_files_intact(dst: Path) -> bool:
    return all((dst / n).is_file() and (dst / n).read_bytes() == d for n, d in USER_FILES.items())


def opts(**kw) -> PackOptions:
    return PackOptions(workers=0, durable=False, records_per_shard=4, **kw)


def records_of(dst: Path, sink: str) -> int:
    if sink == "shards":
        return len(formats.open_shards(dst))
    if sink == "imagefolder":
        return sum(1 for p in dst.rglob("*.jpg") if "part-2-photos" not in p.parts)
    return sum(1 for _ in open_source(sink, dst))


@pytest.mark.parametrize("kind", SOURCES)
def test_every_source_refuses_a_folder_of_user_files_and_packs_beside_them(tmp_path, rng, kind):
    src = make_source(kind, tmp_path / "in", rng)
    dst = tmp_path / "out"
    dst.mkdir()
    plant(dst)
    with pytest.raises(DestinationError, match=r"did not write.*part-1\.pdf"):
        pack(src, dst, opts(source=kind))
    assert user_files_intact(dst) and sorted(survey(dst).foreign) == sorted(
        {n.split("/")[0] for n in USER_FILES})
    s = pack(src, dst, opts(source=kind, overwrite=True))
    assert s.complete and user_files_intact(dst)
    before = len(formats.open_shards(dst))
    s = pack(src, dst, opts(source=kind, overwrite=True, shuffle=True, seed=1))
    assert s.complete and user_files_intact(dst) and len(formats.open_shards(dst)) == before
    assert not [p for p in dst.parent.iterdir() if p.name.startswith(".out.")]


@pytest.mark.parametrize("sink", SINKS)
def test_every_sink_keeps_user_files_and_replaces_only_its_own_output(tmp_path, rng, sink):
    src = make_source("shards", tmp_path / "in", rng)
    other = make_source("shards", tmp_path / "in2", rng, n=5, seed_shift=3)
    dst = tmp_path / "out"
    dst.mkdir()
    plant(dst)
    with pytest.raises(DestinationError, match="did not write"):
        pack(src, dst, opts(sink=sink))
    assert pack(src, dst, opts(sink=sink, overwrite=True)).complete
    assert user_files_intact(dst) and records_of(dst, sink) == 9
    with pytest.raises(DestinationError, match="already a dataset"):
        pack(other, dst, opts(sink=sink))
    assert pack(other, dst, opts(sink=sink, overwrite=True)).complete
    assert user_files_intact(dst) and records_of(dst, sink) == 5  # nothing of the first left
    assert not survey(dst).leftovers or sink != "shards" or set(survey(dst).ours) >= {
        "manifest.json"}


@pytest.mark.parametrize("sink", [s for s in SINKS if s != "shards"])
def test_a_foreign_sink_output_is_listed_in_its_ledger(tmp_path, rng, sink):
    src = make_source("shards", tmp_path / "in", rng)
    dst = tmp_path / "out"
    assert pack(src, dst, opts(sink=sink)).complete
    ledger = json.loads((dst / LEDGER_NAME).read_text())["files"]
    on_disk = sorted(p.relative_to(dst).as_posix() + ("/" if p.is_dir() else "")
                     for p in dst.rglob("*") if p.name != LEDGER_NAME)
    assert ledger == on_disk and on_disk  # folders too (as name/), empty ones included


def test_a_damaged_manifest_is_never_replaced(tmp_path, rng):
    src = make_source("imagefolder", tmp_path / "in", rng)
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "manifest.json").write_text('{"not": "ours"}')
    for overwrite in (False, True):
        with pytest.raises(DestinationError, match="not a valid shardpack manifest"):
            pack(src, dst, opts(overwrite=overwrite))
    assert (dst / "manifest.json").read_text() == '{"not": "ours"}'


def test_a_second_pack_fails_at_once_naming_the_first(tmp_path, rng):
    src = make_source("imagefolder", tmp_path / "in", rng)
    dst = tmp_path / "out"
    held = claim(dst, opts())
    try:
        with pytest.raises(PackError, match=f"another pack \\(PID {os.getpid()}\\)"):
            pack(src, dst, opts())
        # from another process too (flock is per open file, not per process)
        code = ("import sys; from packer import pack, PackOptions, PackError\n"
                f"try: pack({str(src)!r}, {str(dst)!r}, PackOptions(workers=0))\n"
                "except PackError as e: print(e); sys.exit(3)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             cwd=ROOT, timeout=60)
        assert out.returncode == 3 and f"PID {os.getpid()}" in out.stdout
    finally:
        held.release()
    assert pack(src, dst, opts()).complete
    assert not (dst / ".shardpack.lock").exists()  # a finished pack leaves no lock file


def test_a_lock_on_a_file_that_was_swapped_away_is_not_taken(tmp_path):
    """The holder deletes its lock file before unlocking; whoever opened the old file
    and locks it afterwards must notice it is no longer DST's lock."""
    dst = tmp_path / "out"
    dst.mkdir()
    fd = _lock(dst)
    stale = os.open(dst / ".shardpack.lock", os.O_RDWR)
    (dst / ".shardpack.lock").unlink()
    os.close(fd)
    import fcntl

    fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the old file: anyone can lock it now
    fd2 = _lock(dst)  # ...but _lock takes the file at the path, a new one
    assert os.fstat(fd2).st_ino != os.fstat(stale).st_ino
    os.close(fd2)
    os.close(stale)


@pytest.mark.parametrize("kind", SOURCES)
def test_resume_with_another_source_is_refused(tmp_path, rng, kind):
    first = make_source(kind, tmp_path / "a", rng, n=9)
    second = make_source(kind, tmp_path / "b", rng, n=9, seed_shift=9)
    dst = tmp_path / "out"
    with pytest.raises(Stop):  # interrupted with sealed shards (one record each)
        pack(first, dst, PackOptions(workers=0, durable=False, records_per_shard=1,
                                     source=kind), stop_after(5))
    assert (dst / "_journal.jsonl").exists()
    with pytest.raises(PackError, match="cannot resume"):
        pack(second, dst, PackOptions(workers=0, durable=False, records_per_shard=1,
                                      source=kind, resume=True))
    s = pack(first, dst, PackOptions(workers=0, durable=False, records_per_shard=1,
                                     source=kind, resume=True))
    assert s.complete and s.resumed_records > 0
    fresh = pack(first, tmp_path / "fresh", PackOptions(workers=0, durable=False,
                                                        records_per_shard=1, source=kind))
    assert fresh.complete and dataset_files(dst) == dataset_files(tmp_path / "fresh")


def test_overwrite_keeps_the_old_dataset_readable_until_the_new_one_is_complete(tmp_path, rng):
    a = make_source("imagefolder", tmp_path / "a", rng, n=9)
    b = make_source("shards", tmp_path / "b", rng, n=5)
    dst = tmp_path / "out"
    pack(a, dst, opts())
    old = dataset_files(dst)
    reader = formats.open_shards(dst)
    seen = []

    def watch(records):  # during the replace: DST is still the old one
        seen.append(dataset_files(dst) == old and len(formats.open_shards(dst)) == 10)

    pack(b, dst, opts(overwrite=True), Calls(watch))
    assert seen and all(seen)
    assert len(formats.open_shards(dst)) == 5
    assert len(reader) == 10 and bytes(reader[9]["image"])  # an open reader keeps its maps
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_an_interrupted_overwrite_resumes_and_a_fresh_one_starts_over(tmp_path, rng):
    a = make_source("imagefolder", tmp_path / "a", rng, n=9)
    b = make_source("tfrecord", tmp_path / "b", rng, n=9)
    dst = tmp_path / "out"
    pack(a, dst, opts())
    old = dataset_files(dst)
    with pytest.raises(Stop):
        pack(b, dst, PackOptions(workers=0, durable=False, records_per_shard=1, overwrite=True),
             stop_after(1))
    assert dataset_files(dst) == old  # the old dataset, whole
    staging = tmp_path / ".out.shardpack-new"
    assert (staging / "_journal.jsonl").exists()
    s = pack(b, dst, PackOptions(workers=0, durable=False, records_per_shard=1, resume=True))
    assert s.complete and s.resumed_records > 0 and len(formats.open_shards(dst)) == 9
    assert formats.open_shards(dst).manifest.created_by["source"]["kind"] == "tfrecord"
    assert not staging.exists()


def test_a_replace_killed_after_moving_user_files_gives_them_back(tmp_path, rng):
    a = make_source("imagefolder", tmp_path / "a", rng, n=9)
    dst = tmp_path / "out"
    dst.mkdir()
    plant(dst)
    pack(a, dst, opts(overwrite=True))
    dest = claim(dst, opts(overwrite=True))
    assert dest.staged
    # what commit() does before the exchange, then a kill
    moved = sorted(survey(dst).foreign)
    dest._write_marker(moved)
    for rel in moved:
        os.rename(dst / rel, dest.staging / rel)
    dest._locks, locks = [], dest._locks
    for fd in locks:
        os.close(fd)
    assert not user_files_intact(dst)
    s = pack(a, dst, opts(overwrite=True))
    assert s.complete and user_files_intact(dst) and not dest.staging.exists()


def test_cli_refusals_are_data_errors_that_name_dst(tmp_path, rng, capsys):
    src = make_source("imagefolder", tmp_path / "in", rng)
    dst = tmp_path / "out"
    dst.mkdir()
    plant(dst)
    assert main([str(src), str(dst), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert str(dst) in err and "--overwrite" in err and "usage:" not in err
    assert main([str(src), str(dst), "--quiet", "--overwrite"]) == 0
    assert user_files_intact(dst)


def test_a_full_disk_names_dst_and_how_to_finish(tmp_path, rng, capsys, monkeypatch):
    import errno

    from formats.shard import shard_writer

    src = make_source("imagefolder", tmp_path / "in", rng)
    args = [str(src), str(tmp_path / "out"), "--quiet", "--records-per-shard", "2",
            "--workers", "0"]
    real, calls = shard_writer.ShardWriter.append, []

    def append(self, *a):
        calls.append(1)
        if len(calls) == 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *a)

    monkeypatch.setattr(shard_writer.ShardWriter, "append", append)
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'out'}: No space left on device" in err
    assert "finish with: pack-dataset" in err and "--resume" in err
    monkeypatch.setattr(shard_writer.ShardWriter, "append", real)
    assert main([*args, "--resume"]) == 0
    assert main([str(src), str(tmp_path / "full"), *args[2:]]) == 0
    assert dataset_files(tmp_path / "out") == dataset_files(tmp_path / "full")


def test_the_library_writers_delete_only_their_own_files(tmp_path, rng):
    recs = make_records(rng, 5)
    root = tmp_path / "ds"
    root.mkdir()
    plant(root)
    make_dataset(root, recs)
    from formats import DatasetWriter
    from tests.helpers_codecs import IMAGE_FIELDS

    with DatasetWriter(root, IMAGE_FIELDS, records_per_shard=2, overwrite=True,
                       durable=False) as w:
        w.write({f.name: recs[0][f.name] for f in IMAGE_FIELDS})
    assert user_files_intact(root) and len(formats.open_shards(root)) == 1
    out = tmp_path / "tf"
    convert("shards", root, "tfrecord", out, records_per_shard=1)
    assert len(list(out.glob("shard-*.tfrecord"))) == 1
    convert("shards", make_dataset(tmp_path / "two", recs[:2]), "tfrecord", out,
            records_per_shard=1, overwrite=True)  # replaces its own output (ledger)
    assert len(list(out.glob("shard-*.tfrecord"))) == 2
    (out / "shard-notes.txt").write_bytes(b"mine")
    with pytest.raises(formats.FormatError, match="not written by shardpack"):
        convert("shards", root, "tfrecord", out, overwrite=True)
    assert (out / "shard-notes.txt").read_bytes() == b"mine"


def test_a_replace_killed_while_it_made_its_staging_folder_is_cleaned(tmp_path, rng):
    a = make_source("imagefolder", tmp_path / "a", rng, n=9)
    dst = tmp_path / "out"
    pack(a, dst, opts())
    staging = tmp_path / ".out.shardpack-new"
    staging.mkdir()
    (staging / "..shardpack-staging.json.tmp-999999999").write_text("{")  # torn marker
    assert pack(a, dst, opts(overwrite=True)).complete and not staging.exists()
    staging.mkdir()
    (staging / "someone-elses.txt").write_text("x")
    with pytest.raises(PackError, match="move it away"):
        pack(a, dst, opts(overwrite=True))
    assert (staging / "someone-elses.txt").exists()


def test_a_resume_with_other_shard_options_names_the_one_that_differs(tmp_path):
    from formats import DatasetWriter, Field, ManifestError

    fields = [Field("n", "int")]
    w = DatasetWriter(tmp_path / "d", fields, records_per_shard=2, durable=False)
    for i in range(3):
        w.write({"n": i})
    w.abort()
    with pytest.raises(ManifestError, match="another records_per_shard") as info:
        DatasetWriter(tmp_path / "d", fields, records_per_shard=3, durable=False, resume=True)
    assert info.value.found == {"records_per_shard": 2}
    assert info.value.expected == {"records_per_shard": 3}


def test_hostile_classes_file_and_fifo_source_are_typed_errors(tmp_path, rng):
    from formats.codecs.paths import expand_inputs, read_classes_file

    (tmp_path / "classes.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(formats.FormatError, match="class names"):
        read_classes_file(tmp_path)
    os.mkfifo(tmp_path / "x.tfrecord")
    with pytest.raises(formats.FormatError, match="FIFO"):
        expand_inputs(tmp_path / "x.tfrecord", (".tfrecord",))
    with pytest.raises(formats.SchemaError, match="lone surrogate"):
        formats.Field("a\udcff", "int")


def test_an_old_dataset_half_deleted_by_a_kill_is_still_ours(tmp_path, rng):
    """A replace killed while deleting the old folder: what remains must still be
    provable (the manifest goes last), so the next pack finishes the job."""
    from formats.shard.ownership import remove_ours

    a = make_source("imagefolder", tmp_path / "a", rng, n=9)
    old = tmp_path / ".out.shardpack-new"
    pack(a, old, opts())
    ours = survey(old).ours
    deleted = []
    real_unlink = Path.unlink

    def unlink(self, missing_ok=False):
        if len(deleted) == 3:
            raise KeyboardInterrupt  # the kill
        deleted.append(self.name)
        return real_unlink(self, missing_ok=missing_ok)

    Path.unlink = unlink
    try:
        with pytest.raises(KeyboardInterrupt):
            remove_ours(old, ours)
    finally:
        Path.unlink = real_unlink
    assert "manifest.json" not in deleted and survey(old).foreign == []
    pack(a, tmp_path / "out", opts())
    assert pack(a, tmp_path / "out", opts(overwrite=True)).complete and not old.exists()


def test_the_writer_refuses_what_no_reader_would_open(tmp_path, monkeypatch):
    from formats import DatasetWriter, Field, ManifestError, SchemaError
    from formats.shard import manifest

    with pytest.raises(SchemaError, match="at least one field"):
        DatasetWriter(tmp_path / "none", [], records_per_shard=1)
    # Shards no longer count against the manifest's bound (they are in the shard table),
    # but classes still do: a manifest no reader would open is refused when written.
    monkeypatch.setattr(manifest, "MAX_MANIFEST_BYTES", 2000)
    w = DatasetWriter(tmp_path / "many", [Field("n", "int")], records_per_shard=1,
                      durable=False, classes=[f"class {i}" for i in range(200)])
    for i in range(100):
        w.write({"n": i})
    with pytest.raises(ManifestError, match="too many classes"):
        w.close()
    assert len(w.sealed) == 100 and not (tmp_path / "many" / "manifest.json").exists()


def test_an_image_field_is_typed_by_what_it_holds_across_a_resume(tmp_path, rng):
    from formats import DatasetWriter, Field
    from tests.helpers_packer import jpeg, png

    fields = [Field("image", "jpeg"), Field("n", "int")]
    w = DatasetWriter(tmp_path / "d", fields, records_per_shard=1, durable=False)
    w.write({"image": jpeg(rng), "n": 0})
    w.write({"image": png(rng), "n": 1})  # sealed with the formats seen so far
    w.write({"image": jpeg(rng), "n": 2})
    w.abort()
    w = DatasetWriter(tmp_path / "d", fields, records_per_shard=1, durable=False, resume=True)
    assert len(w.sealed) == 3
    assert w.close().fields[0].type == "image"  # the PNG before the resume still counts
    only = DatasetWriter(tmp_path / "j", [Field("image", "image")], records_per_shard=2,
                         durable=False)
    only.write({"image": jpeg(rng)})
    assert only.close().fields[0].type == "jpeg"  # all JPEG: the fast path


def test_an_image_folder_output_with_an_empty_class_is_replaced_whole(tmp_path, rng):
    """Empty class folders are part of the output (its ledger lists folders too), so a
    replace neither trips over them nor leaves them behind; a user's file inside a
    class folder stays."""
    from formats import DatasetWriter
    from tests.helpers_codecs import CLASSES, IMAGE_FIELDS

    recs = [r for r in make_records(rng, 6) if r["label"] != 1]  # class 'dog' stays empty
    src = tmp_path / "src"
    with DatasetWriter(src, IMAGE_FIELDS, classes=CLASSES, records_per_shard=4,
                       durable=False) as w:
        for r in recs:
            w.write({f.name: r[f.name] for f in IMAGE_FIELDS})
    dst = tmp_path / "out"
    assert pack(src, dst, opts(sink="imagefolder")).complete
    assert (dst / "dog").is_dir() and not any((dst / "dog").iterdir())
    (dst / "cat" / "mine.txt").write_text("mine")
    for _ in range(2):
        assert pack(src, dst, opts(sink="imagefolder", overwrite=True)).complete
    assert (dst / "cat" / "mine.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]
    assert survey(dst).foreign == ["cat/mine.txt"]


def test_the_temp_files_of_a_killed_writer_not_yet_reaped_are_ours(tmp_path):
    """A writer killed with SIGKILL answers kill(pid, 0) until its parent reaps it;
    a resume started in that time must still clear its temporary files."""
    import subprocess
    import time

    from formats.shard.ownership import survey

    child = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / f".shard-00003.rec.tmp-{child.pid}").write_bytes(b"x")
        (tmp_path / "_journal.jsonl").write_text("{}\n")
        assert f".shard-00003.rec.tmp-{child.pid}" not in survey(tmp_path).ours  # alive
        child.kill()
        deadline = time.monotonic() + 5
        while f".shard-00003.rec.tmp-{child.pid}" not in survey(tmp_path).ours:
            assert time.monotonic() < deadline, "a zombie writer's temp file stays foreign"
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait()


def test_a_pack_that_did_not_finish_is_not_taken_for_a_folder_of_files(tmp_path):
    from formats.errors import InputError
    from packer import PackOptions, pack

    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "_journal.jsonl").write_text('{"fields": []}\n')
    with pytest.raises(InputError, match=r"did not finish.*--resume"):
        pack(tmp_path / "half", tmp_path / "out", PackOptions(workers=0, durable=False))
    assert not (tmp_path / "out").exists()


def test_ownership_knows_a_datasets_names_and_the_packer_declares_its_own(tmp_path):
    """formats.shard.ownership proves ours only what a dataset names; the range state,
    range shards and shuffle pass are the packer's, ours only when it says so."""
    from formats.shard.ownership import is_our_shard_name, remove_ours, survey
    from packer.work_names import STATE_DIR, WORK

    (tmp_path / STATE_DIR).mkdir()
    (tmp_path / STATE_DIR / "plan.json").write_text("{}")
    (tmp_path / "part-000000000000-00000.rec").write_bytes(b"")
    (tmp_path / "part-1.pdf").write_bytes(b"mine")
    (tmp_path / ".shardpack-shuffle").mkdir()
    (tmp_path / ".shardpack-shuffle" / "_journal.jsonl").write_text("{}\n")
    packer_names = [STATE_DIR, ".shardpack-shuffle", "part-000000000000-00000.rec"]
    bare = survey(tmp_path)
    assert not bare.work_state and sorted(bare.foreign) == sorted([*packer_names, "part-1.pdf"])
    assert not is_our_shard_name("part-000000000000-00000.rec")
    told = survey(tmp_path, WORK)
    assert told.work_state and told.foreign == ["part-1.pdf"]
    assert set(packer_names) <= set(told.leftovers)
    assert is_our_shard_name("part-000000000000-00000.rec", WORK)
    remove_ours(tmp_path, told.leftovers, work=WORK)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-1.pdf"]
