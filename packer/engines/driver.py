"""The range driver: a pack cut into ranges, each packed on its own, finished by one manifest.

Protocol (:func:`drive`; a range is packed by :func:`pack_range`):

1. The caller lists SRC (and shuffles it) or plans a function's inputs; the
   driver splits them into contiguous ranges of ``range_records`` records and
   readies DST (:func:`packer.engines.ranges.prepare`: cleared, or with
   ``--resume`` the ranges already done are kept).
2. Each missing range is one task: it packs its slice with the local engine's
   loop (:func:`packer.loop.pack_listing`, or a function's inputs through
   :meth:`packer.samples.SampleRange.pack`), one process, into a scratch
   folder, publishes the shards under names derived from the range, writes the
   range's done-marker and returns its content. The tasks run wherever the
   caller's ``run_ranges`` puts them: local worker processes
   (:mod:`packer.engines.local`) or Ray tasks (:mod:`packer.engines.ray`, whose
   module docstring says how progress and retries work there).
3. With every range done, the driver writes ``skipped.jsonl``, then the
   manifest (last), then deletes the ranges' state folder.

The records, their order and their bytes equal a one-process pack's with the
same options; shard boundaries differ (each range starts new shards), which is
why ``engine`` and ``task_records`` are in the manifest's options.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from dataclasses import dataclass, replace

from formats.fields import IMAGE_TYPES
from formats.shard import ownership
from formats.shard.manifest import build_manifest, manifest_files, read_manifest

from ..errors import PackInterrupted
from ..loop import pack_listing
from ..options import PackOptions
from ..report import PackProgress, PackSummary
from ..sources.listing import Listing
from ..work_names import marker_name, part_name
from .ranges import Output, RangeResult, prepare, split

__all__ = ["RangeJob", "drive", "pack_range"]


@dataclass(frozen=True)
class RangeJob:
    """What every task of one pack shares."""

    src: str
    output: Output
    plan: str
    options: PackOptions  # the local engine's, for one range: no shuffle, no pool


def pack_range(job: RangeJob, listing, start: int, progress: PackProgress) -> RangeResult:
    """Pack records ``[start, start + len(listing))`` and publish them (a task, on Ray
    or in a local worker process). ``listing``: a :class:`Listing` slice, or a range
    of a function's inputs (a :class:`packer.samples.SampleRange`, which packs itself)."""
    out = job.output
    scratch = out.scratch(start)
    try:
        summary = PackSummary(job.src, str(scratch), listing.kind, "shards")
        if isinstance(listing, Listing):
            pack_listing(listing, scratch, job.options, progress, summary)
        else:  # a range of a function's inputs (packer.samples.SampleRange)
            listing.pack(scratch, job.options, progress, summary)
        manifest = read_manifest(scratch)
        skip_file = scratch / ownership.SKIPPED_NAME
        skips = skip_file.read_text("utf-8").splitlines(keepends=True) \
            if skip_file.exists() else []
        shards = []
        for k, entry in enumerate(manifest.shards):
            renamed = replace(entry, name=part_name(start, k))
            # Shard files never hold their own name, so a rename is all it takes;
            # the index goes last, as the local writer does.
            for old, new in ((entry.data_file, renamed.data_file),
                             (entry.meta_file, renamed.meta_file),
                             (entry.index_file, renamed.index_file)):
                out.publish(scratch / old, new)
            shards.append(renamed)
        out.sync()
        result = RangeResult(start, start + len(listing), job.plan, shards, skips,
                             dict(summary.skipped), summary.records_written, summary.bytes_in,
                             manifest.alignment, dict(manifest.max_raw_size),
                             {f.name: f.type for f in manifest.fields})
        out.write_bytes(marker_name(result.start, result.stop),
                        json.dumps(result.to_json(), sort_keys=True).encode())
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _count(summary: PackSummary, results: list[RangeResult], resumed: int) -> None:
    summary.records_written = sum(r.records_written for r in results)
    summary.skipped = Counter()
    for r in results:
        summary.skipped.update(r.skipped)
    summary.records_in = summary.records_written + summary.records_skipped
    summary.bytes_in = sum(r.bytes_in for r in results)
    summary.shards = sum(len(r.shards) for r in results)
    summary.bytes_out = sum(s.data_bytes + s.index_bytes + s.meta_bytes
                            for r in results for s in r.shards)
    summary.resumed_records = resumed


def drive(run_ranges, src: str, listing, dst_text: str, plan: str, made: dict,
          options: PackOptions, progress: PackProgress, summary: PackSummary) -> PackSummary:
    """Pack the missing ranges of ``listing`` (a Listing or a SampleRange) with
    ``run_ranges(job, listing, todo, progress, results)`` (Ray tasks, or local worker
    processes) and finish DST (the protocol in the module docstring), in ranges of
    ``options.range_records`` records."""
    n = len(listing)
    ranges = split(n, options.range_records)
    output = Output(dst_text, options.durable)
    # A function's input may give several samples (or none): its counts are samples.
    results = prepare(output, plan, ranges, options.resume,
                      per_input=isinstance(listing, Listing))
    resumed = sum(r.records_written for r in results.values())
    todo = [r for r in ranges if r[0] not in results]
    task_options = replace(options, shuffle=False, resume=False, overwrite=False, workers=0,
                           engine="local", ray_address=None, task_records=None)
    job = RangeJob(src, output, plan, task_options)
    t0 = time.perf_counter()
    try:
        progress.start(n, sum(r.stop - r.start for r in results.values()))
        if todo:  # a resume with every range done needs no cluster
            run_ranges(job, listing, todo, progress, results)
        _finish(output, listing, summary, made, list(results.values()))
    except KeyboardInterrupt:
        raise PackInterrupted(summary) from None
    finally:
        _count(summary, list(results.values()), resumed)
        summary.seconds = time.perf_counter() - t0
        progress.close()
    return summary


def _finish(output: Output, listing, summary: PackSummary, made: dict,
            results: list[RangeResult]) -> None:
    """``skipped.jsonl``, then the manifest (last), then drop the ranges' state."""
    results = sorted(results, key=lambda r: r.start)  # their shards and skips in order
    skips = [line for r in results for line in r.skips]
    if skips:
        output.write_bytes(ownership.SKIPPED_NAME, "".join(skips).encode("utf-8"))
    parts = [r.written(listing.fields) for r in results]
    manifest = build_manifest(listing.fields, parts, classes=listing.classes,
                              class_info=listing.class_info, created_by=made)
    for name, data in manifest_files(manifest):  # the manifest last, each on disk in turn
        output.write_bytes(name, data)
        output.sync()
    summary.image_type = next((f.type for f in manifest.fields if f.type in IMAGE_TYPES), None)
    summary.complete = True
    output.remove_state()
