"""A remote dataset's manifest with its shard table, checked as a local one is."""

from __future__ import annotations

from pathlib import Path

from ..errors import ManifestError
from ..files import check_plain_name
from ..shard.manifest import MANIFEST_NAME, Manifest, decode_manifest, shard_table_ref
from .location import Location

__all__ = ["decode_remote_manifest"]


def decode_remote_manifest(location: Location, raw: bytes, folder: Path) -> Manifest:
    """Decode the manifest bytes ``raw`` read from ``location``, first fetching the shard
    table it names (a 2.x manifest) into the local ``folder`` unless it is there.

    The download is checked against the size and CRC32C the manifest gives, and the
    table is checked again as a local one is when the manifest is decoded.

    Raises:
        ManifestError, VersionError: as for a local dataset.
        StorageError: the table cannot be fetched (names the object).
    """
    uri = location.uri_of(MANIFEST_NAME)
    ref = shard_table_ref(raw, uri)
    if ref is None:
        return decode_manifest(raw, uri, root=folder)
    name, size, crc = ref
    check_plain_name(folder, name, what="shard table name")
    local = folder / name
    if local.exists():
        try:
            return decode_manifest(raw, uri, root=folder)
        except ManifestError:
            # The cached copy went bad after it was checked (ours: the cache folder's):
            # fetch it again, once; a bad table in storage then fails below, named.
            local.unlink(missing_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    location.download(name, local, size=size, crc=crc)
    return decode_manifest(raw, uri, root=folder)
