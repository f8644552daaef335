"""The folder sources: what to pack from a folder or a file list, listed up front.

They read back the layout of the folder sink (:mod:`formats.codecs.imagefolder`),
its ``classes.json`` included.

A :class:`Listing` is the whole input, in order, before a byte is read: the
paths, their keys, per-record column values and the schema. Listing first gives
the progress bar its total, lets ``--shuffle`` permute a known list, and makes a
resume position a plain index.

Rules (also in ``pack-dataset --help``):

* Names starting with ``.`` (files and folders) are ignored and not counted.
* ``imagefolder``: every non-hidden sub-folder of SRC is a class; label = index
  of the folder name in sorted order (torchvision's ``ImageFolder`` rule); files
  directly in SRC (README, LICENSE...) are ignored. Class folders are walked
  recursively. An empty class folder keeps its label (the summary names it).
  A ``classes.json`` in SRC (a JSON list of class names, index = label, as
  ``--to imagefolder`` writes it) gives the class names; it must agree with the
  folders, which ``formats.codecs.imagefolder.class_folders`` derives from the names
  (for example ``000-b_c`` for a class ``b/c``). On object storage, which has no
  empty folders, a class it names may have none (the class keeps its label).
* ``files``: every non-hidden file under SRC, recursively; no label.
* ``filelist``: a ``.csv``, ``.tsv`` or ``.jsonl``/``.ndjson`` file with a
  ``path`` column; relative paths are resolved against the list's folder. A
  file list is the user's own, trusted input: absolute paths and ``..`` are
  allowed (never so for names read from archives or manifests). A list on
  object storage names objects beside it: relative, no ``..``. Other columns
  become fields whose type (int, float, str; in JSONL also ndarray or json for
  lists) is inferred from all rows, or given with ``--field NAME=TYPE``
  (:mod:`packer.sources.columns`); a ``str`` ``label`` column becomes class
  indices (classes sorted).
* ``coco``: an images folder and a COCO detection JSON (:mod:`packer.sources.coco`).
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

import csv
import io
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from formats.bounded import parse_json
from formats.codecs.imagefolder import class_folders
from formats.codecs.paths import CLASSES_FILE, read_classes_file
from formats.errors import FormatError, InputError, InputUsageError, UnsafePathError
from formats.fields import Field

from .columns import BAD_ROW, type_column

__all__ = [
    "BUILTIN_SOURCES",
    "JPEG_EXTENSIONS",
    "LIST_EXTENSIONS",
    "OTHER_IMAGE_EXTENSIONS",
    "Listing",
    "detect_builtin",
    "detect_remote",
    "image_field",
    "list_remote",
    "list_remote_file",
    "list_source",
]

BUILTIN_SOURCES = ("imagefolder", "files", "filelist", "coco")
JPEG_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif"})
OTHER_IMAGE_EXTENSIONS = frozenset({".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"})
LIST_EXTENSIONS = frozenset({".csv", ".tsv", ".jsonl", ".ndjson"})
_RESERVED = ("image", "key")
_LIST_LIMIT = 1 << 30  # a file list read from object storage
_CLASSES_LIMIT = 64 << 20  # an image folder's classes.json there (as formats.codecs.paths reads one)


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


def _hidden(name: str) -> bool:
    return name.startswith(".")


def detect_builtin(src: Path) -> str | None:
    """``filelist`` for a list file, ``imagefolder``/``files`` for a folder, else None.

    A folder is an image folder when it has a non-hidden sub-folder and no image
    file at its top level.
    """
    if src.is_file():
        return "filelist" if src.suffix.lower() in LIST_EXTENSIONS else None
    if not src.is_dir():
        return None
    has_dir = has_image = False
    for e in os.scandir(src):
        if _hidden(e.name):
            continue
        if e.is_dir():
            has_dir = True
        elif os.path.splitext(e.name)[1].lower() in JPEG_EXTENSIONS | OTHER_IMAGE_EXTENSIONS:
            has_image = True
    return "imagefolder" if has_dir and not has_image else "files"


def _walk(top: Path, rel: str, out: list[tuple[str, str, tuple[str, str] | None]],
          ancestors: frozenset[tuple[int, int]]) -> None:
    """Append (path, key, problem) for every non-hidden file under ``top``, sorted by name."""
    try:
        entries = sorted(os.scandir(top), key=lambda e: e.name)
    except OSError as exc:
        raise InputError(f"cannot list folder: {exc.strerror}", path=top) from None
    for e in entries:
        if _hidden(e.name):
            continue
        key = f"{rel}/{e.name}" if rel else e.name
        try:
            st = e.stat()  # follows symlinks
        except OSError:
            out.append((e.path, key, None))  # dangling or looping link: reading it says which
            continue
        if stat.S_ISDIR(st.st_mode):
            ident = (st.st_dev, st.st_ino)
            if ident in ancestors:
                out.append((e.path, key, ("unreadable", "symlink loop: links to a folder above it")))
            else:
                _walk(Path(e.path), key, out, ancestors | {ident})
        elif stat.S_ISREG(st.st_mode):
            out.append((e.path, key, None if _utf8(key) else (
                "bad-name", "file name is not valid UTF-8: its key cannot be stored as text")))
        else:
            out.append((e.path, key, ("unreadable", "not a regular file (FIFO, socket or device)")))


def _utf8(text: str) -> bool:
    """Whether ``text`` (a name decoded with surrogateescape) is valid UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _ident(p: Path) -> tuple[int, int]:
    st = p.stat()
    return (st.st_dev, st.st_ino)


def image_field(paths: list[str], to_jpeg: bool) -> Field:
    """The provisional ``image`` field of a listing (see the module docstring)."""
    if to_jpeg:
        return Field("image", "jpeg")
    others = any(os.path.splitext(p)[1].lower() in OTHER_IMAGE_EXTENSIONS for p in paths)
    return Field("image", "image" if others else "jpeg")


def _any_files(found, kind: str) -> bool:
    """Whether a ``files``/``filelist`` source is one of any files (then its records
    follow :mod:`packer.sources.anyfiles`): it holds a file with an extension that is
    not an image's, and either no image or an image with a sidecar (``a.jpg`` +
    ``a.txt``). Image folders, with or without stray files (a README), stay as they
    were: a stray file is an input that is not an image."""
    if kind not in ("files", "filelist"):
        return False
    from formats.codecs.webdataset import split_key

    images = JPEG_EXTENSIONS | OTHER_IMAGE_EXTENSIONS
    image_keys, other_keys = set(), set()
    for _, k, _ in found:
        ext = os.path.splitext(k)[1].lower()
        if not ext:
            continue
        split = split_key(k.rsplit("/", 1)[-1])
        stem = k[: len(k) - len(split[1]) - 1] if split else k
        (image_keys if ext in images else other_keys).add(stem)
    return bool(other_keys) and (not image_keys or bool(image_keys & other_keys))


def _finish_any(kind: str, root: Path, found, columns: dict[str, list],
                col_fields: list[Field], classes, location) -> Listing:
    """A listing of any files (:mod:`packer.sources.anyfiles`)."""
    from .anyfiles import group_files, type_fields

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
    images = JPEG_EXTENSIONS | OTHER_IMAGE_EXTENSIONS
    fields = type_fields(members, problems, images, JPEG_EXTENSIONS)
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
    from formats.codecs.webdataset import split_key

    first: dict[str, str] = {}
    for p, k, _ in found:
        split = split_key(k)
        first.setdefault(k if split is None else split[0], p)
    return [first[k] for k in keys]


def _finish(kind: str, root: Path, found, columns: dict[str, list], col_fields: list[Field],
            to_jpeg: bool, classes=None, empty=(), location=None) -> Listing:
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


def list_source(kind: str, src: Path, *, to_jpeg: bool = False,
                field_types: dict[str, str] | None = None, annotations: Path | None = None,
                drop_empty: bool = False, max_side: int | None = None) -> Listing:
    """List a built-in source.

    Args:
        field_types: ``filelist``: column name -> type, instead of the inferred one
            (:mod:`packer.sources.columns`).
        annotations, drop_empty, max_side: ``coco``: the annotation file, whether
            images without annotations are dropped, and the ``--max-side`` that
            will shrink images (see :func:`packer.sources.coco.list_coco`).

    Raises:
        InputUsageError: SRC is not the kind of thing ``kind`` reads, or an
            option for another kind.
        InputError: a file list that cannot be parsed (names line and column).
    """
    src = Path(src)
    if field_types and kind != "filelist":
        raise InputUsageError(f"--field types the columns of a file list, not of --from {kind}")
    if (annotations is not None or drop_empty) and kind != "coco":
        raise InputUsageError(f"--annotations and --drop-empty are for --from coco, not {kind}")
    if kind == "coco":
        from .coco import list_coco

        return list_coco(src, annotations, to_jpeg=to_jpeg, drop_empty=drop_empty,
                         max_side=max_side)
    if kind in ("imagefolder", "files"):
        if not src.is_dir():
            raise InputUsageError(f"--from {kind} needs a folder", path=src)
        found: list = []
        if kind == "files":
            _walk(src, "", found, frozenset({_ident(src)}))
            return _finish(kind, src, found, {}, [], to_jpeg)
        classes = sorted(e.name for e in os.scandir(src) if not _hidden(e.name) and e.is_dir())
        for name in classes:
            if not _utf8(name):
                raise InputError("class folder name is not valid UTF-8 (class names are stored "
                                "as text); rename it", path=src / name)
        names = _local_class_names(src, classes)
        labels: list[int] = []
        empty = []
        for label, name in enumerate(classes):
            before = len(found)
            _walk(src / name, name, found, frozenset({_ident(src), _ident(src / name)}))
            if len(found) == before:
                empty.append(names[label])
            labels += [label] * (len(found) - before)
        return _finish(kind, src, found, {"label": labels}, [Field("label", "int")], to_jpeg,
                       names, empty)
    if kind == "filelist":
        if not src.is_file():
            raise InputUsageError("--from filelist needs a .csv, .tsv or .jsonl file", path=src)
        return _list_file(src, to_jpeg, field_types=field_types or {})
    raise InputUsageError(f"not a built-in source: {kind!r}")


def list_remote(kind: str, location, *, to_jpeg: bool = False,
                names: list[str] | None = None) -> Listing:
    """List an image folder or a folder of files on object storage (same rules as local).

    Object stores have no empty folders, so no class is ever empty here.

    Args:
        names: the folder's file names, where the caller has listed it already.

    Raises:
        InputUsageError: ``kind`` is not one that can be listed remotely, or nothing is there.
    """
    if kind not in ("imagefolder", "files"):
        raise InputUsageError(f"--from {kind} cannot read from object storage; an image folder or "
                         "a folder of files can (or copy the source to a local disk first)",
                         path=location.uri)
    if names is None:
        names = [f.name for f in location.list_files()]
    names = [n for n in names if not any(_hidden(part) for part in n.split("/"))]
    # Folder by folder, names sorted within each: the order of a local walk
    # ("a/x" before "a-c", which a plain string sort would put first).
    names.sort(key=lambda n: n.split("/"))
    if kind == "files":
        return _finish(kind, location.uri, [(n, n, None) for n in names], {}, [], to_jpeg,
                       location=location)
    nested = [n for n in names if "/" in n]
    folders = sorted({n.split("/", 1)[0] for n in nested})
    classes, empty = folders, []
    if CLASSES_FILE in names:
        present = set(folders)
        classes, folders = _remote_class_names(location, folders)
        empty = [c for c, f in zip(classes, folders, strict=True) if f not in present]
    index = {c: i for i, c in enumerate(folders)}
    found = [(n, n, None) for n in nested]
    labels = [index[n.split("/", 1)[0]] for n in nested]
    return _finish(kind, location.uri, found, {"label": labels}, [Field("label", "int")],
                   to_jpeg, classes, empty, location=location)


def _check_class_names(names, folders: list[str], where, *, missing_ok: bool) -> tuple[str, ...]:
    """The folders ``names`` (from ``where``, a classes.json) gives, checked against the
    ``folders`` found (all of them; or, with ``missing_ok``, some of them)."""
    expected = class_folders(names)
    extra = sorted(set(folders) - set(expected))
    missing = [] if missing_ok else sorted(set(expected) - set(folders))
    if extra or missing:
        said = [f"no folder for {len(missing)} class(es) it names, {missing[:3]}"] if missing \
            else []
        said += [f"{len(extra)} folder(s) it does not name, {extra[:3]}"] if extra else []
        raise InputError(f"{CLASSES_FILE} does not match the class folders: {'; '.join(said)} "
                        f"(its names give the folders {list(expected[:4])}"
                        f"{'...' if len(expected) > 4 else ''}; rule in "
                        "formats.codecs.imagefolder); fix or move it to label by folder names",
                        path=where)
    return expected


def _local_class_names(src: Path, folders: list[str]) -> list[str]:
    """Class names for the (sorted) class ``folders`` of ``src``: from its classes.json
    when there is one (which must agree with them), else the folder names."""
    path = src / CLASSES_FILE
    if not path.is_file():  # a folder of that name would be a class like any other
        return folders
    try:
        names = read_classes_file(src)
    except FormatError as exc:
        raise InputError(f"{exc.message} (an image folder's {CLASSES_FILE} names its classes, "
                        "index = label); fix or move it", path=path) from None
    _check_class_names(names, folders, path, missing_ok=False)
    return list(names)


def _remote_class_names(location, folders: list[str]) -> tuple[list[str], list[str]]:
    """(class names, every class's folder) from classes.json beside the class folders."""
    where = location.uri_of(CLASSES_FILE)
    names = parse_json(location.read_bytes(CLASSES_FILE, _CLASSES_LIMIT), path=where,
                       what="class names", error=InputError, max_bytes=_CLASSES_LIMIT)
    if not isinstance(names, list) or not all(isinstance(c, str) for c in names):
        raise InputError(f"class names must be a JSON list of strings (an image folder's "
                        f"{CLASSES_FILE} names its classes, index = label); fix or move it",
                        path=where)
    return names, list(_check_class_names(names, folders, where, missing_ok=True))


def detect_remote(names: list[str]) -> str:
    """The rule of :func:`detect_builtin` for a folder on object storage, given its
    file names: an image folder has a sub-folder and no image file at its top level."""
    names = [n for n in names if not _hidden(n)]
    has_dir = any("/" in n for n in names)
    has_image = any("/" not in n and os.path.splitext(n)[1].lower() in
                    JPEG_EXTENSIONS | OTHER_IMAGE_EXTENSIONS for n in names)
    return "imagefolder" if has_dir and not has_image else "files"


# -- file lists -------------------------------------------------------------------------

def _read_rows(src: Path, text: str | None, where) -> tuple[list[dict[str, Any]], list[int]]:
    """The rows of a file list and the line each starts on."""
    suffix = src.suffix.lower()
    if text is None:
        try:
            text = src.read_bytes().decode("utf-8-sig")  # line ends as written (no newline
            # translation: a quoted CSV cell's "\r\n" is its text)
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read file list: {exc}", path=where) from None
    if suffix in (".jsonl", ".ndjson"):
        rows, lines = [], []
        # Lines end at "\n" alone: splitlines() would also cut at U+2028 or U+0085,
        # which JSON strings may hold as they are.
        for n, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"line {n}: invalid JSON ({exc.msg})", path=where) from None
            if not isinstance(row, dict):
                raise InputError(f"line {n}: expected a JSON object", path=where,
                                found=type(row).__name__)
            rows.append(row)
            lines.append(n)
        return rows, lines
    # The csv module reads the text as a file: a quoted cell may hold line breaks
    # (splitlines() had cut them out), and each row's first line is counted.
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t" if suffix == ".tsv" else ",")
    header: list[str] | None = None
    rows, lines = [], []
    while True:
        first = reader.line_num + 1
        try:
            cells = next(reader, None)
        except csv.Error as exc:
            raise InputError(f"line {first}: not CSV ({exc})", path=where) from None
        if cells is None:
            return rows, lines
        if not cells:
            continue  # a blank line
        if header is None:
            header = cells
        elif len(cells) != len(header):
            raise InputError(f"line {first}: wrong number of columns", path=where,
                            found=len(cells), expected=len(header))
        else:
            rows.append(dict(zip(header, cells, strict=True)))
            lines.append(first)


def list_remote_file(location, name: str, *, to_jpeg: bool = False,
                     field_types: dict[str, str] | None = None) -> Listing:
    """A file list stored on object storage, next to the objects it names.

    Paths are names relative to the list's folder there (no ``..``, nothing
    absolute: the object store has no "elsewhere" to point to).

    Raises:
        InputError: the list does not parse (names line and column).
        StorageError: it cannot be read.
    """
    where = location.uri_of(name)
    raw = location.read_bytes(name, _LIST_LIMIT)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read file list: {exc}", path=where) from None
    return _list_file(Path(name), to_jpeg, text=text, location=location, where=where,
                      field_types=field_types or {})


def _list_file(src: Path, to_jpeg: bool, *, text: str | None = None, location=None,
               where: str | None = None, field_types: dict[str, str]) -> Listing:
    """``where``: how errors name the list (its URI, for a list on object storage)."""
    where = where or src
    rows, lines = _read_rows(src, text, where)
    names = list(rows[0]) if rows else []
    unknown = sorted(set(field_types) - set(names))
    if unknown:
        raise InputUsageError(f"--field names {unknown}, which the list has no column of to "
                              f"type (its columns besides 'path': "
                              f"{[n for n in names if n != 'path']})", path=where)
    if not rows:
        return _finish("filelist", src, [], {}, [], to_jpeg, location=location)
    if "path" not in names:
        raise InputError("file list has no 'path' column", path=where, found=names)
    for r in _RESERVED:
        if r in names:
            raise InputError(f"file list column {r!r} clashes with the packer's own field",
                            path=where)
    for i, row in enumerate(rows):
        if list(row) != names and set(row) != set(names):
            raise InputError("row has other columns than the first row", path=where, record=i,
                            found=sorted(row), expected=sorted(names))
    base = src.parent
    found = []
    for i, row in enumerate(rows):
        p = row["path"]
        if not isinstance(p, str) or not p:
            raise InputError("empty or non-string 'path'", path=where, record=i, found=p)
        if location is not None:
            try:
                location.path(p)
            except UnsafePathError:
                raise InputError("'path' must name an object beside the list: relative, no "
                                "'..'", path=where, record=i, found=p) from None
            found.append((p, p, None))
            continue
        # Trusted input: the user's own list may point anywhere (see module docstring).
        found.append((os.path.join(base, p), p.replace(os.sep, "/"), None))
    columns: dict[str, list] = {}
    col_fields: list[Field] = []
    classes = None
    text = src.suffix.lower() in (".csv", ".tsv")
    for name in names:
        if name == "path":
            continue
        col = type_column(name, [row[name] for row in rows], from_text=text, lines=lines,
                          where=where, override=field_types.get(name))
        f, values = col.field, col.values
        for i, reason in col.problems.items():
            if found[i][2] is None:  # the first problem of a row is the one it is skipped for
                found[i] = (found[i][0], found[i][1], (BAD_ROW, reason))
        if name == "label" and f.type == "str":
            classes = sorted({v for v in values if v is not None})
            index = {c: i for i, c in enumerate(classes)}
            f, values = Field("label", "int"), [index.get(v) for v in values]
        columns[name] = values
        col_fields.append(f)
    return _finish("filelist", src, found, columns, col_fields, to_jpeg, classes,
                   location=location)
