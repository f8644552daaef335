"""Datasets and sources on object storage: one small API over pyarrow's filesystems.

``uris`` (one parser for every URI, and the secrets it never shows), ``retry``
(backoff before an error is final), ``location`` (a folder on any filesystem, its
checked downloads and uploads) and ``cache`` (the verified local copy of a remote
dataset's shards). ``default_cache_folder`` lives in :mod:`formats.cache_folder`, below
this subpackage and ``formats.shard`` (whose node columns live there too), and is
exported here, where the README and ``packer`` name it.
"""

from ..cache_folder import default_cache_folder
from .location import Location, Place, StoredFile, open_location, place
from .retry import Retry
from .uris import S3_QUERY_KEYS, ParsedURI, display_uri, is_uri, local_path, parse_uri

__all__ = ["S3_QUERY_KEYS", "Location", "ParsedURI", "Place", "Retry", "StoredFile",
           "default_cache_folder", "display_uri", "is_uri", "local_path", "open_location",
           "parse_uri", "place"]
