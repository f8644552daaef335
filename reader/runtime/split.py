"""How much of each batch the GPU decodes, chosen from measured rates.

With ``decode_device="cuda"`` two decoders fill every batch: the GPU (nvImageCodec,
in the main process) and the CPU workers. Both run at once, so a batch of ``n``
images is ready when the slower side is done: ``g * n / gpu_rate`` against
``(1 - g) * n / cpu_rate``. The share ``g`` that makes them equal is the fastest:

    g* = gpu_rate / (gpu_rate + cpu_rate)          (:func:`optimal_share`)

:class:`SplitController` estimates both rates (exponentially weighted, per
delivered batch), and moves the share part of the way toward ``g*`` only when it
is more than ``hysteresis`` away, so noise does not make it wander. Each side
keeps at least ``probe`` of a batch so its rate stays measured (a share of 0 or 1
could never learn that the other side got faster); a fixed share
(``DeviceOptions(gpu_share=...)``) bypasses all of it.

The rates: the GPU's is images per second of the GPU stage (the decode call and
the resample kernels, host and device time); the CPU's is the workers' images per
second of decoding time, times the number of workers (they decode in parallel).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SplitController", "cpu_rate", "optimal_share"]


def cpu_rate(images: int, seconds: float, workers: int) -> float | None:
    """The workers' images per second: ``images`` decoded in ``seconds`` of decode and
    transform time, times the workers (they decode in parallel); None when nothing
    was decoded. The monitor reports the same figure over an interval."""
    return images / seconds * max(workers, 1) if images and seconds > 0 else None


def optimal_share(cpu_rate: float, gpu_rate: float) -> float:
    """The GPU's share of a batch that finishes both sides together (see the module
    docstring); 0.5 when neither rate is known yet."""
    total = cpu_rate + gpu_rate
    return gpu_rate / total if total > 0 else 0.5


@dataclass
class SplitController:
    """The GPU share of the next batches, moved by measurements.

    Attributes:
        share: the GPU's share now (starts at ``start``).
        fixed: a share that never moves (None: measured).
        hysteresis: how far ``g*`` must be from the share before it moves.
        gain: the part of the gap one move closes (1: jump to ``g*``).
        alpha: weight of a new measurement in the rate estimates.
        probe: the least share each side keeps while measured.
        cpu_rate, gpu_rate: the estimates, images per second (None: not measured yet).
    """

    share: float = 0.5
    fixed: float | None = None
    hysteresis: float = 0.05
    gain: float = 0.5
    alpha: float = 0.3
    probe: float = 0.05
    cpu_rate: float | None = None
    gpu_rate: float | None = None

    def __post_init__(self) -> None:
        if self.fixed is not None:
            self.share = self.fixed

    def count(self, n: int) -> int:
        """GPU images of a batch of ``n``: the share rounded, within the probe bounds."""
        g = round(self.share * n)
        if self.fixed is None and n > 1:
            lo = max(1, round(self.probe * n))
            g = min(max(g, lo), n - lo)
        return max(0, min(n, g))

    def observe(self, cpu_images: int, cpu_seconds: float, workers: int,
                gpu_images: int, gpu_seconds: float) -> float:
        """Fold one batch's figures into the rates and return the share for the next
        batches (unchanged when fixed, or when ``g*`` is within the hysteresis)."""
        measured = cpu_rate(cpu_images, cpu_seconds, workers)
        if measured is not None:
            self.cpu_rate = self._ewma(self.cpu_rate, measured)
        if gpu_images and gpu_seconds > 0:
            self.gpu_rate = self._ewma(self.gpu_rate, gpu_images / gpu_seconds)
        if self.fixed is not None or self.cpu_rate is None or self.gpu_rate is None:
            return self.share
        target = optimal_share(self.cpu_rate, self.gpu_rate)
        if abs(target - self.share) > self.hysteresis:
            self.share += self.gain * (target - self.share)
        return self.share

    def _ewma(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.alpha) * old + self.alpha * new
