"""Using the loader from PyTorch (torch is optional: imported on first use).

Directly, which is the fast way::

    loader = Loader(path, 256, transform=[RandomResizedCrop(224), RandomHorizontalFlip()])
    for batch in TorchLoader(loader, channels_first=True, dtype=torch.float32):
        images, labels = batch["image"], batch["label"]   # torch tensors

Tensors are made with ``torch.from_numpy`` and share memory with the batch slot
(leased like the numpy batch: the slot is reused only once no tensor refers to it); with ``channels_first`` or a
``dtype`` the conversion makes a new tensor.

Inside ``torch.utils.data.DataLoader``, for code that must keep one: wrap the
loader's batches in the map-style :class:`TorchBatchDataset` and turn torch's
own batching off; use ``num_workers=0`` there (our workers do the work)::

    dl = torch.utils.data.DataLoader(TorchBatchDataset(loader), batch_size=None,
                                     num_workers=0)

Each item is one whole batch, built in the calling process by the same code the
workers run, so item ``k`` of epoch ``e`` is exactly the loader's batch ``k``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .dataset import main_fields
from .worker import BatchBuilder, batch_rng

__all__ = ["TorchBatchDataset", "TorchLoader", "require_torch", "to_torch"]


def require_torch():
    try:
        import torch
    except ImportError as exc:
        raise ImportError("the torch adapter needs PyTorch: pip install 'shardpack[torch]'") from exc
    return torch


def to_torch(batch: dict, *, channels_first: bool = False, dtype: Any = None,
             image_field: str = "image") -> dict:
    """numpy arrays -> torch tensors (zero-copy); other values pass through.

    Args:
        channels_first: images ``[B, H, W, C]`` become ``[B, C, H, W]`` (contiguous).
        dtype: convert images to this torch dtype (e.g. ``torch.float32``),
            scaled to [0, 1] for floating types.
    """
    torch = require_torch()
    out = {}
    for k, v in batch.items():
        if isinstance(v, np.ndarray):
            t = torch.from_numpy(v)
            if k == image_field and t.ndim == 4:
                if channels_first:
                    t = t.permute(0, 3, 1, 2)
                if dtype is not None:
                    t = t.to(dtype)
                    if t.is_floating_point():
                        t = t.div_(255.0)
                t = t.contiguous()
            out[k] = t
        else:
            out[k] = v
    return out


class TorchLoader:
    """Iterates a :class:`reader.Loader`, yielding dicts of torch tensors."""

    def __init__(self, loader, *, channels_first: bool = False, dtype: Any = None) -> None:
        require_torch()
        self.loader = loader
        self.channels_first = channels_first
        self.dtype = dtype

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        field = self.loader.image_field or "image"
        for batch in self.loader:
            yield to_torch(batch, channels_first=self.channels_first, dtype=self.dtype,
                           image_field=field)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)


class TorchBatchDataset:
    """Map-style dataset of whole batches of ``loader`` (for ``DataLoader(batch_size=None)``).

    Item ``k`` is batch ``k`` of the loader's current epoch, as owned tensors.
    Built in the calling process; ``set_epoch`` changes the epoch.
    """

    def __init__(self, loader, *, channels_first: bool = False, dtype: Any = None) -> None:
        require_torch()
        if loader.raw:
            raise ValueError("TorchBatchDataset needs a decoding loader (decode=True)")
        self.loader = loader
        self.epoch = loader.epoch
        self.channels_first = channels_first
        self.dtype = dtype
        self._builder = None

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __getitem__(self, k: int) -> dict:
        lo = self.loader
        if not 0 <= k < len(lo):
            raise IndexError(f"batch {k} out of range for an epoch of {len(lo)} batches")
        if self._builder is None:
            self._builder = BatchBuilder(lo.dataset, lo.spec)
        indices = lo.sampler.batch(self.epoch, k)
        arrays = {f.name: np.empty(f.shape, f.dtype) for f in lo.layout.fields}
        self._builder.build(indices, arrays, batch_rng(lo.spec, self.epoch, k))
        n = len(indices)
        batch = {name: a[:n] for name, a in arrays.items()}
        if lo.main_fields:
            extra = main_fields(lo.dataset, lo.main_fields, indices)
            batch.update({name: [bytes(x) if isinstance(x, memoryview) else x for x in v]
                          if isinstance(v, list) else v for name, v in extra.items()})
        return to_torch(batch, channels_first=self.channels_first, dtype=self.dtype,
                        image_field=lo.image_field or "image")
