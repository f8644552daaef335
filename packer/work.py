"""Per-file work (read, sniff, parse the header, maybe re-encode) and its process pool.

Protocol: :func:`load` is a module-level function, so it runs the same in the
calling process and in a worker. It never raises for bad input: it returns a
:data:`Loaded` tuple whose ``kind`` is None on success or the skip kind, and the
caller applies the ``--on-error`` policy in one place. Results come back in input
order (``imap`` over chunks), so the output never depends on the worker count.

Speed: when nothing is re-encoded, the parent reads files itself. Measured on
20,000 ~100 KB JPEGs, warm cache, 2 cores: the copy limit (os.read + os.write,
one process) ran 10.5-13.3k files/s; reading in the parent 13.6-15.9k files/s
(the writer's 4 MB buffer saves a syscall per record); two read-ahead threads
9-12k (GIL hand-offs); a 2-process pool returning bytes 3.4-4.6k (a pickle and
two pipe copies per 100 KB record). Processes pay off only when decoding and
re-encoding dominate: ``--max-side`` and ``--to-jpeg``.

Container sources (TFRecord, WebDataset, Parquet files) are the other way round:
parsing them costs more than writing, so :func:`iter_parts` reads their files in
worker processes whatever the options, under the parts protocol below.
"""

from __future__ import annotations

import errno
import functools
import os
import pickle
import signal
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import simplejpeg

from formats.base import Record
from formats.errors import MissingObjectError, ObjectTooLargeError, StorageError
from formats.sniff import image_kind, image_size, is_gray, looks_complete

from .errors import PackError

__all__ = ["MAX_OBJECT_BYTES", "MAX_PIXELS", "Item", "Loaded", "WorkOptions", "iter_loaded",
           "iter_parts", "load", "prepare", "prepare_record"]

# One input read from object storage is refused beyond this (a bound on memory).
MAX_OBJECT_BYTES = 1 << 30
# Object stores answer in milliseconds, not microseconds: reads overlap in threads.
FETCH_THREADS = 16


class Loaded(NamedTuple):
    """One input after :func:`load`.

    ``data`` is the bytes to store (None when skipped), ``nbytes_in`` the bytes
    read from the source, ``kind``/``reason`` the skip kind and words when bad.
    """

    data: bytes | None
    width: int | None
    height: int | None
    nbytes_in: int
    kind: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class WorkOptions:
    """What :func:`load` does with each file (a picklable subset of PackOptions).

    Args:
        image_type: the schema's image field type, ``jpeg`` or ``image``.
        max_side: re-encode JPEGs whose longer side exceeds this.
        quality: JPEG quality when re-encoding.
        to_jpeg: convert non-JPEG images to JPEG.
        location: for a source on object storage, the ``formats.storage.Location``
            that paths are relative to.
    """

    image_type: str = "jpeg"
    max_side: int | None = None
    quality: int = 90
    to_jpeg: bool = False
    location: Any = None

    @property
    def needs_processes(self) -> bool:
        """Whether per-file work is heavy enough for worker processes."""
        return self.max_side is not None or self.to_jpeg


class Item(NamedTuple):
    """One input on its way to the writer.

    ``record`` (field -> value) and ``meta`` are None when the input is skipped;
    ``kind``/``reason`` then say why. ``name`` is what the skip list and errors call
    it (a key, or the source's record origin); ``path`` the file an error names.
    """

    record: dict[str, Any] | None
    meta: dict[str, Any] | None
    name: str
    path: str
    nbytes: int
    kind: str | None = None
    reason: str | None = None


def _is_buffer(v) -> bool:
    return isinstance(v, (bytes, bytearray, memoryview))


def prepare_record(rec: Record, images: list[str], work: WorkOptions) -> Item:
    """One container record with each image payload checked (and maybe re-encoded)."""
    fields, meta = dict(rec.fields), dict(rec.meta)
    nbytes = sum(len(v) for v in fields.values() if _is_buffer(v))
    for name in images:
        loaded = prepare(bytes(fields[name]), rec.origin, work)
        if loaded.kind is not None:
            return Item(None, None, rec.origin, rec.origin, nbytes, loaded.kind,
                        f"field {name!r}: {loaded.reason}")
        fields[name] = loaded.data
        if name == images[0]:  # the metadata table's size is the first image's
            meta["width"], meta["height"] = loaded.width, loaded.height
    return Item(fields, meta, rec.origin, rec.origin, nbytes)


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size) if size else b""
        while len(data) < size:  # short reads are legal; rare on regular files
            more = os.read(fd, size - len(data))
            if not more:
                break
            data += more
        return data
    finally:
        os.close(fd)


def _os_error(path: str, exc: OSError) -> Loaded:
    if exc.errno == errno.ENOENT:
        if os.path.islink(path):
            return Loaded(None, None, None, 0, "missing", "dangling symlink")
        return Loaded(None, None, None, 0, "missing", "no such file")
    if exc.errno == errno.ELOOP:
        return Loaded(None, None, None, 0, "unreadable", "symlink loop")
    if exc.errno == errno.EISDIR:
        return Loaded(None, None, None, 0, "unreadable", "is a directory")
    return Loaded(None, None, None, 0, "unreadable", exc.strerror or str(exc))


# -- images -----------------------------------------------------------------------------
#
# Only the core dependencies: simplejpeg for JPEG, OpenCV for everything else (PNG,
# WebP, GIF, BMP, TIFF). Sizes come from the headers (formats.sniff) without a decode;
# pixels are decoded only to re-encode: --max-side, --to-jpeg.
#
# Conversion to JPEG (--to-jpeg): 16-bit samples are scaled to 8 bits (v / 257,
# rounded: 65535 -> 255), never clipped; other sample types (float, signed) are
# refused as "unsupported". An alpha channel is dropped, as Pillow's convert("RGB")
# and so torchvision's default loader drop it: the JPEG holds the pixels a model
# trained on the original file would have seen. Grayscale (PNG gray or gray+alpha,
# one-channel TIFF/BMP) stays a one-channel JPEG. An animated GIF gives its first frame.
#
# A non-JPEG image over --max-side without --to-jpeg is resized and stored as a PNG
# (lossless; depth and alpha kept): the field is typed ``image``, whose readers sniff.

# Pixels an image may claim before it is decoded; beyond, it is refused as
# "unsupported" (a bound on memory: Pillow's own decompression-bomb error is at 179M).
MAX_PIXELS = 1 << 28
_JPEG_NAMES = (".jpg", ".jpeg", ".jpe", ".jfif")
# The smallest GIF (1x1): whether this OpenCV decodes GIF at all (4.11 and later do).
_TINY_GIF = bytes.fromhex("47494638396101000100800000ffffff00000021f904010000"
                          "00002c00000000010001000002024401003b")


class _Bad(Exception):
    """A skip kind and its reason, raised and caught inside :func:`prepare` only."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(kind, reason)
        self.kind, self.reason = kind, reason


def _target(width: int, height: int, max_side: int) -> tuple[int, int]:
    """The size that fits ``max_side`` with the aspect ratio kept (the longer side exact)."""
    scale = max_side / max(width, height)
    if width >= height:
        return max_side, max(1, round(height * scale))
    return max(1, round(width * scale)), max_side


def _resize(arr: np.ndarray, width: int, height: int) -> np.ndarray:
    import cv2

    # INTER_AREA: an antialiased shrink. On 300 DCT-scaled JPEGs taken to --max-side
    # 256 (one core): 652 µs each at 48.9 dB PSNR against the Pillow BILINEAR it
    # replaced (942 µs); INTER_LINEAR 133 µs but 43.5 dB (it skips pixels).
    out = cv2.resize(arr, (width, height), interpolation=cv2.INTER_AREA)
    return out[..., None] if arr.ndim == 3 and out.ndim == 2 else out


def _resize_jpeg(data: bytes, width: int, height: int, opts: WorkOptions, gray: bool):
    tw, th = _target(width, height, opts.max_side)
    colorspace = "GRAY" if gray else "RGB"
    # DCT scaling decodes straight to the smallest scale (n/8) at least the target size.
    arr = simplejpeg.decode_jpeg(data, colorspace, min_height=th, min_width=tw)
    if arr.shape[1] != tw or arr.shape[0] != th:
        arr = _resize(arr, tw, th)
    out = simplejpeg.encode_jpeg(arr, opts.quality, colorspace, "444" if gray else "420")
    return out, tw, th


@functools.lru_cache(maxsize=1)
def _reads_gif() -> bool:
    import cv2

    try:
        return cv2.imdecode(np.frombuffer(_TINY_GIF, np.uint8), cv2.IMREAD_UNCHANGED) is not None
    except cv2.error:
        return False


def _decode(data: bytes, kind: str, width: int, height: int, gray: bool) -> np.ndarray:
    """Every pixel of a non-JPEG image at its own depth (alpha kept unless ``gray``)."""
    import cv2

    if width * height > MAX_PIXELS:
        raise _Bad("unsupported", f"{kind.upper()} of {width}x{height} pixels: more than "
                   f"{MAX_PIXELS:,} to decode")
    flags = cv2.IMREAD_GRAYSCALE | cv2.IMREAD_ANYDEPTH if gray else cv2.IMREAD_UNCHANGED
    try:
        arr = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    except cv2.error:
        arr = None
    if arr is None:
        if kind == "gif" and not _reads_gif():
            raise _Bad("unsupported", f"OpenCV {cv2.__version__} does not decode GIF (4.11 "
                       "and later do: pip install -U opencv-python-headless)")
        raise _Bad("corrupt", f"{kind.upper()} does not decode")
    if arr.dtype not in (np.uint8, np.uint16):
        raise _Bad("unsupported", f"{kind.upper()} with {arr.dtype} samples (8- and 16-bit "
                   "images can be re-encoded)")
    return arr


def _to_jpeg(data: bytes, kind: str, width: int, height: int, opts: WorkOptions):
    """``data`` as a JPEG at ``opts.quality``, within ``opts.max_side`` (see the notes)."""
    import cv2

    arr = _decode(data, kind, width, height, gray=is_gray(data, kind))
    if arr.dtype == np.uint16:
        arr = cv2.convertScaleAbs(arr, alpha=1 / 257)  # rounds and saturates to uint8
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[..., 0]
    height, width = arr.shape[:2]
    if opts.max_side is not None and max(width, height) > opts.max_side:
        width, height = _target(width, height, opts.max_side)
        arr = _resize(arr, width, height)
    if arr.ndim == 2:
        return simplejpeg.encode_jpeg(arr[..., None], opts.quality, "GRAY", "444"), width, height
    # BGRA: libjpeg-turbo reads the colour and skips the alpha byte, without a copy.
    colorspace = "BGRA" if arr.shape[2] == 4 else "BGR"
    return simplejpeg.encode_jpeg(arr, opts.quality, colorspace, "420"), width, height


def _shrink_to_png(data: bytes, kind: str, width: int, height: int, opts: WorkOptions):
    """A non-JPEG image over ``opts.max_side``, resized and stored as PNG (lossless)."""
    import cv2

    arr = _decode(data, kind, width, height, gray=False)
    width, height = _target(width, height, opts.max_side)
    arr = _resize(arr, width, height)
    ok, buf = cv2.imencode(".png", arr, [cv2.IMWRITE_PNG_COMPRESSION, 6])
    if not ok:
        raise _Bad("unsupported", f"{kind.upper()} of shape {arr.shape} cannot be a PNG")
    return buf.tobytes(), width, height

def load(path: str, opts: WorkOptions) -> Loaded:
    """Read one file and make it ready to store; bad input comes back as a kind."""
    try:
        data = _read(path) if opts.location is None else \
            opts.location.read_bytes(path, MAX_OBJECT_BYTES)
    except OSError as exc:
        return _os_error(path, exc)
    except StorageError as exc:
        # A missing or oversized object is bad input; storage that keeps failing is not,
        # and must stop the pack rather than be skipped record by record.
        if isinstance(exc, MissingObjectError):
            return Loaded(None, None, None, 0, "missing", exc.message)
        if isinstance(exc, ObjectTooLargeError):
            return Loaded(None, None, None, 0, "unreadable", exc.message)
        raise
    return prepare(data, path, opts)


def prepare(data: bytes, name: str, opts: WorkOptions) -> Loaded:
    """Make one input's bytes ready to store: sniff, read the size from the header, and
    re-encode when the options say so (the image notes above).

    Args:
        data: the input's bytes, already in memory.
        name: a path or a record's key; its extension picks the skip kind for data
            with no image signature (``corrupt`` for a .jpg, else ``not-an-image``).
        opts: what to do with it.

    Returns:
        The bytes to store with their size, or the skip kind and reason: bad input
        comes back as a kind (``empty``, ``corrupt``, ``truncated``, ``not-an-image``,
        ``not-a-jpeg``, ``unsupported``), never raised.
    """
    n = len(data)
    if not n:
        return Loaded(None, None, None, 0, "empty", "zero-byte file")
    kind = image_kind(data)
    try:
        if kind == "jpeg":
            return _prepare_jpeg(data, n, opts)
        if kind is None:
            bad = "corrupt" if os.path.splitext(name)[1].lower() in _JPEG_NAMES else "not-an-image"
            raise _Bad(bad, "no known image signature")
        return _prepare_other(data, kind, n, opts)
    except _Bad as exc:
        return Loaded(None, None, None, n, exc.kind, exc.reason)


def _prepare_jpeg(data: bytes, n: int, opts: WorkOptions) -> Loaded:
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError as exc:
        raise _Bad("corrupt", f"bad JPEG header ({exc})") from None
    if not looks_complete(data, "jpeg"):
        raise _Bad("truncated", "JPEG has no end-of-image marker")
    if opts.max_side is not None and max(width, height) > opts.max_side:
        try:
            data, width, height = _resize_jpeg(data, width, height, opts,
                                               colorspace.upper() == "GRAY")
        except ValueError as exc:
            raise _Bad("corrupt", f"JPEG does not decode ({exc})") from None
    return Loaded(data, width, height, n)


def _prepare_other(data: bytes, kind: str, n: int, opts: WorkOptions) -> Loaded:
    name = kind.upper()
    if not opts.to_jpeg and opts.image_type != "image":
        raise _Bad("not-a-jpeg", f"{name} data in a jpeg dataset (use --to-jpeg, or name "
                   f"it .{kind})")
    try:
        width, height = image_size(data, kind)
    except ValueError as exc:
        raise _Bad("corrupt", f"{name} header does not parse ({exc})") from None
    if not looks_complete(data, kind):
        raise _Bad("truncated", f"{name} is shorter than its header says, or has no end marker")
    if opts.to_jpeg:
        data, width, height = _to_jpeg(data, kind, width, height, opts)
    elif opts.max_side is not None and max(width, height) > opts.max_side:
        data, width, height = _shrink_to_png(data, kind, width, height, opts)
    return Loaded(data, width, height, n)

# -- running it over a listing --------------------------------------------------------

def _load_chunk(args: tuple[list[str], WorkOptions]) -> list[Loaded]:
    paths, opts = args
    return [load(p, opts) for p in paths]


def _worker_init() -> None:
    # Ctrl-C goes to the whole process group: the parent alone handles it (and
    # terminates the pool); workers printing their own tracebacks would only confuse.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _chunks(paths: list[str], size: int, opts: WorkOptions):
    for i in range(0, len(paths), size):
        yield paths[i : i + size], opts


def iter_loaded(paths: list[str], opts: WorkOptions, workers: int,
                chunk: int = 32) -> Iterator[Loaded]:
    """:func:`load` every path, yielding results in input order.

    Args:
        paths: files to load.
        opts: what to do with each.
        workers: processes to use when the work needs them (see module docstring);
            0 or 1 loads in this process.
        chunk: paths per task sent to a worker process.
    """
    if not paths:
        return
    if opts.location is not None and not opts.needs_processes:
        yield from _fetch_in_threads(paths, opts)
        return
    if workers >= 2 and opts.needs_processes:
        import multiprocessing as mp

        # fork: spawn would re-import numpy/pyarrow per worker; the parent holds no
        # lock a worker needs (load() touches only its own files).
        ctx = mp.get_context("fork") if hasattr(os, "fork") else mp.get_context()
        with ctx.Pool(workers, initializer=_worker_init) as pool:
            for results in pool.imap(_load_chunk, _chunks(paths, chunk, opts)):
                yield from results
        return
    for p in paths:
        yield load(p, opts)


def _fetch_in_threads(paths: list[str], opts: WorkOptions) -> Iterator[Loaded]:
    """:func:`load` from object storage, ``FETCH_THREADS`` requests in flight, in order."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="shardpack-read") as pool:
        window: deque = deque()
        todo = iter(paths)
        for p in todo:
            window.append(pool.submit(load, p, opts))
            if len(window) >= 4 * FETCH_THREADS:
                break
        while window:
            yield window.popleft().result()
            p = next(todo, None)
            if p is not None:
                window.append(pool.submit(load, p, opts))


# -- container sources in worker processes ---------------------------------------------
#
# The parts protocol
# ------------------
# * A source that can be split offers ``parts()``: sub-sources, one per file, whose
#   records, part after part, are exactly the source's (same values, origins, errors).
# * ``iter_parts`` starts W = min(workers, parts) processes (fork) and maps one
#   anonymous shared ring of ``SLOTS_PER_WORKER`` slots of ``SLOT_BYTES`` per worker.
#   Worker w reads parts w, w + W, w + 2W... in turn, prepares every record
#   (:func:`prepare_record`) and sends :class:`_Chunk` messages on its own pipe: the
#   chunk's items with every buffer field copied into a free slot of its own (a
#   :class:`_Span` in the item says where), ``end`` after a part's last record,
#   ``error`` (the pickled exception and its traceback) when reading fails, after
#   which it sends nothing more. A record too large for a slot travels in the
#   message itself; it still takes a slot, so each worker has at most
#   ``SLOTS_PER_WORKER`` messages in flight: memory stays bounded.
# * The parent reads part 0 from worker 0, part 1 from worker 1 and so on, copies
#   each chunk's payloads out of its slot, hands the slot id back on the worker's
#   free pipe and yields the items: the order is the source's whatever W, so the
#   output bytes never depend on the worker count. An error is raised where the
#   part reached it, after the items before it, as reading in one process would.
# * Pipes, not queues: no feeder thread in the parent competes for its GIL. Each
#   process closes the ends it does not use, so a worker whose parent is gone fails
#   its next send (EPIPE) or sees its free pipe end (EOF).
# * Every wait has a timeout (``POLL_S``): the parent checks that the worker it
#   waits for is alive (a dead one raises PackError naming it); a worker checks
#   ``done`` and ``os.getppid()``. Shutdown (end, error, ``close()`` of the
#   generator, Ctrl-C: workers ignore SIGINT): set ``done``, close the parent's
#   pipe ends (a worker blocked on a send or a slot returns at once), join each
#   worker for up to ``JOIN_S``, then terminate, then kill.

SLOT_BYTES = 4 << 20
SLOTS_PER_WORKER = 16
POLL_S = 0.2
JOIN_S = 2.0
_CHUNK_ITEMS = 1024  # items per message at most (bounds the latency of small records)


class _Span(NamedTuple):
    """Where a buffer field's bytes lie in the message's slot."""

    offset: int
    length: int


class _Chunk(NamedTuple):
    """A worker's message (see the parts protocol)."""

    part: int
    slot: int
    items: list
    end: bool = False
    error: bytes | None = None
    trace: str = ""


class _Stopped(Exception):
    """The parent stopped the pool or is gone: the worker returns."""


class _Pipes(NamedTuple):
    """One worker's two pipes, each as (receiving end, sending end)."""

    free: tuple
    out: tuple


def _free_slot(free, done, parent: int) -> int:
    while not free.poll(POLL_S):
        if done.is_set() or os.getppid() != parent:
            raise _Stopped
    try:
        return int.from_bytes(free.recv_bytes(), "little")
    except (EOFError, OSError):
        raise _Stopped from None


def _pickled_error(exc: BaseException) -> bytes | None:
    try:
        return pickle.dumps(exc)
    except Exception:  # an exception that does not pickle travels as text
        return None


def part_worker(w: int, pipes: list[_Pipes], parts: list, mine: list[int], images: list[str],
                work: WorkOptions, ring, done, parent: int) -> None:
    """Worker ``w`` of :func:`iter_parts`: the parts ``mine``, in turn (the parts protocol)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for v, p in enumerate(pipes):  # keep the two ends this worker uses
        for conn in (p.free[1], p.out[0]) if v == w else (*p.free, *p.out):
            conn.close()
    free, out = pipes[w].free[0], pipes[w].out[1]
    view = memoryview(ring)
    try:
        for p in mine:
            slot, used, items = _free_slot(free, done, parent), 0, []
            try:
                for rec in parts[p]:
                    item = prepare_record(rec, images, work)
                    bufs = [k for k, v in item.record.items() if _is_buffer(v)] \
                        if item.record is not None else []
                    size = sum(memoryview(item.record[k]).nbytes for k in bufs)
                    if items and (used + size > SLOT_BYTES or len(items) >= _CHUNK_ITEMS):
                        out.send(_Chunk(p, slot, items))
                        slot, used, items = _free_slot(free, done, parent), 0, []
                    if size > SLOT_BYTES:  # alone, in the message (the parts protocol)
                        record = {k: bytes(v) if isinstance(v, memoryview) else v
                                  for k, v in item.record.items()}
                        out.send(_Chunk(p, slot, [item._replace(record=record)]))
                        slot = _free_slot(free, done, parent)
                        continue
                    if bufs:
                        record = dict(item.record)
                        base = slot * SLOT_BYTES
                        for k in bufs:
                            data = memoryview(record[k]).cast("B")
                            n = len(data)
                            view[base + used:base + used + n] = data
                            record[k] = _Span(used, n)
                            used += n
                        item = item._replace(record=record)
                    items.append(item)
            except _Stopped:
                raise
            except Exception as exc:  # shipped to the parent, raised there
                out.send(_Chunk(p, slot, items, error=_pickled_error(exc) or b"",
                                trace=traceback.format_exc()))
                return
            out.send(_Chunk(p, slot, items, end=True))
    except (_Stopped, BrokenPipeError):
        return


def _give_slot(free, slot: int) -> None:
    try:
        free.send_bytes(slot.to_bytes(4, "little"))
    except BrokenPipeError:
        pass  # the worker has sent all its parts and returned


def _next_chunk(out, proc, w: int) -> _Chunk:
    try:
        while not out.poll(POLL_S):
            if not proc.is_alive():
                raise EOFError
        return out.recv()
    except EOFError:  # its end of the pipe closed: it is gone
        proc.join(JOIN_S)
        raise PackError(f"pack worker {w} (pid {proc.pid}) died (exit code {proc.exitcode}) "
                        "while reading the source") from None


def _raise_from(chunk: _Chunk, w: int, proc) -> None:
    where = f"in pack worker {w} (pid {proc.pid}):\n{chunk.trace}"
    exc = pickle.loads(chunk.error) if chunk.error else None
    if not isinstance(exc, BaseException):
        raise PackError(f"reading the source failed {where}")
    exc.add_note(where)
    raise exc


def _trim_heap() -> None:
    """Hand the memory the allocators keep free back to the system before a fork.

    A forked worker allocating from pages its parent freed copies each on first
    write; fresh pages cost only a fault. Measured: a Parquet part read in a fresh
    fork ran 4.1-5.7k records/s against 8-9k in its parent; after this, 6.8-9.4k.
    """
    import ctypes
    import sys

    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].default_memory_pool().release_unused()
    try:
        ctypes.CDLL(None).malloc_trim(0)  # glibc; elsewhere there is none to call
    except (AttributeError, OSError):
        pass


def iter_parts(parts: list, images: list[str], work: WorkOptions, workers: int
               ) -> Iterator[Item]:
    """The items of every part in order, read and prepared in worker processes (the
    parts protocol above). Needs ``fork``.

    Raises:
        Whatever reading a part raised (the original exception, with a note naming
        the worker and its traceback); PackError when a worker dies.
    """
    import mmap
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    n = min(workers, len(parts))
    ring = mmap.mmap(-1, n * SLOTS_PER_WORKER * SLOT_BYTES)
    view = memoryview(ring)
    pipes = [_Pipes(ctx.Pipe(duplex=False), ctx.Pipe(duplex=False)) for _ in range(n)]
    done = ctx.Event()
    procs = [ctx.Process(target=part_worker, name=f"shardpack-part-{w}", daemon=True,
                         args=(w, pipes, parts, list(range(w, len(parts), n)), images, work,
                               ring, done, os.getpid()))
             for w in range(n)]
    try:
        _trim_heap()
        for p in procs:
            p.start()
        for p in pipes:
            p.free[0].close()
            p.out[1].close()
        for w, p in enumerate(pipes):
            for slot in range(w * SLOTS_PER_WORKER, (w + 1) * SLOTS_PER_WORKER):
                _give_slot(p.free[1], slot)
        for part in range(len(parts)):
            w = part % n
            while True:
                chunk = _next_chunk(pipes[w].out[0], procs[w], w)
                if chunk.part != part:
                    raise PackError(f"pack worker {w} sent part {chunk.part}, expected {part}")
                base = chunk.slot * SLOT_BYTES
                for item in chunk.items:
                    if item.record is not None:
                        record = item.record
                        for k, v in record.items():
                            if type(v) is _Span:
                                record[k] = bytes(view[base + v.offset:base + v.offset + v.length])
                _give_slot(pipes[w].free[1], chunk.slot)
                yield from chunk.items
                if chunk.error is not None:
                    _raise_from(chunk, w, procs[w])
                if chunk.end:
                    break
    finally:
        done.set()
        for p in pipes:
            for conn in (*p.free, *p.out):
                conn.close()
        for p in procs:
            if p.pid is not None:
                p.join(JOIN_S)
                if p.is_alive():
                    p.terminate()
                    p.join(JOIN_S)
                if p.is_alive():
                    p.kill()
                    p.join()
        view.release()
        ring.close()
