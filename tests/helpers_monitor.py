"""Synthetic batch timings for monitor tests: a fake clock, fake CPU ticks, a pipeline model."""

from __future__ import annotations

from dataclasses import dataclass

from reader.runtime.proc import CpuTicks

try:
    from reader.runtime.timing import BatchTiming
except ImportError:  # the loader's timing module is not there yet
    BatchTiming = None


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeCpu:
    """CPU ticks that advance with a :class:`FakeClock`, for ``Monitor(cpu=...)``.

    Between two calls the machine's ``cores`` spend ``loader_pct`` of their time
    in the loader and ``other_pct`` in other processes (all cores = 100); change
    them between intervals to model a competing program that starts or stops.
    """

    HZ = 100

    def __init__(self, clock: FakeClock, cores: int = 2, loader_pct: float = 50.0,
                 other_pct: float = 0.0) -> None:  # fmt: skip
        self.clock = clock
        self.cores = cores
        self.loader_pct = loader_pct
        self.other_pct = other_pct
        self._at = clock.now
        self._busy = self._total = self._loader = 0.0

    def __call__(self) -> CpuTicks:
        ticks = (self.clock.now - self._at) * self.HZ * self.cores
        self._at = self.clock.now
        self._total += ticks
        self._loader += ticks * self.loader_pct / 100
        self._busy += ticks * (self.loader_pct + self.other_pct) / 100
        return CpuTicks(round(self._busy), round(self._total), round(self._loader))


@dataclass(frozen=True)
class Pattern:
    """One batch's costs in a steady pipeline (seconds, bytes)."""

    io: float = 0.001
    decode: float = 0.004
    transform: float = 0.002
    assemble: float = 0.0005
    step: float = 0.020  # consumer's own time per batch
    wait: float = 0.0  # consumer's wait per batch
    latency: float = 0.010
    records: int = 32
    nbytes: int = 32 * 100_000
    prefetch: int = 2
    skipped: int = 0
    h2d: float | None = None
    h2d_bytes: int | None = None
    # decode_device="cuda": records the GPU decoded, its stage's seconds, the split's share
    gpu_records: int | None = None
    gpu_decode: float | None = None
    gpu_share: float | None = None

    @property
    def busy(self) -> float:
        return self.io + self.decode + self.transform + self.assemble


def timing(p: Pattern, batch: int, worker: int):
    return BatchTiming(
        batch=batch, epoch=0, worker=worker, records=p.records, bytes=p.nbytes,
        skipped=p.skipped, io_s=p.io, decode_s=p.decode, transform_s=p.transform,
        assemble_s=p.assemble, busy_s=p.busy, wait_s=p.wait, latency_s=p.latency,
        next_s=p.wait, prefetch=p.prefetch, h2d_s=p.h2d, h2d_bytes=p.h2d_bytes, read_bytes=p.nbytes,
        gpu_records=p.gpu_records, gpu_decode_s=p.gpu_decode, gpu_share=p.gpu_share,
    )  # fmt: skip


def feed(monitor, clock: FakeClock, p: Pattern, n: int, workers: int = 2, start: int = 0) -> None:
    """Deliver ``n`` batches: the consumer steps, waits, then receives the batch."""
    for i in range(start, start + n):
        clock.advance(p.step + p.wait + (p.h2d or 0.0))
        monitor.on_batch(timing(p, i, i % workers))


# Each pattern: 2 workers, one batch per (step + wait) of wall time.
HEALTHY = Pattern(step=0.020, wait=0.0)
# Workers need 40 ms per batch, two of them deliver one per 20 ms; consumer needs 5 ms.
CPU_BOUND = Pattern(io=0.002, decode=0.030, transform=0.006, assemble=0.002, step=0.005,
                    wait=0.015, latency=0.040)  # fmt: skip
IO_BOUND = Pattern(io=0.030, decode=0.006, transform=0.002, assemble=0.002, step=0.005,
                   wait=0.015, latency=0.040)  # fmt: skip
# Workers are quick (10 ms) but held back by one batch in flight; the consumer waits.
SYNC_BOUND = Pattern(io=0.001, decode=0.006, transform=0.002, assemble=0.001, step=0.012,
                     wait=0.008, latency=0.010, prefetch=1)  # fmt: skip
# CPU_BOUND with a user transform as the cost: 32 ms of it per batch, 4 ms decoding.
TRANSFORM_BOUND = Pattern(io=0.002, decode=0.004, transform=0.032, assemble=0.002, step=0.005,
                          wait=0.015, latency=0.040)  # fmt: skip
# Workers starved of CPU by other programs: busy only 50% although 4 batches are queued
# for 2 workers (without the machine's figures this reads as a slow main process).
STARVED = Pattern(io=0.001, decode=0.015, transform=0.002, assemble=0.002, step=0.005,
                  wait=0.015, latency=0.060, prefetch=4)  # fmt: skip
# 8 MB copied in 10 ms: 0.8 GB/s, a third of the wall time.
TRANSFER_BOUND = Pattern(step=0.020, wait=0.0, h2d=0.010, h2d_bytes=8_000_000)
