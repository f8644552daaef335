"""reader.transforms and reader.transforms.decode: sampling, geometry and the fused decode path."""

from __future__ import annotations

import io
import math
import pickle

import numpy as np
import pytest
import simplejpeg
from PIL import Image

from reader import DecodeError
from reader.transforms import (
    CenterCrop,
    ImagePipeline,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    UserTransform,
)
from reader.transforms.decode import Decoder, decode_full, image_size
from scripts.synth import make_jpeg, synth_image


def _backends():
    out = ["pillow"]
    try:
        import cv2  # noqa: F401

        out.append("cv2")
    except ImportError:
        pass
    return out


BACKENDS = _backends()


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def naive_crop_resize(data: bytes, box: tuple[int, int, int, int], size, backend: str):
    """Reference: full decode, integer crop, resize with the same backend."""
    full = simplejpeg.decode_jpeg(data)
    x0, y0, x1, y1 = (round(v) for v in box)
    crop = np.ascontiguousarray(full[y0:y1, x0:x1])
    if backend == "pillow":
        return np.asarray(Image.fromarray(crop).resize(size[::-1], Image.Resampling.BILINEAR))
    import cv2

    # Plain decode-then-resize reference; area averaging only past 2x, like ours.
    shrink = min(crop.shape[0] / size[0], crop.shape[1] / size[1])
    flag = cv2.INTER_AREA if shrink >= 2 else cv2.INTER_LINEAR
    return cv2.resize(crop, size[::-1], interpolation=flag)


@pytest.fixture(scope="module")
def jpeg():
    return make_jpeg(np.random.default_rng(0), 400, 320, quality=92)


def _sample(t, height, width, rng, n=2000):
    areas, log_ratios = [], []
    for _ in range(n):
        top, left, h, w = t.get_params(height, width, rng)
        assert top >= 0 and top + h <= height and left >= 0 and left + w <= width
        areas.append(h * w / (height * width))
        log_ratios.append(math.log(w / h))
    return np.array(areas), np.array(log_ratios)


def test_random_resized_crop_bounds_and_stats(rng):
    areas, log_ratios = _sample(RandomResizedCrop(224), 400, 400, rng)
    # Integer rounding lets the bounds slip by about a pixel.
    assert areas.min() >= 0.08 * 0.97 and areas.max() <= 1.0
    assert np.abs(log_ratios).max() <= math.log(4 / 3) + 0.02
    # On a square image the log-ratio is symmetric; large areas are sometimes
    # rejected (a side would exceed the image), so the mean area is under 0.54.
    assert abs(log_ratios.mean()) < 0.03
    assert 0.42 < areas.mean() < 0.54


def test_random_resized_crop_distributions_without_rejection(rng):
    # Small areas always fit, so area is uniform and log-ratio is uniform.
    areas, log_ratios = _sample(RandomResizedCrop(224, scale=(0.1, 0.3)), 500, 500, rng)
    lo = math.log(3 / 4)
    for q in (0.1, 0.25, 0.5, 0.75, 0.9):
        assert np.quantile(areas, q) == pytest.approx(0.1 + 0.2 * q, abs=0.02)
        assert np.quantile(log_ratios, q) == pytest.approx(lo - 2 * lo * q, abs=0.03)


def test_random_resized_crop_is_deterministic_and_falls_back():
    t = RandomResizedCrop(32, scale=(0.5, 0.9))
    a = [t.get_params(100, 80, np.random.default_rng(9)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    # Impossible ratio for a 10x100 strip: ten misses, then torchvision's fallback.
    fallback = RandomResizedCrop(8, scale=(0.9, 1.0), ratio=(1.0, 1.0))
    assert fallback.get_params(10, 100, np.random.default_rng(0)) == (0, 45, 10, 10)
    assert fallback.get_params(100, 10, np.random.default_rng(0)) == (45, 0, 10, 10)


def test_pipeline_shapes_and_validation():
    assert ImagePipeline([RandomResizedCrop((160, 128))]).output_shape == (160, 128, 3)
    assert ImagePipeline([Resize(256), CenterCrop(224)]).output_shape == (224, 224, 3)
    user = UserTransform(lambda x: x[::2, ::2], output_shape=(112, 112, 3))
    assert ImagePipeline([CenterCrop(224), user]).output_shape == (112, 112, 3)
    # A size that depends on the image is allowed (the loader pads or concatenates).
    assert ImagePipeline([Resize(256)]).output_shape is None
    with pytest.raises(ValueError, match="fixed output size"):
        ImagePipeline([Resize(256), user])
    with pytest.raises(ValueError, match="in this order"):
        ImagePipeline([CenterCrop(8), lambda x: x, RandomHorizontalFlip()])


def test_resize_then_center_crop_plan_matches_torchvision_geometry():
    plan = ImagePipeline([Resize(256), CenterCrop(224)]).plan(360, 420, np.random.default_rng(0))
    # Resize -> 256x298 (long side truncated); crop at top 16, left round(37.0) = 37.
    sx, sy = 420 / 298, 360 / 256
    assert plan.box == pytest.approx((37 * sx, 16 * sy, 261 * sx, 240 * sy))
    assert plan.size == (224, 224)


@pytest.mark.parametrize("backend", BACKENDS)
def test_crop_resize_matches_naive_reference(jpeg, backend):
    pipe = ImagePipeline([RandomResizedCrop(96)], backend=backend)
    scaled = 0
    for seed in range(12):
        plan = pipe.plan(320, 400, np.random.default_rng(seed))
        box = plan.box
        scaled += min(box[2] - box[0], box[3] - box[1]) >= 2 * 96
        out = np.zeros(pipe.output_shape, np.uint8)
        result = pipe(jpeg, out, np.random.default_rng(seed))
        assert result is out
        ref = naive_crop_resize(jpeg, box, (96, 96), backend)
        # DCT-domain downscaling differs slightly from decode-then-resize; the synthetic
        # grain is 1-2 px, the worst case for such differences (Pillow vs OpenCV
        # area on the same full-resolution crop differ by as much).
        assert psnr(out, ref) > 25, (seed, plan)
    assert scaled > 0  # the DCT-scaled path was exercised


@pytest.mark.parametrize("backend", BACKENDS)
def test_unscaled_crop_is_exact(backend):
    data = make_jpeg(np.random.default_rng(2), 64, 48, quality=95)
    out = ImagePipeline([CenterCrop((20, 30))], backend=backend)(data)
    np.testing.assert_array_equal(out, simplejpeg.decode_jpeg(data)[14:34, 17:47])


@pytest.mark.parametrize("backend", BACKENDS)
def test_flip(jpeg, backend):
    plain = ImagePipeline([CenterCrop(64)], backend=backend)(jpeg)
    flipped = ImagePipeline([CenterCrop(64), RandomHorizontalFlip(p=1.0)], backend=backend)(jpeg)
    np.testing.assert_array_equal(flipped, plain[:, ::-1])
    # A crop after a flip is taken from the mirrored image.
    left = ImagePipeline([RandomHorizontalFlip(1.0), CenterCrop((32, 300)), CenterCrop((32, 8))])
    assert left.plan(320, 400, np.random.default_rng(0)).flip


def test_center_crop_pads_with_zeros():
    data = make_jpeg(np.random.default_rng(3), 40, 30, quality=95)
    out = ImagePipeline([CenterCrop((40, 50))])(data)
    assert out.shape == (40, 50, 3)
    assert not out[:5].any() and not out[-5:].any() and not out[:, :5].any()
    np.testing.assert_array_equal(out[5:35, 5:45], simplejpeg.decode_jpeg(data))


def test_writes_into_out_and_reuses_scratch(jpeg):
    decoder = Decoder(ImagePipeline([RandomResizedCrop(64), RandomHorizontalFlip()]))
    out = np.zeros((64, 64, 3), np.uint8)
    assert decoder.decode_into(memoryview(jpeg), out, np.random.default_rng(1)) is out
    assert out.any()
    scratch = decoder._scratch
    decoder.decode_into(jpeg, out, np.random.default_rng(2))
    assert decoder._scratch is scratch
    with pytest.raises(ValueError, match="out must be"):
        decoder.decode_into(jpeg, np.zeros((32, 32, 3), np.uint8), np.random.default_rng(0))


def test_user_transform_and_pickle(jpeg):
    pipe = ImagePipeline([CenterCrop(64), lambda x: 255 - x])
    expected = 255 - ImagePipeline([CenterCrop(64)])(jpeg)
    np.testing.assert_array_equal(pipe(jpeg), expected)
    clone = pickle.loads(pickle.dumps(ImagePipeline([CenterCrop(64)])))
    np.testing.assert_array_equal(255 - clone(jpeg), expected)
    half = UserTransform(lambda x: np.ascontiguousarray(x[::2, ::2]), output_shape=(32, 32, 3))
    np.testing.assert_array_equal(
        ImagePipeline([CenterCrop(64), half])(jpeg), ImagePipeline([CenterCrop(64)])(jpeg)[::2, ::2]
    )


def test_grayscale_and_cmyk_give_rgb():
    img = synth_image(np.random.default_rng(4), 80, 60)
    gray = simplejpeg.encode_jpeg(img[..., :1].copy(), colorspace="GRAY")
    out = ImagePipeline([CenterCrop(32)])(gray)
    assert out.shape == (32, 32, 3)
    assert (out[..., 0] == out[..., 1]).all() and (out[..., 1] == out[..., 2]).all()
    buf = io.BytesIO()
    Image.fromarray(img).convert("CMYK").save(buf, "JPEG", quality=95)
    rgb = decode_full(buf.getvalue())
    assert rgb.shape == (60, 80, 3) and psnr(rgb, img) > 25


def test_png_slow_path():
    img = synth_image(np.random.default_rng(5), 50, 40)
    buf = io.BytesIO()
    Image.fromarray(img).convert("RGBA").save(buf, "PNG")
    np.testing.assert_array_equal(decode_full(buf.getvalue()), img)
    assert image_size(buf.getvalue()) == (40, 50)
    np.testing.assert_array_equal(
        ImagePipeline([CenterCrop(20)])(buf.getvalue()), img[10:30, 15:35]
    )


@pytest.mark.parametrize(
    "bad",
    [b"", b"not an image", b"\xff\xd8\xff\xe0garbage", "truncated"],
)
def test_corrupt_input_raises_decode_error(jpeg, bad):
    data = jpeg[: len(jpeg) // 2] if bad == "truncated" else bad
    pipe = ImagePipeline([RandomResizedCrop(32)])
    with pytest.raises(DecodeError):
        pipe(data, rng=np.random.default_rng(0))
    with pytest.raises(DecodeError):
        decode_full(data)
    assert issubclass(DecodeError, ValueError)


def test_decode_timed_splits_user_callables_from_the_fused_decode(jpeg):
    """User callables are the monitor's ``transform`` stage; decode + crop + flip stay ``decode``."""
    import time

    from reader.transforms.imaging import make_pipeline

    def slow_invert(x):
        end = time.perf_counter() + 0.02
        while time.perf_counter() < end:
            pass
        return 255 - x

    specs = [RandomResizedCrop(64), RandomHorizontalFlip()]
    plain, user = Decoder(ImagePipeline(specs)), Decoder(ImagePipeline([*specs, slow_invert]))
    a, b = np.empty((64, 64, 3), np.uint8), np.empty((64, 64, 3), np.uint8)
    decode_s, transform_s = plain.decode_timed(jpeg, a, np.random.default_rng(3))
    assert decode_s > 0 and transform_s == 0.0
    decode_s, transform_s = user.decode_timed(jpeg, b, np.random.default_rng(3))
    assert transform_s >= 0.02 and decode_s < 0.02
    np.testing.assert_array_equal(b, 255 - a)  # the same pixels as decode_into
    # The worker-side adapter reports the same split.
    pipeline = make_pipeline([*specs, slow_invert])
    decode_s, transform_s = pipeline.run(memoryview(jpeg), b, np.random.default_rng(3))
    assert transform_s >= 0.02 and decode_s < transform_s
    np.testing.assert_array_equal(b, 255 - a)
    # A callable that changes the shape: its copy into the slot is transform time too.
    half = UserTransform(lambda x: np.ascontiguousarray(x[::2, ::2]), output_shape=(32, 32, 3))
    small = np.empty((32, 32, 3), np.uint8)
    _, transform_s = Decoder(ImagePipeline([*specs, half])).decode_timed(
        jpeg, small, np.random.default_rng(3))  # fmt: skip
    assert transform_s > 0
    np.testing.assert_array_equal(small, a[::2, ::2])
