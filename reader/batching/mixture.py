"""A mixture's order: which record of which source each rank reads, batch by batch.

The job reads one *stream* of samples, positions 0, 1, 2, ... in order: step ``k``
of a job of ``W`` ranks with batches of ``b`` takes the next ``W * b`` positions, rank
``r`` those at ``r, r + W, ...`` among them. Position ``g`` is mapped, by pure
functions and nothing stored:

1. to a source and the sample's number within that source since the run began, by
   the plan in force there (:class:`MixPlan`: the sources' weights, their counts when it
   began, the :class:`~reader.batching.arrangement.Arrangement`);
2. the number ``t`` of source ``s`` is position ``t % N_s`` of the source's pass
   ``t // N_s``, each pass its own permutation (the sampler's orders, keyed by the
   seed, the pass and the source's name);
3. the record there, offset into the :class:`~reader.data.mixed.MixedDataset`.

The same plan orders :class:`reader.TokenBlocks` over a mixture, with *blocks* of each
source's token stream for records (``unit="blocks"``: a source's size is its number
of blocks, and its ``"block"`` order shuffles whole shards, then the blocks of each,
as the blocks of one dataset are).

A state is therefore global: the next position, the epoch's bounds in positions, and
the plan. Loaded at another world size, worker count or batch size, the job continues
at the same position: across the job no sample is served twice and none is skipped.
Loaded with other weights or sources, a new plan starts at that position, every
continuing source at the count it had reached, so nothing of its pass is served
again (a prefix of the stream serves the first samples of each source's order: see
the arrangement's docstring).

Epochs are counts of steps: ``samples_per_epoch // (W * b)`` steps, the stream going on
across them. An epoch resumed at another step size keeps its end and has the steps
that fit in what is left; the remainder opens the next one.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np

from formats.errors import ArgumentError

from ..errors import StateError
from ..options import SamplerOptions, check_count
from .arrangement import Arrangement, integer_weights
from .permutation import permute, round_keys
from .sampler import EpochOrder

__all__ = ["ORDER", "MixOrder", "MixPlan"]

# Names how a mixture's stream is computed: a state saved under another cannot resume.
ORDER = "mix-1"
# What a source's items are, and who reads them (named in states and messages).
_READERS = {"records": "Loader", "blocks": "TokenBlocks"}
_PASSES = 0x70617373  # separates the sources' pass permutations from other keys
_WINDOW_BUDGET = 1 << 22  # window-permutation elements all kept pass orders share
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # spreads pass numbers over the tweak's bits
_RECENT = 128  # batches kept from issue to delivery (prefetch stays below: 4 x workers)


class MixPlan:
    """The weights in force from stream position ``start`` on.

    Args:
        start: the first position it decides.
        weights: source name -> integer weight (:func:`integer_weights`), in the
            mixture's order of sources.
        taken: source name -> its samples served before ``start`` since the run began.
        seed: keys the arrangement.
    """

    def __init__(self, start: int, weights: dict[str, int], taken: dict[str, int],
                 seed: int) -> None:
        self.start = int(start)
        self.weights = dict(weights)
        self.names = tuple(weights)
        self.taken = np.asarray([int(taken.get(n, 0)) for n in self.names], np.int64)
        self.arrangement = Arrangement([weights[n] for n in self.names], seed)

    def counts_at(self, position: int) -> dict[str, int]:
        """Each source's samples served before ``position`` since the run began."""
        t = self.taken + self.arrangement.taken(position - self.start)
        return dict(zip(self.names, t.tolist(), strict=True))

    def describe(self) -> dict:
        return {"start": self.start, "weights": dict(self.weights),
                "taken": dict(zip(self.names, self.taken.tolist(), strict=True))}


class MixOrder:
    """The batch order of a Loader over a :class:`reader.Mix`: what the runtime asks of
    any order (``batch(epoch, k)``, ``num_batches_in(epoch)``), plus the mixture's
    state, re-planning and report.

    Args:
        names: the sources' names, as the :class:`MixedDataset` orders them.
        sizes: records (blocks) per source.
        shard_starts: per source, its dataset's ``starts`` (the ``"block"`` order); for
            blocks, the first block of each shard.
        offsets: where each source's records begin in the mixed dataset.
        weights: name -> weight as the user gave it, or None (by size).
        samples_per_epoch: the epoch's nominal length in samples, or None (the sizes'
            sum).
        batch_size: records per batch and rank.
        options: shuffle, seed, window, rank and world size (``drop_last`` must be
            False: a mixture's batches are all full).
        unit: ``"records"`` (a Loader's) or ``"blocks"`` (a :class:`reader.TokenBlocks`'
            token blocks: each shard is a window of the ``"block"`` order, and a state
            of one unit never resumes the other).
    """

    def __init__(self, names: tuple[str, ...], sizes: list[int], shard_starts: list,
                 offsets: np.ndarray, weights: Mapping | None, samples_per_epoch: int | None,
                 batch_size: int, options: SamplerOptions, *, unit: str = "records") -> None:
        if unit not in _READERS:
            raise ValueError(f"unit must be one of {sorted(_READERS)}, not {unit!r}")
        self.unit, self.reader = unit, _READERS[unit]
        if options.drop_last:
            raise ArgumentError(
                "drop_last=True has no effect on a mixture: its batches are all full (the "
                "stream goes on past an epoch's end, and a remainder smaller than one step "
                "of all ranks starts the next epoch); leave it out")
        empty = [n for n, size in zip(names, sizes, strict=True) if size == 0]
        if empty:
            raise ArgumentError(f"Mix: source {empty[0]!r} has no {unit}")
        self.names = tuple(names)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.sizes = np.asarray(sizes, np.int64)
        self.shard_starts = [np.asarray(s, np.int64) for s in shard_starts]
        self.offsets = np.asarray(offsets, np.int64)
        self.options = options
        self.batch_size = int(batch_size)
        self.streams = np.asarray([zlib.crc32(n.encode()) for n in self.names], np.uint64)
        raw = list(sizes) if weights is None else [weights[n] for n in self.names]
        self.weights = dict(zip(self.names, integer_weights(raw), strict=True))
        self.step = options.world_size * self.batch_size  # stream positions per step
        nominal = int(samples_per_epoch or int(self.sizes.sum()))
        self.per_epoch = nominal // self.step
        if self.per_epoch < 1:
            raise ArgumentError(
                f"an epoch of {nominal} {'samples' if unit == 'records' else unit} holds "
                f"no step of {options.world_size} rank(s) x batch_size {self.batch_size} = {self.step}; raise "
                "Mix(samples_per_epoch=...) or lower the batch size")
        self.epoch_samples = self.per_epoch * self.step
        self.plan = MixPlan(0, self.weights, {}, options.seed)
        self.carried: dict[str, dict] = {}  # sources a loaded state knew that this mix lacks
        # Where epochs lie in the stream: epoch `first` has batches from `first_batch`,
        # batch `first_batch` starting at `first_start`, and ends at `first_end`.
        self.first, self.first_batch, self.first_start = 0, 0, 0
        self.first_end = self.epoch_samples
        self._pass_orders: OrderedDict = OrderedDict()
        self._keys = round_keys(options.seed, _PASSES)
        self._recent: OrderedDict = OrderedDict()  # (epoch, k) -> records, see batch()

    # -- the batch-order interface -----------------------------------------------------

    @property
    def max_batch_size(self) -> int:
        return self.batch_size

    @property
    def partition(self) -> str:
        return "interleaved"

    def __len__(self) -> int:
        return self.num_batches_in(self.first)

    def num_batches_in(self, epoch: int) -> int:
        if epoch == self.first:
            return self.first_batch + (self.first_end - self.first_start) // self.step
        return self.per_epoch

    def batch_start(self, epoch: int, k: int) -> int:
        """The stream position where step ``k`` of ``epoch`` begins."""
        if epoch == self.first:
            return self.first_start + (k - self.first_batch) * self.step
        after_first = self.first_start + (self.num_batches_in(self.first)
                                          - self.first_batch) * self.step
        return after_first + (epoch - self.first - 1) * self.epoch_samples + k * self.step

    def positions(self, epoch: int, k: int, stop: int | None = None) -> np.ndarray:
        """This rank's stream positions in batch ``k`` of ``epoch`` (batches ``k`` to
        ``stop``, one after the other, when ``stop`` is given)."""
        n = self.num_batches_in(epoch)
        stop = k + 1 if stop is None else stop
        if not 0 <= k < stop <= n:
            which = f"batch {k}" if stop == k + 1 else f"batches {k} to {stop - 1}"
            raise IndexError(f"{which} out of range for an epoch of {n} batches")
        if epoch < self.first or (epoch == self.first and k < self.first_batch):
            raise StateError(
                f"batch {k} of epoch {epoch} comes before the position this {self.reader} "
                "resumed "
                f"at (epoch {self.first}, batch {self.first_batch}) at another world size or "
                "batch size: it is not part of this run's stream; set_epoch() to a later epoch")
        o = self.options
        start = self.batch_start(epoch, k) + o.rank  # steps are evenly spaced in an epoch
        within = o.world_size * np.arange(self.batch_size, dtype=np.int64)
        if stop == k + 1:
            return start + within
        steps = self.step * np.arange(stop - k, dtype=np.int64)
        return (start + steps[:, None] + within[None, :]).reshape(-1)

    def batch(self, epoch: int, k: int) -> np.ndarray:
        """The mixed dataset's records of batch ``k`` of ``epoch`` (this rank)."""
        hit = self._recent.get((epoch, k))
        if hit is not None:  # asked again when delivered (main fields, the ledger)
            return hit
        source, record = self.sources_of(self.positions(epoch, k))
        out = self.offsets[source] + record
        self._recent[(epoch, k)] = out
        if len(self._recent) > _RECENT:
            self._recent.popitem(last=False)
        return out

    def ledger_ids(self, ids: np.ndarray) -> np.ndarray:
        """The ledger's ids of the mixed dataset's records ``ids`` (:mod:`reader.ledger`):
        ``stream << 40 | record``, the source's stream (the CRC32 of its name) and the
        record within it, so they do not depend on the mixture's other sources."""
        ids = np.asarray(ids, np.int64)
        src = np.searchsorted(self.offsets, ids, side="right") - 1
        return (self.streams[src] << np.uint64(40)) | (ids - self.offsets[src]).astype(np.uint64)

    # -- positions -> (source, record) -------------------------------------------------

    def sources_of(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source number, record within that source) of each stream position (each at
        or after the plan's start: a loaded state's position)."""
        g = np.asarray(positions, np.int64)
        plan = self.plan
        if g.size and g.min() < plan.start:
            raise StateError(f"stream position {int(g.min())} precedes the plan this "
                             f"{self.reader} resumed with (from position {plan.start})")
        source, n = plan.arrangement(g - plan.start)  # the plan's sources are the mix's
        return source, self._records(source, plan.taken[source] + n)

    def _records(self, source: np.ndarray, number: np.ndarray) -> np.ndarray:
        """Sample ``number`` of each source (since the run began) -> its record: position
        ``number % N`` of pass ``number // N``."""
        size = self.sizes[source]
        passes, pos = np.divmod(number, size)
        mode = self.options.shuffle
        if not mode:
            return pos
        if mode == "full":  # one keyed permutation per (source, pass), all in one call
            tweak = self.streams[source] ^ (passes.astype(np.uint64) * _GOLDEN)
            if (tweak == tweak[0]).all():  # one source and pass: the scalar path, 40% less
                return permute(pos, int(size[0]), self._keys, tweak=tweak[0])
            return permute(pos, size, self._keys, tweak=tweak)
        out = np.empty_like(pos)
        key = source * (1 << 40) + passes
        for k in np.unique(key).tolist():
            sel = key == k
            s, p = divmod(k, 1 << 40)
            out[sel] = self._pass_order(s, p).records(pos[sel])
        return out

    def _pass_order(self, s: int, p: int) -> EpochOrder:
        """Pass ``p`` of source ``s`` in the ``"block"`` order (kept while recent)."""
        hit = self._pass_orders.get((s, p))
        if hit is None:
            # The pass orders kept share one budget of window permutations: a single
            # dataset's (32 MB), not one each (10 sources would hold 640 MB).
            hit = EpochOrder(int(self.sizes[s]), self.shard_starts[s], self.options, p,
                             stream=int(self.streams[s]), window=self._window,
                             cache=_WINDOW_BUDGET // (2 * len(self.names)))
            self._pass_orders[(s, p)] = hit
            if len(self._pass_orders) > 2 * len(self.names):
                self._pass_orders.popitem(last=False)
        else:
            self._pass_orders.move_to_end((s, p))
        return hit

    # -- state -------------------------------------------------------------------------

    @property
    def _window(self) -> int | str | None:
        """The ``"block"`` order's window: the options' for records, a shard for blocks."""
        return "options" if self.unit == "records" else None

    def describe(self) -> dict:
        o = self.options
        window = o.shuffle_window if self.unit == "records" else None
        out = {"order": ORDER, "seed": o.seed, "shuffle": o.shuffle, "window": window}
        if self.unit != "records":  # a Loader's states stay as they were
            out["unit"] = self.unit
        return out

    def state(self, epoch: int, k: int) -> dict:
        """The state at batch ``k`` of ``epoch`` (the next unseen one)."""
        if k >= self.num_batches_in(epoch):
            epoch, k = epoch + 1, 0
        position = self.batch_start(epoch, k)
        end = self.first_end if epoch == self.first else self.batch_start(epoch, self.per_epoch)
        plan = self.plan
        counts = dict(self.carried)
        counts.update({n: {self.unit: int(self.sizes[self.index[n]]), "taken": t}
                       for n, t in plan.counts_at(position).items()})
        return {**self.describe(), "epoch": epoch, "batch": k,
                "epoch_start": self.batch_start(epoch, 0) if epoch != self.first
                else self.first_start - self.first_batch * self.step,
                "position": position, "epoch_end": end, "plan": plan.describe(),
                "sources": counts, "world_size": self.options.world_size,
                "batch_size": self.batch_size}

    def resume(self, state: Mapping) -> tuple[int, int]:
        """Continue at ``state``'s position (any world size and batch size), re-planning
        if its weights or sources differ; returns the (epoch, batch) to start at."""
        _check_state(state, self.describe(), self.reader)
        try:
            epoch, position = check_count(state["epoch"]), check_count(state["position"])
            start, end = int(state["epoch_start"]), int(state["epoch_end"])
            known = {str(n): {self.unit: check_count(rec[self.unit]), "taken": check_count(rec["taken"])}
                     for n, rec in state["sources"].items()}
            plan = state["plan"]
            plan = {"start": check_count(plan["start"]), "weights": dict(plan["weights"]),
                    "taken": {str(n): check_count(t) for n, t in plan["taken"].items()}}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StateError(f"{self.reader} mixture state is damaged ({type(exc).__name__}: "
                             f"{exc}); pass the dict state_dict() returned") from None
        if not start <= position <= end:
            raise StateError(f"mixture state: position {position} lies outside its epoch "
                             f"[{start}, {end}]")
        for name, rec in known.items():
            if name in self.index and int(rec[self.unit]) != int(self.sizes[self.index[name]]):
                raise StateError(
                    f"mixture state: source {name!r} had {rec[self.unit]} {self.unit} when "
                    f"the state was saved, this one has {int(self.sizes[self.index[name]])}: "
                    "a different dataset under the same name cannot continue its pass")
        if plan["weights"] == self.weights:
            self.plan = MixPlan(plan["start"], self.weights, plan["taken"], self.options.seed)
        else:  # re-plan: every continuing source where it was
            taken = {n: rec["taken"] for n, rec in known.items()}
            self.plan = MixPlan(position, self.weights, taken, self.options.seed)
        self.carried = {n: dict(rec) for n, rec in known.items() if n not in self.index}
        served = position - start
        self.first = epoch
        self.first_batch = served // self.step
        self.first_start, self.first_end = position, end  # at another step size, the
        self._recent.clear()  # batches renumbered: as many as the served samples fill
        return epoch, self.first_batch

    def report(self, epoch: int, k: int) -> dict:
        """Per source: its weight's share, its pass, and what of the pass is served and
        left, at batch ``k`` of ``epoch``."""
        state = self.state(epoch, k)
        total = sum(self.weights.values())
        out = {}
        for name, rec in state["sources"].items():
            n, t = int(rec[self.unit]), int(rec["taken"])
            out[name] = {"weight": self.weights.get(name, 0) / total, self.unit: n,
                         "pass": t // n, "served": t % n, "left": n - t % n,
                         "in_plan": name in self.index}
        return out


def _check_state(state, mine: dict, reader: str) -> None:
    if not isinstance(state, Mapping):
        raise StateError("mixture load_state_dict(state): state must be the dict that "
                         f"state_dict() returned, not {type(state).__name__}")
    if state.get("order") != ORDER:
        what = state.get("order", "a single dataset's order")
        raise StateError(f"mixture state: saved by {what!r}, not a mixture's {ORDER!r} order; "
                         "a mixture resumes only from a mixture's state")
    unit, theirs = mine.get("unit", "records"), state.get("unit", "records")
    if theirs != unit:
        who = _READERS.get(theirs, "reader") if isinstance(theirs, str) else "reader"
        raise StateError(f"mixture state: saved by a {who} (its sources counted in "
                         f"{theirs}), this {reader} mixes {unit}: it resumes only from the "
                         f"state of a {reader}")
    for key in ("epoch", "batch", "position", "epoch_start", "epoch_end", "plan", "sources"):
        if key not in state:
            raise StateError(f"mixture state: no {key!r}; pass the dict that state_dict() "
                             "returned")
    for key in ("seed", "shuffle", "window"):
        if state.get(key) != mine[key]:
            raise StateError(f"mixture state was saved with {key}={state.get(key)!r}, this "
                             f"{reader} has {key}={mine[key]!r}: cannot resume exactly")
