"""The region-of-interest JPEG decode (reader.transforms.roi) against the whole-image path.

The promise (reader/transforms/decode.py, module docstring): byte-identical output for
every plan, and the same DecodeError for truncation and for damage that libjpeg
notices where it lies, up to the crop's last iMCU row; what libjpeg would notice
only after that row goes unseen. Tests of the region path skip, saying why, where
its library is not installed (``pip install 'shardpack[roi]'``); the fallback's run
everywhere.
"""

from __future__ import annotations

import io
import itertools
import pickle

import numpy as np
import pytest
from PIL import Image

from formats.sniff import jpeg_dct_scalable
from reader import DecodeError
from reader.transforms import ImagePipeline, RandomHorizontalFlip, RandomResizedCrop, Resize, roi
from reader.transforms import decode as decode_mod
from reader.transforms.decode import Decoder
from reader.transforms.geometry import Plan
from reader.transforms.imaging import DecoderPipeline
from scripts.synth import make_jpeg, synth_image
from tests.helpers_jpeg import encode_kind

needs_roi = pytest.mark.skipif(not roi.available(), reason=f"{roi.unavailable_reason()}")
BACKENDS = ["cv2", "pillow"]


@pytest.fixture(scope="module")
def images():
    """JPEGs of odd sizes in every layout the region path handles."""
    rng = np.random.default_rng(29)
    out = {}
    for kind, (w, h) in itertools.product(("420", "422", "444", "440", "gray", "progressive"),
                                          ((457, 333), (131, 97))):
        out[kind, w, h] = encode_kind(synth_image(rng, w, h), kind)
    return out


def _boxes(height: int, width: int):
    """Corner, center, full, tiny, fractional and edge boxes (x0, y0, x1, y1)."""
    return [
        (0, 0, width, height),                                 # whole image: no region
        (0, 0, width // 3, height // 3),                       # top-left corner
        (width - width // 3, height - height // 3, width, height),  # bottom-right corner
        (width // 4, height // 4, 3 * width // 4, 3 * height // 4),  # center
        (width // 2 - 3, height // 2 - 2, width // 2 + 2, height // 2 + 3),  # tiny, odd
        (17.3, 9.6, width - 21.7, height / 2 + 0.5),           # fractional (a Resize's box)
        (1, 1, width - 1, height - 1),                         # one pixel off every edge
        (width - 9, 0, width, height),                         # a strip at the right edge
    ]


def _pair(backend: str):
    pipe = ImagePipeline([RandomResizedCrop(16)], backend=backend)
    return Decoder(pipe, backend, roi=True), Decoder(pipe, backend, roi=False)


def _count_regions(dec: Decoder) -> list:
    """Spy on the region decodes of ``dec``: the list grows by one region per call."""
    calls = []
    real = dec._region.decode

    def spy(data, factor, region, out):
        calls.append((factor, region))
        return real(data, factor, region, out)

    dec._region.decode = spy
    return calls


@needs_roi
@pytest.mark.parametrize("every_region", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_region_decode_is_byte_identical_to_the_whole_image_path(images, backend, every_region,
                                                                  monkeypatch):
    if every_region:  # also the regions that reach the bottom, which the cost rule skips
        monkeypatch.setattr(roi, "_REGION_COST", 0.0)
    with_roi, whole = _pair(backend)
    calls = _count_regions(with_roi)
    factors = set()
    for (kind, w, h), data in images.items():
        for i, (box, size) in enumerate(itertools.product(_boxes(h, w),
                                                          ((7, 9), (24, 24), (40, 56)))):
            plan = Plan(tuple(float(v) for v in box), size, flip=i % 2 == 1)
            factors.add(decode_mod._dct_factor(plan))
            a = np.zeros((*size, 3), np.uint8)
            b = np.ones((*size, 3), np.uint8)
            with_roi.decode_plan(memoryview(data), h, w, plan, a, None)
            whole.decode_plan(data, h, w, plan, b, None)
            np.testing.assert_array_equal(a, b, err_msg=f"{kind} {w}x{h} {plan}")
    assert factors == {1, 2, 4, 8}  # every DCT scale was crossed with a region
    assert {factor for factor, _ in calls} == {1, 2, 4, 8}
    plans = len(images) * len(_boxes(1, 1)) * 3
    assert len(calls) == plans if every_region else plans // 2 < len(calls) < plans


@needs_roi
def test_classification_pipeline_output_unchanged():
    rng = np.random.default_rng(5)
    jpegs = [make_jpeg(rng, int(w), int(h)) for w, h in rng.integers(60, 400, (40, 2))]
    for backend in BACKENDS:
        pipe = ImagePipeline([RandomResizedCrop(48), RandomHorizontalFlip()], backend=backend)
        with_roi, whole = Decoder(pipe, backend, roi=True), Decoder(pipe, backend, roi=False)
        calls = _count_regions(with_roi)
        for i, data in enumerate(jpegs):
            a = with_roi.decode_into(data, None, np.random.default_rng(i)).copy()
            b = whole.decode_into(data, None, np.random.default_rng(i))
            np.testing.assert_array_equal(a, b, err_msg=f"{backend} image {i}")
        assert len(calls) > 30
    # A varying output size (Resize alone) goes through decode_plan.
    pipe = ImagePipeline([Resize(50)])
    assert not pipe.fixed
    for data in jpegs[:5]:
        np.testing.assert_array_equal(Decoder(pipe, roi=True).decode_into(data, None, rng),
                                      Decoder(pipe, roi=False).decode_into(data, None, rng))


def _turbojpeg_encoder():
    """The roi extra's own module can write what simplejpeg and Pillow cannot."""
    module = pytest.importorskip("turbojpeg", reason="the roi extra's turbojpeg module")
    if not hasattr(module, "SAMP"):  # PyTurboJPEG's module of the same name
        pytest.skip("turbojpeg here is PyTurboJPEG, not the roi extra's module")
    return module


@needs_roi
@pytest.mark.parametrize("every_region", [False, True])
def test_arithmetic_restart_markers_and_411_are_byte_identical(every_region, monkeypatch):
    tj = _turbojpeg_encoder()
    if every_region:
        monkeypatch.setattr(roi, "_REGION_COST", 0.0)
    img = synth_image(np.random.default_rng(11), 131, 97)
    files = {"arithmetic": tj.compress(img, 90, tj.SAMP.Y420, arithmetic=True),
             "restart markers": tj.compress(img, 90, tj.SAMP.Y420, restartrows=1),
             "4:1:1": tj.compress(img, 90, tj.SAMP.Y411),
             "progressive 4:2:2": tj.compress(img, 90, tj.SAMP.Y422, progressive=True)}
    with_roi, whole = _pair("cv2")
    calls = _count_regions(with_roi)
    for (name, data), box in itertools.product(files.items(), _boxes(97, 131)):
        plan = Plan(tuple(float(v) for v in box), (24, 24), True)
        a, b = np.zeros((24, 24, 3), np.uint8), np.ones((24, 24, 3), np.uint8)
        with_roi.decode_plan(data, 97, 131, plan, a, None)
        whole.decode_plan(data, 97, 131, plan, b, None)
        np.testing.assert_array_equal(a, b, err_msg=f"{name} {plan}")
    assert calls


@needs_roi
def test_lossless_jpeg_takes_the_whole_image_path(monkeypatch):
    """A cropped decode of a lossless JPEG crashes the bundled libjpeg-turbo 3.0 beta."""
    tj = _turbojpeg_encoder()
    monkeypatch.setattr(roi, "_REGION_COST", 0.0)
    data = tj.compress(synth_image(np.random.default_rng(12), 64, 48), 100, tj.SAMP.Y444,
                       lossless=True)
    with_roi, whole = _pair("cv2")
    calls = _count_regions(with_roi)
    # A box no larger than the output: no DCT scale, which lossless files do not have.
    plan = Plan((8.0, 8.0, 40.0, 40.0), (32, 32), False)
    a, b = np.zeros((32, 32, 3), np.uint8), np.ones((32, 32, 3), np.uint8)
    with_roi.decode_plan(data, 48, 64, plan, a, None)
    whole.decode_plan(data, 48, 64, plan, b, None)
    np.testing.assert_array_equal(a, b)
    assert not calls


@needs_roi
def test_cmyk_takes_the_whole_image_path():
    buf = io.BytesIO()
    Image.fromarray(synth_image(np.random.default_rng(4), 80, 60)).convert("CMYK").save(
        buf, "JPEG", quality=95)
    data = buf.getvalue()
    with_roi, whole = _pair("cv2")
    calls = _count_regions(with_roi)
    plan = Plan((10.0, 10.0, 40.0, 40.0), (16, 16), False)
    a, b = np.zeros((16, 16, 3), np.uint8), np.zeros((16, 16, 3), np.uint8)
    with_roi.decode_plan(data, 60, 80, plan, a, None)
    whole.decode_plan(data, 60, 80, plan, b, None)
    np.testing.assert_array_equal(a, b)
    assert not calls


# -- bad data ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tall():
    """A 4:2:0 JPEG 512 rows high and the byte range of its entropy-coded data."""
    data = make_jpeg(np.random.default_rng(7), 256, 512)
    sos = data.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(data[sos + 2:sos + 4], "big")
    return data, start, len(data) - 2


@pytest.fixture
def every_region(monkeypatch):
    """Region decodes even where the cost rule would decode the whole image (a strip
    the image's height), so that the bad-data tests reach the region path."""
    monkeypatch.setattr(roi, "_REGION_COST", 0.0)


def _damaged(data: bytes, at: int) -> bytes:
    """Garbage (marker bytes) over 64 bytes at ``at``: a bad Huffman code and a stray marker."""
    out = bytearray(data)
    out[at:at + 64] = b"\xff\x00\xff\x07" * 16
    return bytes(out)


def _decode(data: bytes, box, use_roi: bool) -> np.ndarray:
    dec = Decoder(ImagePipeline([RandomResizedCrop(32)]), "cv2", roi=use_roi)
    out = np.zeros((32, 32, 3), np.uint8)
    dec.decode_plan(data, 512, 256, Plan(box, (32, 32), False), out, None)
    return out


TOP, MIDDLE = (0.0, 0.0, 256.0, 64.0), (0.0, 224.0, 256.0, 288.0)
BOTTOM = (0.0, 448.0, 256.0, 512.0)
LEFT_STRIP = (0.0, 0.0, 32.0, 512.0)


@pytest.mark.usefixtures("every_region")
@pytest.mark.parametrize("use_roi", [pytest.param(True, marks=needs_roi), False])
@pytest.mark.parametrize("box", [TOP, MIDDLE, BOTTOM, LEFT_STRIP])
def test_truncated_jpeg_raises_wherever_the_crop_is(tall, use_roi, box):
    data, start, end = tall
    for cut in (start + (end - start) // 2, end - 100, end):  # the last drops EOI alone
        with pytest.raises(DecodeError, match="corrupt JPEG"):
            _decode(data[:cut], box, use_roi)


@pytest.mark.usefixtures("every_region")
@pytest.mark.parametrize("use_roi", [pytest.param(True, marks=needs_roi), False])
@pytest.mark.parametrize("box", [MIDDLE, BOTTOM, LEFT_STRIP])
def test_damage_inside_or_above_the_crop_raises(tall, use_roi, box):
    """Damage in the crop's rows (or its columns' neighbours), or in rows above it:
    every entropy-coded byte up to the crop's last row is read either way."""
    data, start, end = tall
    bad = _damaged(data, start + (end - start) // 2)  # about row 256
    with pytest.raises(DecodeError, match="corrupt JPEG"):
        _decode(bad, box, use_roi)


@pytest.mark.usefixtures("every_region")
@pytest.mark.parametrize("use_roi", [pytest.param(True, marks=needs_roi), False])
def test_damage_at_the_top_raises_for_a_crop_at_the_bottom(tall, use_roi):
    data, start, _ = tall
    with pytest.raises(DecodeError, match="corrupt JPEG"):
        _decode(_damaged(data, start + 200), BOTTOM, use_roi)


@pytest.mark.usefixtures("every_region")
@needs_roi
def test_damage_after_the_crop_is_not_seen_by_the_region_path(tall):
    """The documented gap: the region decode stops after the crop's last iMCU row, so
    damage below it goes unseen (the crop's pixels are the undamaged file's); the
    whole-image path still raises."""
    data, start, end = tall
    bad = _damaged(data, start + (end - start) * 3 // 4)  # about row 384
    with pytest.raises(DecodeError):
        _decode(bad, TOP, use_roi=False)
    np.testing.assert_array_equal(_decode(bad, TOP, use_roi=True), _decode(data, TOP, False))


# -- the fallback --------------------------------------------------------------------------

def test_fallback_when_the_library_is_missing(monkeypatch):
    monkeypatch.setattr(roi, "_lib", None)
    monkeypatch.setattr(roi, "_path", None)
    monkeypatch.setattr(roi, "_why", "no libturbojpeg (test)")
    assert not roi.available() and roi.library_path() is None
    pipe = ImagePipeline([RandomResizedCrop(32), RandomHorizontalFlip()])
    dec = Decoder(pipe)
    assert dec._region is None
    data = make_jpeg(np.random.default_rng(1), 200, 150)
    out = dec.decode_into(data, None, np.random.default_rng(3))
    assert out.shape == (32, 32, 3) and out.any()
    with pytest.raises(ImportError, match=r"roi=True: no libturbojpeg \(test\)"):
        Decoder(pipe, roi=True)
    with pytest.raises(ImportError, match=r"roi=True: no libturbojpeg \(test\)"):
        ImagePipeline([RandomResizedCrop(32)], roi=True)  # at once, not in a worker
    assert Decoder(pipe, roi=False)._region is None


@pytest.mark.parametrize("bad", ["yes", 1, 0])
def test_roi_is_none_true_or_false(bad):
    with pytest.raises(TypeError, match="roi must be None, True or False"):
        ImagePipeline([RandomResizedCrop(32)], roi=bad)


def test_library_lookup_skips_libraries_without_the_turbojpeg3_api(monkeypatch, tmp_path):
    fake = tmp_path / "libturbojpeg.so.0"
    fake.write_bytes(b"not a shared library")
    monkeypatch.setattr(roi, "_lib", None)
    monkeypatch.setattr(roi, "_path", None)
    monkeypatch.setattr(roi, "_why", None)
    monkeypatch.setattr(roi, "_candidates", lambda: [str(fake)])
    assert not roi.available()
    assert "pip install 'shardpack[roi]'" in roi.unavailable_reason()
    assert str(fake) in roi.unavailable_reason()


def test_the_pipeline_option_reaches_the_decoder_in_a_worker():
    data = make_jpeg(np.random.default_rng(2), 120, 90)
    off = ImagePipeline([RandomResizedCrop(32)], roi=False)
    assert "roi=False" in repr(off)
    worker = pickle.loads(pickle.dumps(DecoderPipeline(off, off.backend)))
    assert worker.decoder()._region is None
    off(data)
    assert off._decoder._region is None
    on = ImagePipeline([RandomResizedCrop(32)])
    assert (DecoderPipeline(on, on.backend).decoder()._region is not None) == roi.available()


@needs_roi
@pytest.mark.usefixtures("every_region")
def test_single_bit_flips_the_region_path_raises_only_where_the_whole_path_does(tall, rng):
    """It reads a prefix of what the whole decode reads, so it never raises where that
    would not; it raises less often (decode.py's docstring has the measured counts)."""
    data, start, end = tall
    raised = {True: 0, False: 0}
    for _ in range(60):
        bad = bytearray(data)
        bad[int(rng.integers(start, end))] ^= 1 << int(rng.integers(0, 8))
        top = float(rng.integers(0, 400))
        box = (0.0, top, 256.0, top + 64.0)
        failed = {}
        for use_roi in (True, False):
            try:
                _decode(bytes(bad), box, use_roi)
                failed[use_roi] = False
            except DecodeError:
                failed[use_roi] = True
                raised[use_roi] += 1
        assert failed[False] or not failed[True], box
    assert raised[False] > raised[True]


@pytest.mark.parametrize("use_roi", [False, None])
def test_a_lossless_jpeg_is_decoded_whole_at_any_crop(use_roi):
    """simplejpeg's DCT-scaled decode of a lossless JPEG corrupts memory (a segfault, a
    dead worker): such a file is decoded at full size whatever the crop."""
    tj = _turbojpeg_encoder()
    img = synth_image(np.random.default_rng(13), 320, 240)
    data = tj.compress(img, 100, tj.SAMP.Y444, lossless=True)
    assert not jpeg_dct_scalable(data)
    assert jpeg_dct_scalable(make_jpeg(np.random.default_rng(1), 64, 48))
    pipe = ImagePipeline([RandomResizedCrop(32, scale=(0.9, 1.0))], roi=use_roi)
    for seed in range(5):  # boxes of 200+ px to 32: a DCT scale of 1/4 or 1/8 otherwise
        out = pipe(data, rng=np.random.default_rng(seed))
        assert out.shape == (32, 32, 3) and out.any()


def test_the_frame_header_walk_never_raises_and_reads_any_number_of_segments():
    good = make_jpeg(np.random.default_rng(1), 64, 48)
    assert jpeg_dct_scalable(good) and jpeg_dct_scalable(memoryview(good))
    for cut in (0, 2, 3, 5, 20):  # no frame header to read: decoded whole
        assert not jpeg_dct_scalable(good[:cut])
    for sof, scalable in ((0xC3, False), (0xC0, True), (0xC2, True), (0xCF, False)):
        head = b"\xff\xd8" + b"\xff\xe2\x00\x04ab" * 5000 + bytes([0xFF, sof, 0, 8])
        assert jpeg_dct_scalable(head) is scalable  # an ICC profile in 5,000 APP2 pieces
    assert not jpeg_dct_scalable(b"\xff\xd8\xff\xff\xff\xc3\x00\x08")  # fill bytes first
    assert not jpeg_dct_scalable(b"\xff\xd8\xff\xda\x00\x08")  # a scan before any frame
    assert not jpeg_dct_scalable(b"\xff\xd8\xff\xe0\xff\xff")  # a length past the end
