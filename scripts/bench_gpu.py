"""The GPU path on real hardware, in one run (needs cupy and a CUDA GPU).

Measures:
  (a) raw cupy pinned host-to-device bandwidth for one batch's bytes (the limit);
  (b) the loader's transfer stage with the slot ring page-locked in place;
  (c) the same with the pinned staging fallback;
  (d) a full epoch on the GPU, checking every batch against the CPU path after the
      same normalization, and the consumer's queue wait when its step takes at
      least the loader's per-batch time.

Run: ``python -m scripts.bench_gpu [--images 4096] [--workers N] [--data DIR]``
Target: (b)/(a) >= 0.8, queue wait ~0 when the step is the slowest part.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import reader
from packer import PackOptions, pack
from reader.device import DeviceOptions, measure_pinned_bandwidth, normalize, require_cupy
from reader.transforms import CenterCrop, RandomResizedCrop
from scripts.synth import make_image_folder


class H2DProbe:
    """A monitor stand-in that keeps each batch's copy time and bytes."""

    def __init__(self):
        self.h2d: list[tuple[float, int]] = []
        self.wait = 0.0

    def on_batch(self, t):
        if t.h2d_s:
            self.h2d.append((t.h2d_s, t.h2d_bytes))
        self.wait += t.wait_s

    def stats(self):
        return {}


def transfer_rate(ds, batch, workers, pinning, epochs=2):
    probe = H2DProbe()
    opts = DeviceOptions(dtype="uint8", layout="NHWC", pinning=pinning)
    loader = reader.Loader(ds, batch, num_workers=workers, transform=[RandomResizedCrop(224)],
                           device="cuda", device_options=opts, monitor=probe)
    with loader:
        for _ in range(epochs):
            for _b in loader:
                pass
        mode = loader._cuda_state.mode
    rates = [n / s / 1e9 for s, n in probe.h2d[2:]]  # first copies include warm-up
    return statistics.median(rates), mode


def check_epoch(ds, batch, workers, step_ms):
    cp = require_cupy()
    opts = DeviceOptions(dtype="float32", layout="NCHW")
    cpu = reader.Loader(ds, batch, num_workers=workers, transform=[CenterCrop(224)], copy=True)
    want = [normalize(b["image"], opts) for b in cpu]
    cpu.close()
    probe = H2DProbe()
    gpu = reader.Loader(ds, batch, num_workers=workers, transform=[CenterCrop(224)],
                        device="cuda", device_options=opts, monitor=probe)
    worst = 0.0
    a = cp.ones((4096, 4096), cp.float32)
    t0 = time.perf_counter()
    with gpu:
        for k, b in enumerate(gpu):
            got = cp.asnumpy(b["image"])
            worst = max(worst, float(np.abs(got - want[k]).max()))
            deadline = time.perf_counter() + step_ms / 1e3
            while time.perf_counter() < deadline:  # the consumer's step, on the GPU
                a = a @ a * 1e-4
            cp.cuda.get_current_stream().synchronize()
    wall = time.perf_counter() - t0
    return len(want), worst, probe.wait / wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("/tmp/shardpack-gpu-bench"))
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--step-ms", type=float, default=60.0, help="simulated training step")
    args = ap.parse_args(argv)
    cp = require_cupy()
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, "
          f"{args.workers} workers, batch {args.batch}, {time.strftime('%Y-%m-%d')}")

    src, ds = args.data / "images", args.data / "shards"
    if not (ds / "manifest.json").exists():
        make_image_folder(src, 16, args.images // 16, seed=0, workers=args.workers)
        pack(src, ds, PackOptions(overwrite=True, durable=False))

    nbytes = args.batch * 224 * 224 * 3
    raw = statistics.median(measure_pinned_bandwidth(nbytes) for _ in range(5))
    reg, reg_mode = transfer_rate(ds, args.batch, args.workers, "register")
    stg, stg_mode = transfer_rate(ds, args.batch, args.workers, "staging")
    n, worst, wait = check_epoch(ds, args.batch, args.workers, args.step_ms)

    print(f"{'measure':52s} {'GB/s':>8s} {'÷ raw':>7s}")
    print(f"{'(a) raw pinned H2D, one batch (' + str(nbytes >> 20) + ' MiB)':52s} {raw:8.2f} {1:7.2f}")
    print(f"{'(b) loader transfer, ring registered (' + reg_mode + ')':52s} {reg:8.2f} {reg / raw:7.2f}")
    print(f"{'(c) loader transfer, staging (' + stg_mode + ')':52s} {stg:8.2f} {stg / raw:7.2f}")
    print(f"(d) {n} GPU batches equal the CPU path after normalization: "
          f"max abs diff {worst:.2e} ({'OK' if worst < 1e-3 else 'MISMATCH'})")
    print(f"    consumer queue wait with a {args.step_ms:.0f} ms step: {wait:.1%}")
    print(f"target (b)/(a) >= 0.8: {'met' if reg / raw >= 0.8 else 'MISSED'}")
    return 0 if worst < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
