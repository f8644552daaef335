"""A :class:`Listing`: everything a listed source packs, in order, before a byte is read.

The paths, their keys, per-record column values and the schema. Listing first
gives the progress bar its total, lets ``--shuffle`` permute a known list, and
makes a resume position a plain index. Every listed source (:mod:`packer.sources`)
returns one; the pack loop (:mod:`packer.loop`) and the range driver read it.

Rules every listing follows:

* Names starting with ``.`` (files and folders) are ignored and not counted.
* Every listed file counts as an input: one that turns out not to be an image
  is skipped (kind ``not-an-image``) or fails the pack, per ``--on-error``.
* ``files`` and ``filelist`` holding any file whose extension is not an image's
  are listed by :mod:`packer.sources.anyfiles` instead (fields by extension,
  sidecars grouped by key, WebDataset style); image-only ones stay as above.
* The image field's type here is provisional (``image`` when the names include
  non-JPEG extensions, else ``jpeg``): the writer types it by what the files hold
  (``formats.DatasetWriter``: ``jpeg``, ``png`` or ``image``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from formats.codecs.webdataset import split_key
from formats.errors import InputError, InputUsageError
from formats.fields import Field
from formats.media import IMAGE_SUFFIXES, OTHER_IMAGE_SUFFIXES

from .anyfiles import group_files, type_fields

__all__ = ["Listing", "finish", "hidden", "image_field", "utf8"]


@dataclass
class Listing:
    """Everything to pack, in input order.

    Attributes:
        kind: the source kind.
        root: SRC (a folder, or the file list).
        paths: the file to read for each record.
        keys: each record's ``key`` field (POSIX path relative to SRC, or as the
            file list wrote it).
        columns: other per-record field values (``label``, file list columns).
        fields: the schema, ``image`` first.
        classes: class names (index = label), or None.
        empty_classes: class folders that held no file.
        problems: record index -> (kind, reason) already known from listing
            (e.g. a FIFO); those records are never opened.
        location: for a source on object storage, the ``formats.storage.Location``
            that ``paths`` are relative to (None: local paths).
        class_info: per class (index = label), an object describing it, for the
            manifest's ``class_info`` (a COCO category), or None.
        check: for fields that depend on the image (its size), an object with
            ``fit(record, stored, header)`` (checks a record once its image is
            read, and scales those fields when the image was resized; returns a
            (kind, reason) problem or None) and ``where(record)`` (words naming
            the record in its source, added to a skip reason). Picklable: the
            Ray engine ships it to its tasks.
        drop_kinds: the problem kinds that are records the user asked to drop
            (``--drop-empty``): listed and counted as skipped, never failing a pack.
        members: for a folder or list of any files (:mod:`packer.sources.anyfiles`),
            each record's ``(field, path)`` files; None for image sources, whose
            record is the one file at ``paths[i]`` (the ``image`` field).
        boxes_clipped: boxes the listing clipped to their image (COCO), for the
            pack's summary.
    """

    kind: str
    root: Path
    paths: list[str]
    keys: list[str]
    columns: dict[str, list[Any]]
    fields: tuple[Field, ...]
    classes: tuple[str, ...] | None = None
    empty_classes: tuple[str, ...] = ()
    problems: dict[int, tuple[str, str]] = field(default_factory=dict)
    location: Any = None
    class_info: tuple[dict[str, Any], ...] | None = None
    check: Any = None
    drop_kinds: frozenset[str] = frozenset()
    members: list[list[tuple[str, str]]] | None = None
    boxes_clipped: int = 0

    def __len__(self) -> int:
        return len(self.paths)

    def reorder(self, order: list[int]) -> None:
        """Put records in ``order`` (a permutation of ``range(len(self))``)."""
        self.paths = [self.paths[i] for i in order]
        self.keys = [self.keys[i] for i in order]
        self.columns = {k: [v[i] for i in order] for k, v in self.columns.items()}
        if self.members is not None:
            self.members = [self.members[i] for i in order]
        where = {old: new for new, old in enumerate(order)}
        self.problems = {where[i]: p for i, p in self.problems.items()}

    def slice(self, a: int, b: int) -> Listing:
        """Records ``[a, b)`` as a listing of their own (what one range packs)."""
        return replace(self, paths=self.paths[a:b], keys=self.keys[a:b],
                       columns={k: v[a:b] for k, v in self.columns.items()}, empty_classes=(),
                       problems={i - a: p for i, p in self.problems.items() if a <= i < b},
                       members=None if self.members is None else self.members[a:b])

    def name(self, i: int) -> str:
        """Record ``i`` as messages name it: its file."""
        return f"file {self.paths[i]}"


def hidden(name: str) -> bool:
    return name.startswith(".")


def utf8(text: str) -> bool:
    """Whether ``text`` (a name decoded with surrogateescape) is valid UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def image_field(paths: list[str], to_jpeg: bool) -> Field:
    """The provisional ``image`` field of a listing (see the module docstring)."""
    if to_jpeg:
        return Field("image", "jpeg")
    others = any(os.path.splitext(p)[1].lower() in OTHER_IMAGE_SUFFIXES for p in paths)
    return Field("image", "image" if others else "jpeg")


def _any_files(found, kind: str) -> bool:
    """Whether a ``files``/``filelist`` source is one of any files (then its records
    follow :mod:`packer.sources.anyfiles`): it holds a file with an extension that is
    not an image's, and either no image or an image with a sidecar (``a.jpg`` +
    ``a.txt``). Image folders, with or without stray files (a README), stay as they
    were: a stray file is an input that is not an image."""
    if kind not in ("files", "filelist"):
        return False
    image_keys, other_keys = set(), set()
    for _, k, _ in found:
        ext = os.path.splitext(k)[1].lower()
        if not ext:
            continue
        split = split_key(k.rsplit("/", 1)[-1])
        stem = k[: len(k) - len(split[1]) - 1] if split else k
        (image_keys if ext in IMAGE_SUFFIXES else other_keys).add(stem)
    return bool(other_keys) and (not image_keys or bool(image_keys & other_keys))


def _finish_any(kind: str, root: Path, found, columns: dict[str, list],
                col_fields: list[Field], classes, location) -> Listing:
    """A listing of any files (:mod:`packer.sources.anyfiles`)."""
    if location is not None:
        raise InputUsageError("a folder or list on object storage is read as images only; "
                              "copy it to a local disk to pack other files", path=root)
    if kind == "files":
        keys, members, problems = group_files(found)
        paths = [m[0][1] if m else p for m, p in zip(members, _first_paths(found, keys),
                                                     strict=True)]
    else:  # a file list: a row is a record of one file; its key is the path as listed
        keys, members, problems = [], [], {}
        for i, (p, k, pr) in enumerate(found):
            _, one, bad = group_files([(p, os.path.basename(k), pr)])
            keys.append(k)
            members.append(one[0])
            if 0 in bad:
                problems[i] = bad[0]
        paths = [p for p, _, _ in found]
    fields = type_fields(members, problems)
    clash = sorted({f.name for f in fields} & ({"key"} | set(columns)))
    if clash:
        raise InputError(f"file extensions {clash} name fields that a column or the key "
                         "field already is; rename the files or the columns", path=root)
    out = list(fields)
    if "label" in columns:
        out.append(next(f for f in col_fields if f.name == "label"))
    out.append(Field("key", "str"))
    out += [f for f in col_fields if f.name != "label"]
    return Listing(kind, root, paths, keys, columns, tuple(out),
                   None if classes is None else tuple(classes), (), problems, location,
                   members=members)


def _first_paths(found, keys: list[str]) -> list[str]:
    """Each grouped record's first file (what messages name)."""
    first: dict[str, str] = {}
    for p, k, _ in found:
        split = split_key(k)
        first.setdefault(k if split is None else split[0], p)
    return [first[k] for k in keys]


def finish(kind: str, root: Path, found, columns: dict[str, list], col_fields: list[Field],
           to_jpeg: bool, classes=None, empty=(), location=None) -> Listing:
    """The listing of ``found`` (``(path, key, problem)`` per file, in order), with the
    per-record ``columns`` typed by ``col_fields``: images, or any files (module docstring)."""
    if _any_files(found, kind):
        return _finish_any(kind, root, found, columns, col_fields, classes, location)
    paths = [p for p, _, _ in found]
    keys = [k for _, k, _ in found]
    problems = {i: pr for i, (_, _, pr) in enumerate(found) if pr is not None}
    fields = [image_field(paths, to_jpeg)]
    if "label" in columns:
        fields.append(next(f for f in col_fields if f.name == "label"))
    fields.append(Field("key", "str"))
    fields += [f for f in col_fields if f.name != "label"]
    return Listing(kind, root, paths, keys, columns, tuple(fields),
                   None if classes is None else tuple(classes), tuple(empty), problems, location)
