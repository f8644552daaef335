"""MDS input, on files laid out byte for byte as streaming's MDSWriter writes them.

(mosaicml-streaming itself does not import alongside this environment's numpy and
huggingface-hub; tests/formats/test_codec_reference.py runs its writer where it does.)
The writer below follows streaming/base/format/mds/writer.py (encode_sample,
encode_joint_shard) and base/writer.py (shard names, index.json entries).
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import zstandard

from formats import DecompressionError, SchemaError
from formats.codecs.registry import convert, detect, open_source
from tests.helpers_codecs import make_records

FIXED = {"int": 8, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint8": 1, "uint16": 2,
         "uint32": 4, "uint64": 8, "float16": 2, "float32": 4, "float64": 8}


def _encode(enc, v) -> bytes:
    if enc in FIXED:
        dt = {"int": "<i8"}.get(enc) or np.dtype(enc).newbyteorder("<").str
        return np.array(v, dt).tobytes()
    if enc in ("str", "str_int", "str_float"):
        return str(v).encode()
    if enc == "json":
        return json.dumps(v).encode()
    if enc == "pkl":
        return b"\x80\x04K\x01."
    return bytes(v)


def write_mds(root, columns: dict[str, str], samples: list[dict], *, per_shard=3,
              compression=None):
    root.mkdir(parents=True, exist_ok=True)
    names = sorted(columns)
    encs = [columns[n] for n in names]
    sizes = [FIXED.get(e) for e in encs]
    config = {"version": 2, "format": "mds", "compression": compression, "hashes": [],
              "size_limit": 1 << 26, "column_names": names, "column_encodings": encs,
              "column_sizes": sizes}
    config_data = json.dumps(config, sort_keys=True).encode()
    shards = []
    for k in range(0, len(samples), per_shard):
        encoded = []
        for s in samples[k:k + per_shard]:
            data = [_encode(e, s[n]) for n, e in zip(names, encs, strict=True)]
            head = np.array([len(d) for d, z in zip(data, sizes, strict=True) if z is None],
                            np.uint32).tobytes()
            encoded.append(head + b"".join(data))
        n = np.uint32(len(encoded))
        offsets = np.array([0] + [len(x) for x in encoded]).cumsum().astype(np.uint32)
        offsets += 4 + len(offsets.tobytes()) + len(config_data)
        raw = n.tobytes() + offsets.tobytes() + config_data + b"".join(encoded)
        raw_name = f"shard.{len(shards):05}.mds"
        raw_info = {"basename": raw_name, "bytes": len(raw), "hashes": {}}
        zip_info = None
        if compression:
            ext = compression.split(":")[0]
            z = zstandard.ZstdCompressor().compress(raw) if ext == "zstd" else gzip.compress(raw)
            zip_info = {"basename": f"{raw_name}.{ext}", "bytes": len(z), "hashes": {}}
            (root / zip_info["basename"]).write_bytes(z)
        else:
            (root / raw_name).write_bytes(raw)
        shards.append({"samples": len(encoded), "raw_data": raw_info, "zip_data": zip_info,
                       **config})
    (root / "index.json").write_text(json.dumps({"version": 2, "shards": shards}, sort_keys=True))
    return root


COLUMNS = {"jpg": "jpeg", "label": "int", "name": "str", "w": "float32", "meta": "json",
           "u": "uint16", "n": "str_int", "raw": "bytes"}


def _samples(rng, n=7):
    return [{"jpg": r["image"], "label": r["label"], "name": r["key"], "w": i / 4,
             "meta": {"i": i}, "u": 60000 + i, "n": -i, "raw": bytes([i]) * i}
            for i, r in enumerate(make_records(rng, n))]


@pytest.mark.parametrize("compression", [None, "zstd", "gz:9"])
def test_mds_columns(tmp_path, rng, compression):
    samples = _samples(rng)
    write_mds(tmp_path / "mds", COLUMNS, samples, compression=compression)
    assert detect(tmp_path / "mds") == "mds"
    src = open_source("mds", tmp_path / "mds")
    assert len(src) == 7
    types = {f.name: f.type for f in src.fields}
    assert types == {"image": "jpeg", "label": "int", "name": "str", "w": "float",
                     "meta": "json", "u": "int", "n": "int", "raw": "bytes"}
    got = list(src)
    for s, g in zip(samples, got, strict=True):
        v = g.fields
        assert (v["image"], v["label"], v["name"], v["w"], v["meta"], v["u"], v["n"], v["raw"]) \
            == (s["jpg"], s["label"], s["name"], s["w"], s["meta"], s["u"], s["n"], s["raw"])


def test_mds_to_shards(tmp_path, rng):
    samples = _samples(rng)
    write_mds(tmp_path / "mds", COLUMNS, samples, compression="zstd")
    n = convert("mds", tmp_path / "mds", "shards", tmp_path / "sh", durable=False)
    from formats import open_shards
    ds = open_shards(tmp_path / "sh")
    assert n == len(ds) == 7 and bytes(ds[6]["image"]) == samples[6]["jpg"]


def test_mds_pickle_is_refused(tmp_path, rng):
    write_mds(tmp_path / "mds", {"x": "pkl", "label": "int"}, [{"x": 1, "label": 0}])
    with pytest.raises(SchemaError, match="column 'x' uses MDS encoding 'pkl', which shardpack "
                                          "never unpickles"):
        open_source("mds", tmp_path / "mds")


def test_mds_unsupported_encoding(tmp_path):
    write_mds(tmp_path / "mds", {"x": "pil"}, [{"x": b""}])
    with pytest.raises(SchemaError, match="'pil', which shardpack does not read"):
        open_source("mds", tmp_path / "mds")


@pytest.mark.parametrize("ext", ["zstd", "gz"])
def test_mds_decompression_bomb(tmp_path, rng, ext):
    """A compressed shard that expands past the raw size its index declares is refused."""
    root = write_mds(tmp_path / "mds", COLUMNS, _samples(rng, 2), compression=ext)
    bomb = b"\0" * (50 << 20)
    z = zstandard.ZstdCompressor().compress(bomb) if ext == "zstd" else gzip.compress(bomb)
    (root / f"shard.00000.mds.{ext}").write_bytes(z)
    with pytest.raises(DecompressionError, match="beyond its bound"):
        list(open_source("mds", root))


def test_mds_zstd_without_content_size_is_bounded(tmp_path, rng):
    root = write_mds(tmp_path / "mds", COLUMNS, _samples(rng, 2), compression="zstd")
    cctx = zstandard.ZstdCompressor(write_content_size=False)
    (root / "shard.00000.mds.zstd").write_bytes(cctx.compress(b"\0" * (20 << 20)))
    with pytest.raises(DecompressionError, match="exceeds the limit"):
        list(open_source("mds", root))


def test_mds_shard_name_cannot_escape(tmp_path, rng):
    root = write_mds(tmp_path / "mds", COLUMNS, _samples(rng, 2))
    index = json.loads((root / "index.json").read_text())
    index["shards"][0]["raw_data"]["basename"] = "../secret"
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="unsafe MDS shard name"):
        list(open_source("mds", root))


def test_mds_damaged_offsets(tmp_path, rng):
    root = write_mds(tmp_path / "mds", COLUMNS, _samples(rng, 3))
    p = root / "shard.00000.mds"
    data = bytearray(p.read_bytes())
    data[8:12] = (10**6).to_bytes(4, "little")
    p.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="offsets"):
        list(open_source("mds", root))
