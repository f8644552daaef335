"""The one table of media facts by name (formats.media) agrees with itself and with
the one table of magic bytes (formats.sniff)."""

from __future__ import annotations

from formats import media
from formats.sniff import image_kind


def test_every_image_kind_has_the_extension_it_is_written_under_and_a_listing_reads():
    assert set(media.IMAGE_EXTENSION) == media.IMAGE_KINDS
    for kind, ext in media.IMAGE_EXTENSION.items():
        assert f".{ext}" in media.IMAGE_SUFFIXES, kind
        assert ext in media.WEBDATASET_IMAGE_EXTENSIONS, kind
    assert media.IMAGE_EXTENSION["jpeg"] == "jpg" and ".jpg" in media.JPEG_SUFFIXES
    assert media.JPEG_SUFFIXES.isdisjoint(media.OTHER_IMAGE_SUFFIXES)
    assert media.IMAGE_SUFFIXES == media.JPEG_SUFFIXES | media.OTHER_IMAGE_SUFFIXES
    assert all(s == s.lower() and s.startswith(".") for s in media.IMAGE_SUFFIXES)
    assert media.AUDIO_EXTENSIONS.isdisjoint(media.WEBDATASET_IMAGE_EXTENSIONS)


def test_the_magic_bytes_name_exactly_the_image_kinds():
    heads = {"jpeg": b"\xff\xd8\xff\xe0", "png": b"\x89PNG\r\n\x1a\n", "gif": b"GIF89a",
             "tiff": b"II*\x00", "webp": b"RIFF\x00\x00\x00\x00WEBPVP8 ",
             "bmp": b"BM" + bytes(12) + (40).to_bytes(4, "little")}
    assert set(heads) == media.IMAGE_KINDS
    for kind, head in heads.items():
        assert image_kind(head + bytes(32)) == kind
