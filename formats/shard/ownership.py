"""Which entries of an output folder a shardpack writer provably made.

Nothing is ever deleted from a folder because of its name alone (a user's
``part-1.pdf`` or ``shard-notes.txt`` is not ours). An entry is ours when one of
our own records says so:

* a valid ``manifest.json`` lists it (shard files, dictionaries), or it is that
  manifest or the dataset's ``skipped.jsonl``;
* a resume journal (``_journal.jsonl``) is present and the name is exactly one
  the writer gives its shards (``shard-NNNNN.rec``...), or the journal's own
  companions (``.skipped.partial.jsonl``);
* the program writing there declared the names it works under (:class:`WorkNames`,
  passed in; the packer's are ``packer.work_names.WORK``: its range state, range
  shards and the first pass of a shuffle), and the proof it named is present (for
  its state and its shards), or the folder holds a manifest or a journal of ours
  (for a first pass);
* the output ledger (``.shardpack-output.json``, written after a foreign-format
  output is complete) lists it;
* it is our temporary name (``.<one of the names above>.tmp-<pid>``) and that
  process is gone; or it is our lock file or staging marker.

Everything else is foreign: a pack refuses a folder holding foreign entries
unless told to write beside them, and then never touches them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..errors import ShardpackError
from ..files import atomic_write_bytes
from .manifest import MANIFEST_NAME, Manifest, read_manifest
from .shard_table import SHARD_TABLE_NAME

__all__ = ["JOURNAL_NAME", "LEDGER_NAME", "LOCK_NAME", "SKIPPED_NAME", "SKIPPED_PARTIAL_NAME",
           "STAGING_MARKER", "Survey", "WorkNames", "dataset_files", "is_our_shard_name",
           "output_entries", "remove_ours", "survey", "write_ledger"]

JOURNAL_NAME = "_journal.jsonl"
SKIPPED_NAME = "skipped.jsonl"
SKIPPED_PARTIAL_NAME = ".skipped.partial.jsonl"
LOCK_NAME = ".shardpack.lock"
LEDGER_NAME = ".shardpack-output.json"
STAGING_MARKER = ".shardpack-staging.json"

_OUR_FILE_NAMES = (MANIFEST_NAME, JOURNAL_NAME, SKIPPED_NAME, SKIPPED_PARTIAL_NAME, LEDGER_NAME,
                   STAGING_MARKER)
_SHARD_FILE = re.compile(r"^shard-\d{5,}\.(?:rec|idx|meta\.parquet)$")
_DICT_FILE = re.compile(r"^dict-\d{3}\.zstd$")
_TEMP = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d{1,10})$")
_LEDGER_LIMIT = 64 << 20


@dataclass(frozen=True)
class WorkNames:
    """The names a program that writes datasets (the packer) works under in an output
    folder, besides the dataset's own: declared by that program and passed to
    :func:`survey`, so this module knows a dataset's names alone.

    Attributes:
        state_dir: a folder of the run's state (the packer's ``.shardpack-ranges/``).
        proof: the file, relative to the output folder, that only such a run writes
            (its plan, inside ``state_dir``); while it is there, ``state_dir`` and
            the names ``shard_names`` matches are ours.
        shard_names: matches exactly the names the run gives its shard files.
        scratch: folders that are ours when they hold a manifest or a journal of
            ours (a first pass the run writes as a dataset of its own).
    """

    state_dir: str
    proof: str
    shard_names: re.Pattern[str]
    scratch: tuple[str, ...] = ()


def is_our_shard_name(name: str, work: WorkNames | None = None) -> bool:
    """Whether ``name`` is exactly a name our writers (and ``work``'s run) give shard or
    dictionary files."""
    return bool(_SHARD_FILE.match(name) or _DICT_FILE.match(name)
                or (work is not None and work.shard_names.match(name)))


def _pid_gone(pid: int) -> bool:
    if pid == os.getpid():
        return True  # our own leftover (an aborted writer in this process)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` died and waits to be reaped (a killed writer whose parent is
    slow to reap it still answers ``kill(pid, 0)``); False where /proc cannot say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # "pid (comm) state ...": comm may hold spaces and parentheses; the state follows
    # the last ")".
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] == b"Z"


@dataclass
class Survey:
    """What an output folder holds.

    Attributes:
        root: the folder.
        ours: relative paths (POSIX) that a shardpack writer made; a directory
            listed here is ours as a whole.
        foreign: relative paths nobody can prove are ours (top-level entries, or
            files inside a directory that also holds ledger-listed files).
        dataset: the complete dataset in ``root`` (its manifest), if any.
        ledger: the files of a complete foreign-format output, if any.
        journal: an interrupted pack of ours left a resume journal.
        work_state: an interrupted run of the :class:`WorkNames` surveyed with left
            its proof (the packer's range plan).
        bad_manifest: ``manifest.json`` exists but is not a valid manifest (why).
    """

    root: Path
    ours: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    dataset: Manifest | None = None
    ledger: list[str] | None = None
    journal: bool = False
    work_state: bool = False
    bad_manifest: str | None = None

    @property
    def complete(self) -> bool:
        """A finished output (a dataset, or a foreign-format output with its ledger)."""
        return self.dataset is not None or self.ledger is not None

    @property
    def leftovers(self) -> list[str]:
        """Our entries a writer may clear: all but the lock file and the staging marker,
        which belong to the pack that holds the folder (``packer.destination``)."""
        return [p for p in self.ours if p not in (LOCK_NAME, STAGING_MARKER)]


def dataset_files(manifest: Manifest) -> set[str]:
    """The names of every file of the dataset ``manifest`` describes, itself included."""
    names = {MANIFEST_NAME, SKIPPED_NAME}
    if manifest.shard_table is not None:
        names.add(manifest.shard_table)
    for e in manifest.shards:
        names |= {e.data_file, e.index_file, e.meta_file}
    return names | {name for name, _ in manifest.dictionaries.values()}


def _read_ledger(path: Path) -> list[str] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _LEDGER_LIMIT:
            return None
        obj = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    files = obj.get("files") if isinstance(obj, dict) else None
    if not isinstance(files, list):
        return None
    out = []
    for name in files:
        if not isinstance(name, str) or not name or "\x00" in name or "\\" in name:
            return None
        parts = PurePosixPath(name).parts
        if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
            return None  # a ledger never names anything outside its folder
        out.append(name)
    return out


def survey(root: str | Path, work: WorkNames | None = None) -> Survey:
    """Classify the entries of ``root`` (a missing folder is empty); ``work``: the names
    a program writing there works under, counted as ours (module docstring)."""
    root = Path(root)
    s = Survey(root)
    try:
        entries = sorted(os.listdir(root))
    except FileNotFoundError:
        return s
    names = set(entries)
    ours: set[str] = set()
    if MANIFEST_NAME in names:
        try:
            s.dataset = read_manifest(root)
        except ShardpackError as exc:
            s.bad_manifest = exc.message
        else:
            ours |= dataset_files(s.dataset)
    s.journal = _is_file(root / JOURNAL_NAME)
    if s.journal:
        # The shard table is written just before the manifest: a writer stopped between
        # the two leaves it beside the journal.
        ours |= {JOURNAL_NAME, SKIPPED_PARTIAL_NAME, SKIPPED_NAME, SHARD_TABLE_NAME}
        ours |= {n for n in names if _SHARD_FILE.match(n) or _DICT_FILE.match(n)}
    s.work_state = work is not None and _is_file(root / work.proof)
    if s.work_state:
        ours |= {work.state_dir, SKIPPED_NAME}
        ours |= {n for n in names if work.shard_names.match(n) or _DICT_FILE.match(n)}
    for folder in work.scratch if work is not None else ():
        scratch = root / folder
        if folder in names and not scratch.is_symlink() and (
                _is_file(scratch / MANIFEST_NAME) or _is_file(scratch / JOURNAL_NAME)):
            ours.add(folder)
    nested: list[str] = []
    if LEDGER_NAME in names:
        s.ledger = _read_ledger(root / LEDGER_NAME)
        if s.ledger is not None:
            ours.add(LEDGER_NAME)
            ours |= {n for n in s.ledger if "/" not in n}
            nested = [n for n in s.ledger if "/" in n]  # "x/" (a folder) is nested too
    ours |= {LOCK_NAME, STAGING_MARKER}
    for n in names:
        m = _TEMP.match(n)
        if m and (is_our_shard_name(m["name"], work) or m["name"] in _OUR_FILE_NAMES) \
                and _pid_gone(int(m["pid"])):
            ours.add(n)
    s.ours = sorted(n for n in ours if n in names)
    listed_dirs = {n.split("/", 1)[0] for n in nested}
    for n in entries:
        if n in ours:
            continue
        if n in listed_dirs and (root / n).is_dir() and not (root / n).is_symlink():
            inside = {f for f in nested if f.startswith(n + "/")}
            found = _entries_under(root, n)
            s.foreign += [f for f in found if f not in inside]
            s.ours += sorted(f for f in found if f in inside)
        else:
            s.foreign.append(n)
    return s


def output_entries(root: str | Path, *, skip=()) -> list[str]:
    """Everything under ``root`` as a ledger lists it: files, and folders as ``name/``
    (an empty one, such as an image folder's empty class, is part of an output too);
    top-level names in ``skip`` left out."""
    root = Path(root)
    out = []
    for top in sorted(os.listdir(root)):
        if top in skip:
            continue
        p = root / top
        if p.is_dir() and not p.is_symlink():
            out += _entries_under(root, top)
        else:
            out.append(top)
    return sorted(out)


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _entries_under(root: Path, top: str) -> list[str]:
    """``top/`` itself, the files (and links) under it, and its sub-folders as ``rel/``."""
    out = [f"{top}/"]
    for dirpath, dirnames, filenames in os.walk(root / top):
        rel = Path(dirpath).relative_to(root).as_posix()
        out += [f"{rel}/{f}" for f in filenames]
        out += [f"{rel}/{d}" for d in dirnames if (Path(dirpath) / d).is_symlink()]
        out += [f"{rel}/{d}/" for d in dirnames if not (Path(dirpath) / d).is_symlink()]
    return out


def remove_ours(root: str | Path, paths, *, keep=(), work: WorkNames | None = None) -> None:
    """Delete ``paths`` (from :attr:`Survey.ours`) under ``root``, except ``keep``;
    directories emptied by it are removed too. Never follows a symlink. ``work``: as
    the survey that found them was given."""
    root = Path(root)
    keep = set(keep)
    parents = set()
    # The proofs go last: a kill halfway leaves what remains still provably ours.
    proofs = (MANIFEST_NAME, JOURNAL_NAME, LEDGER_NAME, STAGING_MARKER,
              *(() if work is None else (work.state_dir,)))
    paths = sorted(paths, key=lambda rel: rel in proofs)
    for rel in paths:
        if rel in keep:
            continue
        p = root / rel
        if rel.endswith("/"):  # a folder an output ledger lists: it goes once it is empty
            rel = rel.rstrip("/")
            parents.add(rel)
        elif p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)
        parent = PurePosixPath(rel).parent
        while str(parent) != ".":
            parents.add(str(parent))
            parent = parent.parent
    for rel in sorted(parents, key=lambda d: -d.count("/")):
        try:
            (root / rel).rmdir()
        except OSError:
            pass  # not empty: it holds something that is not ours


def write_ledger(root: str | Path, files: list[str], *, durable: bool = True) -> None:
    """Record the files of a complete foreign-format output (what a later
    ``--overwrite`` may delete)."""
    data = json.dumps({"files": sorted(files), "tool": "shardpack"}, indent=0).encode()
    atomic_write_bytes(Path(root) / LEDGER_NAME, data, durable=durable)
