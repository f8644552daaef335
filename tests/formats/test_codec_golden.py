"""Tiny files written by the reference implementations, committed under tests/data/codecs.

They keep the readers honest where tfrecord/webdataset/datasets are not installed;
expected.json says what they hold and which writer wrote them.
"""

from __future__ import annotations

import json

import pytest

from formats.codecs.registry import detect, open_source
from tests.helpers_paths import DATA

CODECS = DATA / "codecs"
EXPECTED = json.loads((CODECS / "expected.json").read_text())
IMAGES = [bytes.fromhex(h) for h in EXPECTED["images_hex"]]


@pytest.mark.parametrize("name,fmt", [("reference.tfrecord", "tfrecord"),
                                      ("reference.tar", "webdataset"),
                                      ("reference.parquet", "parquet")])
def test_golden_reference_files(name, fmt):
    assert detect(CODECS / name) == fmt
    src = open_source(fmt, CODECS / name)
    got = list(src)
    assert [bytes(g.fields["image"]) for g in got] == IMAGES
    assert [g.fields["label"] for g in got] == EXPECTED["labels"]
    if fmt == "tfrecord":
        assert [g.fields["bbox"].tolist() for g in got] == EXPECTED["bbox"]
    if fmt == "webdataset":
        assert [g.fields["txt"] for g in got] == ["t0", "t1", "t2"]
    if fmt == "parquet":
        assert src.classes == ("a", "b", "c")
