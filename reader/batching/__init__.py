"""Batching: which records make each batch, seeded, per rank and resumable.

The face of the order: ``from reader.batching import AspectRatioBatches,
BudgetBatches, Mix, TokenBlocks`` (each also on :mod:`reader`).
The modules behind it:
:mod:`~reader.batching.sampler` (the plain order: shuffled fully, by blocks or not at
all, split between ranks), :mod:`~reader.batching.batching` (size-aware batches:
aspect-ratio groups, pixel or token budgets) and :mod:`~reader.batching.tokens` (fixed
blocks of a token stream for language models, read by
:mod:`~reader.batching.token_source` and planned by :mod:`~reader.batching.token_plan`);
above them the plan of a mixture, which ``Loader`` and ``TokenBlocks`` both consume:
:mod:`~reader.batching.mix` (``Mix``, the sources and weights),
:mod:`~reader.batching.arrangement` (which source feeds each position of the stream)
and :mod:`~reader.batching.mixture` (positions to records, epochs, states, re-plans).
"""

from .batching import AspectRatioBatches, BudgetBatches
from .mix import Mix
from .tokens import TokenBlocks

__all__ = ["AspectRatioBatches", "BudgetBatches", "Mix", "TokenBlocks"]
