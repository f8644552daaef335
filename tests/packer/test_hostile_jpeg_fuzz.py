"""A JPEG header fuzzer through ``pack-dataset --on-error skip`` (issue 35, hostile suite).

2,400 files, seeded (the seed is in every failure message; set
``SHARDPACK_JPEG_FUZZ_SEED`` to try others), packed 300 at a time, each pack run in a
bounded child (``tests/hostile.py``): no signal death, no raw traceback, no run over
10 s, under 512 MB, records in = written + skipped. Two families of files:

* ``v*.jpg``, valid by construction (``tests/helpers_jpeg.py``: random precision,
  frame kind, component count, sampling factors, Adobe transform, size): admission
  must be exact both ways: every one written decodes with the Loader's decoder, and
  every one refused as ``unsupported-jpeg`` does not.
* ``m*.jpg``, mutated: random markers and segments inserted, lengths, SOF fields
  (precision, size, component count, sampling bytes, marker) and bytes overwritten,
  truncations, garbage. Each one written is decoded too (whole, and cropped through
  the DCT-scaled path): a picture or a typed ``DecodeError``, never anything else.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from hostile import run_case

from tests.helpers_jpeg import jpeg_file

MODULE = "test_hostile_jpeg_fuzz"
SEED = int(os.environ.get("SHARDPACK_JPEG_FUZZ_SEED", "35"))
FILES = 2400
BATCH = 300
SECONDS = 10.0
PEAK_MB = 512
# Records written are decoded when their header declares no more than this (a
# mutated size of 16383 x 16383 is within the pixel budget, and 768 MB to decode).
DECODED_PIXELS = 1 << 22

_SOF_MARKERS = [0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF]


def _factor(rng) -> tuple[int, int]:
    return int(rng.choice([1, 1, 1, 2, 2, 3, 4])), int(rng.choice([1, 1, 1, 2, 2, 3, 4]))


def valid_file(rng) -> bytes:
    """A file whose scan agrees with its frame header (whatever kind it is)."""
    kind = rng.choice(["baseline", "baseline", "progressive", "lossless"])
    lossless = kind == "lossless"
    precision = int(rng.choice([8, 8, 8, 8, 12, 16] + ([2, 5, 7] if lossless else [])))
    if precision == 16 and not lossless:
        precision = 12  # a DCT frame holds 8 or 12 bits
    n = int(rng.choice([1, 1, 2, 3, 3, 3, 3, 4, 4]))
    sampling = [_factor(rng) for _ in range(n)]
    if n >= 3 and rng.random() < 0.6:  # the common shapes, luma over 1x1 chroma
        sampling = [_factor(rng)] + [(1, 1)] * (n - 1)
    if n > 1 and sum(h * v for h, v in sampling) > 10:
        sampling = [(1, 1)] * n
    # Adobe's transform: 0 none, 1 YCbCr (three components), 2 YCCK (four); any
    # other pairing is a file libjpeg refuses ("Unknown Adobe color transform code").
    adobe = None if rng.random() < 0.6 else int(rng.choice([0, 1 if n == 3 else 2 if n == 4 else 0]))
    return jpeg_file(rng, int(rng.integers(1, 49)), int(rng.integers(1, 49)),
                     precision=precision, sampling=tuple(sampling), lossless=lossless,
                     progressive=kind == "progressive", adobe=adobe)


_COMMON = [((1, 1),), ((1, 1),) * 3, ((2, 1), (1, 1), (1, 1)), ((2, 2), (1, 1), (1, 1)),
           ((1, 2), (1, 1), (1, 1)), ((4, 1), (1, 1), (1, 1)), ((2, 2), (1, 1), (1, 1), (2, 2))]


def common_file(rng) -> bytes:
    """An 8-bit DCT file of a sampling every decoder reads (what mutations start from
    most often, so that many mutated files are still admitted)."""
    sampling = _COMMON[int(rng.integers(0, len(_COMMON)))]
    return jpeg_file(rng, int(rng.integers(1, 49)), int(rng.integers(1, 49)),
                     sampling=sampling, progressive=bool(rng.random() < 0.3),
                     adobe=2 if len(sampling) == 4 else None)


def _sof(data: bytearray) -> int:
    for marker in _SOF_MARKERS:
        at = data.find(bytes([0xFF, marker]), 2)
        if at >= 0:
            return at
    return -1


def mutated_file(rng) -> bytes:
    """A valid file with one to three random changes (or plain garbage after SOI)."""
    data = bytearray(common_file(rng) if rng.random() < 0.7 else valid_file(rng))
    if rng.random() < 0.1:  # an Adobe transform that does not fit the components
        data[2:2] = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00" + \
            bytes([int(rng.integers(0, 4))])
    if rng.random() < 0.03:
        return b"\xff\xd8\xff" + rng.integers(0, 256, int(rng.integers(0, 400)), "u1").tobytes()
    for _ in range(int(rng.integers(1, 4))):
        op = int(rng.integers(0, 11))
        at = _sof(data)
        if op == 0:  # truncate
            data = data[: int(rng.integers(0, len(data) + 1))]
        elif op == 1:  # overwrite bytes in the headers
            for _ in range(int(rng.integers(1, 6))):
                i = int(rng.integers(0, min(len(data), 300) or 1))
                if i < len(data):
                    data[i] = int(rng.integers(0, 256))
        elif op == 2 and 0 <= at <= len(data) - 10:  # the frame header's fields
            field = int(rng.integers(0, 5))
            if field == 0:
                data[at + 4] = int(rng.choice([0, 1, 7, 8, 9, 12, 16, 255]))  # precision
            elif field == 1:  # height and width
                data[at + 5 : at + 9] = rng.choice([0, 1, 255, 16383, 65535, 60000],
                                                   2).astype(">u2").tobytes()
            elif field == 2:
                data[at + 9] = int(rng.choice([0, 1, 2, 3, 4, 5, 10, 255]))  # components
            elif field == 3:  # sampling bytes
                for k in range(at + 11, min(at + 11 + 3 * 4, len(data)), 3):
                    data[k] = int(rng.integers(0, 256))
            else:
                data[at + 1] = int(rng.choice(_SOF_MARKERS))
        elif op == 3:  # a random segment after SOI
            marker = int(rng.integers(0xC0, 0x100))
            length = int(rng.choice([0, 1, 2, 3, 16, 65535, int(rng.integers(0, 70))]))
            body = rng.integers(0, 256, int(rng.integers(0, 64)), "u1").tobytes()
            data[2:2] = bytes([0xFF, marker]) + length.to_bytes(2, "big") + body
        elif op == 4 and 0 <= at <= len(data) - 4:  # the frame header's length field
            data[at + 2 : at + 4] = int(rng.integers(0, 65536)).to_bytes(2, "big")
        elif op == 5 and 0 <= at <= len(data) - 4:  # a second frame header
            length = (data[at + 2] << 8) | data[at + 3]
            data[at:at] = data[at : at + 2 + length]
        elif op == 6:  # fill bytes, stray markers
            i = int(rng.integers(2, max(3, len(data))))
            data[i:i] = bytes([0xFF] * int(rng.integers(1, 5)) +
                              [int(rng.choice([0xD8, 0xD9, 0xDA, 0x00, 0xFF, 0xC4]))])
        elif op == 7:  # no end marker, or garbage after it
            data = data[:-2] if rng.random() < 0.5 else data + rng.integers(
                0, 256, int(rng.integers(1, 50)), "u1").tobytes()
        elif op == 9:  # a well-formed APPn or COM segment of random bytes
            body = rng.integers(0, 256, int(rng.integers(0, 300)), "u1").tobytes()
            marker = int(rng.choice([0xE0, 0xE1, 0xE2, 0xED, 0xEE, 0xEF, 0xFE]))
            data[2:2] = bytes([0xFF, marker]) + (len(body) + 2).to_bytes(2, "big") + body
        elif op == 10:  # bytes of the entropy-coded data
            scan = data.find(b"\xff\xda")
            if scan >= 0 and scan + 20 < len(data) - 2:
                for _ in range(int(rng.integers(1, 4))):
                    data[int(rng.integers(scan + 14, len(data) - 2))] = int(rng.integers(0, 256))
        elif op == 8:  # lengths of other segments
            i = data.find(b"\xff\xc4") if rng.random() < 0.5 else data.find(b"\xff\xda")
            if i >= 0 and i + 4 <= len(data):
                data[i + 2 : i + 4] = int(rng.integers(0, 65536)).to_bytes(2, "big")
    return bytes(data)


def make_batch(folder: Path, seed: int, start: int, n: int) -> None:
    rng = np.random.default_rng([SEED, seed])
    folder.mkdir(parents=True)
    for k in range(start, start + n):
        valid = rng.random() < 0.4
        data = valid_file(rng) if valid else mutated_file(rng)
        (folder / f"{'v' if valid else 'm'}{k:05d}.jpg").write_bytes(data)


# -- the case, run in a bounded child ---------------------------------------------------

def pack_and_decode(src: str, dst: str, report: str) -> None:
    """``pack-dataset SRC DST --on-error skip`` as a user runs it, then every record
    written decoded as the Loader decodes it; what was found goes to ``report``."""
    import contextlib
    import io

    import simplejpeg

    from formats import open_shards
    from formats.sniff import jpeg_frame
    from packer.cli import main
    from reader.errors import DecodeError
    from reader.transforms import ImagePipeline, RandomResizedCrop
    from reader.transforms.decode import decode_full

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([src, dst, "--from", "files", "--on-error", "skip", "--workers", "0",
                   "--json"])
    if rc != 0:
        raise AssertionError(f"exit status {rc}: {err.getvalue()[-2000:]}")
    summary = json.loads(out.getvalue())
    files = sorted(os.listdir(src))
    found: dict = {"in": summary["records_in"], "written": summary["records_written"],
                   "skipped": summary["skipped_by_kind"], "files": len(files), "problems": [],
                   "mutated_decoded": 0, "mutated_refused": 0, "valid_written": 0,
                   "valid_unsupported": 0, "large": 0}
    skipped = {}
    skip_list = Path(dst) / "skipped.jsonl"
    if skip_list.exists():
        for line in skip_list.read_text().splitlines():
            entry = json.loads(line)
            skipped[entry["path"]] = entry["kind"]
    for name, kind in skipped.items():
        if name.startswith("v"):
            data = (Path(src) / name).read_bytes()
            try:
                simplejpeg.decode_jpeg_header(data)
                simplejpeg.decode_jpeg(data, colorspace="RGB")
                decodes = True
            except (ValueError, KeyError):
                decodes = False
            if kind != "unsupported-jpeg" or decodes:
                found["problems"].append(f"{name}: refused as {kind}, decodes: {decodes}")
            found["valid_unsupported"] += 1
    if not summary["records_written"]:
        Path(report).write_text(json.dumps(found))
        return
    crop = ImagePipeline([RandomResizedCrop(8, scale=(0.05, 1.0))], roi=False)
    ds = open_shards(dst)
    rng = np.random.default_rng(0)
    for i in range(len(ds)):
        name, data = ds[i]["key"], bytes(ds[i]["image"])
        if jpeg_frame(data).width * jpeg_frame(data).height > DECODED_PIXELS:
            found["large"] += 1  # admitted by its header; decoding it needs more memory
            continue                # than the case's bound (valid files are small)
        try:
            decode_full(data)
            crop(data, rng=rng)
        except DecodeError as exc:
            if name.startswith("v"):
                found["problems"].append(f"{name}: written, does not decode: {exc}")
            found["mutated_refused"] += 1
            continue
        if name.startswith("v"):
            found["valid_written"] += 1
        else:
            found["mutated_decoded"] += 1
    Path(report).write_text(json.dumps(found))


def test_random_jpeg_headers_pack_without_a_crash_and_admission_is_exact(tmp_path):
    totals = {"files": 0, "valid_written": 0, "valid_unsupported": 0, "mutated_decoded": 0,
              "mutated_refused": 0}
    kinds: dict = {}
    for b, start in enumerate(range(0, FILES, BATCH)):
        src, dst, report = tmp_path / f"src{b}", tmp_path / f"dst{b}", tmp_path / f"r{b}.json"
        make_batch(src, b, start, BATCH)
        where = f"seed {SEED}, batch {b} (SHARDPACK_JPEG_FUZZ_SEED={SEED}), files in {src}"
        out = run_case(MODULE, "pack_and_decode", str(src), str(dst), str(report),
                       timeout=SECONDS, label=f"jpeg fuzz {where}")
        assert out.kind == "ok", f"{where}: {out}"
        assert out.peak_mb < PEAK_MB, f"{where}: {out}"
        found = json.loads(report.read_text())
        assert found["in"] == found["files"] == BATCH, f"{where}: {found}"
        assert found["in"] == found["written"] + sum(found["skipped"].values()), f"{where}: {found}"
        assert not found["problems"], f"{where}: {found['problems'][:10]}"
        for k in totals:
            totals[k] += found.get(k, BATCH if k == "files" else 0)
        for k, v in found["skipped"].items():
            kinds[k] = kinds.get(k, 0) + v
    assert totals["files"] >= 2000
    # The fuzz reaches every side of admission, or it tests less than it says.
    assert totals["valid_written"] > 100 and totals["valid_unsupported"] > 100, totals
    assert totals["mutated_decoded"] > 50 and totals["mutated_refused"] > 10, (totals, kinds)
    assert {"corrupt", "truncated", "unsupported-jpeg"} <= set(kinds), kinds
