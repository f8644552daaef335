"""Hostile foreign inputs and a hostile dataset for inspect-shards: each fails with a
typed error naming the file (or, for the CLI, the right exit status and message)
within seconds and bounded memory; never a raw traceback, a hang or a memory blow-up.

Each case is built in the test (sparse files stand in for huge ones: they cost no
disk and read as zeros) and run through ``tests/hostile.py`` in a child process,
the way a user meets it: ``open_source(...)`` iterated, ``packer.pack(...)``, or
``inspect-shards`` itself.
"""

from __future__ import annotations

import io
import json
import os
import struct
import tarfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hostile import run_case

from formats.codecs.tfexample import _put_len, encode_example
from formats.codecs.tfrecord import masked_crc

MB = 1 << 20
_BIG = 300 * MB  # over every per-value cap (256 MiB), under the child's address space
_HUGE = 700 * MB  # what a sparse file claims where only reading it all would cost memory


def run(func: str, *args, label: str):
    """``run_case``, after resetting this process's peak memory: a child's ru_maxrss
    starts from its parent's peak at the fork, so a test process that once held a
    big file would make every later case look big. Linux resets a process's peak to
    its current size on a write of "5" to ``/proc/self/clear_refs``."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not Linux, or not allowed: the bound is then only looser
        pass
    return run_case("test_hostile_sources", func, *args, label=label)


# -- what the child runs ---------------------------------------------------------------

def iterate(kind: str, path: str, options: dict | None = None) -> None:
    from formats.codecs.registry import open_source

    for _ in open_source(kind, path, options or {}):
        pass


def pack(src: str, dst: str) -> None:
    from packer import PackOptions
    from packer import pack as run_pack

    run_pack(src, dst, PackOptions(workers=0))


def cli(argv: list[str], want_code: int, want_text: str) -> None:
    """Run inspect-shards on strict UTF-8 streams (a terminal or a pipe, not a
    forgiving StringIO); return only if it exits as expected, without a traceback."""
    from reader.inspect.cli import main

    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict",
                                 write_through=True) for _ in range(2))
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    text = out.buffer.getvalue().decode() + err.buffer.getvalue().decode()
    if code != want_code or want_text not in text or "Traceback" in text:
        raise AssertionError(f"exit {code}, wanted {want_code} and {want_text!r}: {text[-800:]}")


# -- builders: each returns (function, args, what the message must name) -----------------

def _sparse(path: Path, head: bytes, size: int, tail: bytes = b"") -> Path:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size - len(tail))
        f.seek(size - len(tail))
        f.write(tail)
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _zero_cells(path: Path, rows: int) -> None:
    # One buffer shared by every row: no 300 MB copy per row while writing.
    data = pa.py_buffer(b"\xff\xd8\xff" + bytes(_BIG - 3))
    offsets = pa.py_buffer(np.array([0, _BIG], np.int32).tobytes())
    cell = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, data])
    schema = pa.schema([("image", pa.binary()), ("label", pa.int64())])
    with pq.ParquetWriter(path, schema, compression="zstd", compression_level=1,
                          use_dictionary=False, write_statistics=False) as w:
        for i in range(rows):
            w.write_table(pa.Table.from_arrays([cell, pa.array([i], pa.int64())], schema=schema))
    del data, cell
    pa.default_memory_pool().release_unused()  # what writing took, back to the system


def _parquet(path: Path, table: pa.Table, **metadata: str) -> Path:
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    pq.write_table(table, path)
    return path


def _images_table(**extra) -> pa.Table:
    return pa.table({"image": [b"\xff\xd8\xff\xe0" + bytes(20)], **extra})


def p_huge_cells(tmp: Path):
    (tmp / "src").mkdir()
    _zero_cells(tmp / "src" / "cells.parquet", rows=2)
    return "pack", [str(tmp / "src"), str(tmp / "dst")], "cells.parquet"


def p_deep_hf_metadata(tmp: Path):
    deep = '{"info": ' + "[" * 100_000 + "]" * 100_000 + "}"
    return "iterate", ["parquet", str(_parquet(tmp / "deep.parquet", _images_table(),
                                               huggingface=deep))], "deep.parquet"


def p_hf_features_a_list(tmp: Path):
    meta = json.dumps({"info": {"features": [1, 2]}})
    return "iterate", ["parquet", str(_parquet(tmp / "hf.parquet", _images_table(label=[1]),
                                               huggingface=meta))], "hf.parquet"


def p_class_names_not_strings(tmp: Path):
    meta = json.dumps({"info": {"features": {"label": {"_type": "ClassLabel", "names": [1]}}}})
    return "iterate", ["parquet", str(_parquet(tmp / "names.parquet", _images_table(label=[0]),
                                               huggingface=meta))], "names.parquet"


def p_deep_json_cell(tmp: Path):
    table = _images_table(meta=["[" * 5000 + "]" * 5000])
    path = _parquet(tmp / "cell.parquet", table, shardpack=json.dumps({"json_columns": ["meta"]}))
    return "iterate", ["parquet", str(path)], "cell.parquet"


def p_label_beyond_int64(tmp: Path):
    table = _images_table(label=pa.array([(1 << 64) - 1], pa.uint64()))
    return "iterate", ["parquet", str(_parquet(tmp / "u64.parquet", table))], "u64.parquet"


def p_footer_claims_gigabytes(tmp: Path):
    size = 1536 * MB
    path = _sparse(tmp / "footer.parquet", b"PAR1", size, struct.pack("<I", size - 12) + b"PAR1")
    return "iterate", ["parquet", str(path)], "footer.parquet"


def p_fifo(tmp: Path):
    return "iterate", ["parquet", str(_fifo(tmp / "pipe.parquet"))], "pipe.parquet"


def _tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


_SAMPLES = [(f"s{i}.{ext}", data) for i in range(3)
            for ext, data in (("cls", b"1"), ("txt", b"hello " * 200))]


def w_truncated_inside_member(tmp: Path):
    path = tmp / "cut.tar"
    path.write_bytes(_tar_bytes(_SAMPLES)[:3000])
    return "iterate", ["webdataset", str(path)], "truncated"


def w_truncated_between_members(tmp: Path):
    full = _tar_bytes(_SAMPLES)
    path = tmp / "cut.tar"
    path.write_bytes(full[:len(full) - 1024 - 512 * 6])  # stops at a member's header
    return "iterate", ["webdataset", str(path)], "truncated"


def w_gzip_truncated(tmp: Path):
    import gzip

    path = tmp / "cut.tar.gz"
    path.write_bytes(gzip.compress(_tar_bytes(_SAMPLES))[:-40])
    return "iterate", ["webdataset", str(path)], "cut.tar.gz"


def _header(name: str, kind: bytes, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def w_pax_header_bomb(tmp: Path):
    path = _sparse(tmp / "pax.tar", _header("././@PaxHeader", tarfile.XHDTYPE, _HUGE),
                   512 + _HUGE + 512 * 3)
    return "iterate", ["webdataset", str(path)], "pax.tar"


def w_long_name_bomb(tmp: Path):
    path = _sparse(tmp / "long.tar", _header("././@LongLink", tarfile.GNUTYPE_LONGNAME, _HUGE),
                   512 + _HUGE + 512 * 3)
    return "iterate", ["webdataset", str(path)], "long.tar"


def w_member_over_cap(tmp: Path):
    path = _sparse(tmp / "big.tar", _header("a.jpg", tarfile.REGTYPE, _BIG),
                   512 + _BIG + 512 * 2)
    return "iterate", ["webdataset", str(path)], "big.tar"


def w_deep_json(tmp: Path):
    path = tmp / "deep.tar"
    path.write_bytes(_tar_bytes([("a.json", b"[" * 100_000 + b"]" * 100_000)]))
    return "iterate", ["webdataset", str(path)], "deep.tar"


def w_huge_label(tmp: Path):
    path = tmp / "label.tar"
    path.write_bytes(_tar_bytes([("a.cls", b"9" * 100_000), ("a.txt", b"x")]))
    return "iterate", ["webdataset", str(path)], "label.tar"


def w_label_beyond_int64(tmp: Path):
    path = tmp / "label.tar"
    path.write_bytes(_tar_bytes([("a.cls", str(1 << 70).encode()), ("a.txt", b"x")]))
    return "iterate", ["webdataset", str(path)], "label.tar"


def w_name_not_utf8(tmp: Path):
    path = tmp / "latin1.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as t:
        for name in ("a.jpg", "a.t\xe9xt"):  # written as Latin-1 bytes: not UTF-8
            t.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
    return "iterate", ["webdataset", str(path)], "not UTF-8"


def w_fifo(tmp: Path):
    return "iterate", ["webdataset", str(_fifo(tmp / "pipe.tar"))], "pipe.tar"


def r_unnamed_pax_bomb_in_a_folder(tmp: Path):
    """Telling what a folder holds reads one header block of an unnamed file, not the
    gigabyte its pax header claims."""
    (tmp / "src").mkdir()
    _sparse(tmp / "src" / "data.bin", _header("././@PaxHeader", tarfile.XHDTYPE, _HUGE),
            512 + _HUGE + 1024)
    return "pack", [str(tmp / "src"), str(tmp / "dst")], "src"


def _mds(root: Path, records: list[bytes], /, **override) -> Path:
    """An MDS folder of one uncompressed shard with columns x (bytes) and meta (json)."""
    root.mkdir()
    n = len(records)
    offsets = np.cumsum([4 * (n + 2)] + [len(s) for s in records]).astype("<u4")
    raw = np.uint32(n).tobytes() + offsets.tobytes() + b"".join(records)
    (root / "shard.00000.mds").write_bytes(raw)
    shard = {"format": "mds", "column_names": ["x", "meta"],
             "column_encodings": ["bytes", "json"], "column_sizes": [None, None],
             "samples": n, "compression": None, "zip_data": None,
             "raw_data": {"basename": "shard.00000.mds", "bytes": len(raw)}, **override}
    (root / "index.json").write_text(json.dumps({"version": 2, "shards": [shard]}))
    return root


def _mds_sample(x: bytes, meta: bytes) -> bytes:
    return struct.pack("<II", len(x), len(meta)) + x + meta


def _mds_index_case(**override):
    def build(tmp: Path):
        root = _mds(tmp / "mds", [_mds_sample(b"ab", b"{}")], **override)
        return "iterate", ["mds", str(root)], "index.json"
    return build


def m_deep_index(tmp: Path):
    root = _mds(tmp / "mds", [_mds_sample(b"ab", b"{}")])
    (root / "index.json").write_text('{"version": 2, "shards": ' + "[" * 100_000 + "]" * 100_000
                                     + "}")
    return "iterate", ["mds", str(root)], "index.json"


def m_index_fifo(tmp: Path):
    (tmp / "mds").mkdir()
    _fifo(tmp / "mds" / "index.json")
    return "iterate", ["mds", str(tmp / "mds")], "index.json"


def m_shard_fifo(tmp: Path):
    root = _mds(tmp / "mds", [_mds_sample(b"ab", b"{}")])
    (root / "shard.00000.mds").unlink()
    _fifo(root / "shard.00000.mds")
    return "iterate", ["mds", str(root)], "shard.00000.mds"


def m_index_too_large(tmp: Path):
    root = _mds(tmp / "mds", [_mds_sample(b"ab", b"{}")])
    _sparse(root / "index.json", b'{"version": 2, "shards": []}', 100 * MB)
    return "iterate", ["mds", str(root)], "index.json"


def m_sample_over_cap(tmp: Path):
    root = _mds(tmp / "mds", [_mds_sample(b"ab", b"{}")])
    size = 12 + _BIG
    head = struct.pack("<IIII", 1, 12, size, _BIG - 8) + struct.pack("<I", 0)
    _sparse(root / "shard.00000.mds", head, size)
    shard = json.loads((root / "index.json").read_text())
    shard["shards"][0]["raw_data"]["bytes"] = size
    (root / "index.json").write_text(json.dumps(shard))
    return "iterate", ["mds", str(root)], "shard.00000.mds"


def m_deep_json_column(tmp: Path):
    root = _mds(tmp / "mds", [_mds_sample(b"ab", b"[" * 5000 + b"]" * 5000)])
    return "iterate", ["mds", str(root)], "shard.00000.mds"


def _tfrecord_frame(data: bytes, length: int | None = None) -> bytes:
    head = struct.pack("<Q", len(data) if length is None else length)
    return (head + struct.pack("<I", masked_crc(head)) + data
            + struct.pack("<I", masked_crc(data)))


def t_record_over_cap(tmp: Path):
    head = struct.pack("<Q", _BIG)
    path = _sparse(tmp / "big.tfrecord", head + struct.pack("<I", masked_crc(head)),
                   16 + _BIG)
    return "iterate", ["tfrecord", str(path)], "big.tfrecord"


def t_packed_number_flood(tmp: Path):
    """33 million one-byte varints in one Int64List: a Python loop per number took minutes."""
    inner, feat, entry, feats, example = (bytearray() for _ in range(5))
    _put_len(inner, 1, b"\x01" * ((1 << 25) + 1))
    _put_len(feat, 3, inner)
    _put_len(entry, 1, b"n")
    _put_len(entry, 2, feat)
    _put_len(feats, 1, entry)
    _put_len(example, 1, feats)
    path = tmp / "flood.tfrecord"
    path.write_bytes(_tfrecord_frame(bytes(example)))
    return "iterate", ["tfrecord", str(path)], "flood.tfrecord"


def t_deep_json_feature(tmp: Path):
    data = encode_example({"image/encoded": [b"\xff\xd8\xff\xe0"],
                           "meta": [b"[" * 100_000 + b"]" * 100_000]})
    path = tmp / "deep.tfrecord"
    path.write_bytes(_tfrecord_frame(data))
    return "iterate", ["tfrecord", str(path), {"features": "image/encoded=image,meta=meta:json"}], \
        "deep.tfrecord"


def t_fifo(tmp: Path):
    return "iterate", ["tfrecord", str(_fifo(tmp / "pipe.tfrecord"))], "pipe.tfrecord"


CASES = {
    "parquet 300 MB zero cells": p_huge_cells,
    "parquet deeply nested huggingface metadata": p_deep_hf_metadata,
    "parquet huggingface features a list": p_hf_features_a_list,
    "parquet class names not strings": p_class_names_not_strings,
    "parquet deeply nested JSON cell": p_deep_json_cell,
    "parquet label beyond int64": p_label_beyond_int64,
    "parquet footer claiming 1.5 GB": p_footer_claims_gigabytes,
    "parquet FIFO": p_fifo,
    "tar truncated inside a member": w_truncated_inside_member,
    "tar truncated between members": w_truncated_between_members,
    "tar.gz truncated": w_gzip_truncated,
    "tar pax header of 700 MB": w_pax_header_bomb,
    "tar GNU long name of 700 MB": w_long_name_bomb,
    "tar member of 300 MB": w_member_over_cap,
    "tar deeply nested JSON member": w_deep_json,
    "tar label of 100k digits": w_huge_label,
    "tar label beyond int64": w_label_beyond_int64,
    "tar member name not UTF-8": w_name_not_utf8,
    "tar FIFO": w_fifo,
    "unnamed file with a 700 MB pax header": r_unnamed_pax_bomb_in_a_folder,
    "mds column_names null": _mds_index_case(column_names=None),
    "mds raw_data a list": _mds_index_case(raw_data=[1, 2]),
    "mds samples 1e30": _mds_index_case(samples=1e30),
    "mds samples a string": _mds_index_case(samples="7"),
    "mds column_sizes of strings": _mds_index_case(column_sizes=["a", "b"]),
    "mds encodings not strings": _mds_index_case(column_encodings=[["x"], {}]),
    "mds column name a lone surrogate": _mds_index_case(column_names=["\ud800", "meta"]),
    "mds index.json deeply nested": m_deep_index,
    "mds index.json a FIFO": m_index_fifo,
    "mds shard a FIFO": m_shard_fifo,
    "mds index.json of 100 MB": m_index_too_large,
    "mds sample of 300 MB": m_sample_over_cap,
    "mds deeply nested JSON column": m_deep_json_column,
    "tfrecord record of 300 MB": t_record_over_cap,
    "tfrecord 33M packed numbers": t_packed_number_flood,
    "tfrecord deeply nested JSON feature": t_deep_json_feature,
    "tfrecord FIFO": t_fifo,
}


@pytest.mark.parametrize("label", list(CASES))
def test_hostile_source_fails_typed_fast_and_small(label, tmp_path):
    func, args, named = CASES[label](tmp_path)
    outcome = run(func, *args, label=label)
    assert outcome.kind == "typed", str(outcome)
    assert outcome.seconds < 5 and outcome.peak_mb < 512, str(outcome)
    assert named in outcome.message, str(outcome)
    assert "Traceback" not in outcome.message


# -- inspect-shards ----------------------------------------------------------------------

_ODD = os.fsdecode(b"ds-\xff")  # a folder name that is not UTF-8: "ds-\udcff" to Python


@pytest.fixture(scope="module")
def odd_names(tmp_path_factory) -> Path:
    """A dataset in a folder whose name is not UTF-8 (argv carries it as a lone
    surrogate, which no strict UTF-8 stream can write)."""
    from tests.helpers_codecs import make_dataset, make_records

    return make_dataset(tmp_path_factory.mktemp("odd") / _ODD,
                        make_records(np.random.default_rng(0), 9))


CLI_CASES = {
    "ls --limit -5 is a usage error": (["ls", "--limit", "-5"], 2, "must be 0 or more"),
    "ls --offset -1 is a usage error": (["ls", "--offset", "-1"], 2, "must be 0 or more"),
    "info prints an odd folder name escaped": (["info"], 0, "ds-\\udcff"),
    "stats on an odd folder name": (["stats"], 0, "records: 9"),
    "ls on an odd folder name": (["ls"], 0, "index"),
    "info --json on an odd folder name": (["info", "--json"], 0, "ds-\\udcff"),
    "show of a missing record names it": (["show", "99"], 1, "inspect-shards: error: "),
}


@pytest.mark.parametrize("label", list(CLI_CASES))
def test_inspect_shards_on_odd_names_and_bad_usage(label, odd_names):
    argv, code, text = CLI_CASES[label]
    outcome = run("cli", [str(odd_names), *argv], code, text, label=f"inspect-shards: {label}")
    assert outcome.kind == "ok", str(outcome)
    assert outcome.seconds < 5 and outcome.peak_mb < 512, str(outcome)


def test_inspect_shards_reports_errors_without_a_traceback(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "manifest.json").mkdir()  # an OSError where a file should be
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "manifest.json").write_text('{"classes": ["\\udc80cat"]}')  # a lone surrogate
    for target in (tmp_path / "missing", tmp_path / "dir", odd, tmp_path / _ODD):
        outcome = run("cli", [str(target), "info"], 1, "inspect-shards: error: ",
                      label=f"inspect-shards: error in {target.name!a}")
        assert outcome.kind == "ok", str(outcome)
