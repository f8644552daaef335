"""Every source × every option that shapes the output: honoured, and recorded.

One pack loop serves every source (packer/loop.py), so ``--shuffle --seed``,
``--max-side``, ``--on-error`` and ``--resume`` mean the same for a folder of files
and for a TFRecord, WebDataset, Parquet, MDS or shards source.
"""

from __future__ import annotations

import json

import pytest
import simplejpeg

import formats
from packer import PackInputError, PackOptions, pack
from packer.plan import shuffle_order
from tests.helpers_coco import make_coco
from tests.helpers_sources import SOURCES as CONTAINERS_AND_FOLDERS
from tests.helpers_sources import make_source

SOURCES = (*CONTAINERS_AND_FOLDERS, "coco")


def source(kind: str, root, rng, **kw):
    """SRC of ``kind``; a COCO source's annotations lie beside its images folder."""
    if kind == "coco":
        return make_coco(root, rng, **kw)[0]
    return make_source(kind, root, rng, **kw)


def opts(kind: str, src=None, **kw) -> PackOptions:
    if kind == "coco":
        kw["annotations"] = str(src.parent / "annotations.json")
    return PackOptions(workers=0, durable=False, records_per_shard=4, source=kind, **kw)


def images(dst) -> list[bytes]:
    ds = formats.open_shards(dst)
    return [bytes(ds[i]["image"]) for i in range(len(ds))]


@pytest.mark.parametrize("kind", SOURCES)
def test_shuffle_and_seed_are_honoured_for_every_source(tmp_path, rng, kind):
    src = source(kind, tmp_path / "in", rng)
    pack(src, tmp_path / "plain", opts(kind, src))
    base = images(tmp_path / "plain")
    pack(src, tmp_path / "s3", opts(kind, src, shuffle=True, seed=3))
    got = images(tmp_path / "s3")
    assert got == [base[i] for i in shuffle_order(len(base), 3)] and got != base
    pack(src, tmp_path / "s4", opts(kind, src, shuffle=True, seed=4))
    assert images(tmp_path / "s4") != got
    made = formats.open_shards(tmp_path / "s3").manifest.created_by["options"]
    assert made["shuffle"] is True and made["seed"] == 3
    assert not (tmp_path / "s3" / ".shardpack-shuffle").exists()


@pytest.mark.parametrize("kind", SOURCES)
def test_max_side_is_honoured_for_every_source(tmp_path, rng, kind):
    src = source(kind, tmp_path / "in", rng)
    s = pack(src, tmp_path / "small", opts(kind, src, max_side=8))
    ds = formats.open_shards(tmp_path / "small")
    sides = [simplejpeg.decode_jpeg_header(bytes(ds[i]["image"]))[:2] for i in range(len(ds))]
    assert sides and all(max(h, w) == 8 for h, w in sides)
    meta = ds.metadata(["width", "height"]).to_pylist()
    assert [(m["height"], m["width"]) for m in meta] == sides  # the table follows the bytes
    assert ds.manifest.created_by["options"]["max_side"] == 8 and s.records_written == len(ds)


@pytest.mark.parametrize("kind", SOURCES)
def test_on_error_is_honoured_for_every_source(tmp_path, rng, kind):
    src = source(kind, tmp_path / "in", rng, corrupt=4)
    with pytest.raises(PackInputError) as info:
        pack(src, tmp_path / "fail", opts(kind, src))
    kind_of = info.value.kind  # a JPEG cut in half: its header or its end is missing
    assert kind_of in ("truncated", "corrupt")
    s = pack(src, tmp_path / "skip", opts(kind, src, on_error="skip"))
    assert s.complete and dict(s.skipped) == {kind_of: 1}
    assert s.records_in == s.records_written + 1 == len(formats.open_shards(tmp_path / "skip")) + 1
    lines = (tmp_path / "skip" / "skipped.jsonl").read_text().splitlines()
    assert [json.loads(x)["kind"] for x in lines] == [kind_of]


@pytest.mark.parametrize("kind", ["tfrecord", "webdataset", "parquet", "mds"])
def test_a_shuffled_container_pack_resumes_byte_identical(tmp_path, rng, kind):
    from tests.packer.test_pack_safety import Stop, dataset_files, stop_after

    src = make_source(kind, tmp_path / "in", rng, n=12)
    o = PackOptions(workers=0, durable=False, records_per_shard=1, source=kind, shuffle=True,
                    seed=5)
    with pytest.raises(Stop):
        pack(src, tmp_path / "cut", o, stop_after(3))
    assert (tmp_path / "cut" / ".shardpack-shuffle" / "manifest.json").exists()
    resumed = pack(src, tmp_path / "cut", PackOptions(**{**o.__dict__, "resume": True}))
    assert resumed.complete and resumed.resumed_records > 0
    pack(src, tmp_path / "full", o)
    assert dataset_files(tmp_path / "cut") == dataset_files(tmp_path / "full")


def test_a_lossless_jpeg_is_resized_without_a_dct_scale(tmp_path):
    """simplejpeg's DCT-scaled decode of a lossless JPEG crashes the packer's worker."""
    import numpy as np

    from scripts.synth import synth_image

    tj = pytest.importorskip("turbojpeg", reason="the roi extra's module writes lossless JPEGs")
    if not hasattr(tj, "SAMP"):
        pytest.skip("turbojpeg here is PyTurboJPEG, not the roi extra's module")
    (tmp_path / "src" / "cls").mkdir(parents=True)
    img = synth_image(np.random.default_rng(3), 320, 240)
    (tmp_path / "src" / "cls" / "a.jpg").write_bytes(tj.compress(img, 100, tj.SAMP.Y444,
                                                                   lossless=True))
    pack(tmp_path / "src", tmp_path / "out", PackOptions(max_side=64, workers=0))
    ds = formats.open_shards(tmp_path / "out")
    meta = ds.metadata().to_pylist()
    assert meta[0]["width"] == 64 and meta[0]["height"] == 48
    assert simplejpeg.decode_jpeg(bytes(ds[0]["image"])).shape == (48, 64, 3)
