"""Data access: opening a dataset where it lies, local or in object storage.

:mod:`~reader.data.dataset` (``open_dataset``, batched reads, paging a batch's
records in), :mod:`~reader.data.remote` (a dataset in object storage, read through
the shard cache of :mod:`formats.storage.cache`, with a prefetcher that fetches the
shards the order asks for next).
"""
