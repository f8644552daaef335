"""Fields whose size differs per sample, in a batch slot: padded or ragged, zero-copy.

A slot holds each such field as one flat region sized for the worst batch (the
loader bounds it from the dataset: the largest image after the transforms, the
most boxes of any record). A worker writes a batch at the start of the region,
contiguously, and reports the shape it used; the main process rebuilds the views
from that shape, so the trainer gets views of the slot, never copies:

* ``"padded"``: ``[n, max_1, ..., *inner]``, each sample at the start of its row
  and zeros after it, padded to the batch's largest sample (``Padded(to=...)``:
  to a fixed size instead); its sizes in ``NAME_size`` (``[n, k]`` int32, one column
  per varying dimension: ``(height, width)`` for images, the count for boxes).
* ``"ragged"``: a :class:`Ragged`: the samples back to back in ``values`` and
  ``offsets`` (``[n + 1]``, like an Arrow list array) into its first dimension.
  Images, whose two sides vary, are stored flat with their shapes in ``shapes``.

One contiguous region per field also means one host-to-device copy per field on
the GPU path (:mod:`reader.runtime.sinks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from formats.errors import ArgumentError, ArgumentTypeError

__all__ = ["Padded", "Ragged", "VarField", "assemble", "check_collate"]

MODES = ("padded", "ragged")


@dataclass(frozen=True)
class Padded:
    """Pad a field to a fixed size, or the batch's largest sample up to a multiple.

    Attributes:
        to: the padded size of the varying dimensions: ``(height, width)`` for an
            image, the count for a per-sample array (``boxes``). A larger sample is
            an error naming its record.
        multiple: pad the batch's largest size up to a multiple of this (detectron2's
            ``size_divisibility``: ``Padded(multiple=32)`` for a stride-32 backbone).
            Unlike the ``PadToMultiple`` transform, ``NAME_size`` then keeps each
            image's own size.
    """

    to: int | tuple[int, ...] | None = None
    multiple: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.multiple, int) or isinstance(self.multiple, bool) \
                or self.multiple < 1:
            raise ArgumentError(f"Padded(multiple=...) needs an int >= 1, got {self.multiple!r}")
        if self.to is None:
            return
        if self.multiple != 1:
            raise ArgumentError("Padded takes to= (a fixed size) or multiple= (the batch's "
                             "largest, rounded up), not both")
        to = (self.to,) if isinstance(self.to, int) else tuple(int(x) for x in self.to)
        if not to or min(to) < 1:
            raise ArgumentError(f"Padded(to=...) needs sizes >= 1, got {self.to!r}")
        object.__setattr__(self, "to", to)


def check_collate(value) -> dict:
    """The Loader's ``collate`` argument as ``{field: "padded" | "ragged" | Padded}``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ArgumentTypeError(f"collate must be a dict of field name -> 'padded', 'ragged' or "
                        f"reader.Padded(to=...), not {type(value).__name__} {value!r}")
    for name, mode in value.items():
        if not isinstance(name, str):
            raise ArgumentTypeError(f"collate keys are field names, not {name!r}")
        if not (isinstance(mode, Padded) or mode in MODES):
            raise ArgumentError(f"collate[{name!r}] must be 'padded', 'ragged' or "
                             f"reader.Padded(to=...), not {mode!r}")
    return dict(value)


class Ragged:
    """Samples of different sizes back to back: ``self[i]`` is a view of sample ``i``.

    Attributes:
        values: the samples concatenated along their first dimension (flat, when
            ``shapes`` is given).
        offsets: ``[n + 1]`` int64: sample ``i`` is ``values[offsets[i]:offsets[i + 1]]``.
        shapes: ``[n, ndim]`` int32, or None: sample ``i`` is flat in ``values`` and
            reshaped to ``shapes[i]`` (images, whose two sides vary).
    """

    __slots__ = ("offsets", "shapes", "values")

    def __init__(self, values: np.ndarray, offsets: np.ndarray, shapes: np.ndarray | None = None):
        self.values = values
        self.offsets = offsets
        self.shapes = shapes

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} of a batch of {n}")
        i %= n
        part = self.values[int(self.offsets[i]):int(self.offsets[i + 1])]
        return part if self.shapes is None else part.reshape(tuple(self.shapes[i]))

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    @property
    def lengths(self) -> np.ndarray:
        """Items per sample (first dimension; elements when ``shapes`` is given)."""
        return np.diff(self.offsets)

    def tolist(self) -> list[np.ndarray]:
        return list(self)

    def copy(self) -> Ragged:
        """Owned arrays (the slot may be reused after this)."""
        return Ragged(self.values.copy(), self.offsets.copy(),
                      None if self.shapes is None else self.shapes.copy())

    def __repr__(self) -> str:
        return (f"Ragged({len(self)} samples, {self.values.dtype}, "
                f"lengths {self.lengths.tolist()})")


@dataclass(frozen=True)
class VarField:
    """One varying-size field of a slot: how it is stored and how big it may get.

    Attributes:
        name: the field (batch key).
        mode: ``"padded"`` or ``"ragged"``.
        dtype: numpy dtype string.
        var_dims: how many dimensions vary (2 for images, 1 for per-sample arrays).
        inner: the fixed dimensions after the varying ones (``(3,)`` for an RGB
            image, ``(4,)`` for boxes, ``()`` for labels or a mask).
        channels_first: images only: ``(C, H, W)`` samples (after ``Normalize(channels_first=True)``).
        bound: the largest size of each varying dimension in any sample.
        to: ``Padded(to=...)``'s fixed size, or None (pad to the batch's largest).
        batch_size: the most samples in a batch.
        multiple: ``Padded(multiple=...)``: the batch's sizes rounded up to it.
        limit: the most rows a batch holds in all (a ``BudgetBatches`` over this
            field), or None.
    """

    name: str
    mode: str
    dtype: str
    var_dims: int
    inner: tuple[int, ...]
    bound: tuple[int, ...]
    batch_size: int
    channels_first: bool = False
    to: tuple[int, ...] | None = None
    multiple: int = 1
    limit: int | None = None

    @property
    def capacity(self) -> int:
        """Elements the slot region holds: a whole batch of the largest samples, or
        ``limit`` rows when the batches are budgeted in this field's rows."""
        m = self.multiple
        dims = self.to or tuple(-(-d // m) * m for d in self.bound)
        whole = self.batch_size * math.prod(dims) * math.prod(self.inner)
        if self.limit is not None:
            whole = min(whole, self.limit * math.prod(self.inner))
        return whole

    def slot_specs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """The ``(name, dtype, shape)`` regions it takes in a slot (:class:`SlotLayout`)."""
        b = self.batch_size
        specs = [(self.name, self.dtype, (max(self.capacity, 1),))]
        if self.mode == "ragged":
            specs.append((self.name + "_offsets", "<i8", (b + 1,)))
        if self.mode == "padded" or self.var_dims > 1:
            specs.append((self.name + "_size", "<i4", (b, self.var_dims)))
        return specs

    def sample_shape(self, dims) -> tuple[int, ...]:
        if self.channels_first:
            return (*self.inner, *dims)
        return (*dims, *self.inner)

    # -- worker side -----------------------------------------------------------------

    def regions(self, slot: dict, sizes: list[tuple[int, ...]], first_record: int = -1
                ) -> tuple[list[np.ndarray], tuple[int, ...]]:
        """Where each sample of sizes ``sizes`` goes in ``slot``; writes the sizes and
        offsets, zeroes padding. Returns the per-sample regions (views, maybe strided)
        and the shape of the batch's whole array (what the main process rebuilds)."""
        n = len(sizes)
        flat = slot[self.name]
        if self.mode == "padded":
            if self.to is not None:
                dims = self.to
                for i, s in enumerate(sizes):
                    if any(a > b for a, b in zip(s, dims, strict=True)):
                        raise ValueError(f"field {self.name!r}: sample {i} has size {s}, "
                                         f"larger than Padded(to={dims})")
            else:
                m = self.multiple
                dims = tuple(-(-max((s[d] for s in sizes), default=0) // m) * m
                             for d in range(self.var_dims))
            shape = (n, *self.sample_shape(dims))
            if math.prod(shape) > flat.size:
                big = max(range(n), key=lambda i: math.prod(sizes[i]))
                raise ValueError(
                    f"field {self.name!r}: sample {big} of the batch has size {sizes[big]}, "
                    f"larger than any the slot was sized for ({self.bound}, the largest the "
                    "dataset's sizes allow: a metadata table whose width or height is wrong, "
                    "or a SampleTransform that makes samples larger)")
            whole = flat[:math.prod(shape)].reshape(shape)
            slot[self.name + "_size"][:n] = sizes if n else 0
            regions = []
            for i, s in enumerate(sizes):
                region = whole[(i, slice(None), *map(slice, s)) if self.channels_first
                               else (i, *map(slice, s))]
                _zero_outside(whole[i], s, self.channels_first)
                regions.append(region)
            return regions, shape
        counts = [math.prod(s) for s in sizes]
        per = math.prod(self.inner)
        offsets = slot[self.name + "_offsets"]
        offsets[0] = 0
        np.cumsum(counts, out=offsets[1:n + 1])
        total = int(offsets[n])
        if total * per > flat.size:
            big = max(range(n), key=lambda i: counts[i])
            raise ValueError(f"field {self.name!r}: the batch holds {total * per} elements, "
                             f"more than the slot's {flat.size} (its largest, sample {big}, "
                             f"has size {sizes[big]}; the slot was sized for {self.bound} a "
                             "sample)")
        if self.var_dims > 1:
            slot[self.name + "_size"][:n] = sizes if n else 0
            shape = (total * per,)
            regions = [flat[int(offsets[i]) * per:int(offsets[i + 1]) * per]
                       .reshape(self.sample_shape(s)) for i, s in enumerate(sizes)]
            return regions, shape
        shape = (total, *self.inner)
        values = flat[:total * per].reshape(shape)
        return [values[int(offsets[i]):int(offsets[i + 1])] for i in range(n)], shape

    # -- main-process side -----------------------------------------------------------

    def view(self, slot: dict, shape: tuple[int, ...], n: int, out: dict) -> None:
        """Put the batch's views of this field into ``out`` (``shape`` as the worker said)."""
        flat = slot[self.name]
        whole = flat[:math.prod(shape)].reshape(shape)
        if self.mode == "padded":
            out[self.name] = whole
            out[self.name + "_size"] = slot[self.name + "_size"][:n]
            return
        offsets = slot[self.name + "_offsets"][:n + 1]
        shapes = None
        if self.var_dims > 1:
            # Images are flat: offsets in elements, not rows; each sample's whole shape.
            offsets = offsets * math.prod(self.inner)
            sizes = slot[self.name + "_size"][:n]
            inner = np.broadcast_to(np.array(self.inner, sizes.dtype), (n, len(self.inner)))
            shapes = np.concatenate([inner, sizes] if self.channels_first else [sizes, inner],
                                    axis=1)
        out[self.name] = Ragged(whole, offsets, shapes)


def _zero_outside(sample: np.ndarray, size: tuple[int, ...], channels_first: bool) -> None:
    """Zero the padding of one padded sample (everything beyond ``size``)."""
    view = sample if not channels_first else np.moveaxis(sample, 0, -1)
    if len(size) == 1:
        view[size[0]:] = 0
        return
    h, w = size[:2]
    view[h:] = 0
    view[:h, w:] = 0


def assemble(slot: dict, fixed: tuple[str, ...], var: tuple[VarField, ...],
             shapes: dict, n: int) -> dict:
    """The batch the main process hands out: views of ``slot`` for ``n`` samples."""
    batch = {name: slot[name][:n] for name in fixed}
    for f in var:
        f.view(slot, shapes[f.name], n, batch)
    return batch
