"""The benchmarks' one harness: what every ``scripts/bench*.py`` shares, so that a script
is its workload and nothing else.

The method (BENCHMARKS.md, "How it measures"), written once here:

* cases run in rounds, back to back, in an order rotated every round (:func:`rotated`,
  :func:`rounds`), so that none always goes first and drift hits every side alike;
* a rate is the median over rounds (:func:`median`), its noise the spread
  (max - min) ÷ median (:func:`spread`); a ratio is the median over rounds of the two
  sides' ratio *in the same round* (:func:`paired_ratio`): this machine's absolute
  rates move 2x between runs, a ratio of runs made back to back barely;
* the load average is read before and after (:class:`Load`): the machine may be shared;
* a writer's run starts after ``os.sync()`` in a fresh folder (:func:`fresh_dir`), so
  the previous run's writeback does not throttle it;
* every input is read once before it is timed (:func:`warm`): page cache warm.

Tables are strings formatted by the script and laid out here (:class:`Table`): the
script says what a figure is, the harness where it stands. Data comes from
:mod:`scripts.synth` (the one synthetic-data generator), cached under ``--data``.

Imports at the top are the standard library's alone: ``scripts/bench_peers.py`` runs
this module in the peers' virtualenv, where shardpack is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

#: Where benchmarks keep their generated data between runs (``--data``'s usual default).
DATA = Path(tempfile.gettempdir()) / "shardpack-bench"
#: This machine's cores, as ``os.cpu_count`` says (``len(os.sched_getaffinity(0))`` is
#: what this process may use; the scripts that default to it say so).
CORES = os.cpu_count() or 1


# -- the command line ---------------------------------------------------------------------

def parser(doc: str, *, full: bool = False) -> argparse.ArgumentParser:
    """A script's parser: its docstring's first line as the description, or (``full``)
    the whole docstring as written."""
    if full:
        return argparse.ArgumentParser(description=doc,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
    return argparse.ArgumentParser(description=doc.splitlines()[0])


def add_data(p: argparse.ArgumentParser, default: Path | None = DATA,
             help: str | None = None) -> None:
    p.add_argument("--data", type=Path, default=default, help=help)


def add_repeat(p: argparse.ArgumentParser, default: int | None = 3,
               help: str | None = None) -> None:
    p.add_argument("--repeat", type=int, default=default, help=help)


def add_workers(p: argparse.ArgumentParser, default: int | None = CORES,
                help: str | None = None) -> None:
    p.add_argument("--workers", type=int, default=default, help=help)


def add_peers_python(p: argparse.ArgumentParser, help: str | None = None) -> None:
    """``--peers-python``: the virtualenv with MosaicML Streaming and LitData
    (BENCHMARKS.md, "Setting up the peers"); ``$SHARDPACK_PEERS_PYTHON`` by default."""
    p.add_argument("--peers-python", default=os.environ.get("SHARDPACK_PEERS_PYTHON"),
                   help=help)


# -- optional packages --------------------------------------------------------------------

#: The distribution that provides an import name, where the two differ.
_DISTRIBUTIONS = {"PIL": "Pillow"}


def missing(*modules: str) -> str | None:
    """Why a row cannot run in this interpreter, in one line: the modules it imports
    (import names) that are not installed, and the extra that installs them
    (pyproject's ``bench``); None when all are there. A row skipped this way prints
    ``skipped: <reason>`` as a peer without its virtualenv does."""
    import importlib.util

    lacking = [m for m in modules if importlib.util.find_spec(m) is None]
    if not lacking:
        return None
    names = ", ".join(_DISTRIBUTIONS.get(m, m) for m in lacking)
    return f"needs {names}, not installed here: pip install 'shardpack[bench]'"


# -- timing and rounds --------------------------------------------------------------------

def timed(fn: Callable, /, *args, **kwargs) -> float:
    """Seconds of one call of ``fn``."""
    return timed_call(fn, *args, **kwargs)[0]


def timed_call(fn: Callable, /, *args, **kwargs):
    """``(seconds, result)`` of one call of ``fn``."""
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t, out


def per_second(fn: Callable, /, *args, **kwargs) -> float:
    """What one call of ``fn`` counts (its return value: images, bytes) per second."""
    seconds, count = timed_call(fn, *args, **kwargs)
    return count / seconds


def rotated(items: Sequence, r: int) -> list:
    """``items`` in round ``r``'s order: rotated by ``r``, so none always goes first
    (with two items: alternated)."""
    items = list(items)
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def rounds(cases: Sequence, repeat: int, run: Callable[[object, int], None],
           after_round: Callable[[int], None] | None = None) -> None:
    """``run(case, r)`` for every case in every round ``r``, in :func:`rotated` order."""
    for r in range(repeat):
        for case in rotated(cases, r):
            run(case, r)
        if after_round is not None:
            after_round(r)


@contextmanager
def fresh_dir(scratch: Path):
    """A new empty folder under ``scratch`` for one writer's run, after ``os.sync()``
    (the previous run's dirty pages would throttle this one's writes and bias whichever
    case runs later); removed afterwards."""
    os.sync()
    out = Path(tempfile.mkdtemp(dir=scratch))
    try:
        yield out
    finally:
        shutil.rmtree(out, ignore_errors=True)


# -- figures ------------------------------------------------------------------------------

def median(xs: Iterable[float]) -> float:
    """The median, NaN when there is nothing."""
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def spread(xs: Sequence[float]) -> float:
    """(max - min) ÷ median: how much one case's rounds disagree (0 for one round)."""
    return (max(xs) - min(xs)) / statistics.median(xs) if len(xs) > 1 else 0.0


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """The median over rounds of ``a[r] / b[r]`` (NaN when none): each ratio of two
    figures measured back to back, in the same round."""
    return median(x / y for x, y in zip(a, b, strict=False) if y)


def ratio_text(x: float, label: str) -> str:
    """``"0.93 of memcpy"``; empty for NaN (a side was not measured)."""
    return f"{x:.2f} {label}" if x == x else ""


class Load:
    """The 1, 5 and 15 minute load averages at construction (``before``) and now."""

    def __init__(self) -> None:
        self.before = os.getloadavg()

    @staticmethod
    def now() -> tuple[float, float, float]:
        return os.getloadavg()

    @staticmethod
    def text(load: Sequence[float]) -> str:
        return " ".join(f"{x:.2f}" for x in load)

    def line(self) -> str:
        """The one sentence every benchmark prints about the load."""
        return (f"load average before {self.text(self.before)}, after {self.text(self.now())} "
                f"on {CORES} cores (other processes compete with every multi-process figure)")


# -- tables -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Col:
    """A column: its title, width (None: the widest cell; 0: not padded), alignment
    (``<`` or ``>``) and the gap before it (None: the table's separator)."""

    title: str
    width: int | None = None
    align: str = "<"
    gap: str | None = None


class Table:
    """Rows of strings laid out in columns, the titles aligned as the cells are.

    A row is a tuple of cells (fewer cells than columns: the rest left empty) or a
    ``str``, printed as it is (a section title, a note). ``line`` needs the widths
    known (given, or :meth:`fit`), so a script can print rows as they are measured.
    """

    def __init__(self, *columns: Col, sep: str = "  ") -> None:
        self.columns = columns
        self.sep = sep

    def fit(self, rows: Iterable) -> Table:
        """The table with every unknown width set to its widest cell (or title)."""
        rows = [r for r in rows if not isinstance(r, str)]
        cols = [c if c.width is not None else
                replace(c, width=max([len(c.title), *(len(r[i]) for r in rows if len(r) > i)]))
                for i, c in enumerate(self.columns)]
        return Table(*cols, sep=self.sep)

    def line(self, *cells: str) -> str:
        out = ""
        for i, (col, cell) in enumerate(zip(self.columns, cells, strict=False)):
            gap = "" if i == 0 else self.sep if col.gap is None else col.gap
            out += f"{gap}{cell:{col.align}{col.width or ''}}"
        return out.rstrip()

    def note(self, first: str, text: str) -> str:
        """A row whose first cell is followed by free text (``skipped: why``)."""
        col = self.columns[0]
        return f"{first:{col.align}{col.width or ''}}{self.sep}{text}".rstrip()

    def head(self, rule: bool = False) -> str:
        title = self.line(*(c.title for c in self.columns))
        return f"{title}\n{'-' * len(title)}" if rule else title

    def render(self, rows: Sequence, rule: bool = False) -> str:
        t = self.fit(rows)
        return "\n".join([t.head(rule), *(r if isinstance(r, str) else t.line(*r) for r in rows)])

    def print(self, rows: Sequence, rule: bool = False) -> None:
        print(self.render(rows, rule))


class Report:
    """A suite's table: rows in sections (``## title``), a row skipped says why after
    its name, notes follow the table (``note: ...``)."""

    def __init__(self, *columns: Col, sep: str = "  ") -> None:
        self.table = Table(*columns, sep=sep)
        self.rows: list[tuple] = []  # ("row", cells) | ("skip", name, why) | ("section", title)
        self.notes: list[str] = []

    def section(self, title: str) -> None:
        self.rows.append(("section", title))

    def row(self, *cells: str) -> None:
        self.rows.append(("row", cells))

    def skip(self, name: str, why: str) -> None:
        self.rows.append(("skip", name, why))

    def print(self) -> None:
        t = self.table.fit(r[1] if r[0] == "row" else (r[1],) for r in self.rows
                           if r[0] != "section")
        print(t.head(rule=True))
        for kind, *rest in self.rows:
            print(f"\n## {rest[0]}" if kind == "section" else
                  t.note(*rest) if kind == "skip" else t.line(*rest[0]))
        for n in self.notes:
            print(f"note: {n}")


# -- machine-readable output ------------------------------------------------------------

def emit(**figures) -> None:
    """One JSON line on stdout: what a runner in a subprocess hands its parent."""
    print(json.dumps(figures), flush=True)


def last_json(stdout: str) -> dict | None:
    """The last JSON line a runner printed (:func:`emit`), or None."""
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def write_json(path: Path, obj, indent: int = 2) -> None:
    """``obj`` as sorted JSON into ``path``, atomically (temporary name, ``os.replace``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=indent, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# -- memory and the page cache (Linux /proc) --------------------------------------------

def _parents() -> dict[int, int]:
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    stat = f.read()
                out[int(d)] = int(stat[stat.rindex(b")") + 2:].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    kids: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        kids.setdefault(parent, []).append(child)
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(kids.get(p, ()))
    return tree


def _status_kb(path: str, key: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_anon_kb(pid: int) -> int:
    """A process's private resident memory (KiB; page cache and shared memory not in it)."""
    return _status_kb(f"/proc/{pid}/status", "RssAnon:") or 0


def tree_rss_anon_kb(pid: int) -> int:
    """RssAnon of ``pid`` and all its descendants (KiB)."""
    return sum(rss_anon_kb(p) for p in process_tree(pid))


def tree_pss_bytes(pid: int) -> int:
    """The summed PSS of ``pid`` and its descendants (shared pages counted once; VmRSS
    where there is no smaps_rollup), in bytes."""
    total = 0
    for p in process_tree(pid):
        kb = _status_kb(f"/proc/{p}/smaps_rollup", "Pss:")
        total += (kb if kb is not None else _status_kb(f"/proc/{p}/status", "VmRSS:") or 0) << 10
    return total


def shmem_kb() -> int:
    """The machine's shared memory (``Shmem`` of /proc/meminfo, KiB)."""
    return _status_kb("/proc/meminfo", "Shmem:") or 0


class Peak(threading.Thread):
    """The peaks of some figures, each read every ``interval`` seconds until :meth:`stop`
    (every 200 ms by default: a scan of /proc costs a few ms of a core the run shares)."""

    def __init__(self, interval: float = 0.2, **probes: Callable[[], float]) -> None:
        super().__init__(daemon=True)
        self.interval, self.probes = interval, probes
        self.peak = dict.fromkeys(probes, 0)
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            for name, probe in self.probes.items():
                self.peak[name] = max(self.peak[name], probe())

    def stop(self) -> dict[str, float]:
        self._done.set()
        self.join()
        return self.peak


# -- data -------------------------------------------------------------------------------

def image_folder(data: Path, count: int, classes: int = 20, name: str = "imagefolder-{n}",
                 **kwargs) -> Path:
    """An image folder of about ``count`` JPEGs (``classes`` subfolders) from
    :func:`scripts.synth.cached_image_folder`, kept under ``data`` as ``name``
    (``{n}``: the JPEGs it holds); ``kwargs`` go to the generator (sides, seed)."""
    from scripts.synth import cached_image_folder

    per_class = max(1, count // classes)
    return cached_image_folder(data / name.format(n=classes * per_class), classes, per_class,
                               **kwargs)


def folder_samples(root: Path) -> list[tuple[str, str, int]]:
    """``(path, "class/file", label)`` of an image folder, sorted (label = class index)."""
    root = Path(root)
    out = []
    for label, cls in enumerate(sorted(p.name for p in root.iterdir() if p.is_dir())):
        for f in sorted((root / cls).iterdir()):
            out.append((str(f), f"{cls}/{f.name}", label))
    return out


def link_folder(src: Path, dst: Path, *, per_class: int | None = None,
                copies: int | None = None) -> Path:
    """Hard links (same bytes, no copy) to an image folder's files, kept once made: the
    first ``per_class`` of every class, or ``copies`` links of each (``K-name``)."""
    if (dst / ".complete").exists():
        return dst
    shutil.rmtree(dst, ignore_errors=True)
    for cls in sorted(p for p in src.iterdir() if p.is_dir()):
        (dst / cls.name).mkdir(parents=True)
        for f in sorted(cls.iterdir())[:per_class]:
            for name in [f.name] if copies is None else [f"{k}-{f.name}" for k in range(copies)]:
                os.link(f, dst / cls.name / name)
    (dst / ".complete").touch()
    return dst


def packed_dataset(data: Path, count: int) -> Path:
    """:func:`image_folder`'s ``count`` JPEGs packed into shards once and kept under
    ``data`` (the reader benchmarks' data set)."""
    from packer import PackOptions, pack

    src = image_folder(data, count)
    path = data / f"packed-{src.name}"
    if not (path / "manifest.json").exists():
        pack(src, path, PackOptions(shard_size=64_000_000, overwrite=True))
    return path


def warm(*paths: Path | str) -> int:
    """Read every file (or every file under every folder) once: the page cache warm.
    Returns the bytes read."""
    total = 0
    for p in map(Path, paths):
        for f in [p] if p.is_file() else sorted(p.rglob("*")):
            if f.is_file():
                with open(f, "rb") as fh:
                    while chunk := fh.read(16 << 20):
                        total += len(chunk)
    return total


def copy_limit(paths: Sequence[Path | str], out: Path) -> int:
    """The copy limit: read every file and append it to one, one process, no fsync.
    Returns the bytes copied."""
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    total = 0
    try:
        for p in paths:
            f = os.open(p, os.O_RDONLY)
            try:
                data = os.read(f, os.fstat(f).st_size)
            finally:
                os.close(f)
            total += os.write(fd, data)
    finally:
        os.close(fd)
    return total


class Sink:
    """Copies every payload into one reused buffer (what a consumer of raw bytes pays),
    so every reader measured touches the same bytes; counts records and bytes.

    With ``copy=False`` it only counts them: what ``__getitem__`` itself costs (ours
    returns a zero-copy view, the peers return bytes they already copied).
    """

    def __init__(self, copy: bool = True) -> None:
        self.copy = copy
        self.view = memoryview(bytearray(8 << 20))
        self.records = 0
        self.bytes = 0

    def __call__(self, data) -> int:
        n = len(data)
        if self.copy:
            if n > len(self.view):
                self.view = memoryview(bytearray(n))
            self.view[:n] = data
        self.records += 1
        self.bytes += n
        return n


# -- the classification pipeline every reader benchmark runs ------------------------------

def rrc_flip(size: int = 224) -> list:
    """decode + RandomResizedCrop(size) + flip: the classification pipeline's transforms."""
    from reader.transforms import RandomHorizontalFlip, RandomResizedCrop

    return [RandomResizedCrop(size), RandomHorizontalFlip()]


def rrc_flip_decoder(size: int = 224):
    """Our decoder of the classification pipeline (:func:`rrc_flip`, fused):
    ``decode(jpeg, rng, out=None)`` fills ``out`` (default: one reused array) and returns it."""
    import numpy as np

    from reader.transforms import ImagePipeline
    from reader.transforms.decode import Decoder

    dec = Decoder(ImagePipeline(rrc_flip(size)))
    reused = np.empty((size, size, 3), np.uint8)

    def decode(data, rng, out=None):
        out = reused if out is None else out
        dec.decode_into(data, out, rng)
        return out

    return decode


def naive_rrc_flip(src, rng, size: int = 224):
    """What a torchvision user's pipeline does: full PIL decode, crop, bilinear resize,
    flip. ``src``: JPEG bytes or a path."""
    import io

    import numpy as np
    from PIL import Image

    from reader.transforms import RandomResizedCrop

    img = Image.open(io.BytesIO(src) if isinstance(src, bytes | bytearray | memoryview)
                     else src).convert("RGB")
    top, left, h, w = RandomResizedCrop(size).get_params(img.height, img.width, rng)
    img = img.resize((size, size), Image.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(img)
