"""Rare JPEGs and pixel bombs at pack time (issue 35, defects 4 and 5): a JPEG the
Loader's decoder cannot read is bad input of kind ``unsupported-jpeg`` (or kept with
``keep_unsupported``), an image declaring more pixels than the budget is ``too-large``
(``max_pixels`` raises it), for every source and for ``pack_samples``."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
import simplejpeg

import formats
import packer.schema
import packer.sources.anyfiles
import packer.work
from formats import DatasetWriter, Field
from formats.media import MAX_PIXELS
from packer import PackInputError, PackOptions, UsageError, pack
from reader.transforms.decode import decode_full
from tests.helpers_jpeg import jpeg_file
from tests.helpers_packer import jpeg, pack_fn
from tests.helpers_paths import ROOT


def opts(**kw) -> PackOptions:
    return PackOptions(**{"durable": False, "workers": 0, **kw})


def png_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    """A valid PNG of a few dozen bytes whose header declares ``width`` x ``height``."""
    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + \
            struct.pack(">I", zlib.crc32(tag + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b""))
            + chunk(b"IEND", b""))


def jpeg_bomb(side: int = 60_000) -> bytes:
    """A small JPEG whose frame header declares ``side`` x ``side`` pixels."""
    data = bytearray(jpeg_file(np.random.default_rng(0), 8, 8))
    at = data.index(b"\xff\xc0")
    data[at + 5 : at + 9] = struct.pack(">HH", side, side)
    return bytes(data)


def patched_4_4_1(rng) -> bytes:
    """A real encoder's 4:4:4 JPEG with its luma sampling patched to 1x4: the
    reproduction of the issue (simplejpeg's header call raised ``KeyError: 6``)."""
    data = bytearray(jpeg(rng, 48, 64))
    if data.find(b"\xff\xc0") < 0:
        pytest.skip("the encoder wrote no baseline frame")
    at = data.index(b"\xff\xc0")
    data[at + 11] = 0x14
    data[at + 14] = data[at + 17] = 0x11
    return bytes(data)


def rare(rng) -> dict[str, bytes]:
    """file name -> a JPEG the Loader's decoder cannot read."""
    return {
        "s441.jpg": jpeg_file(rng, sampling=((1, 4), (1, 1), (1, 1))),
        "patched441.jpg": patched_4_4_1(rng),
        "p12.jpg": jpeg_file(rng, precision=12),
        "p12prog.jpg": jpeg_file(rng, precision=12, progressive=True),
        "ll16.jpg": jpeg_file(rng, precision=16, lossless=True, adobe=0),
        "ll12.jpg": jpeg_file(rng, precision=12, lossless=True),
        "ll8ycc.jpg": jpeg_file(rng, lossless=True),
        "hier.jpg": jpeg_file(rng, sof=0xC5),
        "two.jpg": jpeg_file(rng, sampling=((1, 1), (1, 1))),
    }


def folder(tmp_path, rng, files: dict[str, bytes]):
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    (src / "good.jpg").write_bytes(jpeg(rng))
    (src / "lossless_rgb.jpg").write_bytes(jpeg_file(rng, lossless=True, adobe=0))
    for name, data in files.items():
        (src / name).write_bytes(data)
    return src.parent


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "packer.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_rare_jpegs_are_skipped_as_unsupported_jpeg_and_listed(tmp_path, rng):
    files = rare(rng)
    src = folder(tmp_path, rng, files)
    proc = cli(str(src), str(tmp_path / "dst"), "--on-error", "skip", "--workers", "0", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    skipped = [json.loads(x) for x in (tmp_path / "dst" / "skipped.jsonl").read_text().splitlines()]
    assert {s["path"] for s in skipped} == {f"c/{n}" for n in files}
    assert {s["kind"] for s in skipped} == {"unsupported-jpeg"}
    reasons = {s["path"]: s["reason"] for s in skipped}
    assert "4:4:1" in reasons["c/s441.jpg"] and "4:4:1" in reasons["c/patched441.jpg"]
    assert "12-bit" in reasons["c/p12.jpg"] and "16-bit" in reasons["c/ll16.jpg"]
    assert "hierarchical" in reasons["c/hier.jpg"]
    ds = formats.open_shards(tmp_path / "dst")
    assert len(ds) == 2  # good.jpg and an 8-bit lossless RGB file: both decode
    for i in range(len(ds)):
        assert decode_full(bytes(ds[i]["image"])).ndim == 3


@pytest.mark.parametrize("name", ["s441.jpg", "p12.jpg", "ll8ycc.jpg"])
def test_fail_stops_with_one_line_naming_the_file(tmp_path, rng, name):
    src = folder(tmp_path, rng, {name: rare(rng)[name]})
    proc = cli(str(src), str(tmp_path / "dst"), "--workers", "0", "-q")
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"c/{name}" in proc.stderr and "[unsupported-jpeg]" in proc.stderr
    with pytest.raises(PackInputError) as e:
        pack(src, tmp_path / "api", opts())
    assert e.value.kind == "unsupported-jpeg" and e.value.path.endswith(name)


def test_keep_unsupported_keeps_them_byte_for_byte_and_the_loader_names_them(tmp_path, rng):
    import reader
    from formats.errors import CorruptRecordError

    files = rare(rng)
    src = folder(tmp_path, rng, files)
    proc = cli(str(src), str(tmp_path / "dst"), "--keep-unsupported", "--workers", "0",
               "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["records_written"] == len(files) + 2
    ds = formats.open_shards(tmp_path / "dst")
    by_key = {ds[i]["key"]: bytes(ds[i]["image"]) for i in range(len(ds))}
    for name, data in files.items():
        assert by_key[f"c/{name}"] == data
    made = json.loads((tmp_path / "dst" / "manifest.json").read_text())["created_by"]
    assert made["options"]["keep_unsupported"] is True
    with pytest.raises(CorruptRecordError) as e:
        for _ in reader.Loader(tmp_path / "dst", batch_size=1, num_workers=0):
            pass
    assert e.value.record is not None and "shard-" in str(e.value.path)
    kept = sum(int(b["valid"].sum()) if "valid" in b else 1
               for b in reader.Loader(tmp_path / "dst", batch_size=1, num_workers=0,
                                      on_error="skip"))
    assert kept >= 2


def test_keep_unsupported_cannot_shrink_them_so_max_side_still_refuses(tmp_path, rng):
    src = folder(tmp_path, rng, {"p12.jpg": jpeg_file(rng, 64, 48, precision=12)})
    s = pack(src, tmp_path / "dst", opts(on_error="skip", keep_unsupported=True, max_side=32))
    assert dict(s.skipped) == {"unsupported-jpeg": 1}


def test_pixel_bombs_are_too_large_and_max_pixels_raises_the_budget(tmp_path, rng):
    src = folder(tmp_path, rng, {"bomb.png": png_bomb(), "bomb.jpg": jpeg_bomb()})
    s = pack(src, tmp_path / "dst", opts(on_error="skip"))
    assert dict(s.skipped) == {"too-large": 2} and s.records_written == 2
    lines = (tmp_path / "dst" / "skipped.jsonl").read_text()
    assert "100000x100000" in lines and f"{MAX_PIXELS:,}" in lines
    proc = cli(str(src), str(tmp_path / "cli"), "--workers", "0", "-q")
    assert proc.returncode == 1 and "[too-large]" in proc.stderr and "bomb." in proc.stderr
    s = pack(src, tmp_path / "raised", opts(max_pixels=10**10))
    assert s.records_written == 4 and not s.skipped
    made = json.loads((tmp_path / "raised" / "manifest.json").read_text())["created_by"]
    assert made["options"]["max_pixels"] == 10**10
    made = json.loads((tmp_path / "dst" / "manifest.json").read_text())["created_by"]
    assert "max_pixels" not in made["options"] and "keep_unsupported" not in made["options"]


def test_a_container_source_honours_both_options(tmp_path, rng):
    """Our own shards as the source: image payloads go through the same checks."""
    with DatasetWriter(tmp_path / "in", [Field("image", "image"), Field("key", "str")],
                       durable=False) as w:
        for i, data in enumerate([jpeg(rng), png_bomb(), rare(rng)["s441.jpg"]]):
            w.write({"image": data, "key": f"k{i}"})
    s = pack(tmp_path / "in", tmp_path / "skip", opts(on_error="skip", source="shards"))
    assert dict(s.skipped) == {"too-large": 1, "unsupported-jpeg": 1}
    s = pack(tmp_path / "in", tmp_path / "keep",
             opts(source="shards", keep_unsupported=True, max_pixels=10**10))
    assert s.records_written == 3 and not s.skipped


def test_pack_samples_honours_both_options(tmp_path, rng):
    images = [jpeg(rng), rare(rng)["s441.jpg"], png_bomb()]

    def fn(i):
        return {"image": images[i], "n": i}

    s = pack_fn(fn, range(3), tmp_path / "skip", on_error="skip", durable=False, workers=0)
    assert dict(s.skipped) == {"unsupported-jpeg": 1, "too-large": 1}
    s = pack_fn(fn, range(3), tmp_path / "keep", durable=False, workers=0,
                keep_unsupported=True, max_pixels=10**10)
    assert s.records_written == 3
    with pytest.raises(PackInputError) as e:
        pack_fn(fn, range(3), tmp_path / "fail", durable=False, workers=0)
    assert e.value.kind == "unsupported-jpeg"


@pytest.mark.parametrize("bad", [{"max_pixels": 0}, {"max_pixels": 1.5},
                                 {"keep_unsupported": "yes"}])
def test_bad_option_values_are_usage_errors(bad):
    with pytest.raises(UsageError):
        PackOptions(**bad)


def test_the_three_bad_input_records_are_one_private_class():
    assert not hasattr(packer.schema, "Bad")
    assert not hasattr(packer.sources.anyfiles, "FileProblem")
    assert not hasattr(packer.work, "_Bad") or packer.work._Bad is packer.errors._Bad
    assert "MAX_PIXELS" not in packer.work.__all__


def test_a_header_simplejpeg_cannot_name_no_longer_escapes_as_key_error(rng):
    data = rare(rng)["patched441.jpg"]
    with pytest.raises(KeyError):
        simplejpeg.decode_jpeg_header(data)
    got = packer.work.prepare(data, "a.jpg", packer.work.WorkOptions())
    assert got.kind == "unsupported-jpeg"
