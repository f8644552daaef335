"""A folder on any filesystem: one small API over pyarrow's filesystems.

A :class:`Location` is a folder on some filesystem: ``s3://bucket/prefix`` (and
every other URI that ``pyarrow.fs`` opens: ``gs://``, ``hdfs://``, ``file://``),
or, when fsspec is installed, any protocol fsspec knows. S3 settings ride in the
URI's query (``s3://b/ds?endpoint_override=127.0.0.1:9000&scheme=http``) or in
the usual ``AWS_*`` environment variables; a caller may also pass a ready
``pyarrow.fs.FileSystem``.

Every call is retried with exponential backoff on ``OSError`` (a dropped
connection, a throttled request) and then raises :class:`StorageError` naming
the object. Downloads go to a temporary name, are checked against the expected
size and CRC32C, and only then renamed, so a partial or corrupt object is never
taken for a good one. Names are always relative and checked: a name read from a
manifest cannot reach outside its dataset's prefix.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs

from ..checksum import crc32c
from ..errors import ObjectTooLargeError, StorageError
from ..files import temp_name
from ..names import check_name
from .retry import Retry
from .uris import (
    ParsedURI,
    URIError,
    _canonical,
    _check_s3_query,
    display_uri,
    is_uri,
    local_path,
    parse_uri,
)

__all__ = ["Location", "Place", "StoredFile", "open_location", "place"]

DEFAULT_RETRY = Retry()  # frozen: one shared default

_CHUNK = 8 << 20


#: Schemes pyarrow opens itself; any other goes to fsspec.
_PYARROW_SCHEMES = frozenset({"s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss"})


def _check_name(uri: str, name: str) -> str:
    # The one rule for names that become paths (formats.names); parts allowed.
    return check_name(name, where=uri, what="object name", parts=True)


class StoredFile(NamedTuple):
    """One object as a listing shows it."""

    name: str  # relative to the listed folder
    size: int
    mtime_ns: int | None  # None where the filesystem does not say


class Location:
    """A folder on a filesystem; every name is relative to it (see module docstring).

    Args:
        fs: the filesystem.
        root: the folder's path on ``fs`` (no scheme).
        uri: how to name it in messages (``s3://bucket/prefix``).
        retry: the retry policy for every call.
    """

    def __init__(self, fs: pafs.FileSystem, root: str, uri: str, retry: Retry = DEFAULT_RETRY) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.uri = uri.rstrip("/")
        self.retry = retry

    def __repr__(self) -> str:
        return f"Location({self.uri!r})"

    def __reduce__(self):
        return (Location, (self.fs, self.root, self.uri, self.retry))

    def path(self, name: str) -> str:
        """The filesystem path of ``name`` (checked: relative, no ``..``)."""
        return f"{self.root}/{_check_name(self.uri, name)}" if self.root else _check_name(
            self.uri, name)

    def uri_of(self, name: str) -> str:
        return f"{self.uri}/{name}"

    def stat(self) -> StoredFile | None:
        """The location itself when it is one object (``s3://b/list.csv``), else None."""
        info = self.retry.run(self.uri, "stat", lambda: self.fs.get_file_info(self.root))
        if info.type != pafs.FileType.File:
            return None
        return StoredFile(self.root.rpartition("/")[2], info.size, info.mtime_ns)

    def split(self) -> tuple[Location, str]:
        """(the folder holding this location, its name)."""
        root, _, name = self.root.rpartition("/")
        uri = self.uri.rpartition("/")[0]
        return Location(self.fs, root, uri, self.retry), name

    # -- reading ---------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        path = self.path(name)
        info = self.retry.run(self.uri_of(name), "stat",
                              lambda: self.fs.get_file_info(path))
        return info.type == pafs.FileType.File

    def read_bytes(self, name: str, limit: int) -> bytes:
        """A whole small object (a manifest, a file list), refusing more than ``limit`` bytes."""
        path, uri = self.path(name), self.uri_of(name)

        def read() -> bytes:
            with self.fs.open_input_stream(path) as f:
                data = f.read(limit + 1)
            return data

        data = self.retry.run(uri, "read", read)
        if len(data) > limit:
            raise ObjectTooLargeError(f"object larger than the {limit}-byte limit for it",
                                      path=uri)
        return data

    def download(self, name: str, dest: Path, *, size: int | None = None,
                 crc: int | None = None, limit: int = 1 << 30) -> None:
        """Copy ``name`` to the local file ``dest``, all or nothing.

        The bytes land in a temporary file beside ``dest``; a dropped connection
        retries from the start; the size and CRC32C are checked before the rename.
        Without ``size``, more than ``limit`` bytes is refused.

        Raises:
            StorageError: the object is missing, storage kept failing, or the
                bytes do not match ``size``/``crc`` (a corrupt object).
        """
        path, uri = self.path(name), self.uri_of(name)
        tmp = temp_name(dest)
        bound = limit if size is None else size

        def fetch() -> tuple[int, int]:
            total, check = 0, 0
            try:
                with self.fs.open_input_stream(path) as src, open(tmp, "wb") as out:
                    while True:
                        chunk = src.read(_CHUNK)
                        if not chunk:
                            break
                        total += len(chunk)
                        if total > bound:
                            break  # bounded: never write more than the manifest says
                        check = crc32c(chunk, check)
                        out.write(chunk)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            return total, check

        try:
            total, check = self.retry.run(uri, "download", fetch)
            if size is not None and total != size:
                raise StorageError("object size differs from the manifest", path=uri,
                                   found=total, expected=size)
            if total > bound:
                raise ObjectTooLargeError(f"object larger than the {bound}-byte limit for it",
                                          path=uri)
            if crc is not None and check != crc:
                raise StorageError("object checksum differs from the manifest", path=uri,
                                   found=f"{check:#010x}", expected=f"{crc:#010x}")
            try:
                os.replace(tmp, dest)
            except OSError as exc:
                raise StorageError(f"cannot store the download ({exc})", path=dest) from None
        finally:
            tmp.unlink(missing_ok=True)

    def list_files(self) -> list[StoredFile]:
        """Every file under the folder, recursively, sorted by name."""
        selector = pafs.FileSelector(self.root, recursive=True, allow_not_found=True)
        infos = self.retry.run(self.uri, "list", lambda: self.fs.get_file_info(selector))
        cut = len(self.root) + 1 if self.root else 0
        out = [StoredFile(i.path[cut:], i.size, i.mtime_ns) for i in infos
               if i.type == pafs.FileType.File]
        out.sort()
        return out

    # -- writing ---------------------------------------------------------------------

    def upload(self, src: Path, name: str) -> None:
        """Copy the local file ``src`` to ``name`` (object stores publish it whole)."""
        path, uri = self.path(name), self.uri_of(name)

        def put() -> None:
            with open(src, "rb") as f, self.fs.open_output_stream(path) as out:
                while chunk := f.read(_CHUNK):
                    out.write(chunk)

        self.retry.run(uri, "upload", put)

    def write_bytes(self, name: str, data: bytes) -> None:
        path, uri = self.path(name), self.uri_of(name)

        def put() -> None:
            with self.fs.open_output_stream(path) as out:
                out.write(data)

        self.retry.run(uri, "upload", put)

    def delete(self, name: str) -> None:
        path = self.path(name)

        def rm() -> None:
            try:
                self.fs.delete_file(path)
            except FileNotFoundError:
                pass

        self.retry.run(self.uri_of(name), "delete", rm)


class Place(NamedTuple):
    """A SRC or DST as the user wrote it, read once: where it is, and how it is shown.

    The unopened form of a :class:`Location` (:meth:`open` makes one): entry points
    (``pack``, ``pack_samples``, the CLIs) read the text once with :func:`place` and
    hand this down, instead of each layer asking again whether the text is a URI.
    """

    text: str  # a URI as written (secrets and all), or a local path without ``file://``
    remote: bool  # a ``scheme://`` URI other than ``file://``
    shown: str  # for messages, logs and manifests: secrets never shown

    def __str__(self) -> str:
        return self.text

    def __fspath__(self) -> str:
        if self.remote:
            raise TypeError(f"{self.shown} is a URI, not a local path")
        return self.text

    def open(self, filesystem: pafs.FileSystem | None = None,
             retry: Retry = DEFAULT_RETRY) -> Location:
        """The :class:`Location` this names (see :func:`open_location`)."""
        return open_location(self.text, filesystem, retry)


def place(path: str | os.PathLike | Place) -> Place:
    """Read SRC or DST once: a :class:`Place` (``path`` back if it is one)."""
    if isinstance(path, Place):
        return path
    text = os.fspath(path) if isinstance(path, os.PathLike) else str(path)
    if is_uri(text):
        return Place(text, True, display_uri(text))
    text = str(local_path(text))
    return Place(text, False, text)


def _fsspec(uri: str, parsed: ParsedURI) -> tuple[pafs.FileSystem, str]:
    shown = parsed.display()
    if parsed.user is not None or parsed.password is not None:
        # fsspec protocols read a URI's authority each their own way (memory:// and
        # gcsfs take it for part of the path): credentials there could become a key.
        raise URIError(f"credentials in a {parsed.scheme}:// URI are not supported: give "
                       "them in the filesystem's own configuration", path=shown)
    try:
        import fsspec
    except ImportError:
        raise StorageError("pyarrow does not know this URI scheme, and fsspec (which may) "
                           "is not installed: pip install fsspec", path=shown) from None
    try:
        fs, path = fsspec.core.url_to_fs(uri)
    except ImportError as exc:  # the protocol's own package (s3fs, gcsfs...), with its hint
        raise StorageError(f"cannot open this location: {parsed.scrub(str(exc))}",
                           path=shown) from None
    except (ValueError, TypeError, OSError) as exc:  # an unknown protocol or bad options
        raise URIError(f"cannot open this location ({parsed.scrub(str(exc))})",
                       path=shown) from None
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def open_location(path: str | os.PathLike | Place, filesystem: pafs.FileSystem | None = None,
                  retry: Retry = DEFAULT_RETRY) -> Location:
    """The :class:`Location` for a URI (or, with ``filesystem``, a path on it).

    Bucket, key prefix and credentials come from :func:`parse_uri`, the parse that
    :func:`display_uri` shows, so no secret reaches a key or a message.

    Raises:
        URIError: a URI that cannot name a location as written (an unknown S3 query
            key, a malformed bucket).
        StorageError: a URI that neither pyarrow nor fsspec can open.
    """
    if filesystem is None:
        where = place(path)
    else:  # a path on that filesystem as written: no file:// taken off
        text = str(path)
        where = Place(text, is_uri(text), display_uri(text))
    text, shown = where.text, where.shown
    if not where.remote:
        if filesystem is not None:
            return Location(filesystem, text, text, retry)
        return Location(pafs.LocalFileSystem(), str(Path(text).resolve()), text, retry)
    parsed = parse_uri(text)
    if filesystem is not None:
        return Location(filesystem, shown.partition("://")[2], shown, retry)
    scheme = parsed.scheme.lower()
    if scheme in ("s3", "s3a"):
        _check_s3_query(parsed)
        uri = _canonical(parsed, credentials_from_query=True)
        root = f"{parsed.authority}/{unquote(parsed.path)}".rstrip("/")
    elif scheme in _PYARROW_SCHEMES:
        uri, root = _canonical(parsed), None
    else:
        fs, root = _fsspec(_canonical(parsed), parsed)
        return Location(fs, root, shown, retry)
    try:
        fs, arrow_root = pafs.FileSystem.from_uri(uri)
    except NotImplementedError:  # this pyarrow was built without the scheme's filesystem
        fs, arrow_root = _fsspec(_canonical(parsed), parsed)
    except pa.ArrowInvalid as exc:  # a ValueError: options pyarrow does not take
        raise URIError(f"cannot open this location ({parsed.scrub(str(exc))})",
                       path=shown) from None
    except OSError as exc:
        raise StorageError(f"cannot open this location ({parsed.scrub(str(exc))})",
                           path=shown) from None
    return Location(fs, arrow_root if root is None else root, shown, retry)
