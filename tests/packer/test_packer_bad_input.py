"""Bad input at pack time: each case fails naming the file, or is skipped and listed."""

from __future__ import annotations

import errno
import json
import os

import pytest

import formats
from formats.errors import InputError
from packer import DestinationError, PackError, PackInputError, PackOptions, UsageError, pack
from tests.helpers_packer import image_folder, jpeg, png


def opts(**kw) -> PackOptions:
    return PackOptions(**{"durable": False, "workers": 0, **kw})


def _corrupt(rng):
    return b"\xff\xd8\xff\xe0" + bytes(rng.integers(0, 256, 300, dtype="u1"))


def _truncated(rng):
    data = jpeg(rng, 64, 48)
    return data[: len(data) // 2]


# name -> (how to make the bad entry in the folder, expected kind)
CASES = {
    "corrupt": (lambda d, rng: (d / "bad.jpg").write_bytes(_corrupt(rng)), "corrupt"),
    "truncated": (lambda d, rng: (d / "bad.jpg").write_bytes(_truncated(rng)), "truncated"),
    "zero-byte": (lambda d, rng: (d / "bad.jpg").write_bytes(b""), "empty"),
    "not-an-image": (lambda d, rng: (d / "bad.txt").write_text("hello"), "not-an-image"),
    "symlink-loop": (lambda d, rng: os.symlink("bad.jpg", d / "bad.jpg"), "unreadable"),
    "dangling-symlink": (lambda d, rng: os.symlink("gone.jpg", d / "bad.jpg"), "missing"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fail_names_file_and_reason(tmp_path, rng, case):
    make, kind = CASES[case]
    src = tmp_path / "src"
    image_folder(src, rng, per_class=3)
    make(src / "dog", rng)
    with pytest.raises(PackInputError) as e:
        pack(src, tmp_path / "dst", opts())
    assert e.value.kind == kind
    assert "dog/bad." in e.value.path and "dog/bad." in str(e.value)
    assert not (tmp_path / "dst" / "manifest.json").exists()


@pytest.mark.parametrize("case", sorted(CASES))
def test_skip_lists_it(tmp_path, rng, case):
    make, kind = CASES[case]
    src = tmp_path / "src"
    image_folder(src, rng, per_class=3)
    make(src / "dog", rng)
    s = pack(src, tmp_path / "dst", opts(on_error="skip"))
    assert s.records_in == s.records_written + s.records_skipped == 7
    assert dict(s.skipped) == {kind: 1}
    lines = [json.loads(x) for x in (tmp_path / "dst" / "skipped.jsonl").read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["kind"] == kind
    assert lines[0]["path"].startswith("dog/bad.") and lines[0]["reason"]
    assert len(formats.open_shards(tmp_path / "dst")) == 6


def test_unreadable_file(tmp_path, rng, monkeypatch):
    """Root reads through chmod 000, so the permission error is injected."""
    import packer.work as work

    src = tmp_path / "src"
    image_folder(src, rng, per_class=2)
    real_open = os.open

    def fake_open(path, flags, *a, **k):
        if str(path).endswith("dog/001.jpg"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(work.os, "open", fake_open)
    with pytest.raises(PackInputError, match="Permission denied") as e:
        pack(src, tmp_path / "dst", opts())
    assert e.value.kind == "unreadable" and e.value.path.endswith("dog/001.jpg")
    s = pack(src, tmp_path / "dst", opts(on_error="skip"))
    assert dict(s.skipped) == {"unreadable": 1} and s.records_written == 3


def test_filelist_row_naming_a_directory_or_missing_file(tmp_path, rng):
    (tmp_path / "ok.jpg").write_bytes(jpeg(rng))
    (tmp_path / "adir.jpg").mkdir()
    lst = tmp_path / "l.csv"
    lst.write_text("path\nok.jpg\nadir.jpg\nmissing.jpg\n")
    with pytest.raises(PackInputError, match="is a directory"):
        pack(lst, tmp_path / "dst", opts())
    s = pack(lst, tmp_path / "dst", opts(on_error="skip"))
    assert dict(s.skipped) == {"unreadable": 1, "missing": 1} and s.records_written == 1
    lines = [json.loads(x) for x in (tmp_path / "dst" / "skipped.jsonl").read_text().splitlines()]
    assert [x["path"] for x in lines] == ["adir.jpg", "missing.jpg"]


def test_fifo_is_not_opened(tmp_path, rng):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jpg").write_bytes(jpeg(rng))
    os.mkfifo(src / "pipe.jpg")  # opening it would block forever
    s = pack(src, tmp_path / "dst", opts(on_error="skip"))
    assert dict(s.skipped) == {"unreadable": 1}


def test_spaces_and_unicode_names(tmp_path, rng):
    src = tmp_path / "src"
    (src / "chats tigrés").mkdir(parents=True)
    data = jpeg(rng)
    (src / "chats tigrés" / "mon chat 猫 😺.jpg").write_bytes(data)
    pack(src, tmp_path / "dst", opts())
    ds = formats.open_shards(tmp_path / "dst")
    assert ds[0]["key"] == "chats tigrés/mon chat 猫 😺.jpg" and bytes(ds[0]["image"]) == data
    assert ds.classes == ("chats tigrés",)


def test_empty_class_folder_keeps_its_label(tmp_path, rng):
    src = tmp_path / "src"
    image_folder(src, rng, classes=("a", "c"), per_class=2)
    (src / "b").mkdir()
    s = pack(src, tmp_path / "dst", opts())
    assert s.empty_classes == ("b",)
    ds = formats.open_shards(tmp_path / "dst")
    assert ds.classes == ("a", "b", "c")
    assert [ds[i]["label"] for i in range(4)] == [0, 0, 2, 2]


def test_empty_src(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / ".only-hidden").write_text("x")
    with pytest.raises(PackError, match="no input files"):
        pack(tmp_path / "src", tmp_path / "dst", opts())


def test_dst_inside_src(tmp_path, rng):
    src = tmp_path / "src"
    image_folder(src, rng)
    with pytest.raises(UsageError, match="inside SRC"):
        pack(src, src / "out", opts())
    with pytest.raises(UsageError, match="inside SRC"):
        pack(src, src, opts())
    assert not (src / "out").exists()


def test_dst_already_a_dataset(tmp_path, rng):
    src = tmp_path / "src"
    image_folder(src, rng)
    pack(src, tmp_path / "dst", opts())
    before = (tmp_path / "dst" / "manifest.json").read_bytes()
    with pytest.raises(DestinationError, match="already a dataset"):
        pack(src, tmp_path / "dst", opts())
    assert (tmp_path / "dst" / "manifest.json").read_bytes() == before
    (src / "cat" / "000.jpg").unlink()
    s = pack(src, tmp_path / "dst", opts(overwrite=True))
    assert s.records_written == 9 and len(formats.open_shards(tmp_path / "dst")) == 9


def test_skip_list_removed_when_overwritten_clean(tmp_path, rng):
    src = tmp_path / "src"
    image_folder(src, rng)
    (src / "cat" / "z.jpg").write_bytes(b"")
    pack(src, tmp_path / "dst", opts(on_error="skip"))
    assert (tmp_path / "dst" / "skipped.jsonl").exists()
    (src / "cat" / "z.jpg").unlink()
    pack(src, tmp_path / "dst", opts(overwrite=True))
    assert not (tmp_path / "dst" / "skipped.jsonl").exists()


def test_missing_src(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        pack(tmp_path / "nope", tmp_path / "dst", opts())


def test_a_file_name_that_is_not_utf8_is_a_bad_input_named_and_skippable(tmp_path, rng):
    src = tmp_path / "src"
    image_folder(src, rng, per_class=2)
    bad = os.fsencode(src / "cat") + b"/\xff.jpg"
    with open(bad, "wb") as f:
        f.write((src / "cat" / "000.jpg").read_bytes())
    with pytest.raises(PackInputError, match="not valid UTF-8") as info:
        pack(src, tmp_path / "a", opts())
    assert info.value.kind == "bad-name" and info.value.path.endswith("cat/\udcff.jpg")
    s = pack(src, tmp_path / "b", opts(on_error="skip"))
    assert s.complete and s.records_written == 4 and s.skipped == {"bad-name": 1}
    line = json.loads((tmp_path / "b" / "skipped.jsonl").read_text("utf-8"))
    assert line["path"] == "cat/\udcff.jpg"
    os.mkdir(os.fsencode(src) + b"/\xfa")
    with pytest.raises(InputError, match="class folder name is not valid UTF-8"):
        pack(src, tmp_path / "c", opts(on_error="skip"))


def _damaged_inside(data: bytes) -> bytes:
    """``data`` with the middle of its compressed data zeroed, its ends intact."""
    data = bytearray(data)
    n = len(data)
    data[n // 2: 3 * n // 4] = bytes(3 * n // 4 - n // 2)
    return bytes(data)


def test_an_image_damaged_inside_packs_unless_verify_decode_says_corrupt(tmp_path, rng):
    # The default check reads signature, header and end marker, never the pixels (a
    # decode costs ~270x the check): the help says so; --verify-decode decodes each once.
    from packer.cli import build_parser
    from packer.cli import main as pack_main

    src = tmp_path / "src"
    image_folder(src, rng, classes=("a",), per_class=2)
    (src / "a" / "bad.jpg").write_bytes(_damaged_inside(jpeg(rng, 320, 240)) + b"\xff\xd9")
    (src / "a" / "bad.png").write_bytes(_damaged_inside(png(rng, 320, 240)[:-12])
                                        + png(rng, 4, 4)[-12:])  # its IEND chunk kept
    summary = pack(src, tmp_path / "dst", opts())
    assert summary.records_written == 4 and not summary.skipped
    text = " ".join(build_parser().format_help().split())
    assert "checked by signature, header and end marker, not decoded unless --verify-decode" in text

    summary = pack(src, tmp_path / "verified", opts(on_error="skip", verify_decode=True))
    assert summary.records_written == 2 and summary.skipped == {"corrupt": 2}
    listed = [json.loads(line) for line in (tmp_path / "verified" / "skipped.jsonl").open()]
    assert sorted(e["path"] for e in listed) == ["a/bad.jpg", "a/bad.png"]
    assert all("does not decode" in e["reason"] for e in listed)
    assert formats.open_shards(tmp_path / "verified").manifest.created_by["options"][
        "verify_decode"] is True
    assert pack_main([str(src), str(tmp_path / "cli"), "-q", "--verify-decode"]) == 1
    with pytest.raises(UsageError, match="verify_decode must be True or False"):
        opts(verify_decode="yes")
