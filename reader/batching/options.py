"""The order's options, and the value checks every option record of the reader uses.

This module sits at the bottom of :mod:`reader`: :mod:`reader.batching` reads
:class:`SamplerOptions`, and :mod:`reader.options` (the Loader's other records,
which know the pipeline's and the runtime's types) builds on the checks here. It
imports nothing of the reader, so neither side needs a lazy import to reach it.

The type rules of every check: ``bool`` is not an int (``num_workers=True`` is
refused), a ``str`` is never a number (``batch_size="32"`` is refused), numpy
integers and booleans count as ints and bools and are stored as Python ones.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from formats.errors import ArgumentError, ArgumentTypeError

__all__ = ["SHUFFLE_MODES", "SamplerOptions", "check_batch_size", "check_bool", "check_choice",
           "check_int", "check_int_or_auto", "set_field"]

SHUFFLE_MODES = (False, "block", "full")


def check_int(name: str, value: Any, minimum: int | None = None, extra: str = "") -> int:
    """``value`` as an int (``bool`` and ``str`` refused), at least ``minimum``;
    ``extra`` completes "must be an int" in messages (e.g. " or 'auto'")."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        what = "an int" + (f" >= {minimum}" if minimum is not None else "") + extra
        raise ArgumentTypeError(f"{name} must be {what}, not {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ArgumentError(f"{name} must be an int >= {minimum}{extra}, not {value}")
    return value


def check_int_or_auto(name: str, value: Any, minimum: int) -> int | str:
    if isinstance(value, str):
        if value == "auto":
            return value
        raise ArgumentError(f"{name} must be an int >= {minimum} or 'auto', not {value!r}")
    return check_int(name, value, minimum, " or 'auto'")


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be True or False, not {type(value).__name__} {value!r}")
    return bool(value)


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        options = ", ".join(map(repr, allowed))
        raise (ArgumentError if isinstance(value, str) else ArgumentTypeError)(
            f"{name} must be one of {options}, not {value!r}")
    return value


def set_field(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # frozen dataclasses: normalized in __post_init__


def check_batch_size(value: Any) -> int:
    """The Loader's ``batch_size`` as an int >= 1.

    Raises:
        TypeError: not an int (a ``bool``, a ``str`` such as ``"32"``, a float).
        ValueError: an int below 1.
    """
    return check_int("batch_size", value, 1)


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        return int(text)
    except ValueError:
        raise ArgumentError(f"environment variable {name}={text!r} is not an integer") from None


@dataclass(frozen=True)
class SamplerOptions:
    """Which records, in which order, for which rank.

    Args:
        shuffle: ``False`` (storage order), ``"block"`` (shard order shuffled, then
            records shuffled within windows of ``shuffle_window`` consecutive records:
            near-sequential IO with good mixing) or ``"full"`` (a global
            permutation). ``True`` means ``"full"``.
        seed: the order is a pure function of (seed, epoch, rank, world_size).
        drop_last: ``True`` drops the tail so every rank gets ``len // world_size``
            records and drops a last partial batch; ``False`` pads by wrapping to
            the start of the epoch's order (like torch's DistributedSampler) so
            every rank gets ``ceil(len / world_size)`` records, and yields the last
            partial batch. Either way every rank gets the same number of batches.
        rank: this process's rank in ``[0, world_size)``; ``None``: ``$RANK`` (as
            torchrun sets it), else 0.
        world_size: number of ranks splitting each epoch; ``None``:
            ``$WORLD_SIZE``, else 1.
        shuffle_window: records per shuffle window for ``"block"`` (refused with the
            other modes).
    """

    shuffle: bool | str = False
    seed: int = 0
    drop_last: bool = False
    rank: int | None = None
    world_size: int | None = None
    shuffle_window: int = 4096

    def __post_init__(self) -> None:
        shuffle = self.shuffle
        if isinstance(shuffle, (bool, np.bool_)):
            shuffle = "full" if shuffle else False
        elif not isinstance(shuffle, str) or shuffle not in SHUFFLE_MODES:
            raise (ArgumentError if isinstance(shuffle, str) else ArgumentTypeError)(
                f"shuffle must be False, True, 'block' or 'full', not {shuffle!r}")
        set_field(self, "shuffle", shuffle)
        set_field(self, "seed", check_int("seed", self.seed, 0))
        set_field(self, "drop_last", check_bool("drop_last", self.drop_last))
        world_size = (_env_int("WORLD_SIZE", 1) if self.world_size is None
                      else check_int("world_size", self.world_size, 1))
        rank = _env_int("RANK", 0) if self.rank is None else check_int("rank", self.rank)
        if world_size < 1 or not 0 <= rank < world_size:
            raise ArgumentError(f"rank {rank} is not in [0, world_size={world_size})")
        set_field(self, "rank", rank)
        set_field(self, "world_size", world_size)
        set_field(self, "shuffle_window", check_int("shuffle_window", self.shuffle_window, 1))
        if shuffle != "block" and self.shuffle_window != SamplerOptions.shuffle_window:
            raise ArgumentError(f"shuffle_window={self.shuffle_window} would have no effect: it "
                             f"sizes the windows of shuffle='block', and shuffle={shuffle!r}")
