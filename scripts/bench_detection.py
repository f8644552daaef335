"""Detection pipeline benchmark: ratios against the machine's limit and a peer, in one run.

    python -m scripts.bench_detection [--data DIR] [--images 2000] [--repeat 3] [--quick]

A COCO-like set (``scripts.synth.coco_detection(shapes="coco")``: JPEGs of 480-640 px, 1-20
boxes each) is generated once under ``--data`` and packed with
``pack-dataset --from coco``; later runs reuse both. Warm page cache throughout,
workers = cores. The pipeline is issue 16's: decode + ``ResizeShortestEdge`` (short
side 480-608, long side at most 1,000) + flip with boxes + ``PadToMultiple(32)``, in
aspect-ratio-grouped batches of 16.

(a) ``reader.Loader`` images/s over one epoch from a fresh Loader (its workers'
    start included) ÷ (cores × the single-core rate of the same batches built in this
    process by the workers' own code, ``reader.runtime.worker.BatchBuilder``); beside it, the
    Loader ÷ ``cores`` bare processes building those batches between them (what the
    cores give under the load of that moment);
(b) the same Loader ÷ a torchvision-style baseline: a map-style torch ``Dataset`` over
    the image files and the COCO JSON, PIL decode and bilinear resize, the same
    transforms in numpy/PIL, a list-collate, torch's ``DataLoader``;
(c) padding waste (padded pixels ÷ all pixels of the delivered batches), grouped by
    aspect ratio ÷ plain shuffled batches of 16; and, from planned sizes alone
    (``reader.batching.batching.padding_waste``), the same with one short side, and on a model
    of COCO's sizes, to show where the waste comes from;
(d) the classification pipeline's ratio to its ceiling, by ``scripts.bench_reader``'s
    own functions, to compare with BENCHMARKS.md;
(e) the ragged/padded assembly's share of worker time, from the Loader's monitor
    (laying out the padded images, zeroing their padding, writing the ragged arrays
    and the scalars), with the padding's zeroing replayed alone on one core;
(f) the same Loader ÷ DALI's CPU pipeline over the image files and the COCO JSON
    (``scripts/bench_peers.py detection``, in the peers' virtualenv: ``--peers-python``
    or ``$SHARDPACK_PEERS_PYTHON``; skipped with a message without it or without DALI
    there): ``fn.readers.coco`` (ltrb, no polygons, empty images kept), ``decoders.image``,
    ``fn.resize(resize_shorter=`` one of 480-608 drawn per image ``, max_size=1000)``,
    ``fn.flip`` + ``fn.bb_flip`` on one coin, boxes scaled to pixels, ``cores`` threads,
    batches of 16 in DALI's shuffled order (not aspect-grouped); ragged, and padded
    (``fn.pad`` to the batch's largest image rounded up to 32);
(g) raw structured records, no decode: ours ``Loader(decode=False)`` (JPEG bytes as
    views, boxes, labels; one process, as ``decode=False`` always is), and the same
    with the ``segmentation`` field read, ÷ DALI's ``readers.coco`` alone (JPEG bytes,
    boxes, labels; ``cores`` threads). Below the table: DALI's peak memory and the
    images per CPU-second (process tree, user + system) of the Loader and of DALI, a
    per-core figure that other processes on the machine do not move much.

Every case runs ``--repeat`` times, all cases of a round back to back in a rotated
order; a ratio is the median over rounds of (ours ÷ reference) measured in the same
round, with the range of the per-round ratios beside it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from scripts import harness as h

try:
    from torch.utils.data import Dataset as _TorchDataset
except ImportError:  # the baseline row says it was skipped
    _TorchDataset = object

BATCH = 16
SHORT = (480, 512, 544, 576, 608)
MAX_SIZE = 1000
MULTIPLE = 32


# -- data ------------------------------------------------------------------------------

def cached_coco(root: Path, n: int, seed: int = 0) -> tuple[Path, Path, Path]:
    """``(images, annotations.json, shards)`` of an ``n``-image set, generated and packed
    unless a complete one is there (markers written last, as ``cached_image_folder`` does)."""
    from scripts.synth import coco_detection

    src = root / f"coco-{n}-seed{seed}-cocoshapes"
    images, ann = src / "images", src / "annotations.json"
    if not (src / ".complete").exists():
        t = time.perf_counter()
        print(f"generating {n} detection JPEGs in {src} ...", file=sys.stderr)
        coco_detection(src, n, seed=seed, workers=os.cpu_count() or 1, shapes="coco")
        (src / ".complete").write_text(f"{n} {seed}")
        print(f"  done in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    shards = root / f"coco-{n}-seed{seed}-cocoshapes.shards"
    if not (shards / "manifest.json").exists():
        cmd = [sys.executable, "-m", "packer.cli", str(images), str(shards), "--from", "coco",
               "--annotations", str(ann), "--quiet"]
        if shards.exists():
            cmd.append("--overwrite")  # an interrupted pack left its files there
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return images, ann, shards


def transforms(per_batch: bool = False) -> list:
    from reader.transforms import PadToMultiple, RandomHorizontalFlip, ResizeShortestEdge

    return [ResizeShortestEdge(SHORT, max_size=MAX_SIZE, per_batch=per_batch),
            RandomHorizontalFlip(), PadToMultiple(MULTIPLE)]


# -- ours ------------------------------------------------------------------------------

def loader_epoch(shards: Path, workers: int, epoch: int, grouped: bool = True,
                 per_batch: bool = False) -> dict:
    """One epoch through ``reader.Loader``: images/s, the padding it delivered, and the
    monitor's stage shares."""
    from reader import Loader, Monitor
    from reader.batching import AspectRatioBatches

    monitor = Monitor(3600.0, output=False)  # figures only: no report within the run
    sampler = AspectRatioBatches() if grouped else None
    cpu = _cpu_seconds()
    with Loader(shards, BATCH, batch_sampler=sampler, shuffle=True, seed=0,
                num_workers=workers, transform=transforms(per_batch), monitor=monitor) as lo:
        lo.set_epoch(epoch)
        n = padded = real = 0
        t = time.perf_counter()
        for b in lo:
            sizes = b["image_size"]
            n += len(sizes)
            padded += len(sizes) * b["image"].shape[1] * b["image"].shape[2]
            real += int(sizes.prod(axis=1).sum())
        wall = time.perf_counter() - t
        mean = lo.stats()["mean"]
    return {"rate": n / wall, "images": n, "waste": 1 - real / padded,
            "per_cpu": n / (_cpu_seconds() - cpu),  # the workers are waited for on close
            "assemble_share": mean["assemble_share_pct"] / 100,
            "shares": {k: mean[f"{k}_share_pct"] / 100
                       for k in ("io", "decode", "transform", "assemble")}}


def _cpu_seconds() -> float:
    """CPU time of this process and its children waited for, user + system."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _build(job: tuple[Path, int, int, int]) -> dict:
    """Build batches ``part``, ``part + parts``, ... of ``epoch`` in this process, with the
    code the workers run, into arrays laid out like a slot (as
    ``reader.torch_adapter.TorchBatchDataset`` does). Module-level so it pickles."""
    from reader import Loader
    from reader.batching import AspectRatioBatches
    from reader.data.dataset import main_fields
    from reader.runtime.worker import BatchBuilder, batch_rng
    from reader.transforms.collate import assemble

    shards, epoch, part, parts = job
    with Loader(shards, BATCH, batch_sampler=AspectRatioBatches(), shuffle=True, seed=0,
                num_workers=0, transform=transforms()) as lo:
        builder = BatchBuilder(lo.dataset, lo.spec)
        arrays = {f.name: np.empty(f.shape, f.dtype) for f in lo.layout.fields}
        arrays["image"][:] = 0  # fault the pages in, as a worker's slots already are
        ks = range(part, lo.sampler.num_batches_in(epoch), parts)
        builder.build(lo.sampler.batch(epoch, ks[0]), arrays, batch_rng(lo.spec, epoch, 0))
        n, sizes = 0, []
        start = time.perf_counter()
        for k in ks:
            indices = lo.sampler.batch(epoch, k)
            _, shapes, _ = builder.build(indices, arrays, batch_rng(lo.spec, epoch, k))
            batch = assemble(arrays, lo.plan.fixed, lo.plan.var_fields, shapes, len(indices))
            if lo.main_fields:  # the Loader reads these in its own process, per batch
                batch.update(main_fields(lo.dataset, lo.main_fields, indices))
            n += len(indices)
            sizes.append([tuple(s) for s in batch["image_size"].tolist()])
        end = time.perf_counter()
        # Placing the images in the padded array zeroes the padding: part of the
        # monitor's "assemble", replayed alone here to show what it costs.
        image = next(v for v in lo.plan.var_fields if v.name == "image")
        t = time.perf_counter()
        for s in sizes:
            image.regions(arrays, s)
        zero_fill = time.perf_counter() - t
    return {"images": n, "start": start, "end": end, "zero_fill": zero_fill}


def in_process(shards: Path, epoch: int) -> dict:
    """Single-core images/s of the Loader's batches of ``epoch``, and the share of that
    time that zeroing the padding takes."""
    r = _build((shards, epoch, 0, 1))
    wall = r["end"] - r["start"]
    return {"rate": r["images"] / wall, "zero_fill_share": r["zero_fill"] / wall}


def bare_parallel(shards: Path, epoch: int, cores: int) -> float:
    """Images/s of ``cores`` bare processes building the epoch's batches between them, no
    Loader: what the cores give under the machine's load at that moment."""
    import multiprocessing as mp

    with mp.get_context("fork").Pool(cores) as pool:
        done = pool.map(_build, [(shards, epoch, i, cores) for i in range(cores)])
    # perf_counter is CLOCK_MONOTONIC: comparable across processes.
    return sum(d["images"] for d in done) / (max(d["end"] for d in done)
                                             - min(d["start"] for d in done))


def planned_waste(hw: np.ndarray, short: tuple[int, ...], seed: int = 0) -> tuple[float, float]:
    """Padding waste of grouped and of plain shuffled batches of 16 over records of sizes
    ``hw`` (height, width), each resized by one draw of the pipeline's plan with
    ``short`` as its short sides (``reader.batching.batching.padding_waste``; no image decoded)."""
    from reader.batching.batching import AspectRatioBatches, padding_waste
    from reader.batching.sampler import Sampler
    from reader.options import SamplerOptions
    from reader.transforms import (
        ImagePipeline,
        PadToMultiple,
        RandomHorizontalFlip,
        ResizeShortestEdge,
    )

    class Sizes:  # all that binding a batch order reads of a dataset
        starts = np.zeros(1, np.int64)

        def __len__(self) -> int:
            return len(hw)

    pipe = ImagePipeline([ResizeShortestEdge(short, max_size=MAX_SIZE), RandomHorizontalFlip(),
                          PadToMultiple(MULTIPLE)])
    rng = np.random.default_rng(seed)
    out = np.array([pipe.plan(int(h), int(w), rng).size for h, w in hw])
    opts = SamplerOptions(shuffle=True, seed=seed, rank=0, world_size=1)
    grouped = AspectRatioBatches(sizes=hw).bind(Sizes(), BATCH, opts)
    plain = Sampler(len(hw), Sizes.starts, BATCH, opts)
    return (padding_waste([grouped.batch(0, k) for k in range(grouped.num_batches_in(0))], out),
            padding_waste([plain.batch(0, k) for k in range(len(plain))], out))


def coco_like_sizes(n: int, seed: int = 0) -> np.ndarray:
    """A model of COCO's image sizes (not measured here): long side 640, short side
    360-480, 70% landscape; for the waste row that shows what grouping does there."""
    rng = np.random.default_rng(seed)
    short = rng.integers(360, 481, n)
    long_ = np.full(n, 640)
    landscape = rng.random(n) < 0.7
    return np.where(landscape[:, None], np.stack([short, long_], 1), np.stack([long_, short], 1))


# -- the torchvision-style baseline ---------------------------------------------------

class CocoFiles(_TorchDataset):
    """What a torchvision detection user writes: image files + COCO JSON, PIL, numpy.

    The JSON is parsed once; an item is ``(uint8 HWC tensor padded to a multiple of
    32, {"boxes", "labels", "image_id"})`` with the same transforms as ours: a short
    side drawn from ``SHORT`` (detectron2's sizes and rounding), bilinear resize,
    boxes scaled, a coin-flip mirror, boxes under 1 px dropped. Uint8 HWC, as our
    Loader delivers, so neither side pays for a float conversion the other skips.
    """

    def __init__(self, images: Path, annotations: Path) -> None:
        coco = json.loads(annotations.read_text())
        contiguous = {c["id"]: i for i, c in enumerate(sorted(coco["categories"],
                                                                key=lambda c: c["id"]))}
        per_image: dict[int, list] = {im["id"]: [] for im in coco["images"]}
        for a in coco["annotations"]:
            per_image[a["image_id"]].append(a)
        self.items = []
        for im in coco["images"]:
            anns = per_image[im["id"]]
            xywh = np.array([a["bbox"] for a in anns], np.float32).reshape(-1, 4)
            boxes = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
            labels = np.array([contiguous[a["category_id"]] for a in anns], np.int64)
            self.items.append((str(images / im["file_name"]), im["id"], boxes, labels))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        import torch
        from PIL import Image

        path, image_id, boxes, labels = self.items[i]
        img = Image.open(path).convert("RGB")
        w, h = img.size
        scale = random.choice(SHORT) / min(h, w)
        nh, nw = h * scale, w * scale
        if max(nh, nw) > MAX_SIZE:
            nh, nw = nh * MAX_SIZE / max(nh, nw), nw * MAX_SIZE / max(nh, nw)
        nh, nw = int(nh + 0.5), int(nw + 0.5)
        img = img.resize((nw, nh), Image.BILINEAR)
        boxes = boxes * np.array([nw / w, nh / h, nw / w, nh / h], np.float32)
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
            boxes = np.stack([nw - boxes[:, 2], boxes[:, 1], nw - boxes[:, 0], boxes[:, 3]], 1)
        keep = (boxes[:, 2] - boxes[:, 0] >= 1) & (boxes[:, 3] - boxes[:, 1] >= 1)
        out = np.zeros((-(-nh // MULTIPLE) * MULTIPLE, -(-nw // MULTIPLE) * MULTIPLE, 3), np.uint8)
        out[:nh, :nw] = np.asarray(img)
        return torch.from_numpy(out), {"boxes": torch.from_numpy(boxes[keep]),
                                       "labels": torch.from_numpy(labels[keep]),
                                       "image_id": image_id}


def list_collate(items: list) -> tuple[list, list]:
    """torchvision's detection references' collate: lists, no padding."""
    return tuple(zip(*items, strict=True))


def torch_epoch(images: Path, annotations: Path, workers: int) -> float:
    import torch

    dl = torch.utils.data.DataLoader(CocoFiles(images, annotations), batch_size=BATCH,
                                     shuffle=True, num_workers=workers, collate_fn=list_collate)
    return h.per_second(lambda: sum(len(imgs) for imgs, _ in dl))


# -- the classification pipeline, for (d) -------------------------------------------

def classification_ratio(root: Path, n: int, cores: int) -> tuple[float, float]:
    """``scripts.bench_reader``'s (b): the Loader's images/s and cores x its 1-core rate."""
    from scripts.bench_reader import build_inputs, full_pipeline, single_core_ours

    inputs = build_inputs(root, n)
    h.warm(inputs["shards"])
    one = single_core_ours(inputs["shards"], max(256, n // 4))
    return full_pipeline(inputs["shards"], cores, epochs=2), cores * one


# -- (f), (g): DALI's CPU pipeline, and raw records -------------------------------------

RAW_FIELDS = ("image", "boxes", "labels")


def raw_epoch(shards: Path, fields: tuple[str, ...], epoch: int) -> float:
    """Records/s of one shuffled epoch of ``Loader(decode=False)`` from a fresh Loader
    (opening the shards included), batches of 16, reading ``fields``: every value of
    every field is taken out of its batch (a JSON field is parsed when taken: raw batches
    parse it item by item, lazily)."""
    from reader import Loader

    def run() -> int:
        n = 0
        with Loader(shards, BATCH, decode=False, shuffle=True, seed=0, fields=fields) as lo:
            lo.set_epoch(epoch)
            for b in lo:
                n += len(b["image"])
                for f in fields:
                    for _ in b[f]:
                        pass
        return n

    return h.per_second(run)


def dali_epoch(run, fmt: str, images: Path, annotations: Path, workers: int,
               settings: list[str] = ()) -> dict:
    """One epoch of DALI's pipeline ``fmt`` in the peers' virtualenv (``scripts.bench.Runner``:
    a subprocess, its memory sampled): ``{"rate", "mem_kb", "dali"}`` or ``{"skipped"}``."""
    res = run(fmt, "detection", fmt, str(images), "--annotations", str(annotations),
              "--workers", str(workers), *(x for kv in settings for x in ("--dali", kv)))
    if "skipped" in res:
        return res
    return {"rate": res["records"] / res["seconds"], "mem_kb": res["mem_kb"],
            "per_cpu": res["records"] / res["cpu_seconds"], "dali": res.get("dali", "?")}


# -- report ----------------------------------------------------------------------------

def _range(xs: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(min(xs))}-{fmt.format(max(xs))}" if len(xs) > 1 else ""


DALI = {"dali": "dali-det", "dali_pad": "dali-det-pad", "dali_raw": "dali-det-raw"}


def dali_rows(res: dict, ours: list[float], cores: int, why: str | None) -> list[tuple]:
    """Rows (f) and (g): ours ÷ DALI in the same round, or DALI's rows skipped with why."""
    raw, raw_seg = res["raw"], res["raw_seg"]
    why = why or next((x["skipped"] for k in DALI for x in res[k] if "skipped" in x), None)
    if why is not None:
        return [("(f) DALI readers.coco CPU pipeline", "skipped", why, [], "> 1.0"),
                ("(g) raw records: ours decode=False, 1 process", f"{h.median(raw):.0f} rec/s",
                 "", [], "(DALI skipped)"),
                ("    ours with the segmentation field read", f"{h.median(raw_seg):.0f} rec/s",
                 "", [], "(DALI skipped)")]

    def rate(k):
        return [x["rate"] for x in res[k]]

    def pair(a, b):
        return [x / y for x, y in zip(a, b, strict=True)]

    d, dp, dr = rate("dali"), rate("dali_pad"), rate("dali_raw")
    return [
        (f"(f) Loader / DALI readers.coco+decode+resize+flip, {cores} thr, ragged",
         f"{h.median(ours):.0f} img/s", f"{h.median(d):.0f} img/s", pair(ours, d), "> 1.0"),
        ("    Loader / DALI the same + fn.pad to multiples of 32",
         f"{h.median(ours):.0f} img/s", f"{h.median(dp):.0f} img/s", pair(ours, dp), "> 1.0"),
        (f"(g) raw: ours decode=False, 1 proc / DALI readers.coco, {cores} thr",
         f"{h.median(raw):.0f} rec/s", f"{h.median(dr):.0f} rec/s", pair(raw, dr), "> 1.0"),
        ("    ours with the segmentation field read / DALI readers.coco",
         f"{h.median(raw_seg):.0f} rec/s", f"{h.median(dr):.0f} rec/s", pair(raw_seg, dr),
         "> 1.0"),
    ]


def main(argv: list[str] | None = None) -> int:
    p = h.parser(__doc__, full=True)
    h.add_data(p, Path("/tmp/shardpack-bench-detection"))
    p.add_argument("--images", type=int, default=None, help="detection images (default 2000)")
    h.add_repeat(p, help="rounds")
    h.add_workers(p, len(os.sched_getaffinity(0)))
    p.add_argument("--classification-data", type=Path,
                   default=Path("/tmp/shardpack-bench-reader"),
                   help="scripts.bench_reader's data folder (shared with it)")
    p.add_argument("--classification-images", type=int, default=None,
                   help="default 4096, as scripts.bench_reader")
    p.add_argument("--quick", action="store_true",
                   help="400 detection and 1536 classification images, 1 round")
    h.add_peers_python(p, help="python of the virtualenv with DALI (rows (f) and (g))")
    p.add_argument("--dali", action="append", metavar="KEY=VALUE", default=[],
                   help="a DALI setting (scripts/bench_peers.py, DALI_SETTINGS), repeatable")
    args = p.parse_args(argv)
    n = args.images or (400 if args.quick else 2000)
    n_cls = args.classification_images or (1536 if args.quick else 4096)
    repeat = 1 if args.quick else args.repeat
    cores = args.workers
    t0 = time.perf_counter()
    load = h.Load()

    images, ann, shards = cached_coco(args.data, n)
    from scripts.bench_reader import build_inputs

    build_inputs(args.classification_data, n_cls)
    h.warm(images, ann, shards)
    coco = json.loads(ann.read_text())
    nboxes = len(coco["annotations"]) / len(coco["images"])
    kb = sum(f.stat().st_size for f in images.iterdir()) / n / 1e3
    print(f"data ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    try:
        import torch  # noqa: F401

        torch_missing = None
    except ImportError as exc:
        torch_missing = str(exc)

    res: dict[str, list] = {k: [] for k in ("grouped", "plain", "inproc", "bare", "torch", "cls",
                                            "grouped_pb", "plain_pb", "raw", "raw_seg",
                                            *DALI)}
    cases = [
        ("grouped", lambda r: loader_epoch(shards, cores, r)),
        ("plain", lambda r: loader_epoch(shards, cores, r, grouped=False)),
        ("grouped_pb", lambda r: loader_epoch(shards, cores, r, per_batch=True)),
        ("plain_pb", lambda r: loader_epoch(shards, cores, r, grouped=False, per_batch=True)),
        ("inproc", lambda r: in_process(shards, r)),
        ("bare", lambda r: bare_parallel(shards, r, cores)),
        ("cls", lambda r: classification_ratio(args.classification_data, n_cls, cores)),
    ]
    if torch_missing is None:
        cases.append(("torch", lambda r: torch_epoch(images, ann, cores)))
    cases += [("raw", lambda r: raw_epoch(shards, RAW_FIELDS, r)),
              ("raw_seg", lambda r: raw_epoch(shards, (*RAW_FIELDS, "segmentation"), r))]
    from scripts.bench import Runner

    run = Runner(args.peers_python, cold=False)
    dali_why = None if args.peers_python else (
        "needs the peers virtualenv with DALI (--peers-python or $SHARDPACK_PEERS_PYTHON)")
    if dali_why is None:
        first = dali_epoch(run, "dali-det-raw", images, ann, cores, args.dali)  # untimed
        dali_why = first.get("skipped")
    if dali_why is None:
        cases += [(k, lambda r, k=k: dali_epoch(run, DALI[k], images, ann, cores, args.dali))
                  for k in DALI]
    h.rounds(cases, repeat, lambda case, r: res[case[0]].append(case[1](r)),
             lambda r: print(f"round {r + 1}/{repeat} done ({time.perf_counter() - t0:.0f} s)",
                             file=sys.stderr))

    grouped, plain, inproc = res["grouped"], res["plain"], res["inproc"]
    ours = [g["rate"] for g in grouped]
    ceiling = [cores * x["rate"] for x in inproc]
    bare = res["bare"]
    rows = [(f"(a) Loader / ({cores} x 1-core in-process rate)", f"{h.median(ours):.0f} img/s",
             f"{h.median(ceiling):.0f} img/s",
             [a / c for a, c in zip(ours, ceiling, strict=True)], ">= 0.85"),
            (f"    Loader / {cores} bare processes building the same batches",
             f"{h.median(ours):.0f} img/s", f"{h.median(bare):.0f} img/s",
             [a / b for a, b in zip(ours, bare, strict=True)], "(context: same load)")]
    if torch_missing is None:
        base = res["torch"]
        rows.append(("(b) Loader / torchvision-style Dataset+DataLoader",
                     f"{h.median(ours):.0f} img/s", f"{h.median(base):.0f} img/s",
                     [a / b for a, b in zip(ours, base, strict=True)], ">= 1.5"))
    else:
        rows.append(("(b) torchvision-style Dataset+DataLoader", "skipped", torch_missing, [],
                     ">= 1.5"))
    gw, pw = [g["waste"] for g in grouped], [x["waste"] for x in plain]
    rows.append(("(c) padding waste, aspect-grouped / plain shuffled",
                 f"{h.median(gw):.1%}", f"{h.median(pw):.1%}",
                 [a / b for a, b in zip(gw, pw, strict=True)], "<= 0.5"))
    gpb, ppb = res["grouped_pb"], res["plain_pb"]
    rows.append(("    one short side per batch (per_batch=True): grouped / plain",
                 f"{h.median([g['waste'] for g in gpb]):.1%}",
                 f"{h.median([x['waste'] for x in ppb]):.1%}",
                 [g["waste"] / x["waste"] for g, x in zip(gpb, ppb, strict=True)], "<= 0.5"))
    cls = res["cls"]
    hw = np.array([(im["height"], im["width"]) for im in coco["images"]], np.int64)
    for label, sizes, short in (("    same images, one short side (608)", hw, SHORT[-1:]),
                                ("    model: COCO-like sizes, same transforms",
                                 coco_like_sizes(n), SHORT)):
        g, q = planned_waste(sizes, short)
        rows.append((label, f"{g:.1%}", f"{q:.1%}", [g / q], "(context, planned sizes)"))
    rows.append(("(d) classification Loader / (cores x 1-core rate)",
                 f"{h.median([a for a, _ in cls]):.0f} img/s",
                 f"{h.median([c for _, c in cls]):.0f} img/s", [a / c for a, c in cls],
                 "no regression (BENCHMARKS.md, Classification pipeline: 0.76)"))
    rows.append(("(e) assemble / worker busy time (monitor)",
                 f"{h.median([g['assemble_share'] for g in grouped]):.1%}", "",
                 [g["assemble_share"] for g in grouped], "<= 0.05"))
    rows.append(("    one short side per batch: assemble / worker busy time",
                 f"{h.median([g['assemble_share'] for g in gpb]):.1%}", "",
                 [g["assemble_share"] for g in gpb], "<= 0.05"))
    rows.append(("    one short side per batch: Loader images/s, / per-image draws",
                 f"{h.median([g['rate'] for g in gpb]):.0f} img/s", f"{h.median(ours):.0f} img/s",
                 [g["rate"] / o for g, o in zip(gpb, ours, strict=True)], "(context)"))
    rows.append(("    of which padding zero-fill (1 core, replayed)",
                 f"{h.median([x['zero_fill_share'] for x in inproc]):.1%}", "",
                 [x["zero_fill_share"] for x in inproc], "(context)"))
    rows.append(("    plain shuffled Loader / aspect-grouped Loader",
                 f"{h.median([x['rate'] for x in plain]):.0f} img/s", f"{h.median(ours):.0f} img/s",
                 [x["rate"] / g["rate"] for x, g in zip(plain, grouped, strict=True)],
                 "(context)"))

    rows += dali_rows(res, ours, cores, dali_why)

    shares = {k: h.median([g["shares"][k] for g in grouped])
              for k in ("io", "decode", "transform", "assemble")}
    print(f"detection: {n} JPEGs of 480-640 px ({kb:.0f} KB mean), {nboxes:.1f} boxes/image; "
          f"ResizeShortestEdge({SHORT[0]}-{SHORT[-1]}, max {MAX_SIZE}) + flip + "
          f"PadToMultiple({MULTIPLE}); batch {BATCH}; {cores} workers = cores; "
          f"median of {repeat} round(s)")
    h.Table(h.Col("measure"), h.Col("ours", 12, ">"), h.Col("reference", 12, ">"),
            h.Col("ratio", 6, ">"), h.Col("rounds", 9, ">"), h.Col("target", 0)).print(
        [(name, a, b, f"{h.median(ratios):.3f}" if ratios else "-", _range(ratios), target)
         for name, a, b, ratios, target in rows])
    print("worker time (monitor, grouped Loader): "
          + "  ".join(f"{k} {v:.1%}" for k, v in shares.items()))
    if all(res[k] and all("skipped" not in x for x in res[k]) for k in DALI):
        d = res["dali"][0]
        print(f"DALI {d['dali']} (CPU), {cores} threads; peak RssAnon of its process: "
              + ", ".join(f"{DALI[k]} {max(x['mem_kb'] for x in res[k]) / 1024:,.0f} MiB"
                          for k in DALI))
        print("images per CPU-second (process tree, user + system): Loader "
              f"{h.median([g['per_cpu'] for g in grouped]):.0f}, DALI ragged "
              f"{h.median([x['per_cpu'] for x in res['dali']]):.0f}, DALI padded "
              f"{h.median([x['per_cpu'] for x in res['dali_pad']]):.0f}")
    print(load.line())
    print(f"total {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
