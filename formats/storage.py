"""Datasets and sources on object storage: one small API over pyarrow's filesystems.

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

URIs, and the secrets in them
-----------------------------
One parser, :func:`parse_uri`, reads every URI: what is shown (:func:`display_uri`,
``Location.uri``, every message, log and manifest) and what is opened (bucket, key
prefix, credentials) come from the same parse, so a secret can never be shown, nor
be taken for part of a bucket or an object key. It follows RFC 3986 (the query
starts at the first ``?``, a fragment at the first ``#``, the userinfo ends at the
last ``@`` of the authority and is percent-decoded: ``%2F`` is ``/``, ``%40`` is
``@``) with one rule for what users actually type: AWS secret keys hold ``/`` and
``+``, and are pasted unescaped (``s3://AKID:se/cr+et@bucket/ds``), which RFC 3986
would read as host ``AKID``, port ``se`` and a path. So where the text before the
first ``/`` holds a ``:`` and no ``@``, and that cannot be a host and port (any
``:`` for bucket schemes, ``s3``/``gs``, whose bucket names never hold one; a
non-numeric port for others), and an ``@`` comes later, the userinfo runs to the
**last** ``@`` before the query: a secret may hold ``/``, ``+``, ``:`` and ``@``
unescaped; ``?`` and ``#`` in a secret, and ``@`` in an object name after such
credentials, must be percent-encoded. A URI whose bucket holds a ``:`` (forgotten
``@``) is refused, with nothing of its authority in the message.

Shown, a URI is ``scheme://bucket/key`` (or ``host:port/path``): no userinfo, no
query (``access_key``, ``secret_key``, tokens, endpoints), no fragment. An S3 URI's
query may hold only the keys in :data:`S3_QUERY_KEYS`; any other is a
:class:`URIError` naming it. What is opened is the canonical form of the parse
(credentials percent-encoded), so pyarrow cannot split it otherwise; a URI that
fsspec opens may hold no credentials (its protocols read an authority each their
own way, some as part of the path).
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, TypeVar
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.fs as pafs

from .checksum import crc32c
from .errors import MissingObjectError, ObjectTooLargeError, StorageError, UnsafePathError
from .files import temp_name

__all__ = ["S3_QUERY_KEYS", "Location", "ParsedURI", "Retry", "StoredFile", "URIError",
           "default_cache_folder", "display_uri", "is_uri", "local_path", "open_location",
           "parse_uri"]

T = TypeVar("T")
_CHUNK = 8 << 20
# Errors that no retry mends (pyarrow names S3's error codes in its messages).
_PERMANENT = ("NO_SUCH_BUCKET", "ACCESS_DENIED", "INVALID_ACCESS_KEY_ID",
              "SIGNATURE_DOES_NOT_MATCH")


def is_uri(path: object) -> bool:
    """True for ``scheme://...`` other than ``file://`` (those are plain local paths)."""
    text = str(path)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.isidentifier() and scheme.lower() != "file"


def local_path(path: str | Path) -> str | Path:
    """A local path as given, with a ``file://`` prefix taken off (``file:///data/x``
    is ``/data/x``, never a folder named ``file:`` under the current one)."""
    text = str(path)
    return text[len("file://"):] if text.lower().startswith("file://") else path


def default_cache_folder() -> Path:
    """Where shardpack keeps downloads and staged packs: ``$SHARDPACK_CACHE``, else
    ``$XDG_CACHE_HOME/shardpack``, else ``~/.cache/shardpack``."""
    env = os.environ.get("SHARDPACK_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shardpack"


class URIError(StorageError):
    """A URI that cannot name a location as written (an unknown query key, a
    malformed authority): a usage error. Its message never holds the URI's secrets."""


#: Schemes whose authority is a bucket name, which never holds ":" or "@".
_BUCKET_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs"})
#: Schemes pyarrow opens itself; any other goes to fsspec.
_PYARROW_SCHEMES = frozenset({"s3", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss"})
#: The query keys an ``s3://`` URI may hold: pyarrow's own, and credentials (which
#: are moved into the filesystem's options, never shown).
S3_QUERY_KEYS = ("region", "scheme", "endpoint_override", "allow_bucket_creation",
                 "allow_bucket_deletion", "tls_ca_file_path", "tls_verify_certificates",
                 "access_key", "secret_key")
_QUERY_CREDENTIALS = ("access_key", "secret_key")
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}\Z")


@dataclass(frozen=True)
class ParsedURI:
    """A URI split by :func:`parse_uri` (see the module docstring for the rules).

    Attributes:
        scheme: as written (``s3``).
        authority: the bucket, or ``host[:port]``, as written; userinfo excluded.
        path: what follows the authority's ``/``, as written (percent escapes kept).
        user, password: the decoded userinfo (None when absent).
        query: the ``(key, raw value)`` pairs, in order; the value is None for an
            item without ``=`` (which may itself be a secret).
        fragment: what follows ``#`` (None when absent).
    """

    scheme: str
    authority: str
    path: str
    user: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    query: tuple[tuple[str, str | None], ...] = field(default=(), repr=False)
    fragment: str | None = None

    @property
    def is_bucket(self) -> bool:
        return self.scheme.lower() in _BUCKET_SCHEMES

    def display(self) -> str:
        """``scheme://authority/path``: nothing secret, nothing from the query."""
        return f"{self.scheme}://{self.authority}" + (f"/{self.path}" if self.path else "")

    def secrets(self) -> tuple[str, ...]:
        """Every credential the URI holds (userinfo, and credential query values)."""
        found = [s for s in (self.user, self.password) if s]
        found += [unquote(v) for k, v in self.query if v and _is_secret_key(k)]
        found += [k for k, v in self.query if v is None and k]
        return tuple(found)

    def scrub(self, text: str) -> str:
        """``text`` with each of :meth:`secrets`, raw or percent-encoded, replaced by ``***``."""
        # Shorter ones would garble every message and are no secret worth the name.
        for secret in sorted((s for s in self.secrets() if len(s) >= 3), key=len, reverse=True):
            for form in {secret, quote(secret, safe=""), quote(secret)}:
                text = text.replace(form, "***")
        return text


def _is_secret_key(key: str) -> bool:
    k = key.lower()
    return any(w in k for w in ("secret", "token", "password", "key", "credential", "signature"))


def _redacted(scheme: str) -> str:
    return f"{scheme}://***"


def parse_uri(text: str) -> ParsedURI:
    """Split a ``scheme://...`` URI (see the module docstring for the rules).

    Raises:
        URIError: not a URI, or its authority cannot be a bucket (a bucket scheme
            with an empty name or a ``:`` in it); the message holds no credentials.
    """
    scheme, sep, rest = str(text).partition("://")
    if not sep or not scheme:
        raise URIError("not a URI (scheme://...)")
    # RFC 3986: the fragment starts at the first "#", then the query at the first "?".
    rest, hashed, fragment = rest.partition("#")
    rest, _, query = rest.partition("?")
    head = rest.split("/", 1)[0]
    userinfo = None
    if "@" in head:
        userinfo, _, host = head.rpartition("@")
        rest = host + rest[len(head):]
    elif ":" in head and "@" in rest:
        port = head.partition(":")[2]
        if scheme.lower() in _BUCKET_SCHEMES or not port.isdigit():
            # An unescaped "/" in the secret: the userinfo runs to the last "@".
            userinfo, _, rest = rest.rpartition("@")
    authority, _, path = rest.partition("/")
    user = password = None
    if userinfo is not None:
        raw_user, colon, raw_password = userinfo.partition(":")
        user, password = unquote(raw_user), unquote(raw_password) if colon else None
    pairs = tuple((unquote(k), v if eq else None)
                  for k, eq, v in (p.partition("=") for p in query.split("&") if p))
    parsed = ParsedURI(scheme, authority, path, user, password, pairs,
                       fragment if hashed else None)
    if scheme.lower() in _BUCKET_SCHEMES and (not authority or any(c in authority for c in ":@%")):
        # Said without the authority itself: it may be "key:secret" without its "@".
        raise URIError(f"this {scheme}:// URI needs a bucket name (no ':', '@' or '%' in it) "
                       "after 'key:secret@', if any", path=_redacted(scheme))
    return parsed


def display_uri(path: object) -> str:
    """A URI fit for messages, logs and manifests: ``scheme://bucket/key``, no
    userinfo, no query, no fragment (see the module docstring). Local paths come
    back unchanged; a URI that does not parse comes back as ``scheme://***``."""
    text = str(path)
    if not is_uri(text):
        return text
    try:
        parsed = parse_uri(text)
    except URIError:
        return _redacted(text.partition("://")[0])
    if not parsed.is_bucket and not parsed.authority.partition(":")[2].isdigit() and (
            ":" in parsed.authority):
        # Not host:port: perhaps "user:secret" that lost its "@"; never shown.
        return _redacted(parsed.scheme)
    return parsed.display()


@dataclass(frozen=True)
class Retry:
    """How hard to try before a storage error is final.

    Args:
        attempts: tries in all (the first one included).
        backoff: seconds before the second try; doubled each time, with jitter.
        max_backoff: the longest single wait.
    """

    attempts: int = 5
    backoff: float = 0.2
    max_backoff: float = 10.0

    def run(self, uri: str, what: str, fn: Callable[[], T]) -> T:
        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except FileNotFoundError:
                raise MissingObjectError(f"{what}: no such object", path=uri) from None
            except OSError as exc:
                if isinstance(exc, PermissionError) or any(c in str(exc) for c in _PERMANENT):
                    raise StorageError(f"{what} failed ({exc})", path=uri) from exc
                if attempt == self.attempts:
                    raise StorageError(f"{what} failed after {attempt} tries ({exc})",
                                       path=uri) from exc
            time.sleep(min(delay, self.max_backoff) * (0.5 + random.random()))
            delay *= 2
        raise AssertionError("unreachable")


def _check_name(uri: str, name: str) -> str:
    if (not isinstance(name, str) or not name or name.startswith("/") or "\\" in name
            or "\x00" in name or any(p in ("", ".", "..") for p in name.split("/"))):
        raise UnsafePathError("unsafe object name: must be a relative name inside the dataset",
                              path=uri, found=name)
    return name


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

    def __init__(self, fs: pafs.FileSystem, root: str, uri: str, retry: Retry = Retry()) -> None:
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


def _canonical(parsed: ParsedURI, credentials_from_query: bool = False) -> str:
    """The URI handed to pyarrow or fsspec: the same authority, path and options, the
    credentials percent-encoded, so no parser can split the URI otherwise than
    :func:`parse_uri` did (an unescaped "/" in a secret would start its path).

    Args:
        credentials_from_query: move ``access_key``/``secret_key`` from the query into
            the userinfo (an ``s3://`` URI: pyarrow takes them only there).
    """
    user, password, items = parsed.user, parsed.password, parsed.query
    if credentials_from_query:
        query = {k: unquote(v or "") for k, v in items}
        user = query.get("access_key", user)
        password = query.get("secret_key", password)
        items = tuple((k, v) for k, v in items if k not in _QUERY_CREDENTIALS)
    userinfo = ""
    if user is not None or password is not None:
        userinfo = quote(user or "", safe="") + (
            "" if password is None else ":" + quote(password, safe="")) + "@"
    rest = "&".join(quote(k, safe="") + ("" if v is None else f"={v}") for k, v in items)
    return (f"{parsed.scheme}://{userinfo}{parsed.authority}/{parsed.path}"
            + (f"?{rest}" if rest else "")
            + ("" if parsed.fragment is None else f"#{parsed.fragment}"))


def _check_s3_query(parsed: ParsedURI) -> None:
    keys = [k for k, _ in parsed.query]
    for key, value in parsed.query:
        if key not in S3_QUERY_KEYS:
            # A key is named only when it looks like one: "?secret" alone may be a secret.
            named = repr(key) if value is not None and _PLAIN_KEY.match(key) \
                else "(not shown: not a plain key=value item)"
            hint = (" (a session token goes in AWS_SESSION_TOKEN)"
                    if "token" in key.lower() else "")
            raise URIError(f"unknown query key {named} in an s3:// URI{hint}; the keys "
                           f"understood are {', '.join(S3_QUERY_KEYS)}", path=parsed.display())
        if keys.count(key) > 1:
            raise URIError(f"query key {key!r} given twice", path=parsed.display())
    if parsed.fragment is not None:
        raise URIError("an s3:// URI has no fragment: write '#' in a name as %23",
                       path=parsed.display())


def open_location(path: str | Path, filesystem: pafs.FileSystem | None = None,
                  retry: Retry = Retry()) -> Location:
    """The :class:`Location` for a URI (or, with ``filesystem``, a path on it).

    Bucket, key prefix and credentials come from :func:`parse_uri`, the parse that
    :func:`display_uri` shows, so no secret reaches a key or a message.

    Raises:
        URIError: a URI that cannot name a location as written (an unknown S3 query
            key, a malformed bucket).
        StorageError: a URI that neither pyarrow nor fsspec can open.
    """
    text = str(path)
    if not is_uri(text):
        if filesystem is None:
            text = str(local_path(text))
        if filesystem is not None:
            return Location(filesystem, text, text, retry)
        return Location(pafs.LocalFileSystem(), str(Path(text).resolve()), text, retry)
    parsed = parse_uri(text)
    shown = display_uri(text)
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
