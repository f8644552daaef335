"""Size-aware batches: aspect-ratio groups and cost budgets.

Two frozen, picklable specs say how to batch; ``spec.bind(dataset, batch_size,
options)`` reads the per-record sizes once and returns the bound batch order,
which has the interface of :class:`reader.batching.sampler.Sampler`:

- :class:`AspectRatioBatches` ``(boundaries=(1.0,), sizes=None)``:
  records are grouped by aspect ratio ``width / height`` (group ``i`` holds
  ratios in ``[boundaries[i-1], boundaries[i])``; the default splits portrait
  from landscape, ``w >= h``, as detectron2 and torchvision do). The epoch's
  record order streams into one bucket per group and a batch leaves when its
  bucket holds ``batch_size`` records (the Loader's ``batch_size``, handed to
  ``bind``); at the end, the partly filled buckets
  leave as partial batches in group order (dropped with ``drop_last``). Every
  batch holds one group only.
- :class:`BudgetBatches` ``(budget, size="pixels", padded=True,
  max_batch_size=None, window=64)``: batches whose cost stays within
  ``budget``, where the cost is ``max(size) * count`` (``padded``: pixels or
  tokens after padding to the batch's largest) or ``sum(size)`` (ragged). The
  epoch's record order is cut into sort windows of about ``window`` typical
  batches; each window is sorted by size (ties keep the shuffled order) and cut
  greedily; then the batches are shuffled (within their window for the
  ``"block"`` order, which keeps its locality; not at all without shuffling).

Sizes come from the metadata table (``width``, ``height``: no data file is
read), from a field (``size="field:NAME"``: the value of an ``int`` field, the
stored length of a ``bytes``/``str``/``json`` field, or for an ``ndarray`` the
product of its variable dimensions, all from the index) or from an array the
user passes.

The bound order (:class:`BoundBatches`) keeps the sampler's invariant: the
batches are a pure function of (seed, epoch, rank, world_size). All ranks build
the same global list of batches, which is padded by wrapping whole batches (or
truncated, with ``drop_last``) to a multiple of ``world_size``; batch ``i`` then
goes to rank ``i % world_size`` (the ``r``-th contiguous run for the ``"block"``
order), by :func:`reader.batching.sampler.rank_positions`. So every rank gets the same
number of batches, and resuming at batch ``k`` is exact. Budget batches vary in
number from one epoch to the next: ask ``num_batches_in(epoch)``.

:func:`padding_waste` measures what padding costs in a list of batches.
"""

from __future__ import annotations

import hashlib
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from formats.errors import ArgumentError, ArgumentTypeError
from formats.shard.column_cache import mapped_column

from ..options import SamplerOptions
from .sampler import ORDER, per_rank, rank_positions, shuffled_order

__all__ = ["AspectRatioBatches", "BoundBatches", "BudgetBatches", "padding_waste"]

# Separates the batch-order stream from the record-order one (both keyed by seed, epoch).
_BATCH_STREAM = 0x6261746368


# -- checks ------------------------------------------------------------------------------

def _positive_int(name: str, value: Any, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"{name} must be an int >= 1{' or None' if allow_none else ''}, "
                        f"not {type(value).__name__} {value!r}")
    if value < 1:
        raise ArgumentError(f"{name} must be an int >= 1, not {value}")
    return int(value)


def _int_array(name: str, value: Any, ndim: int, minimum: int) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind not in "iu" or arr.ndim != ndim or (ndim == 2 and arr.shape[1] != 2):
        want = "(num_records,)" if ndim == 1 else "(num_records, 2) of (height, width)"
        raise ArgumentTypeError(f"{name} must be an integer array of shape {want}, "
                        f"not {arr.dtype} {arr.shape}")
    arr = arr.astype(np.int64)
    bad = np.flatnonzero((arr < minimum).reshape(len(arr), -1).any(axis=1))
    if bad.size:
        i = int(bad[0])
        raise ArgumentError(f"{name}: record {i} has size {arr[i].tolist()}, "
                         f"sizes must be >= {minimum}")
    arr.setflags(write=False)
    return arr


def _digest(arr: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(arr).tobytes(), digest_size=8).hexdigest()


def _check_length(arr: np.ndarray, dataset: Any, what: str) -> None:
    if len(arr) != len(dataset):
        raise ArgumentError(f"{what} has {len(arr)} sizes for a dataset of {len(dataset)} records")


# -- sizes from a dataset ---------------------------------------------------------------

def known_image_sizes(dataset: Any) -> np.ndarray:
    """``(height, width)`` of every record from the metadata tables (no data file read),
    0 where a table has none: a column mapped from the cache folder, built once per node
    (:mod:`formats.shard.column_cache`), 8 bytes a record."""
    import pyarrow.compute as pc

    def per_shard(s: int) -> np.ndarray:
        table = dataset.metadata(["width", "height"], shard=s)
        return np.stack([pc.fill_null(table.column(c), 0).to_numpy().astype(np.int32)
                         for c in ("height", "width")], axis=1)

    if not hasattr(dataset, "manifest_crc32c"):  # not a dataset of ours: read it all
        return _known_image_sizes(dataset)
    return mapped_column(dataset, "image_hw", np.int32, per_shard, width=2)


def _known_image_sizes(dataset: Any) -> np.ndarray:
    import pyarrow.compute as pc

    table = dataset.metadata(["width", "height"])
    cols = [pc.fill_null(table.column(c), 0).to_numpy().astype(np.int64)
            for c in ("height", "width")]
    hw = np.stack(cols, axis=1) if len(table) else np.zeros((0, 2), np.int64)
    _check_length(hw, dataset, "the metadata table")
    return hw


def image_sizes(dataset: Any) -> np.ndarray:
    """``(height, width)`` of every record, from the metadata table (no data file read).

    Raises:
        ValueError: a record whose width or height is unknown (null or 0), naming the first.
    """
    hw = known_image_sizes(dataset)
    bad = np.flatnonzero((hw <= 0).any(axis=1))
    if bad.size:
        i = int(bad[0])
        raise ArgumentError(
            f"record {i} has no known width and height in the metadata table "
            f"(width={hw[i, 1]}, height={hw[i, 0]}; {bad.size} such records): pack with "
            f"sizes, or pass them (e.g. AspectRatioBatches(sizes=...) with (height, width) "
            f"per record, BudgetBatches(size=...) with one size per record)")
    return hw


def field_sizes(dataset: Any, name: str) -> np.ndarray:
    """One size per record from field ``name``, vectorized and without reading payloads
    (except the 8 bytes of an ``int`` field): the value of an ``int`` field; the stored
    length of an uncompressed ``bytes``/``str``/``json`` field (UTF-8 bytes for text);
    the product of the variable dimensions of an uncompressed ``ndarray`` field (its
    rows for a ``[None, 4]`` array, its length for a ``[None]`` one). A column mapped
    from the cache folder, built once per node (:mod:`formats.shard.column_cache`).

    Raises:
        ValueError: an unknown or unsuitable field, or a payload length that is not a
            whole number of elements (names the record).
    """
    fields = {f.name: f for f in dataset.fields}
    if name not in fields:
        has = ", ".join(f"{f.name} ({f.type})" for f in dataset.fields)
        raise ArgumentError(f"size='field:{name}': no field {name!r}; the fields are {has}")
    f = fields[name]
    if f.type not in ("int", "bytes", "str", "json", "ndarray"):
        raise ArgumentError(f"size='field:{name}': a {f.type} field has no size; use an int, "
                         f"bytes, str, json or ndarray field, or pass the sizes as an array")
    if f.type != "int" and f.compression != "none":
        raise ArgumentError(f"size='field:{name}': the field is {f.compression}-compressed, so "
                         f"its stored length is not its size; pass the sizes as an array")
    if not hasattr(dataset, "manifest_crc32c"):  # not a dataset of ours: read it all
        return _sizes_of(dataset, f, np.arange(len(dataset), dtype=np.int64))
    starts = dataset.starts

    def per_shard(s: int) -> np.ndarray:
        return _sizes_of(dataset, f, np.arange(starts[s], starts[s + 1], dtype=np.int64))

    key = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return mapped_column(dataset, f"size-{key}", np.int64, per_shard)


def _sizes_of(dataset: Any, f: Any, records: np.ndarray) -> np.ndarray:
    """:func:`field_sizes` of ``records`` (a run of them)."""
    name = f.name
    if f.type == "int":
        out = dataset.scalars(records, name)
        bad = np.flatnonzero(out < 0)
        if bad.size:
            raise ValueError(f"field {name!r} of record {int(records[bad[0]])} is "
                             f"{int(out[bad[0]])}: a size must be >= 0")
        return out
    lengths = dataset.spans(records, name)[2].astype(np.int64)
    if f.type != "ndarray":
        return lengths
    fixed = int(np.prod([d for d in f.shape if d is not None], dtype=np.int64))
    row = np.dtype(f.dtype).itemsize * fixed
    if f.fixed_shape or row == 0:
        return np.full(len(records), int(f.fixed_shape), np.int64)
    header = 8 * (1 + len(f.shape))  # u64 ndim, u64 dims[ndim] (FORMAT.md, section 5)
    body = lengths - header
    bad = np.flatnonzero((body < 0) | (body % row != 0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"field {name!r} of record {int(records[i])}: a payload of "
                         f"{lengths[i]} bytes is not a {header}-byte shape header plus whole "
                         f"rows of {row} bytes")
    return body // row


# -- the bound order ----------------------------------------------------------------------

class BoundBatches:
    """One rank's batches of variable size; subclasses build the global list.

    Members (the interface of :class:`reader.batching.sampler.Sampler`): ``num_batches_in(epoch)``,
    ``num_batches`` (where it does not depend on the epoch), ``batch(epoch, k)``,
    ``rank_indices(epoch)`` (this rank's records, batches concatenated, in delivery
    order) with ``rank_offsets(epoch)`` (where each batch starts in it, plus the end),
    ``partition``, ``max_batch_size`` (the most records any batch of any epoch holds)
    and ``describe()``.
    """

    def __init__(self, num_records: int, shard_starts: Any, options: SamplerOptions,
                 max_batch_size: int, settings: dict) -> None:
        self.num_records = int(num_records)
        self.shard_starts = np.asarray(shard_starts, np.int64)
        self.options = options
        self.max_batch_size = int(max_batch_size)
        self._settings = settings
        self._cache: tuple[int, np.ndarray, np.ndarray] | None = None

    def _global(self, epoch: int, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All ranks' batches of ``epoch`` from its record ``order``: (records, offsets)."""
        raise NotImplementedError

    @property
    def partition(self) -> str:
        """How ranks split the batches: ``contiguous`` runs (block order) or ``interleaved``."""
        return "contiguous" if self.options.shuffle == "block" else "interleaved"

    def _rank(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1], self._cache[2]
        order = shuffled_order(self.num_records, self.shard_starts, self.options, epoch)
        flat, offsets = self._global(epoch, order)
        pos = rank_positions(len(offsets) - 1, self.options)
        lengths = offsets[pos + 1] - offsets[pos]
        mine = np.zeros(len(pos) + 1, np.int64)
        np.cumsum(lengths, out=mine[1:])
        # Gather whole batches: each taken position's run of records, in one numpy pass.
        take = np.repeat(offsets[pos] - mine[:-1], lengths) + np.arange(mine[-1])
        indices = np.ascontiguousarray(flat[take])
        self._cache = (epoch, indices, mine)
        return indices, mine

    def rank_indices(self, epoch: int) -> np.ndarray:
        """This rank's records for ``epoch``, in delivery order (cached for one epoch)."""
        return self._rank(epoch)[0]

    def rank_offsets(self, epoch: int) -> np.ndarray:
        """Batch ``k`` is ``rank_indices(epoch)[offsets[k]:offsets[k + 1]]``."""
        return self._rank(epoch)[1]

    def num_batches_in(self, epoch: int) -> int:
        """Batches in ``epoch`` for this rank (the same for every rank)."""
        return len(self._rank(epoch)[1]) - 1

    def batch(self, epoch: int, k: int) -> np.ndarray:
        """Record indices of batch ``k`` of ``epoch``."""
        indices, offsets = self._rank(epoch)
        if not 0 <= k < len(offsets) - 1:
            raise IndexError(f"batch {k} out of range for an epoch of {len(offsets) - 1} batches")
        return indices[offsets[k] : offsets[k + 1]]

    def describe(self) -> dict:
        """Everything the order depends on (a resumed state must agree on all of it)."""
        o = self.options
        return {**self._settings, "seed": o.seed, "shuffle": o.shuffle, "window": o.shuffle_window,
                "rank": o.rank, "world_size": o.world_size, "drop_last": o.drop_last,
                "num_records": self.num_records, "partition": self.partition, "order": ORDER}


class _Grouped(BoundBatches):
    def __init__(self, groups: np.ndarray, batch_size: int, num_groups: int, dataset: Any,
                 options: SamplerOptions, settings: dict) -> None:
        super().__init__(len(groups), dataset.starts, options, batch_size, settings)
        self.groups = groups
        self.batch_size = batch_size
        self._counts = np.bincount(groups, minlength=num_groups)
        full = int((self._counts // batch_size).sum())
        tails = 0 if options.drop_last else int((self._counts % batch_size > 0).sum())
        self.num_batches = per_rank(full + tails, options)

    def __len__(self) -> int:
        return self.num_batches

    def num_batches_in(self, epoch: int) -> int:
        return self.num_batches

    def _global(self, epoch: int, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        b = self.batch_size
        # Stream positions grouped, in stream order within each group: a group's j-th
        # full batch is its members j*b .. j*b+b-1, and it leaves when the last arrives.
        by_group = np.argsort(self.groups[order], kind="stable")
        rows, tails, start = [np.zeros((0, b), np.int64)], [], 0
        for count in self._counts.tolist():  # one step per group, never per record
            members = by_group[start : start + count]
            start += count
            full = (count // b) * b
            rows.append(members[:full].reshape(-1, b))
            if full < count and not self.options.drop_last:
                tails.append(members[full:])
        rows = np.concatenate(rows)
        rows = rows[np.argsort(rows[:, -1])]
        flat = np.concatenate([rows.reshape(-1), *tails])
        offsets = np.concatenate([np.arange(len(rows) + 1, dtype=np.int64) * b,
                                  len(rows) * b + np.cumsum([len(t) for t in tails],
                                                            dtype=np.int64)])
        return order[flat], offsets


class _Budget(BoundBatches):
    def __init__(self, spec: BudgetBatches, sizes: np.ndarray, dataset: Any,
                 options: SamplerOptions, settings: dict) -> None:
        n = len(sizes)
        budget, cap = spec.budget, spec.max_batch_size or max(n, 1)
        if n:
            typical = (budget // max(int(np.median(sizes)), 1) if spec.padded
                       else budget / max(float(sizes.mean()), 1.0))
            typical = max(1, min(int(typical), cap))
            window = n if spec.window is None else min(n, spec.window * typical)
        else:
            window = 1
        # The most records a batch can hold, over all epochs: the smallest sizes together.
        if not n:
            most = 1
        elif spec.padded:
            smallest = int(sizes.min())
            most = n if smallest == 0 else budget // smallest
        else:
            most = int(np.searchsorted(np.cumsum(np.sort(sizes)), budget, side="right"))
        most = max(1, min(most, cap, window))
        super().__init__(n, dataset.starts, options, most,
                         {**settings, "sort_window": int(window)})
        self.sizes, self.budget, self.padded = sizes, budget, spec.padded
        self.cap, self.window = cap, window
        # The field the budget counts, if one: a batch never holds more of it than the
        # budget, which bounds that field's slot region (reader.runtime.plan).
        size = spec.size
        self.size_field = (size[len("field:"):] if isinstance(size, str)
                           and size.startswith("field:") else None)

    @property
    def num_batches(self) -> int:
        raise AttributeError("budget batches vary in number from one epoch to the next: "
                             "use num_batches_in(epoch)")

    def _global(self, epoch: int, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n, w = len(order), self.window
        at = np.arange(n, dtype=np.int64)
        win = at // w
        # Largest first within each window; a stable sort keeps the shuffle among ties.
        s = self.sizes[order]
        top = int(s.max(initial=0))
        if (n // w + 1) * (top + 1) < 2**62:  # one int64 key sorts three times faster
            order = order[np.argsort(win * (top + 1) + (top - s), kind="stable")]
        else:
            order = order[np.lexsort((-s, win))]
        s = self.sizes[order]
        if self.padded:  # the first record of a batch is its largest
            step = np.where(s > 0, self.budget // np.maximum(s, 1), n)
        else:
            c = np.zeros(n + 1, np.int64)
            np.cumsum(s, out=c[1:])
            step = np.searchsorted(c, c[:-1] + self.budget, side="right") - 1 - at
        step = np.minimum(np.minimum(step, self.cap), np.minimum((win + 1) * w, n) - at)
        # Every step is >= 1 (bind checked budget >= every size), so this ends; it runs
        # once per batch over a precomputed list, not once per record.
        nxt, starts, i = (at + step).tolist(), [], 0
        while i < n:
            starts.append(i)
            i = nxt[i]
        starts = np.array(starts, np.int64)
        bounds = np.append(starts, n)
        nb = len(starts)
        mode = self.options.shuffle
        if mode:
            rng = np.random.default_rng([self.options.seed, int(epoch), _BATCH_STREAM])
            if mode == "full":
                perm = rng.permutation(nb)
            else:  # "block": batches shuffled within their window, windows kept in order
                perm = np.lexsort((rng.random(nb), win[starts]))
            lengths = bounds[perm + 1] - bounds[perm]
            offsets = np.zeros(nb + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            take = np.repeat(bounds[perm] - offsets[:-1], lengths) + np.arange(n)
            return order[take], offsets
        return order, bounds


# -- the specs ----------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class AspectRatioBatches:
    """Batches of ``batch_size`` records of one aspect-ratio group each.

    The batch size is the Loader's (``Loader(path, 16, batch_sampler=AspectRatioBatches())``),
    handed to :meth:`bind`: one way to pass it.

    Args:
        batch_size: refused (an ``ArgumentError`` naming the Loader's spelling): the
            Loader's ``batch_size`` sizes the batches.
        boundaries: increasing ratios ``width / height`` that split the groups
            (``k`` boundaries make ``k + 1`` groups); the default ``(1.0,)`` puts
            portrait (``w < h``) and landscape (``w >= h``) apart.
        sizes: an integer array ``(num_records, 2)`` of (height, width); None: from
            the dataset's metadata table.
    """

    batch_size: int | None = None
    boundaries: tuple[float, ...] = (1.0,)
    sizes: Any = None

    def __post_init__(self) -> None:
        if self.batch_size is not None:
            raise ArgumentError(f"AspectRatioBatches(batch_size={self.batch_size!r}): the batch "
                                "size is the Loader's, one way: Loader(path, "
                                f"{self.batch_size!r}, batch_sampler=AspectRatioBatches())")
        b = np.asarray(self.boundaries, np.float64) if np.ndim(self.boundaries) == 1 else None
        if b is None or not len(b) or not np.all(np.isfinite(b)) or (b <= 0).any() or (
                np.diff(b) <= 0).any():
            raise ArgumentError(f"boundaries must be increasing positive ratios (width / height), "
                             f"at least one, not {self.boundaries!r}")
        object.__setattr__(self, "boundaries", tuple(b.tolist()))
        if self.sizes is not None:
            object.__setattr__(self, "sizes", _int_array("sizes", self.sizes, 2, 1))

    def bind(self, dataset: Any, batch_size: int | None, options: SamplerOptions) -> BoundBatches:
        """The batch order of this rank over ``dataset``.

        Args:
            batch_size: records per batch (the Loader's).

        Raises:
            ValueError: no ``batch_size``; sizes of the wrong length; unknown sizes in the
                metadata table (names the record).
        """
        if batch_size is None:
            raise ArgumentError("AspectRatioBatches needs a batch_size (the Loader's)")
        size = _positive_int("batch_size", batch_size)
        if self.sizes is None:
            hw, source = image_sizes(dataset), "metadata"
        else:
            _check_length(self.sizes, dataset, "AspectRatioBatches(sizes=...)")
            hw, source = self.sizes, "array"
        ratio = hw[:, 1] / hw[:, 0]
        groups = np.searchsorted(np.asarray(self.boundaries), ratio, side="right")
        groups = groups.astype(np.int64)
        settings = {"batching": "aspect_ratio", "batch_size": size,
                    "boundaries": list(self.boundaries), "sizes": source,
                    "sizes_digest": _digest(groups)}
        return _Grouped(groups, size, len(self.boundaries) + 1, dataset, options, settings)


@dataclass(frozen=True, eq=False)
class BudgetBatches:
    """Batches of variable size whose cost stays within ``budget``.

    Args:
        budget: the most a batch may cost (pixels or tokens), an int >= the largest size.
        size: ``"pixels"`` (width * height from the metadata table), ``"field:NAME"``
            (see :func:`field_sizes`), or an integer array, one size >= 0 per record.
        padded: cost ``max(size) * count`` (the batch padded to its largest record);
            False: ``sum(size)`` (ragged batches).
        max_batch_size: the most records in a batch; None: no limit but the budget.
        window: sort windows hold about this many typical batches (by the median
            size); larger windows pad less, smaller ones mix more. None: the whole epoch.
    """

    budget: int
    size: Any = "pixels"
    padded: bool = True
    max_batch_size: int | None = None
    window: int | None = 64

    def __post_init__(self) -> None:
        object.__setattr__(self, "budget", _positive_int("budget", self.budget))
        if isinstance(self.size, str):
            if self.size != "pixels" and not (self.size.startswith("field:") and self.size[6:]):
                raise ArgumentError(f"size must be 'pixels', 'field:NAME' or an array of sizes, "
                                 f"not {self.size!r}")
        else:
            object.__setattr__(self, "size", _int_array("size", self.size, 1, 0))
        if not isinstance(self.padded, (bool, np.bool_)):
            raise ArgumentTypeError(f"padded must be True or False, not {self.padded!r}")
        object.__setattr__(self, "padded", bool(self.padded))
        object.__setattr__(self, "max_batch_size",
                           _positive_int("max_batch_size", self.max_batch_size, True))
        object.__setattr__(self, "window", _positive_int("window", self.window, True))

    def bind(self, dataset: Any, batch_size: int | None, options: SamplerOptions) -> BoundBatches:
        """The batch order of this rank over ``dataset``.

        Args:
            batch_size: must be None (the Loader's left out): the budget sets the batch
                size (cap it with ``max_batch_size``).

        Raises:
            ValueError: a ``batch_size``; a record larger than the budget (names it);
                sizes of the wrong length or unknown.
        """
        if batch_size is not None:
            raise ArgumentError(f"batch_size={batch_size} with BudgetBatches: the budget sets "
                             f"the batch size: leave the Loader's batch_size out (cap it "
                             f"with BudgetBatches(max_batch_size=...))")
        if isinstance(self.size, np.ndarray):
            _check_length(self.size, dataset, "BudgetBatches(size=...)")
            sizes, source = self.size, "array"
        elif self.size == "pixels":
            hw = image_sizes(dataset)
            sizes, source = hw[:, 0].astype(np.int64) * hw[:, 1], self.size
        else:
            sizes, source = field_sizes(dataset, self.size[6:]), self.size
        if len(sizes) and sizes.max() > self.budget:
            i = int(np.argmax(sizes))
            raise ArgumentError(f"record {i} has size {int(sizes[i])} ({source}), more than the "
                             f"budget {self.budget}: no batch can hold it; raise the budget "
                             f"or leave such records out")
        settings = {"batching": "budget", "budget": self.budget, "padded": self.padded,
                    "max_batch_size": self.max_batch_size, "sizes": source,
                    "sizes_digest": _digest(sizes)}
        return _Budget(self, np.asarray(sizes, np.int64), dataset, options, settings)


# -- figures ------------------------------------------------------------------------------

def padding_waste(batches: Any, sizes: Any) -> float:
    """The share of padding when each batch is padded to its largest member, per axis.

    Args:
        batches: record indices per batch (a list of arrays).
        sizes: per record, ``(height, width)`` rows (images: each batch padded to its
            max height and max width) or one length (sequences).

    Returns:
        padded elements ÷ all elements after padding (0.0 for no elements).
    """
    sizes = np.asarray(sizes, np.int64)
    sizes = sizes.reshape(len(sizes), -1)
    batches = [np.asarray(b, np.int64) for b in batches if len(b)]
    if not batches:
        return 0.0
    lengths = np.array([len(b) for b in batches], np.int64)
    members = sizes[np.concatenate(batches)]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    largest = np.maximum.reduceat(members, starts, axis=0)
    total = int((lengths * largest.prod(axis=1)).sum())
    real = int(members.prod(axis=1).sum())
    return (total - real) / total if total else 0.0
