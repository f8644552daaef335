"""``pack_samples(fn, inputs, dst)``: pack what a user's function makes of each input.

Protocol:

1. **The schema**: given, or inferred (:func:`packer.schema.infer_fields`) from the
   first :data:`packer.schema.INFER_SAMPLES` dict samples, in input order, which
   this process makes by running ``fn`` over the first inputs.
2. **Ranges**: the inputs are cut into ranges of ``task_records`` (default: a 64th
   of the inputs, between 1,000 and 10,000, so the ranges keep up to 64 workers busy
   to the end and depend on the inputs alone, never on ``workers``); each range is packed by one task with the pack loop of ``pack-dataset``
   (:func:`packer.loop.write_items`, which applies ``on_error`` in one place) into
   its own ``part-*`` shards by the range driver (:mod:`packer.engines.driver`:
   done-markers, skip lines, the manifest last), as ``pack-dataset --engine ray``
   packs a listing. Tasks run in ``workers`` local processes (forked,
   :mod:`packer.engines.local`), in this process (``workers=0``) or as Ray tasks
   (``engine="ray"``, :mod:`packer.engines.ray`). Each worker writes
   its own shards, so samples never cross a process boundary, and a range's bytes
   depend on the range alone: the output is the same for any ``workers`` and either
   engine (shard boundaries follow ``task_records``).
3. **Inside a range**, samples stream to the writer as the function gives them: a
   generator is consumed one sample at a time, and samples (of one input or many)
   reach the writer in runs bounded in bytes and samples
   (:class:`packer.sample_runs.Runs`), checked against the schema as a run
   (:func:`packer.schema.check_run`) or one by one
   (:func:`packer.schema.check_sample`). Memory is bounded whatever one input
   yields, even without end; the bytes do not depend on where runs end. A sample
   that does not fit is one bad item. An input whose function raises is one bad
   item after the samples it gave before, which are kept: kind ``raised`` when it
   gave none, ``partial`` when it gave some (with ``on_error="skip"`` they are
   written, and the skip list and the summary count the input as ``partial``; with
   ``fail`` the pack stops, naming it, and nothing of its range is published).
4. **Resume** restarts at an input boundary: a range's done-marker
   (``.shardpack-ranges/range-A-B.json``) is written only once every input of ``[A, B)`` is
   finished and its shards published, so the markers are the record of the inputs
   finished. A resume keeps every range whose marker is in DST and packs the others
   again from their first input; whatever an unfinished range had written (its
   scratch folder, shards sealed in the middle of an input included) is deleted
   first. The fingerprint a resume must match: the function's name, every input,
   the schema, the options.

``fn`` must pickle to run in worker processes or on Ray (checked before anything
starts); ``workers=0`` takes any callable.
"""

from __future__ import annotations

import os
import pickle
import reprlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any

from formats.checksum import crc32c
from formats.errors import ShardpackError
from formats.fields import Field
from formats.storage import Place, place
from formats.version import package_version

from .destination import claimed
from .engines.driver import drive
from .engines.local import LocalRanges
from .engines.ray import check_destination, import_ray, on_ray
from .errors import PackError, PackInterrupted, UsageError
from .loop import Item, Run, open_writer, write_items
from .options import DEFAULT_TASK_RECORDS, SOURCE_OPTIONS, PackOptions
from .plan import check_paths, work_options
from .report import PackProgress, PackSummary
from .sample_runs import Runs, freeze, raised, several
from .schema import (
    INFER_SAMPLES,
    describe,
    infer_fields,
    parse_schema,
    per_box_fields,
)

__all__ = ["SOURCE_KIND", "SampleRange", "made_by", "pack_samples", "plan_samples"]

#: The summary's and the manifest's name for this source.
SOURCE_KIND = "function"
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60


def _name(i: int, x: Any, j: int | None = None) -> str:
    return f"input {i} ({_repr.repr(x)})" + ("" if j is None else f" sample {j}")


# -- the driver ------------------------------------------------------------------------

@dataclass
class _Plan:
    """What a pack of samples is, decided before anything is written."""

    fields: tuple[Field, ...]
    fingerprint: str
    per_box: tuple[str, ...] = ()  # inferred: detection fields, first dimension variable


def _infer(fn: Callable, inputs: Sequence) -> tuple[tuple[Field, ...], int]:
    """The schema of the first :data:`INFER_SAMPLES` dict samples (made here: a
    generator is left once they are in), and how many inputs that took."""
    found: list[tuple[str, Any]] = []
    errors: list[tuple[int, str]] = []
    i, n = 0, len(inputs)
    while i < n and len(found) < INFER_SAMPLES:
        out = None
        try:
            out = fn(inputs[i])
            if not several(out):
                found.append((_name(i, inputs[i]), freeze(out)[0]))
            else:
                for j, s in enumerate(out):
                    found.append((_name(i, inputs[i], j), freeze(s)[0]))
                    if len(found) == INFER_SAMPLES:
                        break
        except Exception as exc:  # the user's code: this input's problem, said if no sample
            errors.append((i, raised(exc, 0, False)))
        finally:
            close = getattr(out, "close", None) if several(out) else None
            if close is not None:
                close()  # a generator without end is left here, not run to its end
        i += 1
    dicts = [(name, s) for name, s in found if isinstance(s, dict)]
    if not dicts:
        why = f"; {_name(errors[0][0], inputs[errors[0][0]])}: {errors[0][1]}" if errors else \
            (f"; {found[0][0]} gave a {type(found[0][1]).__name__}" if found else "")
        raise PackError(f"no sample to infer the schema from in the first {i} input(s): the "
                        f"function gave no dict{why}; pass schema= or fix the function")
    return infer_fields(dicts), i


def _fingerprint(fn: Callable, inputs: Sequence, fields, options: PackOptions) -> str:
    """The function (by name), every input, the schema and the options that shape the
    output: what a resume must find again."""
    try:
        body = pickle.dumps(list(inputs), protocol=4)
    except Exception:  # inputs that do not pickle (workers=0): their text instead
        body = "\n".join(repr(x) for x in inputs).encode("utf-8", "surrogatepass")
    shaping = {k: v for k, v in options.recorded().items() if k != "on_error"}
    text = repr([_fn_name(fn), len(inputs), crc32c(body), [f.to_json() for f in fields],
                 sorted(shaping.items()), options.range_records])
    return f"{crc32c(text.encode()):08x}"


def _fn_name(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


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


def pack_samples(fn: Callable[[Any], Any], inputs: Sequence, dst: str | os.PathLike | Place,
                 options: PackOptions | None = None, *, schema: Any = None,
                 progress: PackProgress | bool = True, **unknown: Any) -> PackSummary:
    """Pack the samples ``fn`` makes of each input into a shards dataset at ``dst``.

    Args:
        fn: called once per input; returns one sample (a dict of field -> value) or
            yields several (a generator, of any length: its samples are written as
            they come, in runs of about 4 MB). Must pickle when ``workers`` > 0 or on
            Ray (a function defined at the top level of a module). Each sample is
            copied as it comes (its dict, arrays and buffers), so ``fn`` may reuse them.
        inputs: a sequence (a list, a range...): what ``fn`` is called with, in order.
        dst: the output folder (or an object-store URI), claimed as ``pack-dataset``
            claims it: a folder holding other files is refused unless ``overwrite``.
        options: how to pack (:class:`packer.PackOptions`, as :func:`packer.pack`
            takes them; default ``PackOptions()``). Those it uses:

            * ``workers``: processes running ``fn`` and writing, a range each (None:
              one per core; 0: in this process); with ``engine="ray"``, ranges at once;
            * ``shard_size`` (bytes or ``"64MB"``; a sample larger than it is bad
              input, kind ``over-shard-size``) or ``records_per_shard``: when a shard seals;
            * ``on_error``: ``fail`` stops at the first bad input naming it; ``skip``
              lists it in ``dst/skipped.jsonl`` and goes on;
            * ``resume``: finish an interrupted pack of the same function, inputs and
              schema (the ranges of inputs finished are kept; the others start again
              at their first input);
            * ``overwrite``: replace the dataset already in ``dst``: the new one is
              built in ``.NAME.shardpack-new`` beside it and swapped in at the end; a
              failed pack leaves it there (the error says so) for ``resume=True``;
            * ``durable``: fsync shards before they get their final names;
            * ``engine`` (``local`` worker processes or ``ray`` tasks on a Ray
              cluster) and ``ray_address``;
            * ``task_records``: inputs per range (default :func:`default_range_records`):
              each range is packed by one task into its own shards, and a resume keeps
              the ranges done.

            Those of :data:`packer.options.SOURCE_OPTIONS` (a source's files) are refused.
        schema: the fields, a list of :class:`formats.Field` or a dict of name ->
            type (:func:`packer.schema.parse_schema`: ``{"text": "str", "tokens":
            "int32[None]"}``); None infers it from the first samples.
        progress: True: a tqdm bar on stderr (quiet when stderr is not a terminal);
            False: none; or a :class:`~packer.PackProgress`. Counted in inputs.

    Returns:
        The summary :func:`packer.pack` returns: records are samples (records in =
        written + skipped); an input whose function raises counts as one skipped
        (kind ``raised``, or ``partial`` when the samples it gave before are written).

    Raises:
        TypeError: a keyword that is not an argument; a PackOptions field given as a
            keyword (as pack_samples took them before) says to pass it in ``options``.
        UsageError: bad arguments (names which); nothing was written.
        PackInputError: with ``on_error="fail"``, the first bad input or sample,
            naming the input (index and repr), the field and what was expected.
        PackError: no schema could be inferred, or a worker process died.
        PackInterrupted: Ctrl-C; sealed shards are kept for ``resume=True``.
    """
    if unknown:
        _refuse_keywords(unknown)
    dst = place(dst)  # read once: below, only what it holds is asked
    if not callable(fn):
        raise UsageError(f"fn must be callable, not {type(fn).__name__}")
    if isinstance(inputs, (str, bytes, dict, set, frozenset)) or not hasattr(inputs, "__iter__"):
        unordered = " (whose order is not defined: sort it)" if isinstance(
            inputs, (set, frozenset)) else ""
        raise UsageError(f"inputs must be a sequence of inputs (a list, a range...), not "
                         f"{type(inputs).__name__}{unordered}")
    if not isinstance(inputs, Sequence):
        inputs = list(inputs)
    options = _sample_options(options, len(inputs))
    fields = None if schema is None else parse_schema(schema)
    progress = _progress(progress)
    if not len(inputs):
        raise UsageError("inputs is empty: nothing to pack")
    if options.engine == "ray" or options.num_workers > 0:
        _check_pickles(fn, options.engine)
        _check_inputs_pickle(inputs)
    if dst.remote and options.engine == "ray":  # tasks upload their shards themselves
        from .remote import hold_remote_dst

        with hold_remote_dst(dst):
            summary = PackSummary(_fn_name(fn), dst.shown, SOURCE_KIND, "shards")
            return _pack_on_ray(fn, inputs, dst, fields, options, progress, summary)
    if dst.remote:
        from .remote import pack_to_remote

        return pack_to_remote(_fn_name(fn), dst, options, progress,
                              lambda _s, stage, o, p: _pack(fn, inputs, stage, fields, o, p))
    dst = Path(dst.text)
    check_paths(None, dst)
    return _pack(fn, inputs, dst, fields, options, progress)


def _refuse_keywords(unknown: dict) -> None:
    fields = {f.name for f in dataclass_fields(PackOptions)}
    named = ", ".join(f"{k}={v!r}" for k, v in unknown.items())
    if all(k in fields for k in unknown):
        raise TypeError(f"pack_samples takes its options as pack() does: pass "
                        f"packer.PackOptions({named}) after dst, not {named}")
    bad = next(k for k in unknown if k not in fields)
    raise TypeError(f"pack_samples() got an unexpected keyword argument {bad!r}")


def _sample_options(options: PackOptions | None, n: int) -> PackOptions:
    """``options`` checked for a pack of ``n`` inputs, ``task_records`` filled in:
    local ranges and Ray tasks cut the same ranges."""
    if options is None:
        options = PackOptions()
    elif not isinstance(options, PackOptions):
        raise UsageError(f"options must be a packer.PackOptions, not "
                         f"{type(options).__name__} {options!r}")
    defaults = PackOptions()
    given = [f"{k}={getattr(options, k)!r}" for k in SOURCE_OPTIONS
             if getattr(options, k) != getattr(defaults, k)]
    if given:
        raise UsageError(f"PackOptions({', '.join(given)}): pack_samples packs the samples "
                         "fn returns; these options read, convert or order a source's "
                         "files (packer.pack)")
    return replace(options, task_records=options.task_records or default_range_records(n))


def default_range_records(n: int) -> int:
    """Inputs per range when the caller gives none: a 64th of ``n``, between 1,000 and
    :data:`DEFAULT_TASK_RECORDS`. Ranges of 10,000 left one of two workers idle for a
    fifth of a 50,000-input pack (five ranges); the count follows the inputs alone, so
    the bytes stay the same for any number of workers."""
    return max(1000, min(DEFAULT_TASK_RECORDS, -(-n // 64)))


def _check_inputs_pickle(inputs: Sequence) -> None:
    """Ranges of inputs travel to the workers pickled: every input must pickle (the
    first that does not is named), before anything is written."""
    try:
        pickle.dumps(list(inputs), protocol=4)
        return
    except Exception:
        pass
    for i, x in enumerate(inputs):
        try:
            pickle.dumps(x, protocol=4)
        except Exception as exc:
            raise UsageError(f"{_name(i, x)} cannot be sent to worker processes "
                             f"({type(exc).__name__}: {exc}); pass picklable inputs (paths, "
                             "ids...) or workers=0") from None


def _check_pickles(fn: Callable, engine: str) -> None:
    dumps = pickle.dumps
    if engine == "ray":  # Ray ships tasks with cloudpickle, which takes lambdas too
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
    summary = PackSummary(_fn_name(fn), str(dst), SOURCE_KIND, "shards")  # a local folder
    if options.engine == "ray":
        import_ray()  # before DST is claimed: a missing extra changes nothing there
        return claimed(dst, options, _staged(dst, lambda folder: _pack_on_ray(
            fn, inputs, place(folder), fields, options, progress, summary)))

    def run(folder: Path) -> PackSummary:
        plan = plan_samples(fn, inputs, fields, options)
        summary.per_box_fields = plan.per_box
        part = SampleRange(fn, inputs, 0, plan.fields, plan.fingerprint)
        return drive(LocalRanges(options.num_workers), summary.src, part,
                     os.path.abspath(folder), plan.fingerprint,
                     made_by(fn, plan.fields, options), options, progress, summary)

    return claimed(dst, options, _staged(dst, run))


def _staged(dst: Path, run: Callable[[Path], PackSummary]) -> Callable[[Path], PackSummary]:
    """``run(folder)`` whose failure in the staging folder (``overwrite`` of a dataset:
    :mod:`packer.destination`, "claiming DST", step 3) says what becomes of that folder:
    it stays beside DST, as ``pack-dataset --overwrite`` leaves it, for ``resume=True``
    to continue (a pack without ``resume`` deletes it and starts over)."""

    def staged(folder: Path) -> PackSummary:
        try:
            return run(folder)
        except (ShardpackError, PackInterrupted) as exc:
            if os.path.abspath(folder) != os.path.abspath(dst):
                hint = (f"the new dataset stays unfinished in {folder} beside DST, which "
                        "still holds the old one: resume=True (same function, inputs and "
                        "options) continues it; a pack without resume deletes it and starts "
                        "over")
                if isinstance(exc, ShardpackError):
                    exc.message = f"{exc.message}; {hint}"
                    exc.args = (exc._render(),)
                else:
                    exc.args = (f"{exc.args[0]}; {hint}",)
            raise

    return staged


def _pack_on_ray(fn, inputs, dst: Place, fields, options: PackOptions,
                 progress: PackProgress, summary: PackSummary) -> PackSummary:
    """The pack with Ray tasks: the driver settles the schema (inferring it here from
    the first inputs), each task packs ``task_records`` consecutive inputs with the
    local loop into its own shards, the driver writes the manifest.

    Raises:
        ImportError: Ray is not installed (with the install hint).
    """
    dst_text = dst.text if dst.remote else os.path.abspath(dst.text)
    check_destination(None, dst_text, options)
    run_ranges = on_ray(options)
    plan = plan_samples(fn, inputs, fields, options)
    summary.per_box_fields = plan.per_box
    part = SampleRange(fn, inputs, 0, plan.fields, plan.fingerprint)
    return drive(run_ranges, summary.src, part, dst_text, plan.fingerprint,
                 made_by(fn, plan.fields, options), options, progress, summary)


@dataclass(frozen=True)
class SampleRange:
    """Consecutive inputs of one pack, as a task packs them (with the whole pack's
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

    def name(self, i: int, j: int | None = None) -> str:
        """Input ``i`` (sample ``j`` of it) by its index in the whole pack."""
        return _name(self.offset + i, self.inputs[i], j)

    def pack(self, dst: Path, options: PackOptions, progress: PackProgress,
             summary: PackSummary) -> None:
        """Pack these inputs into the fresh folder ``dst`` with the pack loop."""
        writer = open_writer(dst, self.fields, None, options, {})
        n = len(self.inputs)
        write_items(self._items(options, options.on_error == "skip"), writer,
                    shards=True, total=n, start={}, plan=self.fingerprint, dst=dst,
                    options=options, progress=progress, summary=summary)

    def _items(self, options: PackOptions, skip: bool) -> Iterator[Item | Run]:
        """Every input's samples, in runs (:class:`packer.sample_runs.Runs`) as they come; an input whose
        function raises is one bad item after the samples it gave (kind ``raised``, or
        ``partial`` when it gave some: with ``skip`` they are written)."""
        runs = Runs(self, options.shard_size, work_options(options))
        for i, x in enumerate(self.inputs):
            given, error = 0, None
            try:
                out = self.fn(x)
            except Exception as exc:  # the user's code: any exception is this input's problem
                out, error = None, raised(exc, 0, skip)
            many = several(out)
            runs.begin(i, many)
            if error is None and not many:  # one sample
                if runs.add(out):
                    yield from runs.flush()
                continue
            while error is None:
                # One sample at a time, the function's code alone under the try: what
                # raises there is the input's problem, never the writer's.
                try:
                    sample = next(out)
                except StopIteration:
                    break
                except Exception as exc:
                    error = raised(exc, given, skip)
                    break
                given += 1
                if runs.add(sample):
                    yield from runs.flush()
            if error is not None:
                yield from runs.flush()  # the samples it gave before, in order
                name = self.name(i)
                yield Item(None, None, name, name, 0, "partial" if given else "raised", error)
        yield from runs.flush()


def plan_samples(fn, inputs: Sequence, fields, options: PackOptions) -> _Plan:
    """The schema (given or inferred) and the fingerprint a resume must match."""
    per_box: tuple[str, ...] = ()
    if fields is None:
        fields, _ = _infer(fn, inputs)
        per_box = per_box_fields(fields)
    return _Plan(tuple(fields), _fingerprint(fn, inputs, fields, options), per_box)


def made_by(fn, fields, options: PackOptions) -> dict:
    """The manifest's record of how the dataset was made (the range size included:
    shard boundaries follow it)."""
    recorded = options.recorded()
    recorded["task_records"] = options.range_records
    return {"tool": "packer.pack_samples", "version": package_version(),
            "source": {"kind": SOURCE_KIND, "function": _fn_name(fn)},
            "schema": {f.name: describe(f) for f in fields}, "options": recorded}
