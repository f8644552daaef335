"""What pack-dataset tells a user (issue 35, friction): the summary's image line reads
as what the images are, not as a field name, and Ctrl-C names the folder that holds
the finished shards (a replace stages them beside DST) or says that nothing was kept."""

from __future__ import annotations

import pytest

import formats
from packer import PackSummary, format_summary
from packer.cli import main
from tests.helpers_packer import StopAfter, dataset_files, image_folder, png


@pytest.mark.parametrize(("kind", "words"), [("jpeg", "all JPEG"), ("png", "all PNG"),
                                             ("image", "mixed kinds, sniffed per record")])
def test_the_summary_says_what_the_images_are_not_a_field_named_jpeg(kind, words):
    s = PackSummary("pets", "pets.shards", "imagefolder", "shards", image_type=kind)
    lines = format_summary(s).splitlines()
    assert not any(line.startswith("image field") for line in lines)
    row = next(line for line in lines if line.startswith("images "))
    assert row.split(None, 1)[1] == f"{words} (field type {kind})"


def test_the_summary_of_a_real_pack(tmp_path, rng, capsys):
    image_folder(tmp_path / "src", rng)
    (tmp_path / "src" / "cat" / "x.png").write_bytes(png(rng, 8, 8))
    assert main([str(tmp_path / "src"), str(tmp_path / "d"), "--workers", "0"]) == 0
    out = capsys.readouterr().out
    assert "mixed kinds, sniffed per record (field type image)" in out
    assert formats.open_shards(tmp_path / "d").fields[0].name == "image"


def _interrupt(monkeypatch, n: int = 8) -> None:
    import packer.cli as cli

    monkeypatch.setattr(cli, "_TqdmProgress", lambda quiet: StopAfter(n))


def test_ctrl_c_during_overwrite_names_the_staging_folder_that_holds_the_shards(
        tmp_path, rng, capsys, monkeypatch):
    src, dst = tmp_path / "src", tmp_path / "out"
    image_folder(src, rng, per_class=20)
    common = [str(src), str(dst), "--records-per-shard", "4", "--workers", "0"]
    assert main([*common, "--quiet"]) == 0
    old = dataset_files(dst)
    capsys.readouterr()
    _interrupt(monkeypatch)
    assert main([*common, "--overwrite", "--records-per-shard", "2"]) == 130
    err = capsys.readouterr().err
    staging = tmp_path / ".out.shardpack-new"
    kept = sorted(staging.glob("shard-*.rec"))
    assert kept and f"{len(kept)} finished shard(s) kept in {staging}" in err, err
    assert f"{dst} still holds the old one" in err
    assert dataset_files(dst) == old  # DST untouched until the new dataset is complete
    monkeypatch.undo()
    resume = err.split("resume with: ", 1)[1].strip()
    assert "--overwrite" not in resume and resume.endswith("--resume")
    assert main([*common, "--records-per-shard", "2", "--resume", "--quiet"]) == 0
    assert len(formats.open_shards(dst).manifest.shards) == 20 and not staging.exists()


def test_ctrl_c_in_place_names_dst(tmp_path, rng, capsys, monkeypatch):
    image_folder(tmp_path / "src", rng, per_class=20)
    _interrupt(monkeypatch)
    assert main([str(tmp_path / "src"), str(tmp_path / "d"), "--records-per-shard", "4",
                 "--workers", "0"]) == 130
    err = capsys.readouterr().err
    assert f"kept in {tmp_path / 'd'}\n" in err and "--resume" in err


def test_ctrl_c_of_a_foreign_sink_says_nothing_was_kept(tmp_path, rng, capsys, monkeypatch):
    image_folder(tmp_path / "src", rng, per_class=20)
    _interrupt(monkeypatch)
    assert main([str(tmp_path / "src"), str(tmp_path / "w"), "--to", "webdataset",
                 "--records-per-shard", "4", "--workers", "0"]) == 130
    err = capsys.readouterr().err
    assert "nothing kept" in err and "--resume" not in err, err
    assert not (tmp_path / "w").exists() and not list(tmp_path.glob(".w.*"))
