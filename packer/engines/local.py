"""The local engine of the range driver: ranges packed in forked worker processes.

Each worker packs whole ranges (:func:`packer.engines.driver.pack_range`) and
publishes its own shards, so records never cross a process boundary. At most
``workers`` ranges run at once; ``workers=0`` packs them one after another in
this process.
"""

from __future__ import annotations

from ..errors import PackError, PackInputError
from ..report import PackProgress
from ..work import process_pool
from .driver import pack_range

__all__ = ["LocalRanges"]


class LocalRanges:
    """Runs ranges in ``workers`` forked processes (or here, for 0), a bounded window
    of them at a time: the ``run_ranges`` of :func:`packer.engines.driver.drive`."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def __call__(self, job, part, todo, progress: PackProgress, results: dict) -> None:
        if self.workers == 0:
            for a, b in todo:
                results[a] = pack_range(job, part.slice(a, b), a, PackProgress())
                progress.advance(b - a, results[a].bytes_in)
            return
        from concurrent.futures import FIRST_COMPLETED, wait
        from concurrent.futures.process import BrokenProcessPool

        pool = process_pool(self.workers, executor=True)
        queue = list(reversed(todo))
        running: dict = {}
        clean = False
        # The bad input a failure names is the first in input order, whichever worker
        # met its own first: a range's failure waits for the ranges before it.
        failed: tuple[int, PackInputError] | None = None
        try:
            while (queue and failed is None) or any(
                    failed is None or a < failed[0] for a, _ in running.values()):
                while queue and failed is None and len(running) < self.workers:
                    a, b = queue.pop()
                    running[pool.submit(pack_range, job, part.slice(a, b), a,
                                        PackProgress())] = (a, b)
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    a, b = running.pop(future)
                    try:
                        results[a] = future.result()
                    except BrokenProcessPool:
                        raise PackError(
                            f"a worker process died while packing inputs {a}..{b - 1} (killed, "
                            "or out of memory?); resume=True keeps the ranges done") from None
                    except PackInputError as exc:
                        if failed is None or a < failed[0]:
                            failed = (a, exc)
                        continue
                    progress.advance(b - a, results[a].bytes_in)
            if failed is not None:
                raise failed[1]
            clean = True
        finally:
            if not clean:
                # A failure or Ctrl-C: stop the other ranges now (the executor has no
                # terminate; finished ranges stay for a resume).
                for p in list(getattr(pool, "_processes", {}).values()):
                    p.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
