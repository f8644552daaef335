"""TokenBlocks over a reader.Mix: blocks of several token sources by weight, exactly
once per pass across world sizes, bit-for-bit resume in a new process, re-planning,
the ledger, and what is refused."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import reader
from formats import DatasetWriter, Field
from formats.errors import ArgumentError, CorruptRecordError
from reader.errors import LedgerError, LoaderError, StateError
from reader.ledger import diff_ledgers
from tests.helpers_paths import ROOT

BLOCK = 8
# Blocks per source. A source's token t is BASE * (its number) + t, so a row names its
# source and block, and must be the stream's tokens [block * BLOCK, block * BLOCK + BLOCK].
BLOCKS = {"web": 240, "code": 120, "extra": 60}
NUMBER = {"web": 1, "code": 2, "extra": 3, "wide": 4, "bare": 5}
BASE = 1_000_000


def write_source(root, name, blocks, *, dtype="int32", field="tokens", seed=0):
    """A token dataset of exactly ``blocks`` blocks, in documents of 0 to 150 tokens
    (empty ones too), four to a shard."""
    total = blocks * BLOCK + 1
    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < total:
        lengths.append(int(rng.integers(0, 151)) if rng.random() > 0.1 else 0)
    lengths[-1] -= sum(lengths) - total
    tokens = NUMBER[name] * BASE + np.arange(total)
    spec = Field(field, "ndarray", dtype=dtype, shape=(None,))
    with DatasetWriter(root, [spec], shard_size=None, records_per_shard=4,
                       durable=False) as w:
        at = 0
        for n in lengths:
            w.write({field: tokens[at:at + n].astype(dtype)})
            at += n
    return str(root)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokmix")
    return {n: write_source(root / n, n, k, seed=i) for i, (n, k) in enumerate(BLOCKS.items())}


def named(rows):
    """(source, block) of each row, after checking the row is that block's tokens."""
    rows = np.atleast_2d(np.asarray(rows))
    out = []
    for row in rows:
        name = next(n for n, v in NUMBER.items() if v == int(row[0]) // BASE)
        start = int(row[0]) % BASE
        assert start % BLOCK == 0, row
        assert np.array_equal(row, NUMBER[name] * BASE + start + np.arange(BLOCK + 1)), row
        out.append((name, start // BLOCK))
    return out


def take(tb, steps):
    """This rank's next ``steps`` batches (copies: views of a shard outlive nothing)."""
    it = iter(tb)
    return [np.array(next(it), copy=True) for _ in range(steps)]


def pair(sources):
    return {n: sources[n] for n in ("web", "code")}


# -- a mixture's blocks ----------------------------------------------------------------

@pytest.mark.parametrize("shuffle", ["block", "full", False])
def test_one_pass_by_size_serves_every_block_of_each_source_once(sources, shuffle):
    mix = reader.Mix(pair(sources))  # by size: an epoch is one pass of each
    with reader.TokenBlocks(mix, BLOCK, 4, shuffle=shuffle, seed=1) as tb:
        assert len(tb) == 360 // 4 and tb.num_blocks == 360
        got = named(np.concatenate(list(tb)))
        assert tb.state_dict()["epoch"] == 1
    assert sorted(got) == sorted((n, b) for n in ("web", "code") for b in range(BLOCKS[n]))
    if shuffle:
        web = [b for n, b in got if n == "web"]
        assert web != sorted(web)
    # blocks mix: both sources within every stretch of 40 blocks
    assert all({n for n, _ in got[i:i + 40]} == {"web", "code"} for i in range(0, 360, 40))


def test_each_source_keeps_its_own_passes(sources):
    mix = reader.Mix(pair(sources), weights={"web": 1, "code": 1})
    with reader.TokenBlocks(mix, BLOCK, 10, seed=2) as tb:
        got = named(np.concatenate(take(tb, 36)))  # about 180 of each: code runs out
    code = [b for n, b in got if n == "code"]
    web = [b for n, b in got if n == "web"]
    assert len(code) > 150 and len(web) > 150
    assert sorted(code[:120]) == list(range(120))
    again = code[120:]  # its second pass, a new permutation
    assert len(set(again)) == len(again) and again != code[:len(again)]
    assert len(set(web)) == len(web)  # web's first pass goes on


def test_one_block_at_a_time_is_the_same_stream_and_resumes_into_batches(sources):
    mix = reader.Mix(pair(sources), weights={"web": 0.6, "code": 0.4})
    with reader.TokenBlocks(mix, BLOCK, 5, seed=3) as tb:
        stream = np.concatenate(take(tb, 6))
    with reader.TokenBlocks(mix, BLOCK, None, seed=3) as tb:
        it = iter(tb)
        views = [next(it) for _ in range(10)]
        one = np.stack([np.array(v, copy=True) for v in views])
        state = tb.state_dict()
        assert any(not v.flags.writeable for v in views)  # zero-copy views of a shard
    assert np.array_equal(one, stream[:10])
    with reader.TokenBlocks(mix, BLOCK, 5, seed=3) as tb:
        tb.load_state_dict(state)  # another batch size: the next unserved block
        assert np.array_equal(np.concatenate(take(tb, 4)), stream[10:30])


@pytest.mark.parametrize("batch_size", [None, 3, 40])
@pytest.mark.parametrize("shuffle,world", [("block", 1), ("full", 3), (False, 2)])
def test_small_chunks_and_either_copy_serve_the_same_blocks(sources, monkeypatch, batch_size,
                                                            shuffle, world):
    import reader.batching.tokens as tokens

    mix = reader.Mix(pair(sources), weights={"web": 3, "code": 2})

    def epoch(rank):
        with reader.TokenBlocks(mix, BLOCK, batch_size, shuffle=shuffle, seed=3, rank=rank,
                                world_size=world) as tb:
            return [np.atleast_2d(b).copy() for b in tb]

    whole = [epoch(r) for r in range(world)]
    assert sum(len(named(np.concatenate(w))) for w in whole) == 360 // (
        world * (batch_size or 1)) * world * (batch_size or 1)
    # a chunk per batch or two, and every shard's blocks of a batch by gather and scatter
    monkeypatch.setattr(tokens, "_CHUNK", 4)
    monkeypatch.setattr(tokens, "_ROW_COPIES", 0)
    for r in range(world):
        chunked = epoch(r)
        assert len(chunked) == len(whole[r])
        assert all(np.array_equal(a, b) for a, b in zip(chunked, whole[r], strict=True))


def test_a_damaged_record_of_a_source_is_named(sources, tmp_path):
    bad = write_source(tmp_path / "code", "code", 120, seed=1)
    data = sorted((tmp_path / "code").glob("*.rec"))[0]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    mix = reader.Mix({"web": sources["web"], "code": bad})
    with reader.TokenBlocks(mix, BLOCK, 4, shuffle=False) as tb, \
            pytest.raises(CorruptRecordError, match="checksum"):
        list(tb)


# -- elastic: 8 ranks, then 6, then 4 ------------------------------------------------------

def run_ranks(mix, world, batch_size, state, steps, shuffle):
    """Every rank of a job (simulated in this process) for ``steps`` steps (None: to
    the epoch's end) from ``state``: the blocks all ranks served, and the state."""
    got, states, counts = [], [], []
    for r in range(world):
        with reader.TokenBlocks(mix, BLOCK, batch_size, shuffle=shuffle, seed=3, rank=r,
                                world_size=world) as tb:
            if state is not None:
                tb.load_state_dict(state)
            n = len(tb) - tb.position if steps is None else steps
            batches = take(tb, n)
            assert all(b.shape == (batch_size, BLOCK + 1) for b in batches)  # all full
            got += named(np.concatenate(batches))
            counts.append(len(batches))
            states.append(tb.state_dict())
    assert all(s == states[0] for s in states)  # the state is global
    assert len(set(counts)) == 1  # every rank the same number of steps
    return got, states[0]


@pytest.mark.parametrize("shuffle", ["block", "full"])
def test_elastic_pass_is_exactly_once(sources, shuffle):
    mix = reader.Mix(pair(sources))  # by size: every source finishes its pass together
    a, s1 = run_ranks(mix, 8, 3, None, 5, shuffle)  # steps of 24 blocks
    b, s2 = run_ranks(mix, 6, 2, json.loads(json.dumps(s1)), 7, shuffle)  # of 12
    c, s3 = run_ranks(mix, 4, 3, s2, None, shuffle)  # of 12, to the epoch's end
    assert (s1["position"], s2["position"]) == (120, 204)
    everything = a + b + c
    assert len(everything) == 360
    assert sorted(everything) == sorted((n, k) for n in ("web", "code")
                                        for k in range(BLOCKS[n]))
    assert s3["epoch"] == 1 and s3["position"] == 360


# -- resume bit for bit, in a new process -------------------------------------------------

_SCRIPT = """
import json, sys
import numpy as np
import reader
sources, shuffle, batch = json.loads(sys.argv[1]), sys.argv[4], int(sys.argv[5])
state = json.loads(sys.argv[2]) if sys.argv[2] != "-" else None
mix = reader.Mix(sources, weights={"web": 0.7, "code": 0.3})
with reader.TokenBlocks(mix, 8, batch, shuffle=shuffle, seed=4, ledger=True) as tb:
    if state:
        tb.load_state_dict(state)
    it = iter(tb)
    out = [next(it).tolist() for _ in range(int(sys.argv[3]))]
    print(json.dumps({"batches": out, "state": tb.state_dict()}))
"""


@pytest.mark.parametrize("shuffle", ["block", "full"])
def test_resume_bit_for_bit_in_a_new_process(sources, tmp_path, shuffle):
    """10 batches straight against 5, a state, a new process and 5 more."""
    script = tmp_path / "resume.py"
    script.write_text(_SCRIPT)

    def run(state, steps):
        res = subprocess.run([sys.executable, str(script), json.dumps(pair(sources)),
                              json.dumps(state) if state else "-", str(steps), shuffle, "6"],
                             capture_output=True, text=True, cwd=ROOT, timeout=120,
                             env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout.strip().splitlines()[-1])

    straight = run(None, 10)
    first = run(None, 5)
    rest = run(first["state"], 5)
    assert len(straight["batches"]) == 10
    assert np.array_equal(np.asarray(first["batches"] + rest["batches"]),
                          np.asarray(straight["batches"]))
    assert rest["state"]["ledger"] == straight["state"]["ledger"]
    assert rest["state"]["ledger"]["steps"] == 10
    names = {n for n, _ in named(np.concatenate(np.asarray(straight["batches"])))}
    assert names == {"web", "code"}


def test_ledger_log_of_a_resumed_run_matches_a_straight_one(sources, tmp_path):
    mix = reader.Mix(pair(sources))
    kw = dict(shuffle="full", seed=5, rank=1, world_size=2)
    with reader.TokenBlocks(mix, BLOCK, 4, ledger=tmp_path / "a-{rank}.jsonl", **kw) as tb:
        take(tb, 8)
    with reader.TokenBlocks(mix, BLOCK, 4, ledger=tmp_path / "b-{rank}.jsonl", **kw) as tb:
        take(tb, 3)
        state = tb.state_dict()
    with reader.TokenBlocks(mix, BLOCK, 4, ledger=tmp_path / "b-{rank}.jsonl", **kw) as tb:
        tb.load_state_dict(state)
        take(tb, 5)
    assert diff_ledgers(tmp_path / "a-1.jsonl", tmp_path / "b-1.jsonl") is None
    with reader.TokenBlocks(mix, BLOCK, 4, ledger=tmp_path / "c-{rank}.jsonl",
                            **{**kw, "seed": 6}) as tb:
        take(tb, 8)
    assert diff_ledgers(tmp_path / "a-1.jsonl", tmp_path / "c-1.jsonl")["step"] == 1
    with reader.TokenBlocks(mix, BLOCK, 4, ledger=tmp_path / "a-{rank}.jsonl", **kw) as tb, \
            pytest.raises(LedgerError, match="another run"):
        take(tb, 1)  # a fresh run never appends to a ledger holding steps
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep\n")
    (tmp_path / "l-1.jsonl").symlink_to(target)
    with reader.TokenBlocks(mix, BLOCK, 4, ledger=tmp_path / "l-{rank}.jsonl", **kw) as tb, \
            pytest.raises(LedgerError, match="cannot open the ledger"):
        take(tb, 1)
    assert target.read_text() == "keep\n"


def test_one_dataset_keeps_a_ledger_too(sources):
    with reader.TokenBlocks(sources["web"], BLOCK, 4, ledger=True) as tb:
        take(tb, 2)
        state = tb.state_dict()
    with reader.TokenBlocks(sources["web"], BLOCK, 4, ledger=True) as tb:
        take(tb, 2)
        assert tb.state_dict()["ledger"] == state["ledger"]
        with pytest.raises(LoaderError, match="describes a mixture"):
            tb.plan_report()
    with reader.TokenBlocks(sources["web"], BLOCK, 4) as tb:
        tb.load_state_dict(state)  # a state with a ledger loads without one
        assert tb.state_dict()["batch"] == 2


# -- re-planning -----------------------------------------------------------------------------

def test_replan_mid_pass_serves_no_block_twice_within_its_pass(sources):
    half = reader.Mix(pair(sources), weights={"web": 0.5, "code": 0.5})
    with reader.TokenBlocks(half, BLOCK, 4, seed=2) as tb:
        first = named(np.concatenate(take(tb, 10)))
        state = tb.state_dict()
    skewed = reader.Mix(sources, weights={"web": 0.9, "code": 0.1, "extra": 0.3})  # added
    with reader.TokenBlocks(skewed, BLOCK, 4, seed=2) as tb:
        tb.load_state_dict(state)
        report = tb.plan_report()
        second = named(np.concatenate(take(tb, 30)))
    together = first + second
    for name, size in BLOCKS.items():
        mine = [b for n, b in together if n == name]
        assert len(mine) == len(set(mine)) <= size, name
    assert report["web"]["served"] == sum(n == "web" for n, _ in first)
    assert report["web"]["blocks"] == 240 and report["web"]["weight"] == pytest.approx(0.9 / 1.3)
    assert report["extra"]["served"] == 0 and report["extra"]["in_plan"]
    web, code = (sum(n == s for n, _ in second) for s in ("web", "code"))
    assert web > 5 * code  # the new weights hold after the state
    dropped = reader.Mix({"web": sources["web"]})
    with reader.TokenBlocks(dropped, BLOCK, 4, seed=2) as tb:
        tb.load_state_dict(state)
        rep = tb.plan_report()
        third = named(np.concatenate(take(tb, 20)))
    assert not rep["code"]["in_plan"] and rep["code"]["served"] == sum(
        n == "code" for n, _ in first)
    mine = [b for n, b in first + third if n == "web"]
    assert len(mine) == len(set(mine))


# -- what is refused ---------------------------------------------------------------------------

def test_refusals(sources, tmp_path):
    wide = write_source(tmp_path / "wide", "wide", 20, dtype="int64")
    with pytest.raises(ArgumentError, match=r"source 'web' .* int32, source 'wide' .* int64"):
        reader.TokenBlocks(reader.Mix({"web": sources["web"], "wide": wide}), BLOCK, 4)
    bare = write_source(tmp_path / "bare", "bare", 20, field="ids")
    with pytest.raises(ArgumentError, match="no field 'tokens' in source 'bare'"):
        reader.TokenBlocks(reader.Mix({"web": sources["web"], "bare": bare}), BLOCK, 4)
    short = write_source(tmp_path / "short", "extra", 1)
    with pytest.raises(ArgumentError, match=r"'tokens' of source 'short' .* holds 9 in all"):
        reader.TokenBlocks(reader.Mix({"web": sources["web"], "short": short}), 16, 4)
    mix = reader.Mix(pair(sources))
    with pytest.raises(ArgumentError, match="drop_last"):
        reader.TokenBlocks(mix, BLOCK, 4, drop_last=True)

    with reader.TokenBlocks(sources["web"], BLOCK, 4) as single:
        one = single.state_dict()
    with reader.TokenBlocks(mix, BLOCK, 4) as tb:
        many = tb.state_dict()
        with pytest.raises(StateError, match="a mixture resumes only from a mixture's state"):
            tb.load_state_dict(one)
    with reader.TokenBlocks(sources["web"], BLOCK, 4) as tb, \
            pytest.raises(StateError, match=r"over a reader\.Mix \(of 'web', 'code'\)"):
        tb.load_state_dict(many)
    with reader.TokenBlocks(mix, 2 * BLOCK, 4) as tb, pytest.raises(StateError, match="block_size"):
        tb.load_state_dict(many)
    with reader.TokenBlocks(mix, BLOCK, 4, seed=9) as tb, pytest.raises(StateError, match="seed"):
        tb.load_state_dict(many)
    other = write_source(tmp_path / "web2", "web", 100)
    with reader.TokenBlocks(reader.Mix({"web": other, "code": sources["code"]}), BLOCK, 4) as tb, \
            pytest.raises(StateError, match="'web' had 240 blocks"):
        tb.load_state_dict(many)
    # a Loader's mixture (of records) and a TokenBlocks' (of blocks) never take each other's
    with reader.Loader(mix, 4, decode=False, num_workers=0) as lo:
        records = lo.state_dict()
        with pytest.raises(StateError, match="saved by a TokenBlocks"):
            lo.load_state_dict(many)
    with reader.TokenBlocks(mix, BLOCK, 4) as tb, \
            pytest.raises(StateError, match="saved by a Loader"):
        tb.load_state_dict(records)
