"""A pixel bomb at read time (issue 35, defect 5): a dataset packed before the pack
checked the pixel budget (written here with the shard writer directly) holds images
whose headers declare 10^10 pixels. The Loader refuses each with a typed error naming
shard and record, before anything is allocated, within bounded time and memory (the
cases run in bounded child processes); ``on_error="skip"`` skips them."""

from __future__ import annotations

import numpy as np
import pytest
from hostile import run_case

import formats.media
from formats import DatasetWriter, Field
from reader.errors import DecodeError
from reader.transforms import kernels
from reader.transforms.decode import decode_full, image_size
from tests.helpers_packer import jpeg
from tests.packer.test_pack_rare_jpegs import jpeg_bomb, png_bomb

MODULE = "test_pixel_budget"
SECONDS = 10.0
PEAK_MB = 512


def make(root, bomb: str) -> str:
    rng = np.random.default_rng(5)
    images = [jpeg(rng, 40, 30), png_bomb() if bomb == "png" else jpeg_bomb(), jpeg(rng, 30, 40)]
    with DatasetWriter(root, [Field("image", "image"), Field("label", "int")],
                       durable=False) as w:
        for i, data in enumerate(images):
            w.write({"image": data, "label": i})
    return str(root)


# -- the cases, run in a bounded child ---------------------------------------------------

def epoch(path: str, workers: int, transform: bool, on_error: str) -> None:
    import reader
    from reader.transforms import RandomResizedCrop

    kw = {"transform": [RandomResizedCrop(32)]} if transform else {}
    loader = reader.Loader(path, batch_size=1, num_workers=workers, on_error=on_error,
                           shuffle=False, **kw)
    valid = 0
    for batch in loader:
        valid += int(np.asarray(batch["valid"]).sum()) if "valid" in batch else 1
    if on_error == "skip" and valid != 2:
        raise AssertionError(f"{valid} valid records, expected the 2 good ones")


@pytest.mark.parametrize("bomb", ["png", "jpeg"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("transform", [False, True], ids=["no-transform", "crop"])
def test_the_loader_refuses_a_pixel_bomb_naming_shard_and_record(tmp_path, bomb, workers,
                                                                transform):
    path = make(tmp_path / "ds", bomb)
    out = run_case(MODULE, "epoch", path, workers, transform, "fail", timeout=SECONDS,
                   label=f"pixel bomb {bomb} workers={workers} transform={transform}")
    assert out.kind == "typed", str(out)
    assert out.error == "CorruptRecordError", str(out)
    assert "shard-00000" in out.message and "record 1" in out.message, str(out)
    side = "100000x100000" if bomb == "png" else "60000x60000"
    assert "pixel budget" in out.message and side in out.message, str(out)
    assert out.peak_mb < PEAK_MB, str(out)


@pytest.mark.parametrize("transform", [False, True], ids=["no-transform", "crop"])
def test_on_error_skip_skips_the_bomb_and_serves_the_rest(tmp_path, transform):
    path = make(tmp_path / "ds", "png")
    out = run_case(MODULE, "epoch", path, 0, transform, "skip", timeout=SECONDS,
                   label=f"pixel bomb skipped transform={transform}")
    assert out.kind == "ok", str(out)
    assert out.peak_mb < PEAK_MB, str(out)


# -- the checks themselves, in this process (they refuse before allocating) ----------------

def test_every_decode_entry_refuses_a_header_over_the_budget():
    for data in (png_bomb(), jpeg_bomb()):
        with pytest.raises(DecodeError, match="pixel budget"):
            decode_full(data)
        with pytest.raises(DecodeError, match="pixel budget"):
            image_size(data)
    with pytest.raises(DecodeError, match="pixel budget"):
        kernels._mask_decode(png_bomb(), None)


def test_the_budget_is_the_formats_constant_read_when_decoding(monkeypatch):
    data = jpeg(np.random.default_rng(1), 40, 30)
    assert decode_full(data).shape == (30, 40, 3)
    monkeypatch.setattr(formats.media, "MAX_PIXELS", 40 * 30 - 1)
    with pytest.raises(DecodeError, match="1,199-pixel budget"):
        decode_full(data)
    monkeypatch.setattr(formats.media, "MAX_PIXELS", 10**10)
    with pytest.raises(DecodeError) as e:  # within the budget: now the decoder's own refusal
        decode_full(png_bomb())
    assert "pixel budget" not in str(e.value)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("transform", [False, True], ids=["no-transform", "crop"])
def test_the_loader_s_max_pixels_is_the_budget_its_workers_decode_under(tmp_path, workers,
                                                                         transform):
    """Loader(max_pixels=N) is the budget of every decode, in every worker: below an
    image's size it refuses the image (naming it), at the size it reads it, whatever
    formats.media.MAX_PIXELS says."""
    import reader
    from formats.errors import CorruptRecordError
    from reader.transforms import RandomResizedCrop

    rng = np.random.default_rng(7)
    with DatasetWriter(tmp_path / "ds", [Field("image", "image"), Field("label", "int")],
                       durable=False) as w:
        for i in range(4):
            w.write({"image": jpeg(rng, 40, 30), "label": i})
    kw = {"transform": [RandomResizedCrop(16)]} if transform else {}
    with reader.Loader(tmp_path / "ds", batch_size=2, num_workers=workers,
                       max_pixels=40 * 30 - 1, **kw) as lo, \
            pytest.raises(CorruptRecordError, match=r"1,199-pixel budget .*max_pixels") as info:
        list(lo)
    assert "record 0" in str(info.value)
    with reader.Loader(tmp_path / "ds", batch_size=2, num_workers=workers,
                       max_pixels=40 * 30, **kw) as lo:
        assert sum(len(b["label"]) for b in lo) == 4


def test_a_wrong_max_pixels_is_an_argument_error(tmp_path):
    import reader
    from formats.errors import ArgumentError, ArgumentTypeError

    path = make(tmp_path / "ds", "png")
    with pytest.raises(ArgumentError, match="max_pixels must be an int >= 1, not 0"):
        reader.Loader(path, max_pixels=0)
    with pytest.raises(ArgumentTypeError, match=r"max_pixels .* float 1000000000.0"):
        reader.Loader(path, max_pixels=1e9)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_kept_unsupported_jpeg_is_named_unsupported_at_read_time_not_corrupt(tmp_path,
                                                                             workers):
    """A 12-bit or 4:4:1 JPEG kept by --keep-unsupported (or packed before the check)
    reaches the Loader: it is refused as an unsupported JPEG with the reason, naming
    shard and record, never called corrupt."""
    import reader
    from formats.errors import CorruptRecordError
    from tests.helpers_jpeg import jpeg_file

    rng = np.random.default_rng(3)
    for name, data, why in (("p12", jpeg_file(rng, precision=12), "12-bit"),
                            ("s441", jpeg_file(rng, sampling=((1, 4), (1, 1), (1, 1))),
                             "4:4:1")):
        root = tmp_path / name
        with DatasetWriter(root, [Field("image", "image"), Field("label", "int")],
                           durable=False) as w:
            w.write({"image": jpeg(rng, 40, 30), "label": 0})
            w.write({"image": data, "label": 1})
        with reader.Loader(root, batch_size=2, num_workers=workers) as lo, \
                pytest.raises(CorruptRecordError) as info:
            list(lo)
        message = str(info.value)
        assert "record 1" in message and "unsupported JPEG" in message, message
        assert why in message and "corrupt JPEG" not in message, message
