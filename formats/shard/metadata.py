"""The per-record metadata tables (``NAME.meta.parquet``), read in bounded memory.

A metadata table is small next to its shard, but Parquet can describe a huge
table in a few bytes (run-length and dictionary encodings), and a damaged
footer can ask the decoder for anything. So, per shard and before any column is
decoded: the file must be a regular file of the manifest's ``meta_bytes``
(at most :data:`MAX_META_FILE_BYTES`) with its ``meta_crc32c``; its footer must
give the shard's record count and the table's schema, and column sizes within
:data:`KEY_BYTES_PER_RECORD` (``key``) or :data:`FIXED_BYTES_PER_RECORD` (the
others) per record. The one variable-width column, ``key``, is decoded through
its dictionary and measured before it is expanded. A record count itself is
backed by the shard's index file (20 bytes per field per record on disk), whose
size is checked too where it is present, so what a table decodes to is
proportional to what the dataset holds. (A remote dataset's cache holds the
tables of shards it has not fetched: their counts stand on the manifest alone.)

Lookups by key use :mod:`formats.shard.key_index`, built from these tables.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..checksum import crc32c
from ..errors import FormatError, SchemaError
from ..files import open_regular, read_regular
from .manifest import Manifest, ShardEntry, read_manifest
from .shard_writer import META_SCHEMA

__all__ = ["FIXED_BYTES_PER_RECORD", "KEY_BYTES_PER_RECORD", "MAX_META_FILE_BYTES",
           "read_metadata"]

# A million-record shard's table with 100-byte keys is some 60 MB.
MAX_META_FILE_BYTES = 256 << 20
# Keys are source paths or names: PATH_MAX on average is generous.
KEY_BYTES_PER_RECORD = 4096
# label and size (8 bytes each), width and height (4), with validity and page headers.
FIXED_BYTES_PER_RECORD = 64
# Room for dictionaries, page headers and statistics of a tiny table.
_SLACK = 1 << 20
# Thrift bounds for the footer: our tables have 5 columns and a few row groups.
_THRIFT_STRINGS = 16 << 20
_THRIFT_CONTAINERS = 1 << 16


def read_metadata(path: str | Path, columns: list[str] | None = None,
                  manifest: Manifest | None = None, *, follow_symlinks: bool = False,
                  shards: Sequence[int] | None = None) -> pa.Table:
    """The per-record metadata table (label, key, size, width, height), in record order.

    Reads the manifest and the small ``.meta.parquet`` files only, never the data
    files: for filtering, statistics and size-aware batching.

    Args:
        columns: the columns to read (default: all).
        manifest: the dataset's manifest, if already read.
        follow_symlinks: read files that are symlinks out of the folder (FORMAT.md, §8).
        shards: read only these shards' tables, in this order (default: every shard).

    Raises:
        FormatError: a table that is missing, damaged, disagrees with the
            manifest, or would decode beyond the bounds above (names the file).
        SchemaError: ``columns`` names a column the table does not have.
    """
    root = Path(path)
    manifest = manifest or read_manifest(root, follow_symlinks=follow_symlinks)
    for c in columns or ():
        if c not in META_SCHEMA.names:
            raise SchemaError(f"no metadata column {c!r}", expected=META_SCHEMA.names)
    tables = []
    for e in manifest.shards if shards is None else (manifest.shards[s] for s in shards):
        _check_index_size(root, e, follow_symlinks)
        tables.append(_read_table(root, e, columns, follow_symlinks))
    if not tables:
        schema = META_SCHEMA if columns is None else pa.schema([META_SCHEMA.field(c) for c in columns])
        return schema.empty_table()
    return pa.concat_tables(tables)


def _check_index_size(root: Path, e: ShardEntry, follow_symlinks: bool) -> None:
    p = root / e.index_file
    if not os.path.lexists(p):
        return  # a remote dataset's cache: the shard itself was not fetched
    try:
        fd, st = open_regular(p, root, what="index file", follow_symlinks=follow_symlinks)
    except OSError as exc:  # EMFILE: this reader holds nothing open to give back
        raise FormatError(f"cannot open index file ({exc.strerror})", path=p) from None
    try:
        if st.st_size != e.index_bytes:
            raise FormatError("index file size disagrees with the manifest", path=p,
                              found=f"{st.st_size} bytes", expected=f"{e.index_bytes} bytes")
    finally:
        os.close(fd)


def _read_table(root: Path, e: ShardEntry, columns: list[str] | None,
                follow_symlinks: bool) -> pa.Table:
    p = root / e.meta_file
    raw = read_regular(p, root, limit=MAX_META_FILE_BYTES, what="metadata table",
                       size=e.meta_bytes, follow_symlinks=follow_symlinks)
    found = crc32c(raw)
    if found != e.meta_crc32c:
        raise FormatError("metadata table checksum mismatch", path=p,
                          found=f"{found:08x}", expected=f"{e.meta_crc32c:08x}")
    try:
        footer = pq.ParquetFile(pa.BufferReader(raw), thrift_string_size_limit=_THRIFT_STRINGS,
                                thrift_container_size_limit=_THRIFT_CONTAINERS)
        _check_footer(p, footer, e.records)
        # Read again from the footer already parsed, the key column kept as dictionary.
        pf = pq.ParquetFile(pa.BufferReader(raw), metadata=footer.metadata,
                            read_dictionary=["key"])
        table = pf.read(columns=columns, use_threads=False)
    except (OSError, pa.ArrowException) as exc:
        raise FormatError(f"cannot read the metadata table ({exc})", path=p) from None
    if table.num_rows != e.records:
        raise FormatError("metadata table row count disagrees with the manifest", path=p,
                          found=table.num_rows, expected=e.records)
    if "key" in table.column_names:
        table = _expand_keys(p, table, e.records)
    return table


def _check_footer(p: Path, pf: pq.ParquetFile, records: int) -> None:
    """Row count, schema and column sizes, from the footer alone (nothing decoded yet)."""
    md = pf.metadata
    if md.num_rows != records:
        raise FormatError("metadata table row count disagrees with the manifest", path=p,
                          found=md.num_rows, expected=records)
    schema = pf.schema_arrow
    # A table written with a dictionary-typed key (its Arrow schema stored) reads the same.
    types = [pa.string() if pa.types.is_dictionary(t) and t.value_type == pa.string() else t
             for t in schema.types]
    if schema.names != META_SCHEMA.names or types != META_SCHEMA.types:
        raise FormatError("metadata table schema", path=p,
                          found=", ".join(f"{n}: {t}" for n, t in
                                          zip(schema.names[:8], types[:8], strict=True)),
                          expected=", ".join(f"{f.name}: {f.type}" for f in META_SCHEMA))
    sizes = [0] * md.num_columns
    for g in range(md.num_row_groups):
        group = md.row_group(g)
        for c in range(md.num_columns):
            sizes[c] += group.column(c).total_uncompressed_size
    for name, size in zip(schema.names, sizes, strict=True):
        per = KEY_BYTES_PER_RECORD if name == "key" else FIXED_BYTES_PER_RECORD
        if size > records * per + _SLACK:
            raise FormatError(f"metadata column {name!r} is larger than its record count allows",
                              path=p, found=f"{size} bytes",
                              expected=f"at most {records * per + _SLACK} bytes")


def _expand_keys(p: Path, table: pa.Table, records: int) -> pa.Table:
    """The ``key`` column as plain strings, once its expanded size is known to be bounded
    (a dictionary of one long string repeated for every record is a few bytes on disk)."""
    i = table.column_names.index("key")
    column = table.column(i)
    size = 0
    for chunk in column.chunks:
        lengths = pc.take(pc.binary_length(chunk.dictionary), chunk.indices)
        size += pc.sum(lengths).as_py() or 0
    bound = records * KEY_BYTES_PER_RECORD + _SLACK
    if size > bound:
        raise FormatError("metadata column 'key' would expand beyond its bound", path=p,
                          found=f"{size} bytes", expected=f"at most {bound} bytes")
    return table.set_column(i, META_SCHEMA.field("key"), column.cast(pa.string()))
