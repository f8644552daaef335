"""``--from files`` / ``--from filelist`` with any files: text, JSON, .npy arrays, audio and
other bytes, sidecars grouped WebDataset-style; image-only folders stay as they were."""

from __future__ import annotations

import json

import numpy as np
import pytest

import formats
from packer import PackInputError, PackOptions, pack
from packer.cli import main
from tests.helpers_packer import dataset_files, jpeg


def opts(**kw) -> PackOptions:
    return PackOptions(**{"durable": False, "workers": 0, **kw})


def _value(v):
    return bytes(v) if isinstance(v, memoryview) else v


def mixed_tree(root, rng, n=4):
    """``a{i}.jpg`` + ``.json`` + ``.txt`` + ``.npy`` (length i + 1) + ``.wav``, one in a
    sub-folder; returns key -> the files' contents."""
    (root / "sub").mkdir(parents=True)
    want = {}
    for i in range(n):
        key = f"sub/a{i}" if i == n - 1 else f"a{i}"
        files = {"jpg": jpeg(rng), "json": json.dumps({"i": i, "tags": ["x"] * i}).encode(),
                 "txt": f"caption {i} \u00e9".encode(), "wav": b"RIFF" + bytes([i]) * 40}
        for ext, data in files.items():
            (root / f"{key}.{ext}").write_bytes(data)
        np.save(root / f"{key}.npy", np.arange(i + 1, dtype=np.float32))
        want[key] = files
    return want


def test_a_folder_of_text_packs_as_str(tmp_path):
    """What failed with 'doc0.txt: no known image signature'."""
    src = tmp_path / "texts"
    src.mkdir()
    for i in range(3):
        (src / f"doc{i}.txt").write_text(f"document {i}\nline two \u00e9")
    assert main([str(src), str(tmp_path / "texts.shards"), "--from", "files", "-q"]) == 0
    ds = formats.open_shards(tmp_path / "texts.shards")
    assert [(f.name, f.type) for f in ds.fields] == [("txt", "str"), ("key", "str")]
    assert [ds[i]["txt"] for i in range(3)] == [f"document {i}\nline two \u00e9" for i in range(3)]
    assert [ds[i]["key"] + ".txt" for i in range(3)] == [f"doc{i}.txt" for i in range(3)]


def test_sidecars_become_fields_of_one_record(tmp_path, rng):
    want = mixed_tree(tmp_path / "src", rng)
    s = pack(tmp_path / "src", tmp_path / "ds", opts())
    assert s.records_written == 4 and s.image_type == "jpeg"
    ds = formats.open_shards(tmp_path / "ds")
    types = {f.name: (f.type, f.dtype, f.shape) for f in ds.fields}
    assert types == {"jpg": ("jpeg", None, None), "json": ("json", None, None),
                     "npy": ("ndarray", "<f4", (None,)), "txt": ("str", None, None),
                     "wav": ("bytes", None, None), "key": ("str", None, None)}
    for i in range(len(ds)):
        r = {k: _value(v) for k, v in ds[i].items()}
        files = want[r["key"]]
        assert r["jpg"] == files["jpg"] and r["wav"] == files["wav"]
        assert r["txt"] == files["txt"].decode() and r["json"] == json.loads(files["json"])
        k = int(r["key"][-1])
        np.testing.assert_array_equal(r["npy"], np.arange(k + 1, dtype=np.float32))
    assert ds.metadata().column("width").to_pylist() == [24] * 4  # the image's header


def test_npy_of_fixed_shape_and_fortran_order(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        np.save(src / f"m{i}.npy", np.asfortranarray(np.arange(6, dtype="<i8").reshape(2, 3) + i))
    pack(src, tmp_path / "ds", opts())
    ds = formats.open_shards(tmp_path / "ds")
    assert ds.fields[0].shape == (2, 3) and ds.fields[0].dtype == "<i8"
    np.testing.assert_array_equal(ds[2]["npy"], np.arange(6).reshape(2, 3) + 2)


def test_other_extensions_are_text_by_content_or_bytes(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(2):
        (src / f"r{i}.md").write_text(f"# title {i}")
        (src / f"r{i}.bin").write_bytes(bytes([0, 255, i]))
    pack(src, tmp_path / "ds", opts())
    ds = formats.open_shards(tmp_path / "ds")
    assert {f.name: f.type for f in ds.fields} == {"bin": "bytes", "md": "str", "key": "str"}
    assert bytes(ds[1]["bin"]) == bytes([0, 255, 1]) and ds[1]["md"] == "# title 1"


def test_output_does_not_depend_on_workers(tmp_path, rng):
    mixed_tree(tmp_path / "src", rng, n=6)
    pack(tmp_path / "src", tmp_path / "a", opts(workers=0))
    pack(tmp_path / "src", tmp_path / "b", opts(workers=2))
    assert dataset_files(tmp_path / "a") == dataset_files(tmp_path / "b")


# name -> (how to spoil the tree, kind, words)
BAD = {
    "not-text": (lambda d: (d / "a1.txt").write_bytes(b"\xff\xfe bad"), "not-text", "a1.txt"),
    "bad-json": (lambda d: (d / "a1.json").write_text("{nope"), "bad-json", "a1.json"),
    "bad-array-dtype": (lambda d: np.save(d / "a1.npy", np.zeros(3, np.int16)), "bad-array",
                        "a1.npy"),
    "bad-array-cut": (lambda d: (d / "a1.npy").write_bytes((d / "a1.npy").read_bytes()[:-3]),
                      "bad-array", "a1.npy"),
    "pickled-npy": (lambda d: np.save(d / "a1.npy", np.array([{"x": 1}], dtype=object),
                                      allow_pickle=True), "bad-array", "Python objects"),
    "other-fields": (lambda d: (d / "a1.txt").unlink(), "other-fields", "['jpg', 'json'"),
    "no-extension": (lambda d: (d / "LICENSE").write_text("MIT"), "no-extension", "LICENSE"),
    "broken-image": (lambda d: (d / "a1.jpg").write_bytes(b"\xff\xd8\xff" + bytes(50)),
                     "corrupt", "a1.jpg"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_files_fail_or_are_skipped_and_listed(tmp_path, rng, case):
    spoil, kind, words = BAD[case]
    mixed_tree(tmp_path / "src", rng)
    spoil(tmp_path / "src")
    with pytest.raises(PackInputError) as e:
        pack(tmp_path / "src", tmp_path / "fail", opts())
    assert e.value.kind == kind and words in str(e.value)
    s = pack(tmp_path / "src", tmp_path / "skip", opts(on_error="skip"))
    assert s.records_in == s.records_written + s.records_skipped
    assert dict(s.skipped) == {kind: 1}
    line = json.loads((tmp_path / "skip" / "skipped.jsonl").read_text())
    assert line["kind"] == kind and words in line["reason"]


def test_a_file_list_of_any_files_keeps_its_columns(tmp_path):
    for i in range(3):
        np.save(tmp_path / f"x{i}.npy", np.full((i + 1, 2), i, np.float32))
    rows = [{"path": f"x{i}.npy", "label": ["cat", "dog"][i % 2], "w": i / 2} for i in range(3)]
    (tmp_path / "list.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pack(tmp_path / "list.jsonl", tmp_path / "ds", opts())
    ds = formats.open_shards(tmp_path / "ds")
    assert [f.name for f in ds.fields] == ["npy", "label", "key", "w"]
    assert ds.fields[0].shape == (None, 2) and ds.classes == ("cat", "dog")
    r = ds[2]
    assert (r["label"], r["key"], r["w"]) == (0, "x2.npy", 1.0)
    np.testing.assert_array_equal(r["npy"], np.full((3, 2), 2, np.float32))


def test_image_only_folders_pack_as_before(tmp_path, rng):
    """A folder of images keeps the image field and keys with extensions."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.jpg").write_bytes(jpeg(rng))
    pack(src, tmp_path / "ds", opts())
    ds = formats.open_shards(tmp_path / "ds")
    assert [f.name for f in ds.fields] == ["image", "key"] and ds[0]["key"] == "0.jpg"


def test_npy_files_of_any_byte_order_and_zero_dims_come_back(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", np.arange(6, dtype=">i4").reshape(2, 3))  # big-endian
    np.save(src / "b.npy", np.arange(6, dtype="<i4").reshape(2, 3) + 10)
    pack(src, tmp_path / "ds", opts(source="files"))
    ds = formats.open_shards(tmp_path / "ds")
    assert ds.fields[0].dtype == "<i4"
    assert [ds[i]["npy"].tolist() for i in range(2)] == [[[0, 1, 2], [3, 4, 5]],
                                                       [[10, 11, 12], [13, 14, 15]]]
    scalars = tmp_path / "scalars"
    scalars.mkdir()
    for i in range(2):
        np.save(scalars / f"{i}.npy", np.array(i + 0.5))
    pack(scalars, tmp_path / "ds0", opts(source="files"))
    ds = formats.open_shards(tmp_path / "ds0")
    assert ds.fields[0].shape == () and [float(ds[i]["npy"]) for i in range(2)] == [0.5, 1.5]


@pytest.mark.parametrize("name, body, kind, words", [
    ("n.json", '{"x": NaN}', "bad-json", "cannot be stored as JSON text"),
    ("n.json", '{"x": 1e400}', "bad-json", "cannot be stored as JSON text"),
    ("n.npy", None, "bad-array", "structured dtype"),
])
def test_files_the_writer_cannot_store_are_named_and_skippable(tmp_path, name, body, kind, words):
    src = tmp_path / "src"
    src.mkdir()
    ext = name.rsplit(".", 1)[1]
    if ext == "json":
        (src / "a.json").write_text('{"x": 1}')
        (src / name).write_text(body)
    else:
        np.save(src / "a.npy", np.zeros(2, [("x", "<f4"), ("y", "<f4")]))
        np.save(src / name, np.zeros(2, [("x", "<f4"), ("y", "<f4")]))
    with pytest.raises(PackInputError, match=words) as e:
        pack(src, tmp_path / "dst", opts(source="files"))
    assert e.value.kind == kind and (f"n.{ext}" in str(e.value) or f"a.{ext}" in str(e.value))
    s = pack(src, tmp_path / "ok", opts(source="files", on_error="skip"))
    assert s.skipped[kind] >= 1


@pytest.mark.parametrize("option", [{"max_side": 64}, {"to_jpeg": True}])
def test_image_options_on_files_without_images_are_refused(tmp_path, option):
    from formats.errors import InputUsageError

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello")
    (src / "b.txt").write_text("world")
    with pytest.raises(InputUsageError, match="no image field"):
        pack(src, tmp_path / "ds", opts(source="files", **option))
    assert not (tmp_path / "ds").exists()
