"""The GPU path's checks: the numpy reference of the fused normalize kernel, which GPU a rank uses, and the
loader layouts the GPU can convert. The sink that copies slots to the GPU is
:class:`reader.runtime.sinks.CudaSink`. Nothing here imports cupy until a CUDA loader
is constructed.
"""

from __future__ import annotations

import importlib.util
import os
import time

import numpy as np

from formats.errors import ArgumentError

from ..options import DeviceOptions

__all__ = ["check_layout", "measure_pinned_bandwidth", "normalize",
           "pick_device", "require_cupy"]

INSTALL_HINT = "device='cuda' needs cupy and a CUDA GPU: pip install 'shardpack[gpu]'"


def normalize(images, options: DeviceOptions, xp=np):
    """uint8 ``[B, H, W, C]`` images -> the dtype/layout/normalization of ``options``.

    Written against an array module ``xp`` (numpy or cupy): the reference for the
    fused GPU kernel, and the CPU tests' definition of what the GPU must produce.
    """
    if options.dtype == "uint8":
        out = images
    else:
        dt = xp.float16 if options.dtype == "float16" else xp.float32
        mean = xp.asarray(options.mean, dtype=xp.float32)
        inv_std = xp.asarray([1.0 / s for s in options.std], dtype=xp.float32)
        out = ((images.astype(xp.float32) - mean) * inv_std).astype(dt)
    if options.layout == "NCHW":
        out = xp.ascontiguousarray(out.transpose(0, 3, 1, 2))
    return out


def require_cupy(decode_on_gpu: bool = False):
    """Import cupy and check for a GPU, or raise ImportError with the install hint.

    Args:
        decode_on_gpu: the loader asked for ``decode_device='cuda'``: where nvImageCodec
            is missing too, the hint names both extras, so one install does (cupy is
            checked first, and the decoder's own hint would only come after it).
    """
    hint = INSTALL_HINT
    if decode_on_gpu and not _has_nvimgcodec():
        hint = ("device='cuda' needs cupy and a CUDA GPU, and decode_device='cuda' "
                "nvImageCodec: pip install 'shardpack[gpu,gpu-decode]'")
    try:
        import cupy
    except ImportError as exc:
        raise ImportError(hint) from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError when no driver is loaded
        raise ImportError(f"{hint} (cupy found no usable CUDA driver: {exc})") from exc
    if count < 1:
        raise ImportError(f"{hint} (no CUDA device visible)")
    return cupy


def _has_nvimgcodec() -> bool:
    """Whether nvImageCodec is installed (found, not imported: that is the decoder's)."""
    try:
        return importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except (ImportError, ValueError):  # no ``nvidia`` package at all
        return False


def pick_device(options: DeviceOptions, rank: int, count: int) -> int:
    if options.device_id is not None:
        return options.device_id
    local = os.environ.get("LOCAL_RANK")
    return int(local) if local is not None else rank % count


def check_layout(plan, options: DeviceOptions) -> None:
    """Refuse device options the images of ``plan`` (a
    :class:`reader.runtime.plan.BatchPlan`) cannot get: the GPU converts and
    normalizes padded (or fixed-size) uint8 image batches only.

    Raises:
        ValueError: the image field is ragged, or normalized on the CPU already,
            and ``options`` asks for a conversion.
    """
    image = next((v for v in plan.var_fields if v.name == plan.image), None)
    converts = options.dtype != "uint8" or options.layout != "NHWC"
    if image is not None and image.mode == "ragged" and converts:
        raise ArgumentError("device='cuda' converts whole image batches; a ragged image field "
                         "arrives as it is, image by image (uint8 HWC): collate the image "
                         "padded, or pass DeviceOptions(dtype='uint8', layout='NHWC')")
    core = getattr(plan.pipeline, "pipeline", None)
    if core is not None and core.normalize is not None and converts:
        raise ArgumentError("the transforms end with Normalize (float32 on the CPU) and "
                         "device_options convert on the GPU as well: keep one of the two "
                         "(DeviceOptions(dtype='uint8', layout='NHWC') passes images as they are)")


def measure_pinned_bandwidth(nbytes: int, repeats: int = 20) -> float:
    """Raw pinned host -> device copy bandwidth in GB/s (the limit for the loader's copy)."""
    cp = require_cupy()
    host = np.frombuffer(cp.cuda.alloc_pinned_memory(nbytes), np.uint8, nbytes)
    host[:] = 1
    dev = cp.empty(nbytes, cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    dev.data.copy_from_host_async(host.ctypes.data, nbytes, stream)
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        dev.data.copy_from_host_async(host.ctypes.data, nbytes, stream)
    stream.synchronize()
    return nbytes * repeats / (time.perf_counter() - t0) / 1e9
