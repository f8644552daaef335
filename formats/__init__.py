"""Byte layouts: our shard format (FORMAT.md) and, as codecs, the formats we convert.

This is the only package that knows how bytes sit on disk. ``formats.shard`` holds
our format; ``formats.codecs`` the foreign ones (a source and a sink each) and the
registry that names them; the modules at this level are what both share (errors,
fields, checksums, bounded reads, image sniffing, object storage, the version). Every
error ``formats`` raises on purpose is defined in :mod:`formats.errors` and imported
from this face.
"""

from .base import Record, Sink, Source
from .errors import (
    ArgumentError,
    ArgumentTypeError,
    CacheError,
    CorruptRecordError,
    DatasetNotFoundError,
    DecompressionError,
    DuplicateKeyError,
    ExampleError,
    FormatError,
    InputError,
    InputUsageError,
    KeyLookupError,
    ManifestError,
    MissingFileError,
    MissingObjectError,
    ObjectTooLargeError,
    RecordIndexError,
    SchemaError,
    ShardpackError,
    StorageError,
    UnknownFormatError,
    UnknownKeyError,
    UnsafePathError,
    URIError,
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
    "DatasetNotFoundError",
    "DatasetWriter",
    "DecompressionError",
    "DuplicateKeyError",
    "ExampleError",
    "Field",
    "FormatError",
    "InputError",
    "InputUsageError",
    "KeyLookupError",
    "Manifest",
    "ManifestError",
    "MissingFileError",
    "MissingObjectError",
    "ObjectTooLargeError",
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
    "URIError",
    "UnknownFormatError",
    "UnknownKeyError",
    "UnsafePathError",
    "VersionError",
    "open_shards",
    "read_manifest",
    "read_metadata",
    "verify_dataset",
]
