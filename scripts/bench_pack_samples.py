"""Packing from a Python function: ``packer.pack_samples`` vs LitData's ``optimize`` and
MosaicML's ``MDSWriter``, and vs the function's own rate, same function, inputs and
worker count.

The function (:func:`sample`) turns input ``i`` into one sample: a document of
64-256 words from a fixed vocabulary (``str``) and its UTF-8 bytes as int32 token
ids (an ``ndarray`` of 1-4 KB) — a byte-level tokenizer. ``--work-us`` adds that many
microseconds of CPU per sample (a real tokenizer costs 100-500 µs per document).

Cases, each timed around the call that packs (``durable=False``, page cache warm):

* **produce and discard**: W forked worker processes run the function over the
  inputs (in the ranges ``pack_samples`` cuts) and drop every sample; the limit the
  others are measured against;
* **produce and write bytes**: the same, each 64 samples' bytes joined, checksummed
  and appended to one file per range: the least any packer does (no format);
* **pack_samples**: ``pack_samples(sample, range(N), dst, PackOptions(workers=W))``;
* **LitData**: ``litdata.optimize(fn=sample, inputs=list(range(N)), num_workers=W)``
  (each worker writes its own chunks);
* **MDSWriter**: a ``multiprocessing.Pool(W).imap(sample, range(N), chunksize=64)``
  feeding one ``MDSWriter`` (``ndarray`` and ``str`` columns) in the parent: MDS's
  documented way to write from a function.

LitData and MDS run in the peers virtualenv (``--peers-python`` or
``$SHARDPACK_PEERS_PYTHON``; BENCHMARKS.md, "Setting up the peers"), in a subprocess
that imports this module for the same function. Cases run in rounds (rotated order);
each ratio is taken within a round and the median is shown.

``--memory`` measures memory instead: a function whose input ``(start, count)``
yields ``count`` samples of 1 KB (an int32 array of 256), packed with
``pack_samples(..., PackOptions(workers=W))`` in a fresh process per case: one input yielding
300,000 samples; the same samples over 300 inputs; and one input that never ends,
stopped after 20 s. Each case's process tree is sampled every 0.1 s: the sum of its
processes' proportional set size (PSS, from ``/proc/PID/smaps_rollup``: shared pages
counted once, so a forked worker does not count its parent's pages again) and the
bytes under DST (scratch and shards); a finished case also reports its largest
process's ``ru_maxrss``.

Usage: ``python -m scripts.bench_pack_samples [--count 200000] [--workers W]
[--repeat 3] [--work-us 0] [--quick]``, or ``--memory [--workers W]
[--endless-seconds 20]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from scripts import harness as h

__all__ = ["kb_samples", "main", "sample"]

_PROSE = ("the model reads token streams from shards that are packed once and mapped "
          "many times across epochs while workers decode batches in parallel and "
          "the trainer waits for nothing at all")
_WORDS = _PROSE.split()
_WORK_US = float(os.environ.get("BENCH_WORK_US", "0"))


def sample(i: int) -> dict:
    """Input ``i`` as one sample: ``text`` (str) and ``tokens`` (int32, 1-4 KB)."""
    n = 45 + (i * 7919) % 136
    text = " ".join(_WORDS[(i * 31 + k * 17) % len(_WORDS)] for k in range(n))
    tokens = np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)
    if _WORK_US:
        end = time.perf_counter() + _WORK_US * 1e-6
        while time.perf_counter() < end:
            pass
    return {"text": text, "tokens": tokens}


# -- the cases (each returns seconds) --------------------------------------------------

def _discard_range(args: tuple[int, int]) -> int:
    start, stop = args
    for i in range(start, stop):
        sample(i)
    return stop - start


def _ranges(n: int) -> list[tuple[int, int]]:
    """The inputs cut as ``pack_samples`` cuts them (a task each): the limits get the
    same few, large tasks (small ones cost the pool's messages, not the function)."""
    from packer.samples import default_range_records

    step = default_range_records(n)
    return [(a, min(n, a + step)) for a in range(0, n, step)]


def produce_and_discard(n: int, workers: int) -> float:
    import multiprocessing as mp

    chunks = _ranges(n)
    t = time.perf_counter()
    with mp.get_context("fork").Pool(workers) as pool:
        done = sum(pool.imap_unordered(_discard_range, chunks))
    assert done == n
    return time.perf_counter() - t


def _write_range(args: tuple[int, int, str]) -> int:
    from crc32c import crc32c

    start, stop, path = args
    crc = 0
    with open(path, "wb") as f:
        for a in range(start, stop, 64):
            samples = [sample(i) for i in range(a, min(stop, a + 64))]
            data = b"".join(p for s in samples for p in (s["text"].encode(), s["tokens"]))
            crc = crc32c(data, crc)
            f.write(data)
    return stop - start


def produce_and_write(n: int, workers: int, out: Path) -> float:
    """The floor of any packer: the function's samples, their bytes joined per 64
    inputs, checksummed and appended to one file per range of inputs (ranges as
    ``pack_samples`` cuts them); no index, no check, no format."""
    import multiprocessing as mp

    out.mkdir(parents=True)
    chunks = [(a, b, str(out / f"{a}.bin")) for a, b in _ranges(n)]
    t = time.perf_counter()
    with mp.get_context("fork").Pool(workers) as pool:
        done = sum(pool.imap_unordered(_write_range, chunks))
    assert done == n
    return time.perf_counter() - t


def ours(n: int, workers: int, out: Path) -> float:
    from packer import PackOptions, pack_samples

    seconds, s = h.timed_call(pack_samples, sample, range(n), out,
                              PackOptions(workers=workers, durable=False), progress=False)
    assert s.records_written == n
    return seconds


def litdata(n: int, workers: int, out: Path) -> float:
    import litdata as ld

    return h.timed(ld.optimize, fn=sample, inputs=list(range(n)), output_dir=str(out),
                   num_workers=workers, chunk_bytes="64MB", mode="overwrite")


def mds(n: int, workers: int, out: Path) -> float:
    import multiprocessing as mp

    from streaming import MDSWriter

    t = time.perf_counter()
    with mp.get_context("fork").Pool(workers) as pool, \
            MDSWriter(out=str(out), columns={"text": "str", "tokens": "ndarray:int32"},
                      size_limit=64 << 20) as w:
        for s in pool.imap(sample, range(n), chunksize=64):
            w.write(s)
    return time.perf_counter() - t


PEERS = {"litdata": litdata, "mds": mds}


# -- --memory ----------------------------------------------------------------------------

_KB_TOKENS = 256  # int32: a 1 KB sample
_MEMORY_GUARD = 2 << 30  # a case's tree is stopped here: the machine is shared


def kb_samples(span: tuple[int, int | None]):
    """Input ``(start, count)``: ``count`` samples of 1 KB (None: without end)."""
    start, count = span
    stop = None if count is None else start + count
    j = start
    while stop is None or j < stop:
        yield {"tokens": np.full(_KB_TOKENS, j, np.int32)}
        j += 1


# case -> its inputs: 300,000 samples of 1 KB each way, or one input without end.
MEMORY_CASES = {
    "one input": [(0, 300_000)],
    "300 inputs": [(k * 1000, 1000) for k in range(300)],
    "never-ending": [(0, None)],
}


def _memory_case(name: str, workers: int, out: Path) -> int:
    """In the case's own process: pack, then print the largest ``ru_maxrss`` (KiB)."""
    from packer import PackOptions, pack_samples

    t = time.perf_counter()
    s = pack_samples(kb_samples, MEMORY_CASES[name], out,
                     PackOptions(workers=workers, durable=False), progress=False)
    maxrss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                 resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    h.emit(seconds=time.perf_counter() - t, records=s.records_written, maxrss_kib=maxrss)
    return 0


def _disk_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            try:
                total += os.stat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def memory(workers: int, endless_seconds: float, scratch: Path) -> None:
    """Run every :data:`MEMORY_CASES` case in a fresh process; print the figures."""
    import packer

    print(f"pack_samples peak memory: samples of 1 KB (int32[256]), workers={workers}, "
          f"durable=False, packer from {Path(packer.__file__).parent}; load "
          f"{h.Load.now()[0]:.2f} at start")
    print("tree peak: the case's process tree, summed PSS sampled every 0.1 s; "
          "ru_maxrss: its largest process\n")
    root = Path(__file__).resolve().parent.parent
    table = h.Table(h.Col("case", 12), h.Col("inputs", 6, ">"), h.Col("samples", 8, ">"),
                    h.Col("seconds", 8, ">"), h.Col("tree peak MB", 13, ">"),
                    h.Col("ru_maxrss MB", 13, ">"), sep=" ")
    peaks = {}
    for name, inputs in MEMORY_CASES.items():
        out = scratch / name.replace(" ", "-")
        cmd = [sys.executable, "-m", "scripts.bench_pack_samples", "--memory-case", name,
               "--workers", str(workers), "--out", str(out)]
        proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        endless = inputs[0][1] is None
        t0 = time.perf_counter()
        peak, trace, shown = 0, [], 0.0
        while proc.poll() is None:
            t = time.perf_counter() - t0
            pss = h.tree_pss_bytes(proc.pid)
            peak = max(peak, pss)
            if endless and t >= shown:
                trace.append((t, pss, _disk_bytes(out)))
                shown += 2.0
            if (endless and t >= endless_seconds) or pss > _MEMORY_GUARD:
                os.killpg(proc.pid, signal.SIGKILL)  # the group this call started
                if pss > _MEMORY_GUARD:
                    trace.append((t, pss, _disk_bytes(out)))
                break
            time.sleep(0.1)
        res = h.last_json(proc.communicate()[0])
        if endless:
            why = f"over {_MEMORY_GUARD >> 30} GiB" if peak > _MEMORY_GUARD else "as planned"
            print(f"{name}: one input yielding 1 KB samples without end, killed at "
                  f"{time.perf_counter() - t0:.1f} s ({why})")
            h.Table(h.Col("t (s)", 6, ">"), h.Col("tree PSS MB", 12, ">"),
                    h.Col("on disk MB", 11, ">"), sep=" ").print(
                [(f"{t:.1f}", f"{pss / 1e6:.1f}", f"{disk / 1e6:.1f}") for t, pss, disk in trace])
            continue
        if proc.returncode or res is None:
            print(f"{name}: failed (exit {proc.returncode})")
            continue
        peaks[name] = peak
        if len(peaks) == 1:
            print(table.head())
        print(table.line(name, str(len(inputs)), f"{res['records']:,}", f"{res['seconds']:.1f}",
                         f"{peak / 1e6:.1f}", f"{res['maxrss_kib'] * 1024 / 1e6:.1f}"))
        if len(peaks) == 2:
            a, b = peaks.values()
            print(f"one input ÷ 300 inputs (tree peak): {a / b:.2f} (target <= 1.3)\n")
        shutil.rmtree(out, ignore_errors=True)


def _peer(python: str | None, name: str, n: int, workers: int, out: Path) -> float | str:
    """A peer's seconds, run in the peers' virtualenv (or why not)."""
    if not python:
        return "skipped: needs the peers virtualenv (--peers-python)"
    root = Path(__file__).resolve().parent.parent
    cmd = [python, "-m", "scripts.bench_pack_samples", "--peer", name, "--count", str(n),
           "--workers", str(workers), "--out", str(out)]
    res = subprocess.run(cmd, cwd=root, capture_output=True, text=True,
                         env={**os.environ, "BENCH_WORK_US": str(_WORK_US)})
    if res.returncode:
        return f"failed: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}"
    return h.last_json(res.stdout)["seconds"]


def main(argv: list[str] | None = None) -> int:
    global _WORK_US
    p = h.parser(__doc__)
    p.add_argument("--count", type=int, default=200_000)
    h.add_workers(p)
    h.add_repeat(p)
    p.add_argument("--work-us", type=float, default=0.0,
                   help="extra CPU microseconds per sample (a costlier tokenizer)")
    h.add_peers_python(p)
    p.add_argument("--quick", action="store_true", help="20,000 samples, one round")
    p.add_argument("--memory", action="store_true",
                   help="peak memory of one input yielding many samples (see the docstring)")
    p.add_argument("--endless-seconds", type=float, default=20.0,
                   help="--memory: how long the never-ending input runs")
    p.add_argument("--peer", choices=sorted(PEERS), help=argparse.SUPPRESS)
    p.add_argument("--memory-case", choices=sorted(MEMORY_CASES), help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_case:  # one --memory case, in its own process
        return _memory_case(args.memory_case, args.workers, args.out)
    if args.memory:
        scratch = Path(tempfile.mkdtemp(prefix="bench-samples-memory-"))
        try:
            memory(args.workers, args.endless_seconds, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return 0
    if args.peer:  # inside the peers' virtualenv
        h.emit(seconds=PEERS[args.peer](args.count, args.workers, args.out))
        return 0
    _WORK_US = args.work_us
    os.environ["BENCH_WORK_US"] = str(args.work_us)  # forked workers read the global
    n, repeat = (20_000, 1) if args.quick else (args.count, args.repeat)
    w = args.workers
    scratch = Path(tempfile.mkdtemp(prefix="bench-samples-"))
    sizes = [sample(i)["tokens"].nbytes for i in range(0, n, max(1, n // 1000))]
    load = h.Load()
    print(f"{n:,} samples (str + int32 ndarray of {min(sizes)}-{max(sizes)} B, mean "
          f"{statistics.mean(sizes):,.0f} B), +{args.work_us:g} µs of work each; W = {w} "
          f"workers ({os.cpu_count()} cores); load {load.before[0]:.2f} at start; median of {repeat}")
    cases = {
        "produce and discard": lambda o: produce_and_discard(n, w),
        "produce and write bytes": lambda o: produce_and_write(n, w, o),
        "pack_samples": lambda o: ours(n, w, o),
        "LitData optimize": lambda o: _peer(args.peers_python, "litdata", n, w, o),
        "MDSWriter + Pool.imap": lambda o: _peer(args.peers_python, "mds", n, w, o),
    }
    names = list(cases)
    secs: dict[str, list] = {k: [] for k in names}
    try:
        for r in range(repeat):
            for name in h.rotated(names, r):
                out = scratch / f"{name.split()[0]}-{r}"
                secs[name].append(cases[name](out))
                shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table = h.Table(h.Col("case", 24), h.Col("records/s", 10, ">"),
                    h.Col("pack_samples ÷ it", 18, ">"), h.Col("target", 0, gap="  "), sep=" ")
    print()
    print(table.head())
    targets = {"produce and discard": ">= 0.8", "LitData optimize": ">= 1.0",
               "MDSWriter + Pool.imap": ">= 1.0"}
    for name in names:
        got = secs[name]
        if any(isinstance(x, str) for x in got):
            print(table.note(name, next(x for x in got if isinstance(x, str))))
            continue
        ratio = "" if name == "pack_samples" else f"{h.paired_ratio(got, secs['pack_samples']):.2f}"
        print(table.line(name, f"{n / h.median(got):,.0f}", ratio, targets.get(name, "")))
    print(f"load {h.Load.now()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
