"""Size-aware batches: aspect-ratio groups and budgets keep every sampler guarantee."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import reader
from formats import DatasetWriter, Field
from reader.batching.batching import AspectRatioBatches, BudgetBatches, field_sizes, padding_waste
from reader.batching.sampler import Sampler, shuffled_order
from reader.options import SamplerOptions
from tests.helpers_paths import ROOT


class FakeDataset:
    """What bind reads from a dataset: its length, shard starts and metadata table."""

    def __init__(self, n: int, per_shard: int = 10, width=None, height=None) -> None:
        self.n = n
        self.starts = np.unique(np.append(np.arange(0, n, per_shard), n)).astype(np.int64)
        self.width, self.height = width, height

    def __len__(self) -> int:
        return self.n

    def metadata(self, columns):
        return pa.table({"width": pa.array(self.width, pa.int32()),
                         "height": pa.array(self.height, pa.int32())})


def bind_all(spec, n, world, batch_size=None, **kw):
    """One bound order per rank."""
    ds = FakeDataset(n)
    return [spec.bind(ds, batch_size, SamplerOptions(rank=r, world_size=world, **kw))
            for r in range(world)]


def epoch_batches(bound, epoch):
    return [bound.batch(epoch, k) for k in range(bound.num_batches_in(epoch))]


def check_partition(ranks, single, epoch, n):
    """Ranks take the global list (the one-rank order) padded or truncated, batch i to
    rank i % W (or contiguous runs for "block"); coverage follows from that."""
    world, opts = len(ranks), ranks[0].options
    glob = epoch_batches(single, epoch)
    counts = {r.num_batches_in(epoch) for r in ranks}
    assert len(counts) == 1, "every rank must get the same number of batches"
    each = counts.pop()
    assert each == (len(glob) // world if opts.drop_last else -(-len(glob) // world))
    seen = np.zeros(n, np.int64)
    for r, bound in enumerate(ranks):
        got = epoch_batches(bound, epoch)
        for k, b in enumerate(got):
            i = r * each + k if opts.shuffle == "block" else k * world + r
            assert np.array_equal(b, glob[i % len(glob)])
            np.add.at(seen, b, 1)
        flat = bound.rank_indices(epoch)
        assert np.array_equal(flat, np.concatenate(got or [np.zeros(0, np.int64)]))
        assert np.array_equal(np.diff(bound.rank_offsets(epoch)), [len(b) for b in got])
        assert max((len(b) for b in got), default=0) <= bound.max_batch_size
    whole = np.concatenate(glob or [np.zeros(0, np.int64)])
    assert len(np.unique(whole)) == len(whole), "a record twice in one global epoch"
    if not opts.drop_last:
        assert (seen >= 1).all(), "a record missing from the epoch"
    if each * world == len(glob):  # no padding: exactly the global list, once
        assert np.array_equal(np.sort(seen[seen > 0]), np.ones((seen > 0).sum()))
    return glob


# -- aspect-ratio groups ------------------------------------------------------------------

@given(n=st.integers(1, 150), batch=st.integers(1, 12), world=st.integers(1, 5),
       shuffle=st.sampled_from([False, "block", "full"]), drop_last=st.booleans(),
       seed=st.integers(0, 2**32), epoch=st.integers(0, 3), bounds=st.integers(1, 4),
       data=st.randoms(use_true_random=False))
def test_groups_partition_the_epoch_and_stay_homogeneous(n, batch, world, shuffle, drop_last,
                                                         seed, epoch, bounds, data):
    rng = np.random.default_rng(data.randrange(2**32))
    hw = rng.integers(1, 60, (n, 2))
    boundaries = (0.5, 0.75, 1.0, 1.33, 2.0)[:bounds]
    spec = AspectRatioBatches(boundaries=boundaries, sizes=hw)
    kw = dict(shuffle=shuffle, drop_last=drop_last, seed=seed,
              **({"shuffle_window": 7} if shuffle == "block" else {}))
    ranks = bind_all(spec, n, world, batch, **kw)
    single = bind_all(spec, n, 1, batch, **kw)[0]
    glob = check_partition(ranks, single, epoch, n)
    group = np.searchsorted(boundaries, hw[:, 1] / hw[:, 0], side="right")
    for b in glob:
        assert len(np.unique(group[b])) == 1, f"batch {b} mixes groups {group[b]}"
        assert 1 <= len(b) <= batch and (len(b) == batch or not drop_last)
    full = sum(c // batch for c in np.bincount(group))
    assert sum(len(b) == batch for b in glob) == full
    assert ranks[0].num_batches == ranks[0].num_batches_in(epoch) == len(ranks[0])


def test_groups_stream_in_storage_order_without_shuffle():
    # Ratios w/h: landscape L, portrait P. Stream L P L L P P L P, batches of 2.
    hw = np.array([[1, 2], [2, 1], [1, 2], [1, 2], [2, 1], [2, 1], [1, 2], [2, 1]])
    bound = AspectRatioBatches(sizes=hw).bind(FakeDataset(8), 2, SamplerOptions())
    # A batch leaves when its bucket fills: [0,2] at record 2, [1,4] at 4, [3,6] at 6,
    # [5,7] at 7.
    assert [b.tolist() for b in epoch_batches(bound, 0)] == [[0, 2], [1, 4], [3, 6], [5, 7]]
    assert [b.tolist() for b in epoch_batches(bound, 5)] == [[0, 2], [1, 4], [3, 6], [5, 7]]
    # Leftovers leave at the end, in group order, partial unless drop_last.
    bound = AspectRatioBatches(sizes=hw[:7]).bind(FakeDataset(7), 3, SamplerOptions())
    assert [b.tolist() for b in epoch_batches(bound, 0)] == [[0, 2, 3], [1, 4, 5], [6]]
    bound = AspectRatioBatches(sizes=hw[:7]).bind(
        FakeDataset(7), 3, SamplerOptions(drop_last=True))
    assert [b.tolist() for b in epoch_batches(bound, 0)] == [[0, 2, 3], [1, 4, 5]]


def test_groups_from_the_metadata_table_and_unknown_sizes_named():
    w, h = [40, 30, 50, 20], [30, 40, 50, 80]
    bound = AspectRatioBatches().bind(FakeDataset(4, width=w, height=h), 2, SamplerOptions())
    assert [b.tolist() for b in epoch_batches(bound, 0)] == [[0, 2], [1, 3]]
    for width, height in (([40, 30, None, 20], h), ([40, 30, 50, 20], [30, 0, 50, 80])):
        bad = 2 if width[2] is None else 1
        with pytest.raises(ValueError, match=rf"record {bad} has no known width.*sizes="):
            AspectRatioBatches().bind(FakeDataset(4, width=width, height=height), 2,
                                      SamplerOptions())


# -- budgets -----------------------------------------------------------------------------

@given(n=st.integers(1, 150), world=st.integers(1, 5), padded=st.booleans(),
       shuffle=st.sampled_from([False, "block", "full"]), drop_last=st.booleans(),
       seed=st.integers(0, 2**32), epoch=st.integers(0, 3), cap=st.sampled_from([None, 1, 5]),
       window=st.sampled_from([None, 1, 3]), data=st.randoms(use_true_random=False))
def test_budget_batches_partition_the_epoch_within_budget(n, world, padded, shuffle, drop_last,
                                                          seed, epoch, cap, window, data):
    rng = np.random.default_rng(data.randrange(2**32))
    sizes = rng.integers(0, 50, n)
    budget = int(sizes.max()) + int(rng.integers(1, 200))
    spec = BudgetBatches(budget, size=sizes, padded=padded, max_batch_size=cap, window=window)
    kw = dict(shuffle=shuffle, drop_last=drop_last, seed=seed,
              **({"shuffle_window": 7} if shuffle == "block" else {}))
    ranks = bind_all(spec, n, world, **kw)
    glob = check_partition(ranks, bind_all(spec, n, 1, **kw)[0], epoch, n)
    for b in glob:
        cost = sizes[b].max() * len(b) if padded else sizes[b].sum()
        assert len(b) >= 1 and cost <= budget and (cap is None or len(b) <= cap)
    # No records are dropped by the global list, only by truncation to whole rounds.
    assert sum(len(b) for b in glob) == n


def test_budget_batches_sort_within_windows_so_padding_shrinks(rng):
    sizes = rng.integers(1, 1000, 4000)
    spec = BudgetBatches(8000, size=sizes)
    bound = spec.bind(FakeDataset(4000), None, SamplerOptions(shuffle=True, seed=1))
    batches = epoch_batches(bound, 0)
    # Cut in order of arrival instead, the same number of records per batch:
    lengths = np.array([len(b) for b in batches])
    arrival = np.split(rng.permutation(4000), np.cumsum(lengths)[:-1])
    assert padding_waste(batches, sizes) < 0.1 < padding_waste(arrival, sizes)
    # Larger batches of small records, smaller ones of large records (a window's last
    # batch may be short whatever its sizes).
    small = [len(b) for b in batches if sizes[b].max() < 100]
    large = [len(b) for b in batches if sizes[b].min() > 800]
    assert np.median(small) > 4 * max(large)
    # 8000 records of size 1 would fit, but a batch never spans two sort windows.
    assert bound.max_batch_size == bound.describe()["sort_window"] == 64 * (8000 // int(np.median(sizes)))
    assert bound.num_batches_in(0) != bound.num_batches_in(1) or not np.array_equal(
        bound.rank_indices(0), bound.rank_indices(1))


@pytest.mark.parametrize("shuffle", [False, "block", "full"])
def test_budget_batch_order_is_shuffled_as_the_records_are(shuffle):
    n, sizes = 2000, np.arange(2000) % 97 + 1
    opts = SamplerOptions(shuffle=shuffle, seed=5,
                          **({"shuffle_window": 100} if shuffle == "block" else {}))
    bound = BudgetBatches(400, size=sizes, window=5).bind(FakeDataset(n, 100), None, opts)
    w = bound.describe()["sort_window"]
    where = np.empty(n, np.int64)
    where[shuffled_order(n, FakeDataset(n, 100).starts, opts, 0)] = np.arange(n)
    batches = epoch_batches(bound, 0)
    windows = [np.unique(where[b] // w) for b in batches]
    assert all(len(x) == 1 for x in windows), "a batch spans two sort windows"
    windows = np.concatenate(windows)
    # Without shuffling, batches leave window by window, largest records first; "block"
    # keeps the windows in order (locality) but shuffles within them; "full" mixes all.
    assert (np.diff(windows) >= 0).all() == (shuffle != "full")
    largest = np.array([sizes[b].max() for b in batches])
    rises = (np.diff(largest)[np.diff(windows) == 0] > 0).sum()
    assert (rises == 0) == (shuffle is False)


def test_budget_smaller_than_a_record_is_refused_at_bind():
    sizes = np.array([3, 9, 4, 12, 5])
    with pytest.raises(ValueError, match=r"record 3 has size 12 .*more than the budget 10"):
        BudgetBatches(10, size=sizes).bind(FakeDataset(5), None, SamplerOptions())
    with pytest.raises(ValueError, match="cap it with BudgetBatches\\(max_batch_size"):
        BudgetBatches(100, size=sizes).bind(FakeDataset(5), 32, SamplerOptions())
    # Sizes too large to share one int64 sort key with the window still sort right.
    huge = np.array([2**60, 3, 2**61, 5])
    bound = BudgetBatches(2**62 - 1, size=huge).bind(FakeDataset(4), None, SamplerOptions())
    assert [b.tolist() for b in epoch_batches(bound, 0)] == [[2], [0, 3, 1]]
    bound = BudgetBatches(100, size=sizes).bind(FakeDataset(5), None, SamplerOptions())
    with pytest.raises(AttributeError, match="num_batches_in"):
        bound.num_batches  # noqa: B018


def test_pixel_budget_from_the_metadata_table():
    w, h = [10, 20, 10, 40], [10, 10, 30, 10]
    ds = FakeDataset(4, width=w, height=h)
    bound = BudgetBatches(400, padded=False).bind(ds, None, SamplerOptions())
    assert [b.tolist() for b in epoch_batches(bound, 0)] == [[3], [2], [1, 0]]
    assert bound.describe()["sizes"] == "pixels"


# -- purity, resume, edges ---------------------------------------------------------------

SPECS = [AspectRatioBatches(boundaries=(0.8, 1.25), sizes=np.stack(
             [np.arange(1, 301) % 17 + 1, np.arange(1, 301) % 13 + 1], axis=1)),
         BudgetBatches(120, size=np.arange(300) % 37, window=4)]


@pytest.mark.parametrize("spec", SPECS, ids=["groups", "budget"])
def test_order_is_pure_pickles_and_changes_with_epoch_and_seed(spec):
    batch = 8 if isinstance(spec, AspectRatioBatches) else None
    opts = SamplerOptions(shuffle=True, seed=3, rank=1, world_size=3)
    a = spec.bind(FakeDataset(300), batch, opts)
    b = pickle.loads(pickle.dumps(spec)).bind(FakeDataset(300), batch, opts)
    c = pickle.loads(pickle.dumps(a))
    for e in (0, 2):
        assert all(np.array_equal(x, y) and np.array_equal(x, z) for x, y, z in
                   zip(epoch_batches(a, e), epoch_batches(b, e), epoch_batches(c, e), strict=True))
    assert not np.array_equal(a.rank_indices(0), a.rank_indices(1))
    other = spec.bind(FakeDataset(300), batch, SamplerOptions(shuffle=True, seed=4, rank=1,
                                                              world_size=3))
    assert not np.array_equal(a.rank_indices(0), other.rank_indices(0))
    assert a.describe() == c.describe() and a.describe() != other.describe()
    assert a.describe()["sizes_digest"] == other.describe()["sizes_digest"]


def test_resume_in_a_fresh_process_gives_the_same_batches():
    code = (
        "import numpy as np, pickle, sys\n"
        "spec, opts = pickle.load(sys.stdin.buffer)\n"
        "from tests.reader.batching.test_batching import FakeDataset\n"
        "b = spec.bind(FakeDataset(300), None, opts)\n"
        "sys.stdout.write(','.join(str(b.batch(4, k).tolist()) for k in range(5, "
        "b.num_batches_in(4))))\n")
    spec = SPECS[1]
    opts = SamplerOptions(shuffle="block", seed=9, rank=0, world_size=2, shuffle_window=50)
    here = spec.bind(FakeDataset(300), None, opts)
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps((spec, opts)),
                         capture_output=True, cwd=ROOT, check=True, timeout=60).stdout
    assert out.decode() == ",".join(str(here.batch(4, k).tolist())
                                    for k in range(5, here.num_batches_in(4)))


@pytest.mark.parametrize("spec", SPECS, ids=["groups", "budget"])
def test_more_ranks_than_batches_and_one_record(spec):
    batch = 8 if isinstance(spec, AspectRatioBatches) else None
    sizes = spec.sizes[:1] if isinstance(spec, AspectRatioBatches) else spec.size[:1]
    one = type(spec)(**{**{f: getattr(spec, f) for f in spec.__dataclass_fields__},
                        ("sizes" if batch else "size"): sizes})
    ranks = bind_all(one, 1, 4, batch, shuffle=True)
    assert [epoch_batches(r, 0)[0].tolist() for r in ranks] == [[0]] * 4  # padded by wrapping
    assert [r.num_batches_in(0) for r in bind_all(one, 1, 4, batch, drop_last=True)] == [0] * 4
    # 300 records but 40 ranks: every rank still gets whole batches, the same number.
    ranks = bind_all(spec, 300, 40, batch, shuffle=True)
    check_partition(ranks, bind_all(spec, 300, 1, batch, shuffle=True)[0], 0, 300)


def test_bad_specs_fail_at_construction():
    with pytest.raises(ValueError, match="boundaries"):
        AspectRatioBatches(boundaries=(1.0, 0.5))
    with pytest.raises(ValueError, match="boundaries"):
        AspectRatioBatches(boundaries=())
    with pytest.raises(ValueError, match="the batch size is the Loader's"):
        AspectRatioBatches(batch_size="16")
    with pytest.raises(TypeError, match=r"\(num_records, 2\)"):
        AspectRatioBatches(sizes=np.ones(5, np.int64))
    with pytest.raises(ValueError, match="record 1 has size"):
        AspectRatioBatches(sizes=[[1, 1], [0, 3]])
    with pytest.raises(ValueError, match="record 2 has size"):
        BudgetBatches(10, size=[1, 2, -1])
    with pytest.raises(TypeError, match="integer array"):
        BudgetBatches(10, size=np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match="'pixels', 'field:NAME'"):
        BudgetBatches(10, size="tokens")
    with pytest.raises(ValueError, match="budget"):
        BudgetBatches(0)
    with pytest.raises(ValueError, match="window"):
        BudgetBatches(10, window=0)
    spec = AspectRatioBatches(sizes=np.ones((3, 2), np.int64))
    with pytest.raises(TypeError, match="batch_size"):
        spec.bind(FakeDataset(3), "4", SamplerOptions())
    assert spec.bind(FakeDataset(3), 4, SamplerOptions()).num_batches == 1
    with pytest.raises(ValueError, match="3 sizes for a dataset of 4"):
        spec.bind(FakeDataset(4), 4, SamplerOptions())
    with pytest.raises(ValueError, match="needs a batch_size"):
        AspectRatioBatches(sizes=np.ones((3, 2), np.int64)).bind(FakeDataset(3), None,
                                                                 SamplerOptions())


def test_sampler_offers_the_same_interface():
    s = Sampler(10, [0, 5, 10], 4, SamplerOptions(world_size=1))
    assert s.rank_offsets(0).tolist() == [0, 4, 8, 10]
    assert s.max_batch_size == 4 and s.num_batches_in(7) == 3
    assert set(s.describe()) == {"seed", "shuffle", "window", "rank", "world_size",
                                 "drop_last", "batch_size", "num_records", "partition", "order"}
    bound = SPECS[0].bind(FakeDataset(300), 8, SamplerOptions())
    assert set(s.describe()) < set(bound.describe())


# -- a real packed dataset ---------------------------------------------------------------

@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """30 records with image sizes in the metadata table and sized fields of each kind."""
    rng = np.random.default_rng(7)
    root = tmp_path_factory.mktemp("batching") / "ds"
    fields = [Field("tokens", "ndarray", dtype="<i4", shape=(None,)),
              Field("boxes", "ndarray", dtype="<f4", shape=(None, 4)),
              Field("grid", "ndarray", dtype="|u1", shape=(None, None, 3)),
              Field("text", "str"), Field("length", "int"), Field("fixed", "ndarray",
                                                                  dtype="<f8", shape=(2,)),
              Field("packed", "bytes", compression="zstd"), Field("score", "float")]
    truth = {"tokens": [], "boxes": [], "grid": [], "text": [], "hw": []}
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=7, durable=False) as w:
        for _ in range(30):
            t, nb, gh, gw = (int(x) for x in rng.integers(0, 20, 4))
            text = "é" * int(rng.integers(0, 9))
            hw = (int(rng.integers(20, 90)), int(rng.integers(20, 90)))
            w.write({"tokens": np.arange(t, dtype=np.int32),
                     "boxes": np.zeros((nb, 4), np.float32),
                     "grid": np.zeros((gh, gw, 3), np.uint8), "text": text, "length": t,
                     "fixed": np.zeros(2), "packed": b"x" * t, "score": 0.5},
                    meta={"height": hw[0], "width": hw[1]})
            for k, v in (("tokens", t), ("boxes", nb), ("grid", gh * gw),
                         ("text", len(text.encode())), ("hw", hw)):
                truth[k].append(v)
    return reader.open_dataset(root), truth


def test_field_sizes_come_from_the_index(packed):
    ds, truth = packed
    for name in ("tokens", "boxes", "grid", "text"):
        assert field_sizes(ds, name).tolist() == truth[name], name
    assert field_sizes(ds, "length").tolist() == truth["tokens"]
    assert field_sizes(ds, "fixed").tolist() == [1] * 30
    with pytest.raises(ValueError, match="zstd-compressed"):
        field_sizes(ds, "packed")
    with pytest.raises(ValueError, match="a float field has no size"):
        field_sizes(ds, "score")
    with pytest.raises(ValueError, match=r"no field 'nope'.*tokens \(ndarray\)"):
        BudgetBatches(100, size="field:nope").bind(ds, None, SamplerOptions())


def test_batches_on_a_packed_dataset(packed):
    ds, truth = packed
    hw = np.array(truth["hw"])
    opts = SamplerOptions(shuffle="block", seed=2, shuffle_window=5)
    grouped = AspectRatioBatches().bind(ds, 4, opts)
    landscape = hw[:, 1] >= hw[:, 0]
    for b in epoch_batches(grouped, 1):
        assert len(set(landscape[b].tolist())) == 1
    tokens = BudgetBatches(40, size="field:tokens", max_batch_size=6).bind(ds, None, opts)
    lengths = np.array(truth["tokens"])
    batches = epoch_batches(tokens, 1)
    assert sorted(np.concatenate(batches).tolist()) == list(range(30))
    assert all(lengths[b].max() * len(b) <= 40 and len(b) <= 6 for b in batches)
    pixels = BudgetBatches(3 * 90 * 90, padded=False).bind(ds, None, opts)
    assert all((hw[b, 0] * hw[b, 1]).sum() <= 3 * 90 * 90 for b in epoch_batches(pixels, 0))
    # What the benchmark reports: grouping wastes less padding than arrival order.
    plain = Sampler(len(ds), ds.starts, 4, opts)
    assert padding_waste(epoch_batches(grouped, 1), hw) < padding_waste(
        [plain.batch(1, k) for k in range(len(plain))], hw)


def test_padding_waste_counts_padded_elements():
    hw = np.array([[2, 3], [4, 1], [1, 1]])
    # One batch of all three: padded to 4 x 3 each = 36 pixels, 6 + 4 + 1 = 11 real.
    assert padding_waste([np.arange(3)], hw) == pytest.approx(25 / 36)
    assert padding_waste([[0], [1], [2]], hw) == 0.0
    assert padding_waste([[0, 2], []], [5, 3, 1]) == pytest.approx(4 / 10)
    assert padding_waste([], [1, 2]) == 0.0
