"""A ring of preallocated shared-memory batch slots.

Workers write a batch's arrays straight into a slot; only the slot id crosses a
queue. Layout (all offsets from the ring's base, which is page aligned)::

    ring   = slot 0 | slot 1 | ... | slot N-1          N * slot_bytes
    slot i = field 0 | pad | field 1 | pad | ...      starts at i * slot_bytes
    field  = a C-contiguous [batch_size, *shape] array of its dtype, at an offset
             within the slot that is a multiple of 4096 (PAGE)

so the whole ring can be page-locked once (``cudaHostRegister`` on
:attr:`SlotRing.address`, :attr:`SlotRing.nbytes`) and each field of a slot is
copied with one contiguous H2D copy from ``address + slot_offset(i) + field.offset``.

Backends: ``"anon"`` is one anonymous ``MAP_SHARED`` mapping made before the
workers are forked: nothing has a name, so nothing can be left behind by a killed
process. ``"shm"`` (for the spawn start method) is a POSIX shared-memory segment
named ``shardpack_<owner pid>_<n>``; a new ring unlinks segments whose owner is dead.
"""

from __future__ import annotations

import itertools
import mmap
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .leases import SlotLeases

__all__ = ["PAGE", "FieldLayout", "SlotLayout", "SlotRing", "reclaim_stale_segments"]

PAGE = 4096
SHM_PREFIX = "shardpack_"
_counter = itertools.count()


def _round_up(n: int, to: int = PAGE) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class FieldLayout:
    """Where one field sits in every slot.

    Attributes:
        name: field name (batch key).
        dtype: numpy dtype string.
        shape: the full per-slot shape, ``(batch_size, *sample_shape)``.
        offset: byte offset within the slot (a multiple of :data:`PAGE`).
        nbytes: bytes of the array (before padding).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class SlotLayout:
    """The fields of one slot and its padded size."""

    fields: tuple[FieldLayout, ...]
    slot_bytes: int

    @classmethod
    def build(cls, specs) -> SlotLayout:
        """From ``(name, dtype, shape)`` triples, each field page aligned, in order."""
        out, at = [], 0
        for name, dtype, shape in specs:
            dt = np.dtype(dtype)
            shape = tuple(int(d) for d in shape)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            out.append(FieldLayout(name, dt.str, shape, at, nbytes))
            at = _round_up(at + max(nbytes, 1))
        return cls(tuple(out), max(at, PAGE))

    def field(self, name: str) -> FieldLayout:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reclaim_stale_segments(shm_dir: str | Path = "/dev/shm") -> list[str]:
    """Unlink ``shardpack_<pid>_*`` segments whose owner process is gone; return their names."""
    removed = []
    d = Path(shm_dir)
    if not d.is_dir():
        return removed
    for p in d.glob(SHM_PREFIX + "*"):
        parts = p.name[len(SHM_PREFIX):].split("_")
        if not parts[0].isdigit() or _pid_alive(int(parts[0])):
            continue
        try:
            p.unlink()
            removed.append(p.name)
        except OSError:
            pass  # someone else reclaimed it first
    return removed


class SlotRing:
    """``num_slots`` slots of ``layout`` in one shared buffer.

    Args:
        layout: the fields of a slot.
        num_slots: ring size.
        backend: ``"anon"`` (inherited by forked workers) or ``"shm"`` (named; can
            be pickled to spawned workers, which attach by name).
    """

    def __init__(self, layout: SlotLayout, num_slots: int, backend: str = "anon") -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, not {num_slots}")
        self.layout = layout
        self.num_slots = int(num_slots)
        self.slot_bytes = layout.slot_bytes
        self.nbytes = self.slot_bytes * self.num_slots
        self.backend = backend
        self.name: str | None = None
        self._owner = os.getpid()
        self.leases = SlotLeases()  # the slots the consumer still holds (main process only)
        if backend == "anon":
            self._mm = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
        elif backend == "shm":
            from multiprocessing import shared_memory

            reclaim_stale_segments()
            self.name = f"{SHM_PREFIX}{os.getpid()}_{next(_counter)}"
            self._shm = shared_memory.SharedMemory(self.name, create=True, size=self.nbytes)
            self._mm = self._shm._mmap
        else:
            raise ValueError(f"backend must be 'anon' or 'shm', not {backend!r}")
        self._setup()

    def _setup(self) -> None:
        self.array = np.frombuffer(self._mm, np.uint8, self.nbytes)
        self._views = [self._make_views(i) for i in range(self.num_slots)]

    def _make_views(self, i: int) -> dict[str, np.ndarray]:
        base = i * self.slot_bytes
        return {
            f.name: np.frombuffer(self._mm, f.dtype, int(np.prod(f.shape, dtype=np.int64)),
                                  base + f.offset).reshape(f.shape)
            for f in self.layout.fields
        }

    # -- what the GPU side needs -------------------------------------------------------

    @property
    def buffer(self) -> memoryview:
        """The whole ring as a writable memoryview (page-aligned base)."""
        return memoryview(self._mm)

    @property
    def address(self) -> int:
        """Base address of the ring (for ``cudaHostRegister``)."""
        return self.array.ctypes.data

    def slot_offset(self, i: int) -> int:
        """Byte offset of slot ``i`` from the ring base."""
        return i * self.slot_bytes

    def slot_view(self, i: int) -> dict[str, np.ndarray]:
        """Field name -> full ``[batch_size, ...]`` array view of slot ``i``."""
        return self._views[i]

    # -- lifetime ----------------------------------------------------------------------

    def __getstate__(self) -> dict:
        if self.backend != "shm":
            raise TypeError("an 'anon' SlotRing is inherited by fork, it cannot be pickled; "
                            "use backend='shm' with the spawn start method")
        return {"layout": self.layout, "num_slots": self.num_slots, "name": self.name,
                "owner": self._owner}

    def __setstate__(self, state: dict) -> None:
        from multiprocessing import shared_memory

        self.layout = state["layout"]
        self.num_slots = state["num_slots"]
        self.slot_bytes = self.layout.slot_bytes
        self.nbytes = self.slot_bytes * self.num_slots
        self.backend = "shm"
        self.name = state["name"]
        self._owner = state["owner"]
        if sys.version_info >= (3, 13):
            self._shm = shared_memory.SharedMemory(self.name, track=False)
        else:
            # Attaching registers the name with the resource tracker, which spawned
            # workers share with the owner: a duplicate entry in its set, removed by
            # the owner's unlink. Unregistering here would remove the owner's entry
            # and make that unlink warn at exit.
            self._shm = shared_memory.SharedMemory(self.name)
        self._mm = self._shm._mmap
        self._setup()

    def close(self) -> None:
        """Drop the views and unmap; the owner also unlinks a named segment. Idempotent."""
        if getattr(self, "_views", None) is None:
            return
        self._views = None
        self.array = None
        if self.backend == "shm":
            shm = self._shm
            try:
                shm.close()
            except BufferError:
                # A batch view is still alive; the mapping goes with it. Hand the map
                # to those views alone, so SharedMemory's own __del__ doesn't try
                # (and fail, noisily) to close it again at exit.
                shm._mmap = None
            if os.getpid() == self._owner:
                try:
                    shm.unlink()
                except FileNotFoundError:
                    pass
        else:
            try:
                self._mm.close()
            except BufferError:
                pass  # a batch view is still alive; the mapping is freed with it

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
