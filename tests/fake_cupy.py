"""A stand-in for the small part of cupy that reader/runtime/sinks.py uses, backed by numpy.

"Device" arrays live in host memory; an async host-to-device copy is a memmove
from the given address, done at once; events are complete as soon as recorded.
It lets CI drive the whole ``device="cuda"`` path (slot addresses, partial
batches, event-gated slot release, the kernel's arguments) without a GPU.
"""

from __future__ import annotations

import ctypes
import time
import types

import numpy as np

float16, float32, uint8 = np.float16, np.float32, np.uint8
registered: list[tuple[int, int]] = []
copies: list[tuple[int, int]] = []


class ndarray(np.ndarray):
    @property
    def data(self):
        arr = self

        class _Ptr:
            def copy_from_host_async(self, address, nbytes, stream):
                assert nbytes <= arr.nbytes
                copies.append((address, nbytes))
                ctypes.memmove(arr.ctypes.data, address, nbytes)

        return _Ptr()


def empty(shape, dtype):
    return np.empty(shape, dtype).view(ndarray)


def asarray(a, dtype=None):
    return np.asarray(a, dtype).view(ndarray)


def ascontiguousarray(a):
    return np.ascontiguousarray(a).view(ndarray)


def asnumpy(a):
    return np.asarray(a)


# Every record, wait and kernel launch, in order: ("record", stream, event),
# ("wait", stream, event), ("launch", name, None); streams and events by id().
ops: list[tuple] = []


class _Event:
    done = False
    at = 0.0

    def record(self, stream=None):
        self.done = True  # the work before it ran when it was called
        self.at = time.perf_counter()
        ops.append(("record", id(stream), id(self)))
        return self

    def synchronize(self):
        self.done = True


class _Stream:
    def __init__(self, non_blocking=False, ptr=0):
        self.waited = 0

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def synchronize(self):
        pass

    def wait_event(self, event):
        assert event.done is not None
        self.waited += 1
        ops.append(("wait", id(self), id(event)))

    def record(self):
        return _Event().record()


class _Device:
    def __init__(self, i):
        self.id = i

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class CUDARuntimeError(RuntimeError):
    pass


def _host_register(address, nbytes, flags):
    registered.append((address, nbytes))


def _host_unregister(address):
    registered[:] = [r for r in registered if r[0] != address]


def _elementwise_kernel(in_params, out_params, body, name):
    def run(x, mean, inv_std, h, w, c, nchw, y):
        v = (np.asarray(x, np.float32) - np.asarray(mean)) * np.asarray(inv_std)
        if nchw:
            v = v.transpose(0, 3, 1, 2)
        y[...] = v.astype(y.dtype)
        return y

    return run


_current = _Stream()
runtime = types.SimpleNamespace(
    getDeviceCount=lambda: 1, hostRegister=_host_register, hostUnregister=_host_unregister,
    CUDARuntimeError=CUDARuntimeError, getDeviceProperties=lambda i: {"name": b"fake"},
    driverGetVersion=lambda: 0, runtimeGetVersion=lambda: 0,
    deviceSynchronize=lambda: None)  # every copy and kernel here is done when called
cuda = types.SimpleNamespace(
    runtime=runtime, Device=_Device, Stream=_Stream, Event=_Event, ExternalStream=_Stream,
    get_current_stream=lambda: _current, get_elapsed_time=lambda a, b: (b.at - a.at) * 1e3,
    alloc_pinned_memory=lambda n: bytearray(n))
ElementwiseKernel = _elementwise_kernel


def _resample_kernel(ptr, sh, sw, pitch, rows, flips, out, oh, ow, n):
    """reader.transforms.resample.RESAMPLE_CUDA, run as its numpy definition: each
    "device pointer" is a host address here (the stand-in's images live in host memory)."""
    from reader.transforms.resample import resample_reference

    for k in range(int(n)):
        h, w, p = int(sh[k]), int(sw[k]), int(pitch[k])
        raw = (ctypes.c_uint8 * (p * (h - 1) + w * 3)).from_address(int(ptr[k]))
        src = np.lib.stride_tricks.as_strided(np.frombuffer(raw, np.uint8), (h, w, 3), (p, 3, 1))
        out[int(rows[k])] = resample_reference(src, (int(oh), int(ow)), bool(flips[k]))


raw_kernels = {"shardpack_resample": _resample_kernel}
launches: list[tuple] = []  # (name, grid, block) of each RawKernel launch


def reset() -> None:
    """Forget every recorded copy, launch and stream operation (a test's fixture)."""
    for recorded in (copies, launches, ops):
        recorded.clear()


class RawKernel:
    def __init__(self, code, name):
        self.name = name
        self.run = raw_kernels[name]

    def __call__(self, grid, block, args):
        launches.append((self.name, grid, block))
        ops.append(("launch", self.name, None))
        self.run(*args)


_Stream.ptr = 0
