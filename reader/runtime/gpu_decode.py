"""JPEG decode on the GPU (nvImageCodec), sharing each batch with the CPU workers.

``DeviceOptions(decode_device="cuda")`` (or ``"auto"`` where it qualifies). Per batch
of ``n`` records the runtime picks ``g`` (:mod:`reader.runtime.split`) and the task
says it; then:

1. **Worker** (:class:`Stager`, used by the classification builder for records
   ``0..g-1``): reads the JPEG header, draws the plan from the batch's random stream
   exactly as the CPU path does (the same plan, so the same crop and flip whichever
   side decodes), and writes into the slot, instead of pixels, the compressed bytes
   (packed into the batch's :data:`BYTES` region) and a row of :data:`PLAN`: staged
   flag, byte length, the crop as whole source pixels
   (:func:`reader.transforms.resample.integer_box`), flip, record, offset. A record
   the GPU should not take (not a JPEG, a lossless JPEG, a box reaching outside the
   image, bytes that do not fit the region) is decoded on the CPU with the plan
   already drawn. Records ``g..n-1`` are decoded on the CPU as always.
2. **Main process** (:class:`GpuDecodeStage`, run by the CUDA sink; for the batch
   the consumer will ask for next, started in the stage's own thread as soon as its
   worker is done, :meth:`GpuDecodeStage.ahead`, since the decode call returns only
   once its host work is done and would otherwise add that to each step): one
   ``Decoder.decode`` call for the batch's staged records, each a code stream over
   its slot row with the crop as its region (``CodeStream.get_sub_code_stream(
   region=Region(y0, x0, y1, x1))``: only the crop is decoded); nvImageCodec moves
   the compressed bytes to the device itself (its input lives in host memory: the
   page-locked slot, so that copy is one DMA per code stream, not a staging copy).
   Each image is checked before its pixels are read: 8-bit interleaved RGB of the
   region's size (or of the whole picture, then read at the region's offset);
   anything else, a header nvImageCodec cannot parse, or a ``None`` from the
   decoder fails the record as the bad-input policy says (:class:`Decoded`).
3. The CPU rows travel in the sink's one copy per field (the image field's copy
   starts after the leading GPU rows, which the kernel writes); then one kernel
   launch (:data:`reader.transforms.resample.RESAMPLE_CUDA`) resizes every decoded
   crop (the CPU path's filter), mirrors it and writes it into its row of the
   batch's uint8 image array, and the sink's fused kernel normalizes the whole
   batch. The slot goes back to the workers only after an event recorded behind
   all of it. CUDA events around the decode and the kernel give the GPU stage's
   time for the split (:attr:`GpuDecodeStage.last`), read once complete.

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

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from formats.errors import ArgumentError
from formats.sniff import jpeg_dct_scalable

from ..errors import DecodeError, LoaderError
from ..transforms.bad_input import VALID_FIELD
from ..transforms.decode import image_size
from ..transforms.resample import RESAMPLE_CUDA, integer_box
from .slots import SlotLayout

__all__ = [
    "ALL_FAILED",
    "BYTES",
    "DECODER_OPTIONS",
    "DECODER_THREADS",
    "PLAN",
    "STAGING_FIELDS",
    "Decoded",
    "GpuDecodeStage",
    "Stager",
    "refusal",
    "require_nvimgcodec",
    "resolve_decode_device",
    "row_bytes",
    "with_gpu_fields",
]

log = logging.getLogger(__name__)

INSTALL_HINT = ("decode_device='cuda' needs nvImageCodec with nvJPEG: "
                "pip install 'shardpack[gpu-decode]'")
BYTES = "__gpu_jpeg"  # uint8 [batch, max payload]: a staged record's compressed bytes
PLAN = "__gpu_plan"  # int64 [batch, 9]: staged, length, x0, y0, x1, y1, flip, record, offset
_STAGED, _LEN, _X0, _Y0, _X1, _Y1, _FLIP, _RECORD, _AT = range(9)
_ROW = 9  # in the main process, a plan row's batch row is appended to it
STAGING_FIELDS = (BYTES, PLAN)  # never copied to the device
_SOI = b"\xff\xd8"
#: Smooth chroma upsampling, as libjpeg-turbo does by default on the CPU path
#: (nvImageCodec's default replicates samples: a second source of pixel differences);
#: decoders that cannot do it ignore the option.
DECODER_OPTIONS = ":fancy_upsampling=1"


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
    if getattr(core, "backend", "auto") == "pillow":
        return ("backend='pillow' resizes with Pillow's filter on the CPU, and the GPU's is "
                "OpenCV's: one batch would mix the two (leave the backend at 'auto' or 'cv2')")
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

    :data:`BYTES` holds :func:`row_bytes` per record of the batch, one region the
    staged records are packed into (:class:`Stager`): sized by the mean, not the
    largest, so one outlier (ImageNet holds a 15 MB JPEG among 110 kB ones) cannot
    make every slot a batch of the largest file; what does not fit goes to the CPU."""
    from dataclasses import replace

    names = {f.name for f in ds.fields}
    for n in (BYTES, PLAN):
        if n in names:
            raise ArgumentError(f"decode_device='cuda' carries {n!r} in the slot, and the dataset "
                                "has a field of that name: leave it out (fields=...)")
    image = plan.layout.field(plan.image)
    b = image.shape[0]
    specs = [(f.name, f.dtype, f.shape) for f in plan.layout.fields]
    specs += [(BYTES, np.uint8, (b, row_bytes(ds, plan.image))), (PLAN, np.int64, (b, 9))]
    return replace(plan, layout=SlotLayout.build(specs), fixed=(*plan.fixed, BYTES, PLAN))


#: How :func:`row_bytes` samples the stored lengths (index reads only), and its margin.
SAMPLE_SHARDS, SAMPLE_PER_SHARD, ROW_MARGIN = 8, 512, 1.5


def row_bytes(ds, name: str) -> int:
    """Staging bytes per record of a batch: 1.5 x the mean stored length of field
    ``name`` in a sample, rounded up to 64 bytes. A batch's staged records share its
    rows' bytes, so they fit while they average under 1.5 x the mean (a batch of 256
    ImageNet JPEGs sums within a few percent of 256 means).

    The sample: up to 512 records, evenly spaced, of each of up to 8 shards evenly
    spaced over the dataset (their index entries only; a remote dataset fetches
    those shards, which the loader would read anyway). A dataset without an index
    to read (no ``spans``) gets 1: every record goes to the CPU."""
    spans = getattr(ds, "spans", None)
    if spans is None:
        return 1
    starts = np.asarray(ds.starts, np.int64)
    sizes = np.diff(starts)
    shards = np.flatnonzero(sizes)
    if shards.size > SAMPLE_SHARDS:
        shards = shards[np.linspace(0, shards.size - 1, SAMPLE_SHARDS).round().astype(np.int64)]
    picks = [starts[s] + np.unique(np.linspace(0, sizes[s] - 1, min(sizes[s], SAMPLE_PER_SHARD))
                                   .round().astype(np.int64)) for s in shards.tolist()]
    if not picks:
        return 1
    lengths = spans(np.concatenate(picks), name)[2]
    return max(-(-int(ROW_MARGIN * float(lengths.mean())) // 64) * 64, 64)


class Stager:
    """Step 1 for one batch of ``n`` records in a worker: the batch's staging area in
    its slot, the compressed bytes of the staged records packed one after another in
    the first ``n`` rows of :data:`BYTES` (as one flat region), each record's place
    and plan in its row of :data:`PLAN`.

    Made for every batch of a loader that decodes on the GPU, whatever the batch's
    GPU count: a slot keeps the rows an earlier batch staged, and a flag left set
    would have the GPU decode that batch's record over this one's.
    """

    def __init__(self, arrays: dict, n: int) -> None:
        self.plan = arrays[PLAN]
        self.plan[:n, _STAGED] = 0
        self.area = arrays[BYTES][:n].reshape(-1)  # the rows are contiguous: one region
        self.used = 0

    def stage(self, pipeline, data, i: int, record: int, rng, max_pixels: int | None):
        """Stage record ``i`` of the batch for the GPU, or say how the CPU decodes it.

        Returns:
            None when staged; ``(height, width, plan)`` when the CPU decodes it with
            that plan (already drawn from ``rng``): a lossless JPEG, a crop reaching
            outside the picture, or bytes that do not fit what is left of the area;
            ``()`` when it is no JPEG (the CPU path decodes it and draws its plan).

        Raises:
            DecodeError: the header does not parse (the bad-input policy decides).
        """
        if bytes(data[:2]) != _SOI:
            return ()
        height, width = image_size(data, max_pixels)
        plan = pipeline.pipeline.plan(height, width, rng)
        x0, y0, x1, y1 = plan.box
        eps = 1e-6
        inside = x0 > -eps and y0 > -eps and x1 < width + eps and y1 < height + eps
        at, size = self.used, len(data)
        if not inside or at + size > self.area.size or not jpeg_dct_scalable(data):
            return height, width, plan
        ix0, iy0, ix1, iy1 = integer_box(plan.box, height, width)
        self.plan[i] = (1, size, ix0, iy0, ix1, iy1, int(plan.flip), record, at)
        self.area[at:at + size] = np.frombuffer(data, np.uint8)
        self.used = at + size
        return None


#: nvImageCodec's host threads (parsing, and Huffman decoding where the GPU's own
#: decoders hand it to the CPU). Its default is one per core, which on a host whose
#: cores all run workers would make the two sides of the split fight for them.
DECODER_THREADS = 4
#: A batch with at least this many staged records, none decoded, is the decoder's
#: failure (out of memory, a library missing), not every record's.
ALL_FAILED = 4
#: How long closing waits for a look-ahead decode nobody will collect.
SETTLE_S = 30.0


class GpuDecodeStage:
    """Steps 2 and 3 in the main process: one per runtime (its decoder lives as long).

    The decode runs on a stream of its own (a batch's decode does not wait behind the
    sink's copies and the consumer's work queued before it); the sink's stream waits
    for it before the resample kernel reads the images.

    Args:
        cp: cupy (or the stand-in).
        nvimgcodec: the nvImageCodec module (or the stand-in).
        device_id: the GPU.
        stream: the sink's CUDA stream: the resample kernel runs on it.
        tolerant: ``on_error="skip"``: a record that does not decode is zeroed and
            marked invalid instead of failing the batch.
        key_words: record -> `` (key '...')`` for an error's message
            (:func:`reader.data.dataset.key_words` over the loader's dataset).
    """

    def __init__(self, cp, nvimgcodec, device_id: int, stream, tolerant: bool,
                 key_words=None) -> None:
        self.cp, self.nv = cp, nvimgcodec
        self.device_id = device_id
        self.stream = stream
        self.decode_stream = cp.cuda.Stream(non_blocking=True)
        self._thread = None  # the look-ahead's one thread (ahead), made on first use
        self._tasks = None
        #: A look-ahead decode did not return (settle, close): its ring is left mapped.
        self.hung = False
        self.tolerant = tolerant
        self.key_words = key_words or (lambda record: "")
        self.decoder = nvimgcodec.Decoder(device_id=device_id, max_num_cpu_threads=DECODER_THREADS,
                                          options=DECODER_OPTIONS)
        # The CPU path (simplejpeg) ignores EXIF orientation: so does this one.
        self.params = nvimgcodec.DecodeParams(apply_exif_orientation=False)
        self.kernel = cp.RawKernel(RESAMPLE_CUDA, "shardpack_resample")
        # (Decoded, before, after) until the kernel has read the images and the events
        # can be read without waiting.
        self._alive: deque = deque()
        #: This batch's GPU-decoded images, and the images and seconds of the batches
        #: whose GPU work was measured complete during it (CUDA events are read once
        #: done, never waited for: usually the batch before).
        self.last = (0, 0, 0.0)

    def take(self, batch: dict):
        """Remove the staging fields from ``batch`` (they never go to the device);
        return ``(bytes, plan)`` host views, or None when nothing was staged."""
        data, plan = batch.pop(BYTES), batch.pop(PLAN)
        return (data, plan) if plan[:, _STAGED].any() else None

    def decode(self, share, batch: dict, image: str) -> Decoded:
        """Step 2: decode the staged records (before the sink's copies, so a failure
        can still zero its host row and clear its ``valid`` flag). Returns what
        :meth:`resample` needs.

        Raises:
            DecodeError: a record nvImageCodec could not read or decode (unless
                tolerant), or every one of at least :data:`ALL_FAILED` staged records
                (the decoder failed, tolerant or not).
        """
        t0 = time.thread_time()  # this thread's CPU: waits for the GIL are not the GPU's
        data, plan = share
        area = data.reshape(-1)  # the batch's rows, one region (Stager)
        nv, cp = self.nv, self.cp
        out = Decoded()
        streams, asked, whole = [], [], []
        for i in np.flatnonzero(plan[:, _STAGED] == 1).tolist():
            p = [*plan[i].tolist(), i]  # the plan row, and its batch row (_ROW)
            try:
                # No copy: a view of the page-locked slot; the header is parsed when
                # first asked about (what nvImageCodec cannot parse fails here).
                code = nv.CodeStream(area[p[_AT]:p[_AT] + p[_LEN]])
                size = (code.height, code.width)
                region = nv.Region(p[_Y0], p[_X0], p[_Y1], p[_X1])
                streams.append(code.get_sub_code_stream(region=region))
            except (RuntimeError, ValueError) as exc:  # "Failed to get image info"
                self._failed(out, batch, image, p, f"could not read its JPEG header ({exc})")
                continue
            asked.append(p)
            whole.append(size)
        out.host_s = time.thread_time() - t0
        out.start = cp.cuda.Event()
        out.start.record(self.decode_stream)
        try:
            decoded = (self.decoder.decode(streams, params=self.params,
                                           cuda_stream=self.decode_stream.ptr) if streams else [])
        except (RuntimeError, ValueError) as exc:  # the whole call failed
            decoded = [exc] * len(streams)
        out.done = cp.cuda.Event()
        out.done.record(self.decode_stream)  # behind the decoder's own streams' work
        out.images = decoded  # kept alive until the kernel has read them
        if len(asked) >= ALL_FAILED and all(im is None or isinstance(im, Exception)
                                            for im in decoded):
            records = ", ".join(str(p[_RECORD]) for p in asked[:8])
            raise DecodeError(
                f"nvImageCodec decoded none of the batch's {len(asked)} staged JPEGs (dataset "
                f"records {records}{', ...' if len(asked) > 8 else ''}): the GPU decoder "
                f"failed, not the records ({decoded[0] or 'each result None'}: out of GPU "
                "memory, or a missing nvJPEG library?); DeviceOptions(decode_device='cpu') "
                "decodes on the CPU")
        for p, im, size in zip(asked, decoded, whole, strict=True):
            why = ("could not decode its JPEG" if im is None else
                   f"failed the batch's decode ({im})" if isinstance(im, Exception) else
                   out.add(p, im, size))
            if why is not None:
                self._failed(out, batch, image, p, why)
        return out

    def ahead(self, share, batch: dict, image: str) -> Future:
        """:meth:`decode` in this stage's thread, for a batch the consumer has not asked
        for yet: the decode call returns once its host work is done (parsing, and
        Huffman decoding where it runs on the CPU), which in ``next()`` would add to
        each training step. Returns a future of :meth:`decode`'s result (or its
        error, raised when the batch is delivered).

        The thread is a daemon of its own (not an executor's, which the interpreter
        joins at exit): a decoder that never returns must not hang the exit too."""
        if self.hung:
            raise LoaderError("an earlier GPU decode never returned: nvImageCodec is stuck; "
                              "DeviceOptions(decode_device='cpu') decodes on the CPU")
        if self._thread is None:
            self._tasks = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._serve, args=(self._tasks,),
                                            name="shardpack-gpu-decode", daemon=True)
            self._thread.start()
        future: Future = Future()
        self._tasks.put((future, share, batch, image))
        return future

    def _serve(self, tasks) -> None:
        with self.cp.cuda.Device(self.device_id):  # the current device is per thread
            while (task := tasks.get()) is not None:
                future, share, batch, image = task
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(self.decode(share, batch, image))
                except BaseException as exc:  # raised with its own batch, in next()
                    future.set_exception(exc)

    def settle(self, future: Future) -> bool:
        """Wait (at most :data:`SETTLE_S`) for a look-ahead decode that no batch will
        collect; False, and the stage marked :attr:`hung`, when it did not return."""
        try:
            future.exception(SETTLE_S)
        except FutureTimeout:
            self.hung = True
            log.warning("the GPU decode of a batch did not return within %.0f s; its ring "
                        "stays mapped and page-locked until the process exits (it may "
                        "still read it)", SETTLE_S)
            return False
        return True

    def close(self) -> bool:
        """Stop the look-ahead's thread, then wait for every decode and kernel queued
        (they read the slots: the ring may be unmapped next). False when a decode
        never returned (:attr:`hung`): then nothing is waited for, and the ring must
        not be unmapped."""
        if self._thread is not None:
            self._tasks.put(None)  # it ends after the decode it is in, should that return
            if not self.hung:
                self._thread.join(SETTLE_S)
                self.hung = self._thread.is_alive()
        if self.hung:
            return False
        self._thread = None
        self.decode_stream.synchronize()
        self.stream.synchronize()
        self._alive.clear()
        return True

    def _failed(self, out: Decoded, batch: dict, image: str, p: list, why: str) -> None:
        """A staged record nvImageCodec did not decode: the batch fails naming it, or
        (``on_error="skip"``) its row is zeroed on the host, marked invalid, counted."""
        record, i = p[_RECORD], p[_ROW]
        if not self.tolerant:
            raise DecodeError(f"dataset record {record}{self.key_words(record)}: nvImageCodec "
                              f"{why}; pass on_error='skip' to skip such records, or "
                              "DeviceOptions(decode_device='cpu')")
        batch[image][i] = 0
        batch[VALID_FIELD][i] = False
        out.skipped += 1

    def resample(self, decoded: Decoded | None, out) -> None:
        """Step 3: one launch resizes and mirrors every decoded crop into its row of
        ``out`` (the batch's uint8 ``[B, H, W, 3]`` on the device), once the decode is
        done (the sink's stream waits for the decode stream's event)."""
        cp = self.cp
        n = 0
        if decoded is not None and decoded.done is not None:
            # The slot goes back to the workers after this stream's next event: by then
            # the decoder has read its bytes, whatever it made of them.
            self.stream.wait_event(decoded.done)
        if decoded is not None and decoded.rows:
            d = decoded
            n = len(d.rows)
            _, oh, ow, _ = out.shape
            block = 128
            before = cp.cuda.Event()
            before.record(self.stream)
            self.kernel(((ow + block - 1) // block, oh, n), (block,),
                        (cp.asarray(np.asarray(d.ptr, np.uint64)),
                         cp.asarray(np.asarray(d.height, np.int32)),
                         cp.asarray(np.asarray(d.width, np.int32)),
                         cp.asarray(np.asarray(d.pitch, np.int64)),
                         cp.asarray(np.asarray(d.rows, np.int32)),
                         cp.asarray(np.asarray(d.flips, np.uint8)), out,
                         np.int32(oh), np.int32(ow), np.int32(n)))
            after = cp.cuda.Event()
            after.record(self.stream)
            self._alive.append((d, before, after))
        self.last = (n, *self._measured())

    def _measured(self) -> tuple[int, float]:
        """Images and seconds of the batches whose kernel has finished since the last
        call. The GPU stage's time is the main process's CPU time building the code
        streams, then the device's from the decode call to its images (which covers the
        call's own host work) plus the resample kernel's, by CUDA events (the sink's
        copies between the two do not count)."""
        cp = self.cp
        n, s = 0, 0.0
        while self._alive and self._alive[0][2].done:
            d, before, after = self._alive.popleft()
            device_s = (cp.cuda.get_elapsed_time(d.start, d.done)
                        + cp.cuda.get_elapsed_time(before, after)) / 1e3
            n += len(d.rows)
            s += d.host_s + device_s
        return n, s


class Decoded:
    """One batch's decoded crops, as the resample kernel reads them: per image its
    batch row, device address, height, width, row pitch and flip; the decode's
    events; how many staged records were skipped.

    nvImageCodec is asked for each crop as a region; an image that comes back as the
    whole picture is read at the crop's offset; any other shape or type is refused
    (reading it would be wrong pixels, silently).
    """

    def __init__(self) -> None:
        self.start = self.done = None
        self.rows: list[int] = []
        self.ptr: list[int] = []
        self.height: list[int] = []
        self.width: list[int] = []
        self.pitch: list[int] = []
        self.flips: list[int] = []
        self.images: list = []
        self.host_s = 0.0
        self.skipped = 0

    def add(self, p: list, image, whole: tuple[int, int]) -> str | None:
        """Take the decoded ``image`` of plan row ``p``; a reason when it cannot be read."""
        x0, y0, x1, y1 = p[_X0], p[_Y0], p[_X1], p[_Y1]
        face = image.__cuda_array_interface__
        shape = tuple(face["shape"])
        if face["typestr"][1:] != "u1" or len(shape) != 3 or shape[2] != 3:  # "|u1" or "<u1"
            return (f"gave an image of shape {shape} and type {face['typestr']!r}, not 8-bit "
                    "RGB (height, width, 3)")
        pitch = face["strides"][0] if face.get("strides") else shape[1] * 3
        if (face.get("strides") or (pitch, 3, 1))[1:] != (3, 1):
            return f"gave an image of strides {face['strides']}, not interleaved RGB"
        address = face["data"][0]
        if shape[:2] == (y1 - y0, x1 - x0):
            pass
        elif shape[:2] == tuple(whole):  # the region was not applied: read it in place
            address += y0 * pitch + x0 * 3
        else:
            return (f"gave an image of {shape[0]}x{shape[1]} for a region of "
                    f"{y1 - y0}x{x1 - x0} in a {whole[0]}x{whole[1]} picture")
        self.rows.append(p[_ROW])
        self.ptr.append(address)
        self.height.append(y1 - y0)
        self.width.append(x1 - x0)
        self.pitch.append(pitch)
        self.flips.append(p[_FLIP])
        return None

    def leading(self) -> int:
        """How many rows from the first are decoded here: the kernel writes them, so
        the sink's copy of the CPU rows can start after them."""
        k = 0
        for i in self.rows:
            if i != k:
                break
            k += 1
        return k
