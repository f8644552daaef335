"""``reader.Mix``: several datasets read as one stream, each by its weight."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from formats.errors import ArgumentError, ArgumentTypeError

__all__ = ["Mix"]


class Mix:
    """Several datasets (*sources*) mixed into one stream of samples by weight.

    Pass it to :class:`reader.Loader` in place of a dataset: ``Loader(Mix({"web":
    "web.shards", "code": "code.shards"}, weights={"web": 0.8, "code": 0.2}),
    batch_size=256, shuffle=True)``, or to :class:`reader.TokenBlocks` for blocks of each
    source's token stream (every count below then counts blocks). Each source keeps its
    own shuffled order and its own pass counter: a source that runs out starts its next
    pass (a new permutation) while the others go on. Which source feeds each sample is a pure function of the
    seed and the sample's place in the stream, so it is the same for any number of
    workers and ranks, and a state saved at one world size, worker count or batch size
    resumes at another (:meth:`reader.Loader.load_state_dict`). A state saved with other
    weights, or other sources, re-plans: each source still present continues its
    pass where it was.

    Args:
        sources: name -> dataset folder (or open ``ShardDataset``). Names identify a
            source in states and reports: keep a source's name when you re-plan.
        weights: name -> weight (> 0; normalized). ``None`` (the default) weighs each
            source by its records, so one epoch of the default length is one pass of
            every source, all finishing together. Integer weights are exact
            proportions; floats are rounded to about 10^-6 of their sum.
        samples_per_epoch: samples (all ranks) in one epoch of the Loader; ``None``:
            the sources' records added up. An epoch is a count of steps; the stream
            goes on across epochs (a remainder smaller than one step of all ranks
            starts the next epoch), so every batch is full.

    Raises:
        ArgumentTypeError, ArgumentError: no sources, a name that is not a non-empty
            string, a weight for an unknown source, a missing or non-positive weight.
    """

    def __init__(self, sources: Mapping[str, str | Path | Any],
                 weights: Mapping[str, float] | None = None, *,
                 samples_per_epoch: int | None = None) -> None:
        if not isinstance(sources, Mapping):
            raise ArgumentTypeError("Mix(sources): sources must be a dict of name -> dataset "
                                    f"folder, not {type(sources).__name__}")
        if not sources:
            raise ArgumentError("Mix(sources): no sources; give at least one name -> dataset")
        for name in sources:
            if not isinstance(name, str) or not name:
                raise ArgumentTypeError(f"Mix(sources): a source name must be a non-empty "
                                        f"string, not {name!r}")
            try:
                name.encode("utf-8")  # it keys states and ledgers (JSON, hashed as UTF-8)
            except UnicodeEncodeError:
                raise ArgumentError(f"Mix(sources): the source name {name!a} is not "
                                    "text (it holds a lone surrogate)") from None
        self.sources = dict(sources)
        if weights is None:
            self.weights = None
        else:
            self.weights = _checked_weights(weights, self.sources)
        if samples_per_epoch is not None:
            if (isinstance(samples_per_epoch, bool)
                    or not isinstance(samples_per_epoch, numbers.Integral)
                    or samples_per_epoch < 1):
                raise ArgumentError("Mix(samples_per_epoch): an int >= 1 or None, not "
                                    f"{samples_per_epoch!r}")
            samples_per_epoch = int(samples_per_epoch)
        self.samples_per_epoch = samples_per_epoch

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.sources)

    def __repr__(self) -> str:
        w = "" if self.weights is None else f", weights={self.weights!r}"
        return f"Mix({ {n: str(s) for n, s in self.sources.items()}!r}{w})"


def _checked_weights(weights: Any, sources: dict) -> dict:
    if not isinstance(weights, Mapping):
        raise ArgumentTypeError("Mix(weights): weights must be a dict of source name -> "
                                f"weight, not {type(weights).__name__}")
    unknown = sorted(map(str, set(weights) - set(sources)))
    if unknown:
        raise ArgumentError(f"Mix(weights): no source named {', '.join(map(repr, unknown))}; "
                            f"the sources are {', '.join(map(repr, sources))}")
    missing = [n for n in sources if n not in weights]
    if missing:
        raise ArgumentError(f"Mix(weights): no weight for {', '.join(map(repr, missing))}; "
                            "give every source a weight (or leave weights out: by size)")
    out = {}
    for name in sources:
        w = weights[name]
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not w > 0 or w == float("inf"):
            raise ArgumentError(f"Mix(weights): the weight of {name!r} must be a finite "
                                f"number > 0, not {w!r} (leave a source out to drop it)")
        out[name] = int(w) if isinstance(w, numbers.Integral) else float(w)
    return out
