"""Monitor overhead: loader throughput with the monitor on ÷ off (target >= 0.98), and
with every metric sink on ÷ off (target >= 0.97).

Three measurements:

1. ``on_batch`` alone: microseconds per call (hot path, and amortized with the
   interval reports, which read the machine's CPU figures from ``/proc``), set
   against realistic per-batch times of the loader; and the ``/proc`` read alone.
2. Each metric sink's cost per report (JSONL, TensorBoard, Prometheus, W&B offline;
   a backend that is not installed is skipped, saying so), against the default 5 s
   interval.
3. End to end: the same Loader over the same dataset, rounds alternating monitor
   off / on (default settings) / on with every sink at a report every 0.5 s (ten
   times the default rate, a Prometheus scrape every second) and the timeline
   (``trace=``), the median of the rounds' ratios (the issue's target: >= 0.97); the
   sinks' side also gives its data readiness.

With ``--trace``: the timeline's own costs too: ``on_batch`` with the trace on, the
formatting of one batch and one write of a full ring.

Usage: ``python -m scripts.bench_monitor [--records N] [--samples S] [--workers W] [--trace]``
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

from reader import Monitor
from reader.runtime.proc import ProcCpu
from reader.runtime.timing import BatchTiming
from scripts import harness as h


def _timing(i: int) -> BatchTiming:
    return BatchTiming(
        batch=i, epoch=0, worker=i % 2, records=64, bytes=64 * 110_000, skipped=0,
        io_s=0.0004, decode_s=0.030, transform_s=0.008, assemble_s=0.0002, busy_s=0.039,
        wait_s=0.001, latency_s=0.012, next_s=0.001, prefetch=4, h2d_s=None, h2d_bytes=None,
    )  # fmt: skip


def bench_on_batch(calls: int = 200_000, interval: float = 0.05) -> dict[str, float]:
    """Seconds per ``on_batch`` call: hot path only, and with frequent reports.

    Args:
        calls: calls per measurement.
        interval: report interval for the amortized figure (short on purpose:
            100× more reports than the default 5 s).
    """
    timings = [_timing(i) for i in range(1024)]
    out: dict[str, float] = {}
    def feed(mon: Monitor) -> None:
        for i in range(calls):
            mon.on_batch(timings[i & 1023])

    for label, ival in (("hot path (no report)", 1e9), (f"with a report every {interval}s", interval)):
        out[label] = min(h.timed(feed, Monitor(ival, output=False, record=os.devnull,
                                               num_workers=2)) for _ in range(3)) / calls
    return out


def bench_trace(root: str, calls: int = 200_000) -> dict[str, float]:
    """The timeline's costs: seconds per ``on_batch`` with the trace on (no report), per
    batch formatted (once, at a write), and per write of a full ring."""
    from reader.monitor.trace import TRACE_BATCHES, Trace

    timings = [_timing(i) for i in range(1024)]
    path = os.path.join(root, "trace.json")

    def feed(mon: Monitor) -> None:
        for i in range(calls):
            mon.on_batch(timings[i & 1023])

    hot = min(h.timed(feed, Monitor(1e9, output=False, num_workers=2, cpu=None, trace=path))
              for _ in range(3)) / calls  # fmt: skip
    tr = Trace(path, every=1e9)
    fmt, write = [], []
    for _ in range(3):
        for i in range(TRACE_BATCHES):
            t = timings[i & 1023]
            t.done_at = time.perf_counter()
            tr.on_batch(t)
        fmt.append(h.timed(tr._format_pending) / TRACE_BATCHES)
        write.append(h.timed(tr.write))
    return {"on_batch, trace on (hot path)": hot, "formatting one batch (once)": min(fmt),
            f"one write of {TRACE_BATCHES:,} batches ({os.path.getsize(path) / 1e6:.1f} MB)": min(write)}


def bench_proc_cpu(reads: int = 2000) -> float | None:
    """Seconds per :class:`ProcCpu` read (one per report), or None without ``/proc``."""
    cpu = ProcCpu()
    if cpu() is None:
        return None

    def read() -> None:
        for _ in range(reads):
            cpu()

    return min(h.timed(read) for _ in range(3)) / reads


class Sinks:
    """Every metric sink that can be made here, writing under ``root``; and a scraper
    that reads the Prometheus port as a Prometheus server would (more often)."""

    def __init__(self, root: str, scrape_s: float = 1.0) -> None:
        from reader.monitor import JsonlSink, PrometheusSink, TensorBoardSink, WandbSink

        os.makedirs(root, exist_ok=True)
        self.sinks: list = [JsonlSink(os.path.join(root, "bench.jsonl"))]
        self.skipped: list[str] = []
        self._closers: list = []
        self._stop = threading.Event()
        try:
            tb = TensorBoardSink(os.path.join(root, "tb"))
            self.sinks.append(tb)
            self._closers.append(tb.close)
        except ImportError as exc:
            self.skipped.append(f"TensorBoard ({exc})")
        try:
            prom = PrometheusSink(0, addr="127.0.0.1")
            self.sinks.append(prom)
            self._closers.append(prom.close)
            threading.Thread(target=self._scrape, args=(prom.port, scrape_s), daemon=True).start()
        except ImportError as exc:
            self.skipped.append(f"Prometheus ({exc})")
        try:
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            run = wandb.init(mode="offline", dir=root, project="shardpack-bench",
                             settings=wandb.Settings(console="off", x_disable_stats=True))
            self.sinks.append(WandbSink(run=run))
            self._closers.append(run.finish)
        except ImportError:
            self.skipped.append("W&B (pip install wandb)")

    def _scrape(self, port: int, every: float) -> None:
        import urllib.request

        while not self._stop.wait(every):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                r.read()

    def names(self) -> str:
        from reader.monitor.sinks import sink_name

        return ", ".join(sink_name(s).split()[0] for s in self.sinks)

    def close(self) -> None:
        self._stop.set()
        for close in self._closers:
            close()


def bench_sinks(sinks: list, reports: int = 50) -> dict[str, float]:
    """Seconds per report for each sink, given a real interval's record."""
    from reader.monitor.sinks import sink_name

    mon = Monitor(1e9, output=False, num_workers=2, name="bench")
    timings = [_timing(i) for i in range(64)]
    for t in timings:
        mon.on_batch(t)
    record = {"time": time.time(), "interval": 1, **mon.stats(), "notes": []}
    out = {}
    for sink in sinks:
        def call(sink=sink) -> None:
            for i in range(reports):
                sink({**record, "interval": i + 1})

        out[sink_name(sink)] = min(h.timed(call) for _ in range(3)) / reports
    return out


def _make_dataset(root: str, records: int, side: int) -> str:
    import simplejpeg

    from formats import DatasetWriter, Field

    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (side, side, 3), dtype=np.uint8)
    path = os.path.join(root, "ds")
    with DatasetWriter(path, [Field("image", "jpeg"), Field("label", "int")]) as w:
        for i in range(records):
            img = np.roll(base, i, axis=1)
            w.write({"image": simplejpeg.encode_jpeg(img, quality=90), "label": i % 10})
    return path


def _consume(batch: dict, buf: np.ndarray | None) -> int:
    """What the training loop does with a batch: nothing, or copy its image bytes out
    (as staging for a device copy would)."""
    images = batch["image"]
    if buf is not None:
        at = 0
        for x in images:
            n = len(x)
            buf[at : at + n] = np.frombuffer(x, np.uint8)
            at += n
    return len(images)


def bench_loader(path: str, *, samples: int, workers: int, batch_size: int, raw: bool,
                 copy_out: bool = False, min_s: float = 0.5, sinks: list | None = None,
                 sink_interval: float = 0.5, trace: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Throughput (samples/s) of the same Loader with the monitor off and on.

    Each sample runs whole epochs until at least ``min_s`` seconds have passed;
    samples rotate the cases (and which goes first) so drift hits all alike. With
    ``sinks``, a third case: a monitor reporting every ``sink_interval`` seconds to
    them, and keeping the timeline in ``trace`` when given (its stats are returned as
    ``"sinks_stats"``): the issue's "every sink and the trace on".
    """
    import reader
    from reader import Monitor as _Monitor

    kwargs = dict(batch_size=batch_size, num_workers=workers, prefetch=2 * max(workers, 1))
    if raw:  # read in this process: no workers, nothing in flight
        kwargs = dict(batch_size=batch_size, decode=False)
    else:
        from reader.transforms import CenterCrop

        kwargs["transform"] = [CenterCrop(224)]
    modes = ("off", "on", "sinks") if sinks is not None else ("off", "on")
    rates: dict[str, list[float]] = {m: [] for m in modes}
    # Main-process CPU seconds per batch: the monitor's whole cost lands there, and
    # unlike wall time it barely moves when other processes compete for the cores.
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    buf = np.empty(batch_size * 512 * 1024, np.uint8) if copy_out else None
    loaders = {
        "off": reader.Loader(path, monitor=False, **kwargs),
        "on": reader.Loader(path, monitor=_Monitor(5.0, output=False, num_workers=workers), **kwargs),
    }
    if sinks is not None:
        loaders["sinks"] = reader.Loader(path, monitor=_Monitor(
            sink_interval, output=False, num_workers=workers, sinks=sinks, name="bench",
            trace=trace), **kwargs)
    try:
        for loader in loaders.values():  # warm the page cache and the code paths
            for _batch in loader:
                pass
        del _batch  # a batch held outside the timed loops would be a lease kept for good
        for i in range(samples):
            for mode in h.rotated(modes, i):
                loader = loaders[mode]
                n = batches = 0
                t0, c0 = time.perf_counter(), time.process_time()
                while True:
                    for batch in loader:
                        n += _consume(batch, buf)
                        batches += 1
                    elapsed = time.perf_counter() - t0
                    if elapsed >= min_s:
                        break
                cpu[mode].append((time.process_time() - c0) / batches)
                rates[mode].append(n / elapsed)
        stats = loaders["sinks"].monitor.stats() if sinks is not None else None
    finally:
        for loader in loaders.values():
            loader.close()
            if loader.monitor is not None:
                loader.monitor.close()  # the trace's last write, while its folder exists
    return {"rates": rates, "cpu": cpu, "sinks_stats": stats}


def main(argv: list[str] | None = None) -> int:
    parser = h.parser(__doc__)
    parser.add_argument("--records", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--trace", action="store_true",
                        help="also measure the timeline (Monitor(trace=...)): its costs, and "
                             "a third side end to end")
    args = parser.parse_args(argv)

    costs = bench_on_batch()
    print("on_batch cost")
    cost_table = h.Table(h.Col("case", 34), h.Col("us/call", 10, ">"), sep="")
    cost_table.print([(label, f"{s * 1e6:.2f}") for label, s in costs.items()])
    worst = max(costs.values())
    proc = bench_proc_cpu()
    if proc is None:
        print("/proc CPU read: no readable /proc, CPU figures off")
    else:
        print(cost_table.line("/proc CPU read (once per report)", f"{proc * 1e6:.2f}")
              + f"  = {proc / 5.0:.1e} of a 5 s interval")
    if args.trace:
        from reader.monitor.trace import WRITE_EVERY_S

        with tempfile.TemporaryDirectory() as root:
            costs_trace = bench_trace(root)
        print()
        print(f"trace costs (writes every {WRITE_EVERY_S:g} s at the reports, and at close)")
        h.Table(h.Col("case", 50), h.Col("us", 12, ">"), sep="").print(
            [(label, f"{s * 1e6:.2f}") for label, s in costs_trace.items()])
    print()
    print("on_batch cost vs realistic batch times (1 - cost/batch time = throughput ratio bound)")
    h.Table(h.Col("batch", 44), h.Col("batch ms", 10, ">"), h.Col("ratio", 10, ">"),
            h.Col("limit", 8, ">"), sep="").print(
        [(label, f"{batch_s * 1e3:.3f}", f"{1 - worst / batch_s:.4f}", ">= 0.98")
         for label, batch_s in (("64 x 224px decode+crop, 2 workers", 64 / (2 * 700)),
                                ("256 x 110 KB raw bytes at 5 GB/s", 256 * 110e3 / 5e9),
                                ("64 x 110 KB raw bytes at 10 GB/s", 64 * 110e3 / 10e9))])

    with tempfile.TemporaryDirectory() as root:
        sinks = Sinks(os.path.join(root, "sinks"))
        print()
        print("metric sinks: cost per report (the default interval is 5 s)")
        if sinks.skipped:
            print(f"skipped, not installed: {'; '.join(sinks.skipped)}")
        h.Table(h.Col("sink", 44), h.Col("ms/report", 10, ">"), h.Col("of 5 s", 10, ">"),
                sep="").print([(name, f"{sec * 1e3:.3f}", f"{sec / 5.0:.1e}")
                               for name, sec in bench_sinks(sinks.sinks).items()])
        try:
            loader_rows(args, root, sinks)
        finally:
            sinks.close()
    return 0


def loader_rows(args, root: str, sinks: Sinks) -> None:
    """The end-to-end rows: each loader case with the monitor off, on, and on with sinks."""
    path = _make_dataset(root, args.records, 256)
    for raw, copy_out, mode in (
        (False, False, "decode + CenterCrop(224), consumer idle"),
        (True, True, "raw bytes (decode=False), consumer copies the bytes out"),
        (True, False, "raw bytes (decode=False), consumer idle (worst case)"),
    ):
        res = bench_loader(path, samples=args.samples, workers=args.workers,
                           batch_size=args.batch_size, raw=raw, copy_out=copy_out,
                           sinks=sinks.sinks,
                           trace=os.path.join(root, "trace.json"))  # fmt: skip
        off, on, sunk = res["rates"]["off"], res["rates"]["on"], res["rates"]["sinks"]
        print()
        print(f"Loader, {mode}, {args.records} records, batch {args.batch_size}, "
              f"{args.workers} workers, {args.samples} rounds")  # fmt: skip
        h.Table(h.Col("monitor", 10), h.Col("best/s", 12, ">"), h.Col("median/s", 12, ">"),
                sep="").print([(side, f"{max(r):.0f}", f"{h.median(r):.0f}")
                               for side, r in (("off", off), ("on", on), ("sinks", sunk))])
        ratio_best = max(on) / max(off)
        ratio_med = h.median(on) / h.median(off)
        print(f"ratio on/off: best {ratio_best:.3f}, median {ratio_med:.3f}, median of the "
              f"rounds' ratios {h.paired_ratio(on, off):.3f} (limit >= 0.98)")
        st = res["sinks_stats"]
        print(f"ratio sinks/off ({sinks.names()} and the trace, a report every 0.5 s): best "
              f"{max(sunk) / max(off):.3f}, median {h.median(sunk) / h.median(off):.3f}, "
              f"median of the rounds' ratios {h.paired_ratio(sunk, off):.3f} (limit >= 0.97); "
              f"{st['reports']} reports, sink errors {st['sink_errors'] or 'none'}, "
              f"data readiness {st['mean']['data_readiness_pct']:.1f}%, "
              f"queue wait {st['mean']['queue_wait_pct']:.1f}%")
        cpu_off = h.median(res["cpu"]["off"])
        extra = h.median(res["cpu"]["on"]) - cpu_off
        batch_s = args.batch_size / h.median(off)
        print(f"main-process CPU per batch: off {cpu_off * 1e6:.1f} us, monitor adds "
              f"{extra * 1e6:.1f} us = {extra / batch_s:.2%} of a {batch_s * 1e3:.3f} ms batch "
              f"-> ratio bound {1 - max(extra, 0.0) / batch_s:.3f}")  # fmt: skip
        extra = h.median(res["cpu"]["sinks"]) - cpu_off
        print(f"main-process CPU per batch with the sinks: adds {extra * 1e6:.1f} us = "
              f"{extra / batch_s:.2%} -> ratio bound {1 - max(extra, 0.0) / batch_s:.3f}")


if __name__ == "__main__":
    sys.exit(main())
