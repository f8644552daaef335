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

Fields whose size varies per sample (:mod:`reader.transforms.collate`): a ragged field
becomes a list of tensors, one per sample (views of the slot; what torchvision's
detection models take for ``boxes`` and ``labels``, and for images of different
sizes); a padded one stays one tensor, with its ``NAME_size`` and, with
``padding_mask=True``, a boolean ``NAME_mask`` that is True on real data.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from formats.errors import ArgumentError

from .data.dataset import main_fields
from .runtime.worker import BatchBuilder, batch_rng
from .transforms.collate import Ragged, assemble

__all__ = ["TorchBatchDataset", "TorchLoader", "require_torch", "to_torch"]


def require_torch():
    try:
        import torch
    except ImportError as exc:
        raise ImportError("the torch adapter needs PyTorch: pip install 'shardpack[torch]'") from exc
    return torch


def to_torch(batch: dict, *, channels_first: bool = False, dtype: Any = None,
             image_field: str = "image", padding_mask: bool = False) -> dict:
    """numpy arrays -> torch tensors (zero-copy); ragged fields -> lists of tensors;
    other values pass through.

    Args:
        channels_first: images ``[B, H, W, C]`` become ``[B, C, H, W]`` (contiguous;
            each ``[H, W, C]`` image of a ragged field becomes ``[C, H, W]``).
        dtype: convert images to this torch dtype (e.g. ``torch.float32``),
            scaled to [0, 1] for floating types.
        padding_mask: for each padded field ``NAME`` (one with ``NAME_size``), add
            ``NAME_mask``: True where the data is, False on the padding.
    """
    torch = require_torch()
    out = {}
    for k, v in batch.items():
        if isinstance(v, Ragged):
            items = [torch.from_numpy(x) for x in v]
            if k == image_field:
                items = [_image(t, channels_first, dtype) for t in items]
            out[k] = items
        elif isinstance(v, np.ndarray):
            t = torch.from_numpy(v)
            if k == image_field and t.ndim == 4:
                t = _image(t, channels_first, dtype)
            out[k] = t
        else:
            out[k] = v
    if padding_mask:
        for k in list(out):
            size = batch.get(k + "_size")
            if isinstance(size, np.ndarray) and isinstance(batch[k], np.ndarray):
                if k + "_mask" in batch:
                    raise ArgumentError(f"padding_mask would add {k + '_mask'!r}, which the batch "
                                     "already has (a field of that name): read it under "
                                     "fields=... without it, or leave padding_mask off")
                out[k + "_mask"] = torch.from_numpy(_padding_mask(batch[k], size))
    return out


def _image(t, channels_first: bool, dtype):
    if channels_first:
        t = t.movedim(-1, -3)
    if dtype is not None and t.dtype != dtype:
        # uint8 pixels become 0..1; an image normalized already (float) is only cast.
        scale = not t.is_floating_point()
        t = t.to(dtype)  # a new tensor (the dtype changed): the slot is never written
        if scale and t.is_floating_point():
            t = t.div_(255.0)
    return t.contiguous()


def _padding_mask(values: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``[n, *varying dims]`` bool: True inside each sample's size. The varying dimensions
    follow the batch dimension, except in a channels-first image (``Normalize(
    channels_first=True)``: ``[n, 3, H, W]``), where they are the last ones."""
    k = sizes.shape[1]
    inner = values.ndim - 1 - k
    first = inner == 1 and values.shape[1] in (1, 3) and values.shape[-1] not in (1, 3)
    dims = values.shape[-k:] if first else values.shape[1:1 + k]
    mask = np.ones((len(values), *dims), bool)
    for d in range(k):
        index = np.arange(dims[d]).reshape((1,) + (1,) * d + (-1,) + (1,) * (k - d - 1))
        mask &= index < sizes[:, d].reshape((-1,) + (1,) * k)
    return mask


class TorchLoader:
    """Iterates a :class:`reader.Loader`, yielding dicts of torch tensors.

    Loops follow the Loader's rule (every ``iter()`` starts the current epoch at its
    first batch unless ``load_state_dict()`` was called since; see :class:`reader.Loader`).
    """

    def __init__(self, loader, *, channels_first: bool = False, dtype: Any = None,
                 padding_mask: bool = False) -> None:
        require_torch()
        self.loader = loader
        self.channels_first = channels_first
        self.dtype = dtype
        self.padding_mask = padding_mask

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        # The loader's iter() now, not at the first next(): the loop starts (and
        # state_dict() describes it) when iter() is called, as with the Loader itself.
        return self._tensors(iter(self.loader))

    def _tensors(self, batches):
        field = self.loader.image_field or "image"
        for batch in batches:
            yield to_torch(batch, channels_first=self.channels_first, dtype=self.dtype,
                           image_field=field, padding_mask=self.padding_mask)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)


class TorchBatchDataset:
    """Map-style dataset of whole batches of ``loader`` (for ``DataLoader(batch_size=None)``).

    Item ``k`` is batch ``k`` of the loader's current epoch, as owned tensors.
    Built in the calling process; ``set_epoch`` changes the epoch. Under
    ``on_error="replace"`` an item is the batch the Loader serves, replacements in
    place, but no quarantine is kept (items are built wherever the DataLoader asks).
    """

    def __init__(self, loader, *, channels_first: bool = False, dtype: Any = None) -> None:
        require_torch()
        if loader.raw:
            raise ArgumentError("TorchBatchDataset needs a decoding loader (decode=True)")
        self.loader = loader
        self.epoch = loader.epoch
        self.channels_first = channels_first
        self.dtype = dtype
        self._builder = None

    def __len__(self) -> int:
        return self.loader.sampler.num_batches_in(self.epoch)  # this dataset's epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __getitem__(self, k: int) -> dict:
        lo = self.loader
        n = len(self)
        if not 0 <= k < n:
            raise IndexError(f"batch {k} out of range for epoch {self.epoch} of {n} batches")
        if self._builder is None:
            self._builder = BatchBuilder(lo.dataset, lo.spec)
        indices = lo.sampler.batch(self.epoch, k)
        arrays = {f.name: np.empty(f.shape, f.dtype) for f in lo.layout.fields}
        _, shapes, replaced = self._builder.build(indices, arrays,
                                                  batch_rng(lo.spec, self.epoch, k))
        batch = assemble(arrays, lo.plan.fixed, lo.plan.var_fields, shapes, len(indices))
        if replaced:  # on_error="replace": the main-process fields are the replacements' too
            indices = indices.copy()
            for p, _, replacement in replaced:
                indices[p] = replacement
        if lo.main_fields:
            extra = main_fields(lo.dataset, lo.main_fields, indices)
            batch.update({name: [bytes(x) if isinstance(x, memoryview) else x for x in v]
                          if isinstance(v, list) else v for name, v in extra.items()})
        return to_torch(batch, channels_first=self.channels_first, dtype=self.dtype,
                        image_field=lo.image_field or "image")
