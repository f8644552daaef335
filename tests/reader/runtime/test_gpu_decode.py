"""The GPU decode path (reader/runtime/gpu_decode.py) end to end on the stand-ins
(numpy for cupy, simplejpeg for nvImageCodec), its resample kernel's definition, the
split controller, and the refusals; the real kernel and decoder where a GPU is."""

from __future__ import annotations

import itertools
import sys
import threading
import time
import types

import numpy as np
import pytest

import formats
import reader
from reader.options import DeviceOptions
from reader.runtime.device import normalize
from reader.runtime.split import SplitController, optimal_share
from reader.runtime.worker import batch_rng
from reader.transforms import CenterCrop, Normalize, RandomHorizontalFlip, RandomResizedCrop
from reader.transforms.decode import image_size
from reader.transforms.resample import integer_box, resample_reference, uses_area

simplejpeg = pytest.importorskip("simplejpeg")
cv2 = pytest.importorskip("cv2")


@pytest.fixture
def stand_ins(monkeypatch):
    """fake cupy and fake nvImageCodec in place of the real ones."""
    from tests import fake_cupy, fake_nvimgcodec

    fake_cupy.reset()
    fake_nvimgcodec.reset()
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    nvidia = types.ModuleType("nvidia")
    nvidia.nvimgcodec = fake_nvimgcodec
    monkeypatch.setitem(sys.modules, "nvidia", nvidia)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", fake_nvimgcodec)
    return fake_cupy, fake_nvimgcodec


def _smooth(rng, h, w):
    """A photo-like image (smooth gradients and blobs): JPEG keeps it close, so decoder
    differences stay small as they do on real photos."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 90 * np.sin(x / (7 + 5 * c) + y / (11 + 3 * c) + rng.uniform(0, 6))
                    for c in range(3)], -1)
    return np.clip(img + rng.normal(0, 4, img.shape), 0, 255).astype(np.uint8)


def _dataset(path, rng, n, sizes=((64, 72), (56, 64), (64, 64))):
    with formats.DatasetWriter(path, [formats.Field("image", "jpeg"),
                                      formats.Field("label", "int")]) as w:
        for i in range(n):
            h, w_ = sizes[i % len(sizes)]
            w.write({"image": simplejpeg.encode_jpeg(_smooth(rng, h, w_), quality=95),
                     "label": i})


def _host(v):
    """A batch's array on the host: real cupy's arrays have .get(); numpy's (and the
    stand-in's, a numpy subclass) are copied."""
    return v.get() if hasattr(v, "get") and not isinstance(v, np.ndarray) else np.array(v)


def _batches(path, transform, device_options=None, **kw):
    cuda = device_options is not None
    with reader.Loader(path, 5, num_workers=kw.pop("num_workers", 1), seed=3,
                       shuffle=kw.pop("shuffle", True),
                       transform=transform, copy=not cuda, device="cuda" if cuda else "cpu",
                       device_options=device_options, **kw) as lo:
        out = [{k: _host(v) for k, v in b.items()} for b in lo]
        return out, lo


def _listener():
    """(list, listener): each delivered batch's BatchTiming appended to the list."""
    timings = []

    class Listen:
        def on_batch(self, t):
            timings.append(t)

        def on_workers_changed(self, n, change):
            pass

    return timings, Listen()


RRC_FLIP = [RandomResizedCrop(48, scale=(0.5, 1.0)), RandomHorizontalFlip()]
RAW = dict(dtype="uint8", layout="NHWC")


# -- the resample: its definition against OpenCV ----------------------------------------------

@pytest.mark.parametrize(("src", "dst"), [((40, 50), (32, 32)), ((64, 64), (48, 48)),
                                          ((30, 20), (48, 40)), ((100, 90), (32, 32)),
                                          ((97, 131), (24, 24)), ((64, 96), (32, 32))])
def test_the_resample_is_opencvs_filter_within_one_level(rng, src, dst):
    img = _smooth(rng, *src)
    got = resample_reference(img, dst, flip=False)
    interp = cv2.INTER_AREA if uses_area(src, dst) else cv2.INTER_LINEAR
    want = cv2.resize(img, dst[::-1], interpolation=interp)
    diff = np.abs(got.astype(int) - want)
    # OpenCV's INTER_LINEAR on uint8 uses 11-bit fixed-point weights; ours float: one level.
    assert diff.max() <= 1, (src, dst, diff.max())
    assert np.array_equal(resample_reference(img, dst, flip=True), got[:, ::-1])


_HOST_SHIM = """#include <math.h>
#define __global__
struct D { int x, y, z; };
static D blockIdx, blockDim, threadIdx;
static inline int min(int a, int b) { return a < b ? a : b; }
"""
_HOST_GRID = """
extern "C" void launch(const unsigned long long* src, const int* sh, const int* sw,
        const long long* pitch, const int* dst_row, const unsigned char* flip,
        unsigned char* out, int OH, int OW, int n) {
    blockDim.x = 128;
    for (int z = 0; z < n; z++) for (int y = 0; y < OH; y++)
        for (int bx = 0; bx < (OW + 127) / 128; bx++) for (int t = 0; t < 128; t++) {
            blockIdx.x = bx; blockIdx.y = y; blockIdx.z = z; threadIdx.x = t;
            kern(src, sh, sw, pitch, dst_row, flip, out, OH, OW, n);
        }
}
"""


def test_the_kernel_source_run_on_the_host_matches_its_definition(tmp_path, rng):
    """The CUDA source itself, compiled as C++ with the grid as loops (no GPU here):
    pitch, destination row, flip and both filters as resample_reference defines them."""
    import ctypes
    import shutil
    import subprocess

    from reader.transforms.resample import RESAMPLE_CUDA

    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("needs a C++ compiler (g++ or clang++) to run the kernel source on the host")
    src = tmp_path / "kernel.cpp"
    body = RESAMPLE_CUDA.replace('extern "C" __global__ void shardpack_resample(',
                                 "static void kern(")
    src.write_text(_HOST_SHIM + body + _HOST_GRID)
    lib = tmp_path / "kernel.so"
    subprocess.run([cxx, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True,
                   capture_output=True)
    launch = ctypes.CDLL(str(lib)).launch
    cases = [((97, 131), (32, 32)), ((30, 20), (48, 40)), ((64, 64), (48, 48)),
             ((200, 150), (24, 24))]
    for (h, w), (oh, ow) in cases:
        full = rng.integers(0, 256, (h + 5, w + 7, 3), dtype=np.uint8)
        crop = full[2:2 + h, 3:3 + w]  # strided: its pitch is the full row
        out = np.zeros((2, oh, ow, 3), np.uint8)
        arrays = [np.array([crop.__array_interface__["data"][0]], np.uint64),
                  np.array([h], np.int32), np.array([w], np.int32),
                  np.array([crop.strides[0]], np.int64), np.array([1], np.int32),
                  np.array([1], np.uint8), out]
        launch(*[a.ctypes.data_as(ctypes.c_void_p) for a in arrays], oh, ow, 1)
        diff = np.abs(out[1].astype(int) - resample_reference(crop, (oh, ow), True))
        assert diff.max() <= 1, ((h, w), (oh, ow), diff.max())  # float32 against float64
        assert not out[0].any()  # only its destination row is written


# -- the split controller --------------------------------------------------------------------

def test_the_optimal_share_finishes_both_sides_together():
    g = optimal_share(cpu_rate=3000.0, gpu_rate=9000.0)
    assert g == pytest.approx(0.75)
    n = 256
    assert g * n / 9000 == pytest.approx((1 - g) * n / 3000)
    assert optimal_share(0.0, 0.0) == 0.5


def test_the_controller_moves_toward_the_optimum_and_holds_within_hysteresis():
    c = SplitController()
    assert c.share == 0.5 and c.count(100) == 50
    shares = [c.observe(25, 0.1, 4, 50, 0.005) for _ in range(12)]  # cpu 1000/s, gpu 10000/s
    target = optimal_share(1000.0, 10000.0)
    assert shares[0] > 0.5 and all(b >= a for a, b in itertools.pairwise(shares))
    assert abs(shares[-1] - target) <= c.hysteresis
    held = c.share
    c.observe(25, 0.1, 4, 50, 0.0052)  # a small change of rates: inside the hysteresis
    assert c.share == held


def test_each_side_keeps_a_probe_and_a_fixed_share_never_moves():
    c = SplitController(share=0.999)
    assert c.count(100) == 95  # the CPU keeps 5% so its rate stays measured
    c = SplitController(share=0.0)
    assert c.count(100) == 5
    f = SplitController(fixed=1.0)
    assert f.count(100) == 100 and f.observe(10, 1.0, 2, 90, 0.01) == 1.0
    assert SplitController(fixed=0.0).count(7) == 0


# -- end to end on the stand-ins --------------------------------------------------------------

def test_gpu_decoded_batches_equal_the_cpu_path(tmp_path, rng, stand_ins):
    """decode_device='cuda' alone (gpu_share=1): same records, labels, crops and flips as the
    CPU path; pixels within one level (the filter's rounding, see resample.py), since
    the stand-in decodes as the CPU path does and these crops need no DCT scaling."""
    fake_cupy, fake_nv = stand_ins
    _dataset(tmp_path, rng, 13)
    want, _ = _batches(tmp_path, RRC_FLIP)
    got, lo = _batches(tmp_path, RRC_FLIP, DeviceOptions(decode_device="cuda", gpu_share=1.0, **RAW))
    assert lo.gpu_decode
    assert len(got) == len(want) == 3
    for g, w in zip(got, want, strict=True):
        assert set(g) == {"image", "label"}  # the staging fields never reach the user
        assert np.array_equal(g["label"], w["label"])
        diff = np.abs(g["image"].astype(int) - w["image"])
        assert diff.max() <= 1, diff.max()
    assert len(fake_nv.regions) == 13  # every image decoded on the "GPU"
    assert [launch[0] for launch in fake_cupy.launches] == ["shardpack_resample"] * 3  # one a batch


def test_region_decode_boxes_are_the_cpu_plans(tmp_path, rng, stand_ins):
    """The regions asked of nvImageCodec are the CPU path's plans, rounded as it rounds
    them: replayed here from the batch's random stream, record by record."""
    _, fake_nv = stand_ins
    _dataset(tmp_path, rng, 10)
    _, lo = _batches(tmp_path, RRC_FLIP, DeviceOptions(decode_device="cuda", gpu_share=1.0, **RAW))
    ds = reader.open_dataset(tmp_path)
    core = lo.plan.pipeline.pipeline
    want = []
    for k in range(len(lo)):
        rng_k = batch_rng(lo.spec, 0, k)
        for r in lo.sampler.batch(0, k).tolist():
            data = ds.payload(r, "image")
            h, w = image_size(data)
            x0, y0, x1, y1 = integer_box(core.plan(h, w, rng_k).box, h, w)
            want.append((y0, x0, y1, x1))
    assert fake_nv.regions == want


@pytest.mark.parametrize("num_workers", [0, 2])
def test_hybrid_batches_equal_the_cpu_path_and_report_the_split(tmp_path, rng, stand_ins,
                                                                num_workers):
    _, fake_nv = stand_ins
    _dataset(tmp_path, rng, 23)
    want, _ = _batches(tmp_path, RRC_FLIP, num_workers=num_workers)
    timings, listen = _listener()
    opts = DeviceOptions(decode_device="cuda", dtype="float16", layout="NCHW")
    with reader.Loader(tmp_path, 5, num_workers=num_workers, seed=3, shuffle=True,
                       transform=RRC_FLIP, device="cuda", device_options=opts) as lo:
        lo.runtime.listeners.append(listen)
        got = [{k: np.asarray(v).copy() for k, v in b.items()} for b in lo]
    assert len(got) == len(want) == 5
    for g, w in zip(got, want, strict=True):
        ref = normalize(w["image"], opts).astype(np.float32)
        # one level of 0..255 is 1/(0.225*255) ~ 0.018 after normalization, plus float16
        np.testing.assert_allclose(g["image"].astype(np.float32), ref, atol=0.03)
    assert 0 < len(fake_nv.regions) < 23  # both sides decoded
    assert all(t.gpu_records is not None and 0 < t.gpu_records < t.records for t in timings[:-1])
    assert all(t.gpu_share is not None and 0 < t.gpu_share < 1 for t in timings)
    assert timings[-1].cpu_img_s > 0 and timings[-1].gpu_img_s > 0


def test_dct_scaled_cpu_crops_stay_within_the_stated_bound(tmp_path, rng, stand_ins):
    """Crops the CPU decodes at 1/2..1/8 scale and the GPU at full size, then area-
    averages: not the same pixels. The CPU rounds the box to whole pixels *at its DCT
    scale* (reader/transforms/decode.py), which moves an edge by up to half a scaled
    pixel, less than one output pixel (the scaled box is under twice the output); so
    the two images may be offset by up to one output pixel, and a pixel differs by at
    most the image's local gradient plus a level of filtering. The bound: the mean
    difference per channel within the mean gradient (output pixels) plus one level.
    (Measured here: about half the gradient; it halves when the gradients do.)"""
    _dataset(tmp_path, rng, 10, sizes=((200, 260), (240, 180)))
    small = [RandomResizedCrop(32, scale=(0.3, 1.0)), RandomHorizontalFlip()]
    want, _ = _batches(tmp_path, small)
    got, _ = _batches(tmp_path, small, DeviceOptions(decode_device="cuda", gpu_share=1.0, **RAW))
    cpu = np.concatenate([w["image"] for w in want]).astype(int)
    gpu = np.concatenate([g["image"] for g in got]).astype(int)
    diff = np.abs(gpu - cpu).reshape(-1, 3).mean(axis=0)
    gradient = np.maximum(np.abs(np.diff(cpu, axis=1)).reshape(-1, 3).mean(axis=0),
                          np.abs(np.diff(cpu, axis=2)).reshape(-1, 3).mean(axis=0))
    assert (diff <= gradient + 1).all(), (diff, gradient)
    assert (diff > 0).any()  # not the same pixels: the test compares two real paths


def test_non_jpeg_and_padded_crops_go_to_the_cpu(tmp_path, rng, stand_ins):
    """A PNG record and a CenterCrop reaching outside the image are decoded by the
    workers even in the GPU's share: the batch is the CPU path's."""
    _, fake_nv = stand_ins
    with formats.DatasetWriter(tmp_path, [formats.Field("image", "image")]) as w:
        for i in range(6):
            img = _smooth(rng, 40, 44)
            w.write({"image": cv2.imencode(".png", img)[1].tobytes() if i % 3 == 0
                     else simplejpeg.encode_jpeg(img, quality=95)})
    crop = [CenterCrop(42)]  # taller than the 40 rows: padded, so CPU
    want, _ = _batches(tmp_path, crop)
    got, _ = _batches(tmp_path, crop, DeviceOptions(decode_device="cuda", gpu_share=1.0, **RAW))
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g["image"], w["image"])
    assert fake_nv.regions == []


def test_a_record_the_gpu_cannot_decode_fails_naming_it_or_is_skipped(tmp_path, rng, stand_ins):
    _, fake_nv = stand_ins
    _dataset(tmp_path, rng, 5)
    ds = reader.open_dataset(tmp_path)
    fake_nv.fail.add(bytes(ds.payload(2, "image")))
    opts = DeviceOptions(decode_device="cuda", gpu_share=1.0, **RAW)
    with pytest.raises(reader.DecodeError, match="dataset record 2: nvImageCodec"), \
            reader.Loader(tmp_path, 5, num_workers=0, transform=RRC_FLIP, device="cuda",
                          device_options=opts) as lo:
        next(iter(lo))
    with reader.Loader(tmp_path, 5, num_workers=0, transform=RRC_FLIP, device="cuda",
                       device_options=opts, on_error="skip") as lo:
        b = next(iter(lo))
        valid, image = np.asarray(b["valid"]).copy(), np.asarray(b["image"]).copy()
    assert valid.tolist() == [True, True, False, True, True]
    assert not image[2].any() and image[1].any()


def test_what_nvimgcodec_returns_is_checked_before_it_is_read(tmp_path, rng, stand_ins):
    """A header nvImageCodec will not parse, an image of one channel, and an image
    returned whole instead of its region: the first two fail naming the record (or
    are skipped), the third is read at the region's offset, the same pixels."""
    _, fake_nv = stand_ins
    _dataset(tmp_path, rng, 5)
    ds = reader.open_dataset(tmp_path)
    opts = DeviceOptions(decode_device="cuda", gpu_share=1.0, **RAW)
    want, _ = _batches(tmp_path, RRC_FLIP, num_workers=0)
    for record, where, what in ((1, fake_nv.unreadable, "could not read its JPEG header"),
                                (3, fake_nv.gray, r"gave an image of shape \(\d+, \d+, 1\).*not 8-bit RGB")):
        where.add(bytes(ds.payload(record, "image")))
        with pytest.raises(reader.DecodeError, match=f"dataset record {record}: nvImageCodec "
                                                     f"{what}"):
            _batches(tmp_path, RRC_FLIP, opts, num_workers=0)
        got, _ = _batches(tmp_path, RRC_FLIP, opts, num_workers=0, on_error="skip")
        row = got[0]["label"].tolist().index(record)  # labels are record numbers
        assert got[0]["valid"].tolist() == [i != row for i in range(5)]
        assert not got[0]["image"][row].any() and got[0]["image"][row - 1].any()
        where.clear()
    # A dataset with keys: the error names the record's key too.
    with formats.DatasetWriter(tmp_path / "keyed", [formats.Field("image", "jpeg"),
                                                    formats.Field("key", "str")]) as w:
        for i in range(3):
            w.write({"image": ds.payload(i, "image"), "key": f"cat/{i}.jpg"})
    fake_nv.unreadable.add(bytes(ds.payload(1, "image")))
    with pytest.raises(reader.DecodeError, match=r"dataset record 1 \(key 'cat/1.jpg'\): "
                                                 "nvImageCodec could not read"), \
            reader.Loader(tmp_path / "keyed", 3, num_workers=0, transform=RRC_FLIP,
                          device="cuda", device_options=opts) as lo:
        next(iter(lo))
    fake_nv.unreadable.clear()
    for r in range(5):
        fake_nv.ignore_region.add(bytes(ds.payload(r, "image")))
    got, _ = _batches(tmp_path, RRC_FLIP, opts, num_workers=0)
    assert np.abs(got[0]["image"].astype(int) - want[0]["image"]).max() <= 1


def test_the_gpu_rows_are_not_copied_and_the_stage_is_timed(tmp_path, rng, stand_ins):
    """The leading rows the GPU decodes are written by the kernel, so the image
    field's copy starts after them (all of it, at a share of 1); the GPU stage's
    seconds come from events around the decode and the kernel."""
    fake_cupy, _ = stand_ins
    _dataset(tmp_path, rng, 10)
    timings, listen = _listener()
    for share in (1.0, 0.6):
        fake_cupy.copies.clear()
        opts = DeviceOptions(decode_device="cuda", gpu_share=share, **RAW)
        with reader.Loader(tmp_path, 5, num_workers=0, transform=RRC_FLIP, device="cuda",
                           device_options=opts) as lo:
            lo.runtime.listeners.append(listen)
            image_bytes = lo.layout.field("image").nbytes // 5 * 5
            for _ in lo:
                pass
        copied = sum(n for _, n in fake_cupy.copies)
        # labels only at 1.0; at 0.6 the two CPU rows of each batch of 5 as well
        assert copied < 2 * (image_bytes * (1 - share) + 5 * 8) + 1, (share, copied)
    assert all(t.gpu_records in (3, 5) and t.gpu_decode_s > 0 for t in timings)


def test_an_outlier_goes_to_the_cpu_instead_of_growing_every_slot(tmp_path, rng, stand_ins):
    """A batch's staging area is 1.5 x the sampled mean length a record, not the
    largest: one huge JPEG does not fit it and is decoded by the workers, exactly."""
    from reader.runtime.gpu_decode import row_bytes

    _, fake_nv = stand_ins
    small = [simplejpeg.encode_jpeg(_smooth(rng, 24, 24), quality=90) for _ in range(4)]
    huge = simplejpeg.encode_jpeg(rng.integers(0, 255, (200, 200, 3), np.uint8), quality=100)
    with formats.DatasetWriter(tmp_path, [formats.Field("image", "jpeg"),
                                          formats.Field("label", "int")],
                               records_per_shard=600) as w:
        for i in range(1800):
            w.write({"image": huge if i == 7 else small[i % 4], "label": i})
    ds = reader.open_dataset(tmp_path)
    row = row_bytes(ds, "image")
    assert max(map(len, small)) <= row < len(huge)
    assert row_bytes(ds, "label") >= 1
    crop = [RandomResizedCrop(16, scale=(0.5, 1.0)), RandomHorizontalFlip()]
    with reader.Loader(tmp_path, 10, num_workers=0, transform=crop, seed=1, shuffle=False) as lo:
        want = np.array(next(iter(lo))["image"])
    opts = DeviceOptions(decode_device="cuda", gpu_share=1.0, **RAW)
    with reader.Loader(tmp_path, 10, num_workers=0, transform=crop, seed=1, shuffle=False,
                       device="cuda", device_options=opts) as lo:
        got = _host(next(iter(lo))["image"])
    assert np.abs(got.astype(int) - want).max() <= 1
    assert len(fake_nv.regions) == 9  # record 7 went to the CPU


def test_a_mixture_is_decoded_on_the_gpu(tmp_path, rng, stand_ins):
    """A Mix's sources are staged like one dataset's (their lengths come through
    MixedDataset.spans): same batches as the CPU path."""
    _, fake_nv = stand_ins
    _dataset(tmp_path / "a", rng, 8)
    _dataset(tmp_path / "b", rng, 6, sizes=((48, 60),))
    mix = reader.Mix({"a": tmp_path / "a", "b": tmp_path / "b"})
    opts = DeviceOptions(decode_device="cuda", gpu_share=1.0, **RAW)
    runs = []
    for device_options in (None, opts):
        with reader.Loader(mix, 7, num_workers=0, transform=RRC_FLIP, seed=2,
                           device="cuda" if device_options else "cpu",
                           device_options=device_options) as lo:
            runs.append([{k: _host(v) for k, v in b.items()} for b in lo])
    for g, w in zip(runs[1], runs[0], strict=True):
        assert np.array_equal(g["label"], w["label"])
        assert np.abs(g["image"].astype(int) - w["image"]).max() <= 1
    assert len(fake_nv.regions) == 14


def test_a_batch_with_nothing_for_the_gpu_decodes_none_of_an_earlier_batchs_bytes(
        tmp_path, rng, stand_ins):
    """A slot keeps what an earlier batch staged; a batch the split gives the GPU none
    of (here the last, of one record, at a share of 0.4) must not have those rows
    decoded over its own (silently another record's image, before the fix)."""
    _dataset(tmp_path, rng, 11)
    kw = dict(num_workers=0, shuffle=False)
    want, _ = _batches(tmp_path, RRC_FLIP, **kw)
    got, _ = _batches(tmp_path, RRC_FLIP, DeviceOptions(decode_device="cuda", gpu_share=0.4,
                                                        **RAW), **kw)
    assert [len(g["label"]) for g in got] == [5, 5, 1]
    for g, w in zip(got, want, strict=True):
        assert np.abs(g["image"].astype(int) - w["image"]).max() <= 1


def test_skips_reach_the_device_and_the_counts_with_staging_pinning(tmp_path, rng, stand_ins):
    """pinning='staging' copies the slot into pinned memory: after the decode, so a
    record the GPU skipped arrives invalid and zeroed; skips are counted like the
    workers' (loader.skipped, each batch's timing)."""
    _, fake_nv = stand_ins
    _dataset(tmp_path, rng, 10)
    ds = reader.open_dataset(tmp_path)
    fake_nv.fail.add(bytes(ds.payload(7, "image")))
    timings, listen = _listener()
    opts = DeviceOptions(decode_device="cuda", gpu_share=1.0, pinning="staging", **RAW)
    with reader.Loader(tmp_path, 5, num_workers=0, shuffle=False, transform=RRC_FLIP,
                       device="cuda", device_options=opts, on_error="skip") as lo:
        lo.runtime.listeners.append(listen)
        got = [{k: _host(v) for k, v in b.items()} for b in lo]
        assert lo.skipped == 1
    assert got[1]["valid"].tolist() == [True, True, False, True, True]
    assert not got[1]["image"][2].any() and got[1]["image"][1].any()
    assert [t.skipped for t in timings] == [0, 1]


def test_a_decoder_that_decodes_nothing_is_its_failure_not_the_records(tmp_path, rng,
                                                                       stand_ins):
    """nvImageCodec returns None for every image when it fails as a whole (out of
    memory, nvJPEG missing): said as the decoder's failure, skip or not, never every
    record zeroed in silence."""
    _, fake_nv = stand_ins
    _dataset(tmp_path, rng, 6)
    ds = reader.open_dataset(tmp_path)
    fake_nv.fail.update(bytes(ds.payload(r, "image")) for r in range(6))
    opts = DeviceOptions(decode_device="cuda", gpu_share=1.0, **RAW)
    for on_error in ("fail", "skip"):
        with pytest.raises(reader.DecodeError, match=r"decoded none of the batch's 6 staged "
                                                     r"JPEGs .*the GPU decoder failed"), \
                reader.Loader(tmp_path, 6, num_workers=0, transform=RRC_FLIP, device="cuda",
                              device_options=opts, on_error=on_error) as lo:
            next(iter(lo))


def test_the_gpu_seconds_count_once_their_events_are_done(stand_ins):
    """The stage never waits for an event: a batch's GPU time is counted at the first
    delivery that finds its kernel done (then once), as the longer of the host's time
    and the device's (decode + resample events)."""
    from reader.runtime.gpu_decode import Decoded, GpuDecodeStage

    cp, nv = stand_ins
    stage = GpuDecodeStage(cp, nv, 0, cp.cuda.Stream(), tolerant=False)
    d = Decoded()
    d.rows, d.host_s = [0, 1, 2], 0.001
    d.start, before = cp.cuda.Event().record(), cp.cuda.Event().record()
    time.sleep(0.01)
    d.done, after = cp.cuda.Event().record(), cp.cuda.Event().record()
    after.done = False  # the kernel still running
    stage._alive.append((d, before, after))
    stage.resample(None, None)
    assert stage.last == (0, 0, 0.0) and len(stage._alive) == 1
    after.done = True
    stage.resample(None, None)
    n, images, seconds = stage.last
    assert (n, images) == (0, 3) and 0.02 <= seconds < 1  # two 10 ms spans > 1 ms of host
    stage.resample(None, None)
    assert stage.last == (0, 0, 0.0)  # counted once


def test_the_slot_goes_back_only_after_the_decode_and_the_kernel(tmp_path, rng, stand_ins):
    """The order on the two streams that keeps a slot from being refilled while the
    decoder or the kernel reads it: per batch, the decode's ``done`` is recorded on the
    decode stream, the sink's stream waits for it before the resample kernel, and the
    event that hands the slot back is recorded on the sink's stream after the kernel."""
    fake_cupy, _ = stand_ins
    _dataset(tmp_path, rng, 10)
    opts = DeviceOptions(decode_device="cuda", gpu_share=1.0, **RAW)
    with reader.Loader(tmp_path, 5, num_workers=0, transform=RRC_FLIP, device="cuda",
                       device_options=opts) as lo:
        for _ in lo:
            pass
        sink_stream, decode_stream = id(lo.runtime.cuda.stream), id(lo.runtime.cuda.gpu.decode_stream)
    ops = fake_cupy.ops
    kernels = [i for i, op in enumerate(ops) if op == ("launch", "shardpack_resample", None)]
    assert len(kernels) == 2
    start = 0
    for k in kernels:
        done = [op[2] for op in ops[start:k] if op[:2] == ("record", decode_stream)]
        assert done, "the decode recorded its event on its own stream"
        assert ("wait", sink_stream, done[-1]) in ops[start:k]  # before the kernel
        assert any(op[:2] == ("record", sink_stream) for op in ops[k + 1:])  # the slot's gate
        start = k + 1


def test_closing_with_a_decode_in_flight_waits_for_it_but_not_for_ever(tmp_path, rng,
                                                                       stand_ins, monkeypatch):
    """A look-ahead decode nobody will collect is waited for before its slot goes back;
    one that does not return within SETTLE_S leaves its ring mapped (said in a warning)
    instead of hanging close() or freeing memory it may still read."""
    import reader.runtime.gpu_decode as gpu_decode
    import reader.runtime.runtime as runtime

    _, fake_nv = stand_ins
    _dataset(tmp_path, rng, 20)
    ds = reader.open_dataset(tmp_path)
    fake_nv.slow.add(bytes(ds.payload(12, "image")))  # batch 2's decode takes 2 s
    opts = DeviceOptions(decode_device="cuda", gpu_share=1.0, **RAW)
    kw = dict(num_workers=2, transform=RRC_FLIP, device="cuda", device_options=opts,
              shuffle=False)
    lo = reader.Loader(tmp_path, 5, **kw)
    t0 = time.perf_counter()
    _train(lo, step_s=0.2, stop_at=1)  # the epoch ends (and waits) as the loop is left
    lo.close()
    assert len(fake_nv.threads) == 3  # batch 2's decode had started ahead
    assert time.perf_counter() - t0 > 1.9  # and was waited for (2 s)
    monkeypatch.setattr(gpu_decode, "SETTLE_S", 0.2)
    left = len(runtime._LEFT_MAPPED)
    lo = reader.Loader(tmp_path, 5, **kw)
    t0 = time.perf_counter()
    _train(lo, step_s=0.2, stop_at=1)
    lo.close()
    assert time.perf_counter() - t0 < 1.5
    assert len(runtime._LEFT_MAPPED) == left + 1
    time.sleep(2.0)  # the stuck decode ends, into memory still mapped; then its thread
    assert not [t for t in threading.enumerate() if t.name.startswith("shardpack-gpu-decode")]
    fake_nv.slow.clear()
    with reader.Loader(tmp_path, 5, **kw) as lo:  # a new loader decodes again
        assert len(_train(lo, step_s=0.0)) == 4


def _train(loader, step_s=0.05, stop_at=None):
    """Iterate like a training loop: each batch copied to the host, then a step of
    ``step_s`` (the workers finish the next batch meanwhile)."""
    out = []
    for k, b in enumerate(loader):
        out.append({name: _host(v) for name, v in b.items()})
        if k == stop_at:
            break
        time.sleep(step_s)
    return out


def test_the_next_batch_is_decoded_during_the_training_step(tmp_path, rng, stand_ins):
    """With workers ahead, the GPU decode of batch k+1 starts as batch k is handed over,
    in the stage's own thread, not inside the next next(): the batches are the CPU
    path's all the same, and the thread ends with the loader."""
    _, fake_nv = stand_ins
    _dataset(tmp_path, rng, 30)
    want, _ = _batches(tmp_path, RRC_FLIP, num_workers=2)
    opts = DeviceOptions(decode_device="cuda", gpu_share=1.0, **RAW)
    with reader.Loader(tmp_path, 5, num_workers=2, seed=3, shuffle=True, transform=RRC_FLIP,
                       device="cuda", device_options=opts) as lo:
        got = _train(lo)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g["label"], w["label"])
        assert np.abs(g["image"].astype(int) - w["image"]).max() <= 1
    assert len(fake_nv.threads) == 6
    ahead = [t for t in fake_nv.threads if t.startswith("shardpack-gpu-decode")]
    assert len(ahead) >= 4, fake_nv.threads  # all but the first (and a late worker's)
    assert not [t for t in threading.enumerate() if t.name.startswith("shardpack-gpu-decode")]


def test_a_failure_decoded_ahead_is_raised_with_its_own_batch(tmp_path, rng, stand_ins):
    """A record that fails in the look-ahead fails the batch it belongs to, when that
    batch is asked for (the batches before it arrive whole); with on_error='skip' it
    is zeroed and invalid in its own batch. Stopping with a decode ahead in flight
    leaves nothing running."""
    _, fake_nv = stand_ins
    _dataset(tmp_path, rng, 20)
    ds = reader.open_dataset(tmp_path)
    opts = DeviceOptions(decode_device="cuda", gpu_share=1.0, **RAW)
    kw = dict(num_workers=2, transform=RRC_FLIP, device="cuda", device_options=opts,
              shuffle=False)
    fake_nv.fail.add(bytes(ds.payload(12, "image")))  # batch 2 of 4
    delivered = []
    with pytest.raises(reader.DecodeError, match="dataset record 12: nvImageCodec"), \
            reader.Loader(tmp_path, 5, **kw) as lo:
        for b in lo:
            delivered.append(_host(b["label"]).tolist())
            time.sleep(0.05)
    assert delivered == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    with reader.Loader(tmp_path, 5, on_error="skip", **kw) as lo:
        got = _train(lo)
    assert [g["valid"].tolist() for g in got] == [[True] * 5, [True] * 5,
                                                  [True, True, False, True, True], [True] * 5]
    assert not got[2]["image"][2].any()
    fake_nv.fail.clear()
    fake_nv.slow.add(bytes(ds.payload(12, "image")))  # a decoder that does not return
    with pytest.raises(reader.LoaderTimeoutError, match="GPU decode of a batch took over the "
                                                        r"timeout of 0\.3 s"), \
            reader.Loader(tmp_path, 5, timeout=0.3, **kw) as lo:
        _train(lo, step_s=0.3)
    fake_nv.slow.clear()
    with reader.Loader(tmp_path, 5, **kw) as lo:
        _train(lo, stop_at=1)  # batch 2's decode started ahead, never asked for
    assert not [t for t in threading.enumerate() if t.name.startswith("shardpack-gpu-decode")]


# -- the refusals -----------------------------------------------------------------------------

def test_what_the_gpu_cannot_do_is_refused_with_why(tmp_path, rng, stand_ins):
    _dataset(tmp_path, rng, 4)
    cuda = DeviceOptions(decode_device="cuda")
    with pytest.raises(ValueError, match="Normalize run on CPU pixels"):
        reader.Loader(tmp_path, 2, transform=[RandomResizedCrop(32), Normalize()],
                      device="cuda", device_options=DeviceOptions(decode_device="cuda", **RAW))
    with pytest.raises(ValueError, match="on_error='replace'"):
        reader.Loader(tmp_path, 2, transform=RRC_FLIP, device="cuda", device_options=cuda,
                      on_error="replace")
    with pytest.raises(ValueError, match=r"device_options apply to device='cuda' only.*"
                                         r"decode_device='cuda'"):
        reader.Loader(tmp_path, 2, transform=RRC_FLIP, device_options=cuda)
    with pytest.raises(ValueError, match=r"gpu_share=0\.5 would have no effect"):
        DeviceOptions(decode_device="cpu", gpu_share=0.5)
    for bad in (1.5, -0.1, float("nan"), True):
        with pytest.raises(ValueError):
            DeviceOptions(gpu_share=bad)
    with pytest.raises(ValueError, match="decode_device must be one of"):
        DeviceOptions(decode_device="gpu")
    with pytest.raises(ValueError, match=r"backend='pillow'.*OpenCV's"):
        reader.Loader(tmp_path, 2, transform=reader.transforms.ImagePipeline(
            RRC_FLIP, backend="pillow"), device="cuda", device_options=cuda)


def test_detection_stays_on_the_cpu_and_says_so(tmp_path, rng, stand_ins):
    from reader.transforms import ResizeShortestEdge

    fields = [formats.Field("image", "jpeg"),
              formats.Field("boxes", "ndarray", dtype="float32", shape=(None, 4))]
    with formats.DatasetWriter(tmp_path, fields) as w:
        for _ in range(3):
            w.write({"image": simplejpeg.encode_jpeg(_smooth(rng, 40, 48)),
                     "boxes": np.array([[1, 2, 20, 30]], np.float32)})
    with pytest.raises(ValueError, match="sample path stays on the CPU: boxes"):
        reader.Loader(tmp_path, 2, transform=[ResizeShortestEdge(32)], device="cuda",
                      device_options=DeviceOptions(decode_device="cuda", **RAW))
    # "auto" decodes such a loader on the CPU, as before
    with reader.Loader(tmp_path, 2, transform=[ResizeShortestEdge(32)], device="cuda",
                       device_options=DeviceOptions(**RAW)) as lo:
        assert not lo.gpu_decode


def test_without_nvimgcodec_cuda_says_how_to_install_and_auto_stays_on_the_cpu(
        tmp_path, rng, stand_ins, monkeypatch):
    _dataset(tmp_path, rng, 4)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    monkeypatch.setitem(sys.modules, "nvidia", types.ModuleType("nvidia"))
    with pytest.raises(ImportError, match=r"pip install 'shardpack\[gpu-decode\]'"):
        reader.Loader(tmp_path, 2, transform=RRC_FLIP, device="cuda",
                      device_options=DeviceOptions(decode_device="cuda"))
    with reader.Loader(tmp_path, 2, transform=RRC_FLIP, device="cuda") as lo:
        assert not lo.gpu_decode
        assert {f.name for f in lo.layout.fields} == {"image", "label"}


def test_a_cpu_loader_is_untouched(tmp_path, rng):
    _dataset(tmp_path, rng, 4)
    with reader.Loader(tmp_path, 2, transform=RRC_FLIP, num_workers=0) as lo:
        assert not lo.gpu_decode and lo.runtime.split is None
        assert {f.name for f in lo.layout.fields} == {"image", "label"}


# -- on a GPU ---------------------------------------------------------------------------------

@pytest.mark.gpu
def test_the_cuda_kernel_matches_its_definition(rng):
    from reader.runtime.device import require_cupy
    from reader.transforms.resample import RESAMPLE_CUDA

    try:
        cp = require_cupy()
    except ImportError as exc:
        pytest.skip(str(exc))
    kernel = cp.RawKernel(RESAMPLE_CUDA, "shardpack_resample")
    crops = [_smooth(rng, 97, 131), _smooth(rng, 30, 20), _smooth(rng, 64, 64)]
    dev = [cp.asarray(c) for c in crops]
    out = cp.zeros((3, 32, 32, 3), cp.uint8)
    args = (cp.asarray(np.array([d.data.ptr for d in dev], np.uint64)),
            cp.asarray(np.array([c.shape[0] for c in crops], np.int32)),
            cp.asarray(np.array([c.shape[1] for c in crops], np.int32)),
            cp.asarray(np.array([c.shape[1] * 3 for c in crops], np.int64)),
            cp.asarray(np.array([2, 0, 1], np.int32)), cp.asarray(np.array([1, 0, 1], np.uint8)),
            out, np.int32(32), np.int32(32), np.int32(3))
    kernel((1, 32, 3), (128,), args)
    got = cp.asnumpy(out)
    for row, crop, flip in ((2, crops[0], True), (0, crops[1], False), (1, crops[2], True)):
        diff = np.abs(got[row].astype(int) - resample_reference(crop, (32, 32), flip))
        assert diff.max() <= 1  # float32 against float64


@pytest.mark.gpu
def test_nvimgcodec_batches_against_the_cpu_path(tmp_path, rng):
    """The real decoder: same crops, pixels close (decoders differ in IDCT and chroma
    upsampling: mean within 2 levels per channel; the max is reported by bench_gpu)."""
    from reader.runtime.device import require_cupy

    try:
        require_cupy()
        from nvidia import nvimgcodec  # noqa: F401
    except ImportError as exc:
        pytest.skip(str(exc))
    _dataset(tmp_path, rng, 13)
    want, _ = _batches(tmp_path, RRC_FLIP)
    got, _ = _batches(tmp_path, RRC_FLIP, DeviceOptions(decode_device="cuda", gpu_share=1.0, **RAW))
    diff = np.concatenate([np.abs(g["image"].astype(int) - w["image"]).reshape(-1, 3)
                           for g, w in zip(got, want, strict=True)])
    assert (diff.mean(axis=0) < 2.0).all(), diff.mean(axis=0)
