"""JPEG decode on the GPU (nvImageCodec), sharing each batch with the CPU workers.

``DeviceOptions(decode_device="cuda")`` (or ``"auto"`` where it qualifies). Per batch
of ``n`` records the runtime picks ``g`` (:mod:`reader.runtime.split`) and the task
says it; then:

1. **Worker** (:func:`stage_for_gpu`, called by the classification builder for
   records ``0..g-1``): reads the JPEG header, draws the plan from the batch's random
   stream exactly as the CPU path does (the same plan, so the same crop and flip
   whichever side decodes), and writes into the slot, instead of pixels, the
   compressed bytes (row ``i`` of :data:`BYTES`) and a row of :data:`PLAN`: staged
   flag, byte length, the crop as whole source pixels
   (:func:`reader.transforms.resample.integer_box`), flip, record. A record the GPU
   should not take (not a JPEG, a lossless JPEG, a box reaching outside the image, a
   file larger than its row) is decoded on the CPU with the plan already drawn.
   Records ``g..n-1`` are decoded on the CPU as always.
2. **Main process** (:class:`GpuDecodeStage`, run by the CUDA sink): one
   ``Decoder.decode`` call for the batch's staged records, each a code stream over
   its slot row with the crop as its region (``CodeStream.get_sub_code_stream(
   region=Region(y0, x0, y1, x1))``: only the crop is decoded); nvImageCodec moves
   the compressed bytes to the device itself (its input lives in host memory: the
   page-locked slot, so that copy is one DMA per code stream, not a staging copy).
3. The CPU rows travel in the sink's one copy per field; then one kernel launch
   (:data:`reader.transforms.resample.RESAMPLE_CUDA`) resizes every decoded crop
   (the CPU path's filter), mirrors it and writes it into its row of the batch's
   uint8 image array, and the sink's fused kernel normalizes the whole batch. The
   slot goes back to the workers only after an event recorded behind all of it.

What stays on the CPU (refused with ``"cuda"``, ``"auto"`` falls back, both said in
:func:`refusal`): the sample path (boxes, keypoints and masks follow the image's
geometry on the CPU path today; images whose size varies; per-sample arrays;
``SampleTransform``), callables on the image and ``Normalize`` (they run on CPU
pixels), the decoded cache and ``on_error="replace"`` (a replacement is rebuilt in
the worker). ``on_error="skip"`` works: a record nvImageCodec cannot decode is
zeroed and marked invalid.

The adapter is the ``nvimgcodec`` module and the ``cupy`` module it is given: CI
runs the whole path with tests/fake_nvimgcodec.py (simplejpeg on the CPU) and
tests/fake_cupy.py (numpy; its ``RawKernel`` runs
:func:`reader.transforms.resample.resample_reference`).
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from formats.errors import ArgumentError
from formats.sniff import jpeg_dct_scalable

from ..errors import DecodeError
from ..transforms.bad_input import VALID_FIELD
from ..transforms.decode import image_size
from ..transforms.resample import RESAMPLE_CUDA, integer_box
from .slots import SlotLayout

__all__ = ["BYTES", "PLAN", "GpuDecodeStage", "refusal", "require_nvimgcodec",
           "resolve_decode_device", "stage_for_gpu", "with_gpu_fields"]

INSTALL_HINT = ("decode_device='cuda' needs nvImageCodec with nvJPEG: "
                "pip install 'shardpack[gpu-decode]'")
BYTES = "__gpu_jpeg"  # uint8 [batch, max payload]: a staged record's compressed bytes
PLAN = "__gpu_plan"  # int64 [batch, 8]: staged, length, x0, y0, x1, y1, flip, record
_STAGED, _LEN, _X0, _Y0, _X1, _Y1, _FLIP, _RECORD = range(8)
_SOI = b"\xff\xd8"


def require_nvimgcodec():
    """``nvidia.nvimgcodec``, or ImportError with the install hint."""
    import importlib

    try:
        return importlib.import_module("nvidia.nvimgcodec")
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from exc


def refusal(plan, decode_options, bad_input) -> str | None:
    """Why the GPU decode cannot make this loader's batches (None: it can)."""
    if plan.image is None:
        return "no image field is decoded"
    if plan.sample is not None:
        return ("the sample path stays on the CPU: boxes, keypoints and masks follow the "
                "image's geometry there, as do images whose size varies, per-sample arrays "
                "and SampleTransform callables; the GPU decodes fixed-size image batches "
                "(e.g. RandomResizedCrop + RandomHorizontalFlip) only")
    core = getattr(plan.pipeline, "pipeline", None)
    if core is None:
        return "a custom pipeline object decodes by itself, on the CPU"
    if core.user or core.normalize is not None:
        return ("callables on the image and Normalize run on CPU pixels (normalize on the GPU "
                "with DeviceOptions' dtype, mean and std instead)")
    if decode_options.decoded_cache is not None:
        return "the decoded cache holds CPU-decoded pixels"
    if bad_input.replaces:
        return "on_error='replace' rebuilds a batch with its replacements in the worker"
    return None


def resolve_decode_device(options, plan, decode_options, bad_input) -> bool:
    """Whether this loader decodes on the GPU (``options.decode_device`` resolved once).

    Raises:
        ArgumentError: ``"cuda"`` where :func:`refusal` says why not.
        ImportError: ``"cuda"`` without nvImageCodec (the install hint).
    """
    if options.decode_device == "cpu":
        return False
    why = refusal(plan, decode_options, bad_input)
    if options.decode_device == "cuda":
        if why is not None:
            raise ArgumentError(f"decode_device='cuda' cannot make these batches: {why}; "
                                "leave decode_device out (or 'cpu') to decode in the workers")
        require_nvimgcodec()
        return True
    if why is not None:
        return False
    try:
        require_nvimgcodec()
    except ImportError:
        return False
    return True


def with_gpu_fields(plan, ds):
    """``plan`` with the slot regions the staged records need (:data:`BYTES`, :data:`PLAN`).

    A row of :data:`BYTES` holds the largest payload of the image field (its stored
    lengths, from the index), so the slot grows by about a batch of compressed images
    (bounded by the largest: a dataset with one huge JPEG wastes slot memory; a
    bound that sends outliers to the CPU is a follow-up)."""
    from dataclasses import replace

    names = {f.name for f in ds.fields}
    for n in (BYTES, PLAN):
        if n in names:
            raise ArgumentError(f"decode_device='cuda' carries {n!r} in the slot, and the dataset "
                                "has a field of that name: leave it out (fields=...)")
    image = plan.layout.field(plan.image)
    b = image.shape[0]
    longest = _longest_payload(ds, plan.image)
    specs = [(f.name, f.dtype, f.shape) for f in plan.layout.fields]
    specs += [(BYTES, np.uint8, (b, max(longest, 1))), (PLAN, np.int64, (b, 8))]
    return replace(plan, layout=SlotLayout.build(specs), fixed=(*plan.fixed, BYTES, PLAN))


def _longest_payload(ds, name: str) -> int:
    """The largest stored payload of field ``name``, from the index (shard by shard, so
    memory stays a shard's worth); 1 where the dataset has no index to read it from
    (every record then goes to the CPU: it does not fit its row)."""
    spans = getattr(ds, "spans", None)
    if spans is None:
        return 1
    starts = np.asarray(getattr(ds, "starts", (0, len(ds))), np.int64)
    longest = 1
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
        if b > a:
            longest = max(longest, int(spans(np.arange(a, b, dtype=np.int64), name)[2].max()))
    return longest


def stage_for_gpu(pipeline, data, i: int, record: int, arrays: dict, rng,
                  max_pixels: int | None):
    """Step 1 for record ``i`` of the batch: stage it for the GPU, or say how the CPU
    decodes it.

    Returns:
        None when staged; ``(height, width, plan)`` when the CPU decodes it with that
        plan (already drawn from ``rng``); ``()`` when it is no JPEG (the CPU path
        decodes it and draws its plan, as always).

    Raises:
        DecodeError: the header does not parse (the bad-input policy decides).
    """
    row = arrays[PLAN][i]
    row[_STAGED] = 0
    if bytes(data[:2]) != _SOI:
        return ()
    height, width = image_size(data, max_pixels)
    plan = pipeline.pipeline.plan(height, width, rng)
    x0, y0, x1, y1 = plan.box
    eps = 1e-6
    inside = x0 > -eps and y0 > -eps and x1 < width + eps and y1 < height + eps
    room = arrays[BYTES].shape[1]
    if not inside or len(data) > room or not jpeg_dct_scalable(data):
        return height, width, plan
    ix0, iy0, ix1, iy1 = integer_box(plan.box, height, width)
    row[:] = (1, len(data), ix0, iy0, ix1, iy1, int(plan.flip), record)
    arrays[BYTES][i, :len(data)] = np.frombuffer(data, np.uint8)
    return None


class GpuDecodeStage:
    """Steps 2 and 3 in the main process: one per runtime (its decoder lives as long).

    Args:
        cp: cupy (or the stand-in).
        nvimgcodec: the nvImageCodec module (or the stand-in).
        device_id: the GPU.
        stream: the sink's CUDA stream; decode and kernels are ordered on it.
        tolerant: ``on_error="skip"``: a record that does not decode is zeroed and
            marked invalid instead of failing the batch.
    """

    def __init__(self, cp, nvimgcodec, device_id: int, stream, tolerant: bool) -> None:
        self.cp, self.nv = cp, nvimgcodec
        self.stream = stream
        self.tolerant = tolerant
        self.decoder = nvimgcodec.Decoder(device_id=device_id)
        # The CPU path (simplejpeg) ignores EXIF orientation: so does this one.
        self.params = nvimgcodec.DecodeParams(apply_exif_orientation=False)
        self.kernel = cp.RawKernel(RESAMPLE_CUDA, "shardpack_resample")
        self._alive: deque = deque()  # (event, decoded images) until the kernel has read them
        self.last = (0, 0.0)  # (images, seconds) of the latest batch, for the split controller

    def take(self, batch: dict):
        """Remove the staging fields from ``batch`` (they never go to the device);
        return ``(bytes, plan)`` host views, or None when nothing was staged."""
        data, plan = batch.pop(BYTES), batch.pop(PLAN)
        return (data, plan) if plan[:, _STAGED].any() else None

    def decode(self, share, batch: dict, image: str) -> tuple:
        """Step 2: decode the staged records (before the sink's copies, so a failure
        can still zero its host row and clear its ``valid`` flag). Returns what
        :meth:`resample` needs."""
        t0 = time.perf_counter()
        data, plan = share
        rows = np.flatnonzero(plan[:, _STAGED] == 1)
        nv = self.nv
        streams = []
        for i in rows.tolist():
            p = plan[i]
            code = nv.CodeStream(data[i, :p[_LEN]])
            region = nv.Region(int(p[_Y0]), int(p[_X0]), int(p[_Y1]), int(p[_X1]))
            streams.append(code.get_sub_code_stream(region=region))
        decoded = self.decoder.decode(streams, params=self.params, cuda_stream=self.stream.ptr)
        ok, images = [], []
        for i, im in zip(rows.tolist(), decoded, strict=True):
            if im is not None:
                ok.append(i)
                images.append(im)
                continue
            record = int(plan[i, _RECORD])
            if not self.tolerant:
                raise DecodeError(f"dataset record {record}: nvImageCodec could not decode its "
                                  "JPEG; pass on_error='skip' to skip such records, or "
                                  "DeviceOptions(decode_device='cpu')")
            batch[image][i] = 0
            batch[VALID_FIELD][i] = False
        return ok, images, plan, time.perf_counter() - t0

    def resample(self, decoded: tuple, out) -> None:
        """Step 3: one launch resizes and mirrors every decoded crop into its row of
        ``out`` (the batch's uint8 ``[B, H, W, 3]`` on the device)."""
        t0 = time.perf_counter()
        rows, images, plan, decode_s = decoded
        cp = self.cp
        n = len(rows)
        if n:
            ptr = np.empty(n, np.uint64)
            sh, sw = np.empty(n, np.int32), np.empty(n, np.int32)
            pitch = np.empty(n, np.int64)
            for k, im in enumerate(images):
                face = im.__cuda_array_interface__
                h, w = face["shape"][:2]
                ptr[k], sh[k], sw[k] = face["data"][0], h, w
                pitch[k] = face["strides"][0] if face.get("strides") else w * 3
            flips = plan[rows, _FLIP].astype(np.uint8)
            _, oh, ow, _ = out.shape
            block = 128
            self.kernel(((ow + block - 1) // block, oh, n), (block,),
                        (cp.asarray(ptr), cp.asarray(sh), cp.asarray(sw), cp.asarray(pitch),
                         cp.asarray(np.asarray(rows, np.int32)), cp.asarray(flips), out,
                         np.int32(oh), np.int32(ow), np.int32(n)))
            done = cp.cuda.Event()
            done.record(self.stream)
            self._alive.append((done, images))
        while self._alive and self._alive[0][0].done:
            self._alive.popleft()
        self.last = (n, decode_s + time.perf_counter() - t0)
