"""The local copy of a remote container source: reused by a rerun, never stale,
never shared by two packs at once (packer/source_copy.py). A local folder stands in
for the bucket: the copy sees only a Location and its listing."""

from __future__ import annotations

import logging
import os

import pytest

from formats.storage import StoredFile, open_location
from packer import PackError
from packer.source_copy import SourceCopy


@pytest.fixture()
def bucket(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDPACK_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "bucket"
    (root / "sub").mkdir(parents=True)
    (root / "a.tar").write_bytes(b"a" * 100)
    (root / "sub" / "b.tar").write_bytes(b"b" * 50)
    return root


def fetch(root, src="s3://bkt/data"):
    location = open_location(root)
    copy = SourceCopy(src)
    try:
        return copy, copy.fetch(location, location.list_files())
    except BaseException:
        copy.release(delete=False)
        raise


def test_a_rerun_fetches_only_what_changed_and_drops_what_is_gone(bucket, monkeypatch):
    copy, folder = fetch(bucket)
    assert (folder / "a.tar").read_bytes() == b"a" * 100
    assert (folder / "sub" / "b.tar").read_bytes() == b"b" * 50
    copy.release(delete=False)

    # The same size, new bytes: only the modification time tells them apart.
    (bucket / "a.tar").write_bytes(b"A" * 100)
    st = (bucket / "a.tar").stat()
    os.utime(bucket / "a.tar", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    (bucket / "sub" / "b.tar").unlink()
    (bucket / "c.tar").write_bytes(b"c")
    fetched = []
    real = type(open_location(bucket)).download
    monkeypatch.setattr(type(open_location(bucket)), "download",
                        lambda self, name, *a, **k: (fetched.append(name),
                                                     real(self, name, *a, **k)))
    copy, folder = fetch(bucket)
    assert sorted(fetched) == ["a.tar", "c.tar"]  # b.tar is gone, nothing else re-read
    assert (folder / "a.tar").read_bytes() == b"A" * 100
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if not p.name.startswith(".")) == ["a.tar", "c.tar"]
    copy.release(delete=True)
    assert not folder.exists()


def test_a_file_changed_in_the_copy_is_fetched_again(bucket):
    copy, folder = fetch(bucket)
    copy.release(delete=False)
    (folder / "a.tar").write_bytes(b"x")  # damaged (a crash, a user): wrong size
    (folder / ".a.tar.tmp-99999").write_bytes(b"half")  # a crashed run's download
    (folder / ".fetched.jsonl").write_text('{"name": "sub/b.tar", "st')  # torn journal
    copy, folder = fetch(bucket)
    assert (folder / "a.tar").read_bytes() == b"a" * 100
    assert not (folder / ".a.tar.tmp-99999").exists()
    copy.release(delete=True)


def test_two_packs_of_one_source_do_not_share_its_copy(bucket):
    first, _ = fetch(bucket)
    with pytest.raises(PackError, match="another pack of this SRC"):
        SourceCopy("s3://bkt/data")
    other, _ = fetch(bucket, "s3://bkt/other")  # another SRC: its own copy
    other.release(delete=True)
    first.release(delete=True)
    SourceCopy("s3://bkt/data").release(delete=True)  # free again


def test_a_kept_copy_is_named_in_the_log(bucket, caplog):
    copy, folder = fetch(bucket)
    with caplog.at_level(logging.WARNING, logger="shardpack.packer"):
        copy.release(delete=False)
    assert str(folder) in caplog.text and "s3://bkt/data" in caplog.text
    assert (folder / "a.tar").exists()


def test_names_that_leave_the_copy_are_refused(bucket):
    copy = SourceCopy("s3://bkt/data")
    try:
        with pytest.raises(Exception, match="unsafe object name"):
            copy.fetch(open_location(bucket), [StoredFile("../escape.tar", 1, None)])
    finally:
        copy.release(delete=True)
    assert not (bucket.parent / "cache" / "sources" / "escape.tar").exists()
