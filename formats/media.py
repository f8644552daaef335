"""The project's media facts by name: which file extensions name images, JPEGs and
audio, the extension each image kind is written under, and the pixel budget.

A name says only what a file should hold; what it holds is told by its bytes
(:mod:`formats.sniff`, the one table of magic bytes, and :mod:`formats.audio_header`),
and every payload is checked by them. Names decide what a listing expects before a
byte is read (an image folder's images, the fields of a folder of any files, a
WebDataset member's field) and what a writer calls a file.
"""

from __future__ import annotations

__all__ = ["AUDIO_EXTENSIONS", "IMAGE_EXTENSION", "IMAGE_KINDS", "IMAGE_SUFFIXES",
           "JPEG_SUFFIXES", "MAX_PIXELS", "OTHER_IMAGE_SUFFIXES", "WEBDATASET_IMAGE_EXTENSIONS"]

#: The encoded image formats the project recognizes (what
#: :func:`formats.sniff.image_kind` returns).
IMAGE_KINDS = frozenset({"jpeg", "png", "webp", "gif", "bmp", "tiff"})
#: The file extension (no dot) an image of each kind is written under.
IMAGE_EXTENSION = {"jpeg": "jpg", "png": "png", "webp": "webp", "gif": "gif", "bmp": "bmp",
                   "tiff": "tif"}
#: File name suffixes (lowercase, with the dot) of JPEG files.
JPEG_SUFFIXES = frozenset({".jpg", ".jpeg", ".jpe", ".jfif"})
#: File name suffixes of the other images a listing reads (the other kinds above).
OTHER_IMAGE_SUFFIXES = frozenset({".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"})
#: File name suffixes of every image a listing reads.
IMAGE_SUFFIXES = JPEG_SUFFIXES | OTHER_IMAGE_SUFFIXES
#: Tar member extensions (no dot) that WebDataset's tools take for an image: the kinds
#: above under their usual names, and formats they decode that we carry as they are
#: (``img``: what our sink names an image whose format it cannot tell).
WEBDATASET_IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "gif", "bmp", "tif",
                                         "tiff", "ppm", "pgm", "pbm", "pnm", "jp2", "j2k",
                                         "avif", "heic", "jxl", "img"})
#: Audio file extensions (no dot): such a file is carried as ``bytes``, for the
#: Loader's workers to decode.
AUDIO_EXTENSIONS = frozenset({"wav", "flac", "mp3", "ogg", "opus", "m4a"})
#: The pixel budget: the most pixels (width x height) an image's header may declare
#: (2^28, about 16k x 16k: 805 MB as RGB). ``pack-dataset`` refuses a larger image as
#: bad input (kind ``too-large``; ``--max-pixels`` raises it) and the Loader refuses
#: one in a dataset packed before the check, before a byte of it is allocated: a
#: header of a few bytes may declare 10^10 pixels. Pillow's own decompression-bomb
#: error is at 179M.
MAX_PIXELS = 1 << 28
