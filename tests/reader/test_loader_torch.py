"""The PyTorch adapter (skipped without torch)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_reader import SIDE, CropPipeline, make_dataset

from reader import Loader
from reader.torch_adapter import TorchBatchDataset, TorchLoader

torch = pytest.importorskip("torch", reason="the torch adapter needs PyTorch")


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("torch") / "ds", 64, extra=True)


def test_torch_loader_is_zero_copy_and_converts(ds_path):
    with Loader(ds_path, 16, num_workers=1, transform=CropPipeline()) as lo:
        it = iter(TorchLoader(lo))
        b = next(it)
        assert isinstance(b["image"], torch.Tensor) and b["image"].dtype == torch.uint8
        assert np.shares_memory(b["image"].numpy(), lo.ring.array)
        assert b["label"].dtype == torch.int64 and b["key"][0] == "k0"
    with Loader(ds_path, 16, num_workers=1, transform=CropPipeline()) as lo:
        b = next(iter(TorchLoader(lo, channels_first=True, dtype=torch.float32)))
        assert b["image"].shape == (16, 3, SIDE, SIDE) and b["image"].dtype == torch.float32
        assert float(b["image"].min()) >= 0.0 and float(b["image"].max()) <= 1.0


@pytest.mark.parametrize("how", ["break", "exception", "interrupt"])
def test_torch_loops_start_the_epoch_again_and_resume_from_a_state(ds_path, how):
    kw = dict(num_workers=2, shuffle=True, seed=5, transform=CropPipeline())
    with Loader(ds_path, 8, **kw) as lo:
        want = [b["label"].tolist() for b in TorchLoader(lo)]
    with Loader(ds_path, 8, **kw) as lo:
        tl = TorchLoader(lo)
        seen = []
        try:
            for b in tl:
                seen.append(b["label"].tolist())
                if len(seen) == 3:
                    if how == "break":
                        break
                    raise ValueError if how == "exception" else KeyboardInterrupt
        except (ValueError, KeyboardInterrupt):
            pass
        state = tl.state_dict()
        it = iter(tl)
        assert tl.state_dict()["batch"] == 0  # the new loop's state, from iter() on
        assert [b["label"].tolist() for b in it] == want
    assert seen == want[:3] and state["batch"] == 3
    with Loader(ds_path, 8, **kw) as lo:
        tl = TorchLoader(lo)
        tl.load_state_dict(state)
        assert seen + [b["label"].tolist() for b in tl] == want


def test_torch_dataloader_over_batches_starts_every_loop_at_the_first(ds_path):
    with Loader(ds_path, 16, num_workers=0, shuffle=True, seed=4, transform=CropPipeline(),
                copy=True) as lo:
        dl = torch.utils.data.DataLoader(TorchBatchDataset(lo), batch_size=None, num_workers=0)
        first = next(iter(dl))["label"]
        assert torch.equal(next(iter(dl))["label"], first)
        whole = [b["label"] for b in dl]
        assert len(whole) == 4 and torch.equal(whole[0], first)


def test_inside_torch_dataloader_matches_the_loader(ds_path):
    with Loader(ds_path, 16, num_workers=2, shuffle=True, seed=4, transform=CropPipeline(),
                copy=True) as lo:
        lo.set_epoch(1)
        ours = list(lo)
        lo.set_epoch(1)
        dl = torch.utils.data.DataLoader(TorchBatchDataset(lo), batch_size=None, num_workers=0)
        theirs = list(dl)
    assert len(ours) == len(theirs) == 4
    for a, b in zip(ours, theirs, strict=True):
        assert np.array_equal(a["image"], b["image"].numpy())
        assert np.array_equal(a["label"], b["label"].numpy())
        assert a["key"] == b["key"]


def test_batch_dataset_follows_its_own_epoch_and_masks_never_clash(tmp_path):
    import torch

    from formats import DatasetWriter, Field
    from reader import Loader
    from reader.batching import BudgetBatches
    from reader.torch_adapter import TorchBatchDataset, to_torch

    rng = np.random.default_rng(0)
    with DatasetWriter(tmp_path / "d", [Field("tokens", "ndarray", dtype="int32", shape=(None,))],
                       shard_size=None, records_per_shard=50) as w:
        for _ in range(200):
            w.write({"tokens": np.arange(rng.integers(1, 60), dtype=np.int32)})
    with Loader(tmp_path / "d", batch_sampler=BudgetBatches(256, size="field:tokens"),
                collate={"tokens": "padded"}, shuffle=True, num_workers=0) as lo:
        ds = TorchBatchDataset(lo)
        counts = []
        for e in range(4):
            ds.set_epoch(e)
            counts.append(len(ds))
            assert len(ds) == lo.sampler.num_batches_in(e)
            ds[len(ds) - 1]  # the last batch of that epoch, not of the loader's
        b = next(iter(lo))
        b["tokens_mask"] = np.zeros(1)
        with pytest.raises(ValueError, match="already has"):
            to_torch(b, padding_mask=True)
    assert isinstance(torch.from_numpy(np.zeros(1)), torch.Tensor)
