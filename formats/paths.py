"""Input path patterns: a file, a folder, a glob, or a brace pattern like ``a-{000..009}.tar``."""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from .bounded import parse_json, read_small_file, refuse_special_file
from .errors import FormatError

__all__ = ["canonical_order", "expand_braces", "expand_inputs", "read_classes_file", "write_classes_file"]

_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
_MAX_EXPANSION = 1_000_000
_MAX_CLASSES_FILE = 64 << 20


def expand_braces(pattern: str) -> list[str]:
    """Expand ``{a,b}`` lists and ``{000..009}`` ranges (zero padding kept), as braceexpand does."""
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    body = m.group(1)
    r = _RANGE.match(body)
    if r:
        lo, hi = int(r.group(1)), int(r.group(2))
        if abs(hi - lo) >= _MAX_EXPANSION:
            raise FormatError("brace range is too large", found=body)
        width = len(r.group(1)) if r.group(1).startswith("0") else 0
        step = 1 if hi >= lo else -1
        items = [f"{i:0{width}d}" for i in range(lo, hi + step, step)]
    else:
        items = body.split(",")
    head, tail = pattern[: m.start()], pattern[m.end():]
    return [x for item in items for x in expand_braces(head + item + tail)]


def expand_inputs(path: str | Path, suffixes: Iterable[str]) -> list[Path]:
    """The input files a source reads, in a stable (sorted or pattern) order.

    Args:
        path: a file, a folder (its files ending in one of ``suffixes``, sorted),
            a glob, or a brace pattern.
        suffixes: file name endings that count in a folder, e.g. ``(".tar",)``.

    Raises:
        FormatError: nothing matches.
    """
    text = str(path)
    suffixes = tuple(suffixes)
    p = Path(text)
    refuse_special_file(p)  # a FIFO is no "input file not found", and must not hang
    if p.is_dir():
        files = sorted(q for q in p.iterdir() if q.is_file() and q.name.lower().endswith(suffixes))
    elif p.is_file():
        files = [p]
    else:
        files = []
        for pattern in expand_braces(text):
            if glob.has_magic(pattern):
                files.extend(Path(q) for q in sorted(glob.glob(pattern)) if Path(q).is_file())
            elif Path(pattern).is_file():
                files.append(Path(pattern))
            else:
                raise FormatError("input file not found", path=pattern)
    if not files:
        raise FormatError(f"no input files (looked for {', '.join(suffixes)})", path=text)
    return files


CLASSES_FILE = "classes.json"
_ORDER = {"image": 0, "label": 1, "key": 2}


def canonical_order(fields):
    """``image``, ``label``, ``key`` first, the rest in their input order."""
    return tuple(sorted(fields, key=lambda f: _ORDER.get(f.name, 3)))


def write_classes_file(root: Path, classes) -> None:
    """Class names beside foreign shards that have no place for them (TFRecord, tar)."""
    if classes is not None:
        (Path(root) / CLASSES_FILE).write_text(json.dumps(list(classes), ensure_ascii=False) + "\n",
                                               encoding="utf-8")


def read_classes_file(folder: Path) -> tuple[str, ...] | None:
    """The class names :func:`write_classes_file` left in ``folder``, if any.

    Raises:
        FormatError: the file exists but is not a JSON list of strings.
    """
    path = Path(folder) / CLASSES_FILE
    if not os.path.lexists(path):
        return None
    try:
        raw = read_small_file(path, _MAX_CLASSES_FILE, "class names file")
    except OSError as exc:
        raise FormatError(f"unreadable class names ({exc.strerror})", path=path) from None
    obj = parse_json(raw, path=path, what="class names", error=FormatError,
                     max_bytes=_MAX_CLASSES_FILE)
    if not isinstance(obj, list) or not all(isinstance(c, str) for c in obj):
        raise FormatError("class names must be a JSON list of strings", path=path)
    return tuple(obj)
