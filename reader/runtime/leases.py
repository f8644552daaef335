"""Leased zero-copy batches: a ring slot is refilled only once nothing refers to it.

A CPU batch is a set of views into one slot of the shared ring. Reusing the slot
while the consumer still holds one of those views would change data it already
has (``list(loader)``, ``zip``, "keep the last batch for logging", an autograd
graph holding its inputs) without a word. So every array handed out is made
from a small *handle* object whose ``base`` chain ends in one :class:`_Lease`
per delivered batch; when the last array, slice or tensor made from the batch
is freed, the lease's ``__del__`` puts the slot on the ring's return queue, and
the next ``next()`` collects it. Nothing scans or polls: CPython frees the lease
the moment its last reference goes (a reference cycle holding a batch delays
that until the garbage collector runs; the slot stays leased meanwhile, which
is safe).

The consumer may hold at most :data:`MAX_LEASED` batches as views: the one a
``for`` loop's variable still refers to while ``next()`` runs, the one being
delivered, and one more for a stray reference (the variable of an earlier loop
over the same loader, which Python keeps bound after the loop). A consumer that
holds more gets later batches copied out of the ring (the slot goes back at
once), with one warning naming ``copy=True``: the ring never runs dry and nothing
is overwritten, whatever the consumer keeps.

A process forked while the consumer holds batches (``multiprocessing`` with the
fork start method, to save samples in the background; ``os.fork``) shares the
ring and sees those batches through its own references, which no lease counts.
So a fork the loader does not make itself *pins* the slots held at that moment:
they never return to the ring (the consumer then holds them for good, and later
batches are copied once it holds :data:`MAX_LEASED`), and the child's data never
changes under it. The loader's own worker starts are exempt (:func:`own_fork`).

A lease outlives ``Loader.close()`` safely: its arrays keep the ring's mapping
alive (the unmap is refused while they exist; a named segment is unlinked all
the same), so held batches stay readable and nothing is left in ``/dev/shm``.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from collections import deque
from contextlib import contextmanager

import numpy as np

from ..transforms.collate import Ragged

__all__ = ["MAX_LEASED", "SlotLeases", "own_fork"]

MAX_LEASED = 3


class _Lease:
    """Alive while any array of one delivered batch is; returns its slot when freed."""

    __slots__ = ("returned", "slot")

    def __init__(self, slot: int, returned: deque) -> None:
        self.slot = slot
        self.returned = returned

    def __del__(self) -> None:
        self.returned.append(self.slot)  # deque.append is atomic: safe from any thread


class _Handle:
    """Exposes one slot view through ``__array_interface__`` and keeps its lease alive.

    ``np.asarray(handle)`` makes an array whose ``base`` is the handle, so every
    view of that array keeps the handle, hence the lease, alive. ``view`` keeps
    the ring's mapping exported (not unmappable) for as long as the handle lives.
    """

    __slots__ = ("__array_interface__", "lease", "view")

    def __init__(self, view: np.ndarray, lease: _Lease) -> None:
        self.__array_interface__ = view.__array_interface__
        self.lease = lease
        self.view = view


def _leased(view: np.ndarray, lease: _Lease) -> np.ndarray:
    return np.asarray(_Handle(view, lease))


class SlotLeases:
    """The slots of one ring that the consumer holds, and those it has let go of.

    Args:
        limit: the most batches held as views at once (see :data:`MAX_LEASED`).
    """

    def __init__(self, limit: int = MAX_LEASED) -> None:
        self.limit = limit
        self.held: set[int] = set()
        self._returned: deque[int] = deque()
        self.copied = 0  # batches delivered as copies because too many were held
        self.pinned: set[int] = set()  # held when a process was forked: never reused
        self._warned = False
        _all.add(self)

    def collect(self) -> list[int]:
        """Slots whose batches were freed since the last call."""
        out = []
        returned, held = self._returned, self.held
        while returned:
            slot = returned.popleft()
            if slot in self.pinned:
                continue  # a forked process may still read it
            held.discard(slot)
            out.append(slot)
        return out

    def full(self) -> bool:
        """The consumer already holds ``limit`` batches: the next one must be copied."""
        return len(self.held) >= self.limit

    def lease(self, slot: int, batch: dict, fields) -> dict:
        """``batch`` with its arrays in ``fields`` (those in the slot) made leased views."""
        lease = _Lease(slot, self._returned)
        self.held.add(slot)
        for name in fields:
            v = batch[name]
            if isinstance(v, Ragged):
                batch[name] = Ragged(_leased(v.values, lease), _leased(v.offsets, lease),
                                     None if v.shapes is None else _leased(v.shapes, lease))
            else:
                batch[name] = _leased(v, lease)
        return batch

    def note_copied(self) -> None:
        self.copied += 1
        if not self._warned:
            self._warned = True
            if self.pinned:
                warnings.warn(
                    f"{len(self.pinned & self.held)} batches of this Loader were held when a "
                    "process was forked (it may still read them, so their memory is never "
                    "reused): later batches are copied out of the shared ring (correct, but "
                    "slower). Pass copies to forked processes (batch['image'].copy()), or "
                    "copy=True to the Loader.", RuntimeWarning, stacklevel=5)
                return
            warnings.warn(
                f"the consumer holds {len(self.held)} earlier batches of this Loader, the most "
                "it may hold as zero-copy views of the shared ring: later batches are copied "
                "out of it (correct, but slower). Something keeps them: a list of batches, "
                "arrays or tensors saved for later, the variables of earlier loops over this "
                "loader (del them). Pass copy=True to the Loader when batches are kept.",
                RuntimeWarning, stacklevel=5)


_all: weakref.WeakSet[SlotLeases] = weakref.WeakSet()
_own = threading.local()


@contextmanager
def own_fork():
    """Around the loader's own process starts: they read no batch, nothing is pinned."""
    _own.active = True
    try:
        yield
    finally:
        _own.active = False


def _pin_before_fork() -> None:
    if getattr(_own, "active", False):
        return
    for leases in list(_all):
        leases.pinned |= leases.held


os.register_at_fork(before=_pin_before_fork)
