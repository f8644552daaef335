"""Per-batch timings: measured by the code that does the work, summed by whoever listens.

A worker measures its own stages and sends them back in the batch-done message
(a :class:`WorkerTiming`); the main process adds what only it can
see (how long ``next()`` waited, latency, prefetch depth) and hands one
:class:`BatchTiming` per batch to ``monitor.on_batch`` just before the batch is
returned to the user. With no monitor attached nothing is built at all.

``BatchTiming`` is a plain slotted dataclass, not a frozen one: it is built on
the consumer's hot path for every batch (a frozen dataclass costs about six
times as much to build, and ``dataclasses.replace`` another few microseconds),
and the loader and a device sink fill in ``next_s`` and ``h2d_*`` in place
before the monitor sees it. Treat it as read-only once ``on_batch`` has it.

Clocks: every time stamp is ``time.perf_counter()``, which on Linux is
``CLOCK_MONOTONIC`` (system-wide: the same clock in every process, whatever the
start method), so a worker's ``done_at`` and the main process's issue time are
comparable, and the monitor's timeline (:mod:`reader.monitor.trace`) draws both
on one time axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from formats.fields import BYTES_TYPES, SCALAR_TYPES

__all__ = ["BatchTiming", "WorkerTiming", "batch_timing", "stored_bytes"]


class WorkerTiming(NamedTuple):
    """What a builder measured for one batch (crosses the done queue; built by name).

    The stages are those of :class:`BatchTiming`; ``done_at`` is the builder's
    ``time.perf_counter()`` when the batch was finished, so the main process
    measures latency up to there, not up to when it reads the message.
    """

    io_s: float
    decode_s: float
    transform_s: float
    assemble_s: float
    busy_s: float
    bytes: int
    records: int
    skipped: int
    done_at: float
    gpu_records: int = 0  # records staged for the GPU decode (reader.runtime.gpu_decode)
    read_bytes: int = 0  # of ``bytes``, those paged in during ``io_s``


@dataclass(slots=True)
class BatchTiming:
    """What one batch cost, stage by stage.

    Worker side (``worker`` is -1 and the stages are measured in the main process
    when ``num_workers=0`` or in raw mode):

    Attributes:
        batch: the batch number within the epoch (0-based, in delivery order).
        epoch: the epoch the batch belongs to.
        worker: id of the worker that built it (0..num_workers-1), -1 in-process.
        records: records in the batch.
        bytes: stored bytes of the batch's records, every field it carries (images,
            text, tokens, raw bytes, annotations, scalars; their index lengths summed:
            :func:`stored_bytes`), whoever reads them: the monitor's ``mb_per_s``.
        read_bytes: of ``bytes``, those the builder paged in itself, the time
            ``io_s`` measures: the monitor's ``read_mb_s``. Fields handed out as views
            over the shards (raw mode, text and bytes fields the main process serves)
            are read when the consumer touches them, by no stage of the loader, so
            they are in ``bytes`` only.
        skipped: records that failed to decode and were skipped (``on_error="skip"``).
        io_s: time to page in the records' bytes (touching each page before decoding).
        decode_s: decode time, as the pipeline reports it: for
            ``reader.transforms.imaging.DecoderPipeline`` the fused decode, crop, resize and
            flip (they cannot be timed apart: the DCT scale does part of the resize).
        transform_s: what runs on the decoded image after that: user callables
            and any augmentation a pipeline applies after decoding (0 when none).
            The monitor's ``transform`` stage; counting it as ``decode_s`` would
            make the monitor advise re-packing for a slow augmentation.
        assemble_s: writing scalar fields, the valid mask and the padded or ragged
            per-sample arrays into the slot.
        busy_s: wall time of the whole batch in the worker.

    Main-process side:

    Attributes:
        wait_s: how long ``next()`` blocked waiting for this batch (0 if it was
            ready); with ``num_workers=0``, the time ``next()`` spent building it.
        latency_s: from the batch's request being issued to its builder (a worker,
            or the main process) finishing it. Time a finished batch then sits in
            the done queue while the consumer is busy does not count.
        next_s: from the user's ``next()`` call to the batch being returned.
        prefetch: batches in flight (issued, not yet consumed) when it was requested.
        h2d_s: host-to-device copy time (``device="cuda"`` only, else None).
        h2d_bytes: bytes copied to the device (``device="cuda"`` only, else None).
        ready: the batch was finished before ``next()`` was called (its builder's
            ``done_at`` precedes the call), so the consumer found it waiting: the
            monitor's ``data_readiness_pct`` (SPDL's "data readiness"). Never for a
            batch built inside ``next()`` (``num_workers=0``, raw mode).
        gpu_records: records of the batch the GPU decoded (``decode_device="cuda"``
            only, else None); the workers decoded ``records - gpu_records``.
        gpu_decode_s: the GPU stage's seconds measured complete during this batch
            (the main process's CPU time building the code streams, then decode and
            resample by CUDA events), usually the batch before's: events are read once done, never
            waited for, so over an interval its sum matches ``gpu_records``'.
        gpu_share: the GPU's share of the next batches (:mod:`reader.runtime.split`);
            with ``cpu_img_s`` and ``gpu_img_s``, the rates it was chosen from.

    Time stamps (``time.perf_counter()``, one clock in every process; 0.0 when
    not known), for the timeline:

    Attributes:
        done_at: when the builder finished the batch; it ran from
            ``done_at - busy_s``.
        wait_at: when ``next()`` began waiting for this batch (after handing back
            slots and issuing requests).
    """

    batch: int
    epoch: int
    worker: int
    records: int
    bytes: int
    skipped: int
    io_s: float
    decode_s: float
    transform_s: float
    assemble_s: float
    busy_s: float
    wait_s: float
    latency_s: float
    next_s: float
    prefetch: int
    h2d_s: float | None = None
    h2d_bytes: int | None = None
    ready: bool = False
    gpu_records: int | None = None
    gpu_decode_s: float | None = None
    gpu_share: float | None = None
    cpu_img_s: float | None = None
    gpu_img_s: float | None = None
    done_at: float = 0.0
    wait_at: float = 0.0
    read_bytes: int = 0


def batch_timing(t: WorkerTiming, *, batch: int, epoch: int, worker: int, wait_s: float,
                 latency_s: float, prefetch: int, ready: bool = False,
                 wait_at: float = 0.0) -> BatchTiming:
    """The monitor's record of one batch: the worker's figures and the main process's."""
    return BatchTiming(batch=batch, epoch=epoch, worker=worker, records=t.records, bytes=t.bytes,
                       skipped=t.skipped, io_s=t.io_s, decode_s=t.decode_s,
                       transform_s=t.transform_s, assemble_s=t.assemble_s, busy_s=t.busy_s,
                       wait_s=wait_s, latency_s=latency_s, next_s=0.0, prefetch=prefetch,
                       ready=ready, done_at=t.done_at, wait_at=wait_at,
                       read_bytes=t.read_bytes)


def stored_bytes(ds, names, indices, batch: dict | None = None) -> int:
    """The stored bytes of fields ``names`` of records ``indices``, for the monitor's
    byte counts (``BatchTiming.bytes``), with no Python work per record.

    An ``int`` or ``float`` field is 8 bytes a record (FORMAT.md); an uncompressed bytes
    field that ``batch`` holds is its list of stored payloads, summed by ``len`` in C;
    any other field is its index lengths (``ds.spans``, one numpy gather a batch).
    """
    n = 0
    for name in names:
        f = ds.fields[ds.field_index[name]]
        if f.type in SCALAR_TYPES:
            n += 8 * len(indices)
        elif batch is not None and f.type in BYTES_TYPES and f.compression == "none":
            n += sum(map(len, batch[name]))
        else:
            n += int(ds.spans(indices, name)[2].sum())
    return n
