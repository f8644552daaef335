"""The loader: an iterable of batches built by worker processes into shared slots.

Batch ``k`` of an epoch is issued to the workers as ``(k, slot, epoch, indices,
generation)``; a worker writes it into ``slot`` of the :class:`~reader.runtime.slots.SlotRing`
and answers ``("ok", k, slot, worker, pid, timing)``. Batches are delivered in order
of ``k`` whatever order workers finish in. The consumer (a *sink*) says when a
slot may be reused: on CPU once no array of its batch is alive (a lease, see
:mod:`reader.runtime.leases`), on a GPU when the copy out of it has completed (see
:mod:`reader.runtime.sinks`).

The Loader is assembly: it checks its options (:mod:`reader.options`), builds the
order (:mod:`reader.batching`), the batch plan and pipeline (:func:`reader.runtime.plan.plan_batch`)
and the :class:`~reader.runtime.runtime.Runtime`, which owns the processes, the
ring, the sink and the caches, and iterates. The runtime never calls back into the
Loader: the monitor hears it as a listener. The epoch machinery and its shutdown
protocol live in :mod:`reader.runtime.epoch`.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Iterator
from copy import copy as shallow_copy
from pathlib import Path
from typing import Any

import numpy as np

from formats import ShardDataset
from formats.errors import ArgumentError, ArgumentTypeError
from formats.storage.cache import CacheOptions

from .batching.batching import BudgetBatches
from .batching.mix import Mix
from .batching.mixture import ORDER as MIX_ORDER
from .batching.mixture import MixOrder
from .batching.sampler import Sampler, check_epoch, check_resume, next_unseen
from .data.dataset import open_dataset
from .data.mixed import MixedDataset
from .errors import LoaderError, StateError
from .ledger import Ledger, check_ledger
from .monitor.monitor import resolve_monitor
from .options import (
    DecodedCacheOptions,
    DecodeOptions,
    DeviceOptions,
    SamplerOptions,
    WorkerOptions,
    check_batch_size,
    check_fields,
    resolve_num_workers,
)
from .runtime.autoscale import ScaleChange
from .runtime.device import check_layout, require_cupy
from .runtime.gpu_decode import resolve_decode_device, with_gpu_fields
from .runtime.plan import plan_batch
from .runtime.runtime import Runtime, check_decoded_cache
from .runtime.slots import SlotRing
from .runtime.timing import BatchTiming
from .runtime.worker import BatchSpec
from .transforms.bad_input import BadInput, Quarantine
from .transforms.checks import check_pipeline_options

__all__ = ["Loader"]

log = logging.getLogger(__name__)


DEFAULT_BATCH_SIZE = 256  # records per batch when batch_size is left out (None)

class Loader:
    """Batches of a dataset as dicts of field -> numpy array (or list, for bytes/str fields).

    Batches on CPU are leased views into a shared-memory slot: the slot is reused
    only once nothing refers to the batch (:mod:`reader.runtime.leases`); pass ``copy=True``
    to get owned arrays.

    Loops are what PyTorch users know (torch's ``DataLoader``; torchdata's
    ``StatefulDataLoader`` for resume): every ``iter()`` starts the current epoch at
    its first batch, unless :meth:`load_state_dict` was called since the last
    ``iter()``, which resumes exactly at the batch it names. An epoch whose last
    batch was delivered is finished, and the next ``iter()`` starts the next epoch;
    a loop left early (``break``, an exception, ``KeyboardInterrupt``) leaves the
    epoch where it is, and a new loop reads it again from its first batch.
    :meth:`state_dict`, taken in a loop or after one was left, names the next
    unseen batch, so a new Loader given it continues there. One iterator runs at a
    time: a new ``iter()`` ends the previous one.

    Args:
        source: a dataset folder, an open ``ShardDataset``, or a :class:`reader.Mix` of
            several read as one stream by weight (every batch full; its state resumes
            at any world size or batch size, and re-plans with other weights).
        batch_size: records per batch; ``None`` (left out) is 256. A Loader always makes
            batches (torch's ``batch_size=None``, one sample at a time, has no
            equivalent: read single records with ``reader.open_dataset(path)[i]``); ``1``
            gives batches of one record. It is the one way to size batches of records:
            ``AspectRatioBatches()`` takes it from here (its own ``batch_size`` is
            refused); with ``BudgetBatches`` the budget sizes the batches, so a
            ``batch_size`` is refused (leave it out).
        batch_sampler: size-aware batches (:mod:`reader.batching`):
            ``AspectRatioBatches(...)`` groups records of similar shape,
            ``BudgetBatches(...)`` bounds the pixels or tokens of a batch. Every
            guarantee of the plain order holds (seeded, per rank, resumable).
        shuffle: ``False`` (storage order), ``True``/``"full"`` (a global permutation)
            or ``"block"`` (shards shuffled, then records within windows of
            ``shuffle_window``: near-sequential reads).
        seed: the order, and the random transforms, are a pure function of (seed,
            epoch, rank, world_size).
        drop_last: ``True`` drops the tail so every rank gets ``len // world_size``
            records and no partial batch; ``False`` wraps to the epoch's start (as
            torch's ``DistributedSampler``) and yields the last partial batch.
        rank: this process's rank for distributed partitioning; ``None`` reads
            ``$RANK`` (torchrun sets it), else 0.
        world_size: the number of ranks; ``None`` reads ``$WORLD_SIZE``, else 1.
        shuffle_window: records per window of ``shuffle="block"`` (refused with any
            other order, where it would do nothing).
        transform: the image pipeline (:mod:`reader.transforms`), a list of transform
            specs to build one from, or None (whole images).
        annotations: which fields follow the image's geometry
            (:class:`reader.Annotations`; default: found by name and shape).
        collate: field -> ``"padded"``, ``"ragged"`` or ``reader.Padded(to=...)`` for
            fields whose size varies per sample (see :mod:`reader.transforms.collate`).
        decoders: field -> ``reader.FieldDecoder(fn, dtype, max_rows)``: bytes fields
            (audio, ...) decoded in the workers by ``fn``.
        fields: the fields to return (default: all).
        image_field: the field to decode (default: the first jpeg/image field).
        decode: ``False`` for raw-bytes mode (in-process, no workers; bytes fields as
            zero-copy memoryviews).
        on_error: what a damaged record becomes (:mod:`reader.transforms.bad_input`).
            ``"fail"`` raises on a corrupt image naming shard and record;
            ``"skip"`` zero-fills it, marks it False in the batch's ``valid`` mask
            and counts it (``loader.skipped``); ``"replace"`` serves in its place a
            record of the same source (of the same ``Mix`` source), drawn as a pure
            function of (seed, the bad record, attempt), for an image that does not
            decode and for any field that fails its checksum: batches keep their
            size, ``valid`` stays all True, and the batches are the same whatever the
            number of workers or resumes. ``loader.quarantine`` lists the replaced
            records as ``(source, record, replacement)`` (source: the ``Mix``
            source's name, else None), ``loader.replaced`` counts the replaced
            samples; the state dict carries both (``state["quarantine"]``). A
            record whose :data:`~reader.transforms.bad_input.REPLACE_ATTEMPTS`
            replacements are all bad fails its batch, naming every record tried.
        check_crc: verify every field's CRC32C as it is read (default; False skips it).
        decoded_cache: keep decoded images in shared memory for later epochs
            (:class:`reader.DecodedCacheOptions`; the seed's ``CacheDataset``).
        max_pixels: the pixel budget of every image decoded (None: 2^28, what
            ``pack-dataset`` admits by default; match ``--max-pixels N``).
        num_workers: worker processes, 0 (in-process), or ``"auto"``: one per core to
            start, then measured and adjusted while the loader runs (see
            :mod:`reader.runtime.autoscale`; ``worker_changes`` lists each change and why).
        prefetch: batches in flight, or ``"auto"`` (adapted between ``num_workers`` and
            ``max_prefetch`` so the consumer rarely waits).
        max_prefetch: batches the ring is allocated for (default ``4 * num_workers``,
            at least 2), bounded by ``max_ring_bytes``.
        max_ring_bytes: memory bound of the shared batch ring.
        timeout: seconds without any batch before :class:`reader.LoaderTimeoutError`
            (saying what each worker is doing); None: a stopped worker is an error,
            slow ones are reported and waited for.
        persistent_workers: keep the worker processes from one epoch to the next.
        start_method: ``"fork"`` (Linux default), ``"spawn"`` or ``"forkserver"``.
        copy: return owned arrays instead of views of the shared ring.
        device: ``"cpu"`` or ``"cuda"`` (handled by :mod:`reader.runtime.sinks`); which
            GPU is ``DeviceOptions(device_id=...)``, not ``"cuda:0"``.
        device_options: :class:`reader.DeviceOptions` for ``device="cuda"``.
        cache: where a remote ``source`` (``s3://...``) keeps its shards
            (:class:`reader.CacheOptions`: folder, size bound, prefetching).
        monitor: a :class:`reader.Monitor` (its interval, output and record), ``True``
            (a Monitor with the default settings), ``None`` (the process default set
            by ``reader.enable_monitor``; off unless enabled) or ``False`` (off).
        ledger: ``True`` keeps a running hash of every batch's records in the state
            dict; a path (``"ledger-{rank}.jsonl"``) also appends one line per batch
            there, for ``inspect-shards ledger-diff`` (:mod:`reader.ledger`).

    Each option has this one way in; :mod:`reader.options` holds the checked records
    the order, the pipeline and the workers read.
    """

    def __init__(self, source: str | Path | ShardDataset | Mix, batch_size: int | None = None, *,
                 batch_sampler: Any = None,
                 shuffle: bool | str = False, seed: int = 0, drop_last: bool = False,
                 rank: int | None = None, world_size: int | None = None,
                 shuffle_window: int = SamplerOptions.shuffle_window,
                 transform: Any = None, annotations: Any = None, collate: Any = None,
                 decoders: Any = None, fields: tuple[str, ...] | None = None,
                 image_field: str | None = None, decode: bool = True, on_error: str = "fail",
                 check_crc: bool = True, decoded_cache: DecodedCacheOptions | None = None,
                 max_pixels: int | None = None,
                 num_workers: int | str = "auto", prefetch: int | str = "auto",
                 max_prefetch: int | None = None,
                 max_ring_bytes: int = WorkerOptions.max_ring_bytes,
                 timeout: float | None = None, persistent_workers: bool = False,
                 start_method: str | None = None, copy: bool = False,
                 device: str = "cpu", device_options: DeviceOptions | None = None,
                 cache: CacheOptions | None = None, monitor: Any = None,
                 ledger: bool | str | os.PathLike = False) -> None:
        # Argument errors first, before anything is opened.
        if batch_sampler is not None and not hasattr(batch_sampler, "bind"):
            raise ArgumentTypeError("batch_sampler must be a reader.batching.AspectRatioBatches or "
                            f"BudgetBatches, not {type(batch_sampler).__name__} {batch_sampler!r}")
        if batch_size is not None:
            batch_size = check_batch_size(batch_size)
        elif not isinstance(batch_sampler, BudgetBatches):
            batch_size = DEFAULT_BATCH_SIZE  # left out; BudgetBatches' budget sizes its own
        # The keywords, checked and normalized as the records the order, the workers
        # and the pipeline read (reader.options).
        self.sampler_options = SamplerOptions(
            shuffle=shuffle, seed=seed, drop_last=drop_last, rank=rank, world_size=world_size,
            shuffle_window=shuffle_window)
        check_pipeline_options(transform=transform, annotations=annotations, collate=collate,
                               decoders=decoders)  # the checks that need the pipeline's types
        self.decode_options = DecodeOptions(
            transform=transform, decode=decode, image_field=image_field, fields=fields,
            on_error=on_error, check_crc=check_crc, decoded_cache=decoded_cache,
            annotations=annotations, collate=collate, decoders=decoders, max_pixels=max_pixels)
        # on_error resolved once: the policy the plan and every builder of a batch call.
        self.bad_input = BadInput(self.decode_options.on_error, self.sampler_options.seed)
        self.worker_options = WorkerOptions(
            num_workers=num_workers, prefetch=prefetch, max_prefetch=max_prefetch,
            max_ring_bytes=max_ring_bytes, timeout=timeout, start_method=start_method,
            copy=copy, persistent_workers=persistent_workers)
        ledger = check_ledger(ledger)
        if device not in ("cpu", "cuda"):
            raise ArgumentError(f"device must be 'cpu' or 'cuda', not {device!r}"
                                f"{_device_number_hint(device)}")
        if device_options is not None and device != "cuda":
            why = (" (decode_device='cuda' decodes into the GPU's batch: there is none on a "
                   "CPU loader)" if getattr(device_options, "decode_device", None) == "cuda"
                   else "")
            raise ArgumentError("device_options apply to device='cuda' only; this Loader has "
                             f"device={device!r}{why}")
        check = self.decode_options.check_crc
        if isinstance(source, Mix):
            if batch_sampler is not None:
                raise ArgumentError("batch_sampler with a Mix: size-aware batches of a mixture "
                                    "are not supported yet; leave batch_sampler out")
            parts = [_own_dataset(s, cache, check) for s in source.sources.values()]
            self.dataset = MixedDataset(source.names, [d for d, _ in parts])
            self._owned_parts = [d for d, owned in parts if owned]
        else:
            self.dataset, owned = _own_dataset(source, cache, check)
            self._owned_parts = [self.dataset] if owned else []
        self.device = device
        self.device_options = device_options
        if device == "cuda":
            # Fail here, with the install hint, not at the first batch; one hint for
            # every extra this loader needs.
            require_cupy(getattr(device_options, "decode_device", None) == "cuda")
            self.device_options = device_options or DeviceOptions()
        if isinstance(source, Mix):
            ds = self.dataset
            self.sampler = MixOrder(ds.names, [len(d) for d in ds.parts],
                                    [d.starts for d in ds.parts], ds.offsets, source.weights,
                                    source.samples_per_epoch, batch_size, self.sampler_options)
        elif batch_sampler is None:
            self.sampler = Sampler(len(self.dataset), self.dataset.starts, batch_size,
                                   self.sampler_options)
        else:
            self.sampler = batch_sampler.bind(self.dataset, batch_size, self.sampler_options)
        self.batch_size = self.sampler.max_batch_size  # the slots hold the largest batch
        self._plan_fields()
        self._refuse_idle_options()
        gpu_decode = False
        if device == "cuda" and not self.raw:
            check_layout(self.plan, self.device_options)
            gpu_decode = resolve_decode_device(self.device_options, self.plan,
                                               self.decode_options, self.bad_input)
            if gpu_decode:
                self.plan = with_gpu_fields(self.plan, self.dataset)
                self.layout = self.plan.layout
        elif device == "cuda" and self.device_options.decode_device == "cuda":
            raise ArgumentError("decode_device='cuda' would have no effect: decode=False reads "
                                "raw bytes, nothing is decoded")
        #: Whether JPEGs are decoded on the GPU (DeviceOptions.decode_device, resolved).
        self.gpu_decode = gpu_decode
        self.runtime = Runtime(
            self.dataset, self.sampler, self.plan, self.spec, self.fields, self.worker_options,
            # decode=False reads in this process: "auto" must not name workers that never start.
            num_workers=0 if self.raw else resolve_num_workers(self.worker_options.num_workers),
            auto=self.worker_options.num_workers == "auto" and not self.raw, raw=self.raw,
            device_options=self.device_options if device == "cuda" else None,
            rank=self.sampler_options.rank, decoded_cache=self.decode_options.decoded_cache,
            gpu_decode=gpu_decode, tolerant=self.bad_input.tolerant)
        self.spec = self.runtime.spec  # with the runtime's decoded cache
        self.decoded_cache = self.runtime.decoded_cache
        self.monitor = resolve_monitor(monitor, num_workers=self.num_workers)
        if self.monitor is not None:
            if hasattr(self.dataset, "cache"):
                self.monitor.storage = "remote"  # a diagnosis that names the shard cache
            self.monitor.count_workers(self.runtime.worker_pids)
            self.monitor.set_rank(self.sampler_options.rank, self.sampler_options.world_size)
            self.runtime.listeners.append(_MonitorListener(self.monitor))
        self.ledger = None
        if ledger is not None:
            self.ledger = Ledger(self._stable_ids, self.sampler_options.rank,
                                 None if ledger is True else ledger)
            self.runtime.listeners.append(self.ledger)
        self.cursor = self.runtime.cursor  # epoch, position, skipped, slowest
        self._resume = False  # load_state_dict() since the last iter(): it starts there
        self._active: weakref.ref | None = None
        self._closed = False
        self._pid = os.getpid()

    # -- planning ----------------------------------------------------------------------

    def _plan_fields(self) -> None:
        ds, opts = self.dataset, self.decode_options
        for name in (*(opts.fields or ()), opts.image_field):
            if name in getattr(ds, "differing", ()):
                raise ArgumentError(f"field {name!r} is not alike in every source of the "
                                    f"mixture: {ds.differing[name]}; a mixture reads the "
                                    "fields its sources share, stored alike")
        if opts.fields is None and opts.image_field is None and hasattr(ds, "nothing_shared"):
            why = ds.nothing_shared()
            if why is not None:
                raise ArgumentError(f"{why}; pack the sources with the fields you train on "
                                    "stored alike, or name fields=('key',) to read the keys "
                                    "alone")
        check_fields(opts, {f.name: f.type for f in ds.fields}, ds.root)
        self.raw = not opts.decode
        field = getattr(self.sampler, "size_field", None)
        budget = (field, self.sampler.budget, self.sampler.padded) if field else None
        plan, _ = plan_batch(ds, opts, self.sampler.max_batch_size, raw=self.raw,
                             bad_input=self.bad_input, budget=budget)
        self.fields = opts.fields or tuple(f.name for f in ds.fields)
        self.image_field = plan.image
        self.main_fields = plan.main_fields
        self.plan = plan
        check_decoded_cache(opts.decoded_cache, plan)
        self.spec = BatchSpec(plan.image, plan.pipeline, plan.slot_fields, self.bad_input,
                              self.sampler_options.seed, self.sampler_options.rank,
                              None, plan.sample, plan.main_fields)
        self.layout = plan.layout

    def _refuse_idle_options(self) -> None:
        """Options this loader would accept and never use: refused, naming why."""
        w, d = self.worker_options, self.decode_options
        if self.raw:
            idle = {"transform": d.transform is not None, "on_error": self.bad_input.tolerant,
                    "annotations": d.annotations is not None, "collate": bool(d.collate),
                    "decoders": bool(d.decoders),
                    "num_workers": w.num_workers not in ("auto", 0),
                    "prefetch": w.prefetch != "auto", "timeout": w.timeout is not None,
                    "persistent_workers": w.persistent_workers,
                    "max_prefetch": w.max_prefetch is not None,
                    "max_ring_bytes": w.max_ring_bytes != WorkerOptions.max_ring_bytes,
                    "start_method": w.start_method is not None,
                    "image_field": d.image_field is not None}
            why = ("decode=False reads raw bytes in this process: no decoding, no workers, "
                   "nothing in flight")
        elif resolve_num_workers(w.num_workers) == 0:
            idle = {"timeout": w.timeout is not None, "persistent_workers": w.persistent_workers,
                    "prefetch": w.prefetch not in ("auto", 1),
                    "max_prefetch": w.max_prefetch is not None,
                    "start_method": w.start_method is not None}
            why = "num_workers=0 builds each batch in this process when it is asked for"
        else:
            return
        named = [k for k, v in idle.items() if v]
        if named:
            raise ArgumentError(f"{', '.join(named)} would have no effect: {why}; leave "
                             f"{'it' if len(named) == 1 else 'them'} out")

    def _stable_ids(self, epoch: int, k: int):
        """Batch ``k``'s records as the ledger's ids: a mixture's say which source
        (:meth:`reader.batching.mixture.MixOrder.ledger_ids`), a dataset's are its records."""
        ids = self.sampler.batch(epoch, k)
        if isinstance(self.sampler, MixOrder):
            return self.sampler.ledger_ids(ids)
        return np.asarray(ids, np.int64).astype(np.uint64)

    @property
    def ring(self) -> SlotRing | None:
        """The shared slot ring (created with the first epoch; None in raw mode)."""
        return self.runtime.ring

    @property
    def num_workers(self) -> int:
        """Worker processes now (``num_workers="auto"`` moves it while the loader runs)."""
        return self.runtime.num_workers

    @property
    def worker_changes(self) -> list[ScaleChange]:
        """Every change ``num_workers="auto"`` made: :class:`reader.runtime.autoscale.ScaleChange`."""
        sc = self.runtime.scaler
        return list(sc.changes) if sc is not None else []

    # -- iteration ---------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches in the current epoch (for this rank; with ``BudgetBatches`` the count
        differs from one epoch to the next)."""
        return self.sampler.num_batches_in(self.epoch)

    def __iter__(self) -> Iterator[dict]:
        if self._closed:
            raise LoaderError("this Loader is closed")
        if self._pid != os.getpid():
            # A forked child: the ring and the workers are the parent's (its workers write
            # into that ring); this process gets its own, and leaves those alone.
            self.runtime.forget_after_fork()
            self._active = None
            self._pid = os.getpid()
        self._stop_active("a newer iter() of this Loader replaced this iterator: a Loader runs "
                          "one iterator at a time (zip(loader, loader), or next(iter(loader)) "
                          "inside a loop over it, reads one stream of batches, not two)")
        self._start_loop()
        it = self.runtime.epoch(self.cursor.epoch, self.cursor.position)
        # ``for b in Loader(...)`` holds only the iterator: it keeps the Loader (and so
        # its dataset and runtime) alive until the loop is done; the epoch never uses it.
        it.owner = self
        self._active = weakref.ref(it)
        return it

    def _start_loop(self) -> None:
        """Move the cursor to where a new ``iter()`` starts (the rule in the class docstring)."""
        c = self.cursor
        n = self.sampler.num_batches_in(c.epoch)
        if 0 < n <= c.position:
            # Every batch was delivered (by a loop not run to its end, or before a loaded
            # state was saved): the epoch is finished.
            c.finished(c.epoch, n)
        elif not self._resume:
            c.position = 0  # a loop left early: its epoch again, from the first batch
        self._resume = False

    # The cursor's fields, as the loader's own (state_dict, set_epoch and users read them).
    epoch = property(lambda self: self.cursor.epoch,
                     lambda self, v: setattr(self.cursor, "epoch", v))
    position = property(lambda self: self.cursor.position,
                        lambda self, v: setattr(self.cursor, "position", v))
    skipped = property(lambda self: self.cursor.skipped,
                       lambda self, v: setattr(self.cursor, "skipped", v))

    @property
    def replaced(self) -> int:
        """Samples replaced so far (``on_error="replace"``), all epochs and resumes."""
        return self.cursor.quarantine.replaced

    @property
    def quarantine(self) -> list[tuple[str | None, int, int]]:
        """The records replaced so far (``on_error="replace"``), each once, in the order
        served: ``(source, record, replacement)``, numbered within the source (the
        ``Mix`` source's name, else None); at most
        :data:`~reader.transforms.bad_input.QUARANTINE_MAX` are listed."""
        return self.cursor.quarantine.entries

    def _stop_active(self, why: str | None = None) -> None:
        """End the running iterator; if it had batches left, its next ``next()``
        raises ``RuntimeError(why)`` instead of quietly ending the epoch."""
        it = self._active() if self._active is not None else None
        if it is not None:
            if why is not None and not it.finished:
                it.superseded = why
            it.shutdown()
        self._active = None

    def set_epoch(self, epoch: int) -> None:
        """Make ``epoch`` current, starting at its first batch; the current epoch is left
        as it is (so a state loaded by :meth:`load_state_dict` survives the usual
        ``set_epoch`` at the top of a training loop)."""
        epoch = check_epoch(epoch, "Loader")
        if epoch != self.epoch:
            self._stop_active(f"set_epoch({epoch}) moved this Loader to another epoch")
            self.epoch, self.position = int(epoch), 0
            self._resume = False

    def state_dict(self) -> dict:
        """Where the loader is: the next unseen batch of the current (or last) loop, plus
        what the order depends on. :meth:`load_state_dict` on any Loader of the same order
        resumes there."""
        if isinstance(self.sampler, MixOrder):
            state = self.sampler.state(self.epoch, self.position)
        else:
            epoch, batch = next_unseen(self.sampler, self.epoch, self.position)
            state = {"epoch": epoch, "batch": batch,
                     "num_batches": self.sampler.num_batches_in(epoch), **self.sampler.describe()}
        if self.ledger is not None:
            state["ledger"] = self.ledger.state()
        if self.bad_input.replaces:
            state["quarantine"] = self.cursor.quarantine.state()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Make the next ``iter()`` continue exactly at the batch after the last one
        delivered when ``state`` was taken (a running iterator is ended).

        Raises:
            StateError: ``state`` is not a state dict, or was taken with a different
                order, batching or partitioning (a ``ValueError``).
        """
        kept = ("ledger", "quarantine")  # what the loader carries beside the order's position
        # Everything checked before anything changes: a refused state leaves the loader as it was.
        quarantine = Quarantine.from_state(state.get("quarantine")
                                           if isinstance(state, dict) else None)
        if self.ledger is not None:
            Ledger.parse(state)
        if isinstance(self.sampler, MixOrder):
            position = self.sampler.resume(state)
        else:
            if isinstance(state, dict) and state.get("order") == MIX_ORDER:
                raise StateError("loader state was saved by a Loader over a reader.Mix (of "
                                 f"{', '.join(map(repr, state.get('sources', {})))}); this "
                                 "Loader reads one dataset: pass the same reader.Mix")
            mine = {k: v for k, v in self.state_dict().items() if k not in kept}
            check_resume(mine, {k: v for k, v in state.items() if k not in kept}
                         if isinstance(state, dict) else state, "loader")
            position = next_unseen(self.sampler, int(state["epoch"]), int(state["batch"]))
        if self.ledger is not None:
            self.ledger.resume(state)
        self.cursor.quarantine = quarantine
        self._stop_active("load_state_dict() moved this Loader to the saved position")
        self.epoch, self.position = position
        self._resume = True

    def plan_report(self) -> dict:
        """A mixture's progress at the next unseen batch: per source (by name) its
        ``weight`` (share), ``records``, ``pass`` (from 0), ``served`` and ``left`` of
        that pass, and ``in_plan`` (False for a source a loaded state knew that this
        mixture dropped).

        Raises:
            LoaderError: this Loader reads one dataset, not a :class:`reader.Mix`.
        """
        if not isinstance(self.sampler, MixOrder):
            raise LoaderError("plan_report() describes a mixture: this Loader reads one "
                              "dataset (pass a reader.Mix to mix several)")
        return self.sampler.report(self.epoch, self.position)

    def stats(self) -> dict:
        """The monitor's figures, or a minimal dict when no monitor is attached."""
        if self.monitor is not None:
            return self.monitor.stats()
        return {"epoch": self.epoch, "batch": self.position, "skipped": self.skipped,
                "replaced": self.replaced, "num_workers": self.num_workers}

    # -- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Stop the workers and release the shared ring. Idempotent."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        self._stop_active("this Loader was closed")
        self.runtime.close()  # workers, then the ring and the decoded cache
        if self.monitor is not None:
            self.monitor.flush()  # the interval in progress reported, the trace written
        if self.ledger is not None:
            self.ledger.close()
        for d in self._owned_parts:
            d.close()  # unmaps, and unpins a remote dataset's cached shards

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _device_number_hint(device: Any) -> str:
    """For ``device='cuda:1'`` (PyTorch's spelling): where the GPU's number goes."""
    text = str(device)
    head, sep, number = text.partition(":")
    if head.strip().lower() != "cuda" or not sep:
        return ""
    number = number.strip() if number.strip().isdigit() else "N"
    return (f"; the GPU's number goes in the device options: device='cuda', "
            f"device_options=DeviceOptions(device_id={number}) (left out, each rank takes "
            "the GPU of its LOCAL_RANK)")


def _own_dataset(source, cache, check: bool):
    """(the dataset a Loader reads, whether it opened it): a folder or URI is opened; a
    given ``ShardDataset`` checking CRCs otherwise is copied (its maps reopened, the
    user's object never changed)."""
    if not isinstance(source, ShardDataset):
        return open_dataset(source, cache=cache, check_crc=check), True
    if source.check_crc != check:
        own = shallow_copy(source)
        own.check_crc = check
        return own, True
    return source, False


class _MonitorListener:
    """The monitor as a listener of the runtime (:class:`reader.runtime.runtime.Listener`)."""

    def __init__(self, monitor) -> None:
        self.monitor = monitor

    def on_batch(self, timing: BatchTiming) -> None:
        self.monitor.on_batch(timing)

    def on_workers_changed(self, n: int, change: ScaleChange) -> None:
        self.monitor.num_workers = n
        self.monitor.note(f"workers {change.before} -> {change.after}: {change.reason}")
