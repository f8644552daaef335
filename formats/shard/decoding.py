"""One stored payload to its field's value, with bounded decompression (FORMAT.md, §5.2).

Errors carry what is wrong but not where: the dataset, which knows the shard,
record and byte offset, re-raises them with those added.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import zstandard

from ..checksum import crc32c
from ..errors import CorruptRecordError, DecompressionError, FormatError, SchemaError
from ..fields import Field, decode_value
from ..files import read_regular, safe_child
from .manifest import Manifest

__all__ = ["MAX_DICTIONARY_BYTES", "PayloadDecoder", "load_dictionaries"]

MAX_DICTIONARY_BYTES = 16 << 20  # zstd's trainer writes dictionaries of ~100 KB


def load_dictionaries(root: Path, manifest: Manifest, follow_symlinks: bool) -> dict[str, bytes]:
    """The zstd dictionaries the manifest names, by field, checked against their CRC32C."""
    out = {}
    for field, (name, crc) in manifest.dictionaries.items():
        path = safe_child(root, name, what="dictionary file name")
        data = read_regular(path, root, limit=MAX_DICTIONARY_BYTES, what="zstd dictionary",
                            follow_symlinks=follow_symlinks)
        if crc32c(data) != crc:
            raise FormatError("zstd dictionary checksum mismatch", path=path)
        out[field] = data
    return out


class PayloadDecoder:
    """Decodes the payloads of a dataset's fields.

    Args:
        fields: the schema.
        max_raw_size: per compressed field, the bound on a decompressed payload.
        dictionaries: per field, the zstd dictionary it was compressed with.
    """

    def __init__(self, fields: tuple[Field, ...], max_raw_size: dict[str, int],
                 dictionaries: dict[str, bytes]) -> None:
        self.fields = fields
        self.max_raw_size = max_raw_size
        self.dictionaries = dictionaries
        self._decompressors: dict[int, zstandard.ZstdDecompressor] = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_decompressors": {}}

    def decode(self, j: int, view: memoryview) -> Any:
        """The value of field ``j`` from its stored bytes.

        Raises:
            DecompressionError: a compressed payload is not zstd, is damaged, or
                would exceed its bound.
            CorruptRecordError: the payload is not a value of the field's type.
        """
        f = self.fields[j]
        try:
            if f.compression == "zstd":
                view = memoryview(self._decompress(j, view))
            return decode_value(f, view)
        except DecompressionError:
            raise
        except SchemaError as exc:
            raise CorruptRecordError(exc.message, found=exc.found, expected=exc.expected) from None
        except (ValueError, RecursionError) as exc:
            # A payload that passes its CRC (or is not checked) can still be hostile:
            # JSON nested past the recursion limit, an integer past Python's digit
            # limit, bytes numpy will not view as the field's array.
            raise CorruptRecordError(
                f"field {f.name!r}: payload does not decode ({type(exc).__name__}: {exc})"
            ) from None

    def _decompress(self, j: int, view) -> bytes:
        f = self.fields[j]
        bound = self.max_raw_size.get(f.name, 0)
        try:
            size = zstandard.frame_content_size(view) if len(view) >= 4 else -2
        except zstandard.ZstdError as exc:  # not a zstd frame at all
            raise DecompressionError(f"field {f.name!r}: not a zstd frame ({exc})") from None
        if size < 0 or size > bound:
            raise DecompressionError(
                f"field {f.name!r}: zstd frame content size", found=size, expected=f"0..{bound}"
            )
        try:
            d = self._decompressors.get(j)
            if d is None:
                dd = self.dictionaries.get(f.name)
                d = zstandard.ZstdDecompressor(
                    dict_data=None if dd is None else zstandard.ZstdCompressionDict(dd)
                )
                self._decompressors[j] = d
            out = d.decompress(view, max_output_size=bound)
        except zstandard.ZstdError as exc:
            raise DecompressionError(f"field {f.name!r}: damaged zstd payload ({exc})") from None
        if len(out) != size:
            raise DecompressionError(f"field {f.name!r}: zstd payload size", found=len(out), expected=size)
        return out
