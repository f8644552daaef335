"""inspect-shards: every command on a packed dataset and on a damaged one, tables and --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from formats import DatasetWriter, Field, open_shards
from formats.shard.verify import ALL_MATCH
from reader.inspect.cli import COMMANDS, main
from tests.helpers_codecs import CLASSES, IMAGE_FIELDS, make_dataset, make_records
from tests.helpers_manifest import edit_table_ref


@pytest.fixture
def dataset(tmp_path, rng):
    recs = make_records(rng, 9)
    return recs, make_dataset(tmp_path / "ds", recs)


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_info(dataset, capsys):
    _recs, root = dataset
    code, out, _ = run(capsys, root, "info")
    assert code == 0
    assert "records" in out and "9" in out and "jpeg" in out and "cat, dog, emu" in out
    code, out, _ = run(capsys, root, "info", "--json")
    info = json.loads(out)
    assert (info["records"], info["shards"], info["classes"]) == (9, 3, CLASSES)
    assert info["format_version"] == "2.0" and info["created_by"] == {"tool": "tests"}
    assert [f["name"] for f in info["fields"]] == ["image", "label", "key"]


def test_verify_clean(dataset, capsys):
    _, root = dataset
    code, out, _ = run(capsys, root, "verify")
    assert code == 0 and out.startswith(f"{ALL_MATCH} (") and "checked)" in out
    code, out, _ = run(capsys, root, "verify", "--json")
    assert json.loads(out) == {"ok": True, "problems": []}


def test_verify_damaged(dataset, capsys):
    _, root = dataset
    ds = open_shards(root)
    _, offset, _ = ds.spans([5], "image")
    shard = ds.shards[1].data_path
    ds.close()
    data = bytearray(shard.read_bytes())
    data[int(offset[0]) + 10] ^= 0xFF
    shard.write_bytes(bytes(data))
    code, out, _ = run(capsys, root, "verify")
    assert code == 1
    assert "DAMAGED" in out and "shard-00001.rec" in out
    code, out, _ = run(capsys, root, "verify", "--json")
    problems = json.loads(out)["problems"]
    assert code == 1
    rec = [p for p in problems if p["record"] is not None]
    assert rec == [{"file": "shard-00001.rec", "record": 1, "field": "image",
                    "offset": int(offset[0]), "what": rec[0]["what"]}]
    assert any(p["record"] is None and "file checksum" in p["what"] for p in problems)


def test_ls(dataset, capsys):
    recs, root = dataset
    code, out, _ = run(capsys, root, "ls", "--json", "--limit", "3", "--offset", "2")
    rows = json.loads(out)
    assert [r["index"] for r in rows] == [2, 3, 4]
    assert rows[0]["key"] == recs[2]["key"] and rows[0]["width"] == recs[2]["width"]
    code, out, _ = run(capsys, root, "ls", "--json", "--label", "1", "--limit", "100")
    assert [r["index"] for r in json.loads(out)] == [1, 4, 7]
    code, out, _ = run(capsys, root, "ls")
    assert code == 0 and recs[0]["key"] in out and f"{recs[0]['width']}x{recs[0]['height']}" in out


def test_show(dataset, capsys):
    recs, root = dataset
    code, out, _ = run(capsys, root, "show", "4", "--json")
    info = json.loads(out)
    assert code == 0 and info["shard"] == "shard-00001.rec" and info["record"] == 0
    img = info["fields"]["image"]
    assert img["size"] == len(recs[4]["image"]) and img["sniffed"] == "jpeg"
    assert img["head"].startswith("ff d8 ff")
    assert info["fields"]["label"]["value"] == recs[4]["label"]
    code, out, _ = run(capsys, root, "show", "4")
    assert "jpeg" in out and repr(recs[4]["key"]) in out


def test_extract(dataset, capsys, tmp_path):
    recs, root = dataset
    code, _, _ = run(capsys, root, "extract", "6", "--out", tmp_path / "x.jpg")
    assert code == 0 and (tmp_path / "x.jpg").read_bytes() == recs[6]["image"]
    code, _, _ = run(capsys, root, "extract", "6", "--out", tmp_path / "k", "--field", "key")
    assert (tmp_path / "k").read_text() == recs[6]["key"]
    code, _, err = run(capsys, root, "extract", "6", "--out", tmp_path / "n", "--field", "nope")
    assert code == 1 and "no field 'nope'" in err and "usage:" not in err


def test_stats(dataset, capsys, tmp_path):
    recs, root = dataset
    code, out, _ = run(capsys, root, "stats", "--json")
    stats = json.loads(out)
    assert {k: v["count"] for k, v in stats["labels"].items()} == {"0": 3, "1": 3, "2": 3}
    assert stats["labels"]["2"]["class"] == "emu"
    # size = the record's stored bytes, all fields (image + 8-byte label + key)
    assert stats["size_bytes"]["max"] == max(len(r["image"]) + 8 + len(r["key"]) for r in recs)
    assert stats["width"]["min"] == min(r["width"] for r in recs)
    code, out, _ = run(capsys, root, "stats")
    assert code == 0 and "emu" in out and "p50" in out


def test_stats_samples_shards_of_a_large_dataset_and_says_so(dataset, capsys):
    _, root = dataset  # 9 records in 3 shards
    code, out, _ = run(capsys, root, "stats", "--shards", "2", "--json")
    stats = json.loads(out)
    assert code == 0 and stats["records"] == 9
    assert stats["sampled"] == {"shards": 2, "of_shards": 3, "records": 5, "of_records": 9,
                                "seed": 0}
    assert sum(v["count"] for v in stats["labels"].values()) == 5  # the sample's records
    code, out, _ = run(capsys, root, "stats", "--shards", "2")
    assert "sampled: 2 of 3 shards at random (seed 0), 5 records" in out
    for argv in (("--shards", "3"), ("--shards", "2", "--all")):
        code, out, _ = run(capsys, root, "stats", *argv, "--json")
        stats = json.loads(out)
        assert stats["sampled"] is None and sum(v["count"] for v in stats["labels"].values()) == 9
    with pytest.raises(SystemExit):
        run(capsys, root, "stats", "--shards", "0")
    assert "must be 1 or more" in capsys.readouterr().err


def test_stats_plot(dataset, capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib")
    _, root = dataset
    code, _, _ = run(capsys, root, "stats", "--plot", tmp_path / "s.png")
    assert code == 0 and (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_errors_and_usage(dataset, capsys, tmp_path):
    _, root = dataset
    code, _, err = run(capsys, tmp_path / "nothing", "info")
    assert code == 1 and "the path does not exist" in err  # as every command says it
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, tmp_path / "empty", "info")
    assert code == 1 and "no manifest.json" in err
    code, _, err = run(capsys, root, "show", "99")  # found by reading DST: a data error
    assert code == 1 and "out of range" in err and "usage:" not in err
    with pytest.raises(SystemExit) as exc:
        main([str(root), "frobnicate"])
    assert exc.value.code == 2


def test_errors_say_error_and_a_negative_count_is_a_usage_error(dataset, capsys, tmp_path):
    _, root = dataset
    code, _, err = run(capsys, tmp_path / "nothing", "info")
    assert code == 1 and err.startswith("inspect-shards: error: ") and "Traceback" not in err
    for option in ("--limit", "--offset"):
        with pytest.raises(SystemExit) as exc:
            main([str(root), "ls", option, "-5"])
        assert exc.value.code == 2
        assert "must be 0 or more" in capsys.readouterr().err


def test_commands_table_is_extensible():
    assert [c[0] for c in COMMANDS] == ["info", "verify", "ls", "show", "extract", "stats",
                                       "monitor-report", "ledger-diff"]
    assert all(callable(c[1]) and callable(c[2]) for c in COMMANDS)


# -- both orders, class names, --version, -q ------------------------------------------

def test_the_command_may_come_before_the_dataset(dataset, capsys, tmp_path):
    _, root = dataset
    for argv in (["info", "--json"], ["ls", "--json", "--limit", "4"], ["show", "4", "--json"],
                 ["stats", "--json"]):
        first = run(capsys, root, *argv)
        second = run(capsys, argv[0], root, *argv[1:])
        assert first[0] == 0 and first == second, argv
    code, _, _ = run(capsys, "extract", root, "6", "--out", tmp_path / "x.jpg")
    assert code == 0 and (tmp_path / "x.jpg").exists()
    with pytest.raises(SystemExit) as exc:
        main(["info"])
    assert exc.value.code == 2 and "DATASET" in capsys.readouterr().err


def test_a_dataset_named_like_a_command_is_read_in_the_old_order(dataset, capsys, monkeypatch):
    _, root = dataset
    monkeypatch.chdir(root.parent)
    root.rename(root.parent / "info")
    code, out, _ = run(capsys, "info", "ls", "--json")  # DST "info", COMMAND ls
    assert code == 0 and len(json.loads(out)) == 9


def test_ls_label_takes_a_class_name_or_a_number(dataset, capsys):
    _, root = dataset
    by_name = run(capsys, root, "ls", "--json", "--label", "dog")
    by_number = run(capsys, root, "ls", "--json", "--label", "1")
    assert by_name == by_number and [r["index"] for r in json.loads(by_name[1])] == [1, 4, 7]
    code, _, err = run(capsys, root, "ls", "--label", "gnu")
    assert code == 1 and "no class named 'gnu'" in err and "'cat', 'dog', 'emu'" in err


def test_ls_label_name_on_a_dataset_without_classes_is_refused_in_one_line(tmp_path, rng, capsys):
    from formats import DatasetWriter

    root = tmp_path / "plain"
    with DatasetWriter(root, IMAGE_FIELDS, records_per_shard=4, durable=False) as w:
        for r in make_records(rng, 3):
            w.write({f.name: r[f.name] for f in IMAGE_FIELDS})
    code, _, err = run(capsys, root, "ls", "--label", "cat")
    assert code == 1 and "has no class names" in err and "usage:" not in err
    code, out, _ = run(capsys, root, "ls", "--json", "--label", "2")
    assert code == 0 and [r["label"] for r in json.loads(out)] == [2]


def test_class_name_wins_over_a_number(tmp_path, rng):
    from formats.shard.summary import list_records, resolve_label

    assert resolve_label(["7", "3"], "3") == 1
    assert resolve_label(["7", "3"], "0") == 0
    assert resolve_label(None, 5) == 5
    with pytest.raises(ValueError, match="no class named 'x'"):
        resolve_label(["a"], "x")
    root = make_dataset(tmp_path / "ds", make_records(rng, 6))
    assert [r["index"] for r in list_records(root, label="emu")] == [2, 5]


def test_version_and_short_quiet(dataset, capsys):
    _, root = dataset
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and out.startswith("inspect-shards ") and len(out.split()) == 2
    code, out, err = run(capsys, root, "verify", "-q")
    assert code == 0 and out.startswith(ALL_MATCH) and err == ""


# -- files the user names -------------------------------------------------------------

def test_extract_and_plot_create_missing_folders(dataset, capsys, tmp_path):
    recs, root = dataset
    out = tmp_path / "missing" / "dir" / "a.jpg"
    code, _, _ = run(capsys, root, "extract", "6", "--out", out)
    assert code == 0 and out.read_bytes() == recs[6]["image"]
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib")
    plot = tmp_path / "other" / "dir" / "x.png"
    code, _, _ = run(capsys, root, "stats", "--plot", plot)
    assert code == 0 and plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("into_folder", [False, True])
def test_extract_refuses_to_overwrite_a_file_unless_force(dataset, capsys, tmp_path,
                                                          into_folder):
    recs, root = dataset
    out = tmp_path / "out" / "6.image.jpg"
    out.parent.mkdir()
    out.write_bytes(b"mine")
    target = f"{out.parent}/" if into_folder else out
    for extra in ([], ["--json"]):
        code, stdout, err = run(capsys, root, "extract", "6", "--out", target, *extra)
        assert code == 1 and f"{out} exists: pass --force" in err and "usage:" not in err
        assert out.read_bytes() == b"mine"
        if extra:
            assert json.loads(stdout)["ok"] is False
    # A link in its place is not written through either.
    link = tmp_path / "link.jpg"
    link.symlink_to(tmp_path / "nowhere.jpg")
    code, _, err = run(capsys, root, "extract", "6", "--out", link)
    assert code == 1 and "link.jpg exists" in err and not (tmp_path / "nowhere.jpg").exists()
    code, out_text, _ = run(capsys, root, "extract", "6", "--out", target, "--force")
    assert code == 0 and out.read_bytes() == recs[6]["image"] and f"to {out}" in out_text


def test_stats_plot_without_matplotlib_names_the_extra(dataset, capsys, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    _, root = dataset
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(SystemExit) as info:
        main([str(root), "stats", "--plot", str(tmp_path / "s.png")])
    assert "pip install 'shardpack[plot]'" in str(info.value.code)
    assert not (tmp_path / "s.png").exists()


def test_a_file_in_the_way_of_out_is_an_error_without_traceback(dataset, capsys, tmp_path):
    _, root = dataset
    (tmp_path / "afile").write_bytes(b"")
    code, _, err = run(capsys, root, "extract", "6", "--out", tmp_path / "afile" / "x.jpg")
    assert code == 1 and err.startswith("inspect-shards: error: ") and "is a file" in err
    assert "Traceback" not in err


# -- --follow-symlinks ----------------------------------------------------------------

@pytest.fixture
def linked_out(dataset, tmp_path):
    """The dataset with every file of shard 1 a symlink to a copy outside its folder."""
    recs, root = dataset
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("shard-00001.rec", "shard-00001.idx", "shard-00001.meta.parquet"):
        (root / name).rename(outside / name)
        (root / name).symlink_to(outside / name)
    return recs, root


@pytest.mark.parametrize("argv", [["info"], ["verify"], ["ls"], ["stats"], ["show", "5"],
                                  ["extract", "5", "--out", "{tmp}/r.jpg"]])
def test_links_out_are_refused_unless_follow_symlinks(linked_out, capsys, tmp_path, argv):
    recs, root = linked_out
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, out, err = run(capsys, root, *argv, "--follow-symlinks")
    assert code == 0, err
    if argv[0] == "extract":
        assert (tmp_path / "r.jpg").read_bytes() == recs[5]["image"]
    if argv[0] == "info":  # the manifest is a plain file: info reads nothing else
        return
    code, out, err = run(capsys, root, *argv)
    said = out if argv[0] == "verify" else err  # verify lists what it found, on stdout
    assert code == 1 and "symlink" in said and "--follow-symlinks" in said
    assert "Traceback" not in err


def test_follow_symlinks_is_refused_for_a_remote_dataset(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["s3://bucket/ds", "info", "--follow-symlinks"])
    assert exc.value.code == 2 and "local datasets only" in capsys.readouterr().err



def test_a_closed_pipe_ends_quietly(dataset):
    """`inspect-shards DST ls | head -1`: no error once the reader has stopped reading."""
    import subprocess
    import sys

    _, root = dataset
    proc = subprocess.Popen([sys.executable, "-m", "reader.inspect.cli", str(root), "ls"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == ""


@pytest.mark.parametrize("table", ["../x.arrow", "/abs/x.arrow", "a\\b.arrow"])
def test_an_unsafe_table_name_gets_no_follow_symlinks_hint(dataset, capsys, table):
    """The flag only follows links: for a name that leaves the folder it cannot help."""
    _, root = dataset
    edit_table_ref(root, name=table)
    for argv in (["info"], ["ls"], ["show", "0"]):
        code, _, err = run(capsys, root, *argv)
        assert code == 1 and "unsafe shard table name" in err, err
        assert "--follow-symlinks" not in err


def test_the_hint_is_given_for_a_link_even_inside_a_linked_dataset_folder(linked_out, capsys,
                                                                           tmp_path):
    _, root = linked_out
    (tmp_path / "alias").symlink_to(root)  # the dataset folder itself may be a link
    code, _, err = run(capsys, tmp_path / "alias", "show", "5")
    assert code == 1 and "--follow-symlinks" in err
    edit_table_ref(root, name="../x.arrow")
    code, _, err = run(capsys, tmp_path / "alias", "show", "5")
    assert code == 1 and "--follow-symlinks" not in err


def test_usage_names_the_dataset_not_a_destination(capsys):
    for argv in (["ds", "show"], ["show"]):
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert "DATASET" in err and "DST" not in err, err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "DST" not in capsys.readouterr().out


def test_extract_into_a_folder_maps_a_hostile_field_name_inside_it(tmp_path, capsys):
    root = tmp_path / "ds"
    with DatasetWriter(root, [Field("../../up", "bytes"), Field("..\\x", "bytes")],
                       durable=False) as w:
        w.write({"../../up": b"one", "..\\x": b"two"})
    out = tmp_path / "a" / "b" / "out"
    for field, data in (("../../up", b"one"), ("..\\x", b"two")):
        code, text, err = run(capsys, root, "extract", "0", "--field", field, "--out", f"{out}/",
                              "--json")
        assert code == 0, err
        written = Path(json.loads(text)["out"])
        assert written.parent == out and written.read_bytes() == data
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file() and "ds" not in p.parts) \
        == ["0._.._up.txt", "0._x.txt"]


def test_two_field_names_made_one_file_name_never_overwrite(tmp_path, capsys):
    root = tmp_path / "ds"
    with DatasetWriter(root, [Field("a/b", "bytes"), Field("a_b", "bytes")], durable=False) as w:
        w.write({"a/b": b"first", "a_b": b"second"})
    out = tmp_path / "out"
    assert run(capsys, root, "extract", "0", "--field", "a/b", "--out", f"{out}/")[0] == 0
    code, _, err = run(capsys, root, "extract", "0", "--field", "a_b", "--out", f"{out}/")
    assert code == 1 and "0.a_b.txt exists" in err and "--force" in err
    code, _, err = run(capsys, root, "extract", "0", "--field", "a/b", "--out", f"{out}/")
    assert code == 1 and "the file name for field 'a/b', made safe" in err
    assert (out / "0.a_b.txt").read_bytes() == b"first"
