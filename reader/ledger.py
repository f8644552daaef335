"""A ledger of what a Loader served: a hash chain over the records of each batch.

Resume bugs are silent: a run resumed from a checkpoint that repeats or skips data
trains on, and nothing says so. With ``Loader(..., ledger=True)`` every delivered
batch extends a running hash (BLAKE2b, 16 bytes) over its records' stable ids (for
a :class:`reader.Mix`, the source's name and the record within it; else the record),
and :meth:`reader.Loader.state_dict` carries it (``state["ledger"]``). Two runs that
served the same batches in the same order end with the same hash, whatever their
number of workers, or a checkpoint and a resume in between. ``TokenBlocks(...,
ledger=...)`` keeps the same chain over its blocks (a source's name and the block's
number in it), updated as each batch is yielded (:meth:`Ledger.served`).

With ``ledger="path/ledger-{rank}.jsonl"`` each batch also appends a line to that
file (``{rank}`` becomes the rank, so ranks sharing a folder write apart): the
rank, the epoch, the batch, the rank's step count and the running hash.
:func:`diff_ledgers` (``inspect-shards ledger-diff A B``) names the first step and
rank where two such logs differ. The file's first line says it is a shardpack
ledger: a file that is not one is never appended to, and a run that does not
resume (no ``load_state_dict``) refuses a ledger file that already holds steps,
since it would mix two runs.

It hashes the records the order planned for each batch; with ``on_error="replace"`` a
damaged one was served as its replacement, which the state's quarantine records (the
plan and the quarantine together say what was served, and both are deterministic).

The hash is updated when the runtime reports the batch delivered (a listener), so
a batch delivered and then lost to an exception before the loop received it is
counted: the ledger then shows it served twice, which is what the trainer saw.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from formats.errors import ArgumentError, ArgumentTypeError

from .errors import LedgerError, StateError

__all__ = ["Ledger", "LedgerDifference", "diff_ledgers", "read_ledger"]

LEDGER_FORMAT = "shardpack-ledger-1"
_START = bytes(16)  # the running hash of nothing served yet


class Ledger:
    """The running hash of one Loader (a runtime listener).

    Args:
        ids_of: ``(epoch, k) -> uint64 ids`` of batch ``k`` of ``epoch`` (this rank's).
        rank: this Loader's rank (in the log's lines).
        path: the log file (``{rank}`` replaced), or None for the hash alone.
    """

    def __init__(self, ids_of, rank: int, path: str | os.PathLike | None) -> None:
        self.ids_of = ids_of
        self.rank = rank
        self.digest = _START
        self.steps = 0
        self.resumed = False
        self.path = None if path is None else Path(str(path).replace("{rank}", str(rank)))
        self._fd: int | None = None

    # -- the listener ------------------------------------------------------------------

    def on_batch(self, timing) -> None:
        self.served(timing.epoch, timing.batch)

    def served(self, epoch: int, batch: int) -> None:
        """Batch ``batch`` of ``epoch`` was delivered (what a reader without a runtime,
        :class:`reader.TokenBlocks`, calls)."""
        ids = self.ids_of(epoch, batch)
        self.digest = hashlib.blake2b(self.digest + ids.tobytes(), digest_size=16).digest()
        self.steps += 1
        if self.path is not None:
            self._write({"rank": self.rank, "epoch": epoch, "batch": batch,
                         "step": self.steps, "records": int(ids.size),
                         "hash": self.digest.hex()})

    def on_workers_changed(self, n: int, change: Any) -> None:
        pass

    # -- state -------------------------------------------------------------------------

    def state(self) -> dict:
        return {"hash": self.digest.hex(), "steps": self.steps}

    def resume(self, state: Any) -> None:
        """Continue the chain ``state["ledger"]`` (a state saved without one starts it).

        Raises:
            StateError: ``state["ledger"]`` is not what :meth:`state` returns (checked
                before anything changes: :meth:`parse` first, to check a whole state).
        """
        saved = self.parse(state)
        self.resumed = True
        if saved is not None:
            self.digest, self.steps = saved

    @staticmethod
    def parse(state: Any) -> tuple[bytes, int] | None:
        """``state["ledger"]`` as (hash, steps), or None where the state has none."""
        saved = state.get("ledger") if isinstance(state, dict) else None
        if saved is None:
            return None
        try:
            digest = bytes.fromhex(saved["hash"])
            steps = int(saved["steps"])
        except (KeyError, TypeError, ValueError):
            raise StateError(f"state['ledger'] must be the dict state_dict() saved, not "
                             f"{saved!r}") from None
        if len(digest) != 16 or steps < 0:
            raise StateError(f"state['ledger'] holds no 16-byte hash and step count: {saved!r}")
        return digest, steps

    # -- the log -----------------------------------------------------------------------

    def _write(self, line: dict) -> None:
        if self._fd is None:
            self._fd = self._open()
        self._append(self._fd, line)

    def _append(self, fd: int, line: dict) -> None:
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        try:
            os.write(fd, data)  # one write per line, O_APPEND: lines never interleave
        except OSError as exc:
            raise LedgerError(f"cannot append to the ledger {self.path} ({exc.strerror}); "
                              "free space or pass another ledger= path") from None

    def _open(self) -> int:
        path = self.path
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0),
                         0o644)
        except OSError as exc:
            raise LedgerError(f"cannot open the ledger {path} ({exc.strerror})") from None
        try:
            head = os.pread(fd, 4096, 0)
            if not head:
                self._append(fd, {"format": LEDGER_FORMAT})
                return fd
            first = head.split(b"\n", 1)[0]
            if _header(first) != LEDGER_FORMAT:
                raise LedgerError(f"{path} is not a shardpack ledger (its first line is not "
                                  f"{{\"format\": \"{LEDGER_FORMAT}\"}}): never appended to; "
                                  "pass another ledger= path")
            if not self.resumed and len(head) > len(first) + 1:
                raise LedgerError(f"the ledger {path} already holds another run's steps and "
                                  "this Loader did not resume (load_state_dict): appending "
                                  "would mix two runs; pass a new ledger= path")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def check_ledger(value: Any) -> bool | str | None:
    """The ``ledger=`` keyword: False, True, or a path (str or ``os.PathLike``)."""
    if value is None or value is False:
        return None
    if value is True:
        return True
    if isinstance(value, (str, os.PathLike)):
        if not str(value):
            raise ArgumentError("ledger: an empty path; pass True for the hash alone")
        return os.fspath(value)
    raise ArgumentTypeError(f"ledger must be False, True or a file path, not {value!r}")


def _header(line: bytes) -> str | None:
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return doc.get("format") if isinstance(doc, dict) else None


def read_ledger(path: str | os.PathLike) -> dict[tuple[int, int], dict]:
    """A ledger log's steps by (rank, step).

    Raises:
        LedgerError: the file is not a shardpack ledger, or a line is damaged (named).
    """
    path = Path(path)
    out: dict[tuple[int, int], dict] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise LedgerError(f"cannot read the ledger {path} ({exc.strerror})") from None
    lines = text.split("\n")
    if _header(lines[0].encode()) != LEDGER_FORMAT:
        raise LedgerError(f"{path} is not a shardpack ledger (no {LEDGER_FORMAT!r} first line)")
    for no, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        try:
            doc = json.loads(line)
            key = (int(doc["rank"]), int(doc["step"]))
            str(doc["hash"])
        except (ValueError, KeyError, TypeError):
            raise LedgerError(f"{path}, line {no}: not a ledger step ({line[:80]!r})") from None
        out[key] = doc
    return out


class LedgerDifference(dict):
    """Where two ledgers first differ: ``rank``, ``step``, and each side's line (None
    where one ledger has no such step)."""


def diff_ledgers(a: str | os.PathLike, b: str | os.PathLike) -> LedgerDifference | None:
    """The first step (then the lowest rank) where two ledger logs differ, or None when
    they record the same steps with the same hashes."""
    left, right = read_ledger(a), read_ledger(b)
    for key in sorted(set(left) | set(right), key=lambda k: (k[1], k[0])):
        x, y = left.get(key), right.get(key)
        if x is None or y is None or x["hash"] != y["hash"]:
            return LedgerDifference(rank=key[0], step=key[1], a=x, b=y)
    return None
