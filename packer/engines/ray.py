"""``--engine ray``: the range driver's tasks (:mod:`packer.engines.driver`) as Ray tasks.

Ray-only code lives here; nothing else imports Ray. The driver lists once (or plans
a function's inputs), then :func:`on_ray` runs the missing ranges:

1. It joins ``ray_address``, or starts a cluster in this process, unless one is
   already connected.
2. Each missing range is one Ray task (:func:`_pack_range`, which runs
   :func:`packer.engines.driver.pack_range`). At most ``workers`` (default: the
   cluster's CPUs) tasks are in flight, so a huge listing is not shipped to the
   object store at once.
3. Tasks report records done to a :class:`_Tally` actor every 64 records; the
   driver polls it between ``ray.wait`` calls and feeds the caller's
   :class:`~packer.report.PackProgress`. Per range the highest count wins, so a
   retried range is not counted twice.
4. Ray retries a task whose worker died (``max_retries``) and one that raised
   ``OSError`` (``retry_exceptions``); a bad input (``PackInputError`` under
   ``--on-error fail``) or any other shardpack error is never retried: it fails
   the pack as the task raised it, naming the file.

SRC (and a folder DST) must be at the same path on every node: a shared
filesystem; DST may also be a URI (``s3://...``), which tasks upload to. Every
node needs shardpack installed (``pip install 'shardpack[ray]'``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from formats.errors import InputError, ShardpackError
from formats.shard.manifest import MANIFEST_NAME
from formats.storage import display_uri, is_uri

from ..errors import DestinationError, PackError, UsageError
from ..options import PackOptions
from ..plan import check_paths
from ..report import PackProgress
from .driver import RangeJob, pack_range
from .ranges import Output, RangeResult

__all__ = ["MAX_RETRIES", "check_destination", "import_ray", "on_ray"]

MAX_RETRIES = 3
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
    """The task's progress, sent to the tally."""

    def __init__(self, tally, start: int, n: int) -> None:
        # Not ``self.start``: that is PackProgress.start, which the pack loop calls.
        self.tally, self.first, self.n = tally, start, n
        self.records = self.nbytes = 0

    def advance(self, records: int, nbytes: int) -> None:
        self.records += records
        self.nbytes += nbytes
        self.tally.report.remote(self.first, self.records, self.nbytes)


def _pack_range(job: RangeJob, listing, start: int, tally) -> RangeResult:
    """A Ray task: :func:`pack_range` reporting to the tally."""
    return pack_range(job, listing, start, _RangeProgress(tally, start, len(listing)))


# -- the driver side ----------------------------------------------------------------------

def _result(ray, ref, listing, a: int, b: int, dst: str) -> RangeResult:
    """The task's result, or its failure as a shardpack error naming the file."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, (ShardpackError, OSError, ImportError)):
            raise cause from None  # as the task raised it: names the file and the reason
        raise PackError(f"packing records {a}..{b - 1} failed ({type(cause).__name__}: "
                        f"{cause}); first {listing.name(a)}, last {listing.name(b - 1)}",
                        path=display_uri(dst)) from None
    except ray.exceptions.TaskCancelledError:
        raise KeyboardInterrupt from None
    except ray.exceptions.RayError as exc:  # the worker or its node died, every try
        raise PackError(f"packing records {a}..{b - 1} failed for good after "
                        f"{MAX_RETRIES + 1} tries ({type(exc).__name__}: a worker or node "
                        f"died); first {listing.name(a)}, last {listing.name(b - 1)}",
                        path=display_uri(dst)) from None


def _run(ray, job: RangeJob, listing, todo: list[tuple[int, int]], window: int,
         progress: PackProgress, results: dict[int, RangeResult]) -> None:
    """Run a task per range of ``todo``, ``window`` at a time, into ``results``."""
    task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES,
                      retry_exceptions=[OSError])(_pack_range)
    tally = ray.remote(num_cpus=0)(_Tally).remote()
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
                running[task.remote(job, listing.slice(a, b), a, tally)] = (a, b)
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


def check_destination(src: Path | None, dst: str, options: PackOptions) -> None:
    """What Ray tasks can write: ``--to shards``, into a local DST (claimed before
    this by :func:`packer.destination.claimed`) or one on object storage that is not
    a dataset already (unless ``overwrite``). ``src`` is None for a source on object
    storage.

    Raises:
        UsageError: a sink other than shards.
        InputError: SRC does not exist.
        DestinationError: DST cannot take the pack.
    """
    if options.sink != "shards":
        raise UsageError(f"--engine ray writes --to shards only, not {options.sink!r}; "
                         "use --engine local")
    if not is_uri(dst):  # what a local DST holds was claimed before this
        check_paths(src, Path(dst))
        return
    if src is not None and not src.exists():
        raise InputError("SRC does not exist", path=src)
    if Output(dst).location.exists(MANIFEST_NAME) and not options.overwrite:
        raise DestinationError("DST is already a dataset; pass --overwrite to replace it",
                               path=display_uri(dst))


def on_ray(options: PackOptions):
    """The ``run_ranges`` of :func:`packer.engines.driver.drive` that runs ranges as Ray
    tasks (the module docstring's steps), joining or starting a cluster first.

    Raises:
        ImportError: Ray is not installed (with the install hint).
    """
    ray = import_ray()

    def run(job: RangeJob, listing, todo, progress: PackProgress, results: dict) -> None:
        started = _connect(ray, options)
        try:
            window = options.workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
            _run(ray, job, listing, todo, window, progress, results)
        finally:
            if started:
                ray.shutdown()  # disconnects; a cluster we joined keeps running

    return run
