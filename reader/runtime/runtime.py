"""The runtime: every process, buffer and cache a Loader's batches pass through.

A :class:`Runtime` owns the slot ring (:mod:`~reader.runtime.slots`), the worker
pool (:mod:`~reader.runtime.worker`), the GPU state of a ``device="cuda"`` sink
(:mod:`~reader.runtime.sinks`), the decoded cache
(:mod:`~reader.runtime.decoded_cache`), a remote dataset's shard prefetch and
``num_workers="auto"``'s scaler (:mod:`~reader.runtime.autoscale`).

Layering (DESIGN.md, "Layers call downward and hear upward"): the Loader builds a
Runtime from checked options, the order and the batch plan, then calls it
downward: :meth:`Runtime.epoch` (start an epoch at a position; the returned
iterator's ``next()`` is the next batch), :meth:`Runtime.resize` and
:meth:`Runtime.close`. The runtime never holds or calls the Loader: what happens
inside it (a batch timed, the worker count changed) goes upward as events to the
:class:`Listener` objects in :attr:`Runtime.listeners` (the monitor, the
autoscaler's log). The epochs it starts (:mod:`~reader.runtime.epoch`) read this
object and call its methods; the shutdown protocol they follow is the block at
the top of :mod:`reader.runtime.epoch`.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import sys
import time
from functools import partial
from typing import Protocol

import numpy as np

from formats import ShardDataset
from formats.errors import ArgumentError

from ..data.dataset import key_words
from ..errors import LoaderError
from ..options import DEFAULT_RING_BYTES, DecodedCacheOptions, DeviceOptions, WorkerOptions
from .autoscale import ScaleChange, WorkerScaler
from .decoded_cache import DecodedCache
from .epoch import Cursor, Epoch, RawEpoch
from .plan import BatchPlan
from .sinks import CpuSink, CudaSink, cuda_state
from .slots import SlotRing
from .split import SplitController
from .timing import BatchTiming
from .worker import BatchSpec, WorkerPool

__all__ = ["Listener", "Order", "Runtime", "check_decoded_cache"]

log = logging.getLogger(__name__)


class Order(Protocol):
    """What the runtime asks of an order (:class:`reader.batching.sampler.Sampler` and the
    bound batch samplers of :mod:`reader.batching.batching`)."""

    def batch(self, epoch: int, k: int) -> np.ndarray: ...

    def num_batches_in(self, epoch: int) -> int: ...


class Listener(Protocol):
    """Who hears the runtime: called in the main process, in delivery order."""

    def on_batch(self, timing: BatchTiming) -> None:
        """A batch was delivered; ``timing`` is its :class:`BatchTiming`."""

    def on_workers_changed(self, n: int, change: ScaleChange) -> None:
        """``num_workers="auto"`` moved to ``n`` running workers, for ``change.reason``."""


_LEFT_MAPPED: list = []  # rings a hung GPU decode may still read (release_ring)


class Runtime:
    """The processes, ring, sink, caches and prefetch behind one Loader.

    Args:
        dataset: the open dataset (a remote one has a ``prefetcher``).
        order: which records make batch ``k`` of an epoch.
        plan: the batch plan (:func:`reader.runtime.plan.plan_batch`).
        spec: what a worker builds (:class:`reader.runtime.worker.BatchSpec`), without
            the decoded cache: the runtime makes that and puts it in.
        fields: the fields of a batch (raw mode reads them all here).
        options: the process options (:class:`reader.options.WorkerOptions`).
        num_workers: worker processes to start (``"auto"`` already resolved).
        auto: ``num_workers="auto"``: measure and adjust the count while running.
        raw: ``decode=False``: batches read in this process, no ring, no workers.
        device_options: the GPU sink's options, or None for the CPU sink.
        rank: this loader's rank (picks the GPU).
        decoded_cache: keep decoded images for later epochs, or None.
        gpu_decode: ``decode_device`` resolved to ``"cuda"`` (:mod:`~reader.runtime.gpu_decode`):
            each batch is split between the GPU and the workers (:mod:`~reader.runtime.split`).
        tolerant: ``on_error="skip"``: a record the GPU cannot decode is skipped.
    """

    def __init__(self, dataset: ShardDataset, order: Order, plan: BatchPlan, spec: BatchSpec,
                 fields: tuple[str, ...], options: WorkerOptions, *, num_workers: int,
                 auto: bool = False, raw: bool = False,
                 device_options: DeviceOptions | None = None, rank: int = 0,
                 decoded_cache: DecodedCacheOptions | None = None,
                 gpu_decode: bool = False, tolerant: bool = False) -> None:
        self.dataset = dataset
        self.order = order
        self.plan = plan
        self.fields = fields
        self.options = options
        self.raw = raw
        self.device_options = device_options
        self.rank = rank
        self.scaler: WorkerScaler | None = None
        if auto and not raw and num_workers:
            self.scaler = WorkerScaler(num_workers)
            num_workers = self.scaler.start
        self.num_workers = num_workers
        self.listeners: list[Listener] = []
        self.cursor = Cursor()  # epoch, position (next batch to deliver), skipped, slowest
        self.decoded_cache = self._make_decoded_cache(decoded_cache, plan)
        self.spec = dataclasses.replace(spec, cache=self.decoded_cache)
        self.ring: SlotRing | None = None  # created with the first epoch that needs it
        self.pool: WorkerPool | None = None  # persistent_workers only
        self.cuda = None  # the GPU state (sinks.cuda_state), made with the first CUDA epoch
        # decode_device resolved to "cuda": each batch split by the controller, and
        # whether a record the GPU cannot decode is skipped (on_error="skip").
        self.split = (SplitController(fixed=device_options.gpu_share)
                      if gpu_decode else None)
        self.tolerant = tolerant
        self.closed = False
        self._t0 = time.monotonic()

    # -- called by the Loader --------------------------------------------------------

    def epoch(self, epoch: int, position: int) -> Epoch | RawEpoch:
        """An iterator over ``epoch``'s batches from ``position`` (the cursor moves there)."""
        if self.closed:
            raise LoaderError("this Loader is closed")
        self.cursor.epoch, self.cursor.position = epoch, position
        return RawEpoch(self) if self.raw else Epoch(self)

    def resize(self, n: int, change: ScaleChange | None = None) -> None:
        """Run ``n`` workers (in the running epoch's pool, if any, and from the next
        epoch on); listeners hear of it with ``change`` (the scaler's decision, when
        ``num_workers="auto"`` made it; else one naming the caller)."""
        if n < 1:
            raise ArgumentError(f"a runtime with workers runs at least one, not {n}")
        before = self.num_workers
        pool = self.active_pool or self.pool
        if pool is not None and pool.running != n:
            pool.resize(n)
        self.num_workers = n
        if change is None:
            change = ScaleChange(at_s=time.monotonic() - self._t0, before=before, after=n,
                                 reason="resized by its caller")
        log.info("workers %d -> %d: %s", change.before, change.after, change.reason)
        for listener in self.listeners:
            listener.on_workers_changed(n, change)

    def worker_pids(self) -> list[int]:
        """The processes of the workers running now (the monitor's CPU figures)."""
        pool = self.active_pool or self.pool
        return [p.pid for p in pool.processes] if pool is not None else []

    def forget_after_fork(self) -> None:
        """In a forked child: the ring and the workers are the parent's; leave them alone."""
        self.ring = self.pool = self.active_pool = None
        self.cuda = None

    def close(self) -> None:
        """Stop the workers, release the ring and the decoded cache. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.release_ring()
        if self.decoded_cache is not None:
            self.decoded_cache.close()  # after the workers: none of them still writes to it

    # -- called by the epochs (reader.runtime.epoch) -----------------------------------

    active_pool: WorkerPool | None = None  # the running epoch's pool

    def emit_batch(self, timing: BatchTiming) -> None:
        for listener in self.listeners:
            listener.on_batch(timing)

    def make_sink(self) -> CpuSink | CudaSink:
        if self.device_options is None:
            return CpuSink(copy=self.options.copy)
        if self.cuda is None:
            self.cuda = cuda_state(self.device_options, self.rank)
        gpu = (self.cuda.gpu_stage(self.tolerant, partial(key_words, self.dataset))
               if self.split is not None else None)
        return CudaSink(self.cuda, self.plan.image, gpu, self.options.timeout)

    def depths(self, hold: int) -> tuple[int, int, int]:
        """(lowest, starting, highest) batches in flight; the ring has highest + hold slots."""
        w, slot_bytes = self.options, self.plan.layout.slot_bytes
        nw = max(self.num_workers, 1)
        # With num_workers="auto" the ring is sized once for the most workers it may get
        # (only the slots in use are ever touched: free slots are taken last-in first-out).
        hi = w.max_prefetch or max(2, 4 * (self.scaler.hi if self.scaler else nw))
        if w.prefetch != "auto":
            hi = max(hi, w.prefetch) if w.max_prefetch is None else w.max_prefetch
        fits = w.max_ring_bytes // slot_bytes - hold
        if fits < 1 and w.max_ring_bytes != DEFAULT_RING_BYTES:
            need = (1 + hold) * slot_bytes
            raise ArgumentError(f"max_ring_bytes={w.max_ring_bytes:,} cannot hold one batch in "
                                f"flight and the {hold} the consumer may hold: slots of "
                                f"{slot_bytes:,} bytes need at least {need:,}")
        hi = max(1, min(hi, fits))  # the default bound gives way to one batch in flight
        if self.num_workers == 0:
            return 1, 1, 1
        if w.prefetch != "auto":
            p = min(w.prefetch, hi)
            return p, p, p
        lo = min(nw, hi)
        return lo, min(2 * nw, hi), hi

    def ensure_ring(self, slots: int) -> SlotRing:
        if self.ring is None or self.ring.num_slots < slots:
            self.release_ring()
            backend = "anon" if self.start_method() == "fork" or self.num_workers == 0 else "shm"
            self.ring = SlotRing(self.plan.layout, slots, backend)
        return self.ring

    def acquire_pool(self, ring: SlotRing) -> WorkerPool:
        """Workers for an epoch: the persistent pool when it is usable, else new ones."""
        pool = self.pool
        if pool is not None and (pool.ring is not ring or not pool.alive()):
            if pool.ring is ring:
                log.warning("a persistent worker exited between epochs; starting new workers")
            self.drop_pool(pool)
            pool = None
        if pool is None:
            pool = WorkerPool(mp.get_context(self.start_method()), self.num_workers,
                              self.dataset, ring, self.spec)
            if self.options.persistent_workers:
                self.pool = pool
        self.active_pool = pool
        return pool

    def keeps(self, pool: WorkerPool) -> bool:
        """The runtime keeps ``pool`` across epochs (``persistent_workers``)."""
        return pool is self.pool

    def drop_pool(self, pool: WorkerPool | None = None) -> None:
        """Stop ``pool`` (default: the persistent one), forgetting it if it is that one."""
        pool = pool or self.pool
        if pool is None:
            return
        if self.pool is pool:
            self.pool = None
        if self.active_pool is pool:
            self.active_pool = None
        pool.stop()

    def release_pool(self, pool: WorkerPool) -> None:
        """An epoch is done with ``pool`` (kept, if persistent)."""
        if self.active_pool is pool:
            self.active_pool = None

    def start_prefetch(self, epoch: int, first_batch: int):
        """A started shard prefetcher for a remote dataset, else None."""
        start = getattr(self.dataset, "prefetcher", None)
        n = self.order.num_batches_in(epoch)
        if start is None or first_batch >= n:
            return None
        order = self.order
        return start(lambda k: order.batch(epoch, k), n, first_batch, self.num_workers + 1)

    def release_ring(self) -> None:
        self.drop_pool()  # its workers write into this ring
        if self.ring is None:
            return
        if self.cuda is not None and not self.cuda.release():
            # A GPU decode never returned and may still read the ring: left mapped (and
            # page-locked) until the process exits rather than freed under it.
            _LEFT_MAPPED.append(self.ring)
        else:  # unregistered (page-unlocked) before the memory is unmapped
            self.ring.close()
        self.ring = None

    def start_method(self) -> str:
        m = self.options.start_method
        if m is not None:
            return m
        return "fork" if sys.platform.startswith("linux") else "spawn"

    def _make_decoded_cache(self, opts: DecodedCacheOptions | None,
                            plan: BatchPlan) -> DecodedCache | None:
        if opts is None or plan.sample is not None:
            return None  # refused, where it could never serve, by the Loader's check_decoded_cache
        method = self.start_method()
        return DecodedCache(opts, len(self.dataset), mp.get_context(method).Lock(),
                            named=method != "fork")


def check_decoded_cache(opts: DecodedCacheOptions | None, plan: BatchPlan) -> None:
    """Refuse a decoded cache ``plan`` could never use or fill (the Loader checks this
    with its other options, before it builds the runtime).

    Raises:
        ArgumentError: no image is decoded, the pipeline cannot replay its geometry
            on cached pixels, or ``max_bytes`` is below one output image.
    """
    if opts is None or plan.sample is not None:
        return
    pipeline = plan.pipeline
    if plan.image is None:
        raise ArgumentError("decoded_cache keeps decoded images: this loader decodes none "
                            "(decode=False, or no image field among the fields read)")
    if not hasattr(pipeline, "run_cached"):
        raise ArgumentError("decoded_cache needs a pipeline of reader.transforms specs (it "
                            f"replays their geometry on cached pixels), not {pipeline!r}")
    one = int(np.prod(pipeline.output_shape))
    if opts.max_bytes < one:
        raise ArgumentError(f"decoded_cache max_bytes={opts.max_bytes:,} is smaller than "
                            f"one output image ({'x'.join(map(str, pipeline.output_shape))}"
                            f" = {one:,} bytes): it could never hold a sample")
