"""Name the loader's bottleneck from the monitor's figures.

:func:`diagnose` is a pure function of a figures dict (as found under
``"current"`` or ``"mean"`` in :meth:`reader.monitor.monitor.Monitor.stats`)
and of the previous verdict, so every rule can be tested with hand-written
numbers. The rules follow the patterns of the MegEngine Data Monitor, plus one
for a machine whose cores other programs take, in this order:

1. transfer-bound: host-to-device bandwidth is low *and* the copy costs a
   visible share of wall time. Checked first because the copy runs on the
   consumer's side, so it slows training even when the queue never runs dry.
2. healthy: the consumer rarely waits for a batch, so the training step, not
   the loader, sets the pace.
3. CPU-bound by other processes: the consumer waits, the cores are nearly all
   busy and other programs (not this process or its workers, measured from
   ``/proc``) use a large share of them. The workers are starved, whatever the
   other figures say: a starved worker looks idle (it is not scheduled to pick
   up work), and so does a starved main process.
4. in the main process: no worker builds (``num_workers=0``, or raw mode,
   ``decode=False``, which has no workers): the consumer waits while its own
   process builds each batch inside ``next()``, so the advice is about that
   process (worker processes, or for the gathering of raw fields, less copying),
   never prefetch or more workers, which it does not have. Called CPU-bound,
   with the stage that takes the build's time.
5. sync-bound: the consumer waits but the workers are often idle. When most of
   the wait is for epochs' first batches, the workers' start-up is to blame
   (short epochs, workers not persistent). With fewer
   batches in flight than workers, they are not allowed to run far enough
   ahead (prefetch too small for a bursty consumer); with work queued, the
   main process is slow to dispatch and collect it (task scheduling); the GPU
   decode stage runs there too, and the message gives its share of wall time.
6. IO-bound: busy workers spend their time reading, not decoding.
7. CPU-bound: busy workers spend their time decoding, transforming (user
   callables and any augmentation after the decode) or assembling; the message
   names the stage and the fix for that stage. When the GPU decodes part of each
   batch (``decode_device="cuda"``), it says how much and at what rate: the split
   already balances the two sides, so the fix is still the workers'.

Stability: given the previous verdict, each limit that chooses between two
verdicts is moved by ``Thresholds.hysteresis`` (a fraction of the limit) in
favour of the verdict already shown, so figures that hover around a limit do
not make the verdict flip from one report to the next. The monitor also shows
a new verdict only once several intervals in a row agree on it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from formats.errors import ArgumentError

__all__ = ["KINDS", "Diagnosis", "Thresholds", "diagnose"]

KINDS = ("no-data", "healthy", "io-bound", "cpu-bound", "transfer-bound", "sync-bound")

# Verdicts that blame the loader's side (the consumer waits for it).
_LOADER_KINDS = ("io-bound", "cpu-bound", "sync-bound")


@dataclass(frozen=True)
class Thresholds:
    """Limits the report marks and the diagnosis uses.

    The first five are the seed's "suggested thresholds".

    Args:
        max_load_latency_ms: mean time from a batch being requested to ready.
        max_decode_share_pct: decode time as a share of worker busy time below
            which a run that reads more than ``max_io_share_pct`` is IO-bound (rule
            6). Not a limit on the decode share itself, which is most of the work of
            any JPEG pipeline: the table shows none for it.
        max_io_share_pct: read time as a share of worker busy time; above it
            (with a low decode share) the loader is IO-bound.
        min_h2d_gb_s: host-to-device copy bandwidth.
        max_queue_wait_pct: share of wall time the consumer blocks in ``next()``.
        min_worker_busy_pct: below this, a waiting consumer with idle workers
            means the workers are held back (sync-bound), not overloaded.
        min_h2d_share_pct: a slow copy only matters when it costs at least
            this share of wall time.
        max_other_cpu_pct: CPU time of other processes, as a share of all the
            machine's cores; above it, with the cores nearly all busy, a waiting
            consumer is blamed on them.
        min_idle_cpu_pct: idle share of all cores below which they count as
            nearly all busy.
        hysteresis: how far (a fraction of the limit) a figure must cross a
            limit before the verdict changes from the previous one; 0 judges
            every report on its own.
    """

    max_load_latency_ms: float = 20.0
    max_decode_share_pct: float = 35.0
    max_io_share_pct: float = 50.0
    min_h2d_gb_s: float = 5.0
    max_queue_wait_pct: float = 10.0
    min_worker_busy_pct: float = 75.0
    min_h2d_share_pct: float = 5.0
    max_other_cpu_pct: float = 20.0
    min_idle_cpu_pct: float = 10.0
    hysteresis: float = 0.1

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
                raise ArgumentError(f"Thresholds.{name}: expected a number >= 0, found {value!r}")
            if name.endswith("_pct") and value > 100:
                raise ArgumentError(f"Thresholds.{name}: expected a percentage <= 100, found {value!r}")
        if self.hysteresis >= 1:
            raise ArgumentError(f"Thresholds.hysteresis: expected a fraction < 1, found {self.hysteresis!r}")


@dataclass(frozen=True)
class Diagnosis:
    """The verdict for one set of figures.

    Attributes:
        kind: one of :data:`KINDS`.
        message: one line naming the bottleneck, the evidence and the fix.
        cause: what within ``kind`` is to blame: the stage for ``cpu-bound``
            (``decode``, ``transform``, ``assemble``, ``read``) or
            ``other-processes``; ``prefetch``, ``startup`` (waiting for the
            workers to start, each epoch) or ``dispatch`` for ``sync-bound``; ``storage`` or ``remote-storage`` for ``io-bound``;
            ``h2d`` for ``transfer-bound``; ``consumer`` when healthy.
    """

    kind: str
    message: str
    cause: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message, "cause": self.cause}


def _num(figures: dict[str, Any], key: str, default: float = 0.0) -> float:
    value = figures.get(key)
    return default if value is None else float(value)


def _over(value: float, limit: float, band: float, keep: int) -> bool:
    """``value >= limit``, the limit moved by ``band`` x limit in favour of the verdict
    shown: ``keep`` is +1 when the previous verdict is the one a True answer gives,
    -1 when it is one a False answer gives, 0 when neither (no bias)."""
    return value >= limit * (1.0 - band * keep)


def _under(value: float, limit: float, band: float, keep: int) -> bool:
    """``value < limit``, with the same bias as :func:`_over`."""
    return value < limit * (1.0 + band * keep)


def _keep(previous: Diagnosis | None, yes: bool, no: bool) -> int:
    if previous is None:
        return 0
    return 1 if yes else -1 if no else 0


_STAGE_FIXES = {
    "decode": "re-pack with `pack-dataset --max-side N`, or decode at reduced size",
    "transform": "the transform is the cost, not the JPEG decode: simplify the transform "
                 "callables, or run them on the batch on the GPU after the copy",
    "assemble": "use fewer, larger fields per record or a larger batch",
    "read": "faster storage or larger shards",
}  # fmt: skip


def diagnose(
    stats: dict[str, Any],
    thresholds: Thresholds | None = None,
    previous: Diagnosis | None = None,
) -> Diagnosis:
    """Name the bottleneck and the fix.

    Args:
        stats: a figures dict, or a whole ``Monitor.stats()`` dict (its
            ``"current"`` figures are used).
        thresholds: the limits; defaults to :class:`Thresholds()`.
        previous: the verdict shown so far; limits are biased towards keeping it
            (see ``Thresholds.hysteresis``). None judges the figures alone.

    Returns:
        The :class:`Diagnosis`.
    """
    th = thresholds or Thresholds()
    f = stats["current"] if isinstance(stats.get("current"), dict) else stats
    if not f or not f.get("batches"):
        return Diagnosis("no-data", "no batches delivered yet")
    if previous is not None and previous.kind == "no-data":
        previous = None
    band = th.hysteresis
    kind = previous.kind if previous is not None else None
    cause = previous.cause if previous is not None else None

    wait = _num(f, "queue_wait_pct")
    busy = _num(f, "worker_busy_pct")
    latency = _num(f, "load_latency_ms")
    io = _num(f, "io_share_pct")
    decode = _num(f, "decode_share_pct")
    transform = _num(f, "transform_share_pct")
    assemble = _num(f, "assemble_share_pct")
    workers = int(_num(f, "num_workers", 1))  # 0: built in the main process
    h2d_gb_s = f.get("h2d_gb_s")
    h2d_share = _num(f, "h2d_share_pct")
    other, idle = f.get("other_cpu_pct"), f.get("idle_cpu_pct")

    if (
        h2d_gb_s is not None
        and h2d_gb_s < th.min_h2d_gb_s
        and _over(h2d_share, th.min_h2d_share_pct, band,
                  _keep(previous, kind == "transfer-bound", kind is not None))
    ):  # fmt: skip
        return Diagnosis(
            "transfer-bound",
            f"transfer-bound: host-to-device copies run at {h2d_gb_s:.2f} GB/s "
            f"(< {th.min_h2d_gb_s:g}) and take {h2d_share:.0f}% of wall time -> use pinned "
            "host memory, larger batches, and transfer uint8 (normalize on the GPU)",
            "h2d",
        )
    if _under(wait, th.max_queue_wait_pct, band,
              _keep(previous, kind == "healthy", kind in _LOADER_KINDS)):  # fmt: skip
        return Diagnosis(
            "healthy",
            f"healthy: the consumer waits only {wait:.1f}% of the time "
            f"(< {th.max_queue_wait_pct:g}%); the training step, not the loader, sets the pace",
            "consumer",
        )
    stage, share = max(
        (("decode", decode), ("transform", transform), ("assemble", assemble), ("read", io)),
        key=lambda item: item[1],
    )
    starved = cause == "other-processes"
    keep = _keep(previous, starved, kind in _LOADER_KINDS and not starved)
    if (
        other is not None
        and idle is not None
        and _over(other, th.max_other_cpu_pct, band, keep)
        and _under(idle, th.min_idle_cpu_pct, band, keep)
    ):
        loader = _num(f, "loader_cpu_pct")
        return Diagnosis(
            "cpu-bound",
            f"CPU-bound: other processes use {other:.0f}% of the cores (this loader "
            f"{loader:.0f}%, idle {idle:.0f}%) while the consumer waits {wait:.0f}% of the "
            "time -> the workers are starved of CPU: stop or `nice` the other processes, or "
            "run where cores are free; more workers will not help (of the workers' own time, "
            f"{stage} takes {share:.0f}%)",
            "other-processes",
        )
    if workers == 0:
        return _in_process(wait, busy, stage, share)
    if _under(busy, th.min_worker_busy_pct, band,
              _keep(previous, kind == "sync-bound", kind in ("io-bound", "cpu-bound"))):  # fmt: skip
        depth = _num(f, "prefetch_depth")
        first = _num(f, "first_batch_wait_pct")
        if first >= 0.5 * wait:
            # Most of the wait is for epochs' first batches: the workers are starting.
            starts = int(_num(f, "epochs_started"))
            return Diagnosis(
                "sync-bound",
                f"sync-bound: the consumer waits {wait:.0f}% of the time, {first:.0f}% for the "
                f"first batch of the {starts} epoch(s) started -> the workers start anew every "
                "epoch: persistent_workers=True starts them once; or make epochs longer",
                "startup",
            )
        if depth < workers:
            return Diagnosis(
                "sync-bound",
                f"sync-bound: the consumer waits {wait:.0f}% of the time while workers are only "
                f"{busy:.0f}% busy with {depth:.1f} batches in flight for {workers} worker(s) "
                "-> raise prefetch so workers run ahead of bursts in the consumer",
                "prefetch",
            )
        # Work is queued yet workers idle: handing out tasks and collecting batches
        # (the main process) is what they wait for, so deeper prefetch would not help.
        return Diagnosis(
            "sync-bound",
            f"sync-bound: the consumer waits {wait:.0f}% of the time and workers are only "
            f"{busy:.0f}% busy although {depth:.1f} batches are in flight -> the main process "
            f"is slow to dispatch and collect batches{_gpu_stage(f)}: leave a core free for it "
            "(fewer workers), use larger batches, or move per-batch work out of the training "
            "loop",
            "dispatch",
        )
    if _over(io, th.max_io_share_pct, band,
             _keep(previous, kind == "io-bound", kind == "cpu-bound")) and (
        decode < th.max_decode_share_pct
    ):  # fmt: skip
        rate = f.get("read_mb_s")
        rate_text = "" if rate is None else f", reading at {rate:.0f} MB/s"
        remote = f.get("storage") == "remote"
        fix = ("faster storage, larger shards, block shuffle, or warm the page cache"
               if not remote else
               "shards are being downloaded: give the cache folder room for the dataset "
               "(later epochs then read locally), raise CacheOptions(prefetch_shards=, "
               "download_threads=), and use block shuffle")
        return Diagnosis(
            "io-bound",
            f"IO-bound: workers spend {io:.0f}% of their time reading and {decode:.0f}% "
            f"decoding, load latency {latency:.1f} ms{rate_text} -> {fix}",
            "remote-storage" if remote else "storage",
        )
    who = f"the {workers} worker(s) are"
    if idle is not None and idle < th.min_idle_cpu_pct:
        more = f"the cores are {100 - idle:.0f}% busy, so more workers will not help; "
    else:
        more = "add workers, or "
    return Diagnosis(
        "cpu-bound",
        f"CPU-bound: {stage} takes {share:.0f}% of worker time and {who} {busy:.0f}% busy"
        f"{_gpu_part(f, stage)} -> {more}{_STAGE_FIXES[stage]}",
        stage,
    )


def _in_process(wait: float, busy: float, stage: str, share: float) -> Diagnosis:
    """Rule 4: the main process builds every batch (no workers), and the consumer waits."""
    if stage == "assemble":
        # Nothing decoded: the build is gathering the records' fields into the batch.
        fix = ("gathering the fields is memory-bound copying, not decoding; decode=False "
               "always reads in this process (it has no workers): return only the fields "
               "the step uses (fields=...), keep copy=False, or use larger batches")
    else:
        fix = ("use worker processes (num_workers > 0, or 'auto'): they build batches while "
               f"the training step runs; then {_STAGE_FIXES[stage]}")
    return Diagnosis(
        "cpu-bound",
        f"CPU-bound in the main process: it builds each batch inside next() (num_workers=0, "
        f"or decode=False), busy {busy:.0f}% of wall time while the consumer waits "
        f"{wait:.0f}%; {stage} takes {share:.0f}% of the build -> {fix}",
        stage,
    )


def _gpu_stage(f: dict[str, Any]) -> str:
    """The GPU decode's share of wall time, for a slow main process (rule 5): the GPU
    stage runs there, inside ``next()``; "" without GPU decode."""
    pct, gpu, wall = f.get("gpu_decode_pct"), f.get("gpu_img_s"), f.get("wall_s")
    if not pct or not gpu or not wall:
        return ""
    seconds = f.get("samples", 0) * pct / 100 / gpu
    return f" (the GPU decode stage, which runs there, takes {100 * seconds / wall:.0f}% of wall time)"


def _gpu_part(f: dict[str, Any], stage: str) -> str:
    """What the GPU decode already takes off a CPU-bound loader's workers (rule 7), or "".

    The split controller (:mod:`reader.runtime.split`) gives the GPU the share of each
    batch that finishes both sides together, so with both rates measured, moving more
    images to the GPU would only make it the slower side; the workers' own fixes are
    what is left. Only for the stages the split balances (decode and transform).
    """
    pct, gpu, cpu = f.get("gpu_decode_pct"), f.get("gpu_img_s"), f.get("cpu_img_s")
    if not pct or gpu is None or stage not in ("decode", "transform"):
        return ""
    workers = "" if cpu is None else f" (the workers {cpu:.0f} img/s)"
    return (f"; the GPU decodes {pct:.0f}% of the samples at {gpu:.0f} img/s{workers}, the "
            "share the split chose from both rates, so moving more to the GPU will not help")
