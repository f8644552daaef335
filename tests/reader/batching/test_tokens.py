"""reader.batching.tokens.TokenBlocks: blocks across records and shards, the sampler's guarantees."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from formats import DatasetWriter, Field
from formats.errors import CorruptRecordError
from reader.batching.tokens import TokenBlocks


def _write(root, docs, *, per_shard=3, dtype="int32", compression="none"):
    field = Field("tokens", "ndarray", dtype=dtype, shape=(None,), compression=compression)
    with DatasetWriter(root, [field, Field("text", "str")], shard_size=None,
                       records_per_shard=per_shard, durable=False) as w:
        for d in docs:
            w.write({"tokens": np.asarray(d, dtype), "text": "x"})
    return root


@pytest.fixture(scope="module")
def docs():
    rng = np.random.default_rng(0)
    lengths = [0, 5, 40, 1, 0, 73, 17, 200, 3, 64, 64, 9]  # empty ones, short, long
    return [rng.integers(0, 1000, n) for n in lengths]


@pytest.fixture(scope="module")
def stream(docs):
    return np.concatenate(docs).astype(np.int32)


@pytest.fixture(scope="module")
def path(tmp_path_factory, docs):
    return _write(tmp_path_factory.mktemp("tok") / "ds", docs)


@pytest.mark.parametrize("batch_size", [None, 1, 4, 7])
@pytest.mark.parametrize("block", [1, 8, 31])
def test_every_block_is_the_stream_in_order(path, stream, batch_size, block):
    with TokenBlocks(path, block, batch_size, shuffle=False) as tb:
        got = [np.atleast_2d(b) for b in tb]
    rows = np.concatenate(got)
    n = (len(stream) - 1) // block
    assert len(rows) == n
    for i, row in enumerate(rows):
        assert np.array_equal(row, stream[i * block:i * block + block + 1])


def test_blocks_inside_a_record_are_zero_copy_views(path, docs):
    with TokenBlocks(path, 8, None, shuffle=False) as tb:
        views = [b for b in tb]
    # Views of the shard (read-only) inside a record; copies across a boundary.
    assert any(not v.flags.writeable for v in views)
    assert any(v.flags.writeable for v in views)


@pytest.mark.parametrize("shuffle", ["block", "full"])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_split_shuffled_blocks_evenly_and_reproducibly(path, stream, world, drop_last,
                                                            shuffle):
    block = 8
    starts = []
    counts = set()
    for rank in range(world):
        kw = dict(seed=3, rank=rank, world_size=world, drop_last=drop_last, shuffle=shuffle)
        with TokenBlocks(path, block, 4, **kw) as tb:
            tb.set_epoch(2)
            batches = list(tb)
            fresh = TokenBlocks(path, block, 4, **kw)
            again = [fresh._batch(2, k) for k in range(len(tb))]
            want = fresh.sampler.rank_indices(2)  # the sampler's blocks, in its order
        got = [int(np.flatnonzero([np.array_equal(row, stream[j * block:j * block + block + 1])
                                   for j in range((len(stream) - 1) // block)])[0])
               for row in np.concatenate(batches)]
        assert got == want.tolist()
        counts.add(len(batches))
        for a, b in zip(batches, again, strict=True):
            assert np.array_equal(a, b)
        starts += got
    assert len(counts) == 1  # every rank the same number of batches
    n = (len(stream) - 1) // block
    if not drop_last:
        assert set(starts) == set(range(n))  # every block at least once
    else:
        assert len(starts) == len(set(starts))  # none twice


@pytest.mark.parametrize("batch_size", [3, None])
def test_resume_mid_epoch_is_exact(path, batch_size):
    with TokenBlocks(path, 8, batch_size, seed=1) as tb:
        tb.set_epoch(1)
        it = iter(tb)
        next(it)
        state = tb.state_dict()
        rest = list(it)
    with TokenBlocks(path, 8, batch_size, seed=1) as again:
        again.load_state_dict(state)
        resumed = list(again)
    assert len(resumed) == len(rest) > 0
    assert all(np.array_equal(a, b) for a, b in zip(resumed, rest, strict=True))
    with TokenBlocks(path, 16, batch_size, seed=1) as other, \
            pytest.raises(ValueError, match="block_size"):
        other.load_state_dict(state)


def _rows(batches):
    return [np.array(b, copy=True) for b in batches]


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("how", ["break", "exception", "interrupt"])
@pytest.mark.parametrize("batch_size", [None, 3])
@pytest.mark.parametrize("order", [dict(seed=1), dict(shuffle="full", seed=2, rank=1,
                                                      world_size=2, drop_last=True)])
def test_a_new_loop_after_one_left_early_reads_the_whole_epoch(path, how, batch_size, order):
    with TokenBlocks(path, 8, batch_size, **order) as tb:
        tb.set_epoch(2)
        want = [_rows(tb), _rows(tb)]
    with TokenBlocks(path, 8, batch_size, **order) as tb:
        tb.set_epoch(2)
        seen = []
        try:
            for b in tb:
                seen.append(np.array(b, copy=True))
                if len(seen) == 2:
                    if how == "break":
                        break
                    raise ValueError if how == "exception" else KeyboardInterrupt
        except (ValueError, KeyboardInterrupt):
            pass
        state = tb.state_dict()
        assert (state["epoch"], state["batch"]) == (2, 2) and _same(seen, want[0][:2])
        it = iter(tb)
        assert tb.state_dict()["batch"] == 0  # the state is the new loop's
        assert _same(_rows(it), want[0])
        assert _same(_rows(tb), want[1])  # the finished epoch moved to the next one
    with TokenBlocks(path, 8, batch_size, **order) as tb:
        tb.load_state_dict(state)
        tb.set_epoch(2)  # keeps the loaded position
        assert _same(_rows(tb), want[0][2:])
        assert _same(_rows(tb), want[1])


def test_token_loops_take_every_batch_or_give_way(path):
    import itertools

    with TokenBlocks(path, 8, 4, seed=3) as tb:
        n = len(tb)
        want = [_rows(tb) for _ in range(2)]
        tb.set_epoch(0)
        assert _same(_rows(itertools.islice(tb, n)), want[0])
        assert _same(_rows(tb), want[1])  # every batch delivered: the epoch was finished
        old = iter(tb)
        next(old)
        new = iter(tb)
        with pytest.raises(RuntimeError, match="one iterator runs at a time"):
            next(old)
        next(new)
        tb.set_epoch(7)
        with pytest.raises(RuntimeError, match=r"set_epoch\(7\)"):
            next(new)


def test_epochs_differ(path):
    with TokenBlocks(path, 8, 64, seed=0) as tb:
        a = next(iter(tb))
        tb.set_epoch(1)
        b = next(iter(tb))
    assert not np.array_equal(a, b)


def test_bad_fields_and_sizes_are_refused(tmp_path, path, docs):
    with pytest.raises(ValueError, match="must be an integer ndarray"):
        TokenBlocks(path, 8, field="text")
    with pytest.raises(ValueError, match="no field 'nope'"):
        TokenBlocks(path, 8, field="nope")
    with pytest.raises(ValueError, match="holds 476 in all"):
        TokenBlocks(path, 1000)
    floats = _write(tmp_path / "f", [np.zeros(5)], dtype="float32")
    with pytest.raises(ValueError, match="integer ndarray"):
        TokenBlocks(floats, 2)
    packed = _write(tmp_path / "z", docs, compression="zstd")
    with pytest.raises(ValueError, match="zstd-compressed"):
        TokenBlocks(packed, 2)


def test_a_damaged_record_is_named(tmp_path, docs):
    root = _write(tmp_path / "bad", docs, per_shard=100)
    data = next(root.glob("*.rec"))
    raw = bytearray(data.read_bytes())
    with TokenBlocks(root, 8, 4, shuffle=False) as tb:
        j = tb.sources[0].j
        sh = tb.dataset.shard(0)
        off = int(sh.offsets[7, j]) + 16  # record 7 (200 tokens)
    raw[off] ^= 0xFF
    data.write_bytes(bytes(raw))
    with TokenBlocks(root, 8, 4, shuffle=False) as tb, \
            pytest.raises(CorruptRecordError, match="checksum"):
        list(tb)


@pytest.mark.parametrize("padded", [True, False])
def test_budgeted_document_batches_through_the_loader(path, docs, padded):
    from reader import Loader, Ragged
    from reader.batching import BudgetBatches

    budget = 256
    spec = BudgetBatches(budget, size="field:tokens", padded=padded)
    collate = {"tokens": "padded" if padded else "ragged"}
    with Loader(path, batch_sampler=spec, collate=collate, shuffle=True, seed=1,
                num_workers=1, copy=True) as lo:
        batches = list(lo)
        # The slot holds the budget's rows, not the largest batch times the longest record.
        assert lo.layout.field("tokens").nbytes <= budget * 4
    seen = []
    for b in batches:
        if padded:
            sizes = b["tokens_size"][:, 0]
            assert b["tokens"].shape[1] * len(sizes) <= budget  # the padded cost
            rows = [b["tokens"][i, :n] for i, n in enumerate(sizes)]
        else:
            assert isinstance(b["tokens"], Ragged) and len(b["tokens"].values) <= budget
            rows = list(b["tokens"])
        seen += [tuple(r) for r in rows]
    assert sorted(seen) == sorted(tuple(d.astype(np.int32)) for d in docs)
    with pytest.raises(ValueError, match="budget"):
        Loader(path, batch_sampler=BudgetBatches(100, size="field:tokens"))


def test_open_shards_stay_within_max_open(tmp_path, docs):
    from formats import open_shards

    root = _write(tmp_path / "many", docs * 4, per_shard=1)  # 48 shards
    ds = open_shards(root, max_open=3)
    with TokenBlocks(ds, 8, 4, shuffle="full") as tb:
        for _ in tb:
            assert len(tb.sources[0]._rows) <= 2  # a view holds its shard's map open


def test_a_state_saved_after_the_last_batch_names_the_next_epoch(path):
    with TokenBlocks(path, 8, 4, shuffle=True, seed=3) as tb:
        want = [_rows(tb), _rows(tb)]
    with TokenBlocks(path, 8, 4, shuffle=True, seed=3) as tb:
        seen = [np.array(b, copy=True) for b in itertools.islice(tb, len(tb))]
        state = tb.state_dict()
    assert _same(seen, want[0]) and (state["epoch"], state["batch"]) == (1, 0)
    with TokenBlocks(path, 8, 4, shuffle=True, seed=3) as tb:
        tb.load_state_dict({**state, "epoch": 0, "batch": len(tb)})  # as older versions saved it
        assert tb.epoch == 1
        tb.set_epoch(tb.epoch)
        assert _same(_rows(tb), want[1])


@pytest.mark.parametrize("batch_size", [None, 1, 3, 8])
@pytest.mark.parametrize("shuffle,world", [(False, 1), ("full", 2), ("block", 3)])
def test_plans_in_small_chunks_serve_the_same_blocks(path, monkeypatch, batch_size, shuffle,
                                                     world):
    import reader.batching.tokens as tokens

    def epoch(rank):
        with TokenBlocks(path, 5, batch_size, shuffle=shuffle, seed=3, rank=rank,
                         world_size=world) as tb:
            return [np.atleast_2d(b).copy() for b in tb]

    whole = [epoch(r) for r in range(world)]
    monkeypatch.setattr(tokens, "_CHUNK", 4)  # a chunk per batch or two, crossing shards
    for r in range(world):
        chunked = epoch(r)
        assert len(chunked) == len(whole[r])
        assert all(np.array_equal(a, b) for a, b in zip(chunked, whole[r], strict=True))
