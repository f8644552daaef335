"""Exception types for everything that reads or writes datasets.

:class:`ShardpackError` is the one root of the errors shardpack raises on purpose
(the packer's and the reader's derive from it too); ``except ShardpackError``
catches them all. Each subclass also keeps the standard base users catch: bad
data, a bad dataset and bad usage are ``ValueError`` s, a key that names no single
record a ``KeyError``, a missing dataset or dataset file a ``FileNotFoundError``, a
record index out of range an ``IndexError``, a value of the wrong type a
``TypeError``, a failing Loader a ``RuntimeError``. A Ctrl-C during a pack
(``packer.PackInterrupted``) stays a ``KeyboardInterrupt``, outside the root. Every error carries where it happened
(file, shard, record, byte offset) and what was expected versus found, so a message
reads like::

    shard-00003.rec record 1841 at byte 9437184: checksum 0x1a2b3c4d, expected 0x5e6f7a8b

What was found and expected is quoted at most :data:`QUOTE_LIMIT` characters long
(:func:`quoted`), so a huge value never makes a huge message.
"""

from __future__ import annotations

import errno
from pathlib import Path

__all__ = [
    "QUOTE_LIMIT",
    "ArgumentError",
    "ArgumentTypeError",
    "CacheError",
    "CorruptRecordError",
    "DatasetNotFoundError",
    "DecompressionError",
    "DuplicateKeyError",
    "ExampleError",
    "FormatError",
    "InputError",
    "InputUsageError",
    "KeyLookupError",
    "ManifestError",
    "MissingFileError",
    "MissingObjectError",
    "ObjectTooLargeError",
    "RecordIndexError",
    "SchemaError",
    "ShardpackError",
    "StorageError",
    "URIError",
    "UnknownFormatError",
    "UnknownKeyError",
    "UnsafePathError",
    "VersionError",
    "quoted",
]

#: The most characters of a value an error message quotes: a 10 MB key looked up
#: in vain must not make a 10 MB message (nor cost a 10 MB ``repr``).
QUOTE_LIMIT = 200


class ShardpackError(Exception):
    """The root of shardpack's errors, with the location of what went wrong.

    Args:
        message: what is wrong, in words.
        path: the file concerned.
        record: the record index (within the shard, or global if ``shard`` is None).
        offset: the byte offset in ``path``.
        expected: what the format requires there.
        found: what was there instead.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        record: int | None = None,
        offset: int | None = None,
        expected: object = None,
        found: object = None,
    ) -> None:
        self.message = message
        self.path = None if path is None else str(path)
        self.record = record
        self.offset = offset
        self.expected = expected
        self.found = found
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.path is not None:
            where.append(Path(self.path).name if len(self.path) > 80 else self.path)
        if self.record is not None:
            where.append(f"record {self.record}")
        if self.offset is not None:
            where.append(f"at byte {self.offset}")
        text = self.message
        said = [f"{k} {quoted(v)}" for k, v in (("found", self.found), ("expected", self.expected))
                if v is not None]  # never "expected None"
        if said:
            text += ": " + ", ".join(said)
        return f"{' '.join(where)}: {text}" if where else text

    def __reduce__(self):
        # Keeps the structured fields when an error crosses a process boundary.
        kwargs = {
            "path": self.path,
            "record": self.record,
            "offset": self.offset,
            "expected": self.expected,
            "found": self.found,
        }
        return (_rebuild, (type(self), self.message, kwargs))


def _rebuild(cls, message, kwargs):
    return cls(message, **kwargs)


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` as an error quotes it: at most ``limit`` characters, a longer
    one cut with ``...`` and its full length said (in items for a ``str`` or
    ``bytes``, which are cut before the ``repr`` is made)."""
    if isinstance(value, (str, bytes, bytearray, memoryview)) and len(value) > limit:
        unit = "characters" if isinstance(value, str) else "bytes"
        head = value[:limit] if not isinstance(value, memoryview) else value[:limit].tobytes()
        return f"{repr(head)[:limit]}... ({len(value)} {unit})"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class FormatError(ShardpackError, ValueError):
    """A file is not a well-formed shardpack file (magic, header, index, sizes)."""


class VersionError(FormatError):
    """A file or manifest has a major format version this reader does not know."""


class ManifestError(FormatError):
    """manifest.json is missing, malformed, or disagrees with the files."""


class SchemaError(ShardpackError, ValueError):
    """A record or a value does not match the dataset schema."""


class CorruptRecordError(ShardpackError, ValueError):
    """A record's bytes fail their checksum or cannot be decoded."""


class DecompressionError(CorruptRecordError):
    """A compressed payload is damaged or would expand beyond its declared bound."""


class InputError(ShardpackError, ValueError):
    """A source cannot be listed or read as its kind says (names the file and what is wrong)."""


class InputUsageError(InputError):
    """SRC is not the kind of input the named (or detected) source reads, or an option
    does not fit what SRC holds; nothing was read. The way out is often an option,
    but it is found by looking at SRC, so it is a data error like any other
    (``pack-dataset`` prints one line and exits with status 1); options that
    contradict each other are the packer's ``UsageError`` (status 2)."""


class UnsafePathError(ShardpackError, ValueError):
    """A name read from a manifest or an archive would leave the dataset folder."""


class StorageError(ShardpackError, ValueError):
    """Object storage failed for good (after retries), or a download did not match
    the manifest: the message names the object's URI."""


class MissingObjectError(StorageError):
    """The object does not exist (not retried)."""


class ObjectTooLargeError(StorageError):
    """The object is larger than the bound set for reading it."""


class MissingFileError(FormatError, FileNotFoundError):
    """A file of the dataset does not exist (deleted since the dataset was opened, or
    never written): also a ``FileNotFoundError``, its ``filename`` the file."""

    def __init__(self, message: str, **kwargs) -> None:
        super().__init__(message, **kwargs)
        self.errno, self.strerror, self.filename = errno.ENOENT, message, self.path

    def __str__(self) -> str:  # OSError's own str() would show the errno
        return self.args[0]


class RecordIndexError(ShardpackError, IndexError):
    """A record index outside the dataset (also an ``IndexError``): names the index
    and the dataset's length."""


class ArgumentError(ShardpackError, ValueError):
    """A value passed to shardpack is not one its argument takes (a Loader option,
    ``set_epoch``'s epoch, a record index's type): the message names the argument, the
    value and what is allowed. Raised where the value is given, never later in a
    worker."""


class ArgumentTypeError(ArgumentError, TypeError):
    """An :class:`ArgumentError` whose value has the wrong type (``batch_size="32"``,
    ``ds[1.7]``, ``set_epoch(1.5)``): a ``TypeError`` too, as Python's own argument
    checks are."""


class CacheError(ShardpackError, OSError):
    """The node's cache folder (``$SHARDPACK_CACHE``) cannot serve what it must: a
    download folder that cannot be created or written, or columns too large to map.
    An ``OSError``, as the failure it replaces was; the message says the way out."""


class URIError(StorageError):
    """A URI that cannot name a location as written (an unknown query key, a
    malformed authority): a usage error. Its message never holds the URI's secrets."""


class DatasetNotFoundError(ManifestError, MissingFileError):
    """The dataset path does not exist, or is not a folder (also a ``FileNotFoundError``)."""


class KeyLookupError(ShardpackError, KeyError, ValueError):
    """A lookup by key found no single record (also a ``KeyError``, and a ``ValueError``
    as every error of a bad lookup).

    Attributes:
        key: the key looked up.
        matches: indices of the records with that key (for :class:`DuplicateKeyError`),
            or the closest keys the dataset has (for :class:`UnknownKeyError`).
    """

    def __init__(self, message: str, *, key: str | None = None, matches: tuple = (),
                 **kwargs) -> None:
        self.key = key
        self.matches = tuple(matches)
        super().__init__(message, **kwargs)

    def __str__(self) -> str:  # KeyError's own str() would quote the whole message
        return self.args[0]

    def __reduce__(self):
        rebuild, (cls, message, kwargs) = super().__reduce__()
        return rebuild, (cls, message, {**kwargs, "key": self.key, "matches": self.matches})


class UnknownKeyError(KeyLookupError):
    """No record has this key; the message names the dataset and the closest keys."""


class DuplicateKeyError(KeyLookupError):
    """Several records have this key, so it names no single record
    (:meth:`ShardDataset.indices_of` gives them all)."""


class UnknownFormatError(ShardpackError, KeyError, ValueError):
    """A format name no codec has (a KeyError for the packer, a ValueError for usage)."""

    def __str__(self) -> str:
        return str(self.args[0])


class ExampleError(ShardpackError, ValueError):
    """The bytes are not a well-formed Example; the caller adds file and record."""
