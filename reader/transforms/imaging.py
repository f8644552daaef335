"""Adapts an image pipeline to what a worker calls per sample.

A worker needs two things from a pipeline: ``output_shape`` (H, W, C), known
before any image is decoded so the slot ring can be allocated, and
``run(view, out, rng) -> (decode_s, transform_s)``, which decodes the image in
``view`` straight into ``out`` (a slot region) and reports the time split. Any
object with those two members is used as is; it should count what it does
after decoding (augmentations, user code) as ``transform_s``, or the monitor
blames decoding for it. A
:class:`reader.transforms.ImagePipeline`, or a list of transform specs and
callables to build one from, is wrapped around a :class:`reader.transforms.decode.Decoder`.
"""

from __future__ import annotations

import time
from typing import Any

from .decode import Decoder, check_backend
from .transforms import ImagePipeline

__all__ = ["DecoderPipeline", "make_pipeline"]


def make_pipeline(transform: Any, max_pixels: int | None = None):
    """The worker-side pipeline for ``transform`` (see the module docstring); None is
    the empty pipeline (whole images, each of its own size). An
    :class:`ImagePipeline` keeps its ``backend``; a list of specs gets ``"auto"``.
    ``max_pixels`` is the pixel budget of its decoder (None: the default,
    :data:`formats.media.MAX_PIXELS`); a custom pipeline object decodes by itself.

    Raises:
        ValueError: the specs are out of order.
        ImportError: the pipeline's resize backend cannot be imported (said here, in
            the main process, not in a worker at the first batch).
    """
    if hasattr(transform, "output_shape") and hasattr(transform, "run"):
        return transform
    if not isinstance(transform, ImagePipeline):
        specs = [] if transform is None else (
            list(transform) if isinstance(transform, (list, tuple)) else [transform])
        transform = ImagePipeline(specs)
    check_backend(transform.backend)
    return DecoderPipeline(transform, transform.backend, max_pixels)


class DecoderPipeline:
    """An :class:`ImagePipeline` run by a :class:`reader.transforms.decode.Decoder`.

    The decoder is built on first use, i.e. inside the worker process (it sets
    process-wide OpenCV threading and owns a scratch buffer), and is not pickled.
    Decode, crop, resize and flip are one fused step (the DCT scale does part of
    the resize), reported as ``decode_s``; the user callables that follow are
    ``transform_s`` (see :meth:`reader.transforms.decode.Decoder.decode_timed`).
    """

    def __init__(self, pipeline, backend: str = "auto", max_pixels: int | None = None) -> None:
        self.pipeline = pipeline
        self.backend = backend
        self.max_pixels = max_pixels
        self.output_shape = None if pipeline.output_shape is None else tuple(pipeline.output_shape)
        self._decoder = None

    def __getstate__(self) -> dict:
        return {"pipeline": self.pipeline, "backend": self.backend,
                "max_pixels": self.max_pixels}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["pipeline"], state["backend"], state["max_pixels"])

    def decoder(self):
        """This process's :class:`reader.transforms.decode.Decoder` (built on first use)."""
        if self._decoder is None:
            self._decoder = Decoder(self.pipeline, self.backend, roi=self.pipeline.roi,
                                    max_pixels=self.max_pixels)
        return self._decoder

    def run(self, view, out, rng) -> tuple[float, float]:
        if self._decoder is None:
            t = time.perf_counter()
            self.decoder()
            setup_s = time.perf_counter() - t  # first sample only: counted as decoding
            decode_s, transform_s = self._decoder.decode_timed(view, out, rng)
            return setup_s + decode_s, transform_s
        return self._decoder.decode_timed(view, out, rng)

    def run_cached(self, cache, record: int, view, out, rng) -> tuple[float, float]:
        """:meth:`run` through a :class:`reader.runtime.decoded_cache.DecodedCache`: a hit
        resamples the cached pixels (no decode); a miss decodes the whole image,
        stores it when there is room, and resamples it. The same pixels as :meth:`run`:
        a crop that the fused path decodes at another DCT scale than the cached
        pixels' is decoded from ``view`` (:meth:`reader.transforms.decode.Decoder.from_cache`)."""
        decoder = self.decoder()
        hit = cache.get(record)
        if hit is not None:
            return decoder.from_cache(view, *hit, out, rng)
        t = time.perf_counter()
        image, height, width, scale = decoder.decode_for_cache(view, cache.short_side)
        decode_s = time.perf_counter() - t
        image = cache.put(record, image, height, width, scale)
        more_s, transform_s = decoder.from_cache(view, image, height, width, scale, out, rng)
        return decode_s + more_s, transform_s
