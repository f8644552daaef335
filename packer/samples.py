"""``pack_samples(fn, inputs, dst)``: pack what a user's function makes of each input.

Protocol:

1. **Inference** (no ``schema``): the first inputs are run *raw* (samples as the
   function made them) until :data:`packer.schema.INFER_SAMPLES` dict samples are in,
   and :func:`packer.schema.infer_fields` reads exactly those, in input order.
2. **The writer** is opened with the schema (on a resume its journal must agree)
   and the resume point read: ``at = [input, sample]`` of the last sealed shard.
3. **Items**: every later input runs in a worker process (or here, ``workers=0``),
   which checks each sample against the schema (:func:`packer.schema.check_sample`)
   and returns :class:`packer.loop.Item` values in order; the raw results of step 1
   are checked here the same way. Tasks are contiguous input ranges, a bounded
   window of them in flight, results taken in input order: the bytes never depend
   on ``workers``.
4. **The pack loop** (:func:`packer.loop.write_items`) writes them, applying
   ``on_error`` in one place, exactly as for ``pack-dataset``.

An input whose function raises is one bad item (kind ``raised``; the samples it
yielded before are not written, and the reason says how many); a sample that does
not fit the schema is one bad item. Workers are forked: they inherit ``fn`` and the
inputs, and receive only ranges. ``fn`` must still pickle (the same function then
runs on platforms without fork and on Ray), which is checked before anything starts.
"""

from __future__ import annotations

import os
import pickle
import reprlib
import signal
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from formats.checksum import crc32c
from formats.fields import Field
from formats.storage import display_uri, is_uri
from formats.version import package_version

from .errors import PackError, PackInterrupted, UsageError
from .loop import Item, open_writer, resume_point, write_items
from .options import PackOptions, parse_size
from .plan import check_paths
from .report import PackProgress, PackSummary
from .schema import INFER_SAMPLES, Bad, check_sample, describe, infer_fields, parse_schema

__all__ = ["SOURCE_KIND", "SampleRange", "made_by", "pack_range", "pack_samples", "plan_samples"]

#: The summary's and the manifest's name for this source.
SOURCE_KIND = "function"
_TASK_SECONDS = 0.05  # a task's target duration: IPC amortized, the window stays balanced
_MAX_CHUNK = 1024
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60


def _name(i: int, x: Any, j: int | None = None) -> str:
    return f"input {i} ({_repr.repr(x)})" + ("" if j is None else f" sample {j}")


def _call(fn: Callable, x: Any) -> tuple[list | None, str | None]:
    """The samples ``fn(x)`` gives (one returned, or every one a generator yields), or
    why it raised (the exception and where, the samples given before)."""
    samples: list = []
    try:
        out = fn(x)
        if isinstance(out, Iterator) and not isinstance(out, dict):
            for s in out:
                samples.append(s)
        else:
            samples.append(out)
        return samples, None
    except Exception as exc:  # the user's code: any exception is this input's problem
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        said = f"{type(exc).__name__}: {exc}".rstrip(": ")
        before = f"; the {len(samples)} sample(s) it gave before are not written" if samples else ""
        return None, (f"the function raised {said} (at {os.path.basename(frame.filename)}:"
                      f"{frame.lineno} in {frame.name}){before}")


def _items(i: int, x: Any, samples: list | None, error: str | None, fields: tuple[Field, ...],
           max_bytes: int | None, offset: int = 0) -> list[Item]:
    """One input's items, each with where the source stands after it (``at``, in this
    range) and, when bad, its name (its index in the whole pack: ``offset`` + ``i``)."""
    if samples is None:
        name = _name(offset + i, x)
        return [Item(None, None, name, name, 0, "raised", error, at=(i + 1, 0))]
    out = []
    last = len(samples) - 1
    for j, s in enumerate(samples):
        at = (i + 1, 0) if j == last else (i, j + 1)
        try:
            record, nbytes = check_sample(s, fields, max_bytes, "")
        except Bad as bad:
            name = _name(offset + i, x, j if len(samples) > 1 else None)
            out.append(Item(None, None, name, name, 0, bad.kind, bad.reason, at=at))
            continue
        out.append(Item(record, None, "", "", nbytes, at=at))
    return out


# -- worker processes (forked: they inherit fn and the inputs) -------------------------

_WORKER: dict[str, Any] = {}


def _worker_init(fn: Callable, inputs: Sequence) -> None:
    # Ctrl-C goes to the whole process group: the parent alone handles it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER["fn"], _WORKER["inputs"] = fn, inputs


class _Done(NamedTuple):
    """A task's answer: raw ``(index, samples, error)`` triples, or checked items."""

    start: int
    stop: int
    raw: list | None
    items: list[Item] | None
    seconds: float


def _run(start: int, stop: int, fields: tuple[Field, ...] | None, max_bytes: int | None,
         fn: Callable | None = None, inputs: Sequence | None = None, offset: int = 0) -> _Done:
    """Run ``fn`` over ``inputs[start:stop]``: raw when ``fields`` is None, else checked."""
    t0 = time.perf_counter()
    fn = fn or _WORKER["fn"]
    inputs = _WORKER["inputs"] if inputs is None else inputs
    raw, items = ([], None) if fields is None else (None, [])
    for i in range(start, stop):
        x = inputs[i]
        samples, error = _call(fn, x)
        if raw is not None:
            raw.append((i, samples, error))
        else:
            items.extend(_items(i, x, samples, error, fields, max_bytes, offset))
    return _Done(start, stop, raw, items, time.perf_counter() - t0)


class _Runner:
    """Ranges of inputs through ``fn``, in order: in a process pool, or here."""

    def __init__(self, fn: Callable, inputs: Sequence, workers: int, offset: int = 0) -> None:
        self.fn, self.inputs, self.workers, self.offset = fn, inputs, workers, offset
        self.pool = None
        if workers > 0:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            ctx = mp.get_context("fork") if hasattr(os, "fork") else mp.get_context()
            self.pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init,
                                            initargs=(fn, inputs))

    def run(self, start: int, stop: int, fields, max_bytes, chunk: int = 4) -> Iterator[_Done]:
        """Tasks over ``[start, stop)`` in order; chunks grow until a task takes about
        :data:`_TASK_SECONDS` (results are the same whatever the chunks)."""
        if self.pool is None:
            i = start
            while i < stop:
                j = min(stop, i + chunk)
                yield _run(i, j, fields, max_bytes, self.fn, self.inputs, self.offset)
                i = j
            return
        from concurrent.futures.process import BrokenProcessPool

        window: deque = deque()
        i = start
        depth = 2 * self.workers + 2
        while i < stop or window:
            while i < stop and len(window) < depth:
                j = min(stop, i + chunk)
                window.append((i, j, self.pool.submit(_run, i, j, fields, max_bytes, None, None,
                                                      self.offset)))
                i = j
            a, b, future = window.popleft()
            try:
                done = future.result()
            except BrokenProcessPool:
                raise PackError(f"a worker process died while the function ran over inputs "
                                f"{a}..{b - 1} (killed, or out of memory?); resume=True goes on "
                                "from the last sealed shard") from None
            n = done.stop - done.start
            if done.seconds > 0:
                chunk = max(1, min(_MAX_CHUNK, round(n * _TASK_SECONDS / done.seconds)))
            yield done

    def close(self, wait: bool = True) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=wait, cancel_futures=True)
            self.pool = None


# -- the driver ------------------------------------------------------------------------

@dataclass
class _Plan:
    """What a pack of samples is, decided before the writer opens."""

    fields: tuple[Field, ...]
    raw: list  # (index, samples, error) of the inputs run for inference
    fingerprint: str


def _infer(runner: _Runner, inputs: Sequence, n: int) -> tuple[tuple[Field, ...], list]:
    raw: list = []
    found: list[tuple[str, Any]] = []
    i = 0
    chunk = max(1, runner.workers)
    while i < n and len(found) < INFER_SAMPLES:
        for done in runner.run(i, min(n, i + chunk * 4), None, None, chunk):
            raw.extend(done.raw)
            for k, samples, _ in done.raw:
                for j, s in enumerate(samples or ()):
                    if len(found) < INFER_SAMPLES:
                        found.append((_name(k, inputs[k], j), s))
            i = done.stop
        chunk *= 4
    dicts = [(name, s) for name, s in found if isinstance(s, dict)]
    if not dicts:
        bad = next(((k, e) for k, _, e in raw if e), None)
        why = f"; {_name(bad[0], inputs[bad[0]])}: {bad[1]}" if bad else \
            (f"; {found[0][0]} gave a {type(found[0][1]).__name__}" if found else "")
        raise PackError(f"no sample to infer the schema from in the first {i} input(s): the "
                        f"function gave no dict{why}; pass schema= or fix the function")
    return infer_fields(dicts), raw


def _fingerprint(fn: Callable, inputs: Sequence, fields, options: PackOptions) -> str:
    """The function (by name), every input, the schema and the options that shape the
    output: what a resume must find again."""
    try:
        body = pickle.dumps(list(inputs), protocol=4)
    except Exception:  # inputs that do not pickle (workers=0): their text instead
        body = "\n".join(repr(x) for x in inputs).encode("utf-8", "surrogatepass")
    shaping = {k: v for k, v in options.recorded().items() if k != "on_error"}
    text = repr([_fn_name(fn), len(inputs), crc32c(body), [f.to_json() for f in fields],
                 sorted(shaping.items())])
    return f"{crc32c(text.encode()):08x}"


def _fn_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class _InputProgress(PackProgress):
    """The pack loop's progress calls, told in inputs (the caller's unit), not samples."""

    def __init__(self, progress: PackProgress, total: int, first: int) -> None:
        self.inner, self.total, self.first = progress, total, first

    def start(self, total, done=0):
        self.inner.start(self.total, self.first)

    def close(self):
        self.inner.close()


def _progress(progress: PackProgress | bool) -> PackProgress:
    if progress is True:
        from .report import TqdmProgress

        return TqdmProgress(unit="input")
    if progress is False or progress is None:
        return PackProgress()
    if not isinstance(progress, PackProgress):
        raise UsageError(f"progress must be True, False or a PackProgress, not "
                         f"{type(progress).__name__}")
    return progress


def pack_samples(fn: Callable[[Any], Any], inputs: Sequence, dst: str | Path, *,
                 schema: Any = None, workers: int | None = None,
                 shard_size: int | str | None = "256MB", records_per_shard: int | None = None,
                 on_error: str = "fail", resume: bool = False, overwrite: bool = False,
                 durable: bool = True, progress: PackProgress | bool = True,
                 engine: str = "local", ray_address: str | None = None,
                 task_records: int | None = None) -> PackSummary:
    """Pack the samples ``fn`` makes of each input into a shards dataset at ``dst``.

    Args:
        fn: called once per input; returns one sample (a dict of field -> value) or
            yields several (a generator). Must pickle when ``workers`` > 0 or on Ray
            (a function defined at the top level of a module).
        inputs: a sequence (a list, a range...): what ``fn`` is called with, in order.
        dst: the output folder (or an object-store URI), claimed as ``pack-dataset``
            claims it: a folder holding other files is refused unless ``overwrite``.
        schema: the fields, a list of :class:`formats.Field` or a dict of name ->
            type (:func:`packer.schema.parse_schema`: ``{"text": "str", "tokens":
            "int32[None]"}``); None infers it from the first samples.
        workers: processes running ``fn`` (None: one per core; 0: in this process);
            with ``engine="ray"``, input ranges packed at once.
        shard_size: seal a shard at this data size (bytes or ``"64MB"``); a sample
            larger than it is bad input (kind ``too-large``).
        records_per_shard: or at this many samples.
        on_error: ``fail`` stops at the first bad input naming it; ``skip`` lists it
            in ``dst/skipped.jsonl`` and goes on.
        resume: finish an interrupted pack of the same function, inputs and schema.
        overwrite: replace the dataset already in ``dst`` (swapped in at the end).
        durable: fsync shards before they get their final names.
        progress: True: a tqdm bar on stderr (quiet when stderr is not a terminal);
            False: none; or a :class:`~packer.PackProgress`. Counted in inputs.
        engine: ``local`` or ``ray`` (tasks on a Ray cluster, each packing
            ``task_records`` consecutive inputs into its own shards).
        ray_address, task_records: the Ray cluster to join; inputs per Ray task.

    Returns:
        The summary :func:`packer.pack` returns: records are samples (records in =
        written + skipped); an input whose function raises counts as one skipped.

    Raises:
        UsageError: bad arguments (names which); nothing was written.
        PackInputError: with ``on_error="fail"``, the first bad input or sample,
            naming the input (index and repr), the field and what was expected.
        PackError: no schema could be inferred, or a worker process died.
        PackInterrupted: Ctrl-C; sealed shards are kept for ``resume=True``.
    """
    if not callable(fn):
        raise UsageError(f"fn must be callable, not {type(fn).__name__}")
    if isinstance(inputs, (str, bytes, dict)) or not hasattr(inputs, "__iter__"):
        raise UsageError(f"inputs must be a sequence of inputs (a list, a range...), not "
                         f"{type(inputs).__name__}")
    if not isinstance(inputs, Sequence):
        inputs = list(inputs)
    if isinstance(shard_size, str):
        shard_size = parse_size(shard_size)
    options = PackOptions(source=None, shard_size=shard_size, records_per_shard=records_per_shard,
                          workers=workers, on_error=on_error, resume=resume, overwrite=overwrite,
                          durable=durable, engine=engine, ray_address=ray_address,
                          task_records=task_records)
    fields = None if schema is None else parse_schema(schema)
    progress = _progress(progress)
    if not len(inputs):
        raise UsageError("inputs is empty: nothing to pack")
    if (engine == "local" and options.num_workers > 0) or engine == "ray":
        _check_pickles(fn, engine)
    if is_uri(dst):
        from .remote import pack_to_remote

        return pack_to_remote(_fn_name(fn), str(dst), options, progress,
                              lambda _s, stage, o, p: _pack(fn, inputs, stage, fields, o, p))
    dst = Path(dst)
    check_paths(None, dst)
    return _pack(fn, inputs, dst, fields, options, progress)


def _check_pickles(fn: Callable, engine: str) -> None:
    dumps = pickle.dumps
    if engine == "ray":  # Ray ships tasks with cloudpickle, which takes lambdas too
        from .ray_engine import import_ray

        dumps = import_ray().cloudpickle.dumps
    try:
        dumps(fn)
    except Exception as exc:
        where = "Ray tasks" if engine == "ray" else "worker processes"
        hint = "" if engine == "ray" else ", or pass workers=0 to run it in this process"
        raise UsageError(f"fn {_fn_name(fn)} cannot be sent to {where} ({type(exc).__name__}: "
                         f"{exc}): define it at the top level of a module (not a lambda, a "
                         f"nested function or a bound method of an unpicklable object){hint}"
                         ) from None


def _pack(fn, inputs: Sequence, dst: Path, fields, options: PackOptions,
          progress: PackProgress) -> PackSummary:
    from .run import claimed

    summary = PackSummary(_fn_name(fn), display_uri(dst), SOURCE_KIND, "shards")
    if options.engine == "ray":
        from .ray_engine import pack_samples_on_ray

        return claimed(dst, options, lambda folder: pack_samples_on_ray(
            fn, inputs, folder, fields, options, progress, summary))

    def run(folder: Path) -> PackSummary:
        t0 = time.perf_counter()
        runner = _Runner(fn, inputs, options.num_workers)
        clean = False
        try:
            pack_range(fn, inputs, folder, fields, options, progress, summary, runner)
            clean = True
        except KeyboardInterrupt:
            raise PackInterrupted(summary) from None
        finally:
            runner.close(wait=clean)
            summary.seconds = time.perf_counter() - t0
            progress.close()
        return summary

    return claimed(dst, options, run)


@dataclass(frozen=True)
class SampleRange:
    """Consecutive inputs of one pack, as a Ray task packs them (with the whole pack's
    schema and fingerprint; bad inputs named by their index in the whole pack)."""

    fn: Callable
    inputs: Sequence
    offset: int
    fields: tuple[Field, ...]
    fingerprint: str
    kind: str = SOURCE_KIND
    classes: None = None
    class_info: None = None

    def __len__(self) -> int:
        return len(self.inputs)

    def slice(self, a: int, b: int) -> SampleRange:
        return SampleRange(self.fn, self.inputs[a:b], self.offset + a, self.fields,
                           self.fingerprint)

    def name(self, i: int) -> str:
        return _name(self.offset + i, self.inputs[i])

    def pack(self, dst: Path, options: PackOptions, progress: PackProgress,
             summary: PackSummary) -> None:
        pack_range(self.fn, self.inputs, dst, self.fields, options, progress, summary,
                   _Runner(self.fn, self.inputs, 0, self.offset),
                   _Plan(self.fields, [], self.fingerprint))


def plan_samples(fn, inputs: Sequence, fields, options: PackOptions,
                 runner: _Runner | None = None) -> _Plan:
    """The schema (given or inferred) and the fingerprint a resume must match."""
    raw: list = []
    if fields is None:
        own = runner is None
        runner = runner or _Runner(fn, inputs, 0)
        try:
            fields, raw = _infer(runner, inputs, len(inputs))
        finally:
            if own:
                runner.close()
    return _Plan(tuple(fields), raw, _fingerprint(fn, inputs, fields, options))


def made_by(fn, fields, options: PackOptions) -> dict:
    """The manifest's record of how the dataset was made."""
    return {"tool": "packer.pack_samples", "version": package_version(),
            "source": {"kind": SOURCE_KIND, "function": _fn_name(fn)},
            "schema": {f.name: describe(f) for f in fields},
            "options": options.recorded()}


def pack_range(fn, inputs: Sequence, dst: Path, fields, options: PackOptions,
               progress: PackProgress, summary: PackSummary, runner: _Runner | None = None,
               plan: _Plan | None = None) -> None:
    """Pack every input of ``inputs`` into the folder ``dst`` (the local engine; the Ray
    engine runs it on each range, with the schema and fingerprint of the whole pack)."""
    runner = runner or _Runner(fn, inputs, 0)
    plan = plan or plan_samples(fn, inputs, fields, options, runner)
    writer = open_writer(dst, plan.fields, None, options, made_by(fn, plan.fields, options))
    start = resume_point(writer, plan.fingerprint, dst) or {}
    at = start.get("at") or (0, 0)
    n = len(inputs)
    counter = _InputProgress(progress, n, at[0])
    items = _ordered_items(runner, inputs, plan, options, at, progress)
    write_items(items, writer, shards=True, total=n, start=start, plan=plan.fingerprint,
                dst=dst, options=options, progress=counter, summary=summary)


def _ordered_items(runner: _Runner, inputs: Sequence, plan: _Plan, options: PackOptions,
                   at, progress: PackProgress) -> Iterator[Item]:
    """Every item from input ``at[0]`` on (its first ``at[1]`` samples dropped: they are
    in a sealed shard), telling ``progress`` each input done."""
    first, drop = at
    max_bytes = options.shard_size
    fields = plan.fields

    def done_inputs():
        for i, samples, error in plan.raw:
            if i >= first:
                yield i, i + 1, _items(i, inputs[i], samples, error, fields, max_bytes,
                                       runner.offset)
        begin = max(first, len(plan.raw))
        for done in runner.run(begin, len(inputs), fields, max_bytes):
            yield done.start, done.stop, done.items

    for a, b, items in done_inputs():
        nbytes = 0
        for item in items:
            if drop:
                drop -= 1
                continue
            nbytes += item.nbytes
            yield item
        progress.advance(b - max(a, first), nbytes)
