"""One epoch's worker processes and the in-order delivery to the epoch's sink.

Shutdown protocol
-----------------
Every way out of an epoch (end of data, ``break``, an exception in the training
loop, ``KeyboardInterrupt``, a worker error or death, ``close()``, garbage
collection of the iterator or the loader) goes through ``Epoch.shutdown``, which
releases the epoch's :class:`~reader.runtime.worker.WorkerPool`. Stopping a pool
(``WorkerPool.stop``):

1. set the done event (idle workers see it within ``IDLE_POLL_S``);
2. put one ``None`` task per worker (busy workers stop after their batch);
3. join each worker for up to ``JOIN_S`` together, then ``terminate()``, then
   ``kill()`` whatever is still alive, and join it (no zombies);
4. close both queues without waiting on their feeder threads.

With ``persistent_workers`` the pool belongs to the runtime
(:class:`reader.runtime.runtime.Runtime`) and an epoch that
ends without an error keeps it: the end of data leaves no task in flight; an
early end (``break``, ``set_epoch``, garbage collection) first *drains* it:
bump the pool's generation, so workers answer queued tasks ``"stale"`` without
building them, and collect one answer per task still in flight (at most
``DRAIN_S``). Only then may a later epoch reuse the slots. A failed drain, an
error in ``next()`` (worker error or death, ``KeyboardInterrupt``, timeout) or
a worker found dead when the next epoch starts stops the pool as above; the
next epoch starts a fresh one. ``Runtime.close()`` (called by ``Loader.close()``,
also on garbage collection) stops it.

Workers never outlive their parent: they check ``os.getppid()`` on every idle
poll and are daemonic (multiprocessing terminates them at interpreter exit). The
ring belongs to the runtime, not the epoch, so a GPU consumer can page-lock it
once; ``Runtime.close()`` (from ``Loader.close()``, also on garbage collection)
releases it. The ``anon``
ring has no name, so a loader killed with SIGKILL leaves nothing behind; the
``shm`` ring (spawn) is named by owner pid and reclaimed by the next loader.
Every wait in the main process is a ``get`` with a timeout followed by a
liveness check of every worker, so a dead worker raises within about
``POLL_S`` seconds instead of hanging. A live worker that makes no progress is
noticed too: past ``timeout`` (or, by default, past ``LATE_FACTOR`` times the
slowest batch so far) the workers' states are read from ``/proc``; a stopped
worker (SIGSTOP, a debugger) raises :class:`LoaderTimeoutError` naming it, slow
(using CPU) or blocked (asleep, using none) ones are named in a warning, and an
explicit ``timeout`` raises whatever their state, with the same description.

A process forked from the main one (``os.fork``, a library's subprocess helper)
inherits the loader's objects but never its workers: at the fork the child
disowns every pool (``reader.runtime.worker``), so neither its exit (multiprocessing's
atexit handler terminates the children it knows of) nor its garbage collection
stops, drains or signals the parent's workers.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from formats.errors import FormatError, ShardpackError

from ..data.dataset import main_fields
from ..errors import LoaderError, LoaderTimeoutError, WorkerDiedError, WorkerError
from ..transforms.bad_input import Quarantine
from ..transforms.collate import assemble
from .proc import describe, process_state
from .timing import BatchTiming, batch_timing, stored_bytes
from .worker import BatchBuilder, BatchDone, BatchFailed, Task, batch_rng

__all__ = ["Cursor", "Epoch", "RawEpoch"]

log = logging.getLogger(__name__)

POLL_S = 0.1
JOIN_S = 2.0
DRAIN_S = 5.0  # persistent workers: longest wait for an abandoned epoch's batches in progress
# With timeout=None, a wait longer than LATE_FACTOR x the slowest batch so far (at least
# LATE_MIN_S; LATE_FIRST_S before any batch) looks at the workers: a stopped one raises,
# slow or blocked ones are reported and waited for.
LATE_FIRST_S = 60.0
SUSPENDED_S = 1.0  # a gap this long between two 0.1 s polls: this process was not running
LATE_MIN_S = 10.0
LATE_FACTOR = 20.0
AUTO_SHRINK_AFTER = 32  # batches in a row without waiting before auto prefetch shrinks
WAITED_S = 1e-3  # a wait longer than this counts as the consumer waiting


@dataclass
class Cursor:
    """Where a loader is: owned by its runtime, moved by the epochs as they deliver,
    read (and moved to where a new loop starts) by the Loader.

    Attributes:
        epoch: the current epoch.
        position: the next batch of ``epoch`` to deliver in the running (or last) loop;
            the loader moves it when a new loop starts (``Loader._start_loop``).
        skipped: records skipped so far (``on_error="skip"``), all epochs.
        quarantine: the records replaced so far (``on_error="replace"``), all epochs, and
            their count (:class:`reader.transforms.bad_input.Quarantine`).
        slowest: the longest issue-to-done time of a batch so far, all epochs (s):
            what a late batch is measured against.
    """

    epoch: int = 0
    position: int = 0
    skipped: int = 0
    quarantine: Quarantine = field(default_factory=Quarantine)
    slowest: float = 0.0

    def delivered(self, epoch: int, k: int) -> None:
        self.epoch, self.position = epoch, k + 1

    def finished(self, epoch: int, num_batches: int) -> None:
        """The end of ``epoch``'s data: the cursor moves to the next epoch's start."""
        if self.epoch == epoch and self.position >= num_batches:
            self.epoch, self.position = epoch + 1, 0


def _truncated_file(ds) -> Path | None:
    """A data or index file now shorter than the manifest says (after a worker's SIGBUS);
    a mixture's sources are each looked at (:class:`reader.data.mixed.MixedDataset`)."""
    for part in getattr(ds, "parts", (ds,)):
        for e in part.manifest.shards:
            for name, size in ((e.data_file, e.data_bytes), (e.index_file, e.index_bytes)):
                try:
                    if os.stat(part.root / name).st_size < size:
                        return part.root / name
                except OSError:
                    continue  # missing (a remote dataset's cache): not what the worker read
    return None


def _worker_id(process) -> str:
    return process.name.rsplit("-", 1)[-1]  # "shardpack-worker-<id>" (reader.runtime.worker)


def _doing(process) -> str:
    doing = getattr(process, "doing", None)
    if doing is None:
        return ""
    k = doing.value
    return ", waiting for a task," if k < 0 else f", building batch {k},"


class RawEpoch:
    """Raw-bytes mode: batches read in-process from the mmaps; no workers, no ring."""

    def __init__(self, rt) -> None:
        """``rt``: the :class:`reader.runtime.runtime.Runtime` that starts this epoch."""
        self.rt = rt
        self.epoch = rt.cursor.epoch
        self.k = rt.cursor.position
        self.copy = rt.options.copy
        self.prefetch = rt.start_prefetch(self.epoch, self.k)
        self.superseded: str | None = None  # why a newer iterator or call ended this one
        self.owner: object = None  # kept alive with this epoch (the Loader); never called

    def __iter__(self):
        return self

    @property
    def finished(self) -> bool:
        return self.k >= self.rt.order.num_batches_in(self.epoch)

    def __next__(self) -> dict:
        rt = self.rt
        if self.superseded is not None:
            raise LoaderError(self.superseded)
        n = rt.order.num_batches_in(self.epoch)
        if self.k >= n:
            self.shutdown()
            rt.cursor.finished(self.epoch, n)
            raise StopIteration
        t0 = time.perf_counter()
        if self.prefetch is not None:
            self.prefetch.advance(self.k + 1)
        indices = rt.order.batch(self.epoch, self.k)
        batch = main_fields(rt.dataset, rt.fields, indices)
        if self.copy:
            batch = {k: v if isinstance(v, np.ndarray) else
                     [bytes(x) if isinstance(x, memoryview) else x for x in v]
                     for k, v in batch.items()}
        k = self.k
        if rt.listeners:
            dt = time.perf_counter() - t0
            # Every field's stored bytes; none paged in here (views, read when touched),
            # so no read_bytes, unless copy=True copied the bytes fields (that time is dt).
            nbytes = stored_bytes(rt.dataset, rt.fields, indices, batch)
            rt.emit_batch(BatchTiming(k, self.epoch, -1, len(indices), nbytes, 0, 0.0, 0.0,
                                      0.0, dt, dt, dt, dt, dt, 0))
        self.k = k + 1
        rt.cursor.delivered(self.epoch, k)  # last, as in Epoch._deliver
        return batch

    def shutdown(self) -> None:
        prefetch, self.prefetch = self.prefetch, None
        if prefetch is not None:
            prefetch.close()

    def __del__(self) -> None:  # an epoch left half-read must not leave its prefetcher
        try:
            self.shutdown()
        except Exception:
            pass


class Epoch:
    """One pass over (the rest of) an epoch with workers (or in-process for 0 workers)."""

    def __init__(self, rt) -> None:
        """``rt``: the :class:`reader.runtime.runtime.Runtime` that starts this epoch; the
        epoch reads what it owns and calls it, never the Loader."""
        self.rt = rt
        self.epoch = rt.cursor.epoch
        self.n = rt.order.num_batches_in(self.epoch)
        self.next_issue = self.next_deliver = rt.cursor.position
        self.sink = rt.make_sink()
        self.lo_depth, self.depth, self.hi_depth = rt.depths(self.sink.hold)
        self.ring = rt.ensure_ring(self.hi_depth + self.sink.hold)
        self.sink.attach(self.ring)
        leases = self.ring.leases
        leases.collect()
        # A batch of an earlier epoch the consumer still holds keeps its slot.
        self.free = [s for s in range(self.ring.num_slots) if s not in leases.held]
        self.ready: dict[int, tuple] = {}
        self.issued_at: dict[int, float] = {}
        self.slot_of: dict[int, int] = {}
        self.calm = 0
        self.returned_at: float | None = None  # when next() last returned
        self.superseded: str | None = None  # why a newer iterator or call ended this one
        self.owner: object = None  # kept alive with this epoch (the Loader); never called
        self.pid = os.getpid()
        self.pool = None
        self.workers: list = []
        self.closed = False
        self.prefetch = None
        self.builder = None
        if rt.num_workers == 0:
            self.builder = BatchBuilder(rt.dataset, rt.spec)
        elif self.next_issue < self.n:
            self.pool = rt.acquire_pool(self.ring)
            self.workers = self.pool.processes
            if rt.scaler is not None:
                rt.scaler.resume(time.perf_counter())
            self.task_q, self.done_q = self.pool.task_q, self.pool.done_q
            self.generation = self.pool.generation.value
        # Started after the fork: a child must not inherit a download's lock descriptors.
        self.prefetch = rt.start_prefetch(self.epoch, self.next_issue)

    def __iter__(self):
        return self

    # -- the hot path --------------------------------------------------------------------

    def __next__(self) -> dict:
        t_call = time.perf_counter()
        if self.closed:
            if self.superseded is not None:
                raise LoaderError(self.superseded)
            raise StopIteration
        if self.pid != os.getpid():
            raise LoaderError(f"this epoch's workers belong to process {self.pid}, which "
                               "forked this one: call iter(loader) again here for workers "
                               "of this process")
        try:
            self.free.extend(self.sink.reclaim())
            k = self.next_deliver
            if k >= self.n:
                self.shutdown()
                self.rt.cursor.finished(self.epoch, self.n)
                raise StopIteration
            in_flight = self.next_issue - self.next_deliver
            self._issue()
            t_wait = time.perf_counter()
            if self.builder is not None:
                # In-process, the consumer waits for the whole build.
                msg = self._build_here(k)
                waited = time.perf_counter() - t_wait
            else:
                msg = self.ready.pop(k, None)
                waited = 0.0
                if msg is None:
                    msg = self._wait_for(k)
                    waited = time.perf_counter() - t_wait
            if isinstance(msg, BatchFailed):
                self._raise_worker_error(msg)
            return self._deliver(k, msg, t_call, t_wait, waited, in_flight)
        except StopIteration:
            raise
        except BaseException:
            self.shutdown(failed=True)
            raise

    def _decode_ahead(self) -> None:
        """With the GPU decode on: start the next batch's GPU stage now if its worker
        has finished it (:meth:`CudaSink.decode_ahead`), so that it runs while the
        consumer trains on this one. Never waits for a worker."""
        k = self.next_deliver
        if k >= self.n or self.builder is not None:
            return  # built in-process inside next(): nothing is ready ahead
        msg = self.ready.get(k)
        while msg is None:
            try:
                m = self.done_q.get_nowait()
            except queue.Empty:
                return
            self.ready[m.batch] = m
            if m.batch == k:
                msg = m
        if isinstance(msg, BatchDone):
            plan = self.rt.plan
            try:
                self.sink.decode_ahead(msg.slot, assemble(
                    self.ring.slot_view(msg.slot), plan.fixed, plan.var_fields, msg.shapes,
                    msg.timing.records))
            except Exception:  # only a head start: the batch decodes when it is asked for
                log.debug("the GPU decode's look-ahead failed", exc_info=True)

    @property
    def finished(self) -> bool:
        return self.next_deliver >= self.n

    def _issue(self) -> None:
        order = self.rt.order
        limit = 1 if self.builder is not None else self.depth
        while (self.free and self.next_issue < self.n
               and self.next_issue - self.next_deliver < limit):
            k = self.next_issue
            slot = self.free.pop()
            self.slot_of[k] = slot
            self.issued_at[k] = time.perf_counter()
            if self.builder is None:
                indices = order.batch(self.epoch, k)
                gpu = self.rt.split.count(len(indices)) if self.rt.split is not None else 0
                self.task_q.put(Task(batch=k, slot=slot, epoch=self.epoch, indices=indices,
                                     generation=self.generation, gpu=gpu))
            self.next_issue += 1
        if self.prefetch is not None:
            self.prefetch.advance(self.next_issue)

    def _build_here(self, k: int) -> BatchDone:
        rt = self.rt
        slot = self.slot_of[k]
        indices = rt.order.batch(self.epoch, k)
        gpu = rt.split.count(len(indices)) if rt.split is not None else 0
        try:
            t, shapes, replaced = self.builder.build(indices, self.ring.slot_view(slot),
                                                     batch_rng(rt.spec, self.epoch, k), gpu)
        except ShardpackError:
            raise
        except Exception as exc:
            raise WorkerError(f"in-process batch {k} failed on record {self.builder.current}: "
                              f"{type(exc).__name__}: {exc}", record=self.builder.current,
                              exc_type=type(exc).__qualname__) from exc
        return BatchDone(batch=k, slot=slot, worker=-1, pid=os.getpid(), timing=t, shapes=shapes,
                         replaced=replaced)

    def _wait_for(self, k: int):
        timeout = self.rt.options.timeout
        since = time.perf_counter()
        late_at = since + (timeout if timeout is not None else self._late_after())
        # The workers' /proc states are sampled only once a wait outlasts one poll: a batch
        # that comes within it costs no file reads.
        states = None
        polled = since
        while True:
            try:
                msg = self.done_q.get(timeout=POLL_S)
            except queue.Empty:
                self._check_workers()
                now = time.perf_counter()
                if now - polled > SUSPENDED_S:
                    # This process did not run for a while (stopped with Ctrl-Z, a debugger,
                    # a swapped-out machine): that time is nobody's lateness.
                    late_at += now - polled
                polled = now
                if states is None:
                    states = self._worker_states()
                if now > late_at:
                    self._late(k, now - since, states, timeout)
                    states = self._worker_states()
                    late_at = now + max(now - since, LATE_MIN_S)  # warn again at twice the wait
                continue
            since = time.perf_counter()
            late_at = since + (timeout if timeout is not None else self._late_after())
            states = None
            # Errors wait their turn like batches, so the same record fails first
            # whatever the number of workers.
            if msg.batch == k:
                return msg
            self.ready[msg.batch] = msg

    def _late_after(self) -> float:
        """With no ``timeout``: how long a wait is normal, from the slowest batch so far."""
        slowest = self.rt.cursor.slowest
        if slowest == 0.0:
            return LATE_FIRST_S
        return max(LATE_MIN_S, LATE_FACTOR * slowest)

    def _worker_states(self) -> list:
        return [(time.perf_counter(), process_state(p.pid)) for p in self.workers]

    def _late(self, k: int, waited: float, before: list, timeout: float | None) -> None:
        """No batch for too long: raise (a timeout, or a stopped worker) or warn (slow ones)."""
        now = self._worker_states()
        words = [f"worker {_worker_id(p)} (pid {p.pid}){_doing(p)} is "
                 f"{describe(b, n, t1 - t0)}"
                 for p, (t0, b), (t1, n) in zip(self.workers, before, now, strict=False)]
        stopped = [p.pid for p, (_, n) in zip(self.workers, now, strict=False)
                   if n is not None and n.stopped]
        what = (f"no batch for {waited:.1f} s (waiting for batch {k} of epoch {self.epoch}): "
                + "; ".join(words))
        if timeout is not None:
            raise LoaderTimeoutError(f"{what}; the timeout is {timeout} s") from None
        if stopped:
            raise LoaderTimeoutError(
                f"{what}. A stopped worker never finishes its batch: continue it "
                f"(kill -CONT {' '.join(map(str, stopped))}) and run again, or pass timeout= "
                "to choose how long a batch may take") from None
        s = self.rt.cursor.slowest
        slowest = f"{s:.2f} s" if s else "none delivered yet"
        log.warning("%s (slowest batch so far: %s); still waiting, pass timeout= to fail instead",
                    what, slowest)

    def _check_workers(self) -> None:
        if self.pool is not None:
            self.pool.reap()  # workers retired by num_workers="auto" exit on purpose
        for p in self.workers:
            i = _worker_id(p)
            code = p.exitcode
            if code is not None:
                how = (f"killed by signal {signal.Signals(-code).name}" if code < 0
                       else f"exit status {code}")
                pid = p.pid
                busy = f"batches {self.next_deliver}..{self.next_issue - 1} were in flight"
                self.shutdown(failed=True)
                truncated = _truncated_file(self.rt.dataset) if code == -signal.SIGBUS else None
                if truncated is not None:
                    # Workers check file sizes before each batch; a truncation racing
                    # that check still kills with SIGBUS: name the file all the same.
                    raise FormatError(f"worker {i} (pid {pid}) was {how} reading a shard file "
                                      f"truncated while mapped; {busy} in epoch {self.epoch}",
                                      path=truncated)
                raise WorkerDiedError(f"worker {i} (pid {pid}) exited unexpectedly ({how}); "
                                      f"{busy} in epoch {self.epoch}")

    def _raise_worker_error(self, msg: BatchFailed) -> None:
        k, wid, pid, record, tb = msg.batch, msg.worker, msg.pid, msg.record, msg.traceback
        blob, type_name, text = msg.error
        self.shutdown(failed=True)
        exc = None
        if blob is not None:
            try:
                exc = pickle.loads(blob)
            except Exception:
                exc = None
        where = f"worker {wid} (pid {pid}) failed on record {record} (batch {k} of epoch {self.epoch})"
        if isinstance(exc, ShardpackError):
            exc.add_note(f"{where}\nOriginal traceback in the worker:\n{tb}")
            raise exc
        err = WorkerError(f"{where}: {type_name}: {text}\n\nOriginal traceback in the worker:\n{tb}",
                          worker=wid, pid=pid, record=record, exc_type=type_name, traceback=tb)
        raise err from exc

    def _deliver(self, k: int, msg: BatchDone, t_call: float, t_wait: float, waited: float,
                 in_flight: int) -> dict:
        slot, t = msg.slot, msg.timing
        rt = self.rt
        cursor, plan = rt.cursor, rt.plan
        self.next_deliver = k + 1
        nrec = t.records
        batch = assemble(self.ring.slot_view(slot), plan.fixed, plan.var_fields,
                         msg.shapes, nrec)
        if msg.replaced:
            served = rt.order.batch(self.epoch, k).copy()
            for p, record, replacement in msg.replaced:
                served[p] = replacement
                cursor.quarantine.add(rt.dataset, record, replacement)
        if plan.main_fields:
            served = served if msg.replaced else rt.order.batch(self.epoch, k)
            batch.update(main_fields(rt.dataset, plan.main_fields, served))
        if t.skipped:
            cursor.skipped += t.skipped
        timing = None
        latency = t.done_at - self.issued_at[k]
        if latency > cursor.slowest:
            cursor.slowest = latency
        if rt.listeners:
            # ready: finished before this next() began (same clock, see timing.py).
            timing = batch_timing(t, batch=k, epoch=self.epoch, worker=msg.worker, wait_s=waited,
                                  latency_s=latency if latency > 0.0 else 0.0, prefetch=in_flight,
                                  ready=t.done_at <= t_call, wait_at=t_wait)
            if plan.main_fields:  # served here, so counted here, only when someone listens
                timing.bytes += stored_bytes(rt.dataset, plan.main_fields, served, batch)
        self.issued_at.pop(k, None)
        self.slot_of.pop(k, None)
        batch, timing = self.sink.deliver(slot, batch, timing)
        if rt.split is not None:
            # Waiting for the GPU decode is waiting for the batch: for "auto" workers and
            # prefetch and the monitor as much as waiting for a worker.
            waited += self.sink.gpu_wait_s
            cursor.skipped += self.sink.gpu_skipped
            if timing is not None:
                timing.wait_s += self.sink.gpu_wait_s
                timing.skipped += self.sink.gpu_skipped
            self._split(t, timing)
        self._adapt(waited)
        if rt.scaler is not None and self.pool is not None:
            self._scale(t_call, waited, t.busy_s)
        if timing is not None:
            timing.next_s = time.perf_counter() - t_call
            rt.emit_batch(timing)
        if self.next_deliver >= self.n and self.pool is not None:
            self._release_pool()  # nothing left to build: free (or hand back) the processes early
        if self.sink.decodes_ahead:
            self._decode_ahead()  # the next batch's GPU decode runs during the training step
        # Last: a KeyboardInterrupt (or a monitor's error) before this line loses the batch
        # with the call, and state_dict() still names it as unseen.
        cursor.delivered(self.epoch, k)
        return batch

    def _split(self, t, timing) -> None:
        """Feed the split controller this batch's two rates (:mod:`reader.runtime.split`)."""
        split = self.rt.split
        _, gpu_n, gpu_s = self.sink.gpu.last
        share = split.observe(t.records - t.gpu_records - t.skipped, t.decode_s + t.transform_s,
                              max(self.rt.num_workers, 1), gpu_n, gpu_s)
        if timing is not None:
            timing.gpu_share, timing.cpu_img_s, timing.gpu_img_s = (share, split.cpu_rate,
                                                                    split.gpu_rate)

    def _adapt(self, waited: float) -> None:
        """``prefetch="auto"``: deepen when the consumer waited, shallow after a calm run."""
        if self.lo_depth == self.hi_depth:
            return
        if waited > WAITED_S:
            self.depth = min(self.depth + 1, self.hi_depth)
            self.calm = 0
        else:
            self.calm += 1
            if self.calm >= AUTO_SHRINK_AFTER and len(self.ready) > 1:
                self.depth = max(self.depth - 1, self.lo_depth)
                self.calm = 0

    def _scale(self, t_call: float, waited: float, busy_s: float) -> None:
        """``num_workers="auto"``: feed the scaler; apply its decision once per window."""
        sc = self.rt.scaler
        now = time.perf_counter()
        consumer = t_call - self.returned_at if self.returned_at is not None else 0.0
        self.returned_at = now
        sc.on_batch(waited, consumer, busy_s)
        if not sc.due(now):
            return
        running = [p.pid for p in self.workers if p.exitcode is None][: self.pool.running]
        n = sc.step(sc.window(now, running))
        if n != self.pool.running:
            self.rt.resize(n, sc.changes[-1])
            sc.mark(time.perf_counter(), [p.pid for p in self.workers if p.exitcode is None])

    # -- shutdown (see "Shutdown protocol" in the module docstring) ---------------------

    def _release_pool(self, failed: bool = False) -> None:
        pool, self.pool = self.pool, None
        self.workers = []
        if pool is None:
            return
        rt = self.rt
        if not failed and rt.keeps(pool):
            # Persistent workers: keep them if every task this epoch issued is
            # accounted for, so none can write into a slot the next epoch reuses.
            outstanding = self.next_issue - self.next_deliver - len(self.ready)
            try:
                if pool.drain(outstanding, DRAIN_S):
                    rt.release_pool(pool)
                    return
            except BaseException:
                rt.drop_pool(pool)
                raise
            states = [(p, process_state(p.pid)) for p in pool.processes]
            stopped = [f"worker {_worker_id(p)} (pid {p.pid}) is {describe(None, st, 0.0)}"
                       for p, st in states if st is not None and st.stopped]
            log.warning("the persistent workers did not finish the %d batches in progress "
                        "within %.0f s%s; starting fresh workers", outstanding, DRAIN_S,
                        f" ({'; '.join(stopped)})" if stopped else "")
        rt.drop_pool(pool)

    def shutdown(self, failed: bool = False) -> None:
        """End the epoch; ``failed`` (an error in ``next()``) also stops persistent workers."""
        if self.closed:
            return
        self.closed = True
        prefetch, self.prefetch = self.prefetch, None
        if prefetch is not None:
            prefetch.close()
        self._release_pool(failed)
        self.sink.close()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass
