"""The pack loop: one for every source, writing in order, resuming exactly.

Invariants:

* Inputs become :class:`Item` values in the plan's order, whatever the source: a
  listing's files are read and prepared by :func:`packer.work.iter_loaded`; a
  container source's records have each image payload prepared the same way
  (:func:`packer.work.prepare`: checked, re-encoded with ``--max-side``, converted
  with ``--to-jpeg``). Bad input comes back as an item with a skip kind, and
  ``--on-error`` is applied to it in one place, :func:`write_items`. A source of
  many small records may hand over a :class:`Run` of good ones instead (a
  function's checked samples): the same records, written column by column.
* Records are written by this process alone, so the bytes never depend on
  ``workers``.
* Each ``write`` carries a progress value ``{"next", "skipped", "bytes_in",
  "plan"}``; the writer stores the one that sealed each shard in its journal, so a
  resume restarts at exactly the first input not in a sealed shard, and refuses a
  plan that is not this pack's.
* The skip list is appended to ``.skipped.partial.jsonl`` as inputs are skipped
  (flushed each line); a resume keeps its first ``sum(skipped)`` lines. It is
  renamed to ``skipped.jsonl`` before the manifest is written, which is last.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from formats import DatasetWriter, Record
from formats.fields import IMAGE_TYPES
from formats.files import fsync_dir
from formats.shard import ownership

from .errors import PackError, PackInputError, _Bad
from .options import PackOptions
from .plan import created_by, listing_fingerprint, shuffle_order, work_options
from .report import PackProgress, PackSummary
from .resolve import open_sink
from .sources.anyfiles import MAX_FILE_BYTES, file_value
from .sources.listing import Listing
from .work import WorkOptions, iter_loaded, load, os_error, prepare, process_pool, read_file
from .work_names import WORK

__all__ = ["Item", "Run", "listing_items", "open_writer", "pack_listing", "record_items", "resume_point",
           "write_items"]

_ADVANCE_EVERY = 64


class Item(NamedTuple):
    """One input on its way to the writer.

    ``record`` (field -> value) and ``meta`` are None when the input is skipped;
    ``kind``/``reason`` then say why. ``name`` is what the skip list and errors call
    it (a key, or the source's record origin); ``path`` the file an error names.
    ``dropped``: skipped because the user asked (``--drop-empty``), not for being
    bad: listed and counted, but never failing the pack.
    """

    record: dict[str, Any] | None
    meta: dict[str, Any] | None
    name: str
    path: str
    nbytes: int
    kind: str | None = None
    reason: str | None = None
    dropped: bool = False


class Run(NamedTuple):
    """Consecutive good records given column by column (field -> one value per
    record): what a source making many small records hands the loop in place of an
    :class:`Item` each, so the writer works per run (:meth:`DatasetWriter.write_run`).

    ``nbytes``: each record's input bytes.
    """

    columns: dict[str, list]
    nbytes: list[int]


def listing_items(listing: Listing, start: int, work: WorkOptions, workers: int
                  ) -> Iterator[Item]:
    """The items of a listing from input ``start`` on (files read in order, maybe in
    worker processes)."""
    if listing.members is not None:
        yield from _member_items(listing, start, work)
        return
    paths, keys, problems = listing.paths, listing.keys, listing.problems
    columns = list(listing.columns.items())
    image = listing.fields[0].name
    todo = [p for i, p in enumerate(paths[start:], start) if i not in problems] if problems \
        else paths[start:]
    check, drops = listing.check, listing.drop_kinds
    loaded = iter_loaded(todo, work, workers)
    try:
        for i in range(start, len(paths)):
            if problems and i in problems:
                kind, reason = problems[i]
                yield Item(None, None, keys[i], paths[i], 0, kind, reason, kind in drops)
                continue
            got = next(loaded)
            record = {image: got.data, "key": keys[i]}
            for name, values in columns:
                record[name] = values[i]
            if got.kind is not None:
                reason = got.reason if check is None else f"{got.reason} ({check.where(record)})"
                yield Item(None, None, keys[i], paths[i], got.nbytes_in, got.kind, reason)
                continue
            size = (got.width, got.height)
            bad = None if check is None else check.fit(record, size, got.header or size)
            if bad is not None:
                yield Item(None, None, keys[i], paths[i], got.nbytes_in, *bad)
                continue
            yield Item(record, {"width": got.width, "height": got.height}, keys[i], paths[i],
                       got.nbytes_in)
    finally:
        loaded.close()


def _member_items(listing: Listing, start: int, work: WorkOptions) -> Iterator[Item]:
    """The items of a listing of any files (:mod:`packer.sources.anyfiles`): each record's
    files read here, images checked (and maybe re-encoded) like every image, the others
    parsed by their field's type."""
    fields = {f.name: f for f in listing.fields}
    columns = list(listing.columns.items())
    for i in range(start, len(listing)):
        key, members = listing.keys[i], listing.members[i]
        if i in listing.problems:
            kind, reason = listing.problems[i]
            yield Item(None, None, key, listing.paths[i], 0, kind, reason)
            continue
        record: dict[str, Any] = {}
        meta: dict[str, Any] = {}
        nbytes = 0
        bad = None
        for name, path in members:
            got = load(path, work) if fields[name].type in IMAGE_TYPES else None
            if got is not None:
                nbytes += got.nbytes_in
                if got.kind is not None:
                    bad = (path, got.kind, f"{os.path.basename(path)}: {got.reason}")
                    break
                record[name] = got.data
                if "width" not in meta:
                    meta = {"width": got.width, "height": got.height}
                continue
            try:
                data = read_file(path, MAX_FILE_BYTES)
                nbytes += len(data)
                record[name] = file_value(fields[name], data, path)
            except _Bad as exc:
                bad = (path, exc.kind, f"{os.path.basename(path)}: {exc.reason}")
                break
            except OSError as exc:
                failed = os_error(path, exc)
                bad = (path, failed.kind, f"{os.path.basename(path)}: {failed.reason}")
                break
        if bad is not None:
            yield Item(None, None, key, bad[0], nbytes, bad[1], bad[2])
            continue
        record["key"] = key
        for name, values in columns:
            record[name] = values[i]
        yield Item(record, meta, key, listing.paths[i], nbytes)


def _prepare_record(rec: Record, images: list[str], work: WorkOptions) -> Item:
    """One container record with each image payload checked (and maybe re-encoded)."""
    fields, meta = dict(rec.fields), dict(rec.meta)
    nbytes = sum(len(v) for v in fields.values() if isinstance(v, (bytes, bytearray, memoryview)))
    for name in images:
        data = fields[name]
        if not (type(data) is bytes or (isinstance(data, memoryview) and data.readonly)):
            data = bytes(data)  # a view that could change under us is copied; others not
        loaded = prepare(data, rec.origin, work)
        if loaded.kind is not None:
            return Item(None, None, rec.origin, rec.origin, nbytes, loaded.kind,
                        f"field {name!r}: {loaded.reason}")
        fields[name] = loaded.data
        if name == images[0]:  # the metadata table's size is the first image's
            meta["width"], meta["height"] = loaded.width, loaded.height
    return Item(fields, meta, rec.origin, rec.origin, nbytes)


def _prepare_chunk(args: tuple[list[Record], list[str], WorkOptions]) -> list[Item]:
    records, images, work = args
    return [_prepare_record(r, images, work) for r in records]


def record_items(records: Iterable[Record], fields, work: WorkOptions, workers: int,
                 chunk: int = 32) -> Iterator[Item]:
    """The items of a container source's records (already positioned at the resume
    point), image payloads prepared in order, in worker processes when the work is
    heavy (re-encoding) and ``workers`` allows."""
    images = [f.name for f in fields if f.type in IMAGE_TYPES]
    if not images:
        for rec in records:
            nbytes = sum(len(v) for v in rec.fields.values()
                         if isinstance(v, (bytes, bytearray, memoryview)))
            yield Item(dict(rec.fields), dict(rec.meta), rec.origin, rec.origin, nbytes)
        return
    if workers < 2 or not work.needs_processes:
        for rec in records:
            yield _prepare_record(rec, images, work)
        return
    import itertools

    def chunks():
        it = iter(records)
        while batch := list(itertools.islice(it, chunk)):
            # Records leave this process: views over a mapped file become bytes.
            yield ([Record({k: bytes(v) if isinstance(v, memoryview) else v
                            for k, v in r.fields.items()}, r.meta, r.origin) for r in batch],
                   images, work)

    with process_pool(workers) as pool:
        for items in pool.imap(_prepare_chunk, chunks()):
            yield from items


class _SkipLog:
    """``skipped.jsonl`` built up crash-safely (see module docstring)."""

    def __init__(self, dst: Path, keep: int) -> None:
        self.partial = dst / ownership.SKIPPED_PARTIAL_NAME
        self.final = dst / ownership.SKIPPED_NAME
        lines: list[str] = []
        if keep:
            for p in (self.partial, self.final):
                if p.exists():
                    lines = p.read_text("utf-8").splitlines(keepends=True)[:keep]
                    break
            if len(lines) != keep:
                raise PackError("cannot resume: the skip list of the interrupted run is missing "
                                "lines; pack again without --resume", path=self.partial,
                                found=len(lines), expected=keep)
        self.final.unlink(missing_ok=True)
        self.partial.unlink(missing_ok=True)
        self.count = len(lines)
        self._f = None
        if lines:
            self._open().writelines(lines)
            self._f.flush()

    def _open(self):
        if self._f is None:
            self._f = open(self.partial, "a", encoding="utf-8")  # noqa: SIM115
        return self._f

    def add(self, key: str, kind: str, reason: str) -> None:
        f = self._open()
        line = {"kind": kind, "path": key, "reason": reason}
        try:
            text = json.dumps(line, ensure_ascii=False, sort_keys=True)
            text.encode("utf-8")
        except UnicodeEncodeError:  # a name that is not UTF-8: escaped, the file stays UTF-8
            text = json.dumps(line, sort_keys=True)
        f.write(text + "\n")
        f.flush()  # a SIGKILL must not lose a line the next seal counts
        self.count += 1

    def finish(self, durable: bool) -> None:
        if self._f is None:
            return
        if durable:
            os.fsync(self._f.fileno())
        self._f.close()
        self._f = None
        os.replace(self.partial, self.final)
        if durable:
            fsync_dir(self.final.parent)

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def resume_point(writer, plan: str, dst: Path) -> dict | None:
    """The progress value of the last shard an interrupted run sealed (None: nothing
    to resume), once its plan is this pack's.

    Raises:
        PackError: the interrupted run packed another source or used other options.
    """
    if not writer.resumed:
        return None
    last = writer.resumed[-1]
    if not isinstance(last, dict) or last.get("plan") != plan or "skipped" not in last:
        writer.abort()
        raise PackError("cannot resume: the interrupted run packed another source (other "
                        "place, files, sizes or times) or used other options (shuffle, seed, "
                        "max-side...); pack again without --resume", path=dst)
    return last


def write_items(items: Iterator[Item | Run], writer, *, shards: bool, total: int | None,
                start: dict, plan: str, dst: Path, options: PackOptions,
                progress: PackProgress, summary: PackSummary) -> None:
    """Write every item in order, applying ``--on-error`` to the bad ones; complete
    the output (the manifest last) when they are all done.

    Args:
        writer: our :class:`formats.DatasetWriter` (``shards``) or a foreign sink
            (a context manager, entered here).
        total: the number of inputs, when known (progress only).
        start: where a resume starts (``next``, ``skipped``, ``bytes_in``).
        plan: the pack's fingerprint, stored with every sealed shard.
    """
    skipped: Counter = Counter(start.get("skipped") or {})
    n, bytes_in = start.get("next", 0), start.get("bytes_in", 0)
    written = writer.records_written if shards else 0
    summary.resumed_records = written
    skips = _SkipLog(dst, sum(skipped.values())) if shards else None
    progress.start(total, n)
    fail = options.on_error == "fail"
    pending = pending_bytes = 0
    try:
        with _writing(writer, shards) as write:
            for item in items:
                if type(item) is Run:
                    k = len(item.nbytes)
                    if shards:
                        writer.write_run(item.columns, None, _run_state(item, n, skipped,
                                                                        bytes_in, plan))
                    else:
                        for record in _records(item):
                            write(record, None)
                    n += k
                    written += k
                    size = sum(item.nbytes)
                    bytes_in += size
                    pending += k
                    pending_bytes += size
                    if pending >= _ADVANCE_EVERY:
                        progress.advance(pending, pending_bytes)
                        pending = pending_bytes = 0
                    continue
                n += 1
                bytes_in += item.nbytes
                if item.kind is None:
                    # The progress value: our writer stores it; a foreign sink has no use.
                    write(item, _state(n, skipped, bytes_in, plan) if shards else None)
                    written += 1
                else:
                    if fail and not item.dropped:
                        raise PackInputError(item.reason, path=item.path, kind=item.kind)
                    skipped[item.kind] += 1
                    if skips is not None:
                        skips.add(item.name, item.kind, item.reason)
                pending += 1
                pending_bytes += item.nbytes
                if pending >= _ADVANCE_EVERY:
                    progress.advance(pending, pending_bytes)
                    pending = pending_bytes = 0
            progress.advance(pending, pending_bytes)
            if skips is not None:
                skips.finish(options.durable)
            if shards:
                final = _state(n, skipped, bytes_in, plan)
                manifest = writer.close(final)
                summary.shards = len(manifest.shards)
                summary.bytes_out = sum(s.data_bytes + s.index_bytes + s.meta_bytes
                                        for s in manifest.shards)
                summary.image_type = _image_type(manifest.fields, summary.image_type)
        if not shards:  # the sink completed its files on leaving the with block
            _count_files(summary, dst)
        summary.complete = True
    finally:
        if skips is not None:
            skips.close()
        summary.skipped = skipped
        summary.records_written = written
        summary.records_in = written + sum(skipped.values())
        summary.bytes_in = bytes_in
        if not summary.complete and shards:
            summary.shards = len(writer.sealed)


def _state(n: int, skipped: Counter, bytes_in: int, plan: str) -> dict:
    """The progress value stored with a shard this record may seal (see the module
    docstring)."""
    return {"next": n, "skipped": dict(skipped), "bytes_in": bytes_in, "plan": plan}


def _run_state(run: Run, n: int, skipped: Counter, bytes_in: int, plan: str
               ) -> Callable[[int], dict]:
    """The progress value after the run's first ``k`` records (as :func:`_state`),
    for the writer to ask when one of them seals a shard."""
    cumulative: list[int] = []  # made once, at the first seal: a run may seal many times

    def state(k: int) -> dict:
        if not cumulative:
            cumulative.extend(itertools.accumulate(run.nbytes))
        return _state(n + k, skipped, bytes_in + cumulative[k - 1], plan)
    return state


def _records(run: Run) -> Iterator[Item]:
    """A run's records one by one (for the sinks that take records)."""
    names = list(run.columns)
    for j, values in enumerate(zip(*run.columns.values(), strict=True)):
        yield Item(dict(zip(names, values, strict=True)), None, "", "", run.nbytes[j])


@contextmanager
def _writing(writer, shards: bool):
    """``write(item, state)`` for our writer (closed explicitly, with a progress value;
    aborted on failure) or a foreign sink (closed by its own ``with``)."""
    if not shards:
        with writer as sink:
            yield lambda item, state: sink.write(Record(item.record, item.meta, item.name))
        return
    try:
        yield lambda item, state: writer.write(item.record, item.meta, state)
    except BaseException:
        writer.abort()
        raise


def _image_type(fields, default: str | None) -> str | None:
    """The stored type of the first image field (the summary's "image field" line)."""
    return next((f.type for f in fields if f.type in IMAGE_TYPES), default)


def _count_files(summary: PackSummary, dst: Path) -> None:
    """Shards and bytes a foreign sink made (our hidden control files aside)."""
    files = [p for p in Path(dst).rglob("*") if p.is_file()
             and not any(part.startswith(".") for part in p.relative_to(dst).parts)]
    summary.shards = len(files)
    summary.bytes_out = sum(p.stat().st_size for p in files)


def open_writer(dst: Path, fields, classes, options: PackOptions, made: dict,
                class_info=None):
    """Our DatasetWriter for ``--to shards`` (resumable), else the registry's sink
    (which keeps the class names, not ``class_info``)."""
    if options.sink == "shards":
        return DatasetWriter(
            dst, fields, shard_size=options.shard_size,
            records_per_shard=options.records_per_shard, classes=classes, created_by=made,
            overwrite=options.overwrite, resume=options.resume, durable=options.durable,
            class_info=class_info, working=WORK)
    return open_sink(options.sink, dst, fields, classes, options)


def pack_listing(listing: Listing, dst: Path, options: PackOptions, progress: PackProgress,
                 summary: PackSummary) -> None:
    """Pack a listed source into the folder ``dst`` (the local engine; the Ray engine
    runs it on each range, without shuffle)."""
    n = len(listing)
    if not n:
        raise PackError("SRC holds no input files (hidden files are ignored)", path=listing.root)
    if options.shuffle:
        listing.reorder(shuffle_order(n, options.seed))
    summary.empty_classes = listing.empty_classes
    summary.boxes_clipped = listing.boxes_clipped
    summary.image_type = _image_type(listing.fields, None)
    shards = options.sink == "shards"
    writer = open_writer(dst, listing.fields, listing.classes, options,
                         created_by(summary.source, summary.src, options), listing.class_info)
    plan = listing_fingerprint(listing, options)
    start = (resume_point(writer, plan, dst) if shards else None) or {}
    items = listing_items(listing, start.get("next", 0),
                          work_options(options, listing.location), options.num_workers)
    write_items(items, writer, shards=shards, total=n, start=start, plan=plan, dst=dst,
                options=options, progress=progress, summary=summary)
