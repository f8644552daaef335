"""What an encoded audio payload's header says (format, rate, channels, duration),
without decoding a sample.

Recognized by signature, never by a file name:

====  ==========================================================================
wav   ``RIFF`` size ``WAVE``, then chunks (4-byte id, u32 little-endian size,
      body padded to even): ``fmt `` (u16 format tag, u16 channels, u32 sample
      rate, u32 byte rate, u16 block align, u16 bits per sample), ``data``;
      duration = data size / byte rate
flac  ``fLaC``, then the STREAMINFO block (type 0, 34 bytes): 20-bit sample rate,
      3-bit channels - 1, 5-bit bits per sample - 1, 36-bit total samples (all
      big-endian); duration = total samples / sample rate (0 total: unknown)
mp3   an optional ID3v2 tag (``ID3``, then a 28-bit syncsafe size), then an MPEG
      layer III frame header (11 sync bits); bitrate and sample rate from its
      tables; duration only from a Xing/Info frame count
====  ==========================================================================

Every read is a few bytes at a bounded position: a header walk visits at most
:data:`_MAX_CHUNKS` chunks, whatever sizes they claim. A header that is cut short
or inconsistent is reported (``error``), never raised: the payload came from a
file that may hold anything.
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = ["audio_info"]

_MAX_CHUNKS = 64  # RIFF chunks walked before giving up on finding fmt/data
_MPEG_BITRATES = {  # kbit/s by bitrate index 1..14, layer III
    1: (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),        # MPEG-1
    2: (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),             # MPEG-2, 2.5
}
_MPEG_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


class _Unreadable(Exception):
    """The header is cut short or says something impossible (the message says what)."""


def audio_info(data) -> dict[str, Any] | None:
    """What the header of an encoded audio payload says, or None if ``data`` does
    not start with a WAV, FLAC or MP3 signature.

    Returns:
        ``kind`` (wav, flac, mp3) and what its header gives of ``sample_rate``,
        ``channels``, ``bits``, ``bitrate_kbps`` and ``duration_s`` (absent when the
        header does not say), or ``kind`` and ``error`` ("unreadable header: ...").
        A WAV shorter than its data chunk says also has ``present_s``, the
        duration of the bytes there.
    """
    head = bytes(data[:12])
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        kind, parse = "wav", _wav
    elif head[:4] == b"fLaC":
        kind, parse = "flac", _flac
    elif head[:3] == b"ID3" or _mpeg_frame(head) is not None:
        kind, parse = "mp3", _mp3
    else:
        return None
    try:
        return {"kind": kind, **parse(data)}
    except (_Unreadable, struct.error, IndexError, ValueError) as exc:
        return {"kind": kind, "error": f"unreadable header: {exc}"}


def _read(data, at: int, n: int) -> bytes:
    if at < 0 or at + n > len(data):
        raise _Unreadable(f"cut short at byte {len(data)} (needed {n} bytes at {at})")
    return bytes(data[at:at + n])


def _wav(data) -> dict[str, Any]:
    fmt = None
    at = 12
    for _ in range(_MAX_CHUNKS):
        cid, size = struct.unpack("<4sI", _read(data, at, 8))
        if cid == b"fmt ":
            if size < 16:
                raise _Unreadable(f"fmt chunk of {size} bytes (at least 16)")
            tag, channels, rate, byte_rate, _, bits = struct.unpack("<HHIIHH", _read(data, at + 8, 16))
            if not channels or not rate or not byte_rate:
                raise _Unreadable(f"fmt says {channels} channels, {rate} Hz, {byte_rate} bytes/s")
            fmt = {"format_tag": tag, "sample_rate": rate, "channels": channels, "bits": bits}
        elif cid == b"data":
            if fmt is None:
                raise _Unreadable("data chunk before the fmt chunk")
            out = dict(fmt)
            present = len(data) - (at + 8)
            if size == 0xFFFFFFFF:  # a streaming writer's "unknown": no duration claimed
                return out
            out["duration_s"] = size / byte_rate
            if present < size:
                out["present_s"] = max(present, 0) / byte_rate
            return out
        at += 8 + size + (size & 1)
    raise _Unreadable(f"no data chunk in the first {_MAX_CHUNKS} chunks")


def _flac(data) -> dict[str, Any]:
    block = _read(data, 4, 4)
    if block[0] & 0x7F != 0 or int.from_bytes(block[1:4], "big") < 34:
        raise _Unreadable("first metadata block is not a 34-byte STREAMINFO")
    info = int.from_bytes(_read(data, 18, 8), "big")  # bytes 10..17 of STREAMINFO
    rate = info >> 44
    channels = ((info >> 41) & 0x7) + 1
    bits = ((info >> 36) & 0x1F) + 1
    total = info & 0xFFFFFFFFF
    if rate == 0:
        raise _Unreadable("STREAMINFO says 0 Hz")
    out: dict[str, Any] = {"sample_rate": rate, "channels": channels, "bits": bits}
    if total:
        out["duration_s"] = total / rate
    return out


def _mpeg_frame(head: bytes) -> tuple[int, int, int, int, bool] | None:
    """(version bits, kbit/s, Hz, samples per frame, mono) of a layer III frame
    header in ``head[:4]``, or None if these 4 bytes are not one."""
    if len(head) < 4 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return None
    version, layer = (head[1] >> 3) & 3, (head[1] >> 1) & 3
    rate_index, bitrate_index = (head[2] >> 2) & 3, head[2] >> 4
    if version == 1 or layer != 1 or rate_index == 3 or bitrate_index in (0, 15):
        return None  # reserved version, not layer III, reserved rate, free or bad bitrate
    kbps = _MPEG_BITRATES[1 if version == 3 else 2][bitrate_index - 1]
    samples = 1152 if version == 3 else 576
    return version, kbps, _MPEG_RATES[version][rate_index], samples, head[3] >> 6 == 3


def _mp3(data) -> dict[str, Any]:
    at = 0
    if bytes(data[:3]) == b"ID3":
        tag = _read(data, 0, 10)
        if any(b & 0x80 for b in tag[6:10]):
            raise _Unreadable("ID3 tag size is not syncsafe")
        size = (tag[6] << 21) | (tag[7] << 14) | (tag[8] << 7) | tag[9]
        at = 10 + size + (10 if tag[5] & 0x10 else 0)  # a footer repeats the header
    frame = _mpeg_frame(_read(data, at, 4))
    if frame is None:
        raise _Unreadable(f"no MPEG layer III frame header at byte {at}")
    version, kbps, rate, samples, mono = frame
    out: dict[str, Any] = {"sample_rate": rate, "channels": 1 if mono else 2, "bitrate_kbps": kbps}
    # A Xing/Info frame (VBR files, and LAME's CBR ones) sits after the side info
    # and may carry the frame count: the one duration an MP3 header states.
    side = (17 if mono else 32) if version == 3 else (9 if mono else 17)
    xing = at + 4 + side
    if len(data) >= xing + 12 and bytes(data[xing:xing + 4]) in (b"Xing", b"Info"):
        flags, frames = struct.unpack(">II", bytes(data[xing + 4:xing + 12]))
        if flags & 1 and frames:
            out["duration_s"] = frames * samples / rate
    return out
