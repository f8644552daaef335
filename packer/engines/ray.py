"""``--engine ray``: the driver lists once, Ray tasks pack ranges, the driver writes the manifest.

Protocol (the driver is :func:`pack_on_ray`, a task is :func:`_pack_range`):

1. The driver lists SRC and shuffles exactly as the local engine does, splits
   the listing into contiguous ranges of ``task_records`` records and readies
   DST (:func:`packer.engines.ranges.prepare`: cleared, or with ``--resume`` the ranges
   already done are kept).
2. Each missing range is one Ray task: it packs its slice of the listing with
   the local engine's loop (``run.pack_listing``, one process) into a scratch
   folder, publishes the shards under names derived from the range, writes the
   range's done-marker and returns its content. At most ``workers`` (default:
   the cluster's CPUs) tasks are in flight, so a huge listing is not shipped
   to the object store at once.
3. Tasks report records done to a :class:`_Tally` actor every 64 records; the
   driver polls it between ``ray.wait`` calls and feeds the caller's
   :class:`~packer.report.PackProgress`. Per range the highest count wins, so a
   retried range is not counted twice.
4. Ray retries a task whose worker died (``max_retries``) and one that raised
   ``OSError`` (``retry_exceptions``); a bad input (``PackInputError`` under
   ``--on-error fail``) or any other shardpack error is never retried: it fails
   the pack as the task raised it, naming the file.
5. With every range done, the driver writes ``skipped.jsonl``, then the
   manifest (last), then deletes ``.ray/``.

The records, their order and their bytes equal a local pack's with the same
options; shard boundaries differ (each range starts new shards), which is why
``engine`` and ``task_records`` are in the manifest's options. SRC (and a
folder DST) must be at the same path on every node: a shared filesystem; DST
may also be a URI (``s3://...``), which tasks upload to. Every node needs
shardpack installed (``pip install 'shardpack[ray]'``).

Test hook: ``SHARDPACK_TEST_RAY_KILL_ONCE=/path`` in the driver's environment
makes the first task to create ``/path`` (O_EXCL) kill its own worker halfway
through its range.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from formats.errors import InputError, ShardpackError
from formats.fields import IMAGE_TYPES, stored_image_type
from formats.shard import ownership
from formats.shard.manifest import MANIFEST_NAME, Manifest, manifest_bytes, read_manifest
from formats.storage import display_uri, is_uri

from ..errors import DestinationError, PackError, PackInterrupted, UsageError
from ..loop import pack_listing
from ..options import PackOptions
from ..plan import check_paths, created_by, listing_fingerprint, shuffle_order
from ..report import PackProgress, PackSummary
from ..resolve import check_source_options, detect_source, listing_options
from ..sources.folders import BUILTIN_SOURCES, Listing, list_source
from .ranges import Output, RangeResult, combine, marker_name, part_name, prepare, split

__all__ = ["MAX_RETRIES", "RangeJob", "drive", "import_ray", "pack_on_ray", "pack_range",
           "pack_samples_on_ray"]

MAX_RETRIES = 3
_KILL_ENV = "SHARDPACK_TEST_RAY_KILL_ONCE"
_POLL_SECONDS = 0.2


def import_ray():
    try:
        import ray
    except ImportError:
        raise ImportError("--engine ray needs Ray: pip install 'shardpack[ray]'") from None
    return ray


def _connect(ray, options: PackOptions) -> bool:
    """Join ``ray_address`` or start a cluster here, unless this process already
    has one; True when this call did (and so should disconnect at the end)."""
    if ray.is_initialized():
        return False
    # Task logs stay on the workers: the user's terminal holds the progress bar.
    quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
    if options.ray_address:
        try:
            ray.init(address=options.ray_address, **quiet)
        except ConnectionError as exc:
            raise UsageError(
                f"cannot join the Ray cluster at {options.ray_address} ({exc}); a cluster "
                "that requires token authentication (Ray >= 2.59) needs RAY_AUTH_MODE=token "
                "and its token (RAY_AUTH_TOKEN, or ~/.ray/auth_token) in this environment "
                "too") from None
    else:
        ray.init(num_cpus=options.workers or None, include_dashboard=False, **quiet)
    return True


# -- the task side ------------------------------------------------------------------------

@dataclass(frozen=True)
class RangeJob:
    """What every task of one pack shares."""

    src: str
    output: Output
    plan: str
    options: PackOptions  # the local engine's, for one range: no shuffle, no pool


class _Tally:
    """A Ray actor: records and bytes done per range, as its task last reported."""

    def __init__(self) -> None:
        self.done: dict[int, tuple[int, int]] = {}

    def report(self, start: int, records: int, nbytes: int) -> None:
        # A retry restarts its range at 0: keep the highest count, never go back.
        if records > self.done.get(start, (0, 0))[0]:
            self.done[start] = (records, nbytes)

    def poll(self, finished: list[int]) -> dict[int, tuple[int, int]]:
        for start in finished:
            self.done.pop(start, None)
        return dict(self.done)


class _RangeProgress(PackProgress):
    """The task's progress: sent to the tally (and the kill-once test hook)."""

    def __init__(self, tally, start: int, n: int, kill_once: str | None) -> None:
        # Not ``self.start``: that is PackProgress.start, which the pack loop calls.
        self.tally, self.first, self.n, self.kill_once = tally, start, n, kill_once
        self.records = self.nbytes = 0

    def advance(self, records: int, nbytes: int) -> None:
        self.records += records
        self.nbytes += nbytes
        self.tally.report.remote(self.first, self.records, self.nbytes)
        if self.kill_once and 2 * self.records >= self.n:
            marker, self.kill_once = self.kill_once, None
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
            os._exit(1)  # the test hook: a worker dying mid-range, once


def _pack_range(job: RangeJob, listing, start: int, tally,
                kill_once: str | None) -> RangeResult:
    """A Ray task: :func:`pack_range` reporting to the tally."""
    return pack_range(job, listing, start, _RangeProgress(tally, start, len(listing), kill_once))


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
            name = part_name(start, k)
            # Shard files never hold their own name, so a rename is all it takes;
            # the index goes last, as the local writer does.
            for file, suffix in ((entry.data_file, ".rec"), (entry.meta_file, ".meta.parquet"),
                                 (entry.index_file, ".idx")):
                out.publish(scratch / file, name + suffix)
            shards.append(replace(entry, name=name))
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


# -- the driver side ----------------------------------------------------------------------

def _slice(listing, a: int, b: int):
    if not isinstance(listing, Listing):
        return listing.slice(a, b)
    return replace(listing, paths=listing.paths[a:b], keys=listing.keys[a:b],
                   columns={k: v[a:b] for k, v in listing.columns.items()}, empty_classes=(),
                   problems={i - a: p for i, p in listing.problems.items() if a <= i < b},
                   members=None if listing.members is None else listing.members[a:b])


def _first_last(listing, a: int, b: int) -> str:
    if not isinstance(listing, Listing):
        return f"first {listing.name(a)}, last {listing.name(b - 1)}"
    return f"first file {listing.paths[a]}, last {listing.paths[b - 1]}"


def _result(ray, ref, listing, a: int, b: int, dst: str) -> RangeResult:
    """The task's result, or its failure as a shardpack error naming the file."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, (ShardpackError, OSError, ImportError)):
            raise cause from None  # as the task raised it: names the file and the reason
        raise PackError(f"packing records {a}..{b - 1} failed ({type(cause).__name__}: "
                        f"{cause}); {_first_last(listing, a, b)}",
                        path=display_uri(dst)) from None
    except ray.exceptions.TaskCancelledError:
        raise KeyboardInterrupt from None
    except ray.exceptions.RayError as exc:  # the worker or its node died, every try
        raise PackError(f"packing records {a}..{b - 1} failed for good after "
                        f"{MAX_RETRIES + 1} tries ({type(exc).__name__}: a worker or node "
                        f"died); first file {listing.paths[a]}, last {listing.paths[b - 1]}",
                        path=display_uri(dst)) from None


def _run(ray, job: RangeJob, listing, todo: list[tuple[int, int]], window: int,
         progress: PackProgress, results: dict[int, RangeResult]) -> None:
    """Run a task per range of ``todo``, ``window`` at a time, into ``results``."""
    task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES,
                      retry_exceptions=[OSError])(_pack_range)
    tally = ray.remote(num_cpus=0)(_Tally).remote()
    kill_once = os.environ.get(_KILL_ENV) or None
    queue = list(reversed(todo))
    running: dict = {}
    shown: dict[int, tuple[int, int]] = {}  # per range: records, bytes on the bar

    def show(start: int, records: int, nbytes: int) -> None:
        old_r, old_b = shown.get(start, (0, 0))
        if records > old_r:
            progress.advance(records - old_r, max(0, nbytes - old_b))
            shown[start] = (records, nbytes)

    # Never block on the tally: its process takes a second to start, which a
    # short pack need not wait for (tasks' reports queue up meanwhile).
    poll, finished = None, []
    try:
        while queue or running:
            while queue and len(running) < window:
                a, b = queue.pop()
                running[task.remote(job, _slice(listing, a, b), a, tally, kill_once)] = (a, b)
            ready, _ = ray.wait(list(running), num_returns=1, timeout=_POLL_SECONDS)
            for ref in ready:
                a, b = running.pop(ref)
                result = results[a] = _result(ray, ref, listing, a, b, job.output.dst)
                finished.append(a)
                show(a, b - a, result.bytes_in)
            if poll is not None and ray.wait([poll], timeout=0)[0]:
                for a, (records, nbytes) in ray.get(poll).items():
                    if a not in results:
                        show(a, records, nbytes)
                poll = None
            if poll is None:
                poll, finished = tally.poll.remote(finished), []
    finally:
        for ref in running:  # a failure or Ctrl-C: finished ranges stay for --resume
            ray.cancel(ref)
        ray.kill(tally)


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


def _check(src: Path | None, dst: str, options: PackOptions) -> None:
    """``src`` is None for a source on object storage."""
    if options.sink != "shards":
        raise UsageError(f"--engine ray writes --to shards only, not {options.sink!r}; "
                         "use --engine local")
    if not is_uri(dst):  # what a local DST holds: claimed by packer.run before this
        check_paths(src, Path(dst))
        return
    if src is not None and not src.exists():
        raise InputError("SRC does not exist", path=src)
    if Output(dst).location.exists(MANIFEST_NAME) and not options.overwrite:
        raise DestinationError("DST is already a dataset; pass --overwrite to replace it",
                               path=display_uri(dst))


def pack_on_ray(src: str | Path, dst: str | Path, options: PackOptions,
                progress: PackProgress) -> PackSummary:
    """Pack SRC into DST with Ray tasks (``options.engine == "ray"``; see module docstring).

    Arguments, result and errors as :func:`packer.pack`, and:

    Raises:
        UsageError: a source other than a folder or a file list, or ``--to``
            other than shards.
        ImportError: Ray is not installed (with the install hint).
        PackError: a range whose worker kept dying (names its first and last file).
    """
    remote = is_uri(src)
    # A path is made absolute: tasks run in other folders, maybe on other nodes.
    src_path = None if remote else Path(os.path.abspath(src))
    dst_text = str(dst) if is_uri(dst) else os.path.abspath(dst)
    _check(src_path, dst_text, options)
    ray = import_ray()  # before the listing, which may take long on a big source
    if remote:
        from ..remote import open_remote_source

        # Listed remotely, every task reads its objects through the listing's Location;
        # a container is told by its names and refused below, before a byte is fetched.
        kind, listing, _ = open_remote_source(str(src), options, copy=False)
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
                        path=display_uri(src))
    if options.shuffle:  # the local engine's order, record for record
        listing.reorder(shuffle_order(n, options.seed))
    summary = PackSummary(display_uri(src), display_uri(dst), kind, "shards")
    summary.empty_classes = listing.empty_classes
    summary.boxes_clipped = listing.boxes_clipped
    summary.image_type = next((f.type for f in listing.fields if f.type in IMAGE_TYPES), None)
    made = created_by(summary.source, summary.src, options)
    return drive(_on_ray(ray, options), str(src), listing, dst_text,
                 listing_fingerprint(listing, options), made, options, progress, summary)


def pack_samples_on_ray(fn, inputs, dst: str | Path, fields, options: PackOptions,
                        progress: PackProgress, summary: PackSummary) -> PackSummary:
    """:func:`packer.pack_samples` with Ray tasks: the driver settles the schema (inferring
    it here from the first inputs), each task packs ``task_records`` consecutive inputs
    with the local loop into its own shards, the driver writes the manifest.

    Raises:
        ImportError: Ray is not installed (with the install hint).
    """
    from ..samples import SampleRange, made_by, plan_samples

    dst_text = str(dst) if is_uri(dst) else os.path.abspath(dst)
    _check(None, dst_text, options)
    ray = import_ray()
    plan = plan_samples(fn, inputs, fields, options)
    summary.per_box_fields = plan.per_box
    part = SampleRange(fn, inputs, 0, plan.fields, plan.fingerprint)
    return drive(_on_ray(ray, options), summary.src, part, dst_text, plan.fingerprint,
                 made_by(fn, plan.fields, options), options, progress, summary)


def _on_ray(ray, options: PackOptions):
    """Runs ranges as Ray tasks (steps 2-4), joining or starting a cluster first."""

    def run(job: RangeJob, listing, todo, progress: PackProgress, results: dict) -> None:
        started = _connect(ray, options)
        try:
            window = options.workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
            _run(ray, job, listing, todo, window, progress, results)
        finally:
            if started:
                ray.shutdown()  # disconnects; a cluster we joined keeps running

    return run


def drive(run_ranges, src: str, listing, dst_text: str, plan: str, made: dict,
          options: PackOptions, progress: PackProgress, summary: PackSummary,
          range_records: int | None = None) -> PackSummary:
    """Pack the missing ranges of ``listing`` (a Listing or a SampleRange) with
    ``run_ranges(job, listing, todo, progress, results)`` (Ray tasks, or local worker
    processes) and finish DST (the protocol in the module docstring, steps 1-5).
    ``range_records``: records per range (default ``options.range_records``)."""
    n = len(listing)
    ranges = split(n, range_records or options.range_records)
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
    """``skipped.jsonl``, then the manifest (last), then drop ``.ray/``."""
    shards, skips, _ = combine(results)
    if skips:
        output.write_bytes(ownership.SKIPPED_NAME, "".join(skips).encode("utf-8"))
    max_raw: dict[str, int] = {}
    for r in results:
        for k, v in r.max_raw_size.items():
            max_raw[k] = max(max_raw.get(k, 0), v)
    fields = []
    for f in listing.fields:  # an image field is typed by what every range stored
        if f.type in IMAGE_TYPES:
            seen = {r.field_types.get(f.name, f.type) for r in results if r.records_written}
            f = replace(f, type=stored_image_type(seen)) if seen else f
        fields.append(f)
    manifest = Manifest(fields=tuple(fields), shards=tuple(shards),
                        alignment=results[0].alignment, classes=listing.classes,
                        class_info=listing.class_info,
                        created_by=made,
                        max_raw_size=max_raw)
    output.write_bytes(MANIFEST_NAME, manifest_bytes(manifest))
    output.sync()
    summary.image_type = next((f.type for f in fields if f.type in IMAGE_TYPES), None)
    summary.complete = True
    output.remove_state()
