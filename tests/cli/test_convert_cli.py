"""``pack-dataset SRC DST --from X --to Y`` through formats.codecs.registry, every direction."""

from __future__ import annotations

from pathlib import Path

import pytest

from formats import open_shards
from formats.codecs.registry import open_source
from tests.helpers_codecs import make_dataset, make_records

cli = pytest.importorskip("packer.cli", reason="the packer CLI is not there yet")


@pytest.fixture
def packed(tmp_path, rng):
    recs = make_records(rng, 9)
    return recs, make_dataset(tmp_path / "packed", recs)


@pytest.mark.parametrize("fmt", ["tfrecord", "webdataset", "parquet"])
def test_shards_to_foreign_and_back(tmp_path, packed, fmt):
    recs, src = packed
    assert cli.main([str(src), str(tmp_path / fmt), "--to", fmt, "--quiet",
                     "--records-per-shard", "4"]) == 0
    assert len(list((tmp_path / fmt).glob("shard-*"))) >= 3
    # detected without --from
    assert cli.main([str(tmp_path / fmt), str(tmp_path / "back"), "--quiet"]) == 0
    ds = open_shards(tmp_path / "back")
    assert [bytes(ds[i]["image"]) for i in range(len(ds))] == [r["image"] for r in recs]
    assert ds.scalars(range(len(ds)), "label").tolist() == [r["label"] for r in recs]
    assert ds.manifest.created_by["source"]["kind"] == fmt


def test_shards_to_imagefolder(tmp_path, packed):
    recs, src = packed
    assert cli.main([str(src), str(tmp_path / "if"), "--from", "shards", "--to", "imagefolder",
                     "--quiet"]) == 0
    for r in recs:
        assert (tmp_path / "if" / r["key"]).read_bytes() == r["image"]


def test_foreign_to_foreign(tmp_path, packed):
    recs, src = packed
    assert cli.main([str(src), str(tmp_path / "wds"), "--to", "webdataset", "--quiet"]) == 0
    assert cli.main([str(tmp_path / "wds"), str(tmp_path / "tf"), "--from", "webdataset",
                     "--to", "tfrecord", "--quiet"]) == 0
    got = list(open_source("tfrecord", tmp_path / "tf"))
    assert [g.fields["label"] for g in got] == [r["label"] for r in recs]


def test_unknown_format_is_usage_error(tmp_path, packed, capsys):
    _, src = packed
    assert cli.main([str(src), str(tmp_path / "x"), "--to", "zip", "--quiet"]) == 2


def test_a_folder_source_given_the_wrong_kind_of_src_is_a_data_error(tmp_path, capsys):
    (tmp_path / "list.txt").write_text("not a folder")  # found by looking at SRC
    assert cli.main([str(tmp_path / "list.txt"), str(tmp_path / "out"), "--from", "imagefolder",
                     "--quiet"]) == 1
    assert "--from imagefolder needs a folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    (tmp_path / "rows.csv").write_text("name\nx.jpg\n")  # no 'path' column: data, not usage
    assert cli.main([str(tmp_path / "rows.csv"), str(tmp_path / "out"), "--from", "filelist",
                     "--quiet"]) == 1
    assert "no 'path' column" in capsys.readouterr().err


def test_bad_foreign_input_is_data_error(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.tfrecord").write_bytes(b"\x05" + b"\0" * 20)
    assert cli.main([str(tmp_path / "in"), str(tmp_path / "out"), "--from", "tfrecord",
                     "--quiet"]) == 1
    assert "a.tfrecord" in capsys.readouterr().err


def test_src_as_a_glob_or_brace_pattern(tmp_path, packed, capsys):
    recs, src = packed
    assert cli.main([str(src), str(tmp_path / "tf"), "--to", "tfrecord", "--quiet",
                     "--records-per-shard", "3"]) == 0
    assert cli.main([str(tmp_path / "tf" / "shard-0000[01].tfrecord"), str(tmp_path / "g"),
                     "--quiet"]) == 0
    assert [bytes(r["image"]) for r in open_shards(tmp_path / "g")] == [r["image"] for r in
                                                                          recs[:6]]
    assert cli.main([str(tmp_path / "tf" / "shard-{00000,00002}.tfrecord"),
                     str(tmp_path / "b"), "--quiet"]) == 0
    assert [bytes(r["image"]) for r in open_shards(tmp_path / "b")] == [
        r["image"] for r in recs[:3] + recs[6:]]
    capsys.readouterr()
    assert cli.main([str(tmp_path / "tf" / "nope-*.tfrecord"), str(tmp_path / "n")]) == 1
    assert "matches no file" in capsys.readouterr().err
    assert cli.main([str(tmp_path / "pack*"), str(tmp_path / "n"), "--from", "imagefolder"]) == 1
    assert "matches no file" in capsys.readouterr().err
    # A pattern for a source that reads one folder is wrong whatever it matches: usage.
    assert cli.main([str(tmp_path / "tf" / "shard-*.tfrecord"), str(tmp_path / "n"),
                     "--from", "imagefolder"]) == 2
    assert "reads one folder or list" in capsys.readouterr().err
    assert not (tmp_path / "n").exists()


def test_tfrecord_output_carries_dali_indexes_unless_refused(tmp_path, packed, capsys):
    _, src = packed
    assert cli.main([str(src), str(tmp_path / "tf"), "--to", "tfrecord", "--quiet",
                     "--records-per-shard", "4"]) == 0
    tfs = sorted((tmp_path / "tf").glob("*.tfrecord"))
    assert tfs and all(p.with_suffix(".idx").exists() or Path(f"{p}.idx").exists()
                       for p in tfs)
    assert cli.main([str(src), str(tmp_path / "bare"), "--to", "tfrecord", "--quiet",
                     "--no-tfrecord-index"]) == 0
    assert not list((tmp_path / "bare").glob("*.idx"))
    assert cli.main([str(src), str(tmp_path / "x"), "--no-tfrecord-index", "--quiet"]) == 2
    assert "--to tfrecord only" in capsys.readouterr().err


def test_image_root_reaches_the_parquet_source_and_nothing_else(tmp_path, rng, capsys,
                                                                monkeypatch):
    datasets = pytest.importorskip("datasets", reason="needs the datasets package")
    from tests.helpers_codecs import make_jpeg

    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "0.jpg").write_bytes(make_jpeg(rng))
    monkeypatch.chdir(tmp_path / "imgs")
    features = datasets.Features({"image": datasets.Image()})
    (tmp_path / "meta").mkdir()
    datasets.Dataset.from_dict({"image": ["../imgs/0.jpg"]}, features=features).to_parquet(
        str(tmp_path / "meta" / "a.parquet"))
    src = str(tmp_path / "meta" / "a.parquet")
    assert cli.main([src, str(tmp_path / "no"), "--quiet"]) == 1
    assert "leads outside" in capsys.readouterr().err
    assert cli.main([src, str(tmp_path / "yes"), "--quiet", "--from", "parquet",
                     "--image-root", str(tmp_path)]) == 0
    assert len(open_shards(tmp_path / "yes")) == 1
    assert cli.main([src, str(tmp_path / "x"), "--quiet", "--image-root", str(tmp_path)]) == 2
    assert "--from parquet only" in capsys.readouterr().err
