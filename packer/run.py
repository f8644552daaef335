"""The pack loop: list, load in order (in parallel), write in order, resume exactly.

Invariants:

* Records are written in listing order (after the seeded shuffle) by this
  process alone, so the bytes written never depend on ``workers``.
* Each ``write`` carries a progress value ``{"next", "skipped", "bytes_in"}``;
  the writer stores the one that sealed each shard in its journal, so
  ``resume`` restarts at exactly the first input not in a sealed shard.
* The skip list is appended to ``.skipped.partial.jsonl`` as inputs are skipped
  (flushed each line); a resume keeps its first ``sum(skipped)`` lines. It is
  renamed to ``skipped.jsonl`` before the manifest is written, which is last.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from formats import DatasetWriter, Record, ownership
from formats.checksum import crc32c
from formats.errors import FormatError
from formats.files import fsync_dir
from formats.paths import expand_inputs
from formats.storage import display_uri, is_uri

from .destination import claim
from .errors import PackError, PackInputError, PackInterrupted, UsageError
from .listing import BUILTIN_SOURCES, Listing
from .options import PackOptions
from .report import PackProgress, PackSummary
from .resolve import check_names, detect_source, open_sink, open_source
from .work import WorkOptions, iter_loaded

__all__ = ["SKIPPED_NAME", "check_paths", "pack", "package_version"]

SKIPPED_NAME = ownership.SKIPPED_NAME
_PARTIAL = ownership.SKIPPED_PARTIAL_NAME
_ADVANCE_EVERY = 64


def package_version() -> str:
    try:
        from importlib.metadata import version

        return version("shardpack")
    except Exception:  # not installed: a source checkout
        return "0+unknown"


def check_paths(src: Path | None, dst: Path) -> None:
    """SRC exists and DST is a folder outside it (what DST holds is the claim's business:
    :mod:`packer.destination`)."""
    if src is not None and not src.exists():
        raise UsageError("SRC does not exist", path=src)
    if dst.exists() and not dst.is_dir():
        raise UsageError("DST exists and is not a folder", path=dst)
    rs, rd = (src or dst).resolve(), dst.resolve()
    if src is not None and src.is_dir() and (rd == rs or rs in rd.parents):
        raise UsageError("DST is inside SRC; it would pack itself", path=dst)


class _SkipLog:
    """``skipped.jsonl`` built up crash-safely (see module docstring)."""

    def __init__(self, dst: Path, keep: int) -> None:
        self.partial = dst / _PARTIAL
        self.final = dst / SKIPPED_NAME
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
        text = json.dumps(line, ensure_ascii=False, sort_keys=True)
        if kind == "bad-name":  # a name that is not UTF-8: escaped, so the file stays UTF-8
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


def pack(src: str | Path, dst: str | Path, options: PackOptions | None = None,
         progress: PackProgress | None = None) -> PackSummary:
    """Pack SRC into DST.

    Args:
        src: an image folder, a folder of files, a file list, or anything
            ``formats.registry`` reads.
        dst: the output folder.
        options: how to pack (defaults: ``PackOptions()``).
        progress: called as inputs are done (tqdm lives in the CLI, not here).

    Returns:
        The counters; ``complete`` is true once the manifest is written.

    Raises:
        UsageError: bad options or paths; nothing was written.
        PackInputError: a bad input with ``on_error="fail"`` (names file, kind, reason).
        PackError: any other data problem (a file list that does not parse...).
        PackInterrupted: Ctrl-C; sealed shards are kept for ``resume``.
    """
    options = options or PackOptions()
    progress = progress or PackProgress()
    check_names(options)
    if options.resume and options.sink != "shards":
        raise UsageError(f"--resume works for --to shards only, not {options.sink!r}")
    if is_uri(dst):
        if options.engine == "ray":  # its own driver (packer/ray_engine.py)
            from .ray_engine import pack_on_ray
            from .remote import hold_remote_dst

            with hold_remote_dst(str(dst)):
                return pack_on_ray(src, dst, options, progress)
        from .remote import pack_to_remote

        return pack_to_remote(src, str(dst), options, progress, pack)
    dst = Path(dst)
    if options.engine == "ray":
        from .ray_engine import pack_on_ray

        check_paths(None if is_uri(src) else Path(src), dst)
        return _claimed(dst, options, lambda folder: pack_on_ray(src, folder, options, progress))
    if is_uri(src):
        from .remote import open_remote_source

        check_paths(None, dst)
        kind, source, copy = open_remote_source(str(src), options)
        root = None if copy is None else copy.path
    else:
        src, copy = Path(src), None
        pattern = _matches(src)
        check_paths(None if pattern else src, dst)
        kind = options.source or detect_source(pattern[0] if pattern else src)
        if pattern and kind in BUILTIN_SOURCES:
            raise UsageError(f"--from {kind} reads one folder or list; a pattern (glob or "
                             "braces) names container files (tfrecord, webdataset, parquet)",
                             path=src)
        source = open_source(kind, src, options)
        root = src
    summary = PackSummary(display_uri(src), display_uri(dst), kind, options.sink)

    def run(folder: Path) -> PackSummary:
        t0 = time.perf_counter()
        try:
            if isinstance(source, Listing):
                _pack_listing(source, folder, options, progress, summary)
            else:
                _pack_records(source, root, folder, options, progress, summary)
        except KeyboardInterrupt:
            raise PackInterrupted(summary) from None
        finally:
            summary.seconds = time.perf_counter() - t0
            progress.close()
        return summary

    try:
        return _claimed(dst, options, run)
    finally:
        if copy is not None:  # the local copy of a remote container: kept for a rerun
            copy.release(delete=summary.complete)


def _claimed(dst: Path, options: PackOptions, run) -> PackSummary:
    """``run(folder)`` on DST claimed as :mod:`packer.destination` describes ("claiming
    DST"): locked, refused if it holds what is not ours, staged when it replaces."""
    dest = claim(dst, options)
    try:
        summary = run(dest.folder)
        if summary.complete:
            dest.commit()
        summary.dst = display_uri(dst)
        return summary
    except BaseException:
        dest.abandon()
        raise
    finally:
        dest.release()


def _created_by(summary: PackSummary, options: PackOptions) -> dict:
    return {"tool": "pack-dataset", "version": package_version(),
            "source": {"kind": summary.source, "path": summary.src},
            "options": options.recorded()}


def _open_writer(dst, fields, classes, options, summary):
    if options.sink == "shards":
        return DatasetWriter(
            dst, fields, shard_size=options.shard_size,
            records_per_shard=options.records_per_shard, classes=classes,
            created_by=_created_by(summary, options), overwrite=options.overwrite,
            resume=options.resume, durable=options.durable)
    return open_sink(options.sink, dst, fields, classes, options)


def _plan(listing: Listing, options: PackOptions) -> str:
    """A fingerprint of the source (where it is, every key and column value) and of
    what decides the record order and bytes (on_error aside: resuming a failed pack
    with ``skip`` is the way past a bad file)."""
    opts = {k: v for k, v in options.recorded().items() if k != "on_error"}
    keys = crc32c("\n".join(listing.keys).encode("utf-8", "surrogateescape"))
    columns = crc32c(json.dumps(listing.columns, sort_keys=True, default=str).encode())
    where = str(listing.root) if listing.location is not None else os.path.abspath(listing.root)
    text = json.dumps([opts, listing.kind, where, len(listing), keys, columns], sort_keys=True)
    return f"{crc32c(text.encode()):08x}"


def _resume_point(writer: DatasetWriter, plan: str, dst: Path) -> dict | None:
    """The progress value of the last shard an interrupted run sealed (None: nothing
    to resume), once its plan is this pack's.

    Raises:
        PackError: the interrupted run packed another source or used other options.
    """
    if not writer.resumed:
        return None
    last = writer.resumed[-1]
    if not isinstance(last, dict) or last.get("plan") != plan:
        writer.abort()
        raise PackError("cannot resume: the interrupted run packed another source (other "
                        "place, files, sizes or times) or used other options (shuffle, seed, "
                        "max-side...); pack again without --resume", path=dst)
    return last


@contextmanager
def _writing(writer, shards: bool):
    """Our writer is closed explicitly (with a progress value); others by ``with``."""
    if not shards:
        with writer:
            yield
        return
    try:
        yield
    except BaseException:
        writer.abort()
        raise


def _pack_listing(listing: Listing, dst: Path, options: PackOptions, progress: PackProgress,
                  summary: PackSummary) -> None:
    n = len(listing)
    if not n:
        raise PackError("SRC holds no input files (hidden files are ignored)", path=listing.root)
    if options.shuffle:
        import numpy as np

        listing.reorder(np.random.default_rng(options.seed).permutation(n).tolist())
    summary.empty_classes = listing.empty_classes
    summary.image_type = listing.fields[0].type
    work = WorkOptions(listing.fields[0].type, options.max_side, options.quality, options.to_jpeg,
                       listing.location)
    shards = options.sink == "shards"
    writer = _open_writer(dst, listing.fields, listing.classes, options, summary)

    skipped: Counter = Counter()
    start = bytes_in = 0
    plan = _plan(listing, options)
    last = _resume_point(writer, plan, dst) if shards else None
    if last is not None:
        start, bytes_in = last["next"], last["bytes_in"]
        skipped.update(last["skipped"])
        summary.resumed_records = writer.records_written
    skips = _SkipLog(dst, sum(skipped.values())) if shards else None
    progress.start(n, start)

    paths, keys, problems = listing.paths, listing.keys, listing.problems
    columns = [(k, v) for k, v in listing.columns.items()]
    fail = options.on_error == "fail"
    todo = [p for i, p in enumerate(paths[start:], start) if i not in problems] if problems \
        else paths[start:]
    loaded = iter_loaded(todo, work, options.num_workers)
    write = writer.write if shards else None
    pending = pending_bytes = 0
    state = None
    try:
        with _writing(writer, shards):
            for i in range(start, n):
                if problems and i in problems:
                    kind, reason = problems[i]
                    size = 0
                else:
                    data, width, height, size, kind, reason = next(loaded)
                    bytes_in += size
                if kind is None:
                    record = {"image": data, "key": keys[i]}
                    for name, values in columns:
                        record[name] = values[i]
                    state = {"next": i + 1, "skipped": dict(skipped), "bytes_in": bytes_in,
                             "plan": plan}
                    meta = {"width": width, "height": height}
                    if write is not None:
                        write(record, meta, state)
                    else:
                        writer.write(Record(record, meta, keys[i]))
                else:
                    if fail:
                        raise PackInputError(reason, path=paths[i], kind=kind)
                    skipped[kind] += 1
                    if skips is not None:
                        skips.add(keys[i], kind, reason)
                pending += 1
                pending_bytes += size
                if pending == _ADVANCE_EVERY:
                    progress.advance(pending, pending_bytes)
                    pending = pending_bytes = 0
            progress.advance(pending, pending_bytes)
            if skips is not None:
                skips.finish(options.durable)
            if shards:
                final = {"next": n, "skipped": dict(skipped), "bytes_in": bytes_in, "plan": plan}
                _count_output(summary, dst, writer.close(final))
                summary.complete = True
    finally:
        loaded.close()
        if skips is not None:
            skips.close()
        summary.records_written = writer.records_written if shards else \
            (n - start) - sum(skipped.values())
        summary.skipped = skipped
        summary.records_in = summary.records_written + sum(skipped.values())
        summary.bytes_in = bytes_in
        if not summary.complete and shards:
            summary.shards = len(writer.sealed)
    if not shards:
        _count_output(summary, dst, None)
        summary.complete = True


def _count_output(summary: PackSummary, dst: Path, manifest) -> None:
    """Shards and bytes written: from the manifest, or the files a foreign sink made."""
    if manifest is not None:
        summary.shards = len(manifest.shards)
        summary.bytes_out = sum(s.data_bytes + s.index_bytes + s.meta_bytes for s in manifest.shards)
        return
    files = [p for p in Path(dst).rglob("*") if p.is_file()
             and not any(part.startswith(".") for part in p.relative_to(dst).parts)]
    summary.shards = len(files)
    summary.bytes_out = sum(p.stat().st_size for p in files)


def _matches(src: Path) -> list[Path] | None:
    """The files a SRC that does not exist names as a glob or brace pattern (None: not a
    pattern).

    Raises:
        UsageError: a pattern that matches no file.
    """
    text = str(src)
    if src.exists() or not (glob.has_magic(text) or re.search(r"\{[^{}]*[,.][^{}]*\}", text)):
        return None
    try:
        return expand_inputs(text, ("",))
    except FormatError:
        raise UsageError("SRC is a pattern (glob or braces) that matches no file; a pattern "
                         "names container files (tfrecord, webdataset, parquet), never "
                         "folders", path=src) from None


def _source_plan(root: Path | None, kind: str, options: PackOptions) -> str:
    """A fingerprint of a container source (every file's name, size and mtime) and of
    the options that shape the output: a resume of another source is refused."""
    files = []
    if root is not None:
        if root.is_file():
            paths, base = [root], root.parent
        elif root.is_dir():
            paths, base = sorted(p for p in root.rglob("*") if p.is_file()), root
        else:
            paths, base = _matches(root) or [], Path("/")
        for p in paths:
            st = p.stat()
            files.append([os.path.relpath(p, base), st.st_size, st.st_mtime_ns])
    opts = {k: v for k, v in options.recorded().items() if k != "on_error"}
    where = None if root is None else os.path.abspath(root)
    text = json.dumps([kind, opts, where, files], sort_keys=True)
    return f"{crc32c(text.encode()):08x}"


def _pack_records(source, root: Path | None, dst: Path, options: PackOptions,
                  progress: PackProgress, summary: PackSummary) -> None:
    """A registry Source: its records are already made; bad ones raise (no skip)."""
    import itertools

    fields = tuple(source.fields)
    classes = None if source.classes is None else list(source.classes)
    total = len(source) if hasattr(source, "__len__") else None
    writer = _open_writer(dst, fields, classes, options, summary)
    shards = options.sink == "shards"
    plan = _source_plan(root, summary.source, options) if shards else None
    last = _resume_point(writer, plan, dst) if shards else None
    start = 0 if last is None else last["next"]
    summary.resumed_records = start
    progress.start(total, start)
    count = start
    with _writing(writer, shards):
        for rec in itertools.islice(iter(source), start, None):
            count += 1
            size = sum(len(v) for v in rec.fields.values() if isinstance(v, (bytes, memoryview)))
            summary.bytes_in += size
            if shards:
                writer.write(rec.fields, rec.meta, {"next": count, "plan": plan})
            else:
                writer.write(rec)
            progress.advance(1, size)
        if shards:
            manifest = writer.close({"next": count, "plan": plan})
    _count_output(summary, dst, manifest if shards else None)
    summary.records_in = summary.records_written = count
    summary.complete = True
