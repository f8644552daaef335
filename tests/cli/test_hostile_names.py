"""A dataset whose own field names, keys and class names are hostile writes nothing
outside the output folder, and nothing twice, through the command lines a user runs
(issue 35, defect 3): ``inspect-shards extract --out DIR/``, ``pack-dataset --to
imagefolder`` and ``pack-dataset --to webdataset`` (and the tars extracted naively).

Each case runs in a child bounded in time and memory (``tests/hostile.py``); it
builds its dataset with the shard writer directly, runs the CLI, and raises
``Escaped`` (untyped: the test fails) when a file appears anywhere under its folder
but the dataset and the output, or a file was written over.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from hostile import run_case

from formats import DatasetWriter, Field
from tests.helpers_codecs import make_jpeg

MODULE = "test_hostile_names"
SECONDS = 20.0
PEAK_MB = 512

# Every kind of name the rule refuses (tests/formats/test_names.py holds the full list);
# the out folder sits four levels deep, so each "../" lands inside the case's folder.
HOSTILE = ["../../../up", "/abs/olute.jpg", "..\\..\\win.jpg", "nul\x00byte.jpg", "a/../..",
           "./..", "\uff0e\uff0e\uff0fdots.jpg", "x" * 300 + ".jpg", "ctl\x07\n.jpg", "..",
           "Same.jpg", "same.jpg", "s\u0061me.JPG", "caf\u00e9.jpg", "cafe\u0301.jpg", ""]


class Escaped(AssertionError):
    """A file outside the output folder, or fewer files than were written."""


def _files(top: Path) -> set[Path]:
    return {Path(d) / f for d, _, fs in os.walk(top) for f in fs}


def _check_inside(root: Path, out: Path, ds: Path, before: set[Path]) -> list[Path]:
    """The new files under ``out``; raises if any new file is anywhere else in ``root``."""
    new = _files(root) - before
    outside = sorted(p for p in new if out not in p.parents and ds not in p.parents)
    if outside:
        raise Escaped(f"written outside {out}: {[str(p) for p in outside]}")
    return sorted(p for p in new if out in p.parents)


def _image_dataset(ds: Path, n: int) -> list[bytes]:
    rng = np.random.default_rng(35)
    images = [make_jpeg(rng, 8 + i % 7, 9 + i % 5) for i in range(n)]
    with DatasetWriter(ds, [Field("image", "jpeg"), Field("label", "int"), Field("key", "str")],
                       classes=HOSTILE, records_per_shard=8, durable=False) as w:
        for i, data in enumerate(images):
            w.write({"image": data, "label": i % len(HOSTILE), "key": HOSTILE[i % len(HOSTILE)]})
    return images


def _quiet(main, argv) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(argv)


# -- the cases (run in the child) ----------------------------------------------------------

def extract_every_field(root: str) -> None:
    from reader.inspect.cli import main

    root = Path(root)
    ds, out = root / "ds", root / "a" / "b" / "c" / "out"
    names = [n for n in HOSTILE if n]  # a field name is never empty (the writer refuses one)
    with DatasetWriter(ds, [Field("key", "str"), *(Field(n, "bytes") for n in names)],
                       records_per_shard=8, durable=False) as w:
        w.write({"key": "../../k.jpg", **{n: f"payload {i}".encode() for i, n in enumerate(names)}})
    before = _files(root)
    wrote = {}
    for i, name in enumerate(names):
        code = _quiet(main, [str(ds), "extract", "0", "--field", name, "--out", f"{out}/"])
        if code == 0:
            wrote[i] = name
        elif code != 1:
            raise Escaped(f"field {name!r}: exit {code}")
    files = _check_inside(root, out, ds, before)
    if len(files) != len(wrote):
        raise Escaped(f"{len(wrote)} extracts, {len(files)} files")
    got = {p.read_bytes() for p in files}
    if got != {f"payload {i}".encode() for i in wrote}:
        raise Escaped("a file holds another field's bytes (written over)")
    if len(wrote) < len(names) - 6:  # only names that map to one file are refused
        raise Escaped(f"only {len(wrote)} of {len(names)} fields extracted")


def pack_to_imagefolder(root: str) -> None:
    from packer.cli import main

    root = Path(root)
    ds, out = root / "ds", root / "a" / "b" / "c" / "out"
    images = _image_dataset(ds, 2 * len(HOSTILE))
    before = _files(root)
    code = _quiet(main, [str(ds), str(out), "--from", "shards", "--to", "imagefolder",
                         "--workers", "0", "--quiet"])
    if code != 0:
        raise Escaped(f"pack-dataset --to imagefolder: exit {code}")
    files = [p for p in _check_inside(root, out, ds, before)  # images, not our own files
             if p.name != "classes.json" and not p.name.startswith(".")]
    if sorted(p.read_bytes() for p in files) != sorted(images):
        raise Escaped(f"{len(images)} images, {len(files)} files: some written over")
    folders = [p for p in out.iterdir() if p.is_dir()]
    if len(folders) != len(HOSTILE):
        raise Escaped(f"{len(HOSTILE)} classes, {len(folders)} folders")
    if len({p.name.casefold() for p in files}) != len(files) and \
            len({str(p).casefold() for p in files}) != len(files):
        raise Escaped("two files differ only in case")


def pack_to_webdataset_and_untar(root: str) -> None:
    from formats.codecs.registry import open_source
    from formats.names import unsafe_reason
    from packer.cli import main

    root = Path(root)
    ds, out = root / "ds", root / "a" / "b" / "c" / "out"
    images = _image_dataset(ds, 3 * len(HOSTILE))
    code = _quiet(main, [str(ds), str(out), "--from", "shards", "--to", "webdataset",
                         "--workers", "0", "--quiet", "--records-per-shard", "1000"])
    if code != 0:
        raise Escaped(f"pack-dataset --to webdataset: exit {code}")
    keys = [r.fields["key"] for r in open_source("webdataset", out)]
    if keys != [HOSTILE[i % len(HOSTILE)] for i in range(len(images))]:
        raise Escaped("the exact keys did not come back")
    where = root / "x" / "y" / "z" / "untarred"
    before = _files(root)
    members = 0
    for tar in sorted(out.glob("*.tar")):
        with tarfile.open(tar) as t:
            names = t.getnames()
            bad = [n for n in names if unsafe_reason(n, parts=True)]
            if bad or len({n.casefold() for n in names}) != len(names):
                raise Escaped(f"unsafe or repeated member names: {bad or names}")
            members += len(names)
            # As a naive user would: no filter (Pythons before the filters had none).
            naive = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") \
                else {}
            t.extractall(where, **naive)
    files = _check_inside(root, where, ds, before)
    if len(files) != members:
        raise Escaped(f"{members} members, {len(files)} files: some written over")


def pack_hostile_field_names_to_webdataset(root: str) -> None:
    from packer.cli import main

    root = Path(root)
    ds, out = root / "ds", root / "a" / "b" / "c" / "out"
    for name in ("../../../up", "a\\..\\b", "..", "\uff0e\uff0e", "nul\x00"):
        with DatasetWriter(ds, [Field("key", "str"), Field(name, "bytes")], records_per_shard=8,
                           durable=False, overwrite=True) as w:
            w.write({"key": "k", name: b"x"})
        before = _files(root)
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main([str(ds), str(out), "--from", "shards", "--to", "webdataset",
                         "--workers", "0", "--quiet"])
        if code != 1 or "cannot hold field" not in err.getvalue():
            raise Escaped(f"field {name!r}: exit {code}: {err.getvalue()}")
        _check_inside(root, out, ds, before)


# -- the tests ---------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["extract_every_field", "pack_to_imagefolder",
                                  "pack_to_webdataset_and_untar",
                                  "pack_hostile_field_names_to_webdataset"])
def test_hostile_names_write_nothing_outside_the_output_folder(tmp_path, case):
    outcome = run_case(MODULE, case, str(tmp_path), timeout=SECONDS, label=f"names: {case}")
    assert outcome.kind == "ok", str(outcome)
    assert outcome.peak_mb < PEAK_MB, str(outcome)
    assert not (tmp_path / "a" / "up").exists() and not Path("/abs/olute.jpg").exists()
