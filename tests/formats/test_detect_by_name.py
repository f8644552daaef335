"""One table tells a format by a file's name: the codecs' own SUFFIXES and marker
files, collected by formats.codecs.registry, for local and remote folders alike."""

from __future__ import annotations

import pytest

from formats.codecs import mds, parquet, registry, tfrecord, webdataset
from formats.shard.manifest import MANIFEST_NAME
from packer.remote import _container_kind


@pytest.mark.parametrize(("module", "kind"), [(webdataset, "webdataset"),
                                              (parquet, "parquet"), (tfrecord, "tfrecord")])
def test_every_suffix_a_codec_declares_names_it(module, kind):
    for suffix in module.SUFFIXES:
        assert registry.kind_by_name(f"part-0{suffix}") == kind
        assert registry.kind_by_name(f"PART-0{suffix.upper()}") == kind


def test_markers_and_tensorflow_shard_names():
    assert registry.MARKERS == {MANIFEST_NAME: "shards", mds.INDEX_NAME: "mds"}
    assert registry.kind_by_name("manifest.json") == "shards"
    assert registry.kind_by_name("index.json") == "mds"
    assert registry.kind_by_name("train.tfrecord-00000-of-00010") == "tfrecord"
    assert registry.kind_by_name("cat.jpg") is None
    assert registry.kind_by_name("notes.json") is None


def test_a_remote_folder_is_told_by_the_same_names_as_a_local_one(tmp_path):
    for names, kind in [(["a.tfrecord.gz", "b.tfrecord.gz"], "tfrecord"),
                        (["train.tfrecord-00000-of-00002"], "tfrecord"),
                        (["x.tgz", "y.tar"], "webdataset"), (["p.parquet"], "parquet"),
                        (["manifest.json", "shard-00000.rec"], "shards"),
                        (["index.json", "shard.00000.mds"], "mds"),
                        (["a.tar", "b.parquet"], None), (["cat/1.jpg"], None)]:
        assert _container_kind(names) == kind, names
        folder = tmp_path / "_".join(names).replace("/", "-")
        for n in names:
            (folder / n).parent.mkdir(parents=True, exist_ok=True)
            (folder / n).write_bytes(b"")
        assert registry.detect(folder) == kind, names
