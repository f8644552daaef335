"""A hostile or damaged dataset never crashes, hangs or exhausts a reader (issue 14, read side).

Each hostile case is a module-level function below that does what a user does
(open and read every record, ``ds.metadata()``, a Loader epoch with two workers,
``inspect-shards``), run by ``tests/hostile.py`` in a child bounded in time and
address space. The tests assert a typed error naming the file (or success where
the policy is to read), within 5 s and 512 MB of the case's own peak memory.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hostile import run_case

from formats import DatasetWriter, Field, open_shards
from formats.checksum import crc32c, format_crc
from formats.errors import FormatError, ManifestError, ShardpackError, UnsafePathError
from formats.shard.layout import index_sections
from formats.shard.manifest import MAX_MANIFEST_BYTES
from formats.shard.shard import BLOCK, SPARSE_READ, SPARSE_RECORDS
from formats.shard.shard_writer import META_SCHEMA
from tests.helpers_manifest import (
    edit_manifest,
    edit_shard_table,
    edit_table_ref,
    manifest_v1,
    write_shard_table_bytes,
)
from tests.helpers_paths import TESTS

FIELDS = [Field("data", "bytes"), Field("label", "int"), Field("key", "str"),
          Field("doc", "json", "zstd")]
MODULE = "test_hostile_dataset"
SECONDS = 5.0
PEAK_MB = 512


def make(root: Path, n: int = 24, per_shard: int = 8) -> Path:
    with DatasetWriter(root, FIELDS, records_per_shard=per_shard, durable=False) as w:
        for i in range(n):
            w.write({"data": bytes([i % 251]) * (64 + i), "label": i % 3, "key": f"k{i}",
                     "doc": {"i": i}})
    return root


def replace_meta(root: Path, shard: int, table: pa.Table, **entry) -> None:
    """Write ``table`` as a shard's metadata file and make the manifest agree with it."""
    name = f"shard-{shard:05d}.meta.parquet"
    pq.write_table(table, root / name, compression="zstd")
    raw = (root / name).read_bytes()
    edit_manifest(root, lambda m: m["shards"][shard].update(
        meta_bytes=len(raw), meta_crc32c=format_crc(crc32c(raw)), **entry))


class CliRefused(ShardpackError):
    """inspect-shards ended with an error status and a message (what a user sees)."""


# -- what users do (run in the child) ------------------------------------------------------

def read_all(path: str, follow_symlinks: bool = False, with_metadata: bool = True) -> None:
    """Open, read every record and field with CRCs checked, batch reads, the metadata table."""
    with open_shards(path, check_crc=True, follow_symlinks=follow_symlinks) as ds:
        for i in range(len(ds)):
            bytes(ds[i]["data"])
        everything = np.arange(len(ds))
        ds.scalars(everything, "label")
        ds.payloads(everything, "data")
        if with_metadata:
            ds.metadata()


def metadata(path: str) -> None:
    open_shards(path).metadata()


def loader_epoch(path: str, batch_size: int = 4) -> None:
    from reader import Loader

    loader = Loader(path, batch_size=batch_size, num_workers=2, shuffle=True, seed=1)
    try:
        for _ in loader:
            pass
    finally:
        loader.close()


def inspect(path: str, *command: str) -> None:
    from reader.inspect.cli import main

    out = io.StringIO()
    with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
        rc = main([path, *command, "--quiet"])
    if rc:
        raise CliRefused(f"inspect-shards {command[0]} exited {rc}: {out.getvalue().strip()}")


def truncate_while_open(path: str, name: str) -> None:
    """Read, truncate a mapped shard file (as a crashed copy or another process might), read again."""
    ds = open_shards(path)
    for i in range(len(ds)):
        ds[i]
    os.truncate(Path(path) / name, 100)
    for i in range(len(ds)):
        bytes(ds[i]["data"])


def truncate_under_loader(path: str) -> None:
    """A Loader epoch with two workers, a shard truncated after the first batch."""
    from reader import Loader

    loader = Loader(path, batch_size=4, num_workers=2, shuffle=True, seed=1)
    try:
        for k, _ in enumerate(loader):
            if k == 0:
                os.truncate(Path(path) / "shard-00001.rec", 100)
    finally:
        loader.close()


def with_fd_limit(limit: int, action: str, path: str, *args) -> None:
    """``action`` under ``ulimit -n limit`` (soft and hard, as a container might set)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    globals()[action](path, *args)


def unpickle_after_replace(path: str) -> None:
    """A worker unpickles the dataset after ``pack-dataset --overwrite`` swapped a new one in."""
    blob = pickle.dumps(open_shards(path))
    _swap_in_new_dataset(Path(path))
    pickle.loads(blob)


def reopen_after_replace(path: str) -> None:
    """A process that keeps one shard open reopens another after the swap."""
    ds = open_shards(path, max_open=1)
    ds[0]
    _swap_in_new_dataset(Path(path))
    ds[len(ds) - 1]


def _swap_in_new_dataset(root: Path) -> None:
    # One record more: the same records would make the same manifest, byte for byte.
    new = make(root.with_name(root.name + ".new"), n=25, per_shard=8)
    os.rename(root, root.with_name(root.name + ".old"))
    os.rename(new, root)


# -- hostile datasets: each edits a fresh copy of a sound one, returns what must be named --

def fifo(root: Path, name: str) -> str:
    (root / name).unlink()
    os.mkfifo(root / name)
    return name


def manifest_text(root: Path, text: str) -> str:
    (root / "manifest.json").write_text(text)
    return "manifest.json"


def manifest_edit(change, names: str = "manifest.json"):
    def build(root: Path) -> str:
        edit_manifest(root, change)
        return names
    return build


def manifest_nested(root: Path) -> str:
    return manifest_text(root, "[" * 200_000 + "]" * 200_000)


def manifest_huge_integer(root: Path) -> str:
    text = (root / "manifest.json").read_text()
    return manifest_text(root, text.replace('"alignment": 64', '"alignment": ' + "9" * 5000))


def created_by_nested(m: dict) -> None:
    deep: dict = {}
    node = deep
    for _ in range(500):
        node["x"] = {}
        node = node["x"]
    m["created_by"] = deep


def records_2_63(m: dict) -> None:
    m["shards"][0]["records"] = 2**63
    m["totals"]["records"] = 2**63 + 16


def manifest_over_cap(root: Path) -> str:
    """A manifest listing a million shards: far over the cap, refused before reading it."""
    with open(root / "manifest.json", "r+b") as f:
        f.truncate(250 << 20)  # sparse: the test writes nothing
    return "manifest.json"


def manifest_near_cap(root: Path) -> str:
    """Just under the cap: some 80,000 shards listed, none of them there."""
    in_child("write_manifest_near_cap", str(root))
    return "shard-x000000"  # the first shard, missing


def write_manifest_near_cap(root: str) -> None:
    root = Path(root)
    entry = {"records": 1, "data_bytes": 128, "index_bytes": index_sections(1, 4)[3],
             "meta_bytes": 100, "data_crc32c": "00000000", "index_crc32c": "00000000",
             "meta_crc32c": "00000000"}
    obj = manifest_v1(root)  # a 1.x manifest: its shards listed in it
    (root / "shards.arrow").unlink()

    def text(n: int) -> str:
        obj["shards"] = [{"name": f"shard-x{i:06d}", **entry} for i in range(n)]
        obj["totals"] = {"records": n, "data_bytes": 0, "shards": n}
        return json.dumps(obj, indent=1, sort_keys=True)

    per_shard = len(text(2)) - len(text(1))
    text = text(int(MAX_MANIFEST_BYTES * 0.97 - len(text(0))) // per_shard)
    assert MAX_MANIFEST_BYTES * 0.95 < len(text) < MAX_MANIFEST_BYTES
    (root / "manifest.json").write_text(text)


def zstd_over_plain(m: dict) -> None:
    m["fields"][0].update(compression="zstd", max_raw_size=1000)


def dictionary_fifo(root: Path) -> str:
    os.mkfifo(root / "dict-003.zstd")
    edit_manifest(root, lambda m: m["fields"][3].update(dictionary="dict-003.zstd",
                                                        dictionary_crc32c="00000000"))
    return "dict-003.zstd"


def directory_for(name: str):
    def build(root: Path) -> str:
        (root / name).unlink()
        (root / name).mkdir()
        return "directory"
    return build


def device_for(name: str):
    def build(root: Path) -> str:
        (root / name).unlink()
        (root / name).symlink_to("/dev/zero")
        return "character device"
    return build


def symlink_out(name: str):
    def build(root: Path) -> str:
        outside = root.parent / f"outside-{name}"
        shutil.move(root / name, outside)
        (root / name).symlink_to(outside)
        return f"outside-{name}"  # the target is named
    return build


def meta_of_other_shard(root: Path) -> str:
    """The 44 KB case: a metadata file that is not the one the manifest describes."""
    pq.write_table(pa.table({"label": pa.array(np.arange(50_000), pa.int64())}),
                   root / "shard-00000.meta.parquet")
    return "shard-00000.meta.parquet"


def bomb_table(rows: int, key: str) -> pa.Table:
    """A metadata table whose ``key`` column is one string repeated: small on disk
    (dictionary encoded), ``rows * len(key)`` bytes once decoded."""
    keys = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, np.int32)), pa.array([key]))
    schema = META_SCHEMA.set(1, pa.field("key", keys.type))
    return pa.table({"label": pa.array(np.zeros(rows, np.int64)), "key": keys,
                     "size": pa.array(np.zeros(rows, np.int64)),
                     "width": pa.array(np.zeros(rows, np.int32)),
                     "height": pa.array(np.zeros(rows, np.int32))}, schema=schema)


def meta_row_bomb(root: Path) -> str:
    """Two million rows (a 1 KB key each) in a few KB, the manifest made to agree: 2 GB decoded."""
    in_child("replace_meta_with_bomb", str(root), 2_000_000, 1000)
    return "shard-00000.meta.parquet"


def replace_meta_with_bomb(root: str, rows: int, key_bytes: int) -> None:
    replace_meta(Path(root), 0, bomb_table(rows, "k" * key_bytes))


def in_child(func: str, *args) -> None:
    """Run a builder that allocates much in a child: the test process, whose size every
    later case's child starts with, stays small."""
    code = f"import {MODULE} as m; m.{func}(*{args!r})"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=TESTS,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def meta_row_bomb_records_too(root: Path) -> str:
    """As above, and the manifest's record count raised to match (index size made consistent)."""
    meta_row_bomb(root)
    n = 2_000_000
    edit_manifest(root, lambda m: (
        m["shards"][0].update(records=n, index_bytes=index_sections(n, len(FIELDS))[3]),
        m["totals"].update(records=m["totals"]["records"] - 8 + n)))
    return "shard-00000.idx"


def meta_key_bomb(root: Path) -> str:
    """The shard's eight rows, each key one 80 MB string: 640 MB decoded from a few KB."""
    in_child("replace_meta_with_bomb", str(root), 8, 80 << 20)
    return "shard-00000.meta.parquet"


def meta_wrong_schema(root: Path) -> str:
    table = pa.table({f"c{i}": pa.array(["x"] * 8) for i in range(200)})
    replace_meta(root, 1, table)
    return "shard-00001.meta.parquet"


def surrogate(where: str):
    def change(m: dict) -> None:
        if where == "shard":
            m["shards"][1]["name"] = "shard-\ud800"
        else:
            m["classes"] = ["cat", "d\udc80g"]
    return change


def version(text: str):
    return lambda m: m.update(format_version=text)


# -- the shard table (FORMAT.md, section 4.1) --------------------------------------------

def table_edit(change, names: str = "shards.arrow", fix_manifest: bool = True):
    """A builder rewriting the shard table as ``change(table)`` returns it; by default the
    manifest's size and checksum of it made to agree, so only its content is wrong."""
    def build(root: Path) -> str:
        edit_shard_table(root, change, fix_manifest=fix_manifest)
        return names
    return build


def set_cell(table: pa.Table, column: str, row: int, value) -> pa.Table:
    values = table.column(column).to_pylist()
    values[row] = value
    at = table.schema.get_field_index(column)
    return table.set_column(at, table.schema.field(at), pa.array(values, table.schema.field(at).type))


def table_truncated(root: Path) -> str:
    raw = (root / "shards.arrow").read_bytes()
    (root / "shards.arrow").write_bytes(raw[: len(raw) // 2])
    return "shards.arrow"


def table_bit_flip(root: Path) -> str:
    raw = bytearray((root / "shards.arrow").read_bytes())
    raw[len(raw) // 2] ^= 0x10
    (root / "shards.arrow").write_bytes(bytes(raw))
    return "shards.arrow"


def table_garbage(root: Path) -> str:
    write_shard_table_bytes(root, os.urandom(4096))
    return "shards.arrow"


def table_named(name: str):
    def build(root: Path) -> str:
        edit_table_ref(root, name=name)
        return name
    return build


def table_claims_too_much(root: Path) -> str:
    edit_table_ref(root, bytes=1 << 40)
    return "manifest.json"


def more_records(table: pa.Table) -> pa.Table:
    # One record more in shard 0, its index size made to fit: only totals.records disagrees.
    n = table.column("records")[0].as_py() + 1
    table = set_cell(table, "records", 0, n)
    return set_cell(table, "index_bytes", 0, index_sections(n, len(FIELDS))[3])


TABLE_CASES = [
    ("shard table is a FIFO", lambda r: fifo(r, "shards.arrow"), "read_all", ()),
    ("shard table is missing", lambda r: (os.unlink(r / "shards.arrow"), "shards.arrow")[1],
     "inspect", ("info",)),
    ("shard table truncated", table_truncated, "read_all", ()),
    ("shard table's checksum wrong", table_bit_flip, "inspect", ("info",)),
    ("shard table is not Arrow", table_garbage, "read_all", ()),
    ("shard table claims a terabyte", table_claims_too_much, "read_all", ()),
    ("shard table named outside the folder", table_named("../shards.arrow"), "read_all", ()),
    ("shard table links out", symlink_out("shards.arrow"), "read_all", ()),
    ("shard table short of a row", table_edit(lambda t: t.slice(0, t.num_rows - 1)),
     "read_all", ()),
    ("shard table with a column more",
     table_edit(lambda t: t.append_column("x", pa.array([0] * t.num_rows))), "read_all", ()),
    ("shard table with a null count",
     table_edit(lambda t: set_cell(t, "records", 1, None)), "read_all", ()),
    ("shard table with a negative count",
     table_edit(lambda t: set_cell(t, "meta_bytes", 2, -5)), "read_all", ()),
    ("shard table names a shard outside the folder",
     table_edit(lambda t: set_cell(t, "name", 1, "../outside"), names="../outside"),
     "read_all", ()),
    ("shard table names two shards alike",
     table_edit(lambda t: set_cell(t, "name", 1, t.column("name")[0].as_py())), "read_all", ()),
    ("shard table's index size unfit",
     table_edit(lambda t: set_cell(t, "index_bytes", 0, 64)), "read_all", ()),
    ("shard table's records disagree with totals",
     table_edit(more_records, names="manifest.json"), "inspect", ("info",)),
    ("shard table with a record count of 2**62",
     table_edit(lambda t: set_cell(t, "records", 0, 1 << 62)), "read_all", ()),
]


# (label, hostile dataset builder, case function, extra case arguments)
HOSTILE = [
    ("manifest is a FIFO", lambda r: fifo(r, "manifest.json"), "read_all", ()),
    ("manifest is a FIFO, inspect info", lambda r: fifo(r, "manifest.json"), "inspect", ("info",)),
    ("manifest nests 200,000 deep", manifest_nested, "read_all", ()),
    ("created_by nests 500 deep", manifest_edit(created_by_nested), "inspect", ("info",)),
    ("manifest has a 5,000-digit integer", manifest_huge_integer, "read_all", ()),
    ("records of 2**63", manifest_edit(records_2_63), "read_all", ()),
    ("lone surrogate in a shard name", manifest_edit(surrogate("shard")), "read_all", ()),
    ("lone surrogate in a class name", manifest_edit(surrogate("classes")), "inspect", ("stats",)),
    ("version 1.-5", manifest_edit(version("1.-5")), "read_all", ()),
    ("version with a space", manifest_edit(version(" 1.0")), "read_all", ()),
    ("version with Arabic digits", manifest_edit(version("\u0661.0")), "read_all", ()),
    ("manifest listing a million shards", manifest_over_cap, "read_all", ()),
    ("manifest just under the size cap", manifest_near_cap, "read_all", ()),
    ("zstd switched on over plain payloads", manifest_edit(zstd_over_plain, "shard-00000.rec"),
     "read_all", ()),
    ("zstd switched on, Loader", manifest_edit(zstd_over_plain, "shard-00000.rec"),
     "loader_epoch", ()),
    ("dictionary is a FIFO", dictionary_fifo, "read_all", ()),
    ("data file is a FIFO", lambda r: fifo(r, "shard-00001.rec"), "read_all", ()),
    ("data file is a FIFO, Loader", lambda r: fifo(r, "shard-00001.rec"), "loader_epoch", ()),
    ("data file is a FIFO, inspect verify", lambda r: fifo(r, "shard-00001.rec"), "inspect",
     ("verify",)),
    ("index file is a FIFO", lambda r: fifo(r, "shard-00001.idx"), "inspect", ("show", "3")),
    ("metadata file is a FIFO", lambda r: fifo(r, "shard-00001.meta.parquet"), "metadata", ()),
    ("metadata file is a FIFO, inspect stats", lambda r: fifo(r, "shard-00001.meta.parquet"),
     "inspect", ("stats",)),
    ("data file is a directory", directory_for("shard-00000.rec"), "read_all", ()),
    ("data file is a device", device_for("shard-00000.rec"), "read_all", (True,)),
    ("metadata file of another shard", meta_of_other_shard, "metadata", ()),
    ("metadata row bomb", meta_row_bomb, "metadata", ()),
    ("metadata row bomb, inspect ls", meta_row_bomb, "inspect", ("ls",)),
    ("metadata row bomb with records", meta_row_bomb_records_too, "inspect", ("stats",)),
    ("metadata key bomb", meta_key_bomb, "metadata", ()),
    ("metadata of another schema", meta_wrong_schema, "inspect", ("stats",)),
    ("data file links out", symlink_out("shard-00001.rec"), "read_all", ()),
    ("index file links out, Loader", symlink_out("shard-00001.idx"), "loader_epoch", ()),
    ("metadata file links out", symlink_out("shard-00001.meta.parquet"), "metadata", ()),
    ("manifest links out", symlink_out("manifest.json"), "inspect", ("info",)),
    *TABLE_CASES,
]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return make(tmp_path_factory.mktemp("pristine") / "ds")


def hostile_copy(pristine: Path, tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(pristine, root)
    return root


def measured(peak_file: str, action: str, *args) -> None:
    """Run the case ``action``, then write this process's own peak resident memory.

    The harness's figure (``ru_maxrss``) starts at the test process's own peak, which
    the spawned child inherits across ``exec``: once earlier tests have grown the test
    process, it says nothing about the case. ``VmHWM`` starts afresh at ``exec``.
    """
    try:
        globals()[action](*args)
    finally:
        with open("/proc/self/status", encoding="ascii") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        Path(peak_file).write_text(str(kb / 1024))


def hostile(action: str, *args, label: str):
    """``run_case`` of ``action(*args)``, with ``own_peak_mb`` (see :func:`measured`)."""
    fd, peak = tempfile.mkstemp(prefix="shardpack-peak-")
    os.close(fd)
    try:
        outcome = run_case(MODULE, "measured", peak, action, *args, timeout=SECONDS, label=label)
        text = Path(peak).read_text()
    finally:
        os.unlink(peak)
    outcome.own_peak_mb = float(text) if text else None
    return outcome


def check(outcome, kind: str = "typed", names: str | None = None) -> None:
    assert outcome.kind == kind, str(outcome)
    assert outcome.seconds < SECONDS, str(outcome)
    assert outcome.own_peak_mb is not None and outcome.own_peak_mb < PEAK_MB, (
        f"{outcome.own_peak_mb} MB: {outcome}")
    if names is not None:
        assert names in outcome.message, str(outcome)


@pytest.mark.parametrize(("label", "build", "case", "args"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_dataset_gives_a_typed_error_naming_the_file(pristine, tmp_path, label, build,
                                                             case, args):
    root = hostile_copy(pristine, tmp_path)
    names = build(root)
    check(hostile(case, str(root), *args, label=label), names=names)


def test_zstd_over_plain_payloads_names_shard_record_and_field(pristine, tmp_path):
    root = hostile_copy(pristine, tmp_path)
    manifest_edit(zstd_over_plain)(root)
    outcome = hostile("read_all", str(root), label="zstd over plain: what is named")
    check(outcome)
    assert outcome.error == "DecompressionError"
    assert "shard-00000.rec record 0" in outcome.message and "'data'" in outcome.message


def test_symlink_out_is_refused_naming_its_target(pristine, tmp_path):
    root = hostile_copy(pristine, tmp_path)
    symlink_out("shard-00001.rec")(root)
    with pytest.raises(UnsafePathError) as err:
        open_shards(root)
    assert err.value.path.endswith("shard-00001.rec")
    assert err.value.found == os.path.realpath(tmp_path / "outside-shard-00001.rec")
    assert "follow_symlinks=True" in str(err.value)


def test_symlinks_out_are_read_with_follow_symlinks(pristine, tmp_path):
    from formats import verify_dataset

    root = hostile_copy(pristine, tmp_path)
    for name in ("shard-00001.rec", "shard-00001.idx", "shard-00001.meta.parquet", "manifest.json"):
        symlink_out(name)(root)
    check(hostile("read_all", str(root), True, label="links out, followed"), "ok")
    assert verify_dataset(root, follow_symlinks=True) == []
    with pytest.raises(UnsafePathError, match="manifest"):
        verify_dataset(root)
    (root / "manifest.json").unlink()
    shutil.copy(tmp_path / "outside-manifest.json", root / "manifest.json")
    problems = verify_dataset(root)
    assert {p.file for p in problems} == {"shard-00001.rec", "shard-00001.idx",
                                          "shard-00001.meta.parquet"}
    assert all("outside the dataset folder" in p.what for p in problems)


def test_symlinks_inside_the_folder_and_a_linked_folder_are_read(pristine, tmp_path):
    root = hostile_copy(pristine, tmp_path)
    (root / ".store").mkdir()
    for name in ("shard-00001.rec", "shard-00001.idx", "shard-00001.meta.parquet"):
        shutil.move(root / name, root / ".store" / name)
        (root / name).symlink_to(Path(".store") / name)
    link = tmp_path / "linked"
    link.symlink_to(root)
    for path in (root, link):
        check(hostile("read_all", str(path), label="links inside"), "ok")


def test_a_directory_in_place_of_a_data_file_is_called_one(pristine, tmp_path):
    root = hostile_copy(pristine, tmp_path)
    directory_for("shard-00000.rec")(root)
    with pytest.raises(FormatError, match="data file is a directory, not a regular file"):
        open_shards(root)


def test_the_manifest_cap_is_checked_before_reading(pristine, tmp_path):
    root = hostile_copy(pristine, tmp_path)
    manifest_over_cap(root)
    with pytest.raises(ManifestError, match="larger than this reader accepts"):
        open_shards(root)


# -- truncated while mapped: a typed error, not SIGBUS -------------------------------------

@pytest.mark.parametrize("name", ["shard-00001.rec", "shard-00001.idx"])
def test_truncated_while_mapped(pristine, tmp_path, name):
    root = hostile_copy(pristine, tmp_path)
    outcome = hostile("truncate_while_open", str(root), name, label=f"{name} truncated")
    check(outcome, names=name)
    assert "truncated while mapped" in outcome.message


def test_truncated_under_a_loader_with_workers(tmp_path):
    root = make(tmp_path / "ds", n=400, per_shard=100)
    outcome = hostile("truncate_under_loader", str(root), label="truncated under Loader")
    check(outcome, names="shard-00001.rec")


@pytest.mark.parametrize("mixed", [False, True])
def test_a_worker_killed_by_sigbus_names_the_truncated_file(tmp_path, mixed):
    """The race the size checks cannot close (a truncation between check and read); in
    a mixture, the file of whichever source it was."""
    import signal

    from reader import Loader, Mix

    root = make(tmp_path / "ds", n=400, per_shard=100)
    source = root
    if mixed:
        source = Mix({"other": make(tmp_path / "other", n=100, per_shard=100), "ds": root})
    loader = Loader(source, batch_size=4, num_workers=2)
    try:
        epoch = iter(loader)
        next(epoch)
        os.truncate(root / "shard-00002.rec", 100)
        os.kill(epoch.workers[0].pid, signal.SIGBUS)
        with pytest.raises(FormatError, match=r"shard-00002\.rec") as err:
            for _ in epoch:
                pass
        assert "SIGBUS" in str(err.value) or "truncated while mapped" in str(err.value)
    finally:
        loader.close()


# -- many shards under a low descriptor limit ----------------------------------------------

@pytest.fixture(scope="module")
def many_shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("many") / "ds"
    in_child("write_many_shards", str(root), 2000)
    return root


def write_many_shards(root: str, n: int) -> None:
    with DatasetWriter(root, FIELDS, records_per_shard=1, durable=False) as w:
        for i in range(n):
            w.write({"data": b"x" * 16, "label": i, "key": f"k{i}", "doc": {"i": i}})


@pytest.mark.parametrize(("case", "args"), [("read_all", (False, False)), ("loader_epoch", (16,)),
                                            ("inspect", ("show", "1999"))])
def test_two_thousand_shards_under_ulimit_256(many_shards, case, args):
    outcome = hostile("with_fd_limit", 256, case, str(many_shards), *args,
                       label=f"2000 shards, ulimit -n 256: {case}")
    check(outcome, "ok")


def descriptors_into(folder: Path) -> int:
    """This process's descriptors open on files in ``folder`` (maps hold one each)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(str(folder) + os.sep)
    return count


def test_an_open_shard_holds_two_descriptors_and_at_most_max_open_stay_open(pristine):
    ds = open_shards(pristine, max_open=2)
    try:
        # More shards than max_open: each is opened (and checked) when first read.
        assert descriptors_into(pristine) == 0
        assert sum(s is not None for s in ds.shards) == 0
        for i in range(len(ds)):
            ds[i]
        # Read a record at a time, they are not mapped: only the shard read last holds
        # its two files open (ShardSet._ready releases the others' until their next read).
        assert descriptors_into(pristine) == 2
        assert sum(s is not None for s in ds.shards) == 2
        assert not any(s.mapped for s in ds.shards if s is not None)
        views = ds.payloads(np.arange(len(ds)), "data")  # a batch over more shards than max_open
        assert descriptors_into(pristine) == 4  # the first shard's records were copied
        assert [bytes(v[:1]) for v in views[::8]] == [bytes([i]) for i in (0, 8, 16)]
        ds.close()
        assert descriptors_into(pristine) == 2  # the views still held keep their maps
        del views
        assert descriptors_into(pristine) == 0
    finally:
        ds.close()


# -- a dataset replaced under its path ------------------------------------------------------

@pytest.mark.parametrize("case", ["unpickle_after_replace", "reopen_after_replace"])
def test_a_replaced_dataset_is_refused(pristine, tmp_path, case):
    root = hostile_copy(pristine, tmp_path)
    outcome = hostile(case, str(root), label=case.replace("_", " "))
    check(outcome)
    assert "was replaced since it was opened" in outcome.message and str(root) in outcome.message


def test_an_unchanged_dataset_unpickles_and_reads(pristine):
    ds = pickle.loads(pickle.dumps(open_shards(pristine, max_open=1)))
    assert [ds[i]["key"] for i in (0, 23)] == ["k0", "k23"]


# -- an index validated block by block (issue 36) -------------------------------------------
#
# A shard's index entries are checked when a record of their block (BLOCK records) is
# first read from the mapping, not the whole index at the first read: a damaged entry
# must still be refused, typed and named, before its payload is ever sliced.

LAZY_RECORDS = 3 * BLOCK + 10  # one shard of four blocks, the last one short


@pytest.fixture(scope="module")
def one_big_shard(tmp_path_factory) -> Path:
    return make(tmp_path_factory.mktemp("lazy") / "ds", n=LAZY_RECORDS, per_shard=LAZY_RECORDS)


def damage_entry(root: Path, record: int, field: int, *, offset=None, length=None,
                 offset_of: tuple[int, int] | None = None) -> str:
    """Rewrite one index entry of shard 0 (its offset, length, or the offset of the
    entry ``offset_of``); the header and file sizes stay sound, so opening passes."""
    path = root / "shard-00000.idx"
    raw = bytearray(path.read_bytes())
    offsets_at, lengths_at, _, _ = index_sections(LAZY_RECORDS, len(FIELDS))
    cell = record * len(FIELDS) + field
    if offset_of is not None:
        at = offsets_at + 8 * (offset_of[0] * len(FIELDS) + offset_of[1])
        offset = int.from_bytes(raw[at : at + 8], "little")
    if offset is not None:
        raw[offsets_at + 8 * cell : offsets_at + 8 * cell + 8] = offset.to_bytes(8, "little")
    if length is not None:
        raw[lengths_at + 8 * cell : lengths_at + 8 * cell + 8] = length.to_bytes(8, "little")
    path.write_bytes(raw)
    return "shard-00000.idx"


def read_lazily(path: str, how: str, index: int, max_open: int = 0) -> None:
    """Read sound records of block 0 first (they pass: their block is sound), then
    ``index`` the way ``how`` says (``max_open``: opened on first use, read unmapped)."""
    with open_shards(path, check_crc=True, max_open=max_open or None) as ds:
        assert bytes(ds[0]["data"]) == bytes([0]) * 64
        ds.payloads([1, 2], "data")
        ds.scalars([3], "label")
        if how == "item":
            bytes(ds[index]["data"])
        elif how == "get":
            ds.get(index, "data")
        elif how == "payloads":
            ds.payloads([4, index], "data")
        elif how == "scalars":
            ds.scalars([5, index], "label")
        elif how == "values":
            ds.values([index], "doc")


LAZY = [
    # (label, damage, how to read, index read, record and field the error must name)
    ("offset past the end, item", dict(record=600, field=0, offset=10**12), "item", 600,
     (600, 0)),
    ("offset past the end, batch", dict(record=600, field=0, offset=10**12), "payloads", 600,
     (600, 0)),
    ("length that wraps the sum, scalars", dict(record=600, field=1, length=2**64 - 8),
     "scalars", 600, (600, 1)),
    ("misaligned offset, get", dict(record=600, field=0, offset=65), "get", 600, (600, 0)),
    ("overlapping the record before, values", dict(record=600, field=3, offset_of=(599, 3)),
     "values", 600, (600, 3)),
    # The first entry of a block is compared with the last one before it, so that one
    # is checked too: reading record 2*BLOCK names the bad entry in the block before.
    ("last entry before the block read", dict(record=2 * BLOCK - 1, field=3, offset=10**12),
     "item", 2 * BLOCK, (2 * BLOCK - 1, 3)),
]


@pytest.mark.parametrize(("label", "damage", "how", "index", "names"), LAZY,
                         ids=[c[0] for c in LAZY])
def test_a_damaged_entry_in_a_lazily_validated_index_is_named(one_big_shard, tmp_path, label,
                                                              damage, how, index, names):
    root = hostile_copy(one_big_shard, tmp_path)
    damage_entry(root, **damage)
    outcome = hostile("read_lazily", str(root), how, index, label=f"lazy index: {label}")
    record, field = names
    check(outcome, names="shard-00000.idx")
    assert f"record {record}" in outcome.message, str(outcome)
    assert f"index entry for field {field}" in outcome.message, str(outcome)


def test_a_damaged_entry_fails_a_loader_epoch_typed(one_big_shard, tmp_path):
    root = hostile_copy(one_big_shard, tmp_path)
    damage_entry(root, 600, 0, offset=10**12)
    check(hostile("loader_epoch", str(root), 64, label="lazy index: Loader epoch"),
          names="shard-00000.idx")


def test_only_the_blocks_read_are_validated_and_a_whole_shard_read_checks_all(one_big_shard,
                                                                             tmp_path):
    root = hostile_copy(one_big_shard, tmp_path)
    damage_entry(root, 3 * BLOCK + 5, 0, offset=10**12)  # in the last block
    with open_shards(root) as ds:
        ds.payloads([0, BLOCK + 1, BLOCK + 2], "data")
        shard = ds.shards[0]
        assert shard._blocks.tolist() == [True, True, False, False] and not shard.validated
        assert bytes(ds[2 * BLOCK]["data"]) == bytes([2 * BLOCK % 251]) * (64 + 2 * BLOCK)
        with pytest.raises(FormatError, match=f"record {3 * BLOCK + 5}"):
            ds.shard(0)  # the whole index: what TokenBlocks and verify read
        with pytest.raises(FormatError, match=f"record {3 * BLOCK + 5}"):
            ds.payloads([3 * BLOCK], "data")
    # A fresh mapping trusts nothing checked before.
    with open_shards(root) as ds, pytest.raises(FormatError, match=f"record {3 * BLOCK + 5}"):
        ds.payloads([3 * BLOCK + 9], "data")


def test_a_sound_index_validated_block_by_block_ends_validated(one_big_shard):
    with open_shards(one_big_shard) as ds:
        for i in range(0, LAZY_RECORDS, BLOCK):
            ds.payloads([i], "data")
        assert ds.shards[0].validated
        assert [bytes(v[:1]) for v in ds.payloads(np.arange(LAZY_RECORDS), "data")] == [
            bytes([i % 251]) for i in range(LAZY_RECORDS)]


# -- a shard read before it is mapped (issue 36) ---------------------------------------------
#
# A dataset of many shards (here: more than max_open) opens each on first use and reads its
# first few records with pread, holding its files open only while it is read: the same
# records, the same checks, the same typed errors as through a map.

def read_all_unmapped(path: str) -> None:
    """:func:`read_all`, each shard opened on first use and read record by record, unmapped."""
    with open_shards(path, check_crc=True, max_open=1) as ds:
        for i in range(len(ds)):
            bytes(ds[i]["data"])
            ds.get(i, "doc")
        assert not any(s.mapped for s in ds.shards if s is not None)
        everything = np.arange(len(ds))
        ds.scalars(everything, "label")
        ds.payloads(everything, "data")


@pytest.mark.parametrize(("label", "build", "case", "args"),
                         [h for h in HOSTILE if h[2] == "read_all" and not h[3]],
                         ids=[h[0] for h in HOSTILE if h[2] == "read_all" and not h[3]])
def test_hostile_dataset_read_unmapped_gives_a_typed_error(pristine, tmp_path, label, build,
                                                           case, args):
    root = hostile_copy(pristine, tmp_path)
    names = build(root)
    check(hostile("read_all_unmapped", str(root), label=f"unmapped: {label}"), names=names)


def test_a_sound_dataset_reads_unmapped(pristine):
    check(hostile("read_all_unmapped", str(pristine), label="unmapped: sound"), "ok")


@pytest.fixture(scope="module")
def two_big_shards(tmp_path_factory) -> Path:
    return make(tmp_path_factory.mktemp("unmapped") / "ds", n=2 * LAZY_RECORDS,
                per_shard=LAZY_RECORDS)


@pytest.mark.parametrize(("label", "damage", "how", "index", "names"), LAZY,
                         ids=[c[0] for c in LAZY])
def test_a_damaged_entry_read_unmapped_is_named(two_big_shards, tmp_path, label, damage, how,
                                                index, names):
    root = hostile_copy(two_big_shards, tmp_path)
    damage_entry(root, **damage)
    outcome = hostile("read_lazily", str(root), how, index, 1, label=f"unmapped: {label}")
    record, field = names
    check(outcome, names="shard-00000.idx")
    assert f"record {record}" in outcome.message, str(outcome)
    assert f"index entry for field {field}" in outcome.message, str(outcome)


def test_unmapped_reads_are_the_mapped_ones_and_map_past_the_budget(two_big_shards):
    picks = [0, 5, BLOCK + 3, LAZY_RECORDS - 1, LAZY_RECORDS, LAZY_RECORDS + 7]
    with open_shards(two_big_shards) as mapped, open_shards(two_big_shards, max_open=1) as ds:
        for i in picks:
            assert bytes(ds[i]["data"]) == bytes(mapped[i]["data"])
            assert ds.get(i, "doc") == mapped.get(i, "doc")
            assert bytes(ds.payload(i, "key")) == bytes(mapped.payload(i, "key"))
        for a, b in zip(ds.spans(picks, "data"), mapped.spans(picks, "data"), strict=True):
            assert a.tolist() == b.tolist()
        assert ds.scalars(picks, "label").tolist() == mapped.scalars(picks, "label").tolist()
        assert ds.values(picks, "key") == mapped.values(picks, "key")
        shard = ds.shards[1]
        assert shard is not None and not shard.mapped and not shard.validated
        assert not shard._blocks.any()  # an unmapped shard checks the entries it reads
        # A read of more records at once maps the shard; what it checked carries over.
        many = np.arange(LAZY_RECORDS, LAZY_RECORDS + SPARSE_READ + 1)
        assert [bytes(v) for v in ds.payloads(many, "data")] == [
            bytes(v) for v in mapped.payloads(many, "data")]
        assert shard.mapped and ds.shards[1] is shard
        # So does a read past the budget, one record at a time.
        ds.payloads([0], "data")
        first = ds.shards[0]
        for n in range(SPARSE_RECORDS):
            assert not first.mapped, n
            assert bytes(ds[n % LAZY_RECORDS]["data"]) == bytes(mapped[n % LAZY_RECORDS]["data"])
        assert first.mapped


def test_a_batch_over_many_unmapped_shards_holds_two_descriptors(tmp_path, monkeypatch):
    # 100 shards, each opened on first use (as a dataset of more than EAGER_SHARDS is).
    monkeypatch.setattr("formats.shard.shard_set.EAGER_SHARDS", 10)
    root = make(tmp_path / "ds", n=200, per_shard=2)
    seen = []
    with open_shards(root) as ds:
        real_ready = ds._ready

        def ready(s, *args):
            reader = real_ready(s, *args)
            seen.append(descriptors_into(root))
            return reader

        ds._ready = ready
        assert [bytes(v[:1]) for v in ds.payloads(np.arange(0, 200, 2), "data")] == [
            bytes([i % 251]) for i in range(0, 200, 2)]
        assert ds.scalars(np.arange(1, 200, 2), "label").tolist() == [
            i % 3 for i in range(1, 200, 2)]
        assert not any(s.mapped for s in ds.shards) and all(ds.shards)
    assert len(seen) == 200 and max(seen) <= 2
    assert descriptors_into(root) == 0


def read_replaced_unmapped(path: str) -> None:
    """Read a record of shard 0 unmapped, another shard (which releases shard 0's files),
    swap a new dataset in, then read another record of shard 0."""
    from formats.shard import shard_set

    shard_set.EAGER_SHARDS = 0  # each shard opened on first use, none closed (max_open)
    with open_shards(path) as ds:
        ds[0]
        ds[len(ds) - 1]
        _swap_in_new_dataset(Path(path))
        ds[LAZY_RECORDS - 1]  # another page of the same files: reopened, and checked


def truncate_unmapped(path: str, name: str) -> None:
    """Read a record of shard 0 unmapped, truncate one of its files, read another."""
    with open_shards(path, max_open=1) as ds:
        ds[0]
        os.truncate(Path(path) / name, 100)
        bytes(ds[LAZY_RECORDS - 1]["data"])


def test_a_dataset_replaced_between_unmapped_reads_is_refused(two_big_shards, tmp_path):
    root = hostile_copy(two_big_shards, tmp_path)
    outcome = hostile("read_replaced_unmapped", str(root), label="unmapped: replaced")
    check(outcome, names="shard-00000")
    assert "was replaced since it was opened" in outcome.message


@pytest.mark.parametrize("name", ["shard-00000.rec", "shard-00000.idx"])
def test_a_file_truncated_between_unmapped_reads_is_refused(two_big_shards, tmp_path, name):
    root = hostile_copy(two_big_shards, tmp_path)
    outcome = hostile("truncate_unmapped", str(root), name, label=f"unmapped: {name} truncated")
    check(outcome, names=name)
    assert "truncated" in outcome.message


def test_a_dataset_replaced_during_a_batch_is_refused_and_its_shards_forgotten(
        pristine, tmp_path, monkeypatch):
    # A batch checks the manifest once, after opening its shards (ShardSet._check_opened).
    monkeypatch.setattr("formats.shard.shard_set.EAGER_SHARDS", 0)
    root = hostile_copy(pristine, tmp_path)
    with open_shards(root) as ds:
        real_ready = ds._ready

        def ready(s, records=None, opened=None):
            reader = real_ready(s, records, opened)
            if s == 0:
                _swap_in_new_dataset(root)  # shards 1 and 2 are then the new dataset's
            return reader

        ds._ready = ready
        with pytest.raises(ManifestError, match="replaced since it was opened"):
            ds.scalars(np.arange(len(ds)), "label")
        assert not any(ds.shards) and not any(ds._identity)
        with pytest.raises(ManifestError, match="replaced since it was opened"):
            ds.payloads([0], "data")


def test_unmapped_shards_read_from_many_threads_read_right(tmp_path, monkeypatch):
    # Threads release each other's descriptors (ShardSet._ready): a read never uses one
    # closed, or reused by a file opened meanwhile, under it (_ShardFile's lock).
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr("formats.shard.shard_set.EAGER_SHARDS", 10)
    root = make(tmp_path / "ds", n=400, per_shard=4)
    order = np.random.default_rng(5).permutation(400).tolist()
    with open_shards(root) as ds, ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: (bytes(ds[i]["data"]), ds.get(i, "key")), order))
        assert not any(s.mapped for s in ds.shards)
    assert got == [(bytes([i % 251]) * (64 + i), f"k{i}") for i in order]
