"""Size-aware batch samplers, where the README teaches them: ``from reader.batching import
AspectRatioBatches, BudgetBatches`` (they live in :mod:`reader.order.batching`)."""

from .order.batching import AspectRatioBatches, BudgetBatches

__all__ = ["AspectRatioBatches", "BudgetBatches"]
