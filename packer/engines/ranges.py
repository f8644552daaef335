"""The range driver's work on disk: contiguous ranges, their shards, done-markers.

Nothing here needs Ray; the range driver (:mod:`packer.engines.driver`) uses it,
whether its ranges run as Ray tasks or in local worker processes. The names it
writes in DST are :mod:`packer.work_names`'s (its docstring shows the layout).

Invariants:

* A range's shard names depend only on the range and the shard's place in it,
  so a rerun or a retry writes the same names (and the same bytes: shard files
  never hold their own name).
* A done-marker is written only after every shard of its range is published
  (and, when durable, flushed); it holds the range's shard entries, skip lines
  and counters, so a resume needs nothing else from the run that wrote it.
* ``manifest.json`` is written last, after ``skipped.jsonl``; the state folder
  (:data:`~packer.work_names.STATE_DIR`) is removed after it. A DST without a
  manifest is never a dataset.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from formats import ShardEntry
from formats.checksum import parse_crc
from formats.fields import IMAGE_TYPES
from formats.files import atomic_write_bytes, fsync_dir
from formats.shard.manifest import MANIFEST_NAME, Written
from formats.shard.ownership import (
    JOURNAL_NAME,
    SKIPPED_NAME,
    SKIPPED_PARTIAL_NAME,
    is_our_shard_name,
)
from formats.storage import Location, is_uri, open_location

from ..errors import PackError
from ..work_names import (
    LEGACY_PLAN_NAME,
    LEGACY_STATE_DIR,
    PART_FILE,
    PLAN_NAME,
    STATE_DIR,
    marker_name,
    marker_range,
    part_name,
)

__all__ = ["Output", "RangeResult", "prepare", "split"]

_MARKER_LIMIT = 64 << 20  # a marker holds a range's skip lines: generous, yet bounded
# What a pack of either engine writes into DST, by exact name (formats.shard.ownership);
# cleared before a fresh pack. A local DST was claimed (packer.destination) before this,
# so only our files are there; on object storage the names are all we have.
_OURS_NAMES = (JOURNAL_NAME, SKIPPED_NAME, SKIPPED_PARTIAL_NAME)


def split(n: int, size: int) -> list[tuple[int, int]]:
    """``[0, n)`` as contiguous ``(start, stop)`` ranges of ``size`` records (the last shorter)."""
    return [(a, min(a + size, n)) for a in range(0, n, size)]


@dataclass
class RangeResult:
    """What one task made of its range: the done-marker's content.

    Attributes:
        start, stop: the range ``[start, stop)`` of the (shuffled) listing.
        plan: the fingerprint of the pack that made it.
        shards: its shards, in order, named by :func:`part_name`.
        skips: its lines of ``skipped.jsonl``, in order.
        skipped: skip counts by kind.
        records_written, bytes_in: counters.
        alignment: the shards' payload alignment.
        max_raw_size: per compressed field, the largest raw value.
        field_types: each field's type as the range's writer stored it (an image
            field is typed by what it holds).
    """

    start: int
    stop: int
    plan: str
    shards: list[ShardEntry]
    skips: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    records_written: int = 0
    bytes_in: int = 0
    alignment: int = 0
    max_raw_size: dict[str, int] = field(default_factory=dict)
    field_types: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "stop": self.stop, "plan": self.plan,
                "shards": [s.to_json() for s in self.shards], "skips": self.skips,
                "skipped": self.skipped, "records_written": self.records_written,
                "bytes_in": self.bytes_in, "alignment": self.alignment,
                "max_raw_size": self.max_raw_size, "field_types": self.field_types}

    @classmethod
    def from_json(cls, obj: Any, where: str, per_input: bool = True) -> RangeResult:
        """Parse a done-marker; names must be exactly the range's own.

        ``per_input``: each input is one record, written or skipped (a listing), so the
        counts must add up to the range; a function's input may give any number.

        Raises:
            PackError: anything missing, mistyped or misnamed (``where`` names the marker).
        """
        try:
            shards = []
            for k, s in enumerate(obj["shards"]):
                crcs = {c: parse_crc(s[c]) for c in ("data_crc32c", "index_crc32c", "meta_crc32c")}
                if None in crcs.values() or s["name"] != part_name(obj["start"], k):
                    raise ValueError(f"shard {k}")
                shards.append(ShardEntry(**{**s, **crcs}))
            out = cls(int(obj["start"]), int(obj["stop"]), str(obj["plan"]), shards,
                      [str(x) for x in obj["skips"]], dict(obj["skipped"]),
                      int(obj["records_written"]), int(obj["bytes_in"]), int(obj["alignment"]),
                      dict(obj["max_raw_size"]),
                      {str(k): str(v) for k, v in obj["field_types"].items()})
        except (KeyError, TypeError, ValueError) as exc:
            raise PackError(f"not a valid done-marker ({exc})", path=where) from None
        counted = out.records_written + sum(out.skipped.values())
        if (per_input and counted != out.stop - out.start) or \
                sum(s.records for s in shards) != out.records_written:
            raise PackError("done-marker counts disagree with its range", path=where,
                            found=counted, expected=out.stop - out.start)
        return out

    def written(self, fields) -> Written:
        """What the range wrote, for :func:`formats.shard.manifest.build_manifest`
        (``fields``: the pack's schema, as declared)."""
        images = {f.name: {self.field_types.get(f.name, f.type)} for f in fields
                  if f.type in IMAGE_TYPES} if self.records_written else {}
        return Written(tuple(self.shards), self.alignment, self.max_raw_size, images)

    def files(self) -> dict[str, int]:
        """Every file its shards published, name -> size."""
        out = {}
        for s in self.shards:
            out[s.data_file], out[s.index_file], out[s.meta_file] = (
                s.data_bytes, s.index_bytes, s.meta_bytes)
        return out


class Output:
    """DST as the driver and the tasks write it: a local folder or a :class:`Location`.

    A local DST is written by renames (a task's scratch folder is inside DST, so
    publishing a shard costs no copy); any other is written through
    ``formats.storage`` (tasks upload). Pickles as its text: each process reopens it.

    Args:
        dst: a folder path (made absolute by the caller: tasks run elsewhere) or a URI.
        durable: fsync what is published before the marker that vouches for it.
    """

    def __init__(self, dst: str, durable: bool = True) -> None:
        self.dst = dst
        self.durable = durable
        self.local = None if is_uri(dst) else Path(dst)
        self._location: Location | None = None

    def __reduce__(self):
        return (Output, (self.dst, self.durable))

    @property
    def location(self) -> Location:
        if self._location is None:
            self._location = open_location(self.dst)
        return self._location

    def scratch(self, start: int) -> Path:
        """A new, empty folder for one attempt at a range.

        One per attempt, never shared: a cancelled attempt that is still winding
        down must not delete the files of the one that replaced it. A local DST
        keeps them in its state folder (same filesystem: publishing is a rename;
        whatever a dead worker left goes with that folder); otherwise they are
        in the node's temporary folder.
        """
        import tempfile

        prefix = f"work-{start:012d}-"
        if self.local is not None:
            (self.local / STATE_DIR).mkdir(parents=True, exist_ok=True)
            return Path(tempfile.mkdtemp(prefix=prefix, dir=self.local / STATE_DIR))
        return Path(tempfile.mkdtemp(prefix=f"shardpack-ray-{prefix}"))

    def publish(self, src: Path, name: str) -> None:
        """Move (local) or upload the finished file ``src`` to ``name``."""
        if self.local is not None:
            os.replace(src, self.location.path(name))  # path() checks the name
        else:
            self.location.upload(src, name)

    def write_bytes(self, name: str, data: bytes) -> None:
        if self.local is not None:
            target = Path(self.location.path(name))
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, data, durable=self.durable)
        else:
            self.location.write_bytes(name, data)

    def sync(self) -> None:
        """Make the renames into DST durable (object stores are, once a put returns)."""
        if self.local is not None and self.durable:
            fsync_dir(self.local)

    def files(self) -> dict[str, int]:
        if self.local is not None and not self.local.exists():
            return {}
        return {f.name: f.size for f in self.location.list_files()}

    def read_json(self, name: str) -> Any:
        """The JSON in ``name``, or None when it is missing or torn."""
        try:
            return json.loads(self.location.read_bytes(name, _MARKER_LIMIT))
        except (OSError, ValueError):  # StorageError is a ValueError
            return None

    def delete(self, names) -> None:
        for name in names:
            self.location.delete(name)

    def drop_scratch(self) -> None:
        """Delete the scratch folders of a local DST (tasks of a killed run leave them)."""
        if self.local is not None:
            for p in (self.local / STATE_DIR).glob("work-*"):
                shutil.rmtree(p, ignore_errors=True)

    def clear(self, files: dict[str, int], keep: set[str] = frozenset()) -> None:
        """Delete what a pack of either engine left in DST (``files``), except ``keep``.

        The manifest goes first, so an overwritten dataset never looks complete.
        """
        if MANIFEST_NAME in files:
            self.delete([MANIFEST_NAME])
        self.delete(n for n in files if n not in keep and n != MANIFEST_NAME and (
            n in _OURS_NAMES or is_our_shard_name(n) or PART_FILE.match(n)
            or n.startswith(f"{STATE_DIR}/")))

    def remove_state(self) -> None:
        """Delete the state folder (after the manifest: the run is complete)."""
        if self.local is not None:
            shutil.rmtree(self.local / STATE_DIR, ignore_errors=True)
        else:
            self.delete(n for n in self.files() if n.startswith(f"{STATE_DIR}/"))


def prepare(out: Output, plan: str, ranges: list[tuple[int, int]],
            resume: bool, per_input: bool = True) -> dict[int, RangeResult]:
    """Ready DST for a run; returns the ranges already done (by start), kept for a resume.

    ``per_input``: as :meth:`RangeResult.from_json`.

    Without ``resume`` everything of an earlier pack is deleted. With it, the
    plan must match (else nothing is touched), and a range is kept when its
    marker parses and every file it names is there with its size; the rest
    (shards of unfinished ranges, scratch folders) is deleted.

    Raises:
        PackError: ``resume`` and DST holds a distributed run of another plan.
    """
    out.drop_scratch()
    files = out.files()
    if out.local is None:  # a local DST's was renamed when it was claimed
        files = _adopt_legacy_state(out, files, resume)
    expected = {"plan": plan, "ranges": len(ranges), "task_records": ranges[0][1] - ranges[0][0]}
    done: dict[int, RangeResult] = {}
    if resume and PLAN_NAME in files:
        found = out.read_json(PLAN_NAME)
        if found != expected:
            raise PackError("cannot resume: the interrupted run packed other inputs or used "
                            "other options (shuffle, seed, task records...); pack again "
                            "without --resume", path=out.dst, found=found, expected=expected)
        bounds = set(ranges)
        for name in files:
            bound = marker_range(name)
            if bound is None or bound not in bounds:
                continue
            try:
                result = RangeResult.from_json(out.read_json(name), name, per_input)
            except PackError:
                continue  # a torn or foreign marker: the range is packed again
            if result.plan == plan and (result.start, result.stop) == bound \
                    and all(files.get(f) == size for f, size in result.files().items()):
                done[result.start] = result
    keep = {f for r in done.values() for f in r.files()}
    keep |= {marker_name(r.start, r.stop) for r in done.values()}
    out.clear(files, keep=keep)
    out.write_bytes(PLAN_NAME, json.dumps(expected, sort_keys=True).encode())
    return done


def _adopt_legacy_state(out: Output, files: dict[str, int], resume: bool) -> dict[str, int]:
    """DST's files once the range state an earlier pack left on object storage under
    :data:`~packer.work_names.LEGACY_STATE_DIR` is gone: moved to
    :data:`~packer.work_names.STATE_DIR` for a resume (objects cannot be renamed: each
    is copied, the plan last, then deleted, the plan last, so a kill halfway leaves
    one plan that still proves the rest), or deleted, as that pack would have.
    """
    legacy = sorted((n for n in files if n.startswith(f"{LEGACY_STATE_DIR}/")),
                    key=lambda n: n == LEGACY_PLAN_NAME)
    if not legacy:
        return files
    if resume and LEGACY_PLAN_NAME in files and PLAN_NAME not in files:
        for name in legacy:
            new = f"{STATE_DIR}/{name[len(LEGACY_STATE_DIR) + 1:]}"
            if new != PLAN_NAME and marker_range(new) is None:
                continue
            try:
                data = out.location.read_bytes(name, _MARKER_LIMIT)
            except (OSError, ValueError):  # StorageError is a ValueError
                continue  # as an unreadable marker in prepare(): its range is packed again
            out.write_bytes(new, data)
    out.delete(legacy)
    return out.files()
