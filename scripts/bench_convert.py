"""Conversion speed: pack-dataset --from/--to each foreign format vs that format's reference library.

Issue 18 ("Performance"): each conversion must run at >= 1.0x the reference
library's own reader or writer on the same records, measured side by side.

Data. One synthetic image folder (:mod:`scripts.synth`, 20 classes, sides 200 to
400 px, JPEGs of ~30-100 KB; 4,000 by default, 1,000 with ``--quick``), cached
under ``--data``. Every run packs it, untimed, with our own sinks into shards and
then into TFRecord, WebDataset and Parquet (HF layout), 1,000 records per file;
every row below reads or writes those same records. MB/s is always the JPEG
payload bytes over the wall time, so the rows compare directly.

Rows, one process each unless said:

* copy limit: read every JPEG of the folder and append it to one file (for scale).
* ``--from X``: ``packer.pack(SRC, DST, PackOptions(source=X, workers=cores,
  durable=False))`` into shards, vs the reference reader over the same files,
  touching every payload (each value's bytes copied into a reused 8 MB buffer):

  - tfrecord: ``tfrecord.reader.tfrecord_loader`` per file, with a description of
    the three features (so every Example is parsed and each value extracted);
  - webdataset: ``webdataset.WebDataset(urls, shardshuffle=False)``, every sample;
  - parquet: Hugging Face ``datasets.load_dataset("parquet", data_files=...,
    split="train", cache_dir=<fresh temp folder>)`` (what its docs show first; the
    Arrow cache is built in every run, as on a first load), then
    ``cast_column("image", Image(decode=False))`` so a row holds the image bytes
    (a converter has no use for PIL objects), then every row; plus
    ``pyarrow.parquet.read_table`` of the same files as the I/O limit.
* ``--to X``: ``packer.pack(SHARDS, DST, PackOptions(source="shards", sink=X,
  workers=cores, durable=False))`` (defaults otherwise: ``--to tfrecord`` also
  writes DALI ``.idx`` files), vs ``tfrecord.TFRecordWriter`` (Examples built from
  image bytes, label int, key bytes, under the feature names our sink uses) and
  ``webdataset.TarWriter`` (``jpg``, ``cls``), each fed the records of the same
  shards through ``formats.codecs.registry.open_source("shards")`` (the source ours
  reads), so the two rows differ only in the writer.

Method (as BENCHMARKS.md): page cache warm; every case runs once untimed (imports,
caches, and the correctness checks: ours' output read back, shards by our source,
TFRecord and tars by the reference readers, its records and payload bytes
counted), then ``--repeat`` rounds in which the cases of a
section run back to back in a rotated order, each after ``os.sync()`` into a fresh
folder. Rates are medians over rounds; the ratio is the median over rounds of
ours / reference measured in the same round; spread is (max - min) / median of a
case's own rates. Every run's record count (and the payload bytes a reference
delivered) is checked too; a mismatch stops the run with an error (exit 1).

The header gives the load average before and after: the machine may be shared.

Usage: ``python -m scripts.bench_convert [--count N] [--repeat R] [--quick]``.
Needs ``pip install 'shardpack[bench]'`` and ``datasets`` for the reference rows
(a missing library's rows say ``skipped``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scripts import harness as h

__all__ = ["main"]

_CLASSES = 20
_MIN_SIDE, _MAX_SIDE = 200, 400  # JPEGs of ~30-100 KB (53 KB mean)
_PER_FILE = 1_000  # records per TFRecord / tar / Parquet file of the sources
_touch = h.Sink()  # every reference reader copies each payload in here (returns its length)


class BenchError(RuntimeError):
    """A case produced the wrong number of records or bytes."""


def _check(case: str, what: str, found: int, expected: int) -> None:
    if found != expected:
        raise BenchError(f"{case}: {what} {found:,}, expected {expected:,}")


# --- data ---------------------------------------------------------------------------


def _image_folder(data: Path, count: int) -> tuple[Path, list[Path]]:
    root = h.image_folder(data, count, _CLASSES, f"convert-jpegs-{{n}}-{_MIN_SIDE}-{_MAX_SIDE}",
                          min_side=_MIN_SIDE, max_side=_MAX_SIDE)
    files = sorted(f for d in root.iterdir() if d.is_dir() for f in d.iterdir())
    return root, files


@dataclass
class Sources:
    """The same records in every format, made by our own sinks."""

    shards: Path
    tfrecord: list[Path]
    tfrecord_names: dict[str, str]  # our field -> TFRecord feature name
    webdataset: list[Path]
    parquet: list[Path]


def _make_sources(folder: Path, root: Path, cores: int, n: int) -> Sources:
    from packer import PackOptions, pack

    t = time.perf_counter()
    pack(folder, root / "shards", PackOptions(workers=cores, durable=False))
    for sink in ("tfrecord", "webdataset", "parquet"):
        s = pack(root / "shards", root / sink,
                 PackOptions(source="shards", sink=sink, shard_size=None,
                             records_per_shard=_PER_FILE, workers=cores, durable=False))
        _check(f"source {sink}", "records written", s.records_written, n)
    schema = json.loads((root / "tfrecord" / "schema.json").read_text())
    print(f"sources made in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return Sources(root / "shards", sorted((root / "tfrecord").glob("*.tfrecord")),
                   schema["names"], sorted((root / "webdataset").glob("*.tar")),
                   sorted((root / "parquet").glob("*.parquet")))


# --- the cases: fn(out) -> (records, payload bytes or -1 when not counted) ---------


def _copy_limit(files: list[Path], out: Path) -> tuple[int, int]:
    return len(files), h.copy_limit(files, out / "copy.bin")


def _ours(src, out: Path, cores: int, **kw) -> tuple[int, int]:
    from packer import PackOptions, pack

    s = pack(src, out / "ds", PackOptions(workers=cores, durable=False, **kw))
    if not s.complete:
        raise BenchError(f"pack {kw} did not complete")
    return s.records_written, -1


def _tfrecord_read(files: list[Path], names: dict[str, str]) -> tuple[int, int]:
    from tfrecord.reader import tfrecord_loader

    image, label, key = names["image"], names["label"], names["key"]
    description = {image: "byte", label: "int", key: "byte"}
    count = nbytes = 0
    for path in files:
        for ex in tfrecord_loader(str(path), None, description):
            nbytes += _touch(ex[image])
            _touch(ex[key])
            int(ex[label][0])
            count += 1
    return count, nbytes


def _webdataset_read(files: list[Path]) -> tuple[int, int]:
    import webdataset as wds

    count = nbytes = 0
    for sample in wds.WebDataset([str(p) for p in files], shardshuffle=False):
        for name, value in sample.items():
            if isinstance(value, bytes):
                n = _touch(value)
                if name == "jpg":
                    nbytes += n
        count += 1
    return count, nbytes


def _hf_read(files: list[Path], out: Path) -> tuple[int, int]:
    import datasets

    ds = datasets.load_dataset("parquet", data_files=[str(p) for p in files], split="train",
                               cache_dir=str(out / "hf-cache"))
    ds = ds.cast_column("image", datasets.Image(decode=False))
    count = nbytes = 0
    for row in ds:
        nbytes += _touch(row["image"]["bytes"])
        _touch(row["image"]["path"].encode())  # the key: HF's layout keeps it as the path
        int(row["label"])
        count += 1
    return count, nbytes


def _pyarrow_read(files: list[Path]) -> tuple[int, int]:
    import pyarrow.parquet as pq

    return sum(pq.read_table(p).num_rows for p in files), -1


def _tfrecord_write(shards: Path, names: dict[str, str], out: Path) -> tuple[int, int]:
    from tfrecord import TFRecordWriter

    from formats.codecs.registry import open_source

    image, label, key = names["image"], names["label"], names["key"]
    count = nbytes = 0
    w = TFRecordWriter(str(out / "data.tfrecord"))
    try:
        for rec in open_source("shards", shards):
            f = rec.fields
            data = bytes(f["image"])
            w.write({image: (data, "byte"), label: (f["label"], "int"),
                     key: (f["key"].encode(), "byte")})
            count += 1
            nbytes += len(data)
    finally:
        w.close()
    return count, nbytes


def _webdataset_write(shards: Path, out: Path) -> tuple[int, int]:
    import webdataset as wds

    from formats.codecs.registry import open_source

    count = nbytes = 0
    with wds.TarWriter(str(out / "data.tar")) as w:
        for rec in open_source("shards", shards):
            f = rec.fields
            data = bytes(f["image"])
            w.write({"__key__": f["key"].rsplit(".", 1)[0], "jpg": data, "cls": f["label"]})
            count += 1
            nbytes += len(data)
    return count, nbytes


def _source_only(kind: str, path: Path) -> tuple[int, int]:
    """Our source's records, each payload touched, nothing written (where ours' time goes)."""
    from formats.codecs.registry import open_source

    count = nbytes = 0
    for rec in open_source(kind, path):
        nbytes += _touch(rec.fields["image"])
        count += 1
    return count, nbytes


# --- correctness checks of the untimed first run -----------------------------------


def _readback_shards(out: Path) -> tuple[int, int]:
    from formats.codecs.registry import open_source

    count = nbytes = 0
    for rec in open_source("shards", out / "ds"):
        nbytes += len(rec.fields["image"])
        count += 1
    return count, nbytes


def _readback_tfrecord(out: Path, names: dict[str, str]) -> tuple[int, int]:
    return _tfrecord_read(sorted((out / "ds").glob("*.tfrecord")), names)


def _readback_webdataset(out: Path) -> tuple[int, int]:
    return _webdataset_read(sorted((out / "ds").glob("*.tar")))


# --- timing -------------------------------------------------------------------------


@dataclass
class Case:
    """One row. ``ratio`` = (case a, case b, label): the row shows the median over
    rounds of rate(a) / rate(b) measured in the same round (a name may be its own)."""

    name: str
    fn: Callable[[Path], tuple[int, int]]
    readback: Callable[[Path], tuple[int, int]] | None = None  # first run: ours read back
    needs: str | None = None  # module whose absence skips the case
    ratio: tuple[str, str, str] | None = None
    target: str = ""
    skipped: str | None = None
    seconds: list[float] = field(default_factory=list)


@dataclass
class Section:
    title: str
    cases: list[Case]


def _run_once(case: Case, scratch: Path, n: int, nbytes: int, first: bool) -> float:
    with h.fresh_dir(scratch) as out:
        seconds, (count, got) = h.timed_call(case.fn, out)
        _check(case.name, "records", count, n)
        if got >= 0:
            _check(case.name, "payload bytes", got, nbytes)
        if first and case.readback is not None:
            count, got = case.readback(out)
            _check(f"{case.name} (read back)", "records", count, n)
            _check(f"{case.name} (read back)", "payload bytes", got, nbytes)
    return seconds


def _measure(sections: list[Section], repeat: int, scratch: Path, n: int, nbytes: int) -> None:
    for sec in sections:
        for case in sec.cases:
            if case.needs:
                try:
                    __import__(case.needs)
                except ImportError as e:
                    case.skipped = f"skipped: {e}"
                    continue
            _run_once(case, scratch, n, nbytes, first=True)
    for r in range(repeat):
        for sec in sections:
            for case in h.rotated([c for c in sec.cases if c.skipped is None], r):
                case.seconds.append(_run_once(case, scratch, n, nbytes, first=False))
        print(f"round {r + 1} of {repeat} done", file=sys.stderr)


def _print(sections: list[Section], n: int, nbytes: int, header: list[str]) -> None:
    report = h.Report(h.Col("case"), h.Col("records/s", 10, ">"), h.Col("MB/s", 7, ">"),
                      h.Col("spread", 6, ">"), h.Col("ratio", 20), h.Col("target", 0))
    for sec in sections:
        report.section(sec.title)
        by_name = {c.name: c for c in sec.cases}
        for c in sec.cases:
            if c.skipped:
                report.skip(c.name, c.skipped)
                continue
            rates = [n / s for s in c.seconds]
            med = h.median(rates)
            ratio = ""
            if c.ratio is not None:
                a, b, label = by_name[c.ratio[0]], by_name[c.ratio[1]], c.ratio[2]
                if a.seconds and b.seconds:  # rate(a) ÷ rate(b) = seconds(b) ÷ seconds(a)
                    ratio = h.ratio_text(h.paired_ratio(b.seconds, a.seconds), label)
            report.row(c.name, f"{med:,.0f}", f"{med * nbytes / n / 1e6:,.0f}",
                       f"{h.spread(rates):.0%}", ratio, c.target)
    print("\n".join(header))
    print()
    report.print()


def _plural(k: int, what: str) -> str:
    return f"{k} {what}{'' if k == 1 else 's'}"


def _from_section(kind: str, files: list[Path], cores: int, refs: list[Case]) -> Section:
    """``--from kind``: ours, the reference reader(s), and our source alone."""
    ours = f"pack-dataset --from {kind}, workers={cores}"
    first = refs[0].name
    for ref in refs:
        ref.ratio = (ours, ref.name, "ours ÷ it")
    refs[0].target = ">= 1.0"
    return Section(f"--from {kind} ({_plural(len(files), 'file')}) -> shards", [
        Case(ours, lambda o: _ours(files[0].parent, o, cores, source=kind), _readback_shards),
        *refs,
        Case(f"  ours without the write: {kind} source alone",
             lambda o: _source_only(kind, files[0].parent),
             ratio=(f"  ours without the write: {kind} source alone", first, "it ÷ reader")),
    ])


def _to_section(kind: str, shards: Path, cores: int, ref: Case,
                readback: Callable[[Path], tuple[int, int]]) -> Section:
    ours = f"pack-dataset --to {kind}, workers={cores}"
    ref.ratio, ref.target = (ours, ref.name, "ours ÷ it"), ">= 1.0"
    return Section(f"shards -> --to {kind}", [
        Case(ours, lambda o: _ours(shards, o, cores, source="shards", sink=kind), readback),
        ref,
    ])


def main(argv: list[str] | None = None) -> int:
    p = h.parser(__doc__)
    h.add_data(p, help="cache folder for the generated image folder")
    p.add_argument("--count", type=int, default=4_000, help="images (default 4,000)")
    h.add_repeat(p, None, help="timed rounds (default 5; 3 with --quick)")
    p.add_argument("--quick", action="store_true", help="1,000 images, 3 rounds")
    args = p.parse_args(argv)
    count = 1_000 if args.quick else args.count
    repeat = args.repeat or (3 if args.quick else 5)
    if repeat < 1 or count < _CLASSES:
        p.error(f"need --repeat >= 1 and --count >= {_CLASSES}")
    start = time.perf_counter()
    load = h.Load()
    args.data.mkdir(parents=True, exist_ok=True)
    folder, files = _image_folder(args.data, count)
    n = len(files)
    cores = h.CORES
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files: never the network
    try:  # no progress bars for the datasets rows
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
    except ImportError:
        pass
    scratch = Path(tempfile.mkdtemp(prefix="bench-convert-", dir=args.data))
    try:
        src = _make_sources(folder, scratch / "sources", cores, n)
        nbytes = sum(len(p.read_bytes()) for p in files)  # and the folder is warm
        for f in (*src.tfrecord, *src.webdataset, *src.parquet):  # warm the sources
            f.read_bytes()
        names = src.tfrecord_names
        sections = [
            Section("limit", [Case("copy limit: read every JPEG + append to one file",
                                   lambda o: _copy_limit(files, o))]),
            _from_section("tfrecord", src.tfrecord, cores, [
                Case("tfrecord.reader.tfrecord_loader",
                     lambda o: _tfrecord_read(src.tfrecord, names), needs="tfrecord")]),
            _from_section("webdataset", src.webdataset, cores, [
                Case("webdataset.WebDataset", lambda o: _webdataset_read(src.webdataset),
                     needs="webdataset")]),
            _from_section("parquet", src.parquet, cores, [
                Case("datasets.load_dataset + iterate rows", lambda o: _hf_read(src.parquet, o),
                     needs="datasets"),
                Case("limit: pyarrow.parquet.read_table", lambda o: _pyarrow_read(src.parquet))]),
            _to_section("tfrecord", src.shards, cores,
                        Case("tfrecord.TFRecordWriter",
                             lambda o: _tfrecord_write(src.shards, names, o), needs="tfrecord"),
                        lambda o: _readback_tfrecord(o, names)),
            _to_section("webdataset", src.shards, cores,
                        Case("webdataset.TarWriter", lambda o: _webdataset_write(src.shards, o),
                             needs="webdataset"),
                        _readback_webdataset),
        ]
        _measure(sections, repeat, scratch, n, nbytes)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    header = [
        f"{n} JPEGs ({_MIN_SIDE}-{_MAX_SIDE} px), {nbytes / n / 1e3:.0f} KB mean, "
        f"{nbytes / 1e6:,.0f} MB; sources written by our sinks, {_PER_FILE:,} records a file",
        f"ours: workers={cores} = cores, durable=False; references: 1 process; median of "
        f"{repeat} rounds, page cache warm; MB/s of JPEG payload",
        load.line(),
    ]
    _print(sections, n, nbytes, header)
    print(f"\n({time.perf_counter() - start:.0f} s wall time)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"bench_convert: FAILED: {e}", file=sys.stderr)
        sys.exit(1)
