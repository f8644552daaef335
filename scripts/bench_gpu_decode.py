"""The GPU decode's figures (issue 38), measured by scripts/bench_gpu.py on a lent GPU.

Two steps, each a dict for the JSON report:

``gpu_decode(ds, jpegs, batch, workers, rounds, seconds)``
    (a) nvImageCodec's own batch decode of the same JPEGs (whole images, batches of
    ``batch``, bytes in memory): the decoder's limit; (b) our GPU-decode pipeline
    (``decode_device="cuda", gpu_share=1``: region decode, resize, flip, normalize to
    float16 NCHW); (c) the hybrid (``gpu_share`` measured); (d) the CPU pipeline
    (``decode_device="cpu"``), all to the GPU, alternated rounds, medians. Targets:
    b/a >= 0.85; c/(b + d) >= 0.9 and c/d >= 2. And the pixels: GPU-decoded
    batches against the CPU path on the same crops, mean and max absolute difference
    per channel (uint8). And (e) the overlap (:func:`overlap`): (b) feeding a consumer
    whose step is 1.25 x (b)'s batch time, against the step's bound; target >= 0.9.
``cpu_scaling(ds, batch, workers, rounds, seconds)``
    the CPU's own scaling: ``workers`` bare processes doing decode + RandomResizedCrop
    224 + flip (no Loader), and the Loader (to the CPU) at 1, 4, 8 and ``workers``
    workers; target: Loader ÷ bare >= 0.9 at ``workers`` (is 400 img/s a worker the
    host's cores or our Loader?).

Every rate is timed over about ``seconds`` (:data:`SECONDS` by default, bench_gpu's
``--seconds``) after its start-up (processes, loaders, decoders, the first batches):
the one knob that makes a rehearsal on the stand-ins take seconds.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np

import reader
from reader.options import DeviceOptions
from reader.runtime.device import require_cupy
from scripts import harness as h

OWN_TARGET, HYBRID_SUM_TARGET, HYBRID_CPU_TARGET, SCALING_TARGET = 0.85, 0.9, 2.0, 0.9
OVERLAP_TARGET = 0.9
#: Every timed Loader keeps its workers across epochs, as a training job does (and as
#: the bare processes never restart): a rate over several short epochs would
#: otherwise count each epoch's worker start-up (9 % of the rate here at 2,048 images).
STEADY = {"persistent_workers": True}
SECONDS = 8.0  # each rate's timed interval (bench_gpu --seconds)


def nvimgcodec_rate(payloads: list[np.ndarray], batch: int, seconds: float = SECONDS) -> float:
    """Images/s of nvImageCodec's batched decode alone (whole images, to device, on the
    current device: ``Decoder()``), the clock checked after each batch. Decoded on a
    non-blocking stream of its own, as the Loader's GPU decode is (the sink's stream),
    so the two differ in the work, not in how it is queued.

    The images a call returns are kept until the next call has returned, and the last
    ones until the device is synchronized, as a consumer holds them until it has read
    them (so no image's memory goes back while the decoder may still write it).

    Raises:
        RuntimeError: nvImageCodec returned None for an image (it does so for every
            image when no backend can decode, e.g. without the nvjpeg wheel): the rate
            would count images never decoded.
    """
    from reader.runtime.gpu_decode import DECODER_OPTIONS, require_nvimgcodec

    nv = require_nvimgcodec()
    cp = require_cupy()
    if len(payloads) < batch:
        raise RuntimeError(f"{len(payloads)} JPEGs make no batch of {batch}: give more --images")
    dec = nv.Decoder(options=DECODER_OPTIONS)  # the Loader's decoder settings
    params = nv.DecodeParams(apply_exif_orientation=False)
    stream = cp.cuda.Stream(non_blocking=True)
    batches = [[nv.CodeStream(d) for d in payloads[i:i + batch]]
               for i in range(0, len(payloads) - batch + 1, batch)]

    def decode(b):
        images = dec.decode(b, params=params, cuda_stream=stream.ptr)
        lost = sum(im is None for im in images)
        if lost:
            raise RuntimeError(f"nvImageCodec decoded {len(b) - lost} of {len(b)} JPEGs of a "
                               "batch (None for the others): is the nvjpeg wheel installed?")
        return images

    held = decode(batches[0])  # warm up (allocations, handles)
    cp.cuda.runtime.deviceSynchronize()
    n, t0 = 0, time.perf_counter()
    for b in itertools.cycle(batches):
        held = decode(b)
        n += len(b)
        if time.perf_counter() - t0 >= seconds:
            break
    cp.cuda.runtime.deviceSynchronize()
    rate = n / (time.perf_counter() - t0)
    del held
    return rate


def timed_images(loader, seconds: float = SECONDS, sync=lambda: None) -> float:
    """Images/s of ``loader`` over about ``seconds`` (epochs repeat as needed): the
    batches after a reference batch, over the time from its arrival to the last's.

    The reference is the batch after one per worker (start-up is not the steady rate).
    The workers start together, so their batches arrive in bursts of one per worker:
    the clock starts and stops at a burst's first batch. Started at the warm-up's last
    batch (a burst's end), it would miss about one batch-time per window, which a
    simulation of 16 workers at 0.4-0.64 s a batch puts at 5-7% of an 8 s rate (a
    Loader ÷ bare verdict of 0.9 turned by the clock, not the Loader)."""
    n, t0, warm = 0, None, max(loader.num_workers, 1) + 1
    while True:
        empty = True
        for b in loader:
            empty = False
            if t0 is None:
                warm -= 1
                if warm <= 0:
                    sync()
                    t0 = time.perf_counter()
                continue
            n += len(b["label"])
            if time.perf_counter() - t0 >= seconds:
                sync()
                return n / (time.perf_counter() - t0)
        if empty:  # else this would wait for a batch forever
            raise RuntimeError("the loader made no batch in an epoch: give more --images")


def loader_rate(ds, batch, workers, decode_device, gpu_share=None, seconds=SECONDS) -> dict:
    """Images/s to the GPU over about ``seconds``; the clock stops once the last batch is done."""
    cp = require_cupy()
    opts = DeviceOptions(decode_device=decode_device, gpu_share=gpu_share)
    shares = []
    with reader.Loader(ds, batch, num_workers=workers, shuffle="block", seed=0, **STEADY,
                       transform=h.rrc_flip(), device="cuda", device_options=opts) as lo:
        if decode_device != "cpu" and not lo.gpu_decode:
            raise RuntimeError("decode_device='cuda' did not resolve to the GPU decode")

        best = timed_images(lo, seconds, cp.cuda.get_current_stream().synchronize)
        if lo.runtime.split is not None:
            shares.append(lo.runtime.split.share)
    return {"img_s": best, "share": shares[-1] if shares else None}


def pixels(ds, batch: int, compare: int = 4) -> dict:
    """Mean and max |GPU - CPU| per channel over the first ``compare`` batches (uint8 HWC)."""
    cp = require_cupy()
    raw = dict(dtype="uint8", layout="NHWC")
    with reader.Loader(ds, batch, num_workers=2, seed=0, transform=h.rrc_flip(),
                       copy=True) as cpu:
        want = [b["image"] for _, b in zip(range(compare), cpu, strict=False)]
    opts = DeviceOptions(decode_device="cuda", gpu_share=1.0, **raw)
    with reader.Loader(ds, batch, num_workers=2, seed=0, transform=h.rrc_flip(),
                       device="cuda", device_options=opts) as gpu:
        got = [cp.asnumpy(b["image"]) for _, b in zip(range(compare), gpu, strict=False)]
    diff = np.concatenate([np.abs(g.astype(np.int16) - w).reshape(-1, 3)
                           for g, w in zip(got, want, strict=True)])
    return {"mean_abs_diff": diff.mean(axis=0).round(3).tolist(),
            "max_abs_diff": diff.max(axis=0).tolist(), "images": int(diff.shape[0] // 224 // 224)}


def gpu_decode(ds: Path, jpegs: Path, batch: int, workers: int, rounds: int,
               seconds: float = SECONDS) -> dict:
    # Read once for every round; writable arrays (a CodeStream reads them in place).
    payloads = [np.fromfile(p, np.uint8) for p in sorted(jpegs.rglob("*.jpg"))]
    figures: dict[str, list[float]] = {"own": [], "gpu": [], "hybrid": [], "cpu": []}
    shares: list[float] = []

    def one(case, _r):
        if case == "own":
            figures["own"].append(nvimgcodec_rate(payloads, batch, seconds))
        elif case == "gpu":
            figures["gpu"].append(loader_rate(ds, batch, workers, "cuda", 1.0, seconds)["img_s"])
        elif case == "hybrid":
            r = loader_rate(ds, batch, workers, "cuda", None, seconds)
            figures["hybrid"].append(r["img_s"])
            shares.append(r["share"])
        else:
            figures["cpu"].append(loader_rate(ds, batch, workers, "cpu", None, seconds)["img_s"])

    h.rounds(("own", "gpu", "hybrid", "cpu"), rounds, one)
    # A step 1.25 x the GPU pipeline's batch time: the decode fits inside it.
    step_ms = 1.25 * batch / h.median(figures["gpu"]) * 1e3
    own_ratio = h.paired_ratio(figures["gpu"], figures["own"])
    sums = [g + c for g, c in zip(figures["gpu"], figures["cpu"], strict=True)]
    sum_ratio = h.paired_ratio(figures["hybrid"], sums)
    cpu_ratio = h.paired_ratio(figures["hybrid"], figures["cpu"])
    return {"workers": workers, "img_s": figures, "hybrid_share": shares,
            "gpu_over_own": own_ratio, "hybrid_over_sum": sum_ratio,
            "hybrid_over_cpu": cpu_ratio, "pixels": pixels(ds, batch),
            "overlap": overlap(ds, batch, workers, step_ms, seconds),
            "met": {"gpu_over_own": own_ratio >= OWN_TARGET,
                    "hybrid_over_sum": sum_ratio >= HYBRID_SUM_TARGET,
                    "hybrid_over_cpu": cpu_ratio >= HYBRID_CPU_TARGET}}


def overlap(ds: Path, batch: int, workers: int, step_ms: float, seconds: float = SECONDS) -> dict:
    """The GPU-decode pipeline feeding a consumer whose step takes ``step_ms`` of GPU
    time (bench_gpu's ``gpu_step``): the next batch is decoded during the step (the
    look-ahead, reader.runtime.gpu_decode), so where the pipeline alone is faster than
    the step, the consumer waits for almost nothing. Images/s against the step's
    bound (``batch`` per step), and the share of wall time spent inside ``next()``.
    Target: >= 0.9 of the bound (a decode inside ``next()`` would give about
    step / (step + decode): 0.56 at the step chosen by :func:`gpu_decode`)."""
    from scripts.bench_gpu import H2DProbe, gpu_step

    cp = require_cupy()
    step = gpu_step(cp, step_ms / 1e3)
    probe = H2DProbe()
    opts = DeviceOptions(decode_device="cuda", gpu_share=1.0)
    n, t0 = 0, None
    with reader.Loader(ds, batch, num_workers=workers, shuffle="block", seed=0, **STEADY,
                       transform=h.rrc_flip(), device="cuda", device_options=opts,
                       monitor=probe) as lo:
        while t0 is None or time.perf_counter() - t0 < seconds:
            for b in lo:  # a new epoch each pass, until the time is up
                step()
                if t0 is None:  # from the first step's end: start-up is not the rate
                    t0, probe.wait = time.perf_counter(), 0.0
                    continue
                n += len(b["label"])
                if time.perf_counter() - t0 >= seconds:
                    break
        wall = time.perf_counter() - t0
    ratio = n / wall / (batch / (step_ms / 1e3))
    return {"step_ms": round(step_ms, 2), "img_s": n / wall, "of_step_bound": ratio,
            "queue_wait_fraction": probe.wait / wall, "target": OVERLAP_TARGET,
            "met": ratio >= OVERLAP_TARGET}


def _bare(args) -> float:
    """One bare process: decode + RandomResizedCrop 224 + flip of its share, no Loader;
    its images/s over about ``seconds``, timed from its first record (its start-up,
    like the Loader's, is not the steady rate), the clock checked after each record."""
    path, lo, hi, seconds = args
    ds = reader.open_dataset(path)
    decode = h.rrc_flip_decoder()
    rng = np.random.default_rng(lo)
    n, t0 = 0, time.perf_counter()
    for r in itertools.cycle(range(lo, hi)):
        decode(ds.payload(r, "image"), rng)
        n += 1
        if time.perf_counter() - t0 >= seconds:
            break
    return n / (time.perf_counter() - t0)


def bare_rate(ds: Path, processes: int, seconds: float = SECONDS) -> float:
    """Images/s of ``processes`` bare processes side by side: the sum of their rates."""
    total = len(reader.open_dataset(ds))
    if total < processes:
        raise RuntimeError(f"{total} records cannot keep {processes} processes busy: give more --images")
    cut = np.linspace(0, total, processes + 1).astype(int)
    with mp.get_context("fork").Pool(processes) as pool:
        return sum(pool.map(_bare, [(str(ds), int(cut[i]), int(cut[i + 1]), seconds)
                                    for i in range(processes)]))


def cpu_scaling(ds: Path, batch: int, workers: int, rounds: int,
                seconds: float = SECONDS) -> dict:
    counts = sorted({1, 4, 8, workers} & set(range(1, workers + 1)))
    loader: dict[int, list[float]] = {n: [] for n in counts}
    bare: list[float] = []

    def one(case, _r):
        if case == "bare":
            bare.append(bare_rate(ds, workers, seconds))
            return
        with reader.Loader(ds, batch, num_workers=case, shuffle="block", seed=0, **STEADY,
                           transform=h.rrc_flip()) as lo:
            loader[case].append(timed_images(lo, seconds))

    h.rounds(("bare", *counts), rounds, one)
    ratio = h.paired_ratio(loader[workers], bare)
    return {"bare_processes": workers, "bare_img_s": bare,
            "loader_img_s": {str(n): v for n, v in loader.items()},
            "per_worker_img_s": {str(n): h.median(v) / n for n, v in loader.items()},
            "loader_over_bare": ratio, "target": SCALING_TARGET, "met": ratio >= SCALING_TARGET}
