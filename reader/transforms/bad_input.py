"""What a sample whose record is damaged becomes: the Loader's ``on_error``, decided once.

``on_error`` (its values checked by :class:`reader.options.DecodeOptions`) is
resolved into one :class:`BadInput` value when the Loader is built, and handed to
the batch plan (:func:`reader.runtime.plan.plan_batch`) and to every builder of a
batch. Each builder (the classification path of
:class:`reader.runtime.worker.BatchBuilder`, the sample path of
:class:`reader.transforms.sample.SampleBuilder`) hands each
:class:`reader.errors.DecodeError` to :meth:`BadInput.reject`; the batch plan
asks :meth:`BadInput.slot_specs` whether a batch carries a ``valid`` mask; under
``"replace"`` :class:`reader.runtime.worker.BatchBuilder` asks :meth:`BadInput.substitutes`
what stands in for a bad record. No other code reads ``on_error`` (WebDataset's
``handlers.py`` is the model: the policy is a value handed to one handler).

The rule, the same on every path:

* ``"fail"``: the error goes on; the builder names the shard, record and byte
  offset (a :class:`formats.errors.CorruptRecordError`) and the batch fails.
* ``"skip"``: the sample stays in its batch, in its place, marked False in the
  batch's ``valid`` mask (a bool array) and counted (the batch's ``skipped``,
  summed into ``Loader.skipped``); its decoded fields are zeros (a varying-size one
  has size 0) and its annotations are empty. A record that fails its checksum
  still fails the batch.
* ``"replace"``: a record that fails its checksum (a
  :class:`formats.errors.CorruptRecordError` from the dataset's read of any field
  the batch reads) or does not decode (a ``DecodeError``) is replaced, in its place,
  by another record of the same source (the same dataset; for a :class:`reader.Mix`,
  the same source), and the batch is built again as if its order had named that
  record there (the same random stream, so the batch is the one the order with the
  replacement would give). The replacement is :meth:`BadInput.replacement`: a draw,
  uniform over the source's other records, that is a pure function of (seed, the
  bad record's number within its source, attempt). A replacement that is bad too is
  replaced by the next attempt's draw; after :data:`REPLACE_ATTEMPTS` the batch fails
  with a ``CorruptRecordError`` naming the bad record and every record tried. The
  batch keeps its size and its ``valid`` mask (present, as under ``"skip"``, so code
  written for it runs unchanged) is all True: every sample is real data.

Why a pure function: whichever worker builds a batch, with however many workers,
ranks or restarts, it builds the same batch, so a resumed run serves what a
straight one does bit for bit and every rank keeps its step count (a skipped
sample would not). Nothing the run has seen (the :class:`Quarantine` below) feeds
the choice: it only records it.

What it costs: on a clean batch, saving the batch's random stream and reading its
mask (a few microseconds), and checking in the worker the checksums of the fields the
main process reads (about 110 us for 128 short strings: 0.1 % of a 120 ms batch;
``scripts/bench_safety.py``). A batch holding a record that fails its checksum is
read again before anything in it is decoded (the reads that check come first); one
holding an undecodable image is decoded again, whole: with 1 % of images undecodable
and batches of 128 (most batches hit) the rate was 0.6 of the clean one, with one
record in 10^4 about 1 % of batches are built twice.

The quarantine: each batch that replaced records says so (the worker's
:class:`reader.runtime.worker.BatchDone` carries ``(position, record, replacement)``
triples); as the main process delivers the batch it records the records in the
Loader's :class:`Quarantine` (``loader.quarantine``, ``loader.replaced``), which
``state_dict()`` carries as ``state["quarantine"]`` and ``load_state_dict``
restores.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from formats.errors import CorruptRecordError

from ..data.mixed import MixedDataset
from ..errors import StateError
from ..options import check_count

__all__ = ["QUARANTINE_MAX", "REPLACE_ATTEMPTS", "VALID_FIELD", "BadInput", "Quarantine",
           "Substitutes"]

log = logging.getLogger(__name__)

VALID_FIELD = "valid"  # the batch's mask of samples that are data ("skip" and "replace")
REPLACE_ATTEMPTS = 8  # records drawn to replace one bad record before its batch fails
QUARANTINE_MAX = 4096  # distinct replaced records the quarantine lists (and the state carries)
_DRAW_KEY = 0x7E91ACE  # keeps the replacement draw apart from the order's and transforms' streams


@dataclass(frozen=True)
class BadInput:
    """The bad-input policy: ``on_error`` as a value.

    Attributes:
        on_error: ``"fail"``, ``"skip"`` or ``"replace"``, as the Loader was given it.
        seed: the Loader's seed, which keys the replacement draw (``"replace"``).
    """

    on_error: str = "fail"
    seed: int = 0

    @property
    def skips(self) -> bool:
        """Bad samples are skipped (marked invalid) rather than failing their batch."""
        return self.on_error == "skip"

    @property
    def replaces(self) -> bool:
        """Bad records are replaced by other records of their source."""
        return self.on_error == "replace"

    @property
    def tolerant(self) -> bool:
        """A bad sample does not fail its batch (it is skipped or replaced)."""
        return self.on_error != "fail"

    def slot_specs(self, batch_size: int) -> list[tuple[str, type, tuple[int]]]:
        """The slot arrays this policy adds to a batch that decodes images: the
        ``valid`` mask when bad samples do not fail the batch, else none."""
        return [(VALID_FIELD, np.bool_, (batch_size,))] if self.tolerant else []

    def reject(self, exc: BaseException, valid: np.ndarray | None, i: int) -> None:
        """Sample ``i`` of a batch did not decode (``exc``): raise ``exc`` (``"fail"``),
        or mark it False in ``valid`` (``"skip"``; under ``"replace"`` the builder then
        replaces what is marked); the caller then blanks the sample and counts it.

        Raises:
            DecodeError: ``exc``, when the policy fails (or the batch has no mask).
        """
        if not self.tolerant or valid is None:
            raise exc
        valid[i] = False

    def replacement(self, ds, index: int, attempt: int) -> int | None:
        """The record of ``ds`` (a dataset index) that replaces record ``index`` at
        ``attempt`` (1, 2, ...): uniform over the other records of its source, a pure
        function of (seed, its number within the source, attempt); None when the
        source has no other record."""
        start, size, _ = _source(ds, index)
        r = int(index) - start
        if size < 2:
            return None
        x = int(np.random.default_rng([_DRAW_KEY, self.seed, r, int(attempt)]).integers(size - 1))
        return start + (x if x < r else x + 1)

    def substitutes(self, ds, indices: np.ndarray) -> Substitutes:
        """One batch's replacements, for a builder that found bad records in it."""
        return Substitutes(self, ds, indices)


class Substitutes:
    """The replacements of one batch's bad records, as a builder finds them.

    ``served`` is the batch's records with each bad one's current replacement in its
    place; :meth:`replace` moves the given positions to their next draw.
    """

    def __init__(self, policy: BadInput, ds, indices: np.ndarray) -> None:
        self.policy = policy
        self.ds = ds
        self.indices = np.asarray(indices, np.int64)
        self.served = self.indices.copy()
        self.tried: dict[int, list[int]] = {}  # position -> the records tried there, in order

    def replace(self, positions) -> np.ndarray:
        """The records at ``positions`` were bad: draw the next replacement of each.

        Returns:
            ``served``, updated.

        Raises:
            CorruptRecordError: a position's record and its :data:`REPLACE_ATTEMPTS`
                replacements were all bad, or its source has no other record (names
                the record, its shard and every record tried).
        """
        for p in positions:
            p = int(p)
            original = int(self.indices[p])
            chain = self.tried.setdefault(p, [original])
            attempt = len(chain)
            pick = (self.policy.replacement(self.ds, original, attempt)
                    if attempt <= REPLACE_ATTEMPTS else None)
            if pick is None:
                raise self._exhausted(original, chain)
            chain.append(pick)
            self.served[p] = pick
        return self.served

    def replaced(self) -> tuple[tuple[int, int, int], ...]:
        """``(position, record, replacement)`` of each replaced sample, by position."""
        return tuple((p, int(self.indices[p]), int(self.served[p])) for p in sorted(self.tried))

    def _exhausted(self, original: int, chain: list[int]) -> CorruptRecordError:
        start, size, name = _source(self.ds, original)
        field = self.ds.fields[0].name
        path, r, offset = self.ds.where(original, field)
        within = f"record {original - start} of source {name!r}" if name is not None \
            else f"dataset record {original}"
        if size < 2:
            why = "its source has no other record to replace it with"
        else:
            tried = ", ".join(str(c - start) for c in chain[1:])
            why = (f"so are the {len(chain) - 1} records drawn to replace it ({tried}); "
                   f"on_error='replace' tries {REPLACE_ATTEMPTS}: much of this source is "
                   "damaged (inspect-shards verify lists the records)")
        return CorruptRecordError(f"{within} fails its checksum or does not decode, and {why}",
                                  path=path, record=r, offset=offset)


class Quarantine:
    """The records ``on_error="replace"`` replaced so far (the Loader's ``quarantine``).

    Entries are ``(source, record, replacement)``: the source's name in a
    :class:`reader.Mix` (None for one dataset), the record and what replaced it,
    both numbered within that source; each record once, in the order its batch was
    delivered. ``replaced`` counts replaced samples (a record replaced in every epoch
    counts every time).

    Bounded: it lists at most :data:`QUARANTINE_MAX` records (about 100 KB of state).
    Past that, records are still replaced as before (no batch depends on this list)
    and counted in ``replaced``, but no longer listed; a warning says so once.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[str | None, int], int] = {}  # (source, record) -> replacement
        self.replaced = 0
        self._warned = False  # about the bound

    def add(self, ds, index: int, replacement: int) -> None:
        """Record ``index`` of ``ds`` (a dataset index) was served as ``replacement``."""
        self.replaced += 1
        start, _, name = _source(ds, index)
        key = (name, int(index) - start)
        if key in self._entries:
            return
        if len(self._entries) >= QUARANTINE_MAX:
            if not self._warned:
                self._warned = True
                log.warning("on_error='replace' has replaced %d distinct records; the quarantine "
                            "lists no more (they are still replaced and counted in "
                            "loader.replaced)", QUARANTINE_MAX)
            return
        self._entries[key] = int(replacement) - start

    @property
    def entries(self) -> list[tuple[str | None, int, int]]:
        return [(*k, v) for k, v in self._entries.items()]

    def state(self) -> dict:
        """What ``state_dict()`` carries: ``{"records": [[source, record, replacement],
        ...], "replaced": count}``."""
        return {"records": [list(e) for e in self.entries], "replaced": self.replaced}

    @classmethod
    def from_state(cls, state) -> Quarantine:
        """The quarantine a state carries (None or absent: an empty one).

        Raises:
            StateError: ``state`` is not what :meth:`state` returns.
        """
        q = cls()
        if state is None:
            return q
        try:
            if not isinstance(state, Mapping):
                raise TypeError(type(state).__name__)
            q.replaced = check_count(state["replaced"])
            for source, record, replacement in state["records"]:
                if source is not None and not isinstance(source, str):
                    raise TypeError(f"source {source!r}")
                q._entries[(source, check_count(record))] = check_count(replacement)
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"state['quarantine'] must be what state_dict() saved, "
                             f"{{'records': [[source, record, replacement], ...], 'replaced': "
                             f"n}}; found {state!r:.200} ({type(exc).__name__}: {exc})") from None
        if len(q._entries) > QUARANTINE_MAX:
            raise StateError(f"state['quarantine'] lists {len(q._entries)} records, more than "
                             f"the {QUARANTINE_MAX} a quarantine holds")
        return q


def _source(ds, index: int) -> tuple[int, int, str | None]:
    """(first dataset index, records, name or None) of the source holding record ``index``."""
    if isinstance(ds, MixedDataset):
        s, _ = ds.part_of(index)
        return int(ds.offsets[s]), len(ds.parts[s]), ds.names[s]
    return 0, len(ds), None
