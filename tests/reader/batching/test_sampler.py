"""Sampler properties: a pure function of (seed, epoch, rank, world_size)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reader.batching.sampler import Sampler
from reader.options import SamplerOptions


def starts(n: int, per_shard: int) -> np.ndarray:
    counts = [per_shard] * (n // per_shard) + ([n % per_shard] if n % per_shard else [])
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def make(n, batch, per_shard=10, **kw) -> Sampler:
    return Sampler(n, starts(n, per_shard), batch, SamplerOptions(**kw))


@given(n=st.integers(1, 300), batch=st.integers(1, 40), world=st.integers(1, 5),
       shuffle=st.sampled_from([False, "block", "full"]), drop_last=st.booleans(),
       seed=st.integers(0, 2**32), epoch=st.integers(0, 5))
def test_ranks_partition_the_epoch(n, batch, world, shuffle, drop_last, seed, epoch):
    samplers = [make(n, batch, shuffle=shuffle, drop_last=drop_last, seed=seed, rank=r,
                     world_size=world, **({"shuffle_window": 7} if shuffle == "block" else {}))
                for r in range(world)]
    nb = {len(s) for s in samplers}
    assert len(nb) == 1, "every rank must get the same number of batches"
    got = [np.concatenate([s.batch(epoch, k) for k in range(len(s))] or [np.zeros(0, np.int64)])
           for s in samplers]
    allidx = np.concatenate(got)
    if drop_last:
        # Nothing repeated; at most world_size - 1 + partial batches lost.
        assert len(np.unique(allidx)) == len(allidx)
        assert len(allidx) >= (n // world // batch) * batch * world
    else:
        # Every record at least once; only the wrap-around padding repeats.
        assert set(allidx.tolist()) == set(range(n))
        assert len(allidx) == -(-n // world) * world
        assert len({len(g) for g in got}) == 1
    assert allidx.min(initial=0) >= 0 and allidx.max(initial=0) < n


def test_order_is_pure_and_changes_with_epoch_and_seed():
    a = make(500, 32, shuffle="full", seed=3)
    b = make(500, 32, shuffle="full", seed=3)
    assert np.array_equal(a.rank_indices(2), b.rank_indices(2))
    assert not np.array_equal(a.rank_indices(2), a.rank_indices(3))
    assert not np.array_equal(a.rank_indices(2), make(500, 32, shuffle="full", seed=4).rank_indices(2))
    assert np.array_equal(make(500, 32).rank_indices(0), np.arange(500))
    assert make(500, 32, shuffle=True).options.shuffle == "full"


def test_block_shuffle_is_local_and_mixes():
    n, per_shard, window = 2000, 250, 64
    s = make(n, 16, per_shard=per_shard, shuffle="block", shuffle_window=window, seed=1)
    order = s.global_order(0)
    assert sorted(order.tolist()) == list(range(n))
    # Each window holds `window` records that were consecutive in (shuffled) shard order:
    # within one or two shards, spanning a bounded range of each.
    for w in order[: (n // window) * window].reshape(-1, window):
        shards = np.unique(w // per_shard)
        assert len(shards) <= 2
        for sh in shards:
            part = w[w // per_shard == sh]
            assert part.max() - part.min() < window
    # ...but records are actually shuffled, and shards are visited in a shuffled order.
    assert not np.array_equal(order, np.sort(order))
    firsts = [int(order[i * per_shard]) // per_shard for i in range(n // per_shard)]
    assert firsts != sorted(firsts)


def test_batches_and_bad_arguments():
    s = make(10, 4)
    assert len(s) == 3 and s.batch(0, 2).tolist() == [8, 9]
    s = make(10, 4, drop_last=True)
    assert len(s) == 2
    with pytest.raises(IndexError):
        s.batch(0, 2)
    with pytest.raises(ValueError, match="rank"):
        SamplerOptions(rank=2, world_size=2)
    with pytest.raises(ValueError, match="shuffle"):
        SamplerOptions(shuffle="sometimes")
