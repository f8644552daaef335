"""The GPU path's logic on CPU (slot gating, normalization math), and on a GPU when present."""

from __future__ import annotations

import re
import sys
import types

import numpy as np
import pytest

from formats.errors import ArgumentError
from reader import Loader
from reader.options import DeviceOptions
from reader.runtime.device import normalize, require_cupy
from reader.runtime.sinks import SlotGate


class FakeEvent:
    def __init__(self):
        self.done = False
        self.synced = False

    def synchronize(self):
        self.synced = True
        self.done = True


def test_slot_comes_back_only_after_its_event():
    gate = SlotGate(limit=2)
    e0, e1 = FakeEvent(), FakeEvent()
    gate.add(0, e0)
    gate.add(1, e1)
    assert gate.reclaim() == []  # nothing finished, within the limit: nothing is waited for
    assert not e0.synced
    e0.done = True
    assert gate.reclaim() == [0]
    assert len(gate) == 1


def test_slots_come_back_in_order_even_if_a_later_one_finishes_first():
    gate = SlotGate(limit=3)
    events = [FakeEvent() for _ in range(3)]
    for i, e in enumerate(events):
        gate.add(i, e)
    events[2].done = True
    assert gate.reclaim() == []  # slot 0's copy may still be reading the ring
    events[0].done = True
    assert gate.reclaim() == [0]


def test_gate_waits_for_the_oldest_when_over_its_limit():
    gate = SlotGate(limit=1)
    e0, e1 = FakeEvent(), FakeEvent()
    gate.add(0, e0)
    gate.add(1, e1)
    assert gate.reclaim() == [0]
    assert e0.synced and not e1.synced
    assert gate.drain() == [1] and e1.synced


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_normalize_matches_the_definition(rng, dtype, layout):
    images = rng.integers(0, 256, (3, 5, 7, 3), dtype=np.uint8)
    opts = DeviceOptions(dtype=dtype, layout=layout, mean=(10.0, 20.0, 30.0), std=(2.0, 4.0, 8.0))
    out = normalize(images, opts)
    assert out.dtype == np.dtype(dtype)
    assert out.flags.c_contiguous
    b, h, w, c = images.shape
    assert out.shape == ((b, c, h, w) if layout == "NCHW" else (b, h, w, c))
    for k in range(c):
        want = (images[..., k].astype(np.float64) - opts.mean[k]) / opts.std[k]
        got = out[:, k] if layout == "NCHW" else out[..., k]
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3)


def test_uint8_passthrough_only_changes_layout(rng):
    images = rng.integers(0, 256, (2, 4, 6, 3), dtype=np.uint8)
    out = normalize(images, DeviceOptions(dtype="uint8", layout="NCHW"))
    assert out.dtype == np.uint8 and np.array_equal(out, images.transpose(0, 3, 1, 2))


@pytest.mark.parametrize("bad", [{"dtype": "int8"}, {"layout": "CHW"}, {"output": "jax"},
                                 {"pinning": "magic"}, {"std": (1.0, 0.0, 1.0)},
                                 {"mean": (1.0, 2.0)}])
def test_device_options_are_checked(bad):
    with pytest.raises(ValueError):
        DeviceOptions(**bad)


def test_without_cupy_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(ImportError, match=r"pip install 'shardpack\[gpu\]'"):
        require_cupy()


def test_without_cupy_a_gpu_decode_loader_names_both_extras_at_once(monkeypatch, tmp_path):
    # cupy is checked first; the decoder's hint came only after a second install.
    from tests import fake_nvimgcodec
    from tests.helpers_reader import make_dataset

    path = make_dataset(tmp_path / "ds", 4)
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setitem(sys.modules, "nvidia", types.ModuleType("nvidia"))
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)
    both = r"decode_device='cuda' nvImageCodec: pip install 'shardpack\[gpu,gpu-decode\]'"
    with pytest.raises(ImportError, match=both):
        Loader(path, 2, device="cuda", device_options=DeviceOptions(decode_device="cuda"))
    for options in (None, DeviceOptions(decode_device="auto")):  # not asked for: cupy alone
        with pytest.raises(ImportError, match=r"pip install 'shardpack\[gpu\]'$"):
            Loader(path, 2, device="cuda", device_options=options)
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", fake_nvimgcodec)  # installed
    with pytest.raises(ImportError, match=r"pip install 'shardpack\[gpu\]'$"):
        Loader(path, 2, device="cuda", device_options=DeviceOptions(decode_device="cuda"))


@pytest.mark.parametrize(("device", "words"), [
    ("cuda:0", "device='cuda', device_options=DeviceOptions(device_id=0)"),
    ("cuda:3", "DeviceOptions(device_id=3)"),
    ("cuda:x", "DeviceOptions(device_id=N)"),
])
def test_a_pytorch_style_device_number_points_to_device_id(tmp_path, device, words):
    from tests.helpers_reader import make_dataset

    path = make_dataset(tmp_path / "ds", 4)
    with pytest.raises(ArgumentError, match=re.escape(words)):
        Loader(path, 2, device=device)
    with pytest.raises(ArgumentError) as info:
        Loader(path, 2, device="tpu")
    assert "device_id" not in str(info.value)


def _gpu_or_skip():
    try:
        return require_cupy()
    except ImportError as exc:
        pytest.skip(f"needs a CUDA GPU and cupy: {exc}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_gpu_kernel_matches_numpy_reference(rng, layout, dtype):
    cp = _gpu_or_skip()
    from reader.runtime.sinks import _CudaState

    opts = DeviceOptions(dtype=dtype, layout=layout)
    state = _CudaState(cp, opts, rank=0)
    images = rng.integers(0, 256, (4, 9, 11, 3), dtype=np.uint8)
    from reader.runtime.sinks import CudaSink

    sink = CudaSink.__new__(CudaSink)
    sink.state = state
    got = cp.asnumpy(sink._images(cp.asarray(images)))
    assert got.dtype == np.dtype(dtype)
    tol = 1e-2 if dtype == "float16" else 1e-4  # float16 keeps 11 bits: |x| <= 2.7 here
    np.testing.assert_allclose(got.astype(np.float32), normalize(images, opts), rtol=1e-3, atol=tol)


def test_cuda_loader_fails_at_construction_without_cupy(tmp_path, monkeypatch):
    import formats
    import reader

    with formats.DatasetWriter(tmp_path, [formats.Field("label", "int")]) as w:
        for i in range(4):
            w.write({"label": i})
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(ImportError, match=r"pip install 'shardpack\[gpu\]'"):
        reader.Loader(tmp_path, batch_size=2, device="cuda", num_workers=0)


@pytest.fixture(params=["stand-in", pytest.param("cuda", marks=pytest.mark.gpu)])
def device_cupy(request, monkeypatch):
    """The cupy the device='cuda' tests run on: numpy standing in for it (tests/fake_cupy.py,
    which also records each copy and registration), and the real one on a GPU.
    ``-m gpu`` selects the real one alone (scripts/gpu_check.sh does)."""
    if request.param == "cuda":
        return _gpu_or_skip()
    from tests import fake_cupy

    fake_cupy.registered.clear()
    fake_cupy.copies.clear()
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    return fake_cupy


def _jpeg_dataset(path, rng, n):
    import simplejpeg

    import formats

    with formats.DatasetWriter(path, [formats.Field("image", "jpeg"),
                                      formats.Field("label", "int")]) as w:
        for i in range(n):
            img = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
            w.write({"image": simplejpeg.encode_jpeg(img), "label": i})


@pytest.mark.parametrize(("pinning", "dtype", "layout"), [
    ("register", "float32", "NCHW"), ("staging", "float32", "NCHW"),
    ("register", "float16", "NHWC"), ("staging", "float16", "NCHW"),
    ("register", "uint8", "NCHW")])
def test_cuda_path_end_to_end(tmp_path, rng, device_cupy, pinning, dtype, layout):
    """The whole device='cuda' flow (CUDA sink) gives what the CPU sink gives, normalized."""
    import reader
    from reader.transforms import CenterCrop

    _jpeg_dataset(tmp_path, rng, 10)  # 10 records, batch 4: the last batch is partial
    opts = DeviceOptions(dtype=dtype, layout=layout, pinning=pinning)
    cpu = reader.Loader(tmp_path, 4, num_workers=1, transform=[CenterCrop(32)], copy=True)
    want = [(normalize(b["image"], opts), b["label"]) for b in cpu]
    cpu.close()
    gpu = reader.Loader(tmp_path, 4, num_workers=1, transform=[CenterCrop(32)],
                        device="cuda", device_options=opts)
    with gpu:
        got = [(device_cupy.asnumpy(b["image"]).copy(), device_cupy.asnumpy(b["label"]).copy())
               for b in gpu]
        lo, hi = gpu.ring.address, gpu.ring.address + gpu.ring.nbytes
        mode = gpu.runtime.cuda.mode
    assert mode == pinning
    assert gpu.runtime.cuda.registered is None  # the ring is unregistered when the loader closes
    assert len(got) == len(want) == 3
    for (gi, gl), (wi, wl) in zip(got, want, strict=True):
        assert gi.shape == wi.shape and gi.dtype == np.dtype(dtype)
        # float16: the GPU's rounding of (x - mean) * inv_std may differ by one unit in the last place.
        atol = 1e-2 if dtype == "float16" else 1e-5
        np.testing.assert_allclose(gi.astype(np.float32), wi.astype(np.float32), rtol=1e-3, atol=atol)
        assert np.array_equal(gl, wl)
    if device_cupy.__name__ == "tests.fake_cupy":
        in_ring = [lo <= address and address + n <= hi for address, n in device_cupy.copies]
        # Registered: every copy reads straight out of the ring; staging: never.
        assert all(in_ring) if pinning == "register" else not any(in_ring)
        assert not device_cupy.registered
        assert device_cupy.copies[-2][1] == 2 * 32 * 32 * 3  # the partial batch: 2 images only


def test_cuda_path_carries_padded_and_ragged_fields(tmp_path, rng, device_cupy):
    """Padded images with their sizes and ragged boxes reach the (fake) device, each
    copied straight out of its slot region, with the same values as on the CPU path."""
    import simplejpeg

    import formats
    import reader
    from reader.transforms import PadToMultiple, ResizeShortestEdge

    fields = [formats.Field("image", "jpeg"),
              formats.Field("boxes", "ndarray", dtype="float32", shape=(None, 4))]
    with formats.DatasetWriter(tmp_path, fields) as w:
        for i in range(7):
            h, w_ = int(rng.integers(30, 60)), int(rng.integers(30, 60))
            img = rng.integers(0, 256, (h, w_, 3), dtype=np.uint8)
            boxes = np.array([[1, 2, 10 + j, 12 + j] for j in range(i % 3)], np.float32)
            w.write({"image": simplejpeg.encode_jpeg(img), "boxes": boxes.reshape(-1, 4)})
    specs = [ResizeShortestEdge((32, 40), max_size=64), PadToMultiple(16)]
    opts = DeviceOptions(dtype="uint8", layout="NHWC")
    with reader.Loader(tmp_path, 3, num_workers=1, transform=specs, seed=4, copy=True) as cpu:
        want = list(cpu)
    with reader.Loader(tmp_path, 3, num_workers=1, transform=specs, seed=4, device="cuda",
                       device_options=opts) as gpu:
        got = [{k: (device_cupy.asnumpy(v.values).copy(), v.offsets.copy())
                if isinstance(v, reader.Ragged) else device_cupy.asnumpy(v).copy()
                for k, v in b.items()} for b in gpu]
        lo, hi = gpu.ring.address, gpu.ring.address + gpu.ring.nbytes
    assert len(got) == len(want) == 3
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g["image"], w["image"])
        assert np.array_equal(g["image_size"], w["image_size"])
        values, offsets = g["boxes"]
        assert np.array_equal(values, w["boxes"].values)
        assert np.array_equal(offsets, w["boxes"].offsets)
    if device_cupy.__name__ == "tests.fake_cupy":
        assert all(lo <= a and a + n <= hi for a, n in device_cupy.copies)


def test_cuda_refuses_conversions_it_cannot_make(tmp_path, rng, device_cupy):
    import simplejpeg

    import formats
    import reader
    from reader.transforms import Normalize, ResizeShortestEdge

    with formats.DatasetWriter(tmp_path, [formats.Field("image", "jpeg")]) as w:
        for _ in range(3):
            w.write({"image": simplejpeg.encode_jpeg(rng.integers(0, 256, (30, 40, 3),
                                                                  dtype=np.uint8))})
    with pytest.raises(ValueError, match="ragged image field"):
        reader.Loader(tmp_path, 2, transform=[ResizeShortestEdge(32)], device="cuda",
                      collate={"image": "ragged"})
    with pytest.raises(ValueError, match="Normalize"):
        reader.Loader(tmp_path, 2, transform=[ResizeShortestEdge(32), Normalize()], device="cuda")
    ok = DeviceOptions(dtype="uint8", layout="NHWC")
    reader.Loader(tmp_path, 2, transform=[ResizeShortestEdge(32)], device="cuda",
                  collate={"image": "ragged"}, device_options=ok).close()


@pytest.mark.gpu
def test_cuda_path_hands_torch_tensors_through_dlpack(tmp_path, rng):
    _gpu_or_skip()
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} is a build without CUDA")
    import reader
    from reader.transforms import CenterCrop

    _jpeg_dataset(tmp_path, rng, 10)
    opts = DeviceOptions(dtype="float16", layout="NCHW", output="torch")
    with reader.Loader(tmp_path, 4, num_workers=1, transform=[CenterCrop(32)], copy=True) as cpu:
        want = [(normalize(b["image"], opts), b["label"]) for b in cpu]
    with reader.Loader(tmp_path, 4, num_workers=1, transform=[CenterCrop(32)], device="cuda",
                       device_options=opts) as gpu:
        got = []
        for b in gpu:
            image, label = b["image"], b["label"]
            assert isinstance(image, torch.Tensor) and image.device.type == "cuda"
            assert image.dtype == torch.float16 and isinstance(label, torch.Tensor)
            # Work queued on torch's stream after delivery sees the finished batch.
            got.append((image.float().cpu().numpy(), label.cpu().numpy()))
    assert len(got) == len(want) == 3
    for (gi, gl), (wi, wl) in zip(got, want, strict=True):
        np.testing.assert_allclose(gi, wi.astype(np.float32), rtol=1e-3, atol=1e-2)
        assert np.array_equal(gl, wl)
