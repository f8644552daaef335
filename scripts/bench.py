"""The benchmark suite: shardpack against the hardware limits and the peers, in one run.

    python -m scripts.bench [--data DIR] [--quick] [--peers-python /tmp/peers-venv/bin/python]

Generates (or reuses, ``--data``) an image folder of realistic JPEGs (~100 KB,
300-500 px, ``scripts.synth``), then measures, each case ``--repeat`` times with
the cases interleaved in every round (rotated order), and prints one table:

* limits: plain read of every small file, the copy limit (read every file and
  append it to one file), sequential read of one large file, numpy memcpy,
  single-core decode (simplejpeg, PIL) and decode + random-resized-crop + flip;
* packing: ``packer.pack`` vs the webdataset, tfrecord, MDS and LitData writers;
* raw reading (bytes copied out), sequential and random access, ours vs each
  peer's own reader;
* the full pipeline (decode + random resized crop 224 + flip, batch 256,
  workers = cores): ours vs ImageFolder + PIL through torch's DataLoader, vs
  each peer feeding the same decoder through torch's DataLoader, and vs DALI's own
  CPU pipelines (``readers.file`` over the image folder, ``readers.tfrecord`` over our
  ``--to tfrecord`` output and its ``.idx`` files; ``decoders.image_random_crop`` +
  ``resize`` 224 + ``flip``, uint8 HWC), at cores threads and at one thread (ours at
  one worker): each side's scaling efficiency, ours ÷ DALI at both, images per
  CPU-second;
* cold cache: raw reading and the pipeline with the page cache dropped before
  each run (needs root; skipped with a message otherwise);
* memory: peak RssAnon of each reader's process tree (page cache excluded);
  loader memory for a 10x larger dataset; monitor overhead.

Ratios are computed per round (the two sides measured back to back) and the
median ratio is reported: this machine's absolute rates vary 2x between runs.
Every reader and writer runs in a subprocess (``scripts/bench_peers.py``) so its
memory can be sampled; MosaicML Streaming, LitData and DALI run in a separate
virtualenv (``--peers-python`` or ``$SHARDPACK_PEERS_PYTHON``), or are skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scripts import harness as h

HERE = Path(__file__).resolve().parent
PEERS = HERE / "bench_peers.py"
VENV_FORMATS = ("mds", "litdata", "dali-files", "dali-tfrecord", "dali-det", "dali-det-pad",
                "dali-det-raw")
LABELS = {"shards": "shardpack", "tfrecord": "tfrecord", "wds": "webdataset", "mds": "MDS",
          "litdata": "LitData", "imagefolder": "ImageFolder+PIL (torch DataLoader)",
          "dali-files": "DALI readers.file (image folder)",
          "dali-tfrecord": "DALI readers.tfrecord (our --to tfrecord + .idx)"}
DALI_FORMATS = ("dali-files", "dali-tfrecord")


# -- measurement plumbing ---------------------------------------------------------------------

@dataclass
class Case:
    """One measured thing: its per-round rates (or why it was skipped)."""

    name: str
    unit: str
    rates: list[float] = field(default_factory=list)
    per_cpu: list[float] = field(default_factory=list)  # records per CPU-second, per round
    mem_kb: int = 0
    skipped: str | None = None
    note: str = ""

    @property
    def median(self) -> float:
        return h.median(self.rates)

    @property
    def spread(self) -> float:
        return h.spread(self.rates)


def ratio(a: Case, b: Case) -> float:
    """Median over rounds of a's rate ÷ b's rate in the same round."""
    return h.paired_ratio(a.rates, b.rates)


class Runner:
    """Runs ``bench_peers.py`` subcommands in the right interpreter."""

    def __init__(self, peers_python: str | None, cold: bool) -> None:
        self.peers_python = peers_python
        self.cold = cold
        self.dali: dict[str, str | None] = {}  # why DALI cannot run there (None: it can)

    def python(self, fmt: str) -> str | None:
        return self.peers_python if fmt in VENV_FORMATS else sys.executable

    def __call__(self, fmt: str, *args: str, drop: bool = False) -> dict:
        py = self.python(fmt)
        if py is None:
            return {"skipped": "needs the peers virtualenv (--peers-python or "
                               "$SHARDPACK_PEERS_PYTHON; see BENCHMARKS.md)"}
        if py == sys.executable and (why := h.missing(*runner_needs(fmt, args[0]))):
            return {"skipped": why}
        if fmt.startswith("dali"):
            if py not in self.dali:
                self.dali[py] = dali_missing(py)
            if self.dali[py]:
                return {"skipped": self.dali[py]}
        if drop:
            drop_caches()
        proc = subprocess.Popen([py, str(PEERS), *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=HERE.parent)
        mon = h.Peak(kb=lambda: h.tree_rss_anon_kb(proc.pid))  # page cache not in it
        mon.start()
        out, err = proc.communicate()
        peak = mon.stop()["kb"]
        res = h.last_json(out)
        if proc.returncode or res is None:
            tail = (err.strip().splitlines() or ["no output"])[-1]
            return {"skipped": f"failed (exit {proc.returncode}): {tail[:150]}"}
        res["mem_kb"] = peak
        return res


def runner_needs(fmt: str, command: str) -> tuple[str, ...]:
    """What a ``bench_peers.py`` runner imports beyond the core dependencies (the
    ``bench`` extra's packages), for a run in this interpreter."""
    needs = {"tfrecord": ("tfrecord",), "wds": ("webdataset",), "imagefolder": ("PIL",)}.get(
        fmt, ())
    if command == "pipeline" and fmt != "shards":
        needs += ("torch",)  # every peer's pipeline is torch's DataLoader
    return needs


def dali_missing(python: str) -> str | None:
    """Why DALI cannot run in ``python`` (one line), or None when ``nvidia.dali`` imports."""
    r = subprocess.run([python, "-c", "import nvidia.dali"], capture_output=True, text=True)
    if r.returncode == 0:
        return None
    return (f"DALI not installed in the peers virtualenv ({python}): pip install "
            "nvidia-dali-cuda120 there (BENCHMARKS.md, Setting up the peers)")


# -- DALI (CPU pipelines) ----------------------------------------------------------------------

def ours_tfrecord(shards: Path, data: Path, count: int, cores: int) -> Path:
    """The pipeline subset's shards converted by ``pack-dataset --to tfrecord`` (which
    writes DALI's ``.idx`` files beside them), once, kept under ``data``."""
    from packer import PackOptions, pack

    out = data / f"pipe-ours-tfrecord-{count}"
    if not (out / ".complete").exists():
        shutil.rmtree(out, ignore_errors=True)
        pack(shards, out, PackOptions(source="shards", sink="tfrecord", workers=cores,
                                      durable=False))
        (out / ".complete").touch()
    return out


def scaling(at_cores: Case, at_one: Case, cores: int) -> float:
    """Scaling efficiency: the rate at ``cores`` ÷ (cores × the rate at one), median over
    rounds of the two measured in the same round."""
    return h.paired_ratio(at_cores.rates, [cores * x for x in at_one.rates])


def dali_section(suite: h.Report, cores: int, ours: Case, dali: dict[str, Case],
                 one: dict[str, Case]) -> None:
    """The DALI rows at one thread (ours at one worker) and the notes with each side's
    scaling efficiency, ours ÷ DALI at cores and at one, and images per CPU-second."""
    suite.section("DALI (CPU pipelines): one thread each (ours: 1 worker), same work")
    row(suite, one["shards"], h.ratio_text(scaling(ours, one["shards"], cores),
                                           f"scaling ({cores} ÷ {cores}x1)"))
    for f in DALI_FORMATS:
        row(suite, one[f], h.ratio_text(ratio(one["shards"], one[f]), "ours ÷ it (1 each)"),
            "> 1.0")
    sides = [("ours", ours, one["shards"])] + [(LABELS[f].split(" (")[0], dali[f], one[f])
                                               for f in DALI_FORMATS]
    sides = [(name, a, b) for name, a, b in sides if a.rates and b.rates]
    if len(sides) < 2:  # DALI skipped (its rows say why), or ours
        return
    suite.notes.append(f"scaling efficiency, rate at {cores} ÷ ({cores} x rate at 1), same "
                       "round: " + ", ".join(f"{name} {scaling(a, b, cores):.2f}"
                                              for name, a, b in sides))
    for name, a, b in sides[1:]:
        suite.notes.append(f"ours ÷ {name}: {ratio(ours, a):.2f} at {cores} (per core: "
                           f"{ours.median / cores:,.0f} vs {a.median / cores:,.0f} img/s), "
                           f"{ratio(one['shards'], b):.2f} at 1")
    suite.notes.append(f"images per CPU-second (process tree, user + system) at {cores} / at 1: "
                       + ", ".join(f"{name} {h.median(a.per_cpu):,.0f} / "
                                   f"{h.median(b.per_cpu):,.0f}" for name, a, b in sides))


def drop_caches() -> None:
    """Drop the page cache (needs root): the next read comes from the disk."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def can_drop_caches() -> str | None:
    try:
        drop_caches()
    except OSError as exc:
        return f"cannot drop the page cache ({exc}); run as root"
    return None


def record(case: Case, res: dict, amount: str = "records") -> None:
    if "skipped" in res:
        case.skipped = case.skipped or res["skipped"]
        return
    case.rates.append(res[amount] / res["seconds"])
    if res.get("cpu_seconds"):
        case.per_cpu.append(res["records"] / res["cpu_seconds"])
    case.mem_kb = max(case.mem_kb, res.get("mem_kb", 0))


def rounds(cases: list[tuple[Case, callable]], repeat: int) -> None:
    """Run every case not skipped once per round (:func:`scripts.harness.rounds`)."""
    def run(case_fn, _r):
        case, fn = case_fn
        if case.skipped is None:
            fn(case)

    h.rounds(cases, repeat, run)


def files_of(root: Path) -> list[Path]:
    """Every file under ``root`` but the hidden ones (the markers), sorted."""
    return sorted(f for f in root.rglob("*") if f.is_file() and not f.name.startswith("."))


# -- limits (in-process) ---------------------------------------------------------------------

def read_small_files(paths: list[Path]) -> int:
    buf = bytearray(4 << 20)
    total = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            while n := os.readv(fd, [buf]):
                total += n
        finally:
            os.close(fd)
    return total


def read_big_file(path: Path) -> int:
    buf = bytearray(8 << 20)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            total += n
    return total


#: The rows of :func:`decode_rates` that decode with Pillow.
PIL_ROWS = ("pil", "pil_rrc")


def decode_rates(jpegs: list[bytes]) -> dict[str, float]:
    """Single-core images/s: full decodes, and decode + RRC 224 + flip (ours and naive
    PIL; the PIL rows only where Pillow is installed, see :data:`PIL_ROWS`)."""
    import io

    import simplejpeg

    dec = h.rrc_flip_decoder()
    rng = np.random.default_rng(0)
    fns = {"simplejpeg": simplejpeg.decode_jpeg, "ours_rrc": lambda d: dec(d, rng)}
    if h.missing("PIL") is None:
        from PIL import Image

        fns["pil"] = lambda d: np.asarray(Image.open(io.BytesIO(d)).convert("RGB"))
        fns["pil_rrc"] = lambda d: h.naive_rrc_flip(d, rng)
    rates = {}
    for name, fn in fns.items():
        fn(jpegs[0])
        rates[name] = len(jpegs) / h.timed(lambda fn=fn: [fn(d) for d in jpegs])
    return rates


# -- the suite ---------------------------------------------------------------------------------

def new_report() -> h.Report:
    return h.Report(h.Col("measure"), h.Col("median", 18, ">"), h.Col("spread", 6, ">"),
                    h.Col("ratio", 26), h.Col("target", 22), h.Col("RssAnon MiB", 11, ">"))


def row(report: h.Report, case: Case, ratio_s: str = "", target: str = "") -> None:
    """A case's row: its median rate, spread, ratio, target and peak memory (or why not)."""
    if case.skipped is not None:
        report.skip(case.name, f"skipped: {case.skipped}")
        return
    x = case.median
    mem = f"{case.mem_kb / 1024:,.0f}" if case.mem_kb else ""
    report.row(case.name + (f" [{case.note}]" if case.note else ""),
               f"{x:,.2f} {case.unit}" if x < 100 else f"{x:,.0f} {case.unit}",
               f"{case.spread:.0%}", ratio_s, target, mem)


def main(argv: list[str] | None = None) -> int:
    p = h.parser(__doc__)
    h.add_data(p, Path("/tmp/shardpack-bench"),
               help="where the image folder and the packed copies live (reused)")
    p.add_argument("--count", type=int, default=None,
                   help="JPEGs in the dataset (default 20,000)")
    p.add_argument("--pipeline-count", type=int, default=None,
                   help="JPEGs in the subset used for the full pipeline and the cold runs "
                        "(default 4,000)")
    p.add_argument("--random-count", type=int, default=None,
                   help="random lookups per peer __getitem__ run (ours does --count; "
                        "default 5,000)")
    h.add_repeat(p)
    h.add_workers(p, len(os.sched_getaffinity(0)))
    p.add_argument("--quick", action="store_true",
                   help="2,000 JPEGs, 600 in the pipeline, 1,000 lookups (unless given)")
    p.add_argument("--no-cold", action="store_true", help="skip the cold-cache runs")
    h.add_peers_python(p, help="python of the virtualenv with mosaicml-streaming and litdata")
    p.add_argument("--dali", action="append", metavar="KEY=VALUE", default=[],
                   help="a DALI setting for its pipelines (scripts/bench_peers.py, "
                        "DALI_SETTINGS), repeatable; also given to the detection benchmark")
    p.add_argument("--workloads", action="store_true",
                   help="then the detection, token-stream and pack-from-a-function benchmarks "
                        "(scripts/bench_detection.py, bench_tokens.py, bench_pack_samples.py), "
                        "each printing its own table of ratios")
    args = p.parse_args(argv)
    sizes = (2_000, 600, 1_000) if args.quick else (20_000, 4_000, 5_000)
    args.count, args.pipeline_count, args.random_count = (
        given if given is not None else default for given, default in
        zip((args.count, args.pipeline_count, args.random_count), sizes, strict=True))
    t_start = time.perf_counter()
    load = h.Load()
    args.data.mkdir(parents=True, exist_ok=True)
    src = h.image_folder(args.data, args.count)
    pipe_src = h.link_folder(src, args.data / f"subset-{args.pipeline_count}",
                             per_class=max(1, args.pipeline_count // 20))
    paths = files_of(src)
    n = len(paths)
    nbytes = sum(p.stat().st_size for p in paths)
    cores = args.workers
    run = Runner(args.peers_python, cold=not args.no_cold)
    suite = new_report()
    if args.peers_python is None:
        suite.notes.append("MDS and LitData skipped: no --peers-python / $SHARDPACK_PEERS_PYTHON")
    scratch = args.data / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    big = scratch / "copy.bin"
    formats = ["shards", "tfrecord", "wds", "mds", "litdata"]
    print(f"{n} JPEGs, {nbytes / n / 1e3:.0f} KB mean, {nbytes / 1e9:.2f} GB; pipeline subset "
          f"{len(files_of(pipe_src))}; {cores} workers = cores; median of {args.repeat} rounds",
          flush=True)
    h.warm(src)

    # ---- limits --------------------------------------------------------------------------
    small = Case("plain read of every small file", "MB/s")
    copy = Case("copy limit: read + append to one file, 1 proc", "MB/s")
    seq_big = Case("sequential read of one large file", "MB/s")
    memcpy = Case("numpy memcpy", "MB/s")
    h.copy_limit(paths, big)
    src_arr = np.fromfile(big, np.uint8)
    dst_arr = np.ones_like(src_arr)

    def do_copy(c):
        os.sync()
        c.rates.append(nbytes / h.timed(lambda: h.copy_limit(paths, big)) / 1e6)

    rounds([(small, lambda c: c.rates.append(nbytes / h.timed(lambda: read_small_files(paths)) / 1e6)),
            (copy, do_copy),
            (seq_big, lambda c: c.rates.append(nbytes / h.timed(lambda: read_big_file(big)) / 1e6)),
            (memcpy, lambda c: c.rates.append(nbytes / h.timed(lambda: np.copyto(dst_arr, src_arr)) / 1e6))],
           args.repeat)
    src_arr = dst_arr = None  # free the memory before the next section
    jpegs = [p.read_bytes() for p in paths[:: max(1, n // 300)]]
    dec = {k: Case(name, "img/s") for k, name in (
        ("simplejpeg", "1-core decode, simplejpeg"), ("pil", "1-core decode, PIL"),
        ("ours_rrc", "1-core decode+RRC224+flip, ours"), ("pil_rrc", "1-core decode+RRC224+flip, PIL"))}
    for k in PIL_ROWS:
        dec[k].skipped = h.missing("PIL")
    for _ in range(args.repeat):
        for k, v in decode_rates(jpegs).items():
            dec[k].rates.append(v)
    suite.section("limits (warm page cache)")
    for c in (small, copy, seq_big):
        row(suite, c, h.ratio_text(ratio(c, memcpy), "of memcpy"))
    row(suite, memcpy, "1.00 of memcpy")
    row(suite, dec["simplejpeg"])
    row(suite, dec["pil"], h.ratio_text(ratio(dec["pil"], dec["simplejpeg"]), "of simplejpeg"))
    row(suite, dec["ours_rrc"], h.ratio_text(ratio(dec["ours_rrc"], dec["pil_rrc"]), "of PIL RRC"))
    row(suite, dec["pil_rrc"])
    print(f"limits done ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)

    # ---- packing -------------------------------------------------------------------------
    outs = {f: args.data / f"packed-{f}" for f in formats}
    writers = {f: Case(f"{LABELS[f]} writer" + (f", workers={cores}" if f in ("shards", "litdata")
                                               else ", 1 proc (no parallel writer)"), "rec/s")
               for f in formats}
    pack_copy = Case("copy limit (read + append, 1 proc)", "rec/s")

    def write(fmt):
        def fn(c):
            out = outs[fmt]
            shutil.rmtree(out, ignore_errors=True)
            os.sync()  # the previous writer's dirty pages would throttle this one
            record(c, run(fmt, "write", fmt, str(src), str(out), "--workers", str(cores)))
        return fn

    rounds([(pack_copy, lambda c: (os.sync(), c.rates.append(n / h.timed(lambda: h.copy_limit(paths, big)))))]
           + [(writers[f], write(f)) for f in formats], args.repeat)
    big.unlink(missing_ok=True)
    suite.section(f"packing {n} JPEGs (page cache warm, durable=False: no fsync)")
    row(suite, pack_copy, "1.00 of copy limit")
    ours_w = writers["shards"]
    row(suite, ours_w, h.ratio_text(ratio(ours_w, pack_copy), "of copy limit"), ">= 0.9 of copy limit")
    for f in formats[1:]:
        row(suite, writers[f], h.ratio_text(ratio(ours_w, writers[f]), "ours ÷ it"), "> 1.0")
    print(f"packing done ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)

    # ---- raw reading, warm ---------------------------------------------------------------
    ready = [f for f in formats if (outs[f]).exists() and writers[f].skipped is None]
    h.warm(*(outs[f] for f in ready))
    seq = {f: Case(f"{LABELS[f]} sequential", "MB/s") for f in formats}
    mem_seq = Case("numpy memcpy, 8 MB chunks into a reused buffer", "MB/s")
    for f in formats:
        if f not in ready:
            seq[f].skipped = writers[f].skipped or "not written"
    src_arr = np.concatenate([np.fromfile(p, np.uint8) for p in paths[: n // 4]])
    dst_arr = np.ones(8 << 20, np.uint8)  # the readers copy into a reused 8 MB buffer too

    def chunked_memcpy():
        for at in range(0, src_arr.size, dst_arr.size):
            part = src_arr[at : at + dst_arr.size]
            np.copyto(dst_arr[: part.size], part)

    def reader(fmt, mode, count=None, drop=False, root=None, copy=True):
        def fn(c):
            extra = ["--count", str(count)] if count else []
            extra += [] if copy else ["--no-copy"]
            res = run(fmt, "read", fmt, str(root or outs[fmt]), "--mode", mode, *extra, drop=drop)
            if "skipped" not in res:
                res["mb"] = res["bytes"] / 1e6
            record(c, res, "mb" if mode == "seq" else "records")
        return fn

    counts = {"shards": None, "tfrecord": None, "wds": None, "mds": min(2_000, n), "litdata": None}
    seq["mds"].note = f"first {counts['mds']} records (slow reader)"
    rounds([(mem_seq, lambda c: c.rates.append(src_arr.nbytes / h.timed(chunked_memcpy) / 1e6))]
           + [(seq[f], reader(f, "seq", counts[f])) for f in formats], args.repeat)
    src_arr = dst_arr = None  # free the memory before the next section
    rnd_fmts = ("shards", "mds", "litdata")
    rnd = {f: Case(f"{LABELS[f]} random __getitem__", "rec/s") for f in rnd_fmts}
    rndc = {f: Case(f"{LABELS[f]} random __getitem__ + copy out", "rec/s") for f in rnd_fmts}
    lookups = {"shards": n, "mds": args.random_count, "litdata": max(200, args.random_count // 5)}
    for f in rnd_fmts:
        if f not in ready:
            rnd[f].skipped = rndc[f].skipped = writers[f].skipped or "not written"
        if f != "shards":
            rnd[f].note = rndc[f].note = f"{lookups[f]} lookups"
    batched = Case("shardpack random, batched lookups (ds.payloads, 256 per call) + copy out",
                   "rec/s")
    rounds([(rnd[f], reader(f, "random", lookups[f], copy=False)) for f in rnd_fmts]
           + [(rndc[f], reader(f, "random", lookups[f])) for f in rnd_fmts]
           + [(batched, reader("shards", "random-batch", n))], args.repeat)
    suite.section("raw reading, warm (every payload byte copied out)")
    row(suite, mem_seq)
    row(suite, seq["shards"], h.ratio_text(ratio(seq["shards"], mem_seq), "of memcpy"), ">= 0.8 of memcpy")
    for f in formats[1:]:
        row(suite, seq[f], h.ratio_text(ratio(seq["shards"], seq[f]), "ours ÷ it"), "> 1.0")
    suite.skip("tfrecord / webdataset random access",
               "skipped: n/a: sequential formats (no per-record index in their readers)")
    for cases in (rnd, rndc):
        row(suite, cases["shards"])
        for f in ("mds", "litdata"):
            row(suite, cases[f], h.ratio_text(ratio(cases["shards"], cases[f]), "ours ÷ it"), ">= 10x")
    row(suite, batched, h.ratio_text(ratio(batched, rndc["mds"]), "÷ MDS + copy"), ">= 10x")
    print(f"raw reading done ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)

    # ---- full pipeline, warm ---------------------------------------------------------------
    # Named by the subset's size: a --data folder serves runs of several sizes.
    pouts = {f: args.data / f"pipe-{f}-{args.pipeline_count}" for f in formats}
    for f in ready:
        if not (pouts[f] / ".complete").exists():
            shutil.rmtree(pouts[f], ignore_errors=True)
            res = run(f, "write", f, str(pipe_src), str(pouts[f]), "--workers", str(cores))
            if "skipped" not in res:
                (pouts[f] / ".complete").touch()
    pouts["imagefolder"] = pipe_src
    pfmts = ["shards", "imagefolder", *formats[1:]]
    pipe = {f: Case(f"{LABELS[f]}" + (" + our decoder" if f not in ("shards", "imagefolder") else ""),
                    "img/s") for f in pfmts}
    pipe["shards"].name = "shardpack Loader"
    for f in pfmts:
        if not (pouts[f] / ".complete").exists():
            pipe[f].skipped = writers.get(f, pipe[f]).skipped or "not written"
    # DALI's own CPU pipelines (same work: decode + RRC 224 + flip, uint8 HWC), at
    # cores threads and at one, and ours at one worker, for scaling efficiency.
    pouts["dali-files"] = pipe_src
    pouts["dali-tfrecord"] = ours_tfrecord(pouts["shards"], args.data, args.pipeline_count,
                                           cores) if pipe["shards"].skipped is None else None
    dali = {f: Case(f"{LABELS[f]}, {cores} threads", "img/s") for f in DALI_FORMATS}
    one = {f: Case(f"{LABELS[f]}, 1 thread", "img/s") for f in DALI_FORMATS}
    one["shards"] = Case("shardpack Loader, 1 worker", "img/s")
    if pouts["dali-tfrecord"] is None:
        dali["dali-tfrecord"].skipped = one["dali-tfrecord"].skipped = "no shards to convert"
    one["shards"].skipped = pipe["shards"].skipped
    ceiling = Case(f"ceiling: {cores} x 1-core decode+RRC+flip", "img/s")
    pjpegs = [p.read_bytes() for p in files_of(pipe_src)[:200]]

    dali_args = [x for kv in args.dali for x in ("--dali", kv)]

    def pipeline(fmt, drop=False, workers=cores):
        extra = dali_args if fmt.startswith("dali") else []

        def fn(c):
            record(c, run(fmt, "pipeline", fmt, str(pouts[fmt]), "--workers", str(workers),
                          *extra, drop=drop))
        return fn

    h.warm(*(pouts[f] for f in pfmts if pipe[f].skipped is None))
    bare = Case(f"bare parallel decode+RRC+flip, {cores} procs, no loader", "img/s")

    def bare_decode(c):
        from scripts.bench_reader import parallel_raw_decode

        c.rates.append(parallel_raw_decode(pouts["shards"], cores, 600))

    rounds([(ceiling, lambda c: c.rates.append(cores * decode_rates(pjpegs)["ours_rrc"]))]
           + ([(bare, bare_decode)] if pipe["shards"].skipped is None else [])
           + [(pipe[f], pipeline(f)) for f in pfmts]
           + [(dali[f], pipeline(f)) for f in DALI_FORMATS]
           + [(one[f], pipeline(f, workers=1)) for f in one], args.repeat)
    suite.section(f"full pipeline, warm: decode + RRC 224 + flip, batch 256, {cores} workers, "
                  f"{len(files_of(pipe_src))} JPEGs")
    row(suite, ceiling)
    row(suite, bare, h.ratio_text(ratio(bare, ceiling), "of ceiling"))
    row(suite, pipe["shards"], h.ratio_text(ratio(pipe["shards"], ceiling), "of ceiling"), ">= 0.9 of ceiling")
    suite.notes.append(f"Loader ÷ bare parallel decode (same load, same round): "
                       f"{ratio(pipe['shards'], bare):.2f}")
    row(suite, pipe["imagefolder"], h.ratio_text(ratio(pipe["shards"], pipe["imagefolder"]), "ours ÷ it"), ">= 1.5x")
    for f in formats[1:]:
        row(suite, pipe[f], h.ratio_text(ratio(pipe["shards"], pipe[f]), "ours ÷ it"), "> 1.0")
    for f in DALI_FORMATS:
        row(suite, dali[f], h.ratio_text(ratio(pipe["shards"], dali[f]), "ours ÷ it"), "> 1.0")
    dali_section(suite, cores, pipe["shards"], dali, one)
    print(f"pipeline done ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)

    # ---- cold cache ----------------------------------------------------------------------
    why = "--no-cold" if args.no_cold else can_drop_caches()
    suite.section(f"cold page cache (dropped before every run), {len(files_of(pipe_src))} JPEGs")
    if why:
        suite.skip("cold cache runs", f"skipped: {why}")
    else:
        pfiles = files_of(pipe_src)
        pbytes = sum(p.stat().st_size for p in pfiles)
        csmall = Case("plain read of every small file", "MB/s")
        cseq = {f: Case(f"{LABELS[f]} sequential raw read", "MB/s") for f in formats}
        cseq["mds"].note = seq["mds"].note
        cpipe = {f: Case(f"{pipe[f].name} pipeline", "img/s") for f in pfmts}
        for f in formats:
            cseq[f].skipped = pipe[f].skipped
        for f in pfmts:
            cpipe[f].skipped = pipe[f].skipped

        def cold_small(c):
            drop_caches()
            c.rates.append(pbytes / h.timed(lambda: read_small_files(pfiles)) / 1e6)

        rounds([(csmall, cold_small)]
               + [(cseq[f], reader(f, "seq", counts[f], drop=True, root=pouts[f])) for f in formats]
               + [(cpipe[f], pipeline(f, drop=True)) for f in pfmts], args.repeat)
        row(suite, csmall)
        row(suite, cseq["shards"], h.ratio_text(ratio(cseq["shards"], csmall), "of small-file read"))
        for f in formats[1:]:
            row(suite, cseq[f], h.ratio_text(ratio(cseq["shards"], cseq[f]), "ours ÷ it"), "> 1.0")
        row(suite, cpipe["shards"], h.ratio_text(ratio(cpipe["shards"], pipe["shards"]), "of warm"))
        row(suite, cpipe["imagefolder"], h.ratio_text(ratio(cpipe["shards"], cpipe["imagefolder"]), "ours ÷ it"), ">= 1.5x")
        for f in formats[1:]:
            row(suite, cpipe[f], h.ratio_text(ratio(cpipe["shards"], cpipe[f]), "ours ÷ it"), "> 1.0")
    print(f"cold done ({time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)

    # ---- memory and monitor ----------------------------------------------------------------
    from scripts import bench_monitor, bench_reader

    suite.section("loader memory and monitor overhead")
    sizes = (2_000, 20_000) if args.quick else (10_000, 100_000)
    tiny = [bench_reader.build_tiny(args.data, m) for m in sizes]
    mem = [run("shards", "loader-memory", str(t), "--workers", str(cores)).get("kb", float("nan"))
           for t in tiny]
    suite.row(f"Loader RssAnon (main + workers), {sizes[1]:,} vs {sizes[0]:,} records",
              f"{mem[1] / 1024:,.0f} MiB", "", f"{mem[1] / mem[0]:.2f} of the small one",
              "~1.0 (flat)")
    mon_ds = args.data / "monitor-ds"
    if not (mon_ds / "manifest.json").exists():
        shutil.rmtree(mon_ds, ignore_errors=True)
        mon_ds.mkdir()
        bench_monitor._make_dataset(str(mon_ds), 1024, 256)
    res = bench_monitor.bench_loader(str(mon_ds / "ds"), samples=2 * args.repeat, workers=cores,
                                     batch_size=64, raw=False)
    on, off = res["rates"]["on"], res["rates"]["off"]
    suite.row("monitor on ÷ off, decode + CenterCrop 224, 64/batch", f"{h.median(on):,.0f} img/s",
              f"{h.spread(on):.0%}", f"{h.paired_ratio(on, off):.3f} of off", ">= 0.98")
    cpu_off = h.median(res["cpu"]["off"])
    extra = h.median(res["cpu"]["on"]) - cpu_off
    suite.notes.append(f"monitor: main-process CPU per batch {extra * 1e6:+.0f} us on a "
                       f"{64 / h.median(off) * 1e3:.1f} ms batch "
                       f"(bound {1 - max(extra, 0) / (64 / h.median(off)):.3f})")
    suite.notes.append(load.line())
    suite.notes.append("ratios: median over rounds of (ours ÷ reference) measured back to back; "
                       "spread = (max - min) ÷ median of the rates")
    suite.notes.append(f"total {time.perf_counter() - t_start:.0f} s")
    print()
    suite.print()
    shutil.rmtree(scratch, ignore_errors=True)
    if args.workloads:
        workloads(args)
    return 0


WORKLOADS = (
    ("detection: decode + resize + flip with boxes, aspect-ratio batches", "scripts.bench_detection",
     ["--repeat", "1"]),
    ("token streams: blocks against memcpy and LitData's TokensLoader", "scripts.bench_tokens", []),
    ("packing from a Python function: against LitData and MDSWriter", "scripts.bench_pack_samples",
     ["--repeat", "1"]),
)


def workloads(args) -> None:
    """The other workloads' benchmarks, one after the other in this run (each measures its
    own limit and peers side by side and prints ratios)."""
    peers = ["--peers-python", args.peers_python] if args.peers_python else []
    for title, module, extra in WORKLOADS:
        print(f"\n## {title}", flush=True)
        if module == "scripts.bench_detection":
            extra = [*extra, *(x for kv in args.dali for x in ("--dali", kv))]
        r = subprocess.run([sys.executable, "-m", module, *extra, *peers], cwd=HERE.parent)
        if r.returncode:
            print(f"{module} failed with exit status {r.returncode}")


if __name__ == "__main__":
    sys.exit(main())
