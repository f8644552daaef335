"""Sinks: the consumer side of the slot ring. A sink turns a delivered slot into what
the user gets, and says when the slot may be refilled.

The slot-release protocol every sink follows:

* ``hold``: how many slots the consumer may hold at once (extra ring slots);
* ``attach(ring)``: called once the epoch's ring exists, before any delivery;
* ``deliver(slot, batch, timing) -> (batch, timing)``: turn the slot's views into
  what the user gets;
* ``reclaim() -> list[int]``: called at the start of every ``next()``; the slots
  that may be refilled now;
* ``close()``: the epoch ends.

:class:`CpuSink` (``device="cpu"``) hands out leased views: a slot comes back once
nothing refers to its batch.

:class:`CudaSink` (``device="cuda"``) sends each batch from its shared-memory slot
to the GPU with no staging copy. Per batch, on a dedicated non-blocking CUDA
stream: one async host-to-device copy per field straight out of the slot (the slot
ring is page-locked in place with ``cudaHostRegister``), then one fused kernel that
converts uint8 images to float16/float32, normalizes them (mean/std) and lays them
out as NCHW or NHWC. An event recorded after the copies gates the slot: it goes
back to the workers only once that event has completed (:class:`SlotGate`).

Stream semantics for the consumer: before a batch is returned, the consumer's
current stream (cupy's, or torch's with ``output="torch"``) is made to wait on the
batch's ready event (``cudaStreamWaitEvent``), so work the consumer queues afterwards
sees the finished batch without the host ever blocking. In the other direction, when
the next batch is requested our stream waits on an event recorded on the consumer's
stream, so memory the consumer has dropped is not reused while its kernels may still
read it.

Where registering the ring fails (some container runtimes, or ``pinning="staging"``),
each slot is first copied into a cupy pinned staging buffer. Nothing here imports
cupy until a CUDA loader is constructed.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np

from ..errors import LoaderTimeoutError
from ..options import DeviceOptions
from ..transforms.collate import Ragged
from .device import pick_device, require_cupy
from .gpu_decode import STAGING_FIELDS
from .leases import MAX_LEASED, SlotLeases
from .timing import BatchTiming

__all__ = ["CpuSink", "CudaSink", "SlotGate", "cuda_state"]


class CpuSink:
    """Hands slot views to the user, leased: a slot comes back once nothing refers to it.

    ``deliver`` gives leased views (see :mod:`reader.runtime.leases`), or copies with
    ``copy=True`` or when the consumer already holds ``hold`` batches.
    """

    hold = MAX_LEASED
    decodes_ahead = False  # nothing is decoded in the main process

    def __init__(self, copy: bool = False) -> None:
        self.copy = copy
        self.leases: SlotLeases | None = None
        self.fields: tuple[str, ...] = ()
        self._back: list[int] = []

    def attach(self, ring) -> None:
        self.leases = ring.leases
        self.fields = tuple(f.name for f in ring.layout.fields)

    def deliver(self, slot: int, batch: dict, timing: BatchTiming | None):
        if not self.copy:
            leases = self.leases
            self._back += leases.collect()  # so that full() counts only live batches
            if not leases.full():
                # Everything of the slot: its arrays and ragged fields (main-process
                # fields are lists, and owned).
                names = [k for k, v in batch.items() if isinstance(v, (np.ndarray, Ragged))]
                return leases.lease(slot, batch, names), timing
            leases.note_copied()
        batch = {k: (v.copy() if isinstance(v, (np.ndarray, Ragged)) else
                     [bytes(x) if isinstance(x, memoryview) else x for x in v])
                 for k, v in batch.items()}
        self._back.append(slot)  # nothing refers to it any more
        return batch, timing

    def reclaim(self) -> list[int]:
        out, self._back = self._back, []
        if self.leases is not None:
            out += self.leases.collect()
        return out

    def close(self) -> None:
        self._back = []  # the next epoch starts from the ring's leases, not from us


class SlotGate:
    """Slots whose device copies are in flight, in submission order.

    A slot may be refilled by the workers only after the event recorded behind its
    copies has completed; :meth:`reclaim` hands back exactly those, and, when more
    than ``limit`` are pending, waits for the oldest so the ring can't run dry.

    Args:
        limit: the most slots held back at once.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._pending: deque[tuple[int, Any]] = deque()

    def add(self, slot: int, event) -> None:
        """``event`` has ``done`` (bool) and ``synchronize()``, like a CUDA event."""
        self._pending.append((slot, event))

    def reclaim(self) -> list[int]:
        free = []
        while self._pending and (len(self._pending) > self.limit or self._pending[0][1].done):
            slot, event = self._pending.popleft()
            event.synchronize()
            free.append(slot)
        return free

    def drain(self) -> list[int]:
        """Wait for every pending copy; return all slots."""
        out = []
        while self._pending:
            slot, event = self._pending.popleft()
            event.synchronize()
            out.append(slot)
        return out

    def __len__(self) -> int:
        return len(self._pending)


def cuda_state(options: DeviceOptions, rank: int) -> _CudaState:
    """The GPU state of ``device="cuda"`` (device, stream, kernel, ring registration):
    made once by the runtime and kept as long as it lives, one sink per epoch over it."""
    return _CudaState(require_cupy(), options, rank)


_KERNEL_SRC = """
    // one thread per output element; x is [B, H, W, C] uint8
    int c, h, w, b;
    if (nchw) {
        w = i % W; int t = i / W; h = t % H; t /= H; c = t % C; b = t / C;
    } else {
        c = i % C; int t = i / C; w = t % W; t /= W; h = t % H; b = t / H;
    }
    float v = (float)x[((b * H + h) * W + w) * C + c];
    y = (T)((v - mean[c]) * inv_std[c]);
"""


class _CudaState:
    """What lives as long as the runtime: device, stream, kernel, ring registration."""

    def __init__(self, cp, options: DeviceOptions, rank: int) -> None:
        self.cp = cp
        self.options = options
        self.device_id = pick_device(options, rank, cp.cuda.runtime.getDeviceCount())
        self.device = cp.cuda.Device(self.device_id)
        with self.device:
            self.stream = cp.cuda.Stream(non_blocking=True)
            self.mean = cp.asarray(options.mean, dtype=cp.float32)
            self.inv_std = cp.asarray([1.0 / s for s in options.std], dtype=cp.float32)
            self.kernel = cp.ElementwiseKernel(
                "raw uint8 x, raw float32 mean, raw float32 inv_std, int32 H, int32 W, int32 C, "
                "bool nchw", "T y", _KERNEL_SRC, "shardpack_normalize")
        self.gpu = None  # the GPU decode stage (gpu_stage), made once when asked for
        self.registered = None  # (address, nbytes) of the page-locked ring
        self.mode = None  # "register" or "staging"
        self.staging = None

    def gpu_stage(self, tolerant: bool, key_words=None):
        """The GPU decode stage (:mod:`reader.runtime.gpu_decode`), made on first use."""
        if self.gpu is None:
            from .gpu_decode import GpuDecodeStage, require_nvimgcodec

            with self.device:
                self.gpu = GpuDecodeStage(self.cp, require_nvimgcodec(), self.device_id,
                                          self.stream, tolerant, key_words)
        return self.gpu

    def prepare(self, ring) -> None:
        """Page-lock ``ring`` (once per ring), or set up staging buffers."""
        key = (ring.address, ring.nbytes)
        if self.registered == key or (self.mode == "staging" and self.staging is not None
                                      and self.staging_key == ring.slot_bytes):
            return
        self.release()
        cp = self.cp
        if self.options.pinning != "staging":
            try:
                cp.cuda.runtime.hostRegister(ring.address, ring.nbytes, 0)
                self.registered, self.mode = key, "register"
                return
            except cp.cuda.runtime.CUDARuntimeError:
                if self.options.pinning == "register":
                    raise
        mem = cp.cuda.alloc_pinned_memory(ring.slot_bytes)
        self.staging = np.frombuffer(mem, np.uint8, ring.slot_bytes)
        self.staging_mem, self.staging_key, self.mode = mem, ring.slot_bytes, "staging"

    def release(self) -> bool:
        """Unregister the ring; False when it must stay mapped (a GPU decode that never
        returned may still read it)."""
        if self.gpu is not None and not self.gpu.close():  # its thread may be reading the ring
            return False
        if self.registered is not None:
            self.stream.synchronize()
            self.cp.cuda.runtime.hostUnregister(self.registered[0])
            self.registered = None
        return True


class CudaSink:
    """Copies each delivered slot to the GPU; slots come back when their copy event is done."""

    hold = 2  # the slot being copied, and the one before it (its copy may still run)

    def __init__(self, state: _CudaState, image_field: str | None, gpu=None,
                 timeout: float | None = None) -> None:
        self.state = state
        self.timeout = timeout  # the loader's: how long a batch's GPU decode may take
        self.image_field = image_field  # the field converted and normalized on the GPU
        # The GPU decode of the batch's staged records (reader.runtime.gpu_decode), or None.
        self.gpu = gpu
        self.ring = None
        self.gate = SlotGate(limit=self.hold)
        self._timings: deque = deque()
        self._last_h2d: tuple[float, int] | None = None
        self._ahead: dict[int, Any] = {}  # slot -> future of its GPU decode (decode_ahead)
        # The latest delivery's records the GPU could not decode (skipped), and how long it
        # waited for (or ran) its GPU decode: the epoch counts both.
        self.gpu_skipped = 0
        self.gpu_wait_s = 0.0

    @property
    def decodes_ahead(self) -> bool:
        """Whether :meth:`decode_ahead` has work to do (the GPU decode is on)."""
        return self.gpu is not None

    def decode_ahead(self, slot: int, batch: dict) -> None:
        """Start the GPU decode of the batch in ``slot``, which the consumer will ask for
        next, in the GPU stage's thread, so it runs during the training step instead of
        inside the next ``next()`` (:meth:`GpuDecodeStage.ahead`). ``batch`` is its
        host views (what :meth:`deliver` will be given)."""
        if slot in self._ahead:
            return
        share = self.gpu.take(batch)
        if share is not None:
            self._ahead[slot] = self.gpu.ahead(share, batch, self.image_field)

    def attach(self, ring) -> None:
        self.ring = ring  # page-locked at the first delivery

    def deliver(self, slot: int, batch: dict, timing):
        st, cp = self.state, self.state.cp
        ring = self.ring
        st.prepare(ring)
        opts = st.options
        base = ring.address + ring.slot_offset(slot)
        share = self.gpu.take(batch) if self.gpu is not None else None
        ahead = self._ahead.get(slot)
        decoded = None
        t0 = time.perf_counter()
        # Before any copy: a record that does not decode zeroes its host row (and its
        # valid flag) in the slot.
        if ahead is not None:
            try:
                decoded = ahead.result(self.timeout)  # usually done: it ran during the step
            except FutureTimeout:
                raise LoaderTimeoutError(f"the GPU decode of a batch took over the timeout of "
                                         f"{self.timeout} s (nvImageCodec did not return)") from None
            del self._ahead[slot]  # only once done: close() waits for what is still running
        elif share:
            with st.device:
                decoded = self.gpu.decode(share, batch, self.image_field)
        self.gpu_wait_s = time.perf_counter() - t0 if self.gpu is not None else 0.0
        self.gpu_skipped = decoded.skipped if decoded is not None else 0
        if st.mode == "staging":
            # One host memcpy of the used part of the slot into pinned memory (the
            # compressed bytes the decoder read stay behind).
            used = max(f.offset + f.nbytes for f in ring.layout.fields
                       if f.name not in STAGING_FIELDS)
            st.stream.synchronize()  # the previous copy out of the staging buffer is done
            np.copyto(st.staging[:used], ring.array[ring.slot_offset(slot):ring.slot_offset(slot) + used])
            base = st.staging.ctypes.data
        out = {}
        nbytes = 0
        lead = decoded.leading() if decoded is not None else 0  # image rows the kernel writes
        with st.device, st.stream:
            start = cp.cuda.Event()
            start.record(st.stream)
            device_arrays = {}
            for f in ring.layout.fields:
                view = batch.get(f.name)
                if isinstance(view, Ragged):
                    view = view.values  # its offsets and shapes stay on the host (below)
                if not isinstance(view, np.ndarray):
                    continue
                # A partial or varying-size batch is a prefix of the slot's region (see
                # reader.transforms.collate): one contiguous copy of just that. The
                # image rows the GPU decodes lead the batch; the kernel writes them, so
                # the copy starts after them.
                dev = cp.empty(view.shape, dtype=view.dtype)
                skip = lead * (view.nbytes // len(view)) if f.name == self.image_field else 0
                if view.nbytes > skip:
                    target = dev[lead:] if skip else dev
                    target.data.copy_from_host_async(base + f.offset + skip, view.nbytes - skip,
                                                     st.stream)
                device_arrays[f.name] = dev
                nbytes += view.nbytes - skip
            copies_done = cp.cuda.Event()  # the copies alone: what the H2D figures time
            copies_done.record(st.stream)
            if self.gpu is not None:
                # After the copies, before the gate: the slot's bytes are read by then.
                self.gpu.resample(decoded, device_arrays[self.image_field])
            copied = cp.cuda.Event()
            copied.record(st.stream)
            self.gate.add(slot, copied)
            for name, dev in device_arrays.items():
                value = batch[name]
                if isinstance(value, Ragged):
                    # Values on the device; offsets and shapes copied on the host, where
                    # indexing reads them (a device scalar read would synchronize).
                    out[name] = Ragged(dev, np.array(value.offsets),
                                       None if value.shapes is None else np.array(value.shapes))
                elif name == self.image_field and dev.ndim == 4 and dev.dtype == cp.uint8:
                    out[name] = self._images(dev)
                else:
                    out[name] = dev
            ready = cp.cuda.Event()
            ready.record(st.stream)
        for name, value in batch.items():
            if name not in out:
                out[name] = value  # host-side fields (strings, JSON, bytes)
        self._timings.append((start, copies_done, nbytes))
        timing = self._attach_h2d(timing)
        if timing is not None and self.gpu is not None:
            # Seconds are those measured during this batch (usually the batch before's:
            # see GpuDecodeStage.last); over an interval the two sums match.
            timing.gpu_records, _, timing.gpu_decode_s = self.gpu.last
        consumer = self._consumer_stream()
        consumer.wait_event(ready)
        if opts.output == "torch":
            import torch

            out = {k: (torch.from_dlpack(v) if isinstance(v, cp.ndarray) else
                       [torch.from_dlpack(x) for x in v] if isinstance(v, Ragged) else v)
                   for k, v in out.items()}
        return out, timing

    def _images(self, dev):
        st, cp = self.state, self.state.cp
        opts = st.options
        b, h, w, c = dev.shape
        if opts.dtype == "uint8":
            return cp.ascontiguousarray(dev.transpose(0, 3, 1, 2)) if opts.layout == "NCHW" else dev
        shape = (b, c, h, w) if opts.layout == "NCHW" else (b, h, w, c)
        y = cp.empty(shape, dtype=cp.float16 if opts.dtype == "float16" else cp.float32)
        st.kernel(dev, st.mean, st.inv_std, np.int32(h), np.int32(w), np.int32(c),
                  opts.layout == "NCHW", y)
        return y

    def _consumer_stream(self):
        cp = self.state.cp
        if self.state.options.output == "torch":
            import torch

            return cp.cuda.ExternalStream(torch.cuda.current_stream(self.state.device_id).cuda_stream)
        return cp.cuda.get_current_stream()

    def _attach_h2d(self, timing):
        """Copy times come from CUDA events; read them once complete (no host stall)."""
        cp = self.state.cp
        while self._timings and self._timings[0][1].done:
            start, end, nbytes = self._timings.popleft()
            self._last_h2d = (cp.cuda.get_elapsed_time(start, end) / 1e3, nbytes)
        if timing is None or self._last_h2d is None:
            return timing
        timing.h2d_s, timing.h2d_bytes = self._last_h2d  # BatchTiming is mutable (reader.runtime.timing)
        return timing

    def reclaim(self) -> list[int]:
        # Our next writes wait for whatever the consumer has queued so far.
        consumer_done = self._consumer_stream().record()
        self.state.stream.wait_event(consumer_done)
        return self.gate.reclaim()

    def close(self) -> None:
        if self.gpu is not None:
            # Decodes of batches never delivered (or whose delivery failed) read their
            # slots, which go back to the workers now: wait for them, not for ever.
            if all(self.gpu.settle(f) for f in self._ahead.values()):
                self.gpu.decode_stream.synchronize()
            self._ahead.clear()
        self.gate.drain()
