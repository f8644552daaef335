"""Non-JPEG images packed with the core dependencies only (issue 18, item 5).

Every test here runs with Pillow hidden (``sys.modules["PIL"] = None``: any import of
it raises ImportError, in this process and in the pack's forked workers), and one
runs ``pack-dataset`` in a fresh interpreter where Pillow was never importable.
Test images are made with OpenCV, never Pillow.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
import simplejpeg
from hypothesis import given
from hypothesis import strategies as st

import formats
from formats.media import MAX_PIXELS
from formats.sniff import image_kind, image_size, sniff
from packer import PackOptions, pack
from packer.errors import PackInputError
from packer.work import WorkOptions, prepare
from tests.helpers_paths import ROOT

# OpenCV decodes GIF from 4.11 on (the core dependency allows 4.8): before, --to-jpeg
# refuses a GIF as "unsupported", naming the version that reads it.
GIF_DECODES = cv2.imdecode(np.frombuffer(bytes.fromhex(
    "47494638396101000100800000ffffff00000021f90401000000002c00000000010001000002024401003b"),
    np.uint8), cv2.IMREAD_UNCHANGED) is not None


@pytest.fixture(autouse=True)
def no_pillow(monkeypatch):
    """Pillow unimportable for the test (and the processes it forks)."""
    for name in [m for m in sys.modules if m == "PIL" or m.startswith("PIL.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "PIL", None)


def encode(ext: str, arr: np.ndarray, *params: int) -> bytes:
    ok, buf = cv2.imencode(ext, arr, list(params))
    assert ok
    return buf.tobytes()


def colour(rng, h: int, w: int, channels: int = 3, dtype=np.uint8) -> np.ndarray:
    top = np.iinfo(dtype).max
    shape = (h, w) if channels == 1 else (h, w, channels)
    return rng.integers(0, top, shape, dtype=dtype, endpoint=True)


def png_with_ihdr(width: int, height: int) -> bytes:
    """A PNG signature and a valid IHDR claiming ``width`` x ``height``, then IEND."""
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk + b"\x00\x00\x00\x00IEND\xaeB`\x82"


def opts(**kw) -> PackOptions:
    return PackOptions(**{"workers": 0, "durable": False, "records_per_shard": 4, **kw})


def test_pillow_is_hidden():
    with pytest.raises(ImportError):
        import PIL  # noqa: F401
    with pytest.raises(ImportError):
        from PIL import Image  # noqa: F401


# -- headers, read without decoding ------------------------------------------------------

@pytest.mark.parametrize("ext", [".png", ".webp", ".gif", ".bmp", ".tiff", ".jpg"])
@pytest.mark.parametrize("shape", [(12, 20), (301, 17), (1, 700)])
def test_every_format_is_sniffed_and_measured_from_its_header(rng, ext, shape):
    data = encode(ext, colour(rng, *shape))
    kind = image_kind(data)
    assert kind == {".jpg": "jpeg", ".tiff": "tiff"}.get(ext, ext[1:])
    assert image_size(data, kind) == shape  # (height, width), as an array's shape
    loaded = prepare(data, "x" + ext, WorkOptions(image_type="image"))
    assert loaded.kind is None and loaded.data == data
    assert (loaded.width, loaded.height) == (shape[1], shape[0])


def test_webp_lossless_lossy_and_extended_headers(rng):
    arr = colour(rng, 33, 47, 4)
    for params in ([cv2.IMWRITE_WEBP_QUALITY, 101], [cv2.IMWRITE_WEBP_QUALITY, 80]):
        data = encode(".webp", arr, *params)  # alpha: VP8X or VP8L; lossy: VP8X + ALPH
        assert image_size(data, "webp") == (33, 47)
    assert image_size(encode(".webp", arr[..., :3], cv2.IMWRITE_WEBP_QUALITY, 80), "webp") \
        == (33, 47)  # plain VP8


def test_text_starting_with_bm_is_not_a_bitmap():
    assert sniff(b"BMW is a car, not a bitmap") == "text"
    assert image_kind(b"BMW is a car, not a bitmap") is None


# -- bad input comes back as a kind ------------------------------------------------------

def bad_inputs(rng) -> dict[str, tuple[bytes, str]]:
    png = encode(".png", colour(rng, 40, 50))
    bad_crc = bytearray(png)
    bad_crc[20] ^= 0xFF  # the height in IHDR: its CRC no longer matches
    garbage = png[:33] + bytes(rng.integers(0, 256, 400, dtype=np.uint8)) + png[-12:]
    float_tiff = encode(".tiff", rng.random((6, 7, 3), dtype=np.float32))
    return {
        "bad-ihdr.png": (bytes(bad_crc), "corrupt"),
        "cut.png": (png[: len(png) // 2], "truncated"),
        "cut.webp": (encode(".webp", colour(rng, 40, 50))[:60], "truncated"),
        "garbage.png": (garbage, "corrupt"),        # header fine, pixels not: on decode
        "huge.png": (png_with_ihdr(70_000, 70_000), "too-large"),  # never decoded
        "float.tiff": (float_tiff, "unsupported"),
        "empty.png": (b"", "empty"),
        "notes.png": (b"just text", "not-an-image"),
    }


@pytest.mark.parametrize("to_jpeg", [False, True])
def test_bad_images_come_back_as_a_kind_never_raised(rng, to_jpeg):
    for name, (data, kind) in bad_inputs(rng).items():
        got = prepare(data, name, WorkOptions(image_type="image", to_jpeg=to_jpeg))
        decoded_only = name in ("garbage.png", "float.tiff")
        want = kind if to_jpeg or not decoded_only else None
        assert got.kind == want, (name, got)
        assert (got.data is None) == (want is not None)
        if want is not None:
            assert got.reason


def test_a_huge_header_is_refused_before_any_pixel_is_decoded():
    got = prepare(png_with_ihdr(70_000, 70_000), "a.png", WorkOptions(to_jpeg=True))
    assert got.kind == "too-large" and f"{MAX_PIXELS:,}" in got.reason


@given(prefix=st.sampled_from([b"\x89PNG\r\n\x1a\n", b"GIF89a", b"II*\x00", b"MM\x00*",
                               b"RIFF\x00\x01\x00\x00WEBPVP8 ", b"RIFF\x10\x00\x00\x00WEBPVP8X",
                               b"BM\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00(\x00\x00\x00",
                               b"\xff\xd8\xff"]),
       tail=st.binary(max_size=300), to_jpeg=st.booleans(), max_side=st.sampled_from([None, 4]))
def test_prepare_never_raises_on_damaged_headers(prefix, tail, to_jpeg, max_side):
    got = prepare(prefix + tail, "x.bin", WorkOptions(image_type="image", to_jpeg=to_jpeg,
                                                      max_side=max_side))
    assert (got.kind is None) == (got.data is not None)


# -- packs --------------------------------------------------------------------------------

def mixed_folder(root: Path, rng) -> dict[str, bytes]:
    """An image folder of JPEG, PNG (RGB, RGBA, gray, 16-bit), WebP, BMP, TIFF, GIF."""
    files = {
        "a/0.jpg": simplejpeg.encode_jpeg(colour(rng, 30, 40), 85),
        "a/1.png": encode(".png", colour(rng, 21, 13)),
        "a/2.png": encode(".png", colour(rng, 9, 30, 4)),
        "b/3.png": encode(".png", colour(rng, 16, 16, 1)),
        "b/4.png": encode(".png", colour(rng, 17, 11, 3, np.uint16)),
        "b/5.webp": encode(".webp", colour(rng, 12, 24), cv2.IMWRITE_WEBP_QUALITY, 90),
        "c/6.bmp": encode(".bmp", colour(rng, 7, 9)),
        "c/7.tiff": encode(".tiff", colour(rng, 10, 5, 1, np.uint16)),
        "c/8.gif": encode(".gif", colour(rng, 8, 8)),
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mixed_pack_stores_every_image_as_it_is(tmp_path, rng, workers):
    files = mixed_folder(tmp_path / "src", rng)
    s = pack(tmp_path / "src", tmp_path / "dst", opts(workers=workers))
    assert s.records_written == len(files) and not s.skipped
    ds = formats.open_shards(tmp_path / "dst")
    assert ds.fields[0].type == "image"
    got = {ds[i]["key"]: bytes(ds[i]["image"]) for i in range(len(ds))}
    assert got == files
    meta = ds.metadata().to_pydict()
    sizes = {"a/0.jpg": (40, 30), "a/1.png": (13, 21), "a/2.png": (30, 9), "b/3.png": (16, 16),
             "b/4.png": (11, 17), "b/5.webp": (24, 12), "c/6.bmp": (9, 7), "c/7.tiff": (5, 10),
             "c/8.gif": (8, 8)}
    for i in range(len(ds)):
        assert (meta["width"][i], meta["height"][i]) == sizes[ds[i]["key"]], ds[i]["key"]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mixed_pack_skips_bad_pngs_by_name_and_kind(tmp_path, rng, workers):
    files = mixed_folder(tmp_path / "src", rng)
    bad = bad_inputs(rng)
    for name in ("bad-ihdr.png", "cut.png"):
        (tmp_path / "src" / "b" / name).write_bytes(bad[name][0])
    with pytest.raises(PackInputError) as e:
        pack(tmp_path / "src", tmp_path / "dst", opts(workers=workers))
    assert e.value.kind == "corrupt" and e.value.path.endswith("b/bad-ihdr.png")
    s = pack(tmp_path / "src", tmp_path / "dst", opts(workers=workers, on_error="skip"))
    assert s.records_in == s.records_written + s.records_skipped == len(files) + 2
    assert dict(s.skipped) == {"corrupt": 1, "truncated": 1}
    lines = [json.loads(x) for x in (tmp_path / "dst" / "skipped.jsonl").read_text().splitlines()]
    assert {(x["path"], x["kind"]) for x in lines} == {("b/bad-ihdr.png", "corrupt"),
                                                       ("b/cut.png", "truncated")}


def test_to_jpeg_converts_every_format(tmp_path, rng):
    files = mixed_folder(tmp_path / "src", rng)
    s = pack(tmp_path / "src", tmp_path / "dst", opts(to_jpeg=True, workers=2, on_error="skip"))
    assert dict(s.skipped) == ({} if GIF_DECODES else {"unsupported": 1})
    ds = formats.open_shards(tmp_path / "dst")
    assert ds.fields[0].type == "jpeg" and len(ds) == len(files) - len(s.skipped)
    for i in range(len(ds)):
        key, data = ds[i]["key"], bytes(ds[i]["image"])
        h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        src = cv2.imdecode(np.frombuffer(files[key], np.uint8), cv2.IMREAD_UNCHANGED)
        assert (h, w) == src.shape[:2], key
        # Grayscale stays one channel (the gray PNG and the 16-bit gray TIFF).
        assert (colorspace == "Gray") == (src.ndim == 2), key


def test_sixteen_bit_images_keep_their_range_in_a_jpeg(rng):
    # A ramp over the whole 16-bit range: clipping at 255 (Pillow's I;16 -> RGB) would
    # make nearly every pixel white; the mean of v / 257 must survive.
    ramp = np.linspace(0, 65535, 64 * 48, dtype=np.float64).reshape(48, 64).astype(np.uint16)
    for name, arr in (("gray.png", ramp), ("rgb.png", np.dstack([ramp, ramp[::-1], ramp // 3])),
                      ("gray.tiff", ramp)):
        data = encode(Path(name).suffix, arr)
        got = prepare(data, name, WorkOptions(to_jpeg=True, quality=95))
        assert got.kind is None, got.reason
        out = simplejpeg.decode_jpeg(got.data, "GRAY" if arr.ndim == 2 else "BGR")
        want = arr.astype(np.float64) / 257
        assert abs(out.mean() - want.mean()) < 1.0, name
        assert out.min() <= 3 and out.max() >= 252, name  # the full range, not a few values
        assert len(np.unique(out)) > 200, name


def test_alpha_is_dropped_like_pillows_convert_rgb(rng):
    rgba = colour(rng, 16, 16, 4)
    rgba[..., 3] = 0  # fully transparent: the colour underneath is what stays
    got = prepare(encode(".png", rgba), "a.png", WorkOptions(to_jpeg=True, quality=90))
    # The very JPEG the colour channels alone make: no compositing, no other colour.
    colour_only = np.ascontiguousarray(rgba[..., :3])
    assert got.data == simplejpeg.encode_jpeg(colour_only, 90, "BGR", "420")


def test_max_side_without_pillow(tmp_path, rng):
    # A JPEG whose DCT scale misses the target (OpenCV resizes) and a 16-bit PNG
    # (resized and stored as PNG, its depth kept).
    big = simplejpeg.encode_jpeg(colour(rng, 300, 470), 90)
    got = prepare(big, "a.jpg", WorkOptions(max_side=256))
    assert got.kind is None and (got.width, got.height) == (256, 163)
    assert simplejpeg.decode_jpeg_header(got.data)[:2] == (163, 256)
    deep = encode(".png", colour(rng, 90, 60, 3, np.uint16))
    got = prepare(deep, "b.png", WorkOptions(image_type="image", max_side=45))
    assert got.kind is None and (got.width, got.height) == (30, 45)
    back = cv2.imdecode(np.frombuffer(got.data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert image_kind(got.data) == "png" and back.dtype == np.uint16 and back.shape == (45, 30, 3)
    small = encode(".png", colour(rng, 20, 10))
    assert prepare(small, "c.png", WorkOptions(image_type="image", max_side=45)).data == small


def test_pack_dataset_runs_where_pillow_was_never_importable(tmp_path, rng):
    files = mixed_folder(tmp_path / "src", rng)
    (tmp_path / "src" / "b" / "cut.png").write_bytes(bad_inputs(rng)["cut.png"][0])
    code = ("import sys; sys.modules['PIL'] = None\n"
            "from packer.cli import main\n"
            "rc = main(sys.argv[1:])\n"
            "assert not any(m.startswith('PIL') and sys.modules[m] for m in sys.modules)\n"
            "sys.exit(rc)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for extra in ([], ["--to-jpeg", "--max-side", "12"]):
        dst = tmp_path / ("dst" + "".join(extra))
        run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "src"), str(dst),
                              "--on-error", "skip", "--quiet", "--json", *extra],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        assert run.returncode == 0, run.stderr
        summary = json.loads(run.stdout)
        gif = {} if GIF_DECODES or not extra else {"unsupported": 1}
        assert summary["skipped_by_kind"] == {"truncated": 1, **gif}, summary
        assert summary["records_written"] == len(files) - len(gif), summary


def test_a_gif_this_opencv_cannot_decode_is_refused_naming_the_version(rng, monkeypatch):
    import packer.work as work

    gif = encode(".gif", colour(rng, 8, 8))
    monkeypatch.setattr(cv2, "imdecode", lambda *a: None)  # an OpenCV before 4.11
    work._reads_gif.cache_clear()
    try:
        got = prepare(gif, "a.gif", WorkOptions(to_jpeg=True))
    finally:
        work._reads_gif.cache_clear()
    assert got.kind == "unsupported" and "4.11" in got.reason and cv2.__version__ in got.reason
    stored = prepare(gif, "a.gif", WorkOptions(image_type="image"))  # no decode needed
    assert stored.kind is None and stored.data == gif


def test_the_loader_reads_a_png_dataset_without_pillow(tmp_path, rng):
    import reader
    from reader.transforms import CenterCrop, Resize
    from reader.transforms.decode import decode_full
    from reader.transforms.decode import image_size as decoded_size

    images = [colour(rng, 20 + i, 30 - i) for i in range(4)]
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for i, arr in enumerate(images):  # arrays are RGB; OpenCV writes BGR
        (src / f"{i}.png").write_bytes(encode(".png", cv2.cvtColor(arr, cv2.COLOR_RGB2BGR)))
    pack(tmp_path / "src", tmp_path / "ds", opts())
    ds = formats.open_shards(tmp_path / "ds")
    assert ds.fields[0].type == "png"
    for i, arr in enumerate(images):
        data = bytes(ds[i]["image"])
        assert np.array_equal(decode_full(data), arr)  # lossless, RGB order kept
        assert decoded_size(data) == arr.shape[:2]
    loader = reader.Loader(tmp_path / "ds", batch_size=2, num_workers=0,
                           transform=[Resize(16), CenterCrop(16)])
    with loader:
        shapes = [b["image"].shape for b in loader]
    assert shapes == [(2, 16, 16, 3), (2, 16, 16, 3)]
