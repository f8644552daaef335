"""Order: which records make each batch, seeded, per rank and resumable.

:mod:`~reader.order.sampler` (the plain order: shuffled fully, by blocks or not at
all, split between ranks), :mod:`~reader.order.batching` (size-aware batches:
aspect-ratio groups, pixel or token budgets) and :mod:`~reader.order.tokens` (fixed
blocks of a token stream for language models).
"""
