"""An ImageFolder as output: ``DST/<class folder>/<file name>``, one image per record.

torchvision's ``ImageFolder`` (``find_classes``) labels the sub-folders of its root
by their place in ``sorted()`` order, empty ones included. This sink names the
folders so that the order gives back every label (:func:`class_folders`):

* every class gets a folder, empty ones too (classes without names: labels 0 to
  the largest one seen);
* classes without names: zero-padded label numbers, ``000``, ``001``, ... (three
  digits, more when there are over 1,000 classes);
* named classes: the names themselves when each is a valid folder name as it is
  (unchanged by :func:`formats.names.safe_name`, not ``classes.json``), no two are
  equal as a case-insensitive, normalising file system compares them (it would
  merge them) and they are already in sorted order;
* otherwise every folder is ``NNN-<safe name>`` (``000-dog``, ``001-b_c``; ``NNN``
  alone when nothing of the name survives): equal-width numbers sort in label
  order, so sanitizing never merges or moves a class.

``DST/classes.json`` (a JSON list of names, index = label; written on a clean
exit, as the TFRecord and WebDataset sinks write theirs) records the label order;
for classes without names it lists the folder names. ``pack-dataset`` reading
such a folder back takes the names from it (:mod:`packer.sources.folders`). torchvision
refuses an empty class folder unless ``ImageFolder(root, allow_empty=True)``: a
loud error, where a missing folder would shift every later label in silence.
It also skips GIFs (not in its ``IMG_EXTENSIONS``); this sink writes them as
``.gif`` all the same (``--to-jpeg`` converts them when packing).

File names come from the last part of the record's ``key``, mapped by the one rule
for names that become paths (:mod:`formats.names`: no separator, ``..``, control
character or look-alike survives); two keys that give one name (``a:b`` and ``a_b``,
``A.jpg`` and ``a.jpg`` on a case-insensitive file system) are told apart by a
numbered variant (``a_b_00000007.jpg``), so no file of the run is written over; every
path is checked to lie inside DST before anything is written, whatever the input said.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from ..base import Record
from ..errors import SchemaError, UnsafePathError
from ..fields import Field
from ..media import IMAGE_EXTENSION
from ..names import NameClaims, safe_name
from ..sniff import sniff
from .paths import CLASSES_FILE, write_classes_file

__all__ = ["ImageFolderSink", "class_folders"]

_SAME_EXT = {".jpg": ".jpeg", ".tif": ".tiff"}  # the other spelling a key may already end in
_MIN_DIGITS = 3


def _numbers(count: int) -> list[str]:
    width = max(_MIN_DIGITS, len(str(count - 1)))
    return [f"{i:0{width}d}" for i in range(count)]


def class_folders(classes: Sequence[str] | int) -> tuple[str, ...]:
    """The folder name of each class, index = label, by the rule in the module
    docstring: ``sorted()`` of the result is the result itself.

    Args:
        classes: the class names, or the number of classes when they have none.
    """
    if isinstance(classes, int):
        return tuple(_numbers(classes))
    names = list(classes)
    claims = NameClaims()
    if (all(safe_name(n, "") == n and n != CLASSES_FILE for n in names)
            and all(claims.claim(n) for n in names) and names == sorted(names)):
        return tuple(names)
    out = []
    for num, n in zip(_numbers(len(names)), names, strict=True):
        safe = safe_name(n, "")
        out.append(f"{num}-{safe}" if safe else num)
    return tuple(out)


class ImageFolderSink:
    """Writes the ``image`` field of each record as a file in its class folder.

    Args:
        path: the output folder (created; files already there are kept, and a
            name taken by an earlier file gets a numbered suffix).
        fields: the schema; needs ``image``; ``label`` picks the folder (without
            it, files go straight into DST and no ``classes.json`` is written);
            ``key`` the file name.
        classes: class names, index = label (None: the classes have no names).
        overwrite: replace files of the same name instead of adding a suffix.

    Raises:
        SchemaError: (from :meth:`write`) a label with no class name, or a negative
            label: no folder can hold it.

    Other fields are not written (an ImageFolder has no place for them).
    """

    def __init__(self, path: str | Path, fields, classes=None, *, overwrite: bool = False) -> None:
        self.root = Path(path)
        self.root.mkdir(parents=True, exist_ok=True)
        self._real_root = self.root.resolve()
        names = {f.name: f for f in fields}
        if "image" not in names:
            raise SchemaError("imagefolder output needs an 'image' field",
                              found=sorted(names))
        self.fields: tuple[Field, ...] = tuple(fields)
        self.has_label = "label" in names and names["label"].type == "int"
        self.classes = None if classes is None else tuple(classes)
        self.overwrite = overwrite
        self.count = 0
        self._folders: dict[int, Path] = {}
        self._claims: dict[Path, NameClaims] = {}  # per folder: the names given in this run
        if self.has_label and self.classes is not None:
            # Every class folder up front, empty ones too: a missing one would shift
            # every later label as torchvision counts them.
            for label, name in enumerate(class_folders(self.classes)):
                self._folders[label] = self._mkdir(name)

    def _mkdir(self, name: str) -> Path:
        folder = self._inside(self.root / name)
        folder.mkdir(exist_ok=True)
        return folder

    def _folder(self, label: int) -> Path:
        folder = self._folders.get(label)
        if folder is not None:
            return folder
        if self.classes is not None:
            raise SchemaError(f"record {self.count}: label {label} has no class name "
                              f"({len(self.classes)} classes): no folder can hold it",
                              found=label, expected=f"0 to {len(self.classes) - 1}")
        if label < 0:
            raise SchemaError(f"record {self.count}: a negative label has no folder in an "
                              "image folder", found=label)
        # Three digits now; more, by renaming, at the end if a label reaches 1,000.
        self._folders[label] = folder = self._mkdir(f"{label:0{_MIN_DIGITS}d}")
        return folder

    def _inside(self, p: Path) -> Path:
        # Belt and braces: safe_name already removed separators; this also catches a
        # symlink planted in DST that would redirect a class folder elsewhere.
        real = p.resolve()
        if real != self._real_root and self._real_root not in real.parents:
            raise UnsafePathError("output path would leave the output folder", path=self.root,
                                  found=str(p))
        return p

    def write(self, record: Record) -> None:
        data = record.fields["image"]
        folder = self._folder(int(record.fields["label"])) if self.has_label else self.root
        key = record.fields.get("key")
        stem = f"{self.count:08d}"
        if isinstance(key, str) and key:
            stem = safe_name(PurePosixPath(key.replace("\\", "/")).name, stem)
        kind = sniff(data)
        ext = f".{IMAGE_EXTENSION[kind]}" if kind in IMAGE_EXTENSION else ".bin"
        if Path(stem).suffix.lower() not in (ext, _SAME_EXT.get(ext, ext)):
            stem += ext
        base = Path(stem)
        claims = self._claims.setdefault(folder, NameClaims())
        exists = None if self.overwrite else (lambda name: os.path.lexists(folder / name))
        path = self._inside(folder / claims.unique(base.stem, base.suffix, self.count, exists))
        # "x": a file that appeared since the check above is never written over.
        with open(path, "wb" if self.overwrite else "xb") as f:
            f.write(data)
        self.count += 1

    def _finish(self) -> None:
        """Folders for unnamed classes at their final width, gaps filled; classes.json."""
        if not self.has_label:
            return
        if self.classes is None:
            count = max(self._folders, default=-1) + 1
            folders = class_folders(count)
            # Renames are safe in any order: a wider name starts with a zero, which
            # no three-digit-or-natural-width name written so far does (or is its own).
            for label, folder in sorted(self._folders.items()):
                if folder.name != folders[label]:
                    folder.rename(self._inside(self.root / folders[label]))
            for name in folders:
                self._mkdir(name)
            names = list(folders)
        else:
            names = list(self.classes)
        write_classes_file(self.root, names)

    def __enter__(self) -> ImageFolderSink:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self._finish()
