"""Builds batches into ring slots, in a worker process or in the main process.

A worker's life (see "Shutdown protocol" in :mod:`reader.runtime.epoch`): it takes
:class:`Task` records from the shared task queue, writes the batch into
``ring.slot_view(slot)``, and answers on the done queue with a small named record
(:class:`BatchDone`, :class:`BatchFailed` or :class:`BatchStale`). Sample data
never crosses a queue. A ``None`` task, the done event, or
its parent's death (checked on every idle second) ends it. :class:`WorkerPool`
starts and stops a set of workers.
"""

from __future__ import annotations

import multiprocessing.process
import os
import pickle
import queue
import signal
import time
import traceback
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from formats.errors import CorruptRecordError

from ..data.dataset import key_words, page_in
from ..errors import DecodeError
from ..transforms.bad_input import VALID_FIELD, BadInput
from ..transforms.kernels import KERNELS
from ..transforms.sample import SampleBuilder
from .gpu_decode import PLAN as GPU_PLAN
from .gpu_decode import Stager
from .leases import own_fork
from .timing import WorkerTiming, stored_bytes

__all__ = ["BatchBuilder", "BatchDone", "BatchFailed", "BatchSpec", "BatchStale", "Task",
           "WorkerPool", "batch_rng", "worker_loop"]

IDLE_POLL_S = 1.0
RETIRE = "retire"  # the task that makes one worker exit once its answers are sent


class Task(NamedTuple):
    """Build batch ``batch`` of ``epoch`` from records ``indices`` into ``slot``; a
    ``generation`` that is no longer the pool's is answered stale, unbuilt."""

    batch: int
    slot: int
    epoch: int
    indices: np.ndarray
    generation: int
    gpu: int = 0  # records 0..gpu-1 staged for the GPU decode (reader.runtime.gpu_decode)


class BatchDone(NamedTuple):
    """A batch is in its slot. ``shapes``: the shape of each varying-size field's
    array in the slot (:mod:`reader.transforms.collate`), empty when there are none.
    ``replaced``: ``(position, record, replacement)`` of each bad record the builder
    replaced (``on_error="replace"``, :mod:`reader.transforms.bad_input`), by position;
    the main process reads the batch's main-process fields from the replacements and
    records them in the quarantine."""

    batch: int
    slot: int
    worker: int
    pid: int
    timing: WorkerTiming
    shapes: dict
    replaced: tuple = ()


class BatchFailed(NamedTuple):
    """Building a batch raised: ``error`` is :func:`error_message`'s triple."""

    batch: int
    slot: int
    worker: int
    pid: int
    record: int | None
    error: tuple
    traceback: str


class BatchStale(NamedTuple):
    """A cancelled task, answered without being built (the slot was not touched)."""

    batch: int
    slot: int


@dataclass(frozen=True)
class BatchSpec:
    """What a worker writes into a slot, fixed for the loader's lifetime.

    Args:
        image_field: the field decoded through ``pipeline`` (None: no image).
        pipeline: an object with ``output_shape`` and
            ``run(view, out, rng) -> (decode_s, transform_s)`` (see
            :mod:`reader.transforms.imaging`).
        slot_fields: ``(name, type)`` of the int/float/fixed ndarray fields
            gathered into the slot.
        bad_input: what a sample that does not decode becomes
            (:class:`reader.transforms.bad_input.BadInput`, ``on_error`` resolved).
        seed: base seed of the per-batch random streams.
        rank: this loader's rank (part of the stream seed).
        cache: a :class:`reader.runtime.decoded_cache.DecodedCache` the pipeline reads
            decoded images from and keeps them in (None: decode every time).
        sample: the sample path's plan (:class:`reader.transforms.sample.SampleSpec`) when the
            loader reads annotations, varying-size images or arrays, or runs
            sample callables; None: the classification path.
        main_fields: the fields the main process reads (``BatchPlan.main_fields``): under
            ``on_error="replace"`` the builder checks their checksums too, so a record
            damaged there is replaced with the rest of it rather than failing at delivery.
    """

    image_field: str | None
    pipeline: Any
    slot_fields: tuple[tuple[str, str], ...]
    bad_input: BadInput
    seed: int
    rank: int
    cache: Any = None
    sample: Any = None
    main_fields: tuple[str, ...] = ()


def batch_rng(spec: BatchSpec, epoch: int, batch: int) -> np.random.Generator:
    """The random stream of one batch: the same whoever builds it."""
    return np.random.default_rng([spec.seed, int(epoch), spec.rank, int(batch)])


class BatchBuilder:
    """Fills slot arrays for given record indices; returns ``(timing, shapes, replaced)``.

    ``current`` is the global index of the record being worked on, so a failure
    can name it.
    """

    def __init__(self, ds, spec: BatchSpec) -> None:
        self.ds = ds
        self.spec = spec
        self._current: int | None = None
        self._image = KERNELS["image"]  # the classification path's kernel
        self._sample = None
        if spec.sample is not None:
            self._sample = SampleBuilder(ds, spec.sample, spec.pipeline, spec.bad_input)
        # Every field a batch reads (the worker's and the main process's): a damaged
        # record is one whose read of any of them fails (on_error="replace").
        s = spec.sample
        names = [spec.image_field, *(n for n, _ in spec.slot_fields), *spec.main_fields]
        if s is not None:
            names += [*(n for n, _, _ in s.decoded), *(f.name for f in s.arrays),
                      *(n for n, _ in s.decoders)]
        self._read_fields = tuple(dict.fromkeys(n for n in names if n is not None))
        # BatchTiming.bytes: what paging in counts (the image, the sample path's decoded
        # fields), plus the stored bytes of the other fields built here (a scalar's are
        # 8 a record: no gather on the classification path). The main process adds the
        # fields it serves (reader.runtime.epoch), and only when a monitor listens.
        paged = {spec.image_field, *spec.main_fields}
        if s is not None:
            paged.update(n for n, _, _ in s.decoded)
        self._unpaged = tuple(n for n in self._read_fields if n not in paged)

    @property
    def current(self) -> int | None:
        if self._sample is not None and self._sample.current is not None:
            return self._sample.current
        return self._current

    @current.setter
    def current(self, value: int | None) -> None:
        self._current = value
        if self._sample is not None:
            self._sample.current = value

    def build(self, indices: np.ndarray, arrays: dict[str, np.ndarray],
              rng: np.random.Generator, gpu: int = 0) -> tuple[WorkerTiming, dict, tuple]:
        """Build the batch of records ``indices`` into ``arrays`` with the batch's random
        stream ``rng``, staging its first ``gpu`` records for the GPU decode; returns
        ``(timing, shapes, replaced)`` (``replaced``: see :class:`BatchDone`)."""
        policy = self.spec.bad_input
        try:
            if policy.replaces:
                return self._build_replacing(indices, arrays, rng)
            return (*self._build(indices, arrays, rng, gpu), ())
        except DecodeError as exc:
            # A DecodeError the policy let through (on_error="fail") names its record.
            raise self._corrupt(self.current, exc) from None

    def _build_replacing(self, indices, arrays, rng) -> tuple[WorkerTiming, dict, tuple]:
        """``on_error="replace"``: build; while some records were bad (marked in the
        ``valid`` mask, or failing a read), put their replacements in their places
        (:meth:`reader.transforms.bad_input.BadInput.substitutes`) and build the batch
        again from the same random stream, as its order would with them in place."""
        t0 = time.perf_counter()
        start = rng.bit_generator.state
        valid = arrays.get(VALID_FIELD)
        served, subs = indices, None
        while True:
            try:
                timing, shapes = self._build(served, arrays, rng)
                bad = np.flatnonzero(~valid[:len(served)]) if valid is not None else ()
            except CorruptRecordError:  # a read failed its checksum (or its decode)
                bad = self._damaged(served)
                if not len(bad):
                    raise  # not a record's damage: as under on_error="fail"
            if not len(bad):
                break
            if subs is None:
                subs = self.spec.bad_input.substitutes(self.ds, indices)
            served = subs.replace(bad)
            rng.bit_generator.state = start
        if subs is None:
            return timing, shapes, ()
        # The rounds that found bad records are the batch's time too.
        return timing._replace(busy_s=time.perf_counter() - t0), shapes, subs.replaced()

    def _damaged(self, indices: np.ndarray) -> list[int]:
        """Positions of the batch whose record fails a read of a field the batch reads
        (its checksum, or the dataset's decode of the field), record by record."""
        bad = []
        for i, r in enumerate(indices.tolist()):
            for name in self._read_fields:
                try:
                    self.ds.get(r, name)
                except CorruptRecordError:
                    bad.append(i)
                    break
        return bad

    def _build(self, indices, arrays, rng, gpu: int = 0) -> tuple[WorkerTiming, dict]:
        t_start = time.perf_counter()
        spec = self.spec
        n = len(indices)
        valid = arrays.get(VALID_FIELD)
        if valid is not None:
            valid[:n] = True
        # The reads that only check and gather come first: a record that fails its
        # checksum there is found (and, under on_error="replace", replaced) before any
        # image of its batch is decoded.
        self._scalars(indices, arrays)
        if spec.main_fields and spec.bad_input.replaces and self.ds.check_crc:
            for name in spec.main_fields:  # their checksums, here, where a bad one is replaced
                self.ds.payloads(indices, name)
        gather_s = time.perf_counter() - t_start
        shapes: dict = {}
        staged = 0
        if spec.image_field is not None or self._sample is not None:
            if self._sample is not None:
                io_s, decode_s, transform_s, assemble_s, nbytes, skipped, shapes = \
                    self._sample.build(indices, arrays, rng, valid)
            else:
                io_s, decode_s, transform_s, nbytes, skipped, staged = self._images(
                    indices, arrays, rng, valid, gpu)
                assemble_s = 0.0
        else:
            io_s = decode_s = transform_s = assemble_s = 0.0
            nbytes = skipped = 0
        done_at = time.perf_counter()
        stored = nbytes + stored_bytes(self.ds, self._unpaged, indices) if self._unpaged else nbytes
        timing = WorkerTiming(io_s=io_s, decode_s=decode_s, transform_s=transform_s,
                              assemble_s=assemble_s + gather_s, busy_s=done_at - t_start,
                              bytes=stored, records=n, skipped=skipped, done_at=done_at,
                              gpu_records=staged, read_bytes=nbytes)
        return timing, shapes

    def _images(self, indices, arrays, rng, valid, gpu: int = 0) -> tuple:
        """The classification path: one fixed-size image per record, fused decode, by the
        image kernel (:meth:`reader.transforms.kernels.Kernel.decode_fixed`); a sample that
        does not decode goes to the policy (:mod:`reader.transforms.bad_input`). The
        first ``gpu`` records are staged for the GPU decode instead where they can be
        (:class:`reader.runtime.gpu_decode.Stager`; staging counts as io)."""
        spec, ds = self.spec, self.ds
        skipped = staged = 0
        decode_s = transform_s = 0.0
        views = ds.payloads(indices, spec.image_field)
        t = time.perf_counter()
        nbytes = page_in(views)
        io_s = time.perf_counter() - t
        images = arrays[spec.image_field]
        # Every batch of a GPU-decoding loader clears its staging flags, even one with
        # nothing for the GPU (slots are reused: a flag left set would be decoded).
        stager = Stager(arrays, len(indices)) if GPU_PLAN in arrays else None
        decode, pipeline, cache, policy = (self._image.decode_fixed, spec.pipeline, spec.cache,
                                           spec.bad_input)
        idx = indices.tolist()
        for i, v in enumerate(views):
            self._current = idx[i]
            try:
                if i < gpu:
                    t = time.perf_counter()
                    how = stager.stage(pipeline, v, i, idx[i], rng, pipeline.max_pixels)
                    io_s += time.perf_counter() - t
                    if how is None:
                        staged += 1
                        continue
                    if how:  # a plan drawn, decoded here
                        t = time.perf_counter()
                        pipeline.decoder().decode_plan(v, *how, images[i], rng)
                        decode_s += time.perf_counter() - t
                        continue
                d, tr = decode(pipeline, v, images[i], rng, cache, idx[i])
            except DecodeError as exc:
                policy.reject(exc, valid, i)
                images[i] = 0
                skipped += 1
                continue
            decode_s += d
            transform_s += tr
        self._current = None
        return io_s, decode_s, transform_s, nbytes, skipped, staged

    def _scalars(self, indices, arrays) -> None:
        ds = self.ds
        for name, ftype in self.spec.slot_fields:
            if ftype in ("int", "float"):
                arrays[name][:len(indices)] = ds.scalars(indices, name)
            else:
                out = arrays[name]
                for i, r in enumerate(indices.tolist()):
                    out[i] = ds.get(r, name)

    def _corrupt(self, index: int, exc: Exception) -> CorruptRecordError:
        path, r, offset = self.ds.where(index, self.spec.image_field or self.ds.fields[0].name)
        return CorruptRecordError(
            f"field {self.spec.image_field!r} of dataset record {index}{key_words(self.ds, index)} "
            f"does not decode ({exc}); "
            "pass on_error='skip' to skip such records or on_error='replace' to replace them",
            path=path, record=r, offset=offset)


def error_message(exc: BaseException) -> tuple:
    """What a worker sends for an exception: (pickled exception or None, class name, text)."""
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)
    except Exception:
        blob = None
    return blob, type(exc).__qualname__, str(exc)


def worker_loop(worker_id: int, ds, ring, spec: BatchSpec, task_q, done_q, done_event,
                parent_pid: int, generation=None, doing=None) -> None:
    """A worker process's main function (module scope, so it can be spawned).

    ``doing`` (a shared int) holds the batch being built, -1 between batches, so the
    main process can tell which worker a late batch waits for.
    ``generation`` (a shared int, see :class:`WorkerPool`) cancels tasks: one
    whose generation is no longer current is answered :class:`BatchStale`
    without being built.
    """
    # Ctrl-C goes to the whole process group: the main process decides what to do.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    builder = BatchBuilder(ds, spec)
    pid = os.getpid()
    retired = False
    try:
        while not done_event.is_set():
            try:
                task = task_q.get(timeout=IDLE_POLL_S)
            except queue.Empty:
                if os.getppid() != parent_pid:
                    break  # the parent died: nobody will read our results
                continue
            if task is None:
                break
            if task == RETIRE:
                retired = True  # the pool shrinks: flush our answers before exiting
                break
            k, slot = task.batch, task.slot
            if generation is not None and task.generation != generation.value:
                done_q.put(BatchStale(batch=k, slot=slot))
                continue
            if doing is not None:
                doing.value = k
            try:
                timing, shapes, replaced = builder.build(task.indices, ring.slot_view(slot),
                                                         batch_rng(spec, task.epoch, k), task.gpu)
            except Exception as exc:
                done_q.put(BatchFailed(batch=k, slot=slot, worker=worker_id, pid=pid,
                                       record=builder.current, error=error_message(exc),
                                       traceback=traceback.format_exc()))
                builder.current = None
                continue
            finally:
                if doing is not None:
                    doing.value = -1
            done_q.put(BatchDone(batch=k, slot=slot, worker=worker_id, pid=pid, timing=timing,
                                 shapes=shapes, replaced=replaced))
    except KeyboardInterrupt:
        pass
    finally:
        if not retired:
            # Results still buffered matter to nobody once we stop; never block exit on them.
            done_q.cancel_join_thread()


class WorkerPool:
    """Worker processes, their two queues, the done event and the task generation.

    An epoch owns a pool for its own lifetime; with ``persistent_workers`` the
    loader owns one across epochs and an epoch that ends early hands it back
    only once none of its tasks can still write into a slot (:meth:`drain`).
    Stopping follows "Shutdown protocol" in :mod:`reader.runtime.epoch`.

    Args:
        ctx: a multiprocessing context.
        num_workers: processes to start.
        ds, ring, spec: what every worker builds from and into.
    """

    def __init__(self, ctx, num_workers: int, ds, ring, spec: BatchSpec) -> None:
        self.ring = ring
        self.task_q = ctx.Queue()
        self.done_q = ctx.Queue()
        self.done_event = ctx.Event()
        self.generation = ctx.RawValue("q", 0)  # an aligned int64: read without a lock
        self.processes: list = []
        self.stopped = False
        self.retiring = 0  # workers told to exit (num_workers="auto" shrinking) not yet reaped
        self._start = (ctx, ds, ring, spec)
        self._next_id = 0
        _pools.add(self)
        try:
            for _ in range(num_workers):
                self.add()
        except BaseException:
            self.stop()
            raise

    def add(self) -> None:
        """Start one more worker on the same queues and ring."""
        ctx, ds, ring, spec = self._start
        i, self._next_id = self._next_id, self._next_id + 1
        doing = ctx.RawValue("q", -1)
        p = ctx.Process(target=worker_loop, name=f"shardpack-worker-{i}", daemon=True,
                        args=(i, ds, ring, spec, self.task_q, self.done_q,
                              self.done_event, os.getpid(), self.generation, doing))
        p.doing = doing  # the batch it builds (-1: none), read by a late batch's message
        with own_fork():
            p.start()
        self.processes.append(p)

    def retire(self) -> None:
        """Have one worker exit once the tasks queued before now are taken."""
        self.task_q.put(RETIRE)
        self.retiring += 1

    def resize(self, n: int) -> None:
        """Grow or shrink to ``n`` running workers (those retiring not counted)."""
        while len(self.processes) - self.retiring < n:
            self.add()
        while len(self.processes) - self.retiring > max(n, 1):
            self.retire()

    @property
    def running(self) -> int:
        return len(self.processes) - self.retiring

    def reap(self) -> None:
        """Forget workers that exited because they were retired (exit status 0)."""
        for p in list(self.processes):
            if self.retiring and p.exitcode == 0:
                p.join()
                self.processes.remove(p)
                self.retiring -= 1

    def alive(self) -> bool:
        """Every worker is running (and the pool was not stopped)."""
        self.reap()
        return bool(self.processes) and all(p.exitcode is None for p in self.processes)

    def disown(self) -> None:
        """In a forked child: forget the workers (the parent's) without touching them."""
        self.stopped = True
        for p in self.processes:
            # Else multiprocessing's atexit handler in this child would terminate them.
            multiprocessing.process._children.discard(p)
        self.processes = []

    def drain(self, outstanding: int, deadline_s: float) -> bool:
        """Cancel queued tasks and collect the answers of ``outstanding`` issued ones.

        Returns:
            True when all of them were answered and no worker failed or died
            within ``deadline_s``: no task can touch a slot any more and the
            pool may serve another epoch. False otherwise (then stop it).
        """
        if self.stopped:
            return False
        self.generation.value += 1
        deadline = time.monotonic() + deadline_s
        while outstanding > 0:
            left = deadline - time.monotonic()
            if left <= 0 or not self.alive():
                return False
            try:
                msg = self.done_q.get(timeout=min(left, 0.1))
            except queue.Empty:
                continue
            if isinstance(msg, BatchFailed):
                return False  # the worker is fine, but be conservative: start afresh
            outstanding -= 1
        return True

    def stop(self, join_s: float = 2.0) -> None:
        """Stop and reap every worker, close the queues. Idempotent."""
        if self.stopped:
            return
        self.stopped = True
        processes, self.processes = self.processes, []
        self.done_event.set()
        for _ in processes:
            try:
                self.task_q.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + join_s
        for p in processes:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in processes:
            if p.is_alive():
                p.terminate()
                p.join(0.5)
            if p.is_alive():
                p.kill()
                p.join()
        for q in (self.task_q, self.done_q):
            q.cancel_join_thread()
            q.close()

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:
            pass


_pools: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


def _disown_after_fork() -> None:
    for pool in list(_pools):
        pool.disown()


os.register_at_fork(after_in_child=_disown_after_fork)
