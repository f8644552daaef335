"""Whole samples in the workers: an image, its masks and annotations, one geometry.

The classification path (:class:`reader.runtime.worker.BatchBuilder` alone) decodes one
image field of a fixed size per record. This path serves everything else: images
whose size varies (``ResizeShortestEdge``, ``Resize(int)``, no transform at all),
boxes, keypoints and masks that must follow their image, per-sample arrays of
any length, and :class:`reader.transforms.SampleTransform` callables on the whole
sample. Per batch:

1. the records' payloads are paged in and their arrays read (``io``);
2. each image's size comes from its header and its :class:`Plan` is drawn from
   the batch's random stream, in record order (``decode`` with step 3);
3. each decoded field (the image, then its masks) is decoded with its plan straight
   into its region of the slot by the kernel of its kind
   (:mod:`reader.transforms.kernels`: for the image DCT scaling, crop, resize and flip
   in one pass, as on the classification path; for a mask nearest-neighbour);
4. each moved field (boxes, keypoints) is moved by the same plan by its kind's
   kernel; rows a filtering kernel drops (boxes cropped away) go together with the
   same rows of every per-box field (``transform``);
5. the per-sample arrays are written padded or ragged (:mod:`reader.transforms.collate`,
   ``assemble``).

With sample callables, step 3 decodes into arrays of their own, the callables run
on the whole sample, and what they return is written in step 5.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from formats.errors import ArgumentError, ArgumentTypeError

from ..data.dataset import page_in
from ..errors import DecodeError
from .bad_input import BadInput
from .collate import VarField
from .kernels import KERNELS, KernelParams

__all__ = ["Annotations", "FieldDecoder", "SampleBuilder", "SampleSpec"]

@dataclass(frozen=True)
class Annotations:
    """Which fields follow the image's geometry (the Loader's ``annotations=``).

    Left at None, each is found in the dataset: ``boxes`` is an ndarray field named
    ``boxes`` of shape ``[None, 4]`` (xyxy pixels); ``per_box`` the ndarray fields
    whose first dimension varies and which are named ``labels``, ``iscrowd``,
    ``area``, ``keypoints``, ``scores`` or ``classes``, or have as many rows as
    ``boxes`` in every record by the shard index (a compressed one of another
    name must be listed); ``keypoints`` a
    field named ``keypoints`` of shape ``[None, K, 2 or 3]``; ``masks`` the image
    fields named ``mask`` or ending in ``_mask``. Per-box fields are checked per
    record to have one row per box.

    Attributes:
        boxes: the boxes field, or ``""`` for none.
        per_box: the fields with one row per box, filtered with the boxes.
        keypoints: the keypoints field, or ``""``.
        masks: label-image fields resampled with the image, nearest-neighbour.
        min_box_size: boxes smaller than this (output pixels) after the transforms are dropped.
    """

    boxes: str | None = None
    per_box: tuple[str, ...] | None = None
    keypoints: str | None = None
    masks: tuple[str, ...] | None = None
    min_box_size: float = 1.0

    def __post_init__(self) -> None:
        if self.min_box_size < 0:
            raise ArgumentError(f"min_box_size must be >= 0, not {self.min_box_size}")
        for name in ("per_box", "masks"):
            v = getattr(self, name)
            if isinstance(v, str):
                raise ArgumentTypeError(f"{name} must be a tuple of field names, not the string {v!r}")
            if v is not None:
                object.__setattr__(self, name, tuple(v))


@dataclass(frozen=True)
class FieldDecoder:
    """Decode a bytes field in the workers with a user callable (audio, compressed
    arrays, anything the loader does not decode itself); the Loader's ``decoders=``.

    The result is written into the batch slot like any array whose first dimension
    varies (ragged by default, see :mod:`reader.transforms.collate`), so the slot must be sized
    for it: ``max_rows`` bounds the first dimension. The monitor counts the time as
    ``decode``.

    Attributes:
        fn: ``fn(data) -> array`` of ``dtype`` and shape ``[rows, *inner]``; ``data``
            is the stored bytes (a zero-copy memoryview). Picklable (module level).
        dtype: the array's dtype.
        max_rows: the most rows one sample decodes to (e.g. 30 s of 16 kHz audio: 480,000).
        inner: the fixed dimensions after the first (``(2,)`` for stereo samples).
    """

    fn: Any
    dtype: str
    max_rows: int
    inner: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ArgumentTypeError(f"FieldDecoder fn must be callable, not {self.fn!r}")
        object.__setattr__(self, "dtype", np.dtype(self.dtype).str)
        if not isinstance(self.max_rows, int) or isinstance(self.max_rows, bool) \
                or self.max_rows < 1:
            raise ArgumentError(f"FieldDecoder max_rows must be an int >= 1, not {self.max_rows!r}")
        object.__setattr__(self, "inner", tuple(int(d) for d in self.inner))


@dataclass(frozen=True)
class SampleSpec:
    """What the sample path writes (planned once by the loader, see :mod:`reader.loader`).

    Fields are named with their kind, a key of :data:`reader.transforms.kernels.KERNELS`;
    the builder dispatches on it.

    Attributes:
        image: the field the geometry is planned on (its header gives the source
            size), decoded through the pipeline (None: no image).
        decoded: ``(field, kind, VarField or None)`` of the fields decoded with the
            plan, the image first (None: a fixed shape).
        moved: ``(field, kind)`` of the array fields the plan moves (boxes, keypoints).
        per_box: fields losing the rows a filtering kernel drops (with the boxes).
        arrays: every varying-size array field read in the workers, boxes included.
        params: what the kernels need besides the plan.
        decoders: ``(field, FieldDecoder)`` of the fields decoded by user callables
            (their :class:`VarField` is among ``arrays``).
    """

    image: str | None
    decoded: tuple[tuple[str, str, VarField | None], ...]
    moved: tuple[tuple[str, str], ...]
    per_box: tuple[str, ...]
    arrays: tuple[VarField, ...]
    params: KernelParams
    decoders: tuple[tuple[str, FieldDecoder], ...] = ()

    @property
    def image_var(self) -> VarField | None:
        """How the image is stored when its size varies (None: fixed shape, or no image)."""
        return self.decoded[0][2] if self.decoded else None

    @property
    def var_fields(self) -> tuple[VarField, ...]:
        return (*(v for _, _, v in self.decoded if v is not None), *self.arrays)


class SampleBuilder:
    """Fills one batch through the sample path (a worker owns one).

    ``current`` names the record being worked on, for error messages.
    """

    def __init__(self, ds, spec: SampleSpec, pipeline, bad_input: BadInput) -> None:
        self.ds = ds
        self.spec = spec
        self.pipeline = pipeline  # reader.transforms.imaging.DecoderPipeline
        self.bad_input = bad_input  # what a sample that does not decode becomes
        self.current: int | None = None
        self._decoded_fields = [(name, KERNELS[kind], var) for name, kind, var in spec.decoded]
        moved = [(name, KERNELS[kind]) for name, kind in spec.moved]
        self._filters = [(name, k) for name, k in moved if k.filters]
        self._movers = [(name, k) for name, k in moved if not k.filters]

    def build(self, indices: np.ndarray, slot: dict, rng: np.random.Generator, valid):
        """Returns ``(io_s, decode_s, transform_s, assemble_s, bytes, skipped, shapes)``."""
        spec, ds = self.spec, self.ds
        idx = indices.tolist()
        n = len(idx)
        t = time.perf_counter()
        payloads = [ds.payloads(indices, name) for name, _, _ in self._decoded_fields]
        views = payloads[0] if payloads else []
        nbytes = sum(page_in(p) for p in payloads)
        decoded = dict(spec.decoders)
        arrays = {f.name: [self._array(r, f) for r in idx] for f in spec.arrays
                  if f.name not in decoded}
        io_s = time.perf_counter() - t

        t = time.perf_counter()
        for name, dec in spec.decoders:
            arrays[name] = [self._decoded(r, v, name, dec)
                            for r, v in zip(idx, ds.payloads(indices, name), strict=True)]
        decode_s = time.perf_counter() - t
        transform_s = 0.0
        skipped = 0
        sizes: list[tuple[int, int]] = []
        plans: list = []
        decoder = self.pipeline.decoder() if spec.image else None
        t = time.perf_counter()
        draws = self.pipeline.pipeline.batch_draws(rng) if spec.image else None
        for i, v in enumerate(views):
            self.current = idx[i]
            try:
                hw = decoder.size_of(v)
            except DecodeError as exc:
                hw = self._skip(i, exc, valid)
                skipped += 1
            sizes.append(hw)
            plans.append(self.pipeline.pipeline.plan(*hw, rng, draws) if hw != (0, 0) else None)
        decode_s += time.perf_counter() - t

        t = time.perf_counter()
        for i in range(n):
            self.current = idx[i]
            self._follow(arrays, i, plans[i] if plans else None, sizes[i] if sizes else None)
        transform_s += time.perf_counter() - t

        shapes: dict[str, tuple] = {}
        if spec.image and self.pipeline.pipeline.samples:
            d, tr, a, k = self._with_callables(idx, payloads, sizes, plans, arrays, slot,
                                               shapes, rng, valid)
            decode_s, transform_s, assemble_s, skipped = (decode_s + d, transform_s + tr, a,
                                                          skipped + k)
        else:
            d, tr, a, k = self._decode_into_slot(idx, payloads, sizes, plans, slot, shapes,
                                                 rng, valid, arrays)
            decode_s, transform_s, skipped = decode_s + d, transform_s + tr, skipped + k
            t = time.perf_counter()
            self._write_arrays(arrays, slot, shapes, idx)
            assemble_s = a + time.perf_counter() - t
        self.current = None
        return io_s, decode_s, transform_s, assemble_s, nbytes, skipped, shapes

    # -- steps -----------------------------------------------------------------------

    def _array(self, record: int, f: VarField) -> np.ndarray:
        a = self.ds.get(record, f.name)
        if a.shape[1:] != f.inner:
            raise ValueError(f"field {f.name!r} of record {record} has shape {a.shape}; "
                             f"expected [N, {', '.join(map(str, f.inner))}]")
        return a

    def _decoded(self, record: int, data, name: str, dec: FieldDecoder) -> np.ndarray:
        """One field through its user decoder, the result checked against its declaration."""
        self.current = record
        a = dec.fn(data)
        fn = getattr(dec.fn, "__qualname__", repr(dec.fn))
        want = f"{np.dtype(dec.dtype)} [rows{''.join(f', {d}' for d in dec.inner)}]"
        if not isinstance(a, np.ndarray) or a.dtype != np.dtype(dec.dtype) \
                or a.shape[1:] != dec.inner or a.ndim != 1 + len(dec.inner):
            got = f"{a.dtype} {list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
            raise TypeError(f"decoder {fn} of field {name!r} returned {got} for record "
                            f"{record}; FieldDecoder declares {want}")
        if len(a) > dec.max_rows:
            raise ValueError(f"decoder {fn} of field {name!r} returned {len(a)} rows for record "
                             f"{record}, more than FieldDecoder(max_rows={dec.max_rows})")
        return a

    def _skip(self, i: int, exc: Exception, valid) -> tuple[int, int]:
        self.bad_input.reject(exc, valid, i)
        return (0, 0)

    def _follow(self, arrays: dict, i: int, plan, size) -> None:
        """Step 4: move this sample's array fields with its image, each by its kind's kernel."""
        for name, kernel in self._filters:
            self._filter(arrays, i, name, kernel, plan, size)
        if plan is not None:
            params = self.spec.params
            for name, kernel in self._movers:
                arrays[name][i] = kernel.move(arrays[name][i], plan, params)[0]

    def _filter(self, arrays: dict, i: int, name: str, kernel, plan, size) -> None:
        """A filtering kernel's field (the boxes), and the same rows of every per-box field."""
        spec = self.spec
        boxes = arrays[name][i]
        for other in spec.per_box:
            if len(arrays[other][i]) != len(boxes):
                raise ValueError(f"record {self.current}: field {other!r} has "
                                 f"{len(arrays[other][i])} rows, boxes has {len(boxes)}: "
                                 f"per-box fields need one row per box (annotations=)")
        if plan is None:  # no image, or a skipped one: nothing to place the boxes on
            keep = np.zeros(len(boxes), bool) if size == (0, 0) else np.ones(len(boxes), bool)
            moved = boxes[keep]
        else:
            moved, keep = kernel.move(boxes, plan, spec.params)
        arrays[name][i] = moved
        for other in spec.per_box:
            arrays[other][i] = arrays[other][i][keep]

    def _decode(self, decoder, payloads: list, i: int, size, plan, outs: list, rng) -> float:
        """Step 3 for sample ``i``: each decoded field into its ``outs``, by its kind's
        kernel; returns the seconds of user transforms among it."""
        tr = 0.0
        for (_, kernel, _), p, out in zip(self._decoded_fields, payloads, outs, strict=True):
            tr += kernel.decode(decoder, p[i], *size, plan, out, rng)
        return tr

    def _decode_into_slot(self, idx, payloads, sizes, plans, slot, shapes, rng, valid,
                          arrays):
        """Step 3 on the fast path: every decoded field straight into its region of the slot."""
        spec = self.spec
        if not spec.image:
            return 0.0, 0.0, 0.0, 0
        t = time.perf_counter()  # laying out the padded or ragged regions is assembly
        out_sizes = [p.size if p is not None else (0, 0) for p in plans]
        regions = []
        for name, _, var in self._decoded_fields:
            if var is not None:
                r, shapes[name] = self._regions(var, slot, out_sizes, idx)
            else:
                r = slot[name]
            regions.append(r)
        assemble_s = time.perf_counter() - t
        decode_s = transform_s = 0.0
        skipped = 0
        decoder = self.pipeline.decoder()
        image_var = spec.image_var
        for i in range(len(plans)):
            if plans[i] is None:
                if image_var is None:
                    for r in regions:
                        r[i] = 0
                continue
            self.current = idx[i]
            t = time.perf_counter()
            try:
                tr = self._decode(decoder, payloads, i, sizes[i], plans[i],
                                  [r[i] for r in regions], rng)
            except DecodeError as exc:
                self._skip(i, exc, valid)
                for r in regions:
                    r[i][...] = 0
                # As a sample whose header did not read: no boxes, no size (its region,
                # laid out already, holds zeros; a ragged one keeps its place).
                for name in arrays:
                    arrays[name][i] = arrays[name][i][:0]
                if image_var is not None and image_var.mode == "padded":
                    slot[spec.image + "_size"][i] = 0
                skipped += 1
                continue
            decode_s += time.perf_counter() - t - tr
            transform_s += tr
        return decode_s, transform_s, assemble_s, skipped

    def _with_callables(self, idx, payloads, sizes, plans, arrays, slot, shapes, rng, valid):
        """Step 3 with sample callables: decode into arrays, run them, then write."""
        pipeline = self.pipeline.pipeline
        decoder = self.pipeline.decoder()
        decode_s = transform_s = 0.0
        skipped = 0
        samples = []
        for i in range(len(plans)):
            self.current = idx[i]
            sample = {name: arrays[name][i] for name in arrays}
            if plans[i] is not None:
                t = time.perf_counter()
                outs = [np.empty(k.shape(pipeline, plans[i].size), k.dtype(pipeline))
                        for _, k, _ in self._decoded_fields]
                try:
                    tr = self._decode(decoder, payloads, i, sizes[i], plans[i], outs, rng)
                    sample.update((name, out) for (name, _, _), out
                                  in zip(self._decoded_fields, outs, strict=True))
                except DecodeError as exc:
                    self._skip(i, exc, valid)
                    skipped += 1
                    plans[i] = None
                    tr = 0.0
                decode_s += time.perf_counter() - t - tr
                transform_s += tr
            if plans[i] is None:  # skipped: an empty sample, written as zeros
                sample = {name: arrays[name][i][:0] for name in arrays}
                for name, k, _ in self._decoded_fields:
                    sample[name] = np.zeros(k.shape(pipeline, (0, 0)), k.dtype(pipeline))
            else:
                t = time.perf_counter()
                for fn in pipeline.samples:
                    sample = self._call(fn, sample, rng)
                transform_s += time.perf_counter() - t
            samples.append(sample)
        t = time.perf_counter()
        self._write_samples(samples, slot, shapes, idx)
        return decode_s, transform_s, time.perf_counter() - t, skipped

    def _call(self, fn, sample: dict, rng) -> dict:
        """One sample callable, its result checked (a wrong one names the record)."""
        before = {k: (v.dtype, v.ndim) for k, v in sample.items()}
        result = fn(sample, rng)
        name = getattr(fn.fn, "__qualname__", repr(fn.fn))
        if not isinstance(result, dict):
            raise TypeError(f"SampleTransform {name} returned {type(result).__name__} for "
                            f"record {self.current}; it must return the sample dict")
        if set(result) != set(before):
            raise ValueError(f"SampleTransform {name} returned fields {sorted(result)} for "
                             f"record {self.current}; expected {sorted(before)}")
        for k, (dtype, ndim) in before.items():
            v = result[k]
            if not isinstance(v, np.ndarray) or v.dtype != dtype or v.ndim != ndim:
                got = (f"{v.dtype} with {v.ndim} dimensions" if isinstance(v, np.ndarray)
                       else type(v).__name__)
                raise TypeError(f"SampleTransform {name} returned {k!r} as {got} for record "
                                f"{self.current}; expected {dtype} with {ndim} dimensions")
        return result

    def _write_samples(self, samples: list[dict], slot: dict, shapes: dict, idx: list) -> None:
        pipeline = self.pipeline.pipeline
        for name, kernel, var in self._decoded_fields:
            values = [s[name] for s in samples]
            if var is not None:
                sizes = [kernel.size_of(a, var.channels_first) for a in values]
                regions, shapes[name] = self._regions(var, slot, sizes, idx)
                fixed = None
            else:
                regions = slot[name]
                fixed = kernel.fixed_shape(pipeline)
            for i, a in enumerate(values):
                if not a.size:
                    regions[i][...] = 0  # a skipped sample (a padded one is zeroed already)
                elif fixed is not None and a.shape != fixed:
                    raise ValueError(f"a SampleTransform returned {kernel.kind} {a.shape} for "
                                     f"batch sample {i}; this pipeline's {kernel.kind}s are "
                                     f"{fixed}")
                else:
                    regions[i][...] = a
        arrays = {f.name: [s[f.name] for s in samples] for f in self.spec.arrays}
        self._write_arrays(arrays, slot, shapes, idx)

    def _regions(self, var: VarField, slot: dict, sizes: list, idx: list):
        """``var.regions``; when the batch does not fit its slot, the error names the
        record of the largest sample (the likely culprit) as the one being worked on."""
        try:
            return var.regions(slot, sizes)
        except ValueError:
            if sizes:
                self.current = idx[max(range(len(sizes)), key=lambda i: math.prod(sizes[i]))]
            raise

    def _write_arrays(self, arrays: dict, slot: dict, shapes: dict, idx: list) -> None:
        """Step 5: the per-sample arrays, padded or ragged."""
        for f in self.spec.arrays:
            values = arrays[f.name]
            regions, shapes[f.name] = self._regions(f, slot, [(len(a),) for a in values], idx)
            for region, a in zip(regions, values, strict=True):
                region[: len(a)] = a
