"""Our own format as a codec: a source (re-shard, recompress, export) and a sink.

The sink wraps :class:`formats.DatasetWriter`; the source iterates a dataset in
record order and carries each record's width and height along, so re-packing
keeps the metadata table.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..base import Record
from ..errors import SchemaError
from ..fields import BYTES_TYPES, SCALAR_TYPES, Field
from ..shard.dataset import open_shards
from ..shard.dataset_writer import DatasetWriter
from ..shard.layout import DEFAULT_ALIGNMENT

__all__ = ["ShardsSink", "ShardsSource", "with_compression"]


class ShardsSource:
    """The records of a shardpack dataset.

    Args:
        path: the dataset folder.
        check_crc: verify each field's checksum as it is read.
    """

    def __init__(self, path: str | Path, *, check_crc: bool = True) -> None:
        self.ds = open_shards(path, check_crc=check_crc)
        self.fields = self.ds.fields
        self.classes = self.ds.classes
        self.class_info = self.ds.manifest.class_info  # what a re-shard writes back

    def __len__(self) -> int:
        return len(self.ds)

    def __iter__(self) -> Iterator[Record]:
        meta = self.ds.metadata(["width", "height"])
        widths = meta.column("width").to_pylist()
        heights = meta.column("height").to_pylist()
        names = [e.data_file for e in self.ds.manifest.shards]
        starts = self.ds.starts.tolist()
        for s, name in enumerate(names):
            for i in range(starts[s], starts[s + 1]):
                m = {}
                if widths[i] is not None:
                    m["width"], m["height"] = widths[i], heights[i]
                yield Record(self.ds[i], m, f"{name}:{i - starts[s]}")


def with_compression(fields, compression: str | Mapping[str, str] | None) -> tuple[Field, ...]:
    """``fields`` with new compression: a mapping by field name, or one value for
    every non-image bytes-like field (images are already compressed)."""
    if compression is None:
        return tuple(fields)
    out = []
    for f in fields:
        if isinstance(compression, Mapping):
            c = compression.get(f.name, f.compression)
        elif f.type in SCALAR_TYPES or (f.type in BYTES_TYPES and f.type != "bytes"):
            c = f.compression
        else:
            c = compression
        out.append(Field(f.name, f.type, c, f.dtype, f.shape))
    unknown = set(compression) - {f.name for f in fields} if isinstance(compression, Mapping) else ()
    if unknown:
        raise SchemaError("compression given for unknown fields", found=sorted(unknown))
    return tuple(out)


class ShardsSink:
    """Writes a shardpack dataset (a :class:`DatasetWriter` taking :class:`Record`).

    Args:
        path: the dataset folder.
        fields: the schema.
        classes: class names.
        compression: see :func:`with_compression`.
        shard_size, records_per_shard, alignment, created_by, overwrite, resume,
            durable: as for :class:`DatasetWriter`.
    """

    def __init__(self, path: str | Path, fields, classes=None, *,
                 compression: str | Mapping[str, str] | None = None,
                 shard_size: int | None = 256 << 20, records_per_shard: int | None = None,
                 alignment: int = DEFAULT_ALIGNMENT, created_by: dict | None = None,
                 overwrite: bool = False, resume: bool = False, durable: bool = True) -> None:
        self.fields = with_compression(fields, compression)
        self.writer = DatasetWriter(
            path, self.fields, classes=None if classes is None else list(classes),
            shard_size=shard_size, records_per_shard=records_per_shard, alignment=alignment,
            created_by=created_by, overwrite=overwrite, resume=resume, durable=durable)

    def write(self, record: Record, progress: Any = None) -> None:
        self.writer.write(record.fields, record.meta or None, progress)

    def __enter__(self) -> ShardsSink:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.writer.__exit__(exc_type, exc, tb)
