"""scripts.synth: deterministic, decodable, realistically sized JPEGs."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import simplejpeg

from scripts.synth import make_image_folder, make_jpeg, make_tiny_jpeg, synth_image


def test_make_jpeg_is_deterministic_and_decodable():
    a = make_jpeg(np.random.default_rng(3), 120, 90)
    b = make_jpeg(np.random.default_rng(3), 120, 90)
    c = make_jpeg(np.random.default_rng(4), 120, 90)
    assert a == b
    assert a != c
    assert simplejpeg.decode_jpeg(a).shape == (90, 120, 3)


def test_tiny_jpeg_decodes():
    assert simplejpeg.decode_jpeg(make_tiny_jpeg(np.random.default_rng(0))).shape == (24, 32, 3)


def test_content_is_not_flat_or_white_noise():
    img = synth_image(np.random.default_rng(1), 200, 160).astype(np.float32)
    assert img.std() > 20  # not flat
    # Neighbouring pixels are correlated, unlike white noise.
    lum = img.mean(axis=2)
    corr = np.corrcoef(lum[:, :-1].ravel(), lum[:, 1:].ravel())[0, 1]
    assert corr > 0.5


def test_mean_size_is_photo_like():
    rng = np.random.default_rng(7)
    sizes = [len(make_jpeg(rng, int(w), int(h))) for w, h in rng.integers(300, 501, (24, 2))]
    assert 60_000 < np.mean(sizes) < 140_000, np.mean(sizes)


def test_image_folder_layout_and_determinism(tmp_path):
    one = make_image_folder(tmp_path / "a", 2, 3, min_side=40, max_side=60, seed=5)
    two = make_image_folder(tmp_path / "b", 2, 3, min_side=40, max_side=60, seed=5, workers=2)
    assert [p.relative_to(tmp_path / "a") for p in one] == [
        p.relative_to(tmp_path / "b") for p in two
    ]
    assert str(one[4].relative_to(tmp_path / "a")) == "class_001/img_00001.jpg"
    for p, q in zip(one, two, strict=True):
        assert p.read_bytes() == q.read_bytes()
        h, w, _, _ = simplejpeg.decode_jpeg_header(p.read_bytes())
        assert 40 <= h <= 60 and 40 <= w <= 60
    other = make_image_folder(tmp_path / "c", 2, 3, min_side=40, max_side=60, seed=6)
    assert one[0].read_bytes() != other[0].read_bytes()


def test_needs_only_the_core_dependencies():
    """The demo's image generator draws with OpenCV: no Pillow (not a core dependency)."""
    code = ("import sys; sys.modules['PIL'] = None\n"
            "import numpy as np, simplejpeg\n"
            "from scripts.synth import make_jpeg\n"
            "assert simplejpeg.decode_jpeg(make_jpeg(np.random.default_rng(0), 64, 48)).shape"
            " == (48, 64, 3)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
