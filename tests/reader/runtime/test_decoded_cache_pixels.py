"""The decoded cache serves exactly the uncached path's pixels (issue 35, defect 7).

The uncached path decodes each crop's box at a DCT scale chosen from the box (1/2,
1/4, 1/8 once it is that many times the output), and a scaled decode is no resample
of another scale's pixels: a cache that resampled every crop from the image it
kept changed the pixels of the crops that took a reduced scale. Here 10,000 random
RandomResizedCrops (scale, ratio, output size, flip, ``short_side`` and cache bound
drawn at random; every reduced scale taken, through hits and misses) go through the
per-sample functions a worker calls, cached against uncached, compared exactly; then
one small Loader run with the cache on and off.
"""

from __future__ import annotations

import math
import threading
from collections import Counter

import cv2
import numpy as np
import pytest

from formats import DatasetWriter, Field
from reader import DecodedCacheOptions, Loader
from reader.runtime.decoded_cache import DecodedCache
from reader.transforms import ImagePipeline, RandomHorizontalFlip, RandomResizedCrop, roi
from reader.transforms.decode import _dct_factor, image_size
from reader.transforms.imaging import DecoderPipeline
from scripts.synth import synth_image
from tests.helpers_jpeg import encode_kind

KINDS = ("420", "422", "444", "440", "411", "gray", "progressive")
SIZES = ((61, 45), (133, 97), (210, 256), (300, 291))  # (width, height)
CROPS = 10_000
PIPELINES = 50


@pytest.fixture(scope="module")
def jpegs() -> list[tuple[str, bytes]]:
    """JPEGs of every layout and size, and images every plan decodes whole: a PNG and,
    where the roi extra's encoder is installed, a lossless JPEG (no DCT to scale)."""
    rng = np.random.default_rng(35)
    out = [(f"{kind} {w}x{h}", encode_kind(synth_image(rng, w, h), kind))
           for kind in KINDS for w, h in SIZES]
    out.append(("png 250x180", cv2.imencode(".png", synth_image(rng, 250, 180))[1].tobytes()))
    try:
        import turbojpeg
    except ImportError:
        return out
    if hasattr(turbojpeg, "SAMP"):  # not PyTurboJPEG's module of the same name
        data = turbojpeg.compress(synth_image(rng, 240, 200), 100, turbojpeg.SAMP.Y444,
                                  lossless=True)
        out.append(("lossless 240x200", data))
    return out


def _random_pipeline(rng: np.random.Generator) -> tuple[ImagePipeline, int | None]:
    """A RandomResizedCrop + flip pipeline with random parameters, and a ``short_side``.
    Outputs of 6-40 px: boxes of these images reach 8x them, the 1/8 scale."""
    size = (int(rng.integers(6, 41)), int(rng.integers(6, 41)))
    lo = float(rng.uniform(0.02, 0.6))
    scale = (lo, float(rng.uniform(lo, 1.0)))
    ratio = (math.exp(rng.uniform(math.log(1 / 3), 0)), math.exp(rng.uniform(0, math.log(3))))
    backend = "pillow" if rng.random() < 0.2 else "cv2"
    use_roi = roi.available() and rng.random() < 0.7  # both decode paths, where installed
    pipe = ImagePipeline([RandomResizedCrop(size, scale=scale, ratio=ratio),
                          RandomHorizontalFlip()], backend=backend, roi=use_roi)
    short_side = [None, None, min(size), int(rng.integers(10, 60))][int(rng.integers(0, 4))]
    return pipe, short_side


def test_ten_thousand_random_crops_from_the_cache_are_the_uncached_ones(jpegs, rng):
    sizes = [image_size(d) for _, d in jpegs]
    whole = sum(h * w * 3 for h, w in sizes)
    seen = Counter()
    bad = []
    for p in range(PIPELINES):
        pipe, short_side = _random_pipeline(rng)
        run = DecoderPipeline(pipe, pipe.backend)
        # Sometimes too small for all: records that do not fit are decoded every time.
        bound = int(whole * (1.0 if rng.random() < 0.7 else rng.uniform(0.2, 0.8)))
        cache = DecodedCache(DecodedCacheOptions(max_bytes=bound, short_side=short_side),
                             len(jpegs), threading.Lock())
        want = np.empty(pipe.output_shape, np.uint8)
        got = np.empty(pipe.output_shape, np.uint8)
        for _ in range(CROPS // PIPELINES):
            record = int(rng.integers(0, len(jpegs)))
            seed = int(rng.integers(0, 2**63))
            name, data = jpegs[record]
            hit = cache.get(record) is not None
            run.run(data, want, np.random.default_rng(seed))
            run.run_cached(cache, record, data, got, np.random.default_rng(seed))
            plan = pipe.plan(*sizes[record], np.random.default_rng(seed))
            factor = _dct_factor(plan)
            seen["factor", factor, "hit" if hit else "miss"] += 1
            seen["flip", plan.flip] += 1
            if not np.array_equal(want, got):
                diff = np.abs(want.astype(int) - got.astype(int)).mean()
                bad.append(f"pipeline {p} ({pipe.transforms[0]}, backend {pipe.backend}, roi "
                           f"{pipe.roi}, short_side {short_side}), {name}, seed {seed}: {plan}, "
                           f"DCT 1/{factor}, cache {'hit' if hit else 'miss'}, mean |diff| "
                           f"{diff:.2f}")
        cache.close()
    for factor in (1, 2, 4, 8):  # every scale, served from the cache and on a miss
        assert seen["factor", factor, "hit"] >= 50 and seen["factor", factor, "miss"] >= 5, seen
    assert seen["flip", True] > 1000 and seen["flip", False] > 1000, seen
    assert not bad, f"{len(bad)} of {CROPS} crops differ; the first: " + "\n".join(bad[:5])


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    """48 JPEGs of 90-180 px: crops to 12 px take every DCT scale."""
    root = tmp_path_factory.mktemp("dcache-pixels") / "ds"
    rng = np.random.default_rng(7)
    with DatasetWriter(root, [Field("image", "jpeg"), Field("label", "int")], shard_size=None,
                       records_per_shard=16, durable=False) as w:
        for i in range(48):
            width, height = (int(s) for s in rng.integers(90, 181, 2))
            w.write({"image": encode_kind(synth_image(rng, width, height), KINDS[i % 5]),
                     "label": i})
    return root


@pytest.mark.parametrize("short_side", [None, 24])
def test_a_loader_with_the_cache_serves_the_uncached_pixels(ds_path, short_side):
    def epochs(cache):
        with Loader(ds_path, 8, num_workers=2, shuffle=True, seed=5, copy=True,
                    decoded_cache=cache,
                    transform=[RandomResizedCrop(12, scale=(0.05, 1.0)),
                               RandomHorizontalFlip()]) as lo:
            got = [[(b["label"], b["image"]) for b in lo] for _ in range(3)]
            return got, lo.decoded_cache.stats() if cache else None

    want, _ = epochs(None)
    got, stats = epochs(DecodedCacheOptions(max_bytes=1 << 26, short_side=short_side))
    assert stats["records"] == 48
    for e, (we, ge) in enumerate(zip(want, got, strict=True)):
        for (wl, wi), (gl, gi) in zip(we, ge, strict=True):
            assert np.array_equal(wl, gl)
            differ = [int(x) for x, a, b in zip(wl, wi, gi, strict=True)
                      if not np.array_equal(a, b)]
            assert not differ, f"epoch {e}: records {differ} differ from the uncached ones"
