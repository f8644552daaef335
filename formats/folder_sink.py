"""An ImageFolder as output: ``DST/<class name>/<file name>``, one image per record.

Class folder names come from the class names (or the label number), file names
from the record's ``key``; both are sanitized, and every path is checked to lie
inside DST before anything is written, whatever the input said.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from .base import Record
from .errors import SchemaError, UnsafePathError
from .fields import Field
from .sniff import sniff

__all__ = ["ImageFolderSink", "safe_name"]

_BAD = re.compile(r"[\x00-\x1f/\\:*?\"<>|]")
_EXT = {"jpeg": ".jpg", "png": ".png", "webp": ".webp", "gif": ".gif", "bmp": ".bmp"}
_MAX_NAME = 200


def safe_name(text: str, fallback: str) -> str:
    """A single, harmless file name made from untrusted ``text``: no separators or
    control characters, valid UTF-8 (a lone surrogate, which no file system call
    can encode, is spelled out), at most ``_MAX_NAME`` bytes (file systems count
    bytes, not characters)."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    name = _BAD.sub("_", text).strip().lstrip(".")
    name = name.encode("utf-8")[:_MAX_NAME].decode("utf-8", "ignore")
    return name if name and name not in (".", "..") else fallback


class ImageFolderSink:
    """Writes the ``image`` field of each record as a file in its class folder.

    Args:
        path: the output folder (created; files already there are kept, and a
            name taken by an earlier file gets a numbered suffix).
        fields: the schema; needs ``image``; ``label`` picks the folder (without
            it, files go straight into DST); ``key`` the file name.
        classes: class names, index = label.
        overwrite: replace files of the same name instead of adding a suffix.

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
        self._used: set[Path] = set()

    def _folder(self, label: int) -> Path:
        folder = self._folders.get(label)
        if folder is None:
            if self.classes is not None and 0 <= label < len(self.classes):
                name = safe_name(self.classes[label], f"class_{label}")
            else:
                name = str(label)
            folder = self._inside(self.root / name)
            folder.mkdir(exist_ok=True)
            self._folders[label] = folder
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
        ext = _EXT.get(sniff(data), ".bin")
        if Path(stem).suffix.lower() not in (ext, ".jpeg" if ext == ".jpg" else ext):
            stem += ext
        path = self._inside(folder / stem)
        if path in self._used or (not self.overwrite and path.exists()):
            base = Path(stem)
            path = self._inside(folder / f"{base.stem}_{self.count:08d}{base.suffix}")
        self._used.add(path)
        with open(path, "wb") as f:
            f.write(data)
        self.count += 1

    def __enter__(self) -> ImageFolderSink:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        return None
