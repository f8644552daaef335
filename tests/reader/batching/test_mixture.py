"""Mixtures: proportions, exactly-once passes across world sizes, re-planning, the ledger."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import reader
from formats.errors import ArgumentError, ArgumentTypeError
from reader.batching.arrangement import Arrangement, integer_weights
from reader.errors import LedgerError, LoaderError, StateError
from reader.ledger import diff_ledgers
from tests.helpers_paths import ROOT
from tests.helpers_reader import CropPipeline, make_dataset

SIZES = {"a": 300, "b": 200, "c": 100}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    return {n: str(make_dataset(root / n, size, records_per_shard=50, seed=size))
            for n, size in SIZES.items()}


def raw(mix, batch_size, **kw):
    kw.setdefault("num_workers", 0)
    return reader.Loader(mix, batch_size, decode=False, fields=("label",), **kw)


def served(lo, steps):
    """(source name, record) of this rank's next ``steps`` batches, as read back."""
    ds = lo.dataset
    out = []
    it = iter(lo)
    for _ in range(steps):
        next(it)
        ids = lo.sampler.batch(lo.epoch, lo.position - 1)
        src = np.searchsorted(ds.offsets, ids, side="right") - 1
        out += [(ds.names[s], int(i - ds.offsets[s])) for s, i in zip(src, ids, strict=True)]
    return out


# -- the arrangement: a pure function of (seed, position) -------------------------------

def test_proportions_hold_for_every_prefix():
    weights = [0.5, 0.3, 0.15, 0.05]
    a = Arrangement(integer_weights(weights), seed=7)
    src, _ = a(np.arange(100_000))
    for stop in range(10_000, 100_001, 10_000):
        share = np.bincount(src[:stop], minlength=4) / stop
        se = np.sqrt(np.asarray(weights) * (1 - np.asarray(weights)) / stop)
        assert (np.abs(share - weights) < 4 * se).all(), (stop, share)
    # no long runs: a run of one source is bounded by the block's layout
    runs = np.diff(np.flatnonzero(np.diff(src)))
    assert runs.max() < 64


def test_each_source_numbered_in_stream_order_and_counts_exact_per_cycle():
    a = Arrangement([1000, 2000, 3000, 7], seed=3)
    src, number = a(np.arange(2 * a.cycle + 5))
    for s in range(4):
        mine = number[src == s]
        assert (mine == np.arange(mine.size)).all()  # any prefix serves a prefix
    assert np.bincount(src[: a.cycle]).tolist() == a.counts
    for stop in (0, 1, 4095, 4096, 5000, a.cycle + 17):
        assert (a.taken(stop) == np.bincount(src[:stop], minlength=4)).all()


def test_arrangement_same_for_any_split_of_positions():
    a, b = Arrangement([5, 3], seed=1), Arrangement([5, 3], seed=1)
    g = np.arange(20_000)
    whole = a(g)
    parts = [b(g[r::7]) for r in range(7)]
    for r in range(7):
        assert (whole[0][r::7] == parts[r][0]).all() and (whole[1][r::7] == parts[r][1]).all()


# -- passes, ranks and resume -----------------------------------------------------------

def run_ranks(mix, world, batch_size, state, steps, shuffle):
    """Every rank of a job for ``steps`` steps (None: to the epoch's end) from ``state``."""
    got, states, counts = [], [], []
    for r in range(world):
        with raw(mix, batch_size, shuffle=shuffle, seed=3, rank=r, world_size=world) as lo:
            if state is not None:
                lo.load_state_dict(state)
            n = len(lo) - lo.position if steps is None else steps
            got += served(lo, n)
            counts.append(n)
            states.append(lo.state_dict())
    assert all(s == states[0] for s in states)  # the state is global
    assert len(set(counts)) == 1  # every rank the same number of steps
    return got, states[0]


@pytest.mark.parametrize("shuffle", ["full", "block", False])
def test_elastic_pass_is_exactly_once(sources, shuffle):
    mix = reader.Mix(sources)  # by size: one epoch is one pass of each
    a, s1 = run_ranks(mix, 8, 5, None, 5, shuffle)
    b, s2 = run_ranks(mix, 6, 5, s1, 4, shuffle)
    c, s3 = run_ranks(mix, 4, 7, s2, None, shuffle)
    everything = a + b + c
    assert len(everything) == sum(SIZES.values())
    assert sorted(everything) == sorted((n, r) for n, k in SIZES.items() for r in range(k))
    assert s3["epoch"] == 1 and s3["position"] == sum(SIZES.values())


def test_next_pass_is_a_new_permutation(sources):
    mix = reader.Mix(sources, weights={"a": 1, "b": 1, "c": 1})
    with raw(mix, 10, shuffle=True, seed=1) as lo:
        got = served(lo, 60)  # 200 samples of each source: c runs out after 100
    c = [r for n, r in got if n == "c"]
    assert sorted(c[:100]) == list(range(100)) and sorted(c[100:200]) == list(range(100))
    assert c[:100] != c[100:200]


def test_replan_serves_nothing_twice_within_a_pass(sources, tmp_path):
    two = {"a": sources["a"], "b": sources["b"]}
    half = reader.Mix(two, weights={"a": 0.5, "b": 0.5})
    with raw(half, 10, shuffle=True, seed=2) as lo:
        first = served(lo, 8)
        state = lo.state_dict()
    skewed = reader.Mix(sources, weights={"a": 0.9, "b": 0.1, "c": 0.3})  # c added
    with raw(skewed, 10, shuffle=True, seed=2) as lo:
        lo.load_state_dict(state)
        report = lo.plan_report()
        second = served(lo, 12)
    together = first + second
    for name, size in SIZES.items():
        mine = [r for n, r in together if n == name]
        assert len(mine) == len(set(mine)) <= size, name
    assert report["a"]["served"] == sum(n == "a" for n, _ in first)
    assert report["c"]["served"] == 0 and report["c"]["in_plan"]
    dropped = reader.Mix({"a": sources["a"]})
    with raw(dropped, 10, shuffle=True, seed=2) as lo:
        lo.load_state_dict(state)
        rep = lo.plan_report()
    assert not rep["b"]["in_plan"] and rep["b"]["served"] == sum(n == "b" for n, _ in first)


def test_state_is_small(sources):
    with raw(reader.Mix(sources), 10, ledger=True) as lo:
        served(lo, 3)
        import json
        assert len(json.dumps(lo.state_dict())) < 4096


def test_resume_bit_for_bit_images_workers_new_process(sources, tmp_path):
    """10 steps straight against 5, a checkpoint, a new process and 5 more."""
    script = tmp_path / "resume.py"
    script.write_text(f"""
import json, sys, numpy as np, reader
sys.path.insert(0, {str(ROOT)!r})
from tests.helpers_reader import CropPipeline
mix = reader.Mix({sources!r}, weights={{"a": 0.5, "b": 0.3, "c": 0.2}})
state = json.loads(sys.argv[1]) if sys.argv[1] != "-" else None
with reader.Loader(mix, 8, shuffle=True, seed=4, num_workers=int(sys.argv[2]),
                   transform=CropPipeline(), ledger=True) as lo:
    if state:
        lo.load_state_dict(state)
    it = iter(lo)
    out = [next(it) for _ in range(int(sys.argv[3]))]
    sums = [[int(b["image"].astype(np.int64).sum()), b["label"].tolist()] for b in out]
    print(json.dumps({{"batches": sums, "state": lo.state_dict()}}))
""")

    def run(state, workers, steps):
        import json
        res = subprocess.run([sys.executable, str(script), json.dumps(state) if state else "-",
                              str(workers), str(steps)], capture_output=True, text=True,
                             cwd=ROOT, timeout=120)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout.strip().splitlines()[-1])

    for workers in (0, 2):
        straight = run(None, workers, 10)
        first = run(None, workers, 5)
        rest = run(first["state"], 2 - workers, 5)  # and the other worker count
        assert first["batches"] + rest["batches"] == straight["batches"]
        assert rest["state"]["ledger"] == straight["state"]["ledger"]


def test_ledger_log_and_diff(sources, tmp_path):
    mix = reader.Mix(sources)
    log_a, log_b = tmp_path / "a-{rank}.jsonl", tmp_path / "b-{rank}.jsonl"
    with raw(mix, 10, shuffle=True, seed=1, ledger=log_a) as lo:
        served(lo, 6)
    with raw(mix, 10, shuffle=True, seed=1, ledger=log_b) as lo:
        served(lo, 3)
        state = lo.state_dict()
    with raw(mix, 10, shuffle=True, seed=1, ledger=log_b) as lo:
        lo.load_state_dict(state)
        served(lo, 3)
    a, b = tmp_path / "a-0.jsonl", tmp_path / "b-0.jsonl"
    assert diff_ledgers(a, b) is None
    with raw(mix, 10, shuffle=True, seed=9, ledger=tmp_path / "c.jsonl") as lo:
        served(lo, 6)
    d = diff_ledgers(a, tmp_path / "c.jsonl")
    assert d["step"] == 1 and d["rank"] == 0
    # a fresh run never appends to a ledger holding steps, nor to a file that is not one
    with raw(mix, 10, ledger=a) as lo, pytest.raises(LedgerError, match="another run"):
        served(lo, 1)
    other = tmp_path / "notes.txt"
    other.write_text("mine\n")
    with raw(mix, 10, ledger=other) as lo, pytest.raises(LedgerError, match="not a shardpack"):
        served(lo, 1)
    assert other.read_text() == "mine\n"



def test_ledger_read_only_disk(sources, small_disk):
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    with raw(reader.Mix(sources), 10, ledger=small_disk / "l.jsonl") as lo, \
            pytest.raises(LedgerError, match=r"cannot open the ledger .*Read-only"):
        served(lo, 1)


def test_ledger_full_disk(sources, small_disk):
    with open(small_disk / "fill", "wb") as f:  # leave about one page
        try:
            f.write(b"\0" * (64 << 10))
        except OSError:
            pass
    with raw(reader.Mix(sources), 10, ledger=small_disk / "l.jsonl") as lo, \
            pytest.raises(LedgerError, match=r"ledger .*No space left"):
        served(lo, 60)


def test_ledger_symlink_refused(sources, tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep\n")
    (tmp_path / "l.jsonl").symlink_to(target)
    with raw(reader.Mix(sources), 10, ledger=tmp_path / "l.jsonl") as lo, \
            pytest.raises(LedgerError, match="cannot open the ledger"):
        served(lo, 1)
    assert target.read_text() == "keep\n"


# -- what is refused ----------------------------------------------------------------------

def test_refusals(sources, tmp_path):
    with pytest.raises(ArgumentError, match="no weight for 'c'"):
        reader.Mix(sources, weights={"a": 1, "b": 1})
    with pytest.raises(ArgumentError, match="no source named 'z'"):
        reader.Mix(sources, weights={"a": 1, "b": 1, "c": 1, "z": 1})
    with pytest.raises(ArgumentError, match="finite number > 0"):
        reader.Mix(sources, weights={"a": 1, "b": 0, "c": 1})
    with pytest.raises(ArgumentTypeError):
        reader.Mix(["a"])
    with pytest.raises(ArgumentError, match="drop_last"):
        raw(reader.Mix(sources), 10, drop_last=True)
    with pytest.raises(ArgumentError, match="batch_sampler"):
        reader.Loader(reader.Mix(sources), batch_sampler=reader.AspectRatioBatches())
    with raw(sources["a"], 10) as single:
        state = single.state_dict()
    with raw(reader.Mix(sources), 10) as lo, pytest.raises(StateError, match="mixture"):
        lo.load_state_dict(state)
    with raw(reader.Mix(sources), 10, seed=1) as lo:
        state = lo.state_dict()
    with raw(reader.Mix(sources), 10, seed=2) as lo, pytest.raises(StateError, match="seed"):
        lo.load_state_dict(state)
    other = make_dataset(tmp_path / "a2", 120, records_per_shard=50)
    with raw(reader.Mix({**sources, "a": str(other)}), 10, seed=1) as lo, \
            pytest.raises(StateError, match="'a' had 300 records"):
        lo.load_state_dict(state)
    with raw(reader.Mix(sources), 10) as lo, pytest.raises(LoaderError):
        raw(sources["a"], 10).plan_report()


def test_fields_must_agree(sources, tmp_path):
    lean = make_dataset(tmp_path / "lean", 60, extra=False)  # no score, no key
    mix = reader.Mix({"a": sources["a"], "lean": str(lean)})
    with raw(mix, 10) as lo:  # label is shared
        assert len(served(lo, 2)) == 20
    with pytest.raises(ArgumentError, match="source 'lean' has no field 'key'"):
        reader.Loader(mix, 10, decode=False, fields=("key",), num_workers=0)
    with reader.Loader(mix, 8, transform=CropPipeline(), num_workers=0) as lo:
        batch = next(iter(lo))
        assert set(batch) >= {"image", "label"} and "key" not in batch


def test_ledger_diff_command(sources, tmp_path, capsys):
    from reader.inspect.cli import main

    mix = reader.Mix(sources)
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        with raw(mix, 10, shuffle=True, seed=seed, ledger=tmp_path / f"{name}.jsonl") as lo:
            served(lo, 4)
    a, b, c = (str(tmp_path / f"{n}.jsonl") for n in "abc")
    assert main(["ledger-diff", a, b]) == 0
    assert "agree: 4 steps of 1 rank" in capsys.readouterr().out
    assert main([a, "ledger-diff", c]) == 1
    assert "first difference at step 1 of rank 0" in capsys.readouterr().out
    assert main(["ledger-diff", a, c, "--json"]) == 1
    import json
    assert json.loads(capsys.readouterr().out)["first_difference"]["step"] == 1
    (tmp_path / "junk.jsonl").write_text('{"format": "shardpack-ledger-1"}\n{"rank": 0, "st\n')
    assert main(["ledger-diff", a, str(tmp_path / "junk.jsonl")]) == 1
    err = capsys.readouterr().err
    assert "junk.jsonl, line 2: not a ledger step" in err and "Traceback" not in err
    assert main(["ledger-diff", a, str(tmp_path / "missing.jsonl")]) == 1
    assert "cannot read the ledger" in capsys.readouterr().err


def test_damaged_or_foreign_states_are_named(sources):
    with raw(reader.Mix(sources), 10) as lo:
        served(lo, 2)
        state = lo.state_dict()
    with raw(sources["a"], 10) as single, pytest.raises(StateError, match=r"over a reader\.Mix"):
        single.load_state_dict(state)
    for key, value in (("position", -3), ("position", 1.5), ("sources", {"a": {"taken": 1}}),
                       ("plan", "weights"), ("epoch", True)):
        bad = {**state, key: value}
        with raw(reader.Mix(sources), 10) as lo, pytest.raises(StateError):
            lo.load_state_dict(bad)


def test_image_fields_of_other_formats_mix_as_image(sources, tmp_path):
    """A jpeg field of one source and a png one of another: each payload decodes by its
    own format, so they agree as ``image``; a field of another kind does not."""
    from formats import DatasetWriter, Field
    from reader.transforms import CenterCrop
    from tests.helpers_packer import png

    rng = np.random.default_rng(0)
    root = tmp_path / "png"
    with DatasetWriter(root, [Field("image", "png"), Field("label", "int")],
                       records_per_shard=20, shard_size=None, durable=False) as w:
        for i in range(40):
            w.write({"image": png(rng, 40, 36), "label": 1000 + i})
    mix = reader.Mix({"a": sources["a"], "p": str(root)}, weights={"a": 1, "p": 1})
    with reader.Loader(mix, 16, transform=[CenterCrop(32)], num_workers=0, shuffle=True) as lo:
        assert lo.dataset.fields[0].type == "image"
        batch = next(iter(lo))
    assert batch["image"].shape == (16, 32, 32, 3)
    assert (batch["label"] >= 1000).any() and (batch["label"] < 1000).any()
    text = tmp_path / "text"
    with DatasetWriter(text, [Field("image", "str"), Field("label", "int")],
                       records_per_shard=20, shard_size=None, durable=False) as w:
        for i in range(20):
            w.write({"image": "not an image", "label": i})
    with pytest.raises(ArgumentError, match="stores 'image' as jpeg, source 't' as str"):
        reader.Loader(reader.Mix({"a": sources["a"], "t": str(text)}), 8, num_workers=0,
                      fields=("image", "label"))


@pytest.mark.parametrize("weights", [[0.5, 0.3, 0.15, 0.05], [3, 1], [1] * 10])
def test_every_rank_gets_each_source_in_proportion_batch_by_batch(weights):
    """A rank's strided positions land on random slots: per-batch counts spread as random
    draws would (a structured shuffle once put 126 batches of 32,000 beyond 4 sd)."""
    a = Arrangement(integer_weights(weights), seed=11)
    src, _ = a(np.arange(1 << 19))
    w = np.asarray(weights, float) / sum(weights)
    world, b, beyond, batches = 8, 256, 0, 0
    for r in range(world):
        mine = src[r::world]
        for k in range(len(mine) // b):
            c = np.bincount(mine[k * b:(k + 1) * b], minlength=len(w))
            beyond += (np.abs(c - b * w) > 4 * np.sqrt(b * w * (1 - w))).any()
            batches += 1
    assert beyond <= max(2, batches // 500)  # random draws: about 1 in 16,000 per source


def test_a_mixture_sharing_only_keys_is_refused_unless_fields_are_named(tmp_path, rng):
    from formats import DatasetWriter, Field

    web = tmp_path / "web"
    with DatasetWriter(web, [Field("key", "str"), Field("txt", "str")], shard_size=None,
                       records_per_shard=10, durable=False) as w:
        for i in range(4):
            w.write({"key": f"w{i}", "txt": "hello"})
    pets = make_dataset(tmp_path / "pets", 4)  # image, label, score, key
    mix = reader.Mix({"web": str(web), "pets": str(pets)})
    with pytest.raises(ArgumentError, match=r"share no field besides 'key'.*source 'web' has "
                       r"key \(str\), txt \(str\).*source 'pets' has image \(jpeg\)"):
        reader.Loader(mix, 2, num_workers=0)
    with reader.Loader(mix, 2, fields=("key",), num_workers=0) as lo:  # asked for: served
        assert set(next(iter(lo))) == {"key"}
