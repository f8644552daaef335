"""Image folders and folders of files, on a local disk or on object storage, listed up front.

They read back the layout of the folder sink (:mod:`formats.codecs.imagefolder`),
its ``classes.json`` included.

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
* A folder is an image folder when it has a non-hidden sub-folder and no image
  file at its top level (:func:`detect_folder`, :func:`detect_remote`).

The rules every listing follows are in :mod:`packer.sources.listing`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from formats.bounded import parse_json
from formats.codecs.imagefolder import class_folders
from formats.codecs.paths import CLASSES_FILE, read_classes_file
from formats.errors import FormatError, InputError, InputUsageError
from formats.fields import Field
from formats.media import IMAGE_SUFFIXES

from .listing import Listing, finish, hidden, utf8

__all__ = ["FOLDER_SOURCES", "detect_folder", "detect_remote", "list_folder", "list_remote"]

#: The source kinds this module lists.
FOLDER_SOURCES = ("imagefolder", "files")
_CLASSES_LIMIT = 64 << 20  # an image folder's classes.json there (as formats.codecs.paths reads one)


def _is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES


def detect_folder(src: Path) -> str:
    """``imagefolder`` or ``files`` for the local folder ``src`` (module docstring)."""
    has_dir = has_image = False
    for e in os.scandir(src):
        if hidden(e.name):
            continue
        if e.is_dir():
            has_dir = True
        elif _is_image_name(e.name):
            has_image = True
    return "imagefolder" if has_dir and not has_image else "files"


def detect_remote(names: list[str]) -> str:
    """The rule of :func:`detect_folder` for a folder on object storage, given its
    file names."""
    names = [n for n in names if not hidden(n)]
    has_dir = any("/" in n for n in names)
    has_image = any("/" not in n and _is_image_name(n) for n in names)
    return "imagefolder" if has_dir and not has_image else "files"


def _walk(top: Path, rel: str, out: list[tuple[str, str, tuple[str, str] | None]],
          ancestors: frozenset[tuple[int, int]]) -> None:
    """Append (path, key, problem) for every non-hidden file under ``top``, sorted by name."""
    try:
        entries = sorted(os.scandir(top), key=lambda e: e.name)
    except OSError as exc:
        raise InputError(f"cannot list folder: {exc.strerror}", path=top) from None
    for e in entries:
        if hidden(e.name):
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
            out.append((e.path, key, None if utf8(key) else (
                "bad-name", "file name is not valid UTF-8: its key cannot be stored as text")))
        else:
            out.append((e.path, key, ("unreadable", "not a regular file (FIFO, socket or device)")))


def _ident(p: Path) -> tuple[int, int]:
    st = p.stat()
    return (st.st_dev, st.st_ino)


def list_folder(kind: str, src: Path, *, to_jpeg: bool = False) -> Listing:
    """List the local ``imagefolder`` or ``files`` folder ``src``.

    Raises:
        InputUsageError: ``src`` is not a folder.
        InputError: a folder cannot be listed, a class folder name is not UTF-8, or
            its ``classes.json`` does not agree with the class folders.
    """
    if not src.is_dir():
        raise InputUsageError(f"--from {kind} needs a folder", path=src)
    found: list = []
    if kind == "files":
        _walk(src, "", found, frozenset({_ident(src)}))
        return finish(kind, src, found, {}, [], to_jpeg)
    classes = sorted(e.name for e in os.scandir(src) if not hidden(e.name) and e.is_dir())
    for name in classes:
        if not utf8(name):
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
    return finish(kind, src, found, {"label": labels}, [Field("label", "int")], to_jpeg,
                  names, empty)


def list_remote(kind: str, location, *, to_jpeg: bool = False,
                names: list[str] | None = None) -> Listing:
    """List an image folder or a folder of files on object storage (same rules as local).

    Object stores have no empty folders, so no class is ever empty here.

    Args:
        names: the folder's file names, where the caller has listed it already.

    Raises:
        InputUsageError: ``kind`` is not one that can be listed remotely, or nothing is there.
    """
    if kind not in FOLDER_SOURCES:
        raise InputUsageError(f"--from {kind} cannot read from object storage; an image folder or "
                              "a folder of files can (or copy the source to a local disk first)",
                              path=location.uri)
    if names is None:
        names = [f.name for f in location.list_files()]
    names = [n for n in names if not any(hidden(part) for part in n.split("/"))]
    # Folder by folder, names sorted within each: the order of a local walk
    # ("a/x" before "a-c", which a plain string sort would put first).
    names.sort(key=lambda n: n.split("/"))
    if kind == "files":
        return finish(kind, location.uri, [(n, n, None) for n in names], {}, [], to_jpeg,
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
    return finish(kind, location.uri, found, {"label": labels}, [Field("label", "int")],
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
