"""URIs, and the secrets in them.

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

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote

from ..errors import URIError

__all__ = ["S3_QUERY_KEYS", "ParsedURI", "display_uri", "is_uri", "local_path",
           "parse_uri"]


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


#: Schemes whose authority is a bucket name, which never holds ":" or "@".
_BUCKET_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs"})


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
