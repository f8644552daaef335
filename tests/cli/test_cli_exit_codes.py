"""Exit codes of both command lines (DESIGN.md): 2 and the usage block for what the
command line says by itself; 1 and one line for anything found by reading SRC or DST."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from packer.cli import main as pack_main
from reader.inspect.cli import main as inspect_main
from tests.helpers_coco import make_coco
from tests.helpers_packer import image_folder


def run(main, argv, capsys) -> tuple[int, str]:
    """``main(argv)``'s exit status (argparse's SystemExit too) and its stderr."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def assert_usage(code: int, err: str, prog: str) -> None:
    assert code == 2, err
    assert err.startswith(f"usage: {prog}") and ": error: " in err, err


def assert_data_error(code: int, err: str, prog: str, *words: str) -> None:
    assert code == 1, err
    assert "usage:" not in err and err.count("\n") == 1, err  # one line, no usage block
    assert err.startswith(f"{prog}: error: ") and all(w in err for w in words), err


@pytest.fixture
def src(tmp_path, rng):
    image_folder(tmp_path / "src", rng, per_class=2)
    return tmp_path / "src"


def test_pack_dataset_usage_errors_print_the_usage_block(tmp_path, src, capsys):
    dst = tmp_path / "dst"
    for argv in (["--bogus"],                                  # a wrong flag (argparse)
                 ["--shard-size", "lots"],                     # a bad value (argparse)
                 ["--workers", "many"],
                 ["--seed", "3"],                              # options that contradict
                 ["--resume", "--overwrite"],
                 ["--to", "webdatset"],                        # no such format
                 ["--from", "imagefolder", "--annotations", "a.json"],
                 ["--field", "path=str"]):
        code, err = run(pack_main, [src, dst, "-q", *argv], capsys)
        assert_usage(code, err, "pack-dataset")
    code, err = run(pack_main, [src, "s3://bucket/ds?bogus=1", "-q"], capsys)  # a bad URI
    assert_usage(code, err, "pack-dataset")
    code, err = run(pack_main, [src, src / "out", "-q"], capsys)  # DST inside SRC
    assert_usage(code, err, "pack-dataset")
    assert not dst.exists() and not (src / "out").exists()


def test_pack_dataset_refusals_about_dst_are_one_line_and_status_1(tmp_path, src, capsys):
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "manifest.json")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text("{not json")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    done = tmp_path / "done"
    assert pack_main([str(src), str(done), "-q"]) == 0
    for dst, words in ((user, ("did not write", "notes.txt")),
                       (fifo, ("FIFO", "never replaced")),
                       (bad, ("not a valid shardpack manifest",)),
                       (a_file, ("not a folder",)),
                       (done, ("already a dataset", "--overwrite"))):
        code, err = run(pack_main, [src, dst, "-q"], capsys)
        assert_data_error(code, err, "pack-dataset", str(dst), *words)
    assert (user / "notes.txt").read_text() == "mine"


def test_pack_dataset_refusals_about_src_are_one_line_and_status_1(tmp_path, src, rng,
                                                                    capsys):
    dst = tmp_path / "dst"
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "x.unknownformat").write_bytes(b"\x00\x01")
    (tmp_path / "list.csv").write_text("path,v\n" + "\n".join(
        f"{p.relative_to(tmp_path)},1" for p in sorted(src.rglob("*.jpg"))) + "\n")
    half = tmp_path / "half"
    half.mkdir()
    (half / "_journal.jsonl").write_text('{"fields": []}\n')
    images_dir, ann = make_coco(tmp_path / "coco", rng, n=2)
    doc = json.loads(ann.read_text())
    doc["annotations"][0]["segmentation"] = {"counts": [1200], "size": [30, 40]}
    ann.write_text(json.dumps(doc))
    cases = (
        ([tmp_path / "nope", dst], ("does not exist",)),
        ([tmp_path / "nope-*.tfrecord", dst], ("matches no file",)),
        ([tmp_path / "list.csv", dst, "--from", "imagefolder"], ("needs a folder",)),
        ([tmp_path / "list.csv", dst, "--field", "nope=json"], ("--field names ['nope']",)),
        ([half, dst], ("did not finish", "--resume")),
        ([src, dst, "--from", "coco", "--annotations", tmp_path / "none.json"],
         ("none.json", "no such file")),
        ([images_dir, dst, "--annotations", ann, "--max-side", "16"], ("RLE mask",)),
    )
    for argv, words in cases:
        code, err = run(pack_main, [*argv, "-q"], capsys)
        assert_data_error(code, err, "pack-dataset", *words)
    code, err = run(pack_main, [odd, dst, "--from", "files", "--max-side", "8", "-q"], capsys)
    assert_data_error(code, err, "pack-dataset", "no image field")
    assert not dst.exists()


def test_inspect_shards_usage_and_data_errors(tmp_path, src, capsys):
    ds = tmp_path / "ds"
    assert pack_main([str(src), str(ds), "-q"]) == 0
    for argv in ([ds, "frobnicate"], [ds, "ls", "--limit", "-1"], [ds, "show", "one"],
                 ["s3://bucket/ds", "info", "--follow-symlinks"]):
        code, err = run(inspect_main, argv, capsys)
        assert_usage(code, err, "inspect-shards")
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "manifest.json")
    for argv, words in (([tmp_path / "nothing", "info"], ("does not exist",)),
                        ([fifo, "info"], ("FIFO",)),
                        ([ds, "show", "99"], ("out of range",)),
                        ([ds, "extract", "0", "--out", tmp_path / "x", "--field", "nope"],
                         ("no field 'nope'",)),
                        ([ds, "ls", "--label", "gnu"], ("no class named 'gnu'",))):
        code, err = run(inspect_main, argv, capsys)
        assert_data_error(code, err, "inspect-shards", *words)
    # --json says so on stdout as well, for scripts.
    assert inspect_main([str(ds), "show", "99", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and "out of range" in out["error"]


def test_the_console_scripts_exit_the_same_way(tmp_path, src):
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    for module, argv, status in (("packer.cli", [src, user, "-q"], 1),
                                 ("packer.cli", [src, user, "--seed", "3"], 2),
                                 ("reader.inspect.cli", [tmp_path / "nothing", "info"], 1),
                                 ("reader.inspect.cli", [user, "frobnicate"], 2)):
        p = subprocess.run([sys.executable, "-m", module, *map(str, argv)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == status, (module, argv, p.stderr)
        assert ("usage:" in p.stderr) == (status == 2) and "Traceback" not in p.stderr


def test_a_bad_input_that_stops_the_pack_names_the_skip_option_once(tmp_path, src, capsys):
    (src / "cat").mkdir(exist_ok=True)
    notes = src / "cat" / "notes.txt"
    notes.write_text("not an image")
    dst = tmp_path / "dst"
    code, err = run(pack_main, [src, dst, "-q"], capsys)
    assert_data_error(code, err, "pack-dataset", str(notes), "[not-an-image]", "--on-error skip")
    assert err.count("--on-error skip") == 1
    code, err = run(pack_main, [src, dst, "-q", "--on-error", "skip"], capsys)
    assert code == 0, err
    assert "not-an-image" in (dst / "skipped.jsonl").read_text()
