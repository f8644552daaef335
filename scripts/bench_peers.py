"""Runners for ``scripts/bench.py``: one writer or reader per call, timings as JSON.

Every runner is a subcommand, so ``bench.py`` can run it in the interpreter that has
the peer installed (MosaicML Streaming and LitData live in a separate virtualenv,
since installing them can replace torch and numpy) and sample the memory of the
process tree from outside. Times are measured inside the runner: interpreter
start-up and imports are not part of any figure.

    python scripts/bench_peers.py write FORMAT SRC OUT [--workers N]
    python scripts/bench_peers.py read FORMAT DIR [--mode seq|random] [--count K]
    python scripts/bench_peers.py pipeline FORMAT DIR [--workers N] [--batch 256]

FORMAT: ``shards`` (ours), ``tfrecord``, ``wds`` (webdataset), ``mds``, ``litdata``,
and ``imagefolder`` for ``pipeline``. SRC is an image folder (class subfolders);
every writer stores the same three fields: the JPEG bytes, the label, the key.
Each call prints one JSON object: ``seconds``, ``records``, ``bytes`` (and
``skipped`` with a reason when the peer cannot do it). Readers copy every payload
byte into a reused buffer, so every reader touches the same bytes.
"""

from __future__ import annotations

import argparse
import os
import sys
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


# -- CLI -----------------------------------------------------------------------------------

IMPORTS = {"shards": ("formats", "reader", "packer"), "tfrecord": ("tfrecord", "tfrecord.reader"),
           "wds": ("webdataset",), "mds": ("streaming",), "litdata": ("litdata",),
           "imagefolder": ("PIL.Image",)}


def _preload(fmt: str, cmd: str) -> None:
    """Import what the runner needs before the clock starts (start-up is not measured)."""
    import importlib

    names = list(IMPORTS.get(fmt, ()))
    if cmd == "pipeline":  # ours needs no torch; the peers feed torch's DataLoader
        names += ["reader.pipeline.decode", "reader.transforms"] + ([] if fmt == "shards" else ["torch"])
    for name in names:
        importlib.import_module(name)


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
    q.add_argument("format", choices=sorted([*READERS, "imagefolder"]))
    q.add_argument("dir", type=Path)
    h.add_workers(q)
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
            dt, n = h.timed_call(pipeline, args.format, args.dir, args.workers)
            h.emit(seconds=dt, records=n, bytes=0)
    except (ImportError, NotImplementedError) as exc:
        h.emit(skipped=f"{type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
