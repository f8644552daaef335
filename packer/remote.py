"""Packing from and to object storage.

From: an image folder, a folder of files or a file list on object storage is
listed there and its objects are read by the pack loop itself (many at once).
Container formats (TFRecord, WebDataset tars, Parquet, MDS, our shards) are
fetched whole into a local copy first (:mod:`packer.source_copy`), since their
readers need seekable local files.

To: the staging folder is a normal dataset folder (journal, ``--resume`` and all),
kept under the cache folder at a name derived from DST, so an interrupted pack
resumes from it. Publishing uploads every file but the manifest, then the
manifest last: until that one object exists, DST is not a dataset, exactly as a
local pack's folder is not until its ``manifest.json`` is renamed into place.
Replacing a dataset (``--overwrite``) deletes the old manifest first, and the
old dataset's objects that the new one does not reuse after the new manifest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from formats.codecs.registry import MARKERS, kind_by_name
from formats.errors import InputUsageError, ManifestError, StorageError
from formats.files import try_lock
from formats.shard.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, read_manifest
from formats.shard.ownership import SKIPPED_NAME, dataset_files
from formats.storage import (
    Location,
    Place,
    default_cache_folder,
    display_uri,
    is_uri,
    open_location,
    place,
)
from formats.storage.manifests import decode_remote_manifest

from .errors import DestinationError, PackError, UsageError
from .options import PackOptions
from .report import PackProgress, PackSummary
from .resolve import detect_source, open_source
from .source_copy import SourceCopy
from .sources.filelist import LIST_EXTENSIONS, list_remote_file
from .sources.folders import detect_remote, list_remote

__all__ = ["hold_remote_dst", "open_remote_source", "pack_to_remote", "staging_folder"]

log = logging.getLogger("shardpack.packer")

_REPLACING = ".replacing"  # in the staging folder: a publish that replaces a dataset began


def staging_folder(dst: str | Place) -> Path:
    """Where a pack to ``dst`` is built before it is uploaded (stable across runs)."""
    key = hashlib.sha256(place(dst).shown.encode()).hexdigest()[:24]
    return default_cache_folder() / "staging" / key


def open_remote_source(src: str, options: PackOptions, *, copy: bool = True
                       ) -> tuple[str | None, Any, SourceCopy | None]:
    """(kind, source, local copy) for a SRC on object storage: a remote
    :class:`~packer.sources.listing.Listing` for folders and file lists (no copy), else a
    registry source over a :class:`~packer.source_copy.SourceCopy` (see module
    docstring), to release once packed.

    Args:
        copy: False: fetch nothing; a source that needs a local copy comes back as
            ``(kind or None, None, None)``.

    Raises:
        InputError: nothing recognizes SRC, or ``--from filelist`` names a folder.
        PackError: another pack holds the local copy of SRC.
        StorageError: storage failed (names the object).
    """
    location = open_location(src)
    to_jpeg = options.to_jpeg
    single = location.stat()
    if single is not None:
        folder, name = location.split()
        kind = options.source or ("filelist" if Path(name).suffix.lower() in LIST_EXTENSIONS
                                  else _container_kind([name]))
        if kind == "filelist":
            return kind, list_remote_file(folder, name, to_jpeg=to_jpeg,
                                          field_types=dict(options.field_types)), None
        location, files = folder, [single]
    else:
        files = [f for f in location.list_files()
                 if not any(part.startswith(".") for part in f.name.split("/"))]
        names = [f.name for f in files]
        kind = options.source or _container_kind(names) or detect_remote(names)
        if kind in ("imagefolder", "files"):
            return kind, list_remote(kind, location, to_jpeg=to_jpeg, names=names), None
        if kind == "filelist":
            raise InputUsageError("--from filelist: give the list file itself as SRC",
                                  path=location.uri)
    if not copy:
        return kind, None, None
    held = SourceCopy(src)
    try:
        local = held.fetch(location, files)
        if single is not None:
            local = local / single.name
        kind = kind or detect_source(local)
        return kind, open_source(kind, local, options), held
    except BaseException:
        held.release(delete=False)
        raise


def _container_kind(names: list[str]) -> str | None:
    """The container format of a folder's top-level objects, by name, as a local folder's
    (``formats.codecs.registry``; None: images)."""
    top = [n for n in names if "/" not in n and not n.startswith(".")]
    for marker, kind in MARKERS.items():
        if marker in top:
            return kind
    kinds = {kind_by_name(n) for n in top}
    kinds.discard(None)
    return kinds.pop() if len(kinds) == 1 else None


@contextmanager
def hold_remote_dst(dst: str | Place):
    """One pack at a time to the object-store folder ``dst``, from this machine: an
    exclusive lock beside its staging folder (object stores have no locks; packs from
    several machines to one DST are the user's to keep apart).

    Raises:
        PackError: another pack on this machine holds it.
    """
    dst = place(dst)
    stage = staging_folder(dst)
    stage.parent.mkdir(parents=True, exist_ok=True)
    lock = try_lock(stage.with_name(stage.name + ".lock"))
    if lock is None:
        raise PackError("another pack to this DST is running (it holds the staging folder); "
                        "wait for it to finish", path=dst.shown)
    try:
        yield
    finally:
        os.close(lock)


def pack_to_remote(src, dst: str | Place, options: PackOptions, progress: PackProgress | None,
                   pack_local) -> PackSummary:
    """Pack ``src`` into the remote folder ``dst`` through the staging folder.

    Args:
        pack_local: ``packer.run.pack`` (passed in: it calls this module).
    """
    dst = place(dst)
    if options.sink != "shards":
        raise UsageError(f"--to {options.sink} writes local files only; object storage takes "
                         "--to shards", path=dst.shown)
    location = open_location(dst)
    stage = staging_folder(dst)
    with hold_remote_dst(dst):
        if options.resume and (stage / MANIFEST_NAME).exists():
            # Packed in full, then interrupted while publishing: publish it (again).
            summary = _staged_summary(src, dst, stage, options)
            _publish_stage(stage, location, options.overwrite)
            return summary
        if location.exists(MANIFEST_NAME) and not options.overwrite:
            raise DestinationError("DST is already a dataset; pass --overwrite to replace it",
                             path=dst.shown)
        _probe(location)
        if not options.resume and stage.exists():
            shutil.rmtree(stage)
        summary = pack_local(src, stage, options, progress)
        if summary.complete:
            _publish_stage(stage, location, options.overwrite)
        summary.dst = dst.shown
        return summary


def _probe(location: Location) -> None:
    """Fail now, not after the whole pack, when DST cannot be written (no bucket, no rights)."""
    probe = ".shardpack-write-probe"
    try:
        location.write_bytes(probe, b"")
    except StorageError as exc:
        raise DestinationError(f"cannot write to DST ({exc.message})", path=location.uri) from None
    try:
        location.delete(probe)
    except StorageError as exc:  # a write-only role: packing needs no delete (replacing does)
        log.warning("cannot delete the empty object %s (%s); it is harmless",
                    location.uri_of(probe), exc.message)


def _publish_stage(stage: Path, location: Location, overwrite: bool) -> None:
    # Deleting the old manifest is the point of no return of a replace: a resumed
    # publish must finish the replace (delete the old shards) even without --overwrite.
    replacing = stage / _REPLACING
    if overwrite and not replacing.exists():
        # What the old dataset holds, read before its manifest goes: only those objects
        # are ever deleted (formats.shard.ownership: a user's objects beside it stay).
        replacing.write_text(json.dumps(sorted(_dataset_objects(location))))
    replaced = json.loads(replacing.read_text()) if replacing.exists() else None
    publish(stage, location, replace=replaced)
    shutil.rmtree(stage, ignore_errors=True)


def _dataset_objects(location: Location) -> set[str]:
    """The objects the dataset at ``location`` consists of (none when it has no manifest).

    Raises:
        DestinationError: a ``manifest.json`` that is not a valid one (never replaced).
    """
    if not location.exists(MANIFEST_NAME):
        return set()
    raw = location.read_bytes(MANIFEST_NAME, MAX_MANIFEST_BYTES)
    try:
        with tempfile.TemporaryDirectory(prefix="shardpack-manifest-") as folder:
            manifest = decode_remote_manifest(location, raw, Path(folder))
    except ManifestError as exc:
        raise DestinationError(f"DST holds a manifest.json that is not a valid shardpack manifest "
                         f"({exc.message}); it is never replaced: remove it yourself",
                         path=display_uri(location.uri)) from None
    return dataset_files(manifest)


def _staged_summary(src, dst: Place, stage: Path, options: PackOptions) -> PackSummary:
    """The counters of a pack finished in the staging folder, after checking that it is
    this pack: the same source and the same options."""
    from collections import Counter

    manifest = read_manifest(stage)
    made = manifest.created_by
    shown = display_uri(src) if is_uri(src) else str(Path(src))
    if made.get("source", {}).get("path") != shown or made.get("options") != options.recorded():
        raise PackError("cannot resume: the staged pack for this DST packed another source or "
                        "used other options; pack again without --resume", path=stage,
                        found=made.get("source", {}).get("path"), expected=shown)
    skipped: Counter = Counter()
    skip_file = stage / SKIPPED_NAME
    if skip_file.exists():
        for line in skip_file.read_text("utf-8").splitlines():
            skipped[json.loads(line)["kind"]] += 1
    written = manifest.records
    return PackSummary(shown, dst.shown, made.get("source", {}).get("kind", "?"),
                       "shards", records_in=written + sum(skipped.values()),
                       records_written=written, skipped=skipped, shards=len(manifest.shards),
                       resumed_records=written, complete=True)


def publish(folder: Path, location: Location, *, replace: list[str] | None = None) -> None:
    """Upload the dataset in ``folder`` to ``location``, manifest last.

    Args:
        replace: the objects of the dataset being replaced: its manifest is deleted
            first, and those the new dataset does not reuse after the new manifest.
    """
    before = {f.name for f in location.list_files()} if replace else set()
    if replace and MANIFEST_NAME in before:
        location.delete(MANIFEST_NAME)
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    for name in files:
        if name != MANIFEST_NAME:
            location.upload(folder / name, name)
    location.upload(folder / MANIFEST_NAME, MANIFEST_NAME)
    for name in sorted((before & set(replace or ())) - set(files)):
        location.delete(name)
