"""Runners for ``scripts/bench.py``: one writer or reader per call, timings as JSON.

Every runner is a subcommand, so ``bench.py`` can run it in the interpreter that has
the peer installed (MosaicML Streaming and LitData live in a separate virtualenv,
since installing them can replace torch and numpy) and sample the memory of the
process tree from outside. Times are measured inside the runner: interpreter
start-up and imports are not part of any figure.

    python scripts/bench_peers.py write FORMAT SRC OUT [--workers N]
    python scripts/bench_peers.py read FORMAT DIR [--mode seq|random] [--count K]
    python scripts/bench_peers.py pipeline FORMAT DIR [--workers N] [--dali KEY=VALUE ...]
    python scripts/bench_peers.py detection FORMAT DIR [--annotations JSON] [--workers N]

FORMAT: ``shards`` (ours), ``tfrecord``, ``wds`` (webdataset), ``mds``, ``litdata``,
and for ``pipeline`` also ``imagefolder``, ``dali-files`` (DALI's ``readers.file``
over the image folder) and ``dali-tfrecord`` (DALI's ``readers.tfrecord`` over our
``--to tfrecord`` output and its ``.idx`` files): DALI's own CPU pipeline, its
``--workers`` being its ``num_threads``. ``detection`` runs DALI's ``readers.coco``
over a COCO folder (``scripts/bench_detection.py``'s data): ``dali-det`` (decoded,
resized, flipped with boxes), ``dali-det-pad`` (the same padded to multiples of 32)
and ``dali-det-raw`` (no decode: image bytes, boxes, labels).

SRC is an image folder (class subfolders); every writer stores the same three
fields: the JPEG bytes, the label, the key. Each call prints one JSON object:
``seconds``, ``records``, ``bytes``, and ``cpu_seconds`` for ``pipeline`` and
``detection`` (or ``skipped`` with a reason when the peer cannot do it). Readers copy
every payload byte into a reused buffer, so every reader touches the same bytes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the peers' virtualenv does not install shardpack
    sys.path.insert(0, str(ROOT))

from scripts import harness as h  # noqa: E402  (after the path, in the peers' virtualenv)

BATCH = 256
SIZE = 224
SHARD_BYTES = 256 * 1000**2  # our default; peers with a size knob get the same


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# -- writers -----------------------------------------------------------------------------

def write_shards(src: Path, out: Path, workers: int) -> int:
    from packer import PackOptions, pack

    pack(src, out, PackOptions(durable=False, workers=workers))
    return len(h.folder_samples(src))


def write_tfrecord(src: Path, out: Path, workers: int) -> int:
    from tfrecord import TFRecordWriter

    out.mkdir(parents=True, exist_ok=True)
    items = h.folder_samples(src)
    w = TFRecordWriter(str(out / "data.tfrecord"))
    for path, key, label in items:
        w.write({"image": (_read(path), "byte"), "label": (label, "int"),
                 "key": (key.encode(), "byte")})
    w.close()
    return len(items)


def write_wds(src: Path, out: Path, workers: int) -> int:
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    items = h.folder_samples(src)
    with wds.ShardWriter(str(out / "part-%05d.tar"), maxsize=SHARD_BYTES, verbose=0) as w:
        for path, key, label in items:
            w.write({"__key__": key.rsplit(".", 1)[0].replace(".", "_"), "jpg": _read(path),
                     "cls": label})
    return len(items)


def write_mds(src: Path, out: Path, workers: int) -> int:
    from streaming import MDSWriter

    items = h.folder_samples(src)
    with MDSWriter(out=str(out), columns={"image": "bytes", "label": "int", "key": "str"},
                   size_limit=SHARD_BYTES) as w:
        for path, key, label in items:
            w.write({"image": _read(path), "label": label, "key": key})
    return len(items)


def _litdata_item(item):
    path, key, label = item
    return {"image": _read(path), "label": label, "key": key}


def write_litdata(src: Path, out: Path, workers: int) -> int:
    import litdata

    items = h.folder_samples(src)
    litdata.optimize(fn=_litdata_item, inputs=items, output_dir=str(out), num_workers=workers,
                     chunk_bytes=SHARD_BYTES, mode="overwrite")
    return len(items)


WRITERS = {"shards": write_shards, "tfrecord": write_tfrecord, "wds": write_wds,
           "mds": write_mds, "litdata": write_litdata}


# -- raw readers ---------------------------------------------------------------------------

def _order(n: int, mode: str, count: int | None, seed: int) -> list[int]:
    import numpy as np

    if mode == "seq":
        return list(range(n if count is None else min(n, count)))
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, count or n).tolist()


def read_shards(root: Path, mode: str, count: int | None, seed: int, sink: h.Sink) -> None:
    from formats import open_shards

    ds = open_shards(root)
    if mode == "seq":
        from reader import Loader

        with Loader(ds, BATCH, decode=False) as lo:
            for b in lo:
                for x in b["image"]:
                    sink(x)
                if count is not None and sink.records >= count:
                    break
        return
    order = _order(len(ds), "random", count, seed)
    if mode == "random-batch":  # what the Loader does: one vectorized lookup per batch
        import numpy as np

        idx = np.asarray(order)
        for at in range(0, len(idx), BATCH):
            for x in ds.payloads(idx[at : at + BATCH], "image"):
                sink(x)
        return
    for i in order:
        sink(ds[i]["image"])  # a whole sample, like the peers' __getitem__


def read_tfrecord(root: Path, mode: str, count: int | None, seed: int, sink: h.Sink) -> None:
    if mode != "seq":
        raise NotImplementedError("the tfrecord package reads sequentially (its index only "
                                  "splits files between workers)")
    from tfrecord.reader import tfrecord_loader

    desc = {"image": "byte", "label": "int", "key": "byte"}
    for rec in tfrecord_loader(str(root / "data.tfrecord"), None, desc):
        sink(rec["image"])
        if count is not None and sink.records >= count:
            break


def read_wds(root: Path, mode: str, count: int | None, seed: int, sink: h.Sink) -> None:
    if mode != "seq":
        raise NotImplementedError("webdataset tars are sequential-only (no index)")
    import webdataset as wds

    urls = sorted(str(p) for p in root.glob("*.tar"))
    for s in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        sink(s["jpg"])
        if count is not None and sink.records >= count:
            break


def _mds_dataset(root: Path, cls=None, **kw):
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    return (cls or StreamingDataset)(local=str(root), remote=None, shuffle=False, **kw)


def _read_map_style(ds, mode: str, count: int | None, seed: int, sink: h.Sink) -> None:
    """A peer's dataset: iterate it (seq) or index it (random)."""
    if mode == "seq":
        for s in ds:
            sink(s["image"])
            if count is not None and sink.records >= count:
                break
        return
    for i in _order(len(ds), mode, count, seed):
        sink(ds[i]["image"])


def read_mds(root: Path, mode: str, count: int | None, seed: int, sink: h.Sink) -> None:
    _read_map_style(_mds_dataset(root, batch_size=1), mode, count, seed, sink)


def read_litdata(root: Path, mode: str, count: int | None, seed: int, sink: h.Sink) -> None:
    import litdata

    _read_map_style(litdata.StreamingDataset(str(root), shuffle=False), mode, count, seed, sink)


READERS = {"shards": read_shards, "tfrecord": read_tfrecord, "wds": read_wds,
           "mds": read_mds, "litdata": read_litdata}


# -- full pipeline (decode + random resized crop 224 + flip) -------------------------------

class _Decode:
    """Our decoder (the same work for every peer), built lazily in each worker."""

    def __init__(self) -> None:
        self.dec = None
        self.rng = None

    def __call__(self, data, label):
        import numpy as np
        import torch

        if self.dec is None:
            self.dec = h.rrc_flip_decoder(SIZE)
            self.rng = np.random.default_rng(os.getpid())
        out = self.dec(data, self.rng, np.empty((SIZE, SIZE, 3), np.uint8))
        return torch.from_numpy(out), int(label)


_DECODE = _Decode()


class ImageFolderPIL:
    """torchvision's ImageFolder + RandomResizedCrop + flip, written out with PIL."""

    def __init__(self, src: Path) -> None:
        self.items = h.folder_samples(src)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        import numpy as np
        import torch

        path, _, label = self.items[i]
        img = h.naive_rrc_flip(path, np.random.default_rng(), SIZE)
        return torch.from_numpy(img.copy()), label


def wds_decode(s):
    return _DECODE(s["jpg"], s["cls"])


def _tfr_map(rec):
    return _DECODE(rec["image"], rec["label"][0])


def _count(loader) -> int:
    n = 0
    for x, _ in loader:
        n += len(x)
    return n


def pipeline(fmt: str, root: Path, workers: int) -> int:
    if fmt == "shards":
        from reader import Loader

        with Loader(root, BATCH, num_workers=workers, shuffle="block", seed=0,
                    transform=h.rrc_flip(SIZE)) as lo:
            return sum(len(b["label"]) for b in lo)
    import torch
    from torch.utils.data import DataLoader

    if fmt == "imagefolder":
        dl = DataLoader(ImageFolderPIL(root), batch_size=BATCH, shuffle=True, num_workers=workers)
    elif fmt == "wds":
        import webdataset as wds

        urls = sorted(str(p) for p in root.glob("*.tar"))
        ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False).map(wds_decode)
        dl = DataLoader(ds.batched(BATCH), batch_size=None, num_workers=workers)
    elif fmt == "tfrecord":
        from tfrecord.tools.tfrecord2idx import create_index
        from tfrecord.torch.dataset import TFRecordDataset

        index = root / "data.tfindex"
        if not index.exists():
            create_index(str(root / "data.tfrecord"), str(index))
        ds = TFRecordDataset(str(root / "data.tfrecord"), str(index),
                             {"image": "byte", "label": "int"}, transform=_tfr_map)
        dl = DataLoader(ds, batch_size=BATCH, num_workers=workers)
    elif fmt == "mds":
        from streaming import StreamingDataset

        class Decoded(StreamingDataset):
            def __getitem__(self, i):
                s = super().__getitem__(i)
                return _DECODE(s["image"], s["label"])

        dl = DataLoader(_mds_dataset(root, Decoded, batch_size=BATCH), batch_size=BATCH,
                        num_workers=workers)
    elif fmt == "litdata":
        import litdata

        class DecodedL(litdata.StreamingDataset):
            def __getitem__(self, i):
                s = super().__getitem__(i)
                return _DECODE(s["image"], s["label"])

        dl = litdata.StreamingDataLoader(DecodedL(str(root), shuffle=False), batch_size=BATCH,
                                         num_workers=workers)
    else:
        raise SystemExit(f"unknown pipeline format {fmt!r}")
    del torch
    return _count(dl)


# -- DALI's own CPU pipelines (the peers' virtualenv) --------------------------------------

#: DALI's settings, as measured best on the CPU (scripts/results/HISTORY.md, "DALI (CPU pipelines)",
#: says what else was tried); ``--dali KEY=VALUE`` overrides one. Pipeline keywords:
#: ``prefetch_queue_depth``, ``exec_dynamic`` (DALI 2's executor), ``exec_pipelined``,
#: ``exec_async``, ``bytes_per_sample``, ``set_affinity``, ``concurrency``; the rest choose ops:
#: ``crop`` (``decoder``: ``decoders.image_random_crop``, DALI's fused ROI decode;
#: ``after``: ``decoders.image`` + ``random_resized_crop``), ``flip`` (``flip``:
#: ``fn.flip``; ``cmn``: ``crop_mirror_normalize`` to uint8 HWC with ``mirror``),
#: ``antialias`` (``fn.resize``'s, on by default in DALI), ``initial_fill`` (the
#: readers' shuffle buffer), ``hint`` (``bytes_per_sample_hint`` of the decoder).
DALI_SETTINGS: dict = {"prefetch_queue_depth": 2, "exec_dynamic": False, "crop": "decoder",
                       "flip": "flip", "antialias": True}
_PIPELINE_KEYS = ("prefetch_queue_depth", "exec_dynamic", "exec_pipelined", "exec_async",
                  "bytes_per_sample", "set_affinity", "concurrency")
_OP_KEYS = ("crop", "flip", "antialias", "initial_fill", "hint")


def dali_settings(pairs: list[str] | None) -> dict:
    """:data:`DALI_SETTINGS` with ``KEY=VALUE`` pairs applied (a value is JSON when it
    parses as JSON: ``2``, ``true``, ``[1, 2]``; else a string)."""
    import json

    out = dict(DALI_SETTINGS)
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--dali wants KEY=VALUE, got {pair!r}")
        if key not in _PIPELINE_KEYS + _OP_KEYS:  # a typo would be measured as the default
            raise SystemExit(f"--dali {key!r}: not a setting these pipelines use; one of "
                             f"{', '.join(_PIPELINE_KEYS + _OP_KEYS)}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _dali_pipeline_kw(threads: int, batch: int, settings: dict) -> dict:
    kw = {"batch_size": batch, "num_threads": threads, "device_id": None, "seed": 0}
    kw.update({k: settings[k] for k in _PIPELINE_KEYS if k in settings})
    return kw


def _dali_epoch(pipe, batch: int, name: str = "Reader") -> tuple[int, float, float]:
    """Runs ``pipe`` for one epoch of its reader, in whole batches (the reader runs on
    into the next epoch for the last one: every image counted was decoded). Returns the
    images delivered, and the clock (``time.perf_counter``) and :func:`_cpu_seconds` at
    the last batch's delivery: the batches DALI prefetches past it (``prefetch_queue_depth``)
    and its teardown are not counted, as they would not be in a longer run."""
    pipe.build()
    meta = pipe.reader_meta(name)
    n = meta["epoch_size_padded"] if meta.get("epoch_size_padded") else meta["epoch_size"]
    steps = max(1, -(-n // batch))
    for _ in range(steps):
        pipe.run()
    return steps * batch, time.perf_counter(), _cpu_seconds()


def dali_classification(fmt: str, root: Path, threads: int,
                        settings: dict) -> tuple[int, float, float]:
    """DALI's CPU pipeline of the classification benchmark: read, decode + random
    resized crop 224 (torchvision's area 0.08-1 and ratio 3/4-4/3, 10 tries), flip, uint8
    HWC 224x224x3 out, batches of :data:`BATCH` images."""
    from nvidia.dali import fn, pipeline_def, types

    fill = {"initial_fill": settings["initial_fill"]} if "initial_fill" in settings else {}

    @pipeline_def(**_dali_pipeline_kw(threads, BATCH, settings))
    def classification():
        if fmt == "dali-files":
            jpegs, labels = fn.readers.file(file_root=str(root), random_shuffle=True,
                                            name="Reader", **fill)
        else:
            import nvidia.dali.tfrecord as tfrec

            files = sorted(root.glob("*.tfrecord"))
            if not files:
                raise FileNotFoundError(f"no .tfrecord files in {root}")
            rec = fn.readers.tfrecord(
                path=[str(f) for f in files], index_path=[str(f.with_suffix(".idx")) for f in files],
                features={"image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                          "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1)},
                random_shuffle=True, name="Reader", **fill)
            jpegs, labels = rec["image/encoded"], rec["image/class/label"]
        hint = {"bytes_per_sample_hint": settings["hint"]} if "hint" in settings else {}
        crop = {"random_area": [0.08, 1.0], "random_aspect_ratio": [3 / 4, 4 / 3],
                "num_attempts": 10}
        if settings["crop"] == "decoder":
            images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                                   **crop, **hint)
            images = fn.resize(images, resize_x=SIZE, resize_y=SIZE,
                               antialias=settings["antialias"])
        else:
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB, **hint)
            images = fn.random_resized_crop(images, size=(SIZE, SIZE), **crop,
                                            antialias=settings["antialias"])
        mirror = fn.random.coin_flip()
        if settings["flip"] == "cmn":
            images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="HWC",
                                              mirror=mirror)
        else:
            images = fn.flip(images, horizontal=mirror)
        return images, labels

    return _dali_epoch(classification(), BATCH)


DALI_DETECTION = ("dali-det", "dali-det-pad", "dali-det-raw")
DET_BATCH = 16
DET_SHORT = (480, 512, 544, 576, 608)  # scripts/bench_detection.py's SHORT and MAX_SIZE
DET_MAX = 1000


def dali_detection(fmt: str, images: Path, annotations: Path, threads: int,
                   settings: dict) -> tuple[int, float, float]:
    """DALI's CPU pipeline of the detection benchmark over the COCO folder: ``readers.coco``
    (ltrb boxes, no polygons, empty images kept as ours keeps them), decode, resize the
    short side to one of 480-608 drawn per image with the long side at most 1,000, a
    coin-flip mirror of image and boxes, boxes scaled back to pixels of the resized image;
    ``dali-det-pad`` pads the batch to its largest image rounded up to 32 (what
    ``PadToMultiple(32)`` and our batch layout give); ``dali-det-raw`` stops after the
    reader (JPEG bytes, boxes, labels)."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(**_dali_pipeline_kw(threads, DET_BATCH, settings))
    def detection():
        jpegs, boxes, labels = fn.readers.coco(
            file_root=str(images), annotations_file=str(annotations), ltrb=True,
            ratio=fmt != "dali-det-raw", skip_empty=False, polygon_masks=False,
            random_shuffle=True, name="Reader")
        if fmt == "dali-det-raw":
            return jpegs, boxes, labels
        img = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        short = fn.random.choice(list(DET_SHORT))
        img = fn.resize(img, resize_shorter=fn.cast(short, dtype=types.FLOAT),
                        max_size=DET_MAX, antialias=settings["antialias"])
        flip = fn.random.coin_flip()
        img = fn.flip(img, horizontal=flip)
        boxes = fn.bb_flip(boxes, ltrb=True, horizontal=flip)
        hw = img.shape(dtype=types.FLOAT)  # (h, w, 3)
        boxes = boxes * fn.stack(hw[1], hw[0], hw[1], hw[0])  # relative -> pixels
        if fmt == "dali-det-pad":
            img = fn.pad(img, axes=(0, 1), align=(32, 32))
        return img, boxes, labels

    return _dali_epoch(detection(), DET_BATCH)


# -- CLI -----------------------------------------------------------------------------------

IMPORTS = {"shards": ("formats", "reader", "packer"), "tfrecord": ("tfrecord", "tfrecord.reader"),
           "wds": ("webdataset",), "mds": ("streaming",), "litdata": ("litdata",),
           "imagefolder": ("PIL.Image",),
           **dict.fromkeys(("dali-files", "dali-tfrecord", *DALI_DETECTION),
                           ("nvidia.dali", "nvidia.dali.fn", "nvidia.dali.tfrecord"))}


def _preload(fmt: str, cmd: str) -> None:
    """Import what the runner needs before the clock starts (start-up is not measured)."""
    import importlib

    names = list(IMPORTS.get(fmt, ()))
    if cmd == "pipeline" and not fmt.startswith("dali"):
        # ours needs no torch; the peers feed torch's DataLoader
        names += ["reader.transforms.decode", "reader.transforms"] + ([] if fmt == "shards" else ["torch"])
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            if name.startswith("nvidia.dali"):
                raise ImportError(f"DALI not installed in {sys.executable} ({exc}); install "
                                  "nvidia-dali-cuda120 or -cuda130 there (BENCHMARKS.md, "
                                  "Setting up the peers)") from None
            raise


def _cpu_seconds() -> float:
    """CPU time of this process and of its children waited for (a Loader's or a
    DataLoader's workers are, when it closes), user + system."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _dali_version() -> str:
    import nvidia.dali

    return nvidia.dali.__version__


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("format", choices=sorted(WRITERS))
    w.add_argument("src", type=Path)
    w.add_argument("out", type=Path)
    h.add_workers(w)
    r = sub.add_parser("read")
    r.add_argument("format", choices=sorted(READERS))
    r.add_argument("dir", type=Path)
    r.add_argument("--mode", choices=("seq", "random", "random-batch"), default="seq",
                   help="random-batch: ours only, batched index lookups")
    r.add_argument("--no-copy", action="store_true", help="do not copy payloads out")
    r.add_argument("--count", type=int, default=None, help="records (default: all)")
    r.add_argument("--seed", type=int, default=0)
    q = sub.add_parser("pipeline")
    q.add_argument("format", choices=sorted([*READERS, "imagefolder", "dali-files",
                                             "dali-tfrecord"]))
    q.add_argument("dir", type=Path)
    h.add_workers(q, help="worker processes (ours, torch's DataLoader); DALI's num_threads")
    d = sub.add_parser("detection", help="DALI's readers.coco pipelines (bench_detection)")
    d.add_argument("format", choices=DALI_DETECTION)
    d.add_argument("dir", type=Path, help="the COCO images folder")
    d.add_argument("--annotations", type=Path, required=True)
    h.add_workers(d, help="DALI's num_threads")
    for x in (q, d):
        x.add_argument("--dali", action="append", metavar="KEY=VALUE",
                       help="a DALI setting (bench_peers.DALI_SETTINGS), repeatable")
    m = sub.add_parser("loader-memory", help="RssAnon of a Loader (main + workers) mid-epoch")
    m.add_argument("dir", type=Path)
    h.add_workers(m)
    args = p.parse_args(argv)
    if args.cmd == "loader-memory":
        from scripts.bench_reader import loader_memory

        h.emit(seconds=1.0, records=0, bytes=0, kb=loader_memory(args.dir, args.workers))
        return 0
    try:
        _preload(args.format, args.cmd)
        if args.cmd == "write":
            dt, n = h.timed_call(WRITERS[args.format], args.src, args.out, args.workers)
            nbytes = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
            h.emit(seconds=dt, records=n, bytes=nbytes)
        elif args.cmd == "read":
            sink = h.Sink(copy=not args.no_copy)
            dt = h.timed(READERS[args.format], args.dir, args.mode, args.count, args.seed, sink)
            h.emit(seconds=dt, records=sink.records, bytes=sink.bytes)
        else:
            extra = {}
            t, cpu = time.perf_counter(), _cpu_seconds()
            if args.format.startswith("dali"):  # timed to its last batch (_dali_epoch)
                if args.cmd == "detection":
                    n, t_end, cpu_end = dali_detection(args.format, args.dir, args.annotations,
                                                       args.workers, dali_settings(args.dali))
                else:
                    n, t_end, cpu_end = dali_classification(args.format, args.dir, args.workers,
                                                            dali_settings(args.dali))
                extra["dali"] = _dali_version()
            else:
                n = pipeline(args.format, args.dir, args.workers)
                t_end, cpu_end = time.perf_counter(), _cpu_seconds()
            h.emit(seconds=t_end - t, records=n, bytes=0, cpu_seconds=cpu_end - cpu, **extra)
    except (ImportError, NotImplementedError) as exc:
        h.emit(skipped=f"{type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
