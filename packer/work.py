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
"""

from __future__ import annotations

import errno
import functools
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import simplejpeg

from formats.errors import MissingObjectError, ObjectTooLargeError, StorageError
from formats.media import JPEG_SUFFIXES, MAX_PIXELS
from formats.sniff import (
    image_kind,
    image_size,
    is_gray,
    jpeg_frame,
    jpeg_unsupported,
    looks_complete,
)

from .errors import _Bad

__all__ = ["MAX_OBJECT_BYTES", "Loaded", "WorkOptions", "iter_loaded", "load",
           "os_error", "prepare", "process_pool", "read_file", "worker_init"]

# One input read from object storage is refused beyond this (a bound on memory).
MAX_OBJECT_BYTES = 1 << 30
# Object stores answer in milliseconds, not microseconds: reads overlap in threads.
FETCH_THREADS = 16


class Loaded(NamedTuple):
    """One input after :func:`load`.

    ``data`` is the bytes to store (None when skipped), ``width``/``height`` its
    size, ``nbytes_in`` the bytes read from the source, ``kind``/``reason`` the
    skip kind and words when bad, ``header`` the (width, height) the input's
    header gave (what a source's own size is checked against; it differs from
    the stored size when the image was shrunk).
    """

    data: bytes | None
    width: int | None
    height: int | None
    nbytes_in: int
    kind: str | None = None
    reason: str | None = None
    header: tuple[int, int] | None = None


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
        max_pixels: a larger image (by its header) is bad input, kind ``too-large``.
        keep_unsupported: keep a JPEG the Loader's decoder cannot read (kind
            ``unsupported-jpeg``) byte for byte instead.
        verify_decode: decode every image once (``corrupt`` when it fails), not only
            those re-encoded.
    """

    image_type: str = "jpeg"
    max_side: int | None = None
    quality: int = 90
    to_jpeg: bool = False
    location: Any = None
    max_pixels: int = MAX_PIXELS
    keep_unsupported: bool = False
    verify_decode: bool = False

    @property
    def needs_processes(self) -> bool:
        """Whether per-file work is heavy enough for worker processes."""
        return self.max_side is not None or self.to_jpeg or self.verify_decode


def read_file(path: str, max_bytes: int | None = None) -> bytes:
    """A whole local file (``max_bytes``: larger is an ``EFBIG`` OSError, a bound on memory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if max_bytes is not None and size > max_bytes:
            raise OSError(errno.EFBIG, f"larger than the {max_bytes:,}-byte limit on one file",
                          path)
        data = os.read(fd, size) if size else b""
        while len(data) < size:  # short reads are legal; rare on regular files
            more = os.read(fd, size - len(data))
            if not more:
                break
            data += more
        return data
    finally:
        os.close(fd)


def os_error(path: str, exc: OSError) -> Loaded:
    """An OSError reading ``path`` as bad input: its skip kind and reason."""
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

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>: the signal a process gets when its parent dies
# The smallest GIF (1x1): whether this OpenCV decodes GIF at all (4.11 and later do).
_TINY_GIF = bytes.fromhex("47494638396101000100800000ffffff00000021f904010000"
                          "00002c00000000010001000002024401003b")


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


def _resize_jpeg(data: bytes, width: int, height: int, opts: WorkOptions, gray: bool,
                 scalable: bool):
    tw, th = _target(width, height, opts.max_side)
    colorspace = "GRAY" if gray else "RGB"
    # DCT scaling decodes straight to the smallest scale (n/8) at least the target size;
    # a lossless JPEG has no DCT (a scaled decode of one crashes simplejpeg): whole.
    # ``scalable`` comes from the frame the caller read (formats.sniff.jpeg_frame).
    scale = {"min_height": th, "min_width": tw} if scalable else {}
    arr = simplejpeg.decode_jpeg(data, colorspace, **scale)
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


def _decode(data: bytes, kind: str, gray: bool) -> np.ndarray:
    """Every pixel of a non-JPEG image at its own depth (alpha kept unless ``gray``)."""
    import cv2

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


def _to_jpeg(data: bytes, kind: str, opts: WorkOptions):
    """``data`` as a JPEG at ``opts.quality``, within ``opts.max_side`` (see the notes)."""
    import cv2

    arr = _decode(data, kind, gray=is_gray(data, kind))
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

    arr = _decode(data, kind, gray=False)
    width, height = _target(width, height, opts.max_side)
    arr = _resize(arr, width, height)
    ok, buf = cv2.imencode(".png", arr, [cv2.IMWRITE_PNG_COMPRESSION, 6])
    if not ok:
        raise _Bad("unsupported", f"{kind.upper()} of shape {arr.shape} cannot be a PNG")
    return buf.tobytes(), width, height

def load(path: str, opts: WorkOptions) -> Loaded:
    """Read one file and make it ready to store; bad input comes back as a kind."""
    try:
        data = read_file(path) if opts.location is None else \
            opts.location.read_bytes(path, MAX_OBJECT_BYTES)
    except OSError as exc:
        return os_error(path, exc)
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
        data: the input's bytes, already in memory (bytes, or a read-only
            memoryview: handed on uncopied unless re-encoded).
        name: a path or a record's key; its extension picks the skip kind for data
            with no image signature (``corrupt`` for a .jpg, else ``not-an-image``).
        opts: what to do with it.

    Returns:
        The bytes to store with their size, or the skip kind and reason: bad input
        comes back as a kind (``empty``, ``corrupt``, ``truncated``, ``not-an-image``,
        ``not-a-jpeg``, ``unsupported``, ``unsupported-jpeg``, ``too-large``), never
        raised.
    """
    n = len(data)
    if not n:
        return Loaded(None, None, None, 0, "empty", "zero-byte file")
    kind = image_kind(data)
    try:
        if kind == "jpeg":
            return _prepare_jpeg(data, n, opts)
        if kind is None:
            bad = "corrupt" if os.path.splitext(name)[1].lower() in JPEG_SUFFIXES else "not-an-image"
            raise _Bad(bad, "no known image signature")
        return _prepare_other(data, kind, n, opts)
    except _Bad as exc:
        return Loaded(None, None, None, n, exc.kind, exc.reason)


def _within_budget(width: int, height: int, name: str, opts: WorkOptions) -> None:
    """The pixel budget (:data:`formats.media.MAX_PIXELS`), from the header alone."""
    if width * height > opts.max_pixels:
        raise _Bad("too-large", f"{name} header declares {width}x{height} = "
                   f"{width * height:,} pixels, more than the {opts.max_pixels:,}-pixel "
                   "budget (--max-pixels raises it)")


def _prepare_jpeg(data: bytes, n: int, opts: WorkOptions) -> Loaded:
    """A JPEG is admitted by its frame header (:func:`formats.sniff.jpeg_unsupported`:
    what the Loader's decoder reads), its size and its end marker; it is decoded only
    to re-encode, or when lossless (whether one decodes depends on its colour
    transform, which no header field says)."""
    try:
        frame = jpeg_frame(data)
    except ValueError as exc:
        raise _Bad("corrupt", f"bad JPEG header ({exc})") from None
    unsupported = jpeg_unsupported(frame)
    _refuse_unsupported(unsupported, opts)
    _within_budget(frame.width, frame.height, "JPEG", opts)
    if not looks_complete(data, "jpeg"):
        raise _Bad("truncated", "JPEG has no end-of-image marker")
    if unsupported is None:
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except (ValueError, KeyError) as exc:  # KeyError: a sampling simplejpeg cannot name
            raise _Bad("corrupt", f"bad JPEG header ({exc})") from None
        if frame.lossless:
            unsupported = _lossless_problem(data)
            _refuse_unsupported(unsupported, opts)
    if unsupported is not None:  # kept, as asked: stored byte for byte, never decoded
        if opts.max_side is not None and max(frame.width, frame.height) > opts.max_side:
            raise _Bad("unsupported-jpeg", f"JPEG with {unsupported}: it cannot be shrunk "
                       f"to --max-side {opts.max_side}")
        return Loaded(data, frame.width, frame.height, n, header=(frame.width, frame.height))
    header = (width, height)
    if opts.max_side is not None and max(width, height) > opts.max_side:
        try:
            data, width, height = _resize_jpeg(data, width, height, opts,
                                               colorspace.upper() == "GRAY",
                                               scalable=not frame.lossless)
        except ValueError as exc:
            raise _Bad("corrupt", f"JPEG does not decode ({exc})") from None
    elif opts.verify_decode and not frame.lossless:  # a lossless one was decoded above
        _verify_jpeg(data)
    return Loaded(data, width, height, n, header=header)


def _verify_jpeg(data: bytes) -> None:
    """``--verify-decode``: the whole image decoded as the Loader decodes it (strict:
    libjpeg-turbo's warnings, such as a scan with extraneous or missing bytes, fail)."""
    try:
        simplejpeg.decode_jpeg(data, "RGB")
    except ValueError as exc:
        raise _Bad("corrupt", f"JPEG does not decode ({exc})") from None


def _refuse_unsupported(unsupported: str | None, opts: WorkOptions) -> None:
    if unsupported is not None and not opts.keep_unsupported:
        raise _Bad("unsupported-jpeg", f"JPEG with {unsupported}; --keep-unsupported keeps "
                   "such files as they are")


def _lossless_problem(data: bytes) -> str | None:
    """Why the Loader cannot decode a lossless JPEG, or None: libjpeg-turbo converts no
    colours in lossless mode, so only a frame stored as RGB decodes to RGB (tried
    here, as the Loader decodes; lossless files are rare, the decode affordable).

    Raises:
        _Bad: ``corrupt``, the decode fails for another reason.
    """
    try:
        simplejpeg.decode_jpeg(data, "RGB")
    except ValueError as exc:
        if "color conversion" in str(exc):
            return "a lossless frame whose colours the decoder cannot convert to RGB"
        raise _Bad("corrupt", f"JPEG does not decode ({exc})") from None
    return None


def _prepare_other(data: bytes, kind: str, n: int, opts: WorkOptions) -> Loaded:
    name = kind.upper()
    if not opts.to_jpeg and opts.image_type != "image":
        raise _Bad("not-a-jpeg", f"{name} data in a jpeg dataset (use --to-jpeg, or name "
                   f"it .{kind})")
    try:
        height, width = image_size(data, kind)
    except ValueError as exc:
        raise _Bad("corrupt", f"{name} header does not parse ({exc})") from None
    _within_budget(width, height, name, opts)
    if not looks_complete(data, kind):
        raise _Bad("truncated", f"{name} is shorter than its header says, or has no end marker")
    header = (width, height)
    if opts.to_jpeg:
        data, width, height = _to_jpeg(data, kind, opts)
    elif opts.max_side is not None and max(width, height) > opts.max_side:
        data, width, height = _shrink_to_png(data, kind, width, height, opts)
    elif opts.verify_decode:
        _decode(data, kind, gray=False)  # raises corrupt (or unsupported) as a re-encode would
    return Loaded(data, width, height, n, header=header)

# -- running it over a listing --------------------------------------------------------

def _load_chunk(args: tuple[list[str], WorkOptions]) -> list[Loaded]:
    paths, opts = args
    return [load(p, opts) for p in paths]


def worker_init(parent: int) -> None:
    """A packer worker process's initializer (``initargs=(os.getpid(),)``).

    Ctrl-C goes to the whole process group, and the parent alone handles it (and stops
    its workers); workers printing their own tracebacks would only confuse. A worker
    dies with its parent (Linux's parent-death signal): a pack killed outright (SIGKILL,
    the OOM killer) must not leave workers that go on writing into DST and holding its
    lock, which would refuse the resume."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: a stray worker ends with its pipe
        return
    if os.getppid() != parent:  # the parent died before prctl could take effect
        os._exit(1)


def process_pool(workers: int, executor: bool = False):
    """The packer's one way to start worker processes: ``workers`` of them, each run
    through :func:`worker_init` (Ctrl-C ignored, death with the parent).

    fork where there is one: spawn would re-import numpy/pyarrow per worker, and the
    parent holds no lock a worker needs (a worker touches only its own inputs and
    outputs).

    Args:
        workers: processes in the pool.
        executor: a ``concurrent.futures.ProcessPoolExecutor`` (futures, a broken pool
            noticed) instead of a ``multiprocessing.Pool`` (ordered ``imap``).
    """
    import multiprocessing as mp

    ctx = mp.get_context("fork") if hasattr(os, "fork") else mp.get_context()
    initargs = (os.getpid(),)
    if executor:
        from concurrent.futures import ProcessPoolExecutor

        return ProcessPoolExecutor(workers, mp_context=ctx, initializer=worker_init,
                                   initargs=initargs)
    return ctx.Pool(workers, initializer=worker_init, initargs=initargs)


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
        with process_pool(workers) as pool:
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
