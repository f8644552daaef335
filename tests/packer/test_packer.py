"""pack-dataset: sources, fields, options, determinism, resume (in process)."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest

import formats
from formats.errors import InputUsageError
from packer import (
    PackInterrupted,
    PackOptions,
    PackSummary,
    UsageError,
    format_summary,
    pack,
    parse_size,
)
from packer.cli import main
from tests.helpers_packer import StopAfter, dataset_files, image_folder, jpeg, png
from tests.helpers_paths import ROOT

FAST = {"durable": False, "workers": 0}


def opts(**kw) -> PackOptions:
    return PackOptions(**{**FAST, **kw})


@pytest.mark.parametrize("text, n", [("64MB", 64_000_000), ("1GiB", 1 << 30), ("1.5 kb", 1500),
                                     ("4096", 4096), ("2mib", 2 << 20)])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "MB", "-1MB", "3 parsecs", "0"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError):
        parse_size(text)


def test_imagefolder_round_trip(tmp_path, rng):
    src = tmp_path / "src"
    files = image_folder(src, rng, classes=("dog", "cat", "emu"), per_class=4)
    (src / ".hidden").mkdir()
    (src / ".hidden" / "x.jpg").write_bytes(jpeg(rng))
    (src / "cat" / ".DS_Store").write_bytes(b"junk")
    (src / "README.txt").write_text("top-level files are ignored in an image folder")
    s = pack(src, tmp_path / "dst", opts(records_per_shard=5))
    assert (s.records_in, s.records_written, s.records_skipped, s.shards) == (12, 12, 0, 3)
    assert s.complete and s.source == "imagefolder"
    ds = formats.open_shards(tmp_path / "dst")
    assert ds.classes == ("cat", "dog", "emu")
    assert [f.name for f in ds.fields] == ["image", "label", "key"]
    assert ds.fields[0].type == "jpeg"
    keys = [ds[i]["key"] for i in range(len(ds))]
    assert keys == sorted(files)
    for i, key in enumerate(keys):
        assert bytes(ds[i]["image"]) == files[key]
        assert ds[i]["label"] == ds.classes.index(key.split("/")[0])
    meta = ds.metadata().to_pydict()
    assert meta["width"][0] == 16 and meta["height"][0] == 12
    assert meta["label"] == [ds[i]["label"] for i in range(len(ds))]
    assert ds.manifest.created_by["tool"] == "pack-dataset"
    assert "workers" not in ds.manifest.created_by["options"]
    assert not (tmp_path / "dst" / "skipped.jsonl").exists()


def test_flat_files_source(tmp_path, rng):
    src = tmp_path / "flat"
    (src / "sub").mkdir(parents=True)
    (src / "a.jpg").write_bytes(jpeg(rng))
    (src / "sub" / "b.jpeg").write_bytes(jpeg(rng))
    s = pack(src, tmp_path / "dst", opts())
    assert s.source == "files" and s.records_written == 2
    ds = formats.open_shards(tmp_path / "dst")
    assert [f.name for f in ds.fields] == ["image", "key"]
    assert [ds[i]["key"] for i in range(2)] == ["a.jpg", "sub/b.jpeg"]
    assert ds.classes is None


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_filelist_columns_and_types(tmp_path, rng, suffix):
    img = tmp_path / "imgs"
    img.mkdir()
    rows = []
    for i in range(4):
        (img / f"{i}.jpg").write_bytes(jpeg(rng))
        rows.append({"path": f"imgs/{i}.jpg", "label": i % 2, "score": i / 2, "note": f"n{i}"})
    lst = tmp_path / f"list{suffix}"
    if suffix == ".jsonl":
        lst.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        sep = "\t" if suffix == ".tsv" else ","
        lst.write_text(sep.join(rows[0]) + "\n" + "".join(
            sep.join(str(v) for v in r.values()) + "\n" for r in rows))
    s = pack(lst, tmp_path / "dst", opts())
    assert s.source == "filelist" and s.records_written == 4
    ds = formats.open_shards(tmp_path / "dst")
    assert {f.name: f.type for f in ds.fields} == {
        "image": "jpeg", "label": "int", "key": "str", "score": "float", "note": "str"}
    assert [ds[i]["score"] for i in range(4)] == [0.0, 0.5, 1.0, 1.5]
    assert ds[3]["key"] == "imgs/3.jpg" and ds[3]["label"] == 1 and ds[3]["note"] == "n3"
    assert ds.metadata().column("label").to_pylist() == [0, 1, 0, 1]


def test_filelist_str_labels_become_classes_and_paths_may_leave(tmp_path, rng):
    outside = tmp_path / "outside.jpg"
    outside.write_bytes(jpeg(rng))
    lists = tmp_path / "lists"
    lists.mkdir()
    lst = lists / "l.csv"
    lst.write_text(f"path,label\n../outside.jpg,zebra\n{outside},ant\n")
    pack(lst, tmp_path / "dst", opts())
    ds = formats.open_shards(tmp_path / "dst")
    assert ds.classes == ("ant", "zebra")
    assert [ds[i]["label"] for i in range(2)] == [1, 0]


def test_filelist_rows_must_agree(tmp_path, rng):
    (tmp_path / "a.jpg").write_bytes(jpeg(rng))
    lst = tmp_path / "l.jsonl"
    lst.write_text('{"path": "a.jpg", "x": 1}\n{"path": "a.jpg", "x": "one"}\n')
    with pytest.raises(formats.ShardpackError, match="column 'x'"):
        pack(lst, tmp_path / "dst", opts())
    lst.write_text('{"file": "a.jpg"}\n')
    with pytest.raises(formats.ShardpackError, match="no 'path' column"):
        pack(lst, tmp_path / "dst", opts())


def test_workers_do_not_change_bytes(tmp_path, rng):
    src = tmp_path / "src"
    image_folder(src, rng, per_class=30, sizes=lambda i: (20 + 3 * i, 18 + i))
    outs = []
    for w, side in ((0, None), (1, None), (2, None), (0, 40), (2, 40)):
        dst = tmp_path / f"w{w}-{side}"
        pack(src, dst, PackOptions(workers=w, max_side=side, records_per_shard=7, durable=False))
        outs.append(dataset_files(dst))
    assert outs[0] == outs[1] == outs[2]
    assert outs[3] == outs[4]
    assert outs[0] != outs[3]


def test_shuffle_is_seeded(tmp_path, rng):
    src = tmp_path / "src"
    image_folder(src, rng, per_class=10)

    def order(seed):
        dst = tmp_path / f"s{seed}"
        pack(src, dst, opts(shuffle=True, seed=seed, overwrite=True))
        ds = formats.open_shards(dst)
        return [ds[i]["key"] for i in range(len(ds))]

    a, b, c = order(1), order(1), order(2)
    assert a == b != c
    assert a != sorted(a) and sorted(a) == sorted(c)


def test_max_side_reencodes_only_large_images(tmp_path, rng):
    import simplejpeg

    src = tmp_path / "src"
    src.mkdir()
    small, big, tall = jpeg(rng, 30, 20), jpeg(rng, 200, 90), jpeg(rng, 33, 101)
    for name, data in (("a.jpg", small), ("b.jpg", big), ("c.jpg", tall)):
        (src / name).write_bytes(data)
    pack(src, tmp_path / "dst", opts(max_side=48, quality=80))
    ds = formats.open_shards(tmp_path / "dst")
    assert bytes(ds[0]["image"]) == small
    h, w, _, _ = simplejpeg.decode_jpeg_header(bytes(ds[1]["image"]))
    assert (w, h) == (48, 22)
    h, w, _, _ = simplejpeg.decode_jpeg_header(bytes(ds[2]["image"]))
    assert (w, h) == (16, 48)
    meta = ds.metadata().to_pydict()
    assert meta["width"] == [30, 48, 16] and meta["height"] == [20, 22, 48]


def test_non_jpeg_images_stored_or_converted(tmp_path, rng):
    pytest.importorskip("PIL")
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    p = png(rng)
    (src / "a" / "x.png").write_bytes(p)
    (src / "a" / "y.jpg").write_bytes(jpeg(rng))
    pack(src, tmp_path / "keep", opts())
    ds = formats.open_shards(tmp_path / "keep")
    assert ds.fields[0].type == "image"
    assert bytes(ds[0]["image"]) == p
    assert ds.metadata().column("width").to_pylist()[0] == 20
    pack(src, tmp_path / "conv", opts(to_jpeg=True))
    ds = formats.open_shards(tmp_path / "conv")
    assert ds.fields[0].type == "jpeg"
    assert bytes(ds[0]["image"])[:3] == b"\xff\xd8\xff"


def test_an_image_field_is_typed_by_content_not_by_name(tmp_path, rng):
    pytest.importorskip("PIL")
    src = tmp_path / "src"
    src.mkdir()
    (src / "fake.jpg").write_bytes(png(rng))  # a PNG named .jpg is a PNG
    pack(src, tmp_path / "png", opts())
    assert formats.open_shards(tmp_path / "png").fields[0].type == "png"
    (src / "real.jpg").write_bytes(jpeg(rng))
    pack(src, tmp_path / "mixed", opts())
    assert formats.open_shards(tmp_path / "mixed").fields[0].type == "image"
    (src / "fake.jpg").unlink()
    (src / "other.png").write_bytes(jpeg(rng))  # a JPEG named .png: the fast path holds
    pack(src, tmp_path / "jpeg", opts())
    assert formats.open_shards(tmp_path / "jpeg").fields[0].type == "jpeg"



@pytest.mark.parametrize("shuffle", [False, True])
def test_interrupt_then_resume_is_byte_identical(tmp_path, rng, shuffle):
    src = tmp_path / "src"
    image_folder(src, rng, per_class=200)
    bad = sorted((src / "cat").iterdir())
    bad[7].write_bytes(b"")                       # before the interruption
    bad[150].write_bytes(b"not an image at all")  # after it
    o = PackOptions(records_per_shard=9, on_error="skip", shuffle=shuffle, seed=3, durable=False,
                    workers=0)
    full = pack(src, tmp_path / "full", o)
    assert full.records_skipped == 2 and full.records_in == 400
    with pytest.raises(PackInterrupted) as e:
        pack(src, tmp_path / "cut", o, progress=StopAfter(200))
    assert not (tmp_path / "cut" / "manifest.json").exists()
    assert e.value.summary.shards >= 10
    again = pack(src, tmp_path / "cut", PackOptions(**{**o.__dict__, "resume": True}))
    assert again.resumed_records > 0
    assert again.records_in == full.records_in and again.skipped == full.skipped
    assert dataset_files(tmp_path / "cut") == dataset_files(tmp_path / "full")
    lines = (tmp_path / "full" / "skipped.jsonl").read_text().splitlines()
    assert {json.loads(x)["kind"] for x in lines} == {"empty", "corrupt"}


def test_resume_refuses_other_options(tmp_path, rng):
    src = tmp_path / "src"
    image_folder(src, rng, per_class=40)
    with pytest.raises(PackInterrupted):
        pack(src, tmp_path / "d", opts(records_per_shard=5), progress=StopAfter(64))
    with pytest.raises(formats.ManifestError, match="cannot resume"):
        pack(src, tmp_path / "d", opts(records_per_shard=6, resume=True))
    with pytest.raises(formats.ShardpackError, match="cannot resume"):
        pack(src, tmp_path / "d", opts(records_per_shard=5, resume=True, shuffle=True))
    # on_error may change: resuming a failed pack with skip is how to get past a bad file.
    s = pack(src, tmp_path / "d", opts(records_per_shard=5, resume=True, on_error="skip"))
    assert s.resumed_records == 60 and s.records_written == 80


def test_summary_text_and_json(tmp_path, rng):
    src = tmp_path / "src"
    image_folder(src, rng)
    (src / "cat" / "bad.jpg").write_bytes(b"\xff\xd8\xff garbage")
    s = pack(src, tmp_path / "dst", opts(on_error="skip"))
    assert isinstance(s, PackSummary)
    j = s.to_json()
    assert j["records_in"] == j["records_written"] + j["records_skipped"] == 11
    assert j["skipped_by_kind"] == {"corrupt": 1}
    text = format_summary(s)
    assert "corrupt: 1" in text and "skipped.jsonl" in text


def test_cli_json_and_exit_codes(tmp_path, rng, capsys):
    src = tmp_path / "src"
    image_folder(src, rng)
    dst = tmp_path / "dst"
    assert main([str(src), str(dst), "--json", "--quiet", "--workers", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records_written"] == 10 and out["complete"]
    assert main([str(src), str(dst), "--quiet"]) == 1  # already a dataset: found in DST
    assert "--overwrite" in capsys.readouterr().err
    assert main([str(src), str(dst), "--quiet", "--overwrite", "--shard-size", "1KB"]) == 0
    assert formats.open_shards(dst).manifest.shards.__len__() > 1
    (src / "cat" / "000.jpg").write_bytes(b"")
    assert main([str(src), str(tmp_path / "d2"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "000.jpg" in err and "zero-byte" in err
    with pytest.raises(SystemExit) as e:
        main([str(src), str(dst), "--shard-size", "lots"])
    assert e.value.code == 2


def test_cli_interrupt_prints_resume_hint(tmp_path, rng, capsys, monkeypatch):
    src = tmp_path / "src"
    image_folder(src, rng, per_class=50)
    import packer.cli as cli

    monkeypatch.setattr(cli, "_TqdmProgress", lambda quiet: StopAfter(64))
    rc = main([str(src), str(tmp_path / "d"), "--records-per-shard", "4", "--workers", "0"])
    assert rc == 130
    err = capsys.readouterr().err
    assert "--resume" in err and "finished shard" in err
    monkeypatch.undo()
    assert main([str(src), str(tmp_path / "d"), "--records-per-shard", "4", "--workers", "0",
                 "--resume", "--quiet"]) == 0
    assert len(formats.open_shards(tmp_path / "d")) == 100


def test_unknown_format_not_available(tmp_path, rng, capsys, monkeypatch):
    import packer.resolve as resolve

    monkeypatch.setattr(resolve, "_REGISTRY", "formats._no_such_registry")
    src = tmp_path / "src"
    image_folder(src, rng)
    assert main([str(src), str(tmp_path / "d"), "--from", "tfrecord", "--quiet"]) == 2
    assert "--from 'tfrecord': no such format" in capsys.readouterr().err
    assert main([str(src), str(tmp_path / "d"), "--to", "webdataset", "--quiet"]) == 2
    assert "choose from shards" in capsys.readouterr().err


def test_a_misspelt_format_names_the_closest_and_every_choice(tmp_path, rng, capsys):
    src = tmp_path / "src"
    image_folder(src, rng)
    assert main([str(src), str(tmp_path / "d"), "--to", "webdatset", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'webdataset'?" in err and "tfrecord" in err and "imagefolder" in err
    assert main([str(src), str(tmp_path / "d"), "--from", "parquett", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'parquet'?" in err and "mds" in err and "filelist" in err
    assert not (tmp_path / "d").exists()


def test_registry_source_and_sink_plug_in(tmp_path, rng, monkeypatch):
    """A stand-in formats.codecs.registry: the interface documented in packer's docstring."""
    import packer.resolve as resolve

    written = []

    class Source:
        fields = (formats.Field("blob", "bytes"), formats.Field("n", "int"))
        classes = None

        def __len__(self):
            return 3

        def __iter__(self):
            for i in range(3):
                yield formats.Record({"blob": bytes([i]) * 5, "n": i}, {}, f"r{i}")

    class Sink:
        def __init__(self, fields):
            self.fields = fields

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            written.append("closed")

        def write(self, record):
            written.append(record)

    reg = types.ModuleType("fake_registry")
    reg.open_source = lambda name, path, options: Source() if name == "fake" else {}[name]
    reg.open_sink = lambda name, path, fields, classes, options: Sink(fields)
    monkeypatch.setitem(sys.modules, "fake_registry", reg)
    monkeypatch.setattr(resolve, "_REGISTRY", "fake_registry")
    src = tmp_path / "whatever.bin"
    src.write_bytes(b"x")
    s = pack(src, tmp_path / "d", opts(source="fake"))
    assert s.records_written == 3
    ds = formats.open_shards(tmp_path / "d")
    assert ds[2]["n"] == 2 and bytes(ds[2]["blob"]) == b"\x02" * 5
    img = tmp_path / "img"
    image_folder(img, rng, per_class=2)
    s = pack(img, tmp_path / "out", opts(sink="other"))
    assert s.records_written == 4 and written[-1] == "closed"
    assert written[0].fields["key"] == "cat/000.jpg" and written[0].meta["width"] == 16
    with pytest.raises(UsageError, match="no such format"):
        pack(src, tmp_path / "e", opts(source="nope"))


def test_options_validate():
    with pytest.raises(UsageError):
        PackOptions(on_error="ignore")
    with pytest.raises(UsageError):
        PackOptions(resume=True, overwrite=True)
    with pytest.raises(UsageError):
        PackOptions(max_side=0)
    assert PackOptions(workers=None).num_workers == (os.cpu_count() or 1)


@pytest.mark.parametrize("state", [".shardpack-ranges", ".ray"])  # today's name; before
def test_a_local_pack_clears_what_an_interrupted_range_pack_left(tmp_path, rng, state):
    image_folder(tmp_path / "src", rng, per_class=3)
    dst = tmp_path / "out"
    (dst / state).mkdir(parents=True)
    (dst / state / "plan.json").write_text("{}")  # what proves the leftovers are ours
    (dst / state / "range-0-6.json").write_text("{}")
    (dst / "part-000000000000-00000.rec").write_bytes(b"old")
    assert pack(tmp_path / "src", dst, PackOptions(workers=0, durable=False)).complete
    assert not (dst / state).exists() and not list(dst.glob("part-*"))
    assert not (dst / ".shardpack-ranges").exists()
    assert len(formats.open_shards(dst)) == 6


def test_a_uri_that_cannot_be_understood_is_a_usage_error(tmp_path, rng, capsys):
    src = tmp_path / "src"
    image_folder(src, rng, per_class=1)
    assert main([str(src), "s3://AKID:9/SeCrEt@bucket/ds?bogus=1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "bogus" in err and "SeCrEt" not in err and "Traceback" not in err


def test_an_option_that_would_change_nothing_is_refused(tmp_path, rng, capsys):
    src = tmp_path / "src"
    image_folder(src, rng, per_class=1)
    for extra, why in ((["--quality", "70"], "--max-side or --to-jpeg"),
                       (["--seed", "3"], "give --shuffle"),
                       (["--to", "imagefolder", "--shard-size", "1MB"], "do not apply")):
        assert main([str(src), str(tmp_path / "d"), "--quiet", *extra]) == 2
        assert why in capsys.readouterr().err
    assert not (tmp_path / "d").exists()
    blobs = tmp_path / "blobs"
    with formats.DatasetWriter(blobs, [formats.Field("n", "int")], records_per_shard=2) as w:
        w.write({"n": 1})
    with pytest.raises(InputUsageError, match="no image field"):
        pack(blobs, tmp_path / "e", opts(max_side=8))
    assert main([str(src), str(tmp_path / "q"), "--quiet", "--max-side", "8",
                 "--quality", "70"]) == 0


def test_file_uris_are_local_paths_for_src_and_dst(tmp_path, monkeypatch):
    import numpy as np

    image_folder(tmp_path / "src", np.random.default_rng(0))
    monkeypatch.chdir(tmp_path)
    s = pack(f"file://{tmp_path}/src", f"file://{tmp_path}/out", opts())
    assert s.records_written == 10 and (tmp_path / "out" / "manifest.json").exists()
    assert not (tmp_path / "file:").exists()


def _readme_block(start: str, page: str = "README.md") -> list[str]:
    """The lines ``page`` (the README, or a guide) shows after the console line ``start``,
    up to the next ``$``."""

    lines = (ROOT / page).read_text().splitlines()
    i = lines.index(start) + 1
    block = []
    while not lines[i].startswith(("$", "```")):
        block.append(lines[i])
        i += 1
    return block


def _rows(lines: list[str]) -> list[tuple[str, int]]:
    """(label, column where the value starts) of each row of a summary table."""
    import re

    return [(m.group(1), m.end(2)) for line in lines
            if (m := re.match(r"^(\S+(?: \S+)*)( {2,})", line))]


def test_the_readme_shows_the_summary_table_and_the_files_as_they_are(tmp_path, rng, capsys):
    src = tmp_path / "pets"
    image_folder(src, rng, per_class=3)
    (src / "cat" / "broken.jpg").write_bytes(b"")
    assert main([str(src), str(tmp_path / "pets.shards"), "--on-error", "skip"]) == 0
    ours = capsys.readouterr().out.splitlines()
    shown = _readme_block("$ pack-dataset pets pets.shards --shard-size 4MB --on-error skip")
    assert [label for label, _ in _rows(ours)] == [label for label, _ in _rows(shown)]
    assert {col for _, col in _rows(ours)} == {col for _, col in _rows(shown)}
    assert "records written  6" in ours and "records in       7" in ours
    # --to webdataset: the rows shown, and what `ls` lists.
    assert main([str(tmp_path / "pets.shards"), str(tmp_path / "pets-wds"), "--to",
                 "webdataset"]) == 0
    ours = capsys.readouterr().out.splitlines()
    shown = _readme_block("$ pack-dataset pets.shards pets-wds --to webdataset",
                          "docs/guides/converting.md")
    assert shown[0] == "..." and all(line in ours for line in shown[1:] if "files out" in line)
    assert set(_rows(shown[1:])) <= {(label, col) for label, col in _rows(ours)}
    listed = sorted(p.name for p in (tmp_path / "pets-wds").iterdir()
                    if not p.name.startswith("."))
    assert _readme_block("$ ls pets-wds", "docs/guides/converting.md") == ["  ".join(listed)]
