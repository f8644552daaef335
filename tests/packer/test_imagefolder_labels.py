"""``--to imagefolder`` that torchvision reads with the same labels (issue 18, item 1).

The judge is torchvision's ``ImageFolder`` where it imports. It is not in the dev
environment, so the tests apply its documented rule themselves
(``torchvision/datasets/folder.py``: ``find_classes`` labels the directories
directly under the root by their place in ``sorted(entry.name for entry in
os.scandir(root) if entry.is_dir())``, hidden ones included; ``make_dataset``
then takes, per class, the files below it with an image extension from
``IMG_EXTENSIONS``), see :func:`torchvision_rule`. torchvision 0.29.1's own
``folder.py``, run once by hand over every dataset of :data:`DATASETS`, gave the
same classes and samples. It refuses a class folder with no image unless
``ImageFolder(root, allow_empty=True)``: an empty class is a loud error there,
never a silent shift of the later labels.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import simplejpeg
from hypothesis import given
from hypothesis import strategies as st

import formats
from formats import DatasetWriter, Field
from formats.base import Record
from formats.codecs.imagefolder import ImageFolderSink, class_folders
from formats.errors import InputError, SchemaError
from formats.names import safe_name
from packer import PackOptions, pack
from packer.resolve import list_source

FIELDS = (Field("image", "image"), Field("label", "int"), Field("key", "str"))
# torchvision 0.2x IMG_EXTENSIONS
TORCHVISION_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff",
                          ".webp")


def torchvision_rule(root: Path) -> tuple[list[str], dict[str, int]]:
    """(classes, file path relative to root -> label) as torchvision's ImageFolder
    assigns them (the rule quoted in the module docstring)."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = {}
    for label, name in enumerate(classes):
        for folder, _, files in sorted(os.walk(root / name, followlinks=True)):
            for f in sorted(files):
                if f.lower().endswith(TORCHVISION_EXTENSIONS):
                    samples[(Path(folder) / f).relative_to(root).as_posix()] = label
    return classes, samples


def torchvision_itself(root: Path) -> tuple[list[str], dict[str, int]] | None:
    try:
        from torchvision.datasets import ImageFolder
    except (ImportError, RuntimeError):  # RuntimeError: its C++ ops built for another torch
        return None
    ds = ImageFolder(str(root), allow_empty=True)
    return list(ds.classes), {Path(p).relative_to(root).as_posix(): t for p, t in ds.samples}


def image(rng, i: int) -> bytes:
    arr = rng.integers(0, 256, (6 + i % 4, 8, 3), dtype=np.uint8)
    if i % 3 == 2:  # some PNGs among the JPEGs
        return cv2.imencode(".png", arr)[1].tobytes()
    return simplejpeg.encode_jpeg(arr, 80)


# name -> (class names or None, labels of the records)
DATASETS = {
    "an empty class": (["cat", "dog", "emu"], [0, 2, 0, 2, 2]),
    "twelve unnamed classes": (None, [11, 0, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 2]),
    "unnamed with a gap": (None, [0, 3, 3]),
    "spaces, slashes, unicode, duplicates after sanitizing": (
        ["b/c", "b_c", " z", "a b", "ünï", "Ω", "Cat", "cat", ".hidden", "classes.json", "",
         "a:b", "a?b", "zz"],
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 1]),  # "zz" (13) has no record
    "valid unique sorted names": (["apple", "banana", "cherry"], [2, 1, 0, 1]),
}


def make_shards(root: Path, rng, classes, labels) -> list[dict]:
    recs = [{"image": image(rng, i), "label": lab, "key": f"orig/{i:03d}"}
            for i, lab in enumerate(labels)]
    with DatasetWriter(root, FIELDS, classes=classes, records_per_shard=4,
                       created_by={"tool": "tests"}, durable=False) as w:
        for r in recs:
            w.write(r)
    return recs


def opts(**kw) -> PackOptions:
    return PackOptions(**{"workers": 0, "durable": False, "records_per_shard": 4, **kw})


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_shards_to_imagefolder_to_shards_keeps_every_label(tmp_path, rng, name):
    classes, labels = DATASETS[name]
    recs = make_shards(tmp_path / "a", rng, classes, labels)
    count = len(classes) if classes is not None else max(labels) + 1
    names = list(classes) if classes is not None else [f"{i:03d}" for i in range(count)]

    pack(tmp_path / "a", tmp_path / "if", opts(source="shards", sink="imagefolder"))
    out = tmp_path / "if"
    # Every class has a folder (empty ones too), in label order as torchvision sorts.
    folders, samples = torchvision_rule(out)
    assert folders == list(class_folders(names if classes is not None else count))
    assert len(folders) == count and len(set(folders)) == count
    assert json.loads((out / "classes.json").read_text("utf-8")) == names
    # Each record once, in its class's folder, bytes unchanged; torchvision's label.
    by_stem = {Path(p).stem: p for p in samples}
    assert len(samples) == len(recs)
    for i, r in enumerate(recs):
        path = by_stem[f"{i:03d}"]
        assert samples[path] == r["label"], (path, r["label"])
        assert (out / path).read_bytes() == r["image"]
    judged = torchvision_itself(out)
    if judged is not None:
        assert judged == (folders, samples)

    # ... and back: class names from classes.json, labels by torchvision's order.
    pack(out, tmp_path / "b", opts())
    ds = formats.open_shards(tmp_path / "b")
    assert list(ds.classes) == names
    got = {Path(ds[i]["key"]).stem: (bytes(ds[i]["image"]), int(ds[i]["label"]), ds[i]["key"])
           for i in range(len(ds))}
    assert len(got) == len(recs)
    for i, r in enumerate(recs):
        data, label, key = got[f"{i:03d}"]
        assert (data, label) == (r["image"], r["label"])
        assert samples[key] == label  # the same label torchvision gives that file


def test_a_folder_tree_without_classes_json_is_labelled_by_its_folder_names(tmp_path, rng):
    recs = make_shards(tmp_path / "a", rng, ["b/c", "b_c"], [0, 1, 1])
    pack(tmp_path / "a", tmp_path / "if", opts(source="shards", sink="imagefolder"))
    (tmp_path / "if" / "classes.json").unlink()
    listing = list_source("imagefolder", tmp_path / "if")
    assert listing.classes == ("000-b_c", "001-b_c")
    assert listing.columns["label"] == [r["label"] for r in recs]


# -- the naming rule ---------------------------------------------------------------------

def test_folder_names_by_the_rule():
    assert class_folders(3) == ("000", "001", "002")
    assert class_folders(12)[9:] == ("009", "010", "011")
    wide = class_folders(1001)
    assert wide[0] == "0000" and wide[-1] == "1000" and sorted(wide) == list(wide)
    assert class_folders(["apple", "banana"]) == ("apple", "banana")
    assert class_folders(["banana", "apple"]) == ("000-banana", "001-apple")  # unsorted
    assert class_folders(["b/c", "b_c"]) == ("000-b_c", "001-b_c")           # merged
    assert class_folders([" z", "a"]) == ("000-z", "001-a")                   # moved
    assert class_folders(["Cat", "cat"]) == ("000-Cat", "001-cat")            # case
    assert class_folders(["classes.json"]) == ("000-classes.json",)         # our file
    assert class_folders(["..", "x"]) == ("000", "001-x")                    # nothing left


@given(st.lists(st.text(max_size=12) | st.sampled_from(["a", "A", "b/c", "b_c", " z", "."]),
                max_size=30))
def test_folder_names_sort_in_label_order_never_collide_and_stay_inside(names):
    folders = class_folders(names)
    assert len(folders) == len(names)
    assert sorted(folders) == list(folders)
    assert len({f.casefold() for f in folders}) == len(folders)
    for f in folders:
        assert safe_name(f, "") == f and f != "classes.json" and not f.startswith(".")


# -- the sink's edges ----------------------------------------------------------------------

def test_unnamed_classes_past_a_thousand_widen_every_folder(tmp_path, rng):
    img = image(rng, 0)
    with ImageFolderSink(tmp_path / "o", FIELDS) as sink:
        for i, label in enumerate([5, 1000, 0, 5]):
            sink.write(Record({"image": img, "label": label, "key": f"{i}.jpg"}))
    folders, samples = torchvision_rule(tmp_path / "o")
    assert folders == [f"{i:04d}" for i in range(1001)]
    assert samples == {"0005/0.jpg": 5, "1000/1.jpg": 1000, "0000/2.jpg": 0, "0005/3.jpg": 5}
    assert json.loads((tmp_path / "o" / "classes.json").read_text()) == folders


def test_a_label_no_folder_can_hold_is_refused(tmp_path, rng):
    img = image(rng, 0)
    with (pytest.raises(SchemaError, match="label 3 has no class name"),
          ImageFolderSink(tmp_path / "a", FIELDS, ["x", "y", "z"]) as sink):
        sink.write(Record({"image": img, "label": 3, "key": "a.jpg"}))
    with (pytest.raises(SchemaError, match="negative label"),
          ImageFolderSink(tmp_path / "b", FIELDS) as sink):
        sink.write(Record({"image": img, "label": -1, "key": "a.jpg"}))
    assert not (tmp_path / "a" / "classes.json").exists()  # a failed write completes nothing


def test_without_a_label_files_go_to_dst_and_no_classes_json(tmp_path, rng):
    fields = (Field("image", "jpeg"), Field("key", "str"))
    with ImageFolderSink(tmp_path / "o", fields, ["x"]) as sink:
        sink.write(Record({"image": image(rng, 0), "key": "k/a.jpg"}))
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["a.jpg"]


# -- reading an image folder back ---------------------------------------------------------

def written(tmp_path: Path, rng, classes=("b/c", "b_c", "empty"), labels=(0, 1, 1)) -> Path:
    make_shards(tmp_path / "a", rng, list(classes), list(labels))
    pack(tmp_path / "a", tmp_path / "if", opts(source="shards", sink="imagefolder"))
    return tmp_path / "if"


def test_classes_json_that_disagrees_with_the_folders_is_refused_by_name(tmp_path, rng):
    src = written(tmp_path, rng)
    assert list_source("imagefolder", src).classes == ("b/c", "b_c", "empty")
    (src / "002-empty").rmdir()  # what a copy that drops empty folders does
    with pytest.raises(InputError, match=r"classes.json does not match the class folders: "
                                        r"no folder for 1 class\(es\) it names, \['002-empty'\]"):
        list_source("imagefolder", src)
    (src / "002-empty").mkdir()
    (src / "extra").mkdir()
    with pytest.raises(InputError, match=r"1 folder\(s\) it does not name, \['extra'\]") as e:
        pack(src, tmp_path / "c", opts())
    assert e.value.path == str(src / "classes.json")


@pytest.mark.parametrize("text", ['{"0": "cat"}', "[1, 2]", "not json"])
def test_a_classes_json_that_is_not_a_list_of_names_is_refused_by_name(tmp_path, rng, text):
    src = written(tmp_path, rng)
    (src / "classes.json").write_text(text)
    with pytest.raises(InputError, match="fix or move it") as e:
        list_source("imagefolder", src)
    assert e.value.path == str(src / "classes.json")


def test_a_folder_named_classes_json_is_a_class_like_any_other(tmp_path, rng):
    for name in ("a", "classes.json"):
        (tmp_path / "src" / name).mkdir(parents=True)
        (tmp_path / "src" / name / "x.jpg").write_bytes(image(rng, 0))
    listing = list_source("imagefolder", tmp_path / "src")
    assert listing.classes == ("a", "classes.json") and listing.columns["label"] == [0, 1]


# -- on object storage, which has no empty folders -------------------------------------

@pytest.fixture(scope="module")
def endpoint():
    from helpers_s3 import s3_endpoint

    with s3_endpoint() as url:
        yield url


def test_a_remote_image_folder_takes_names_and_labels_from_classes_json(endpoint, tmp_path, rng):
    from helpers_s3 import new_bucket, s3_uri

    from formats.storage import open_location
    from packer.sources.folders import list_remote

    src = written(tmp_path, rng, classes=("b/c", "empty", "zz"), labels=(0, 2, 2))
    loc = open_location(s3_uri(endpoint, new_bucket(endpoint), "tree"))
    for f in sorted(src.rglob("*")):
        if f.is_file() and not f.name.startswith("."):
            loc.upload(f, f.relative_to(src).as_posix())
    remote, local = list_remote("imagefolder", loc), list_source("imagefolder", src)
    assert remote.classes == local.classes == ("b/c", "empty", "zz")
    assert remote.columns["label"] == local.columns["label"] == [0, 2, 2]  # "zz" keeps 2
    assert remote.empty_classes == local.empty_classes == ("empty",)
    loc.upload(_write(tmp_path / "x.jpg", image(rng, 0)), "stray/x.jpg")
    with pytest.raises(InputError, match=r"it does not name, \['stray'\]"):
        list_remote("imagefolder", loc)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
