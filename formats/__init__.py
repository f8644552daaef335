"""Byte layouts: our shard format (FORMAT.md) and, as codecs, the formats we convert.

This is the only package that knows how bytes sit on disk. ``formats.shard`` holds
our format; ``formats.codecs`` the foreign ones (a source and a sink each) and the
registry that names them; the modules at this level are what both share (errors,
fields, checksums, bounded reads, image sniffing, object storage, the version).
"""

from .base import Record, Sink, Source
from .errors import (
    ArgumentError,
    ArgumentTypeError,
    CacheError,
    CorruptRecordError,
    DecompressionError,
    FormatError,
    ManifestError,
    MissingFileError,
    RecordIndexError,
    SchemaError,
    ShardpackError,
    StorageError,
    UnsafePathError,
    VersionError,
)
from .fields import Field
from .shard.dataset import ShardDataset, open_shards, read_metadata
from .shard.dataset_writer import DatasetWriter
from .shard.manifest import Manifest, ShardEntry, read_manifest
from .shard.verify import Problem, verify_dataset

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "CacheError",
    "CorruptRecordError",
    "DatasetWriter",
    "DecompressionError",
    "Field",
    "FormatError",
    "Manifest",
    "ManifestError",
    "MissingFileError",
    "Problem",
    "Record",
    "RecordIndexError",
    "SchemaError",
    "ShardDataset",
    "ShardEntry",
    "ShardpackError",
    "Sink",
    "Source",
    "StorageError",
    "UnsafePathError",
    "VersionError",
    "open_shards",
    "read_manifest",
    "read_metadata",
    "verify_dataset",
]
