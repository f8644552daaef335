"""JPEG admission by the frame header (issue 35, defect 4): what
:func:`formats.sniff.jpeg_unsupported` calls decodable is exactly what the Loader's
decoder (simplejpeg: its header call, then an RGB decode) decodes, tried on files of
every kind that ``tests/helpers_jpeg.py`` writes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import simplejpeg

from formats.sniff import image_size, jpeg_dct_scalable, jpeg_frame, jpeg_unsupported
from tests.helpers_jpeg import jpeg_file

FACTORS = [(h, v) for h in range(1, 5) for v in range(1, 5)]


def decodes(data: bytes) -> bool:
    """What the Loader does with a JPEG: the header call (sizes), then an RGB decode."""
    try:
        simplejpeg.decode_jpeg_header(data)
        simplejpeg.decode_jpeg(data, colorspace="RGB")
    except (ValueError, KeyError):
        return False
    return True


def admitted(data: bytes) -> bool:
    frame = jpeg_frame(data)
    if jpeg_unsupported(frame) is not None:
        return False
    return not frame.lossless or decodes(data)  # lossless: the packer tries the decode


def samplings(rng: np.random.Generator):
    """Every sampling of 1 to 3 components, and a share of the 4-component ones (CMYK
    and YCCK), within the 10 blocks an MCU may hold."""
    for n in (1, 2, 3):
        for s in itertools.product(FACTORS, repeat=n):
            if n == 1 or sum(h * v for h, v in s) <= 10:
                yield s, None
    for s in itertools.product(FACTORS, repeat=4):
        if sum(h * v for h, v in s) <= 10 and rng.random() < 0.3:
            yield s, int(rng.integers(0, 3))


def test_every_sampling_is_admitted_exactly_when_the_decoder_reads_it():
    rng = np.random.default_rng(35)
    cases = 0
    for sampling, adobe in samplings(rng):
        data = jpeg_file(rng, 8, 8, sampling=sampling, adobe=adobe)
        cases += 1
        assert admitted(data) == decodes(data), (sampling, adobe,
                                                 jpeg_unsupported(jpeg_frame(data)))
    assert cases > 1000, cases


# A DCT frame holds 8 or 12 bits (16 is tried, as bad input); a lossless one 2 to 16.
_FRAMES = [(p, k) for k in ("baseline", "progressive") for p in (8, 12, 16)] + \
    [(p, k) for k in ("lossless", "lossless-rgb") for p in (2, 4, 8, 12, 16)]


@pytest.mark.parametrize(("precision", "kind"), _FRAMES)
def test_precision_and_frame_kind_are_admitted_exactly_when_the_decoder_reads_them(
        precision, kind):
    rng = np.random.default_rng(precision)
    lossless = kind.startswith("lossless")
    data = jpeg_file(rng, 24, 16, precision=precision, lossless=lossless,
                     progressive=kind == "progressive", adobe=0 if kind == "lossless-rgb" else None)
    assert admitted(data) == decodes(data)
    assert admitted(data) == ((precision == 8 and kind != "lossless") or
                              (kind == "lossless-rgb" and precision <= 8))
    frame = jpeg_frame(data)
    if precision != 8 and not (lossless and precision < 8):
        assert f"{precision}-bit" in jpeg_unsupported(frame)


@pytest.mark.parametrize("marker", [0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB,
                                    0xCD, 0xCE, 0xCF])
def test_hierarchical_frames_are_refused_and_the_others_left_to_the_decode(marker):
    data = jpeg_file(np.random.default_rng(1), sof=marker)
    reason = jpeg_unsupported(jpeg_frame(data))
    if marker in (0xC5, 0xC6, 0xC7, 0xCD, 0xCE, 0xCF):
        assert "hierarchical" in reason
        assert not decodes(data)
    else:
        assert reason is None  # the scan is coded as SOF0's: the decode calls it corrupt


def test_4_4_1_sampling_is_named_where_simplejpeg_raises_a_raw_key_error():
    data = jpeg_file(np.random.default_rng(2), sampling=((1, 4), (1, 1), (1, 1)))
    with pytest.raises(KeyError):  # what the packer used to die of
        simplejpeg.decode_jpeg_header(data)
    assert "4:4:1 sampling (1x4, 1x1, 1x1)" in jpeg_unsupported(jpeg_frame(data))


def test_the_frame_header_gives_the_size_and_cut_headers_raise_value_error_only():
    data = jpeg_file(np.random.default_rng(3), 40, 24, sampling=((2, 2), (1, 1), (1, 1)))
    frame = jpeg_frame(data)
    assert (frame.height, frame.width, frame.precision, frame.kind) == (24, 40, 8, "baseline")
    assert frame.sampling == ((2, 2), (1, 1), (1, 1))
    assert image_size(data, "jpeg") == (24, 40) == simplejpeg.decode_jpeg_header(data)[:2]
    assert jpeg_frame(memoryview(data)) == frame
    for cut in range(len(data)):
        try:
            jpeg_frame(data[:cut])
        except ValueError:
            continue
        assert cut > data.index(b"\xff\xc0") + 10  # the frame header was all there


def test_a_frame_header_whose_length_disagrees_with_its_components_is_refused():
    data = bytearray(jpeg_file(np.random.default_rng(4)))
    at = data.index(b"\xff\xc0")
    data[at + 9] = 4  # four components announced, three described
    with pytest.raises(ValueError, match="components"):
        jpeg_frame(bytes(data))
    assert jpeg_dct_scalable(bytes(data))  # the walk alone still finds a DCT frame
