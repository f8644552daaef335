"""The process machinery that builds batches into shared memory and hands them over.

:mod:`~reader.runtime.runtime` (the :class:`~reader.runtime.runtime.Runtime` a
Loader builds and calls: it owns everything below and emits events upward),
:mod:`~reader.runtime.plan` (the batch plan: what each slot holds and how big it
is), :mod:`~reader.runtime.slots` (the ring of shared-memory slots),
:mod:`~reader.runtime.leases` (a slot comes back once nothing refers to its batch),
:mod:`~reader.runtime.worker` (the worker processes and what they build),
:mod:`~reader.runtime.epoch` (one epoch's delivery in order, and its shutdown),
:mod:`~reader.runtime.sinks` (what a delivered slot becomes: leased views on the
CPU, device arrays on a GPU), :mod:`~reader.runtime.device` (the GPU path's
checks), :mod:`~reader.runtime.decoded_cache` (decoded images kept for later
epochs), :mod:`~reader.runtime.autoscale` (``num_workers="auto"``),
:mod:`~reader.runtime.proc` (what ``/proc`` says about processes and the machine)
and :mod:`~reader.runtime.timing` (per-batch timings).
"""
