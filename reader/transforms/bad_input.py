"""What a sample whose bytes do not decode becomes: the Loader's ``on_error``, decided once.

``on_error`` (its values checked by :class:`reader.options.DecodeOptions`) is
resolved into one :class:`BadInput` value when the Loader is built, and handed to
the batch plan (:func:`reader.runtime.plan.plan_batch`) and to every builder of a
batch. Each builder (the classification path of
:class:`reader.runtime.worker.BatchBuilder`, the sample path of
:class:`reader.transforms.sample.SampleBuilder`) hands each
:class:`reader.errors.DecodeError` to :meth:`BadInput.reject`; the batch plan
asks :meth:`BadInput.slot_specs` whether a batch carries a ``valid`` mask. No
other code reads ``on_error`` (WebDataset's ``handlers.py`` is the model: the
policy is a value handed to one handler).

The rule, the same on every path:

* ``"fail"``: the error goes on; the builder names the shard, record and byte
  offset (a :class:`formats.errors.CorruptRecordError`) and the batch fails.
* ``"skip"``: the sample stays in its batch, in its place, marked False in the
  batch's ``valid`` mask (a bool array, present only in this mode) and counted
  (the batch's ``skipped``, summed into ``Loader.skipped``); its decoded fields
  are zeros (a varying-size one has size 0) and its annotations are empty.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["VALID_FIELD", "BadInput"]

VALID_FIELD = "valid"  # the batch's mask of samples that decoded (on_error="skip" only)


@dataclass(frozen=True)
class BadInput:
    """The bad-input policy: ``on_error`` as a value.

    Attributes:
        on_error: ``"fail"`` or ``"skip"``, as the Loader was given it.
    """

    on_error: str = "fail"

    @property
    def skips(self) -> bool:
        """Bad samples are skipped (marked invalid) rather than failing their batch."""
        return self.on_error == "skip"

    def slot_specs(self, batch_size: int) -> list[tuple[str, type, tuple[int]]]:
        """The slot arrays this policy adds to a batch that decodes images: the
        ``valid`` mask when it skips, else none."""
        return [(VALID_FIELD, np.bool_, (batch_size,))] if self.skips else []

    def reject(self, exc: BaseException, valid: np.ndarray | None, i: int) -> None:
        """Sample ``i`` of a batch did not decode (``exc``): raise ``exc`` (``"fail"``),
        or mark it False in ``valid`` (``"skip"``); the caller then blanks the sample
        and counts it.

        Raises:
            DecodeError: ``exc``, when the policy fails (or the batch has no mask).
        """
        if not self.skips or valid is None:
            raise exc
        valid[i] = False
