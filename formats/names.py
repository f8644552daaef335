"""Names from data that become paths: the one rule (DESIGN.md, "Failure behaviour").

A field name, a record key, a class name or an object name in a manifest is data:
it may hold any string. Before one becomes a path, or part of one, it goes through
this module, which refuses it or maps it to a safe name; nothing else decides.

A name is split into parts at ``/``. A part is **unsafe** (:func:`unsafe_reason`)
when it is:

* empty, ``.`` or ``..`` (``a//b``, ``./..``, ``a/../..``);
* holds a backslash (a separator on Windows, and to some tools), NUL or another
  control character (C0, DEL, C1);
* longer than 255 bytes of UTF-8 (``NAME_MAX`` of every common file system);
* not UTF-8 (a lone surrogate: no file system call can encode it);
* holds a character whose compatibility form (NFKC) is a dot or a separator
  (fullwidth ``．`` and ``／``, ``‥``, ``﹒``): Unicode normalisation, and Windows'
  "best fit" conversion, turn them into ``..`` and ``/``.

and a whole name is unsafe when it is absolute (a leading ``/`` or ``\\``, a drive
such as ``C:``) or any part is.

Two ways to use the rule, chosen by each caller:

* **Refuse** (:func:`check_name`): a name that must be used as it is written (an
  object name in a manifest, a tar member read back) raises
  :class:`~formats.errors.UnsafePathError` naming where it came from, the record
  when there is one, and the name.
* **Map** (:func:`safe_name`, :func:`safe_path`): a sink that names its own files
  after data (a class folder, an image file named by its key, an extracted field,
  a tar member) replaces each unsafe character with ``_`` (also those Windows
  refuses in a file name, ``:*?"<>|``), drops leading dots (no hidden files) and
  trailing dots and spaces, and cuts a part to a byte budget. Mapping merges names
  (``a:b`` and ``a_b``; ``A`` and ``a`` on a case-insensitive file system), so a
  sink that maps also claims each name it writes in a :class:`NameClaims`, which
  compares names as such a file system does and gives a taken one a numbered
  variant: nothing is ever written over.
"""

from __future__ import annotations

import re
import unicodedata

from .errors import UnsafePathError

__all__ = ["MAPPED_BYTES", "MAX_PART_BYTES", "NameClaims", "check_name", "safe_name", "safe_path",
           "unsafe_reason"]

#: The longest part of a path, in bytes (``NAME_MAX``).
MAX_PART_BYTES = 255
#: The longest part a mapped name keeps, in bytes: room for a numbered variant
#: (``_00001234``) and an extension within :data:`MAX_PART_BYTES`.
MAPPED_BYTES = 200
_EMPTY_OR_DOTS = ("", ".", "..")
# ASCII parts are checked with one search (this runs once per shard name at open).
_ASCII_UNSAFE = re.compile(r"[\x00-\x1f\x7f\\]")
# What a mapped name never holds: the unsafe characters above, "/" and what Windows
# refuses in a file name.
_ASCII_MAPPED = re.compile(r'[\x00-\x1f\x7f\\/:*?"<>|]')
_DRIVE = re.compile(r"^[A-Za-z]:")


def _odd_char(c: str) -> bool:
    """A non-ASCII character that is a control character or a look-alike of a dot or
    a separator (its NFKC form holds ``.``, ``/`` or ``\\``)."""
    if unicodedata.category(c) == "Cc":
        return True
    nf = unicodedata.normalize("NFKC", c)
    return "." in nf or "/" in nf or "\\" in nf


def _part_reason(part: str) -> str | None:
    if part in _EMPTY_OR_DOTS:
        return "an empty, '.' or '..' part"
    if part.isascii():
        if _ASCII_UNSAFE.search(part):
            return "a backslash, NUL or control character"
        if len(part) > MAX_PART_BYTES:
            return f"a part longer than {MAX_PART_BYTES} bytes"
        return None
    try:
        size = len(part.encode("utf-8"))
    except UnicodeEncodeError:
        return "a character that is not UTF-8 (a lone surrogate)"
    if size > MAX_PART_BYTES:
        return f"a part longer than {MAX_PART_BYTES} bytes"
    if _ASCII_UNSAFE.search(part) or any(not c.isascii() and _odd_char(c) for c in part):
        return ("a backslash, a control character, or a character that normalises to a "
                "dot or a separator")
    return None


def unsafe_reason(name: object, *, parts: bool = False) -> str | None:
    """Why ``name`` cannot become a path as it is (the module docstring's rule), or
    None when it can.

    Args:
        name: the name (anything: only a non-empty ``str`` can be safe).
        parts: ``name`` may have several parts, separated by ``/``; otherwise a ``/``
            makes it unsafe.
    """
    if not isinstance(name, str):
        return f"not text ({type(name).__name__})"
    if name.startswith(("/", "\\")) or _DRIVE.match(name):
        return "an absolute path"
    if not parts and "/" in name:
        return "a '/' in a single name"
    for part in name.split("/") if parts else (name,):
        reason = _part_reason(part)
        if reason:
            return reason
    return None


def check_name(name: object, *, where: object, what: str = "name", record: int | None = None,
               parts: bool = False) -> str:
    """``name`` itself, refused unless it is safe (:func:`unsafe_reason`).

    Args:
        where: the file or folder the name came from (named in the error).
        what: what the name is, in words (``shard name``, ``field name``).
        record: the record it belongs to, if any.
        parts: allow several ``/``-separated parts.

    Raises:
        UnsafePathError: naming ``where``, the record, the name and what is wrong.
    """
    reason = unsafe_reason(name, parts=parts)
    if reason:
        inside = "a relative name" if parts else "a plain name"
        raise UnsafePathError(f"unsafe {what}: must be {inside} inside its folder ({reason})",
                              path=None if where is None else str(where), record=record,
                              found=name)
    return name  # type: ignore[return-value]


def _cut(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8, on a character boundary."""
    raw = text.encode("utf-8")
    return text if len(raw) <= limit else raw[:limit].decode("utf-8", "ignore")


def safe_name(text: str, fallback: str, *, limit: int = MAPPED_BYTES) -> str:
    """A single, harmless file name made from untrusted ``text`` (the module
    docstring's mapping), or ``fallback`` when nothing of it survives.

    Args:
        limit: the most bytes the name keeps (at most :data:`MAX_PART_BYTES`).
    """
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")  # lone surrogates spelled out
    name = _ASCII_MAPPED.sub("_", text)
    if not name.isascii():
        name = "".join("_" if not c.isascii() and _odd_char(c) else c for c in name)
    name = _cut(name.strip().lstrip("."), limit).rstrip(". ")
    return name if name not in _EMPTY_OR_DOTS else fallback


def safe_path(text: str, fallback: str, *, limit: int = MAPPED_BYTES) -> str:
    """A relative path of harmless parts made from untrusted ``text``: each part
    mapped as :func:`safe_name` maps it, with ``\\`` a separator too; parts that map
    to nothing (``""``, ``.``, ``..``) are dropped, never followed. ``fallback`` when
    no part survives."""
    parts = [safe_name(p, "", limit=limit) for p in text.replace("\\", "/").split("/")]
    parts = [p for p in parts if p]
    return "/".join(parts) if parts else fallback


class NameClaims:
    """The names already given in one folder (or one archive), compared as a
    case-insensitive, normalising file system compares them (NFC, case folded), so
    that two names meaning one file are told apart before anything is written."""

    def __init__(self) -> None:
        self._taken: set[str] = set()

    @staticmethod
    def _key(name: str) -> str:
        return unicodedata.normalize("NFC", name).casefold()

    def claim(self, name: str) -> bool:
        """Take ``name``; False (and nothing taken) when it, or a name a file system
        could take for it, was taken before."""
        key = self._key(name)
        if key in self._taken:
            return False
        self._taken.add(key)
        return True

    def unique(self, stem: str, suffix: str, number: int, taken=None) -> str:
        """``stem + suffix`` claimed, or the first free ``stem_<number>[_k] + suffix``
        when it is taken here (or ``taken(name)`` says it exists already)."""
        name, k = stem + suffix, 0
        while (taken is not None and taken(name)) or not self.claim(name):
            k += 1
            name = f"{stem}_{number:08d}{'' if k == 1 else f'_{k}'}{suffix}"
        return name
