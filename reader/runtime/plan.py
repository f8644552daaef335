"""What a loader's batch holds and where each field of it is made, decided once.

:func:`plan_batch` reads the dataset's schema and the decode options and decides,
field by field: decoded in the workers (the image, masks), gathered into the slot
(int, float, fixed-shape arrays), written padded or ragged by the workers
(arrays whose first dimension varies, images whose size varies), or read in the
main process (strings, JSON, undecoded bytes). It also sizes the slot: a varying
field's region holds a batch of its largest samples, bounded from the dataset
(image sizes from the metadata table, row counts from the shard index).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from formats.errors import ArgumentError
from formats.fields import BOXES_FIELD, BYTES_TYPES, IMAGE_TYPES, PER_BOX_NAMES

from ..batching.batching import field_sizes, known_image_sizes
from ..transforms.bad_input import BadInput
from ..transforms.collate import Padded, VarField
from ..transforms.decode import image_size, pixel_budget
from ..transforms.imaging import make_pipeline
from ..transforms.kernels import KERNELS, KernelParams
from ..transforms.kernels import var_rows as _var_rows
from ..transforms.sample import Annotations, SampleSpec
from ..transforms.transforms import Resize, ResizeShortestEdge
from .slots import SlotLayout

__all__ = ["BatchPlan", "plan_batch"]


@dataclass(frozen=True)
class BatchPlan:
    """The outcome of :func:`plan_batch`.

    Attributes:
        image: the decoded image field, or None.
        pipeline: its worker pipeline (:class:`reader.transforms.imaging.DecoderPipeline`), or None.
        slot_fields: ``(name, type)`` of the scalar and fixed-shape array fields gathered.
        sample: the sample path's plan, or None for the classification path.
        main_fields: fields read in the main process.
        fixed: batch keys that are fixed-shape slot arrays (sliced to the batch).
        var_fields: the varying-size fields (:mod:`reader.transforms.collate`).
        layout: the slot layout.
    """

    image: str | None
    pipeline: Any
    slot_fields: tuple[tuple[str, str], ...]
    sample: SampleSpec | None
    main_fields: tuple[str, ...]
    fixed: tuple[str, ...]
    var_fields: tuple[VarField, ...]
    layout: SlotLayout


# The kinds the Loader's options can name (image_field=, reader.Annotations); a field
# of any other registered kind is found by its kernel's rule alone.
_NAMED_KINDS = ("image", "boxes", "keypoints", "mask")


def _found(kind: str, types: dict, names: tuple[str, ...], image: str | None) -> list[str]:
    """The fields among ``names`` (other than the image) of ``kind``, by its kernel's rule."""
    kernel = KERNELS[kind]
    return [n for n in names if n != image and kernel.finds(types[n])]


def _annotations(ann: Annotations | None, ds, types: dict, names: tuple[str, ...],
                 image: str | None, rows) -> tuple[dict[str, str], tuple[str, ...]]:
    """``({field: kind}, per_box)`` among ``names``, explicit or found (see Annotations).

    ``rows(name)`` gives a field's row counts per record (cached by the caller)."""
    ann = ann or Annotations()

    def named(value, default, what):
        if value == "":
            return None
        if value is not None:
            if value not in names:
                raise ArgumentError(f"annotations {what}={value!r}: no such field among those "
                                 f"read ({', '.join(names)})")
            return value
        return default

    boxes_default = next(iter(_found("boxes", types, names, image)), None)
    if ann.boxes is None and BOXES_FIELD in names and boxes_default is None \
            and image is not None:
        raise ArgumentError(_boxes_hint(types[BOXES_FIELD]))
    boxes = named(ann.boxes, boxes_default, "boxes")
    if boxes is not None and not (_var_rows(types[boxes]) and types[boxes].shape[1:] == (4,)):
        raise ArgumentError(f"boxes field {boxes!r} must be an ndarray of shape [None, 4] (xyxy "
                         f"pixels), not {types[boxes].type} {types[boxes].shape}")
    kp_default = next(iter(_found("keypoints", types, names, image)), None)
    keypoints = named(ann.keypoints, kp_default, "keypoints")
    if keypoints is not None and not (_var_rows(types[keypoints])
                                      and len(types[keypoints].shape) == 3
                                      and types[keypoints].shape[2] in (2, 3)):
        raise ArgumentError(f"keypoints field {keypoints!r} must be an ndarray of shape "
                         f"[None, K, 2 or 3], not {types[keypoints].shape}")
    if ann.per_box is not None:
        per_box = tuple(ann.per_box)
        for n in per_box:
            if n not in names or not _var_rows(types[n]):
                raise ArgumentError(f"annotations per_box: {n!r} is not an ndarray field with a "
                                 "varying first dimension among the fields read")
    elif boxes is not None:
        # The usual names (checked per record, so a broken one is an error, never a shift),
        # and any field with one row per box in every record (the index says).
        per_box = tuple(n for n in names if n != boxes and _var_rows(types[n]) and (
            n in PER_BOX_NAMES or (types[n].compression == types[boxes].compression == "none"
                                   and np.array_equal(rows(n), rows(boxes)))))
    else:
        per_box = ()
    if keypoints is not None and boxes is not None and keypoints not in per_box:
        per_box += (keypoints,)
    if ann.masks is not None:
        masks = tuple(ann.masks)
        for n in masks:
            if n not in names or types[n].type not in IMAGE_TYPES or n == image:
                raise ArgumentError(f"annotations masks: {n!r} is not an image field (other than "
                                 "the decoded image) among the fields read")
    else:
        masks = tuple(_found("mask", types, names, image))
    kinds = {n: kind for kind, found in (("boxes", (boxes,)), ("keypoints", (keypoints,)),
                                         ("mask", masks))
             for n in found if n is not None}
    for kind in KERNELS:
        if kind not in _NAMED_KINDS:
            kinds.update((n, kind) for n in _found(kind, types, names, image) if n not in kinds)
    return kinds, per_box


def _boxes_hint(f) -> str:
    """Why a field named ``boxes`` cannot follow the image, and the way out: a fixed
    count of boxes (every record the same) is a schema that said so, fixed by packing
    it with a variable first dimension."""
    text = (f"field {f.name!r} is {f.type} {f.dtype or ''} {f.shape or ''}, not the [None, 4] "
            "xyxy boxes that follow the image's geometry: ")
    if f.type == "ndarray" and len(f.shape or ()) == 2 and f.shape[1] == 4:
        dtype = np.dtype(f.dtype).name
        return text + (f"its first dimension is fixed ({f.shape[0]} boxes in every record); "
                       f"pack it with a variable one (pack_samples(..., schema={{'{f.name}': "
                       f"'{dtype}[None,4]', ...}}), per-box fields such as labels "
                       "likewise [None]), or pass annotations=reader.Annotations(boxes='') "
                       "to read it as it is, untransformed")
    return text + "pass annotations=reader.Annotations(boxes='') to read it as it is"


def _image_sizes(ds, image: str, max_pixels: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Every record's (heights, widths): the metadata table, headers where it has none;
    an image over the pixel budget ``max_pixels`` counts as size 0 (no slot is sized
    for it: the worker refuses or skips it)."""
    try:
        hw = known_image_sizes(ds)
    except Exception:  # no table (an old or foreign dataset): read every header
        hw = np.zeros((len(ds), 2), np.int64)
    unknown = np.flatnonzero((hw <= 0).any(axis=1))
    if unknown.size:
        hw = np.array(hw, np.int64)  # a private copy of the shared, read-only column

        for r in unknown.tolist():
            try:
                hw[r] = image_size(ds.payload(r, image), max_pixels)
            except Exception:
                continue  # a corrupt image: the worker reports (or skips) it when read
    over = hw[:, 0].astype(np.int64) * hw[:, 1] > pixel_budget(max_pixels)
    if over.any():  # never a slot for a pixel bomb: the worker refuses (or skips) it
        hw = np.where(over[:, None], 0, hw)
    return hw[:, 0], hw[:, 1]


def _var(name: str, mode, dtype, var_dims: int, inner, bound, batch_size: int,
         channels_first: bool = False, limit: int | None = None) -> VarField:
    """A :class:`VarField` from a ``collate`` value ("padded", "ragged" or ``Padded``)."""
    padded = isinstance(mode, Padded)
    if padded and mode.to is not None and len(mode.to) != var_dims:
        what = "(height, width)" if var_dims == 2 else "one count (rows)"
        raise ArgumentError(f"collate[{name!r}]: Padded(to={mode.to}) gives {len(mode.to)} "
                         f"size(s); {name!r} varies in {var_dims} dimension(s): give {what}")
    return VarField(name, "padded" if padded else mode, np.dtype(dtype).str, var_dims,
                    tuple(inner), tuple(bound), batch_size, channels_first,
                    mode.to if padded else None, mode.multiple if padded else 1, limit)


def _max_rows(ds, f, rows) -> int:
    """The most rows of ``f`` in any record: from the index, or for a compressed field
    from the manifest's largest uncompressed payload (no record is decompressed)."""
    if f.compression == "none":
        return int(rows(f.name).max(initial=0))
    raw = ds.manifest.max_raw_size.get(f.name, 0)
    header = 8 * (1 + len(f.shape))
    return max(0, (raw - header) // max(math.prod(f.shape[1:]) * np.dtype(f.dtype).itemsize, 1))


def plan_batch(ds, opts, batch_size: int, *, raw: bool, bad_input: BadInput,
               budget: tuple[str, int, bool] | None = None) -> tuple[BatchPlan, dict]:
    """Decide each field's path (see the module docstring).

    The steps, in order, each filling in a :class:`_Draft`: the image and the
    annotations that follow it (:func:`_choose_image`), the image's and the masks'
    regions (:func:`_image_regions`), the user decoders (:func:`_check_decoders`),
    every other field (:func:`_place_field`), the sample path (:func:`_sample_spec`),
    and the slot layout (:func:`_layout`).

    Args:
        ds: the dataset.
        opts: the loader's :class:`reader.options.DecodeOptions`.
        batch_size: the most records in a batch (the sampler's largest batch).
        raw: ``decode=False``: every field read in the main process.
        bad_input: the bad-input policy (``on_error`` resolved by the Loader): it
            says whether a batch carries the ``valid`` mask.
        budget: ``(field, budget, padded)`` when batches are budgeted in a field's
            rows (``BudgetBatches(size="field:NAME")``): its region holds that many.

    Returns:
        ``(plan, types)``: the plan, and the schema as field name -> Field.

    Raises:
        ValueError: an option that does not fit the dataset (named).
    """
    types = {f.name: f for f in ds.fields}
    names = opts.fields or tuple(types)
    collate = dict(opts.collate or {})
    unknown = [n for n in collate if n not in names]
    if unknown:
        raise ArgumentError(f"collate names {unknown[0]!r}, which is not among the fields read "
                         f"({', '.join(names)})")
    d = _Draft(ds, opts, batch_size, raw, types, names, collate, dict(opts.decoders or {}))
    if not raw:
        _choose_image(d)
    if d.image is not None:
        _image_regions(d)
    _check_decoders(d)
    for n in names:
        if n != d.image and n not in d.decoded:
            _place_field(d, n, budget)
    return _layout(d, _sample_spec(d), bad_input), types


@dataclass
class _Draft:
    """What :func:`plan_batch` has decided so far, filled in by its steps in order."""

    ds: Any
    opts: Any
    b: int  # the batch size the regions hold
    raw: bool
    types: dict
    names: tuple[str, ...]
    collate: dict
    decoders: dict
    image: str | None = None
    pipeline: Any = None
    kinds: dict = field(default_factory=dict)  # annotation field -> its kind (KERNELS' key)
    per_box: tuple[str, ...] = ()
    image_var: VarField | None = None
    specs: list = field(default_factory=list)  # (name, dtype, shape) of the slot's arrays
    var_fields: list = field(default_factory=list)
    decoded_vars: list = field(default_factory=list)  # (name, kind, VarField or None)
    slot_fields: list = field(default_factory=list)
    main: list = field(default_factory=list)
    arrays: list = field(default_factory=list)
    found: dict = field(default_factory=dict)

    def rows(self, name: str) -> np.ndarray:
        """An uncompressed field's rows per record, from the index (read once)."""
        if name not in self.found:
            self.found[name] = field_sizes(self.ds, name)
        return self.found[name]

    @property
    def core(self):
        """The ImagePipeline (None: no image, or a custom pipeline object)."""
        return getattr(self.pipeline, "pipeline", None)

    @property
    def fixed_image(self) -> bool:
        return self.pipeline is not None and self.pipeline.output_shape is not None

    @property
    def decoded(self) -> tuple[str, ...]:
        """The annotation fields decoded with the image's plan (masks)."""
        return tuple(n for n, k in self.kinds.items() if KERNELS[k].decoded)


def _choose_image(d: _Draft) -> None:
    """The image field, the annotations that follow its geometry, and its pipeline."""
    types, names, opts = d.types, d.names, d.opts
    image = opts.image_field
    if image is None:
        image = next((n for n in names if KERNELS["image"].finds(types[n])), None)
    if image is not None and types[image].type not in IMAGE_TYPES:
        raise ArgumentError(f"field {image!r} is {types[image].type}, not an image")
    d.image = image
    d.kinds, d.per_box = _annotations(opts.annotations, d.ds, types, names, image, d.rows)
    if image is None:
        if opts.transform is not None:
            raise ArgumentError("transform would have no effect: none of the fields read is an "
                             "image (fields=..., image_field=...)")
        return
    d.pipeline = make_pipeline(opts.transform, opts.max_pixels)
    for n, kind in d.kinds.items():
        KERNELS[kind].check(types[n], d.core)


def _image_regions(d: _Draft) -> None:
    """The image's region (fixed, or padded/ragged bounded from the dataset's sizes)
    and the masks', which follow it."""
    image, pipeline, core, collate, b = d.image, d.pipeline, d.core, d.collate, d.b
    if not d.fixed_image and core is None:
        raise ArgumentError("a custom pipeline object needs a fixed output_shape")
    if d.fixed_image:
        if image in collate:
            raise ArgumentError(f"collate[{image!r}]: this pipeline's images all have the shape "
                             f"{pipeline.output_shape}; only varying-size fields are "
                             "padded or ragged")
        dtype = core.dtype if core is not None else np.uint8
        d.specs.append((image, dtype, (b, *pipeline.output_shape)))
    else:
        bound = core.max_output(*_image_sizes(d.ds, image, d.opts.max_pixels))
        # Rounding in one resize changes the aspect ratio the next one sees, by a
        # pixel or two: a margin per resizing spec after the first keeps the bound.
        resizes = sum(isinstance(t, (Resize, ResizeShortestEdge)) for t in core.geometric)
        bound = tuple(x + 2 * max(resizes - 1, 0) for x in bound)
        d.image_var = _var(image, collate.get(image, "padded"), core.dtype, 2, (3,), bound, b,
                           bool(core.normalize and core.normalize.channels_first))
        d.var_fields.append(d.image_var)
    d.decoded_vars.append((image, "image", d.image_var))
    for m in d.decoded:
        kernel = KERNELS[d.kinds[m]]
        if d.fixed_image:
            if m in collate:
                raise ArgumentError(f"collate[{m!r}]: this pipeline's {kernel.kind}s all have the "
                                 f"size {pipeline.output_shape[:2]}; only varying-size fields "
                                 "are padded or ragged")
            size = core.resample_shape[:2] if core is not None else pipeline.output_shape[:2]
            d.specs.append((m, kernel.dtype(core), (b, *kernel.shape(core, size))))
            d.decoded_vars.append((m, kernel.kind, None))
        else:
            iv = d.image_var
            like_image = (iv.mode if iv.mode == "ragged" else
                          Padded(iv.to, 1 if iv.to else iv.multiple))
            # Its region has the image's sides; what the kernel adds after them is fixed.
            v = _var(m, collate.get(m, like_image), kernel.dtype(core), 2,
                     kernel.shape(core, ()), iv.bound, b)
            d.var_fields.append(v)
            d.decoded_vars.append((m, kernel.kind, v))


def _check_decoders(d: _Draft) -> None:
    """Each user decoder names a bytes field read, stored uncompressed, not an image."""
    types = d.types
    for n in d.decoders:
        if n not in d.names:
            raise ArgumentError(f"decoders names {n!r}, which is not among the fields read "
                             f"({', '.join(d.names)})")
        if types[n].type not in BYTES_TYPES or n == d.image or n in d.decoded:
            raise ArgumentError(f"decoders[{n!r}]: a FieldDecoder takes a bytes field's stored "
                             f"bytes; {n!r} is {types[n].type}"
                             + (" and decoded as an image already" if n in (d.image, *d.decoded)
                                else ""))
        if types[n].compression != "none":
            raise ArgumentError(f"decoders[{n!r}]: the field is stored {types[n].compression}-"
                             "compressed; a FieldDecoder reads stored bytes in place")


def _place_field(d: _Draft, n: str, budget: tuple[str, int, bool] | None) -> None:
    """Field ``n`` (not the image or a mask): decoded by a user decoder, gathered into
    the slot, written padded or ragged by the workers, or read in the main process."""
    f, collate, b = d.types[n], d.collate, d.b
    if d.raw:
        d.main.append(n)
    elif n in d.decoders:
        dec = d.decoders[n]
        v = _var(n, collate.get(n, "ragged"), dec.dtype, 1, dec.inner, (dec.max_rows,), b)
        d.arrays.append(v)
        d.var_fields.append(v)
    elif f.type in ("int", "float") or (f.type == "ndarray" and f.fixed_shape):
        if n in collate:
            raise ArgumentError(f"collate[{n!r}]: {n!r} has a fixed shape; only varying-size "
                             "fields are padded or ragged")
        d.slot_fields.append((n, f.type))
    elif _var_rows(f):
        dtype = f.dtype
        limit = None
        mode = collate.get(n, "ragged")
        if budget is not None and budget[0] == n and (
                mode == "ragged" or (mode == "padded" and budget[2])):
            limit = budget[1]  # the batch's rows (padded or summed) stay within it
        if n in d.kinds and KERNELS[d.kinds[n]].fractional and d.image is not None \
                and np.dtype(dtype).kind in "iub":
            dtype = np.float32  # moved coordinates are fractional: never truncated
        v = _var(n, mode, dtype, 1, f.shape[1:], (_max_rows(d.ds, f, d.rows),), b, limit=limit)
        d.arrays.append(v)
        d.var_fields.append(v)
    else:
        if n in collate:
            raise ArgumentError(f"collate[{n!r}]: {f.type} fields come as lists of values; "
                             "padded or ragged applies to images and arrays whose first "
                             "dimension varies")
        d.main.append(n)


def _sample_spec(d: _Draft) -> SampleSpec | None:
    """The sample path's plan, or None when the fixed-size image path serves."""
    core, opts = d.core, d.opts
    # Per-batch draws are made where a whole batch is planned: the sample path.
    needs_sample = (d.image_var is not None or d.arrays or d.kinds
                    or (core is not None and (core.samples or core.per_batch)))
    if not needs_sample or d.raw:
        return None
    if opts.decoded_cache is not None:
        raise ArgumentError("decoded_cache serves the fixed-size image path (one image field, "
                         "a fixed output size, no annotations or per-sample arrays)")
    if d.image is not None and core is None:
        raise ArgumentError("a custom pipeline object serves the fixed-size image path only; "
                         "annotations, masks, per-sample arrays and sizes that vary need "
                         "reader.transforms specs")
    params = KernelParams((opts.annotations or Annotations()).min_box_size,
                          getattr(core, "keypoint_pairs", ()))
    return SampleSpec(image=d.image, decoded=tuple(d.decoded_vars),
                      moved=tuple((n, k) for n, k in d.kinds.items() if not KERNELS[k].decoded),
                      per_box=d.per_box, arrays=tuple(d.arrays), params=params,
                      decoders=tuple(d.decoders.items()))


def _layout(d: _Draft, sample: SampleSpec | None, bad_input: BadInput) -> BatchPlan:
    """The slot's arrays, in order: the image's and masks' (already in ``d.specs``),
    the gathered fields, each varying field's region, the ``valid`` mask."""
    specs, b = d.specs, d.b
    for n, t in d.slot_fields:
        f = d.types[n]
        dt = {"int": np.int64, "float": np.float64}.get(t) or np.dtype(f.dtype)
        specs.append((n, dt, (b, *(f.shape or ()))))
    for v in d.var_fields:
        for name, *_ in v.slot_specs()[1:]:
            if name in d.names:
                raise ArgumentError(f"field {v.name!r} varies in size, so batches carry "
                                 f"{name!r} beside it, and the dataset has a field of that "
                                 f"name: leave that one out (fields=...)")
        specs.extend(v.slot_specs())
    if d.image is not None:
        specs.extend(bad_input.slot_specs(b))  # the valid mask, if bad samples are skipped
    in_var = {name for v in d.var_fields for name, *_ in v.slot_specs()}
    fixed = tuple(s[0] for s in specs if s[0] not in in_var)
    return BatchPlan(image=d.image, pipeline=d.pipeline, slot_fields=tuple(d.slot_fields),
                     sample=sample, main_fields=tuple(d.main), fixed=fixed,
                     var_fields=tuple(d.var_fields), layout=SlotLayout.build(specs))
