"""Errors of the packer, on the ``formats`` base so every message names its file.

``UsageError`` is a command line (or call) that contradicts itself: found without
reading SRC or DST, it is ``pack-dataset``'s exit status 2 with the usage block.
Everything found by looking at SRC or DST is a data error (exit status 1, one
line): ``DestinationError`` for a DST that cannot take the pack as it is,
``formats.errors.InputError`` for SRC, and ``PackInputError`` for one bad input
file, carrying the skip ``kind`` so the same value feeds ``skipped.jsonl``.

Inside the packer, one input found bad deep in a check (an image's header, a file's
text, a sample's field) is raised as the private :class:`_Bad` and caught where the
input becomes an item with a skip kind; ``--on-error`` is applied to that item in
one place (:func:`packer.loop.write_items`), never to the exception.
"""

from __future__ import annotations

from formats.errors import ShardpackError

__all__ = ["DestinationError", "PackError", "PackInputError", "PackInterrupted", "UsageError"]


class PackError(ShardpackError, ValueError):
    """The pack cannot go on (bad source, unwritable destination...)."""


class UsageError(PackError):
    """Options or paths that contradict each other, seen without reading SRC or DST;
    nothing was written (``pack-dataset``: exit status 2, with the usage block)."""


class DestinationError(PackError):
    """DST cannot take the pack as it is: it holds files shardpack did not write, a
    manifest that is not ours, a dataset (without ``overwrite``), or it cannot be
    created or written. Found by looking at DST, so a data error (``pack-dataset``:
    exit status 1, one line); nothing was written."""


class PackInputError(PackError):
    """One input file cannot be packed.

    Args:
        path: the file.
        kind: the skip kind (``missing``, ``unreadable``, ``empty``,
            ``not-an-image``, ``not-a-jpeg``, ``corrupt``, ``truncated``, ``unsupported``,
            ``unsupported-jpeg``, ``too-large`` (over the pixel budget), ``over-shard-size``,
            ``bad-name``...).
        reason: what is wrong, in words.
    """

    def __init__(self, reason: str, *, path=None, kind: str = "unreadable", **kw) -> None:
        self.kind = kind
        super().__init__(reason, path=path, **kw)

    def _render(self) -> str:
        # The full path, never shortened: the user has to find the file.
        return f"{self.path}: {self.message} [{self.kind}]"

    def __reduce__(self):
        return (_rebuild_input, (self.message, self.path, self.kind))


def _rebuild_input(message, path, kind):
    return PackInputError(message, path=path, kind=kind)


class _Bad(Exception):
    """One bad input: its skip kind and the reason, in words (see the module docstring)."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(kind, reason)
        self.kind, self.reason = kind, reason


class PackInterrupted(KeyboardInterrupt):
    """Ctrl-C during a pack; sealed shards stay for ``--resume``.

    Args:
        summary: the counters so far (a :class:`~packer.report.PackSummary`).
    """

    def __init__(self, summary) -> None:
        super().__init__("pack interrupted: the shards sealed so far are kept; run it again "
                         "with --resume (PackOptions(resume=True)) to finish it")
        self.summary = summary
