"""Byte layouts: our shard format (FORMAT.md) and, as codecs, the formats we convert.

This is the only package that knows how bytes sit on disk.
"""

from .base import Record, Sink, Source
from .dataset import ShardDataset, open_shards, read_metadata
from .dataset_writer import DatasetWriter
from .errors import (
    CorruptRecordError,
    DecompressionError,
    FormatError,
    ManifestError,
    SchemaError,
    ShardpackError,
    StorageError,
    UnsafePathError,
    VersionError,
)
from .fields import Field
from .manifest import Manifest, ShardEntry, read_manifest
from .verify import Problem, verify_dataset

__all__ = [
    "CorruptRecordError",
    "DatasetWriter",
    "DecompressionError",
    "Field",
    "FormatError",
    "Manifest",
    "ManifestError",
    "Problem",
    "Record",
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
