"""The names a pack works under in the folder it writes, besides the dataset's own.

One place for them, below everything that reads or writes them: the claim
(:mod:`packer.destination`) proves them ours, the range driver
(:mod:`packer.engines.ranges`) writes them, the loop and the source detection
(:mod:`packer.loop`, :mod:`packer.resolve`) tell an unfinished pack by them.

Layout while a pack of ranges runs, with either engine (all under names a
one-process pack never uses, so neither mistakes the other's leftovers for its
own)::

    part-AAAAAAAAAAAA-KKKKK.{rec,idx,meta.parquet}           shard K of the range starting at A
    .shardpack-ranges/plan.json                              the plan fingerprint and the ranges
    .shardpack-ranges/range-AAAAAAAAAAAA-BBBBBBBBBBBB.json   done-marker: range [A, B) is published
    .shardpack-ranges/work-AAAAAAAAAAAA-*/                   a task's scratch (local DST only)
    .shardpack-shuffle/                                      a shuffled container's first pass

Earlier packs kept the range state in ``.ray/`` (named after the engine that
introduced it), for the local engine too. A pack interrupted then still resumes:
the claim renames a local ``.ray/`` that holds its plan (:func:`adopt_legacy_state`),
and the range driver moves the state on object storage
(:func:`packer.engines.ranges.prepare`).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from formats.files import fsync_dir
from formats.shard.ownership import WorkNames

__all__ = ["LEGACY_PLAN_NAME", "LEGACY_STATE_DIR", "PART_FILE", "PLAN_NAME", "SHUFFLE_PASS",
           "STATE_DIR", "WORK", "adopt_legacy_state", "holds_legacy_state", "marker_name",
           "marker_range", "part_name"]

#: The folder of a pack's range state, whichever engine runs the ranges.
STATE_DIR = ".shardpack-ranges"
PLAN_NAME = f"{STATE_DIR}/plan.json"
#: The same folder as earlier packs named it; adopted for a resume, never written.
LEGACY_STATE_DIR = ".ray"
LEGACY_PLAN_NAME = f"{LEGACY_STATE_DIR}/plan.json"
_MARKER = re.compile(rf"^{re.escape(STATE_DIR)}/range-(\d{{12}})-(\d{{12}})\.json$")

#: Exactly the names of the files of the shards :func:`part_name` names.
PART_FILE = re.compile(r"^part-\d{12}-\d{5,}\.(?:rec|idx|meta\.parquet)$")

#: The first pass of a shuffled pack of a container source, a dataset of ours read
#: back in the shuffled order (:mod:`packer.run`).
SHUFFLE_PASS = ".shardpack-shuffle"

#: What ``formats.shard.ownership`` counts as ours when told: the range state (its
#: plan proves it) and ``part-*`` shards, and the first pass of a shuffle.
WORK = WorkNames(STATE_DIR, PLAN_NAME, PART_FILE, (SHUFFLE_PASS,))


def part_name(start: int, k: int) -> str:
    """The base name of shard ``k`` of the range starting at record ``start``."""
    return f"part-{start:012d}-{k:05d}"


def marker_name(start: int, stop: int) -> str:
    """The done-marker of the range ``[start, stop)``."""
    return f"{STATE_DIR}/range-{start:012d}-{stop:012d}.json"


def marker_range(name: str) -> tuple[int, int] | None:
    """``(start, stop)`` of the done-marker ``name``, or None when ``name`` is not one."""
    m = _MARKER.match(name)
    return None if m is None else (int(m[1]), int(m[2]))


def holds_legacy_state(folder: Path) -> bool:
    """Whether ``folder`` holds the range state of an earlier pack (``.ray/`` with its
    plan, a regular file; neither followed through a link)."""
    old = folder / LEGACY_STATE_DIR
    try:
        if old.is_symlink():
            return False
        return stat.S_ISREG(os.stat(folder / LEGACY_PLAN_NAME, follow_symlinks=False).st_mode)
    except OSError:
        return False


def adopt_legacy_state(folder: Path, durable: bool = True) -> bool:
    """Rename the range state an earlier pack left in ``folder`` to :data:`STATE_DIR`,
    so the claim proves it ours and a resume finds it; only where that name is free.
    Called under the claim's lock ("claiming DST", step 2). True when it renamed.
    """
    if not holds_legacy_state(folder) or os.path.lexists(folder / STATE_DIR):
        return False
    os.rename(folder / LEGACY_STATE_DIR, folder / STATE_DIR)
    if durable:
        fsync_dir(folder)
    return True
