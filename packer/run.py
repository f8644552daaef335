"""``pack()``: resolve SRC, claim DST, decide the plan, run the one pack loop.

Every source goes through the same steps (:mod:`packer.plan` decides,
:mod:`packer.loop` writes): a listing of files or a container source's records
become items in the plan's order, each image payload is checked and re-encoded the
same way, ``--on-error`` is applied to bad items in one place, and a ``--resume``
must match the plan's fingerprint. ``--shuffle`` for a container source: our
shards are read in the shuffled order directly (random access); the others are
first copied as they come into a hidden dataset inside the output folder
(``.shardpack-shuffle``, kept for a resume once complete), which is then read in
the shuffled order.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from pathlib import Path

from formats import DatasetWriter, open_shards
from formats.base import Record
from formats.errors import InputUsageError
from formats.fields import IMAGE_TYPES
from formats.shard.manifest import MANIFEST_NAME
from formats.storage import Place, place

from .destination import claimed
from .engines.driver import drive
from .engines.ray import check_destination, import_ray, on_ray
from .errors import PackError, PackInterrupted, UsageError
from .loop import open_writer, pack_listing, record_items, resume_point, write_items
from .options import PackOptions
from .plan import (
    check_paths,
    created_by,
    listing_fingerprint,
    pattern_files,
    shuffle_order,
    source_fingerprint,
    work_options,
)
from .report import PackProgress, PackSummary
from .resolve import (
    BUILTIN_SOURCES,
    check_names,
    check_source_options,
    detect_source,
    list_source,
    listing_options,
    open_source,
)
from .sources.listing import Listing
from .work_names import SHUFFLE_PASS

__all__ = ["pack"]


def pack(src: str | os.PathLike | Place, dst: str | os.PathLike | Place,
         options: PackOptions | None = None, progress: PackProgress | None = None) -> PackSummary:
    """Pack SRC into DST.

    Args:
        src: an image folder, a folder of files, a file list, anything
            ``formats.codecs.registry`` reads, or a glob/brace pattern of such files.
        dst: the output folder, or an object-store URI.
        options: how to pack (defaults: ``PackOptions()``).
        progress: called as inputs are done (tqdm lives in the CLI, not here).

    Returns:
        The counters; ``complete`` is true once the output is complete.

    Raises:
        UsageError: options that contradict each other; nothing was written.
        DestinationError: DST cannot take the pack as it is; nothing was written.
        InputError: SRC is missing or not what the options say it is (an
            ``InputUsageError``); nothing was written.
        PackInputError: a bad input with ``on_error="fail"`` (names file, kind, reason).
        PackError: any other data problem (a file list that does not parse...).
        PackInterrupted: Ctrl-C; sealed shards are kept for ``resume``.
    """
    options = options or PackOptions()
    progress = progress or PackProgress()
    if options.engine != "ray" and options.task_records is not None:
        raise UsageError("task_records (--task-records) cuts the ranges of engine='ray' "
                         "(--engine ray); a local pack has none")
    src, dst = place(src), place(dst)  # read once: below, only what they hold is asked
    check_names(options)
    check_source_options(options.source, options, remote=src.remote)
    if options.resume and options.sink != "shards":
        raise UsageError(f"--resume works for --to shards only, not {options.sink!r}")
    if dst.remote:
        if options.engine == "ray":  # the range driver, tasks on Ray (packer/engines/)
            from .remote import hold_remote_dst

            with hold_remote_dst(dst):
                return _pack_on_ray(src, dst, options, progress)
        from .remote import pack_to_remote

        return pack_to_remote(src.text, dst, options, progress, pack)
    dst_shown = dst.shown
    dst = Path(dst.text)
    if options.engine == "ray":
        check_paths(None if src.remote else Path(src.text), dst)
        return claimed(dst, options, lambda folder: _pack_on_ray(src, place(folder), options,
                                                                  progress))
    if src.remote:
        from .remote import open_remote_source

        check_paths(None, dst)
        kind, source, copy = open_remote_source(src.text, options)
        root = None if copy is None else copy.path
        check_source_options(kind, options, remote=True)
    else:
        copy, root = None, Path(src.text)
        pattern = pattern_files(root)
        check_paths(None if pattern else root, dst)
        kind = options.source or detect_source(pattern[0] if pattern else root)
        check_source_options(kind, options)
        if pattern and kind in BUILTIN_SOURCES:
            raise UsageError(f"--from {kind} reads one folder or list; a pattern (glob or "
                             "braces) names container files (tfrecord, webdataset, parquet)",
                             path=root)
        source = open_source(kind, root, options)
    if (options.max_side or options.to_jpeg) \
            and not any(f.type in IMAGE_TYPES for f in source.fields):
        raise InputUsageError("SRC has no image field: --max-side and --to-jpeg would "
                              "change nothing", path=src.shown)
    summary = PackSummary(src.shown, dst_shown, kind, options.sink)

    def run(folder: Path) -> PackSummary:
        t0 = time.perf_counter()
        try:
            if isinstance(source, Listing):
                pack_listing(source, folder, options, progress, summary)
            else:
                _pack_source(source, root, folder, options, progress, summary)
        except KeyboardInterrupt:
            raise PackInterrupted(summary) from None
        finally:
            summary.seconds = time.perf_counter() - t0
            progress.close()
        return summary

    try:
        return claimed(dst, options, run)
    finally:
        if copy is not None:  # the local copy of a remote container: kept for a rerun
            copy.release(delete=summary.complete)


def _pack_on_ray(src: Place, dst: Place, options: PackOptions,
                 progress: PackProgress) -> PackSummary:
    """Pack SRC into DST with the range driver, its ranges Ray tasks
    (``options.engine == "ray"``: :mod:`packer.engines.driver`, :mod:`packer.engines.ray`).

    Arguments, result and errors as :func:`pack`, and:

    Raises:
        UsageError: a source other than a listed one, or ``--to`` other than shards.
        ImportError: Ray is not installed (with the install hint).
        PackError: a range whose worker kept dying (names its first and last file).
    """
    remote = src.remote
    # A path is made absolute: tasks run in other folders, maybe on other nodes.
    src_path = None if remote else Path(os.path.abspath(src.text))
    dst_text = dst.text if dst.remote else os.path.abspath(dst.text)
    check_destination(src_path, dst_text, options)
    import_ray()  # before the listing, which may take long on a big source
    if remote:
        from .remote import open_remote_source

        # Listed remotely, every task reads its objects through the listing's Location;
        # a container is told by its names and refused below, before a byte is fetched.
        kind, listing, _ = open_remote_source(src.text, options, copy=False)
    else:
        kind = options.source or detect_source(src_path)
        listing = (list_source(kind, src_path, **listing_options(options))
                   if kind in BUILTIN_SOURCES else None)
    check_source_options(kind, options, remote=remote)
    if listing is None:
        raise UsageError(f"--engine ray packs {', '.join(BUILTIN_SOURCES)} sources, not "
                         f"{kind or 'a container file'!r}; pack it with --engine local")
    n = len(listing)
    if not n:
        raise PackError("SRC holds no input files (hidden files are ignored)",
                        path=src.shown)
    if options.shuffle:  # the local engine's order, record for record
        listing.reorder(shuffle_order(n, options.seed))
    summary = PackSummary(src.shown, dst.shown, kind, "shards")
    summary.empty_classes = listing.empty_classes
    summary.boxes_clipped = listing.boxes_clipped
    summary.image_type = next((f.type for f in listing.fields if f.type in IMAGE_TYPES), None)
    made = created_by(summary.source, summary.src, options)
    return drive(on_ray(options), src.text, listing, dst_text,
                 listing_fingerprint(listing, options), made, options, progress, summary)


def _pack_source(source, root: Path | None, dst: Path, options: PackOptions,
                 progress: PackProgress, summary: PackSummary) -> None:
    """Pack a container source's records (see the module docstring for ``--shuffle``)."""
    fields = tuple(source.fields)
    classes = None if source.classes is None else list(source.classes)
    total = len(source) if hasattr(source, "__len__") else None
    plan = source_fingerprint(root, summary.source, options)
    shards = options.sink == "shards"
    # The writer first: it clears what an earlier pack left (keeping, on a resume, a
    # complete first pass of the shuffle, which _shuffled then reuses).
    writer = open_writer(dst, fields, classes, options,
                         created_by(summary.source, summary.src, options),
                         getattr(source, "class_info", None))  # only our shards carry it
    start = (resume_point(writer, plan, dst) if shards else None) or {}
    if options.shuffle:
        try:
            source, total = _shuffled(source, root, summary.source, dst, options, plan)
        except BaseException:
            if shards:
                writer.abort()
            raise
    records = itertools.islice(iter(source), start.get("next", 0), None)
    items = record_items(records, fields, work_options(options), options.num_workers)
    write_items(items, writer, shards=shards, total=total, start=start, plan=plan, dst=dst,
                options=options, progress=progress, summary=summary)
    shutil.rmtree(dst / SHUFFLE_PASS, ignore_errors=True)


class _InOrder:
    """A shards dataset's records in a given order (random access: no second pass)."""

    def __init__(self, path: Path, order: list[int], fields, classes) -> None:
        self.ds = open_shards(path, check_crc=True)
        self.order, self.fields, self.classes = order, fields, classes
        meta = self.ds.metadata(["width", "height"])
        self._w = meta.column("width").to_pylist()
        self._h = meta.column("height").to_pylist()

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self):
        for i in self.order:
            meta = {} if self._w[i] is None else {"width": self._w[i], "height": self._h[i]}
            yield Record(self.ds[i], meta, f"record {i}")


def _shuffled(source, root: Path | None, kind: str, dst: Path, options: PackOptions,
              plan: str):
    """``source`` in the seeded shuffled order, and its length."""
    if kind == "shards" and root is not None and root.is_dir():
        n = len(source)
        return _InOrder(root, shuffle_order(n, options.seed), source.fields, source.classes), n
    # The first pass: the records as they come, into a hidden dataset of ours beside
    # the output; a resume reuses it when it is complete and of this plan (an
    # interrupted first pass is done again).
    scratch = dst / SHUFFLE_PASS
    done = (scratch / MANIFEST_NAME).exists() and \
        open_shards(scratch).manifest.created_by.get("plan") == plan
    if not done:
        shutil.rmtree(scratch, ignore_errors=True)
        with DatasetWriter(scratch, source.fields, shard_size=1 << 30,
                           classes=source.classes, created_by={"plan": plan},
                           durable=options.durable) as w:
            for rec in source:
                w.write(rec.fields, rec.meta)
    n = len(open_shards(scratch))
    return _InOrder(scratch, shuffle_order(n, options.seed), source.fields, source.classes), n
