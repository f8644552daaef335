"""Edit a written dataset's manifest, for tests that damage one on purpose.

Writers write version 2.0 (the shards in ``shards.arrow``). Tests that damage a
shard entry's JSON edit the same dataset as a 1.x manifest, which lists its shards
itself and which every reader still reads: :func:`edit_manifest`. Tests of the
shard table itself rewrite its columns: :func:`edit_shard_table`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from formats.checksum import crc32c, format_crc
from formats.shard.manifest import read_manifest
from formats.shard.shard_table import SHARD_TABLE_NAME


def manifest_v1(root: Path) -> dict:
    """The dataset's manifest as a 1.0 manifest's object (its shards listed in it)."""
    obj = json.loads((root / "manifest.json").read_text())
    if "shard_table" in obj:
        shards = read_manifest(root).shards
        obj.pop("shard_table")
        obj["format_version"] = "1.0"
        obj["shards"] = [e.to_json() for e in shards]
    return obj


def edit_manifest(root: Path, change) -> None:
    """Rewrite ``root``'s manifest as 1.0, after ``change(obj)`` edits its object."""
    obj = manifest_v1(root)
    change(obj)
    (root / "manifest.json").write_text(json.dumps(obj))
    (root / SHARD_TABLE_NAME).unlink(missing_ok=True)


def edit_table_ref(root: Path, **ref) -> None:
    """Change the manifest's ``shard_table`` object (name, bytes, crc32c)."""
    obj = json.loads((root / "manifest.json").read_text())
    obj["shard_table"].update(ref)
    (root / "manifest.json").write_text(json.dumps(obj))


def write_shard_table_bytes(root: Path, raw: bytes, *, fix_manifest: bool = True) -> None:
    """Write ``raw`` as ``root``'s shard table; with ``fix_manifest``, make the manifest's
    size and checksum of it agree (so only the table's content can be wrong)."""
    (root / SHARD_TABLE_NAME).write_bytes(raw)
    if fix_manifest:
        edit_table_ref(root, bytes=len(raw), crc32c=format_crc(crc32c(raw)))


def write_shard_table(root: Path, table: pa.Table, **kw) -> bytes:
    """Write ``table`` as ``root``'s shard table (see :func:`write_shard_table_bytes`)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    raw = sink.getvalue().to_pybytes()
    write_shard_table_bytes(root, raw, **kw)
    return raw


def edit_shard_table(root: Path, change, **kw) -> bytes:
    """Rewrite ``root``'s shard table as ``change(table)`` returns it (a pyarrow Table)."""
    with pa.memory_map(str(root / SHARD_TABLE_NAME)) as f:
        table = pa.ipc.open_file(f).read_all()
    return write_shard_table(root, change(table), **kw)
