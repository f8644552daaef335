"""The GPU path checked in one run: its tests on the device, then its figures, all in one
JSON file and a table. ``bash scripts/gpu_check.sh`` is the one command that drives it.

Steps, each timed, an error in one recorded and the next still run:
  probe  cupy imports, sees a device and copies to it; where it does not (no GPU, or a
         driver the wheels do not match), one line says why, the GPU path's tests run on
         the numpy stand-in (tests/fake_cupy.py) and the exit status is theirs;
  tests  GPU_TESTS (test_device.py, test_gpu_decode.py) with real cupy (``-m gpu``): the sinks, padded
         and ragged fields, normalize / float16 / NCHW, torch tensors through DLPack
         (where torch has CUDA);
  h2d    (a) a raw pinned cupy copy of the bytes the loader copies per batch, the limit;
         (b) the loader's copies straight out of the page-locked slot ring; (c) the same
         through pinned staging; target (b)/(a) >= 0.8;
  epoch  an epoch to the GPU whose first batches equal the CPU path after the same
         normalization, and the consumer's queue wait when its step is the slowest part
         (about 0);
  pipeline  decode + RandomResizedCrop 224 + flip to the GPU (float16 NCHW, normalized
         there) ÷ the same pipeline to the CPU, workers = cores, median of alternated
         rounds; target >= 0.9 (the device adds no bottleneck);
  dali   DALI's GPU pipeline on the same JPEGs, when ``nvidia.dali`` imports;
  gpu_decode  nvImageCodec's own batch decode, our GPU-decode pipeline, the hybrid and
         the CPU pipeline, alternated, and the pixels against the CPU path
         (scripts/bench_gpu_decode.py: targets >= 0.85 of nvImageCodec, hybrid >= 0.9 of
         the sum and >= 2x the CPU pipeline), when nvImageCodec imports;
  cpu_scaling  bare processes doing decode + crop + flip against the Loader at 1, 4, 8
         and N workers (target >= 0.9).
h2d, epoch and pipeline decode on the CPU (``decode_device="cpu"``) whether or not
nvImageCodec is installed: they measure the copy path, and "auto" would hand their
batches to the GPU decoder (whose pixels differ from the CPU path's).

Run: ``python -m scripts.bench_gpu [--images 32768] [--workers N] [--seconds 8] [--out FILE]``
(scripts/gpu_requirements.py says what gpu_check.sh installs first). ``--seconds`` is
each gpu_decode and cpu_scaling rate's timed interval; tests/examples/test_gpu_check.py
rehearses every step on the stand-ins with ``--images 32 --seconds 0.2``.

Budget of the lease's one command, ``gpu_check.sh --wheels DIR --only
tests,gpu_decode,cpu_scaling`` at the defaults on a 16-core host, estimated from the code
and from per-core rates on the 2-core development machine (decode + RandomResizedCrop +
flip about 1,100 img/s, synthesis about 110 JPEGs/s, packing about 2,800 records/s; the
lent H200 host's Loader gave 400 img/s a worker, so its cores may be up to 2.5x slower):
the wheels' install and the probe 0.5-1 min; tests (the ~14 ``gpu`` tests, kernels
compiled) 0.3-1 min, 150 s at most; data, 32,768 JPEGs of 2.9 GB synthesized and packed
once per ``--data`` folder, 0.4-0.9 min; gpu_decode, 3 rounds of 4 rates of 8 s plus
1-3 s start-up each (loader, 16 workers, page-locked ring, decoder), the JPEGs read once,
the pixels and the overlap (one more rate), 2.1-2.6 min; cpu_scaling, 3 rounds of 5 rates (bare, Loader at 1, 4, 8, 16)
of 8 s plus 0.5-2 s each, 2.1-2.5 min. In all 5-8.5 min: inside a command's 10 minutes,
and inside the lease (15 min less about 2 to start) once, not twice; a rerun fits as one
step with ``--only`` (the data is kept) or ``--seconds 4`` (about 1.8 min less).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

import reader
from reader.options import DeviceOptions
from reader.runtime.device import measure_pinned_bandwidth, normalize, require_cupy
from reader.runtime.gpu_decode import require_nvimgcodec
from reader.transforms import CenterCrop, RandomResizedCrop
from scripts import bench_gpu_decode as gd
from scripts import harness as h

ROOT = Path(__file__).resolve().parents[1]
GPU_TESTS = ["tests/reader/runtime/test_device.py", "tests/reader/runtime/test_gpu_decode.py"]
H2D_TARGET, PIPELINE_TARGET = 0.8, 0.9
STEPS = ("tests", "h2d", "epoch", "pipeline", "dali", "gpu_decode", "cpu_scaling")


# -- the probe and the tests ----------------------------------------------------------------

def gpu_unusable() -> str | None:
    """Why the GPU path cannot run here, or None when cupy reaches a device."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a wheel whose libraries fail to load
        return f"cupy does not import: {type(exc).__name__}: {exc}".replace("\n", " ")
    try:
        cp = require_cupy()
        probe = np.arange(256, dtype=np.uint8)
        if not np.array_equal(cp.asnumpy(cp.asarray(probe)), probe):
            return "a copy to the GPU and back changed the bytes"
    except Exception as exc:  # ImportError, CUDARuntimeError (driver too old for the wheels), ...
        return f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return None


def run_tests(marker: str, workdir: Path) -> dict:
    """tests/reader/runtime/test_device.py under ``-m marker`` in a child pytest: counts, failures, skip reasons."""
    xml = workdir / f"tests-{marker.replace(' ', '-')}.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker,
           f"--junitxml={xml}", *GPU_TESTS]
    t0 = time.perf_counter()
    # 150 s: about 14 tests take well under a minute; a hang must leave the lease's
    # command (10 minutes) the time for the measures.
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=150)
    out = {"selection": f"-m '{marker}'", "exit": proc.returncode,
           "seconds": round(time.perf_counter() - t0, 1), "passed": 0, "failed": [], "skips": {}}
    if not xml.exists():
        out["failed"].append(f"pytest wrote no report: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        return out
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name")
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        skip = case.find("skipped")
        if bad is not None:
            out["failed"].append(f"{name}: {bad.get('message', '')}"[:300])
        elif skip is not None:
            reason = skip.get("message", "")
            out["skips"][reason] = out["skips"].get(reason, 0) + 1
        else:
            out["passed"] += 1
    if out["failed"]:
        print(proc.stdout[-6000:], file=sys.stderr)
    return out


# -- data -----------------------------------------------------------------------------------

def make_data(root: Path, images: int, workers: int) -> dict:
    """``images`` JPEGs in an image folder (for DALI) and packed as shards, kept for reruns."""
    from packer import PackOptions, pack
    from scripts.synth import make_image_folder

    src, ds = root / f"jpegs-{images}", root / f"shards-{images}"
    if not (ds / "manifest.json").exists():  # written last: the JPEGs are complete too
        make_image_folder(src, 16, max(1, images // 16), seed=0, workers=workers)
        pack(src, ds, PackOptions(overwrite=True, durable=False, workers=workers))
    return {"jpegs": str(src), "shards": str(ds)}


# -- the measures ---------------------------------------------------------------------------

class H2DProbe(reader.Monitor):
    """A monitor that keeps each batch's copy time and bytes (and reports nothing)."""

    def __init__(self):
        super().__init__(3600.0, output=False, cpu=None)
        self.h2d: list[tuple[float, int]] = []
        self.wait = 0.0

    def on_batch(self, t):
        if t.h2d_s:
            self.h2d.append((t.h2d_s, t.h2d_bytes))
        self.wait += t.wait_s

    def stats(self):
        return {}


def transfer_rate(ds, batch, workers, pinning, epochs=2):
    """GB/s of the loader's copies (CUDA-event timed), its ring mode, and the bytes a batch copies."""
    probe = H2DProbe()
    opts = DeviceOptions(dtype="uint8", layout="NHWC", pinning=pinning, decode_device="cpu")
    loader = reader.Loader(ds, batch, num_workers=workers, transform=[RandomResizedCrop(224)],
                           device="cuda", device_options=opts, monitor=probe)
    with loader:
        for _ in range(epochs):
            for _b in loader:
                pass
        mode = loader.runtime.cuda.mode
    timed = probe.h2d[2:] or probe.h2d  # the first copies include warm-up
    if not timed:
        raise RuntimeError("no copy was timed: give more --images")
    rates = [n / s / 1e9 for s, n in timed]
    return h.median(rates), mode, max(n for _s, n in timed)


def h2d(ds, batch, workers) -> dict:
    reg, reg_mode, nbytes = transfer_rate(ds, batch, workers, "register")
    stg, stg_mode, _ = transfer_rate(ds, batch, workers, "staging")
    raw = h.median(measure_pinned_bandwidth(nbytes) for _ in range(5))
    return {"batch_bytes": nbytes, "raw_pinned_gb_s": raw, "ring_gb_s": reg, "ring_mode": reg_mode,
            "ring_ratio": reg / raw, "staging_gb_s": stg, "staging_mode": stg_mode,
            "staging_ratio": stg / raw, "target": H2D_TARGET, "met": reg / raw >= H2D_TARGET}


def gpu_step(cp, seconds: float):
    """A consumer's step of about ``seconds`` of GPU time: elementwise passes over 64 MB,
    as many as timed passes say fit (the host only queues them; the step ends in a sync)."""
    a = cp.asarray(np.full(1 << 24, 1.0, np.float32))
    stream = cp.cuda.get_current_stream()
    a *= 0.999  # compiles the kernel
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(4):
        a *= 0.999
    stream.synchronize()
    passes = max(1, round(seconds / max((time.perf_counter() - t0) / 4, 1e-6)))

    def step():
        nonlocal a
        for _ in range(passes):
            a *= 0.999
        stream.synchronize()

    return step


def check_epoch(ds, batch, workers, step_ms, compare=16) -> dict:
    """An epoch to the GPU (float32 NCHW) with a consumer step after each batch; its first
    ``compare`` batches checked against the CPU path after the same normalization."""
    cp = require_cupy()
    opts = DeviceOptions(dtype="float32", layout="NCHW", decode_device="cpu")
    with reader.Loader(ds, batch, num_workers=workers, transform=[CenterCrop(224)], copy=True) as cpu:
        want = [b["image"] for _, b in zip(range(compare), cpu, strict=False)]  # uint8
    step = gpu_step(cp, step_ms / 1e3)
    probe = H2DProbe()
    gpu = reader.Loader(ds, batch, num_workers=workers, transform=[CenterCrop(224)],
                        device="cuda", device_options=opts, monitor=probe)
    worst, n = 0.0, 0
    t0 = time.perf_counter()
    with gpu:
        for k, b in enumerate(gpu):
            if k < len(want):
                diff = cp.asnumpy(b["image"]) - normalize(want[k], opts)
                worst = max(worst, float(np.abs(diff).max()))
            step()
            n += 1
    wall = time.perf_counter() - t0
    return {"batches": n, "compared": len(want), "max_abs_diff": worst, "ok": worst < 1e-3,
            "step_ms": step_ms, "queue_wait_fraction": probe.wait / wall}


def pipeline_rate(ds, batch, workers, device, epochs=2) -> float:
    """Best epoch's images/s of the classification pipeline to ``device``; on the GPU the
    clock stops once the last batch's copies and kernels are done."""
    sync = (lambda: None) if device == "cpu" else require_cupy().cuda.get_current_stream().synchronize
    opts = DeviceOptions(decode_device="cpu") if device == "cuda" else None
    with reader.Loader(ds, batch, num_workers=workers, shuffle="block", seed=0,
                       transform=h.rrc_flip(), device=device, device_options=opts) as lo:

        def epoch() -> int:
            n = sum(len(b["label"]) for b in lo)
            sync()
            return n

        return max(h.per_second(epoch) for _ in range(epochs))


def pipeline(ds, batch, workers, rounds) -> dict:
    cpu, cuda = [], []

    def one(device, _r):
        (cpu if device == "cpu" else cuda).append(pipeline_rate(ds, batch, workers, device))

    h.rounds(("cpu", "cuda"), rounds, one)  # alternated: neither side always runs first
    ratio = h.paired_ratio(cuda, cpu)
    return {"workers": workers, "cpu_img_s": cpu, "cuda_img_s": cuda, "ratio": ratio,
            "target": PIPELINE_TARGET, "met": ratio >= PIPELINE_TARGET}


def dali(src: Path, batch: int, workers: int, epochs: int = 2) -> dict:
    """DALI's GPU pipeline over the same JPEGs: nvJPEG decode (``device="mixed"``), random
    resized crop 224, flip, and float16 CHW normalization, as our GPU path hands out."""
    try:
        import nvidia.dali as nvdali
        from nvidia.dali import fn, pipeline_def, types
    except ImportError as exc:
        return {"skipped": f"nvidia.dali does not import ({exc}); put a nvidia-dali-cuda120 "
                           "or -cuda130 wheel in --wheels DIR to measure it"}
    files = sorted(p for p in src.rglob("*.jpg"))
    classes = sorted({p.parent.name for p in files})
    labels = [classes.index(p.parent.name) for p in files]
    opts = DeviceOptions()

    @pipeline_def(batch_size=batch, num_threads=workers, device_id=0)
    def classification():
        jpegs, label = fn.readers.file(files=[str(p) for p in files], labels=labels,
                                       random_shuffle=True, seed=0, name="Reader")
        images = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB)
        images = fn.random_resized_crop(images, size=(224, 224))
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT16, output_layout="CHW",
                                          mean=list(opts.mean), std=list(opts.std),
                                          mirror=fn.random.coin_flip())
        return images, label.gpu()

    pipe = classification()
    pipe.build()
    steps = max(1, len(files) // batch)

    def epoch() -> int:
        for _ in range(steps):
            pipe.run()
        return steps * batch

    best = max(h.per_second(epoch) for _ in range(epochs))
    return {"version": nvdali.__version__, "threads": workers, "img_s": best,
            "pipeline": "readers.file, decoders.image(mixed), random_resized_crop 224, "
                        "crop_mirror_normalize(float16, CHW, coin-flip mirror)"}


# -- the report -----------------------------------------------------------------------------

def step(report: dict, name: str, fn, *args):
    """Run one step into ``report[name]``; an error is recorded (and printed), not raised."""
    t0 = time.perf_counter()
    try:
        report[name] = fn(*args)
    except Exception as exc:  # recorded in the JSON and the table; the exit status is 1
        traceback.print_exc()
        report[name] = {"error": f"{type(exc).__name__}: {exc}"}
    report[name]["seconds"] = round(time.perf_counter() - t0, 1)
    return report[name]


def table(r: dict) -> str:
    """The report for people: one row per figure, then reasons and names (kept out of
    the rows so the columns stay narrow)."""
    rows = []
    notes: list[str] = []

    def verdict(met):
        return "met" if met else "MISSED"

    def unmeasured(key, title):
        d = r.get(key, {})
        if "error" in d or "skipped" in d:
            rows.append((title, "ERROR" if "error" in d else "skipped", "", ""))
            notes.append(f"{title}: {d.get('error') or d['skipped']}")
        return not d or "error" in d or "skipped" in d

    if not unmeasured("tests", "tests (real cupy, -m gpu)"):
        t = r["tests"]
        rows.append(("tests (real cupy, -m gpu)", f"{t['passed']} passed, {len(t['failed'])} failed, "
                     f"{sum(t['skips'].values())} skipped", "", "all pass"))
        notes += [f"FAILED {f}" for f in t["failed"]]
        notes += [f"skipped ({n}): {why}" for why, n in t["skips"].items()]
    unmeasured("data", "the JPEGs and shards")
    if not unmeasured("h2d", "host-to-device"):
        hd = r["h2d"]
        rows += [(f"(a) raw pinned H2D, {hd['batch_bytes'] / 2**20:.1f} MiB", f"{hd['raw_pinned_gb_s']:.2f} GB/s", "1.00", ""),
                 (f"(b) slot ring, {hd['ring_mode']}", f"{hd['ring_gb_s']:.2f} GB/s", f"{hd['ring_ratio']:.2f}",
                  f">= {H2D_TARGET} {verdict(hd['met'])}"),
                 (f"(c) slot ring, {hd['staging_mode']}", f"{hd['staging_gb_s']:.2f} GB/s", f"{hd['staging_ratio']:.2f}", "")]
    if not unmeasured("epoch", "an epoch on the GPU"):
        e = r["epoch"]
        rows += [(f"{e['compared']} of {e['batches']} GPU batches = CPU path",
                  f"max diff {e['max_abs_diff']:.1e}", "", "OK" if e["ok"] else "MISMATCH"),
                 (f"consumer queue wait, {e['step_ms']:.0f} ms step", f"{e['queue_wait_fraction']:.1%}", "", "~0")]
    ours = None
    if not unmeasured("pipeline", "pipeline to the GPU ÷ to the CPU"):
        p = r["pipeline"]
        ours = h.median(p["cuda_img_s"])
        rows += [(f"pipeline to the CPU, {p['workers']} workers", f"{h.median(p['cpu_img_s']):.0f} img/s", "", ""),
                 ("pipeline to the GPU (float16 NCHW)", f"{ours:.0f} img/s",
                  f"{p['ratio']:.2f}", f">= {PIPELINE_TARGET} {verdict(p['met'])}")]
    if not unmeasured("dali", "DALI GPU pipeline"):
        d = r["dali"]
        rows.append((f"DALI {d['version']} GPU pipeline, {d['threads']} threads", f"{d['img_s']:.0f} img/s",
                     f"ours {ours / d['img_s']:.2f}x" if ours else "", ""))
    if not unmeasured("gpu_decode", "GPU decode (nvImageCodec)"):
        g = r["gpu_decode"]
        med = {k: h.median(v) for k, v in g["img_s"].items()}
        rows += [("nvImageCodec's own batch decode", f"{med['own']:.0f} img/s", "1.00", ""),
                 ("our GPU-decode pipeline", f"{med['gpu']:.0f} img/s", f"{g['gpu_over_own']:.2f}",
                  f">= 0.85 {verdict(g['met']['gpu_over_own'])}"),
                 ("CPU pipeline (decode_device='cpu')", f"{med['cpu']:.0f} img/s", "", ""),
                 ("hybrid ÷ (GPU + CPU alone)", f"{med['hybrid']:.0f} img/s",
                  f"{g['hybrid_over_sum']:.2f}", f">= 0.9 {verdict(g['met']['hybrid_over_sum'])}"),
                 ("hybrid ÷ CPU pipeline", "", f"{g['hybrid_over_cpu']:.2f}",
                  f">= 2 {verdict(g['met']['hybrid_over_cpu'])}"),
                 ("pixels |GPU - CPU| mean per channel", str(g["pixels"]["mean_abs_diff"]),
                  f"max {g['pixels']['max_abs_diff']}", ""),
                 (f"GPU pipeline + {g['overlap']['step_ms']:.0f} ms step (wait "
                  f"{g['overlap']['queue_wait_fraction']:.0%})",
                  f"{g['overlap']['img_s']:.0f} img/s", f"{g['overlap']['of_step_bound']:.2f}",
                  f">= 0.9 {verdict(g['overlap']['met'])}")]
    if not unmeasured("cpu_scaling", "CPU scaling"):
        c = r["cpu_scaling"]
        rows.append((f"{c['bare_processes']} bare processes (decode+crop+flip)",
                     f"{h.median(c['bare_img_s']):.0f} img/s", "1.00", ""))
        rows += [(f"Loader, {n} workers", f"{h.median(v):.0f} img/s",
                  f"{c['per_worker_img_s'][n]:.0f}/worker", "") for n, v in c["loader_img_s"].items()]
        rows.append(("Loader ÷ bare processes", "", f"{c['loader_over_bare']:.2f}",
                     f">= 0.9 {verdict(c['met'])}"))
    table = h.Table(h.Col("measure"), h.Col("value"), h.Col("÷ limit"), h.Col("target"))
    return "\n".join([table.render(rows), *notes])


def main(argv=None) -> int:
    ap = h.parser(__doc__, full=True)
    h.add_data(ap, Path("/tmp/shardpack-gpu-bench"),
               help="where the JPEGs and shards are made once and kept")
    ap.add_argument("--out", type=Path, help="the JSON report (default: DATA/gpu_check.json)")
    ap.add_argument("--images", type=int, default=32768,
                    help="JPEGs of 300-500 px: 8 batches per worker per epoch at 16 workers")
    ap.add_argument("--batch", type=int, default=256)
    h.add_workers(ap, os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternated rounds of the pipeline, gpu_decode and cpu_scaling figures")
    ap.add_argument("--step-ms", type=float, default=60.0, help="the consumer's simulated step")
    ap.add_argument("--seconds", type=float, default=gd.SECONDS,
                    help="each gpu_decode and cpu_scaling rate's timed interval (a rehearsal "
                         "on the stand-ins: 0.2)")
    ap.add_argument("--only", help="comma-separated steps to run after the probe (tests, h2d, "
                    "epoch, pipeline, dali, gpu_decode, cpu_scaling; default: all): e.g. "
                    "--only tests,gpu_decode,cpu_scaling fits a short device lease")
    args = ap.parse_args(argv)
    steps = STEPS if args.only is None else tuple(x.strip() for x in args.only.split(","))
    if set(steps) - set(STEPS):
        ap.error(f"--only: unknown steps {sorted(set(steps) - set(STEPS))}; known: {', '.join(STEPS)}")
    if min(args.images, args.batch, args.workers, args.rounds) < 1 or args.step_ms < 0 \
            or not args.seconds > 0:
        ap.error("--images, --batch, --workers and --rounds must be at least 1, --step-ms not "
                 "negative, --seconds positive")
    out = args.out or args.data / "gpu_check.json"
    args.data.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cores": os.cpu_count(),
                    "workers": args.workers, "batch": args.batch, "images": args.images}
    reason = gpu_unusable()
    if reason is not None:
        report["skipped"] = reason
        tests = step(report, "stand_in_tests", run_tests, "not gpu", args.data)
        report["seconds"] = round(time.perf_counter() - t0, 1)
        h.write_json(out, report)
        if "error" in tests:
            summary = tests["error"]
        else:
            summary = f"{tests['passed']} passed, {len(tests['failed'])} failed"
        print(f"gpu check: no usable GPU ({reason}): skipped the GPU checks; the GPU path's tests "
              f"on the numpy stand-in: {summary}; report in {out}")
        return 0 if "error" not in tests and tests["passed"] and not tests["failed"] else 1

    cp = require_cupy()
    props = cp.cuda.runtime.getDeviceProperties(0)
    report["device"] = {"name": props["name"].decode(), "cupy": getattr(cp, "__version__", "?"),
                        "driver": cp.cuda.runtime.driverGetVersion(),
                        "runtime": cp.cuda.runtime.runtimeGetVersion()}
    print(f"device: {report['device']['name']} (cupy {report['device']['cupy']}, driver "
          f"{report['device']['driver']}), {args.workers} workers, batch {args.batch}", file=sys.stderr)
    if "tests" in steps:
        step(report, "tests", run_tests, "gpu", args.data)
    data = step(report, "data", make_data, args.data, args.images, args.workers)
    if "error" not in data:
        src, ds = Path(data["jpegs"]), Path(data["shards"])
        if "h2d" in steps:
            step(report, "h2d", h2d, ds, args.batch, args.workers)
        if "epoch" in steps:
            step(report, "epoch", check_epoch, ds, args.batch, args.workers, args.step_ms)
        if "pipeline" in steps:
            step(report, "pipeline", pipeline, ds, args.batch, args.workers, args.rounds)
        if "dali" in steps:
            step(report, "dali", dali, src, args.batch, args.workers)
        if "gpu_decode" in steps:
            try:
                require_nvimgcodec()
            except ImportError as exc:
                report["gpu_decode"] = {"skipped": f"{exc}; put the nvidia_nvimgcodec_cu12 and "
                                                   "nvidia_nvjpeg_cu12 wheels in --wheels DIR"}
            else:
                step(report, "gpu_decode", gd.gpu_decode, ds, src, args.batch, args.workers,
                     args.rounds, args.seconds)
        if "cpu_scaling" in steps:
            step(report, "cpu_scaling", gd.cpu_scaling, ds, args.batch, args.workers,
                 args.rounds, args.seconds)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    h.write_json(out, report)
    print(table(report))
    print(f"{report['seconds']:.0f} s; every figure in {out}")
    t = report.get("tests", {"exit": 0})
    broken = [k for k in ("tests", "data", "h2d", "epoch", "pipeline", "dali", "gpu_decode",
                          "cpu_scaling")
              if "error" in report.get(k, {})]
    epoch_ok = report.get("epoch", {}).get("ok", "epoch" not in steps)
    return 1 if broken or t.get("failed") or t.get("exit") != 0 or not epoch_ok else 0


if __name__ == "__main__":
    sys.exit(main())
