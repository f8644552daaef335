"""The checks of the Loader's pipeline keywords that need the pipeline's own types.

:mod:`reader.options` holds the records and the value checks that need nothing
above it; whether a ``transform`` is a spec of :mod:`reader.transforms`, an
``annotations`` an :class:`~reader.transforms.sample.Annotations`, a ``decoders``
entry a :class:`~reader.transforms.sample.FieldDecoder` or a ``collate`` mode one
of :mod:`~reader.transforms.collate`'s is checked here, beside those types. The
Loader runs :func:`check_pipeline_options` at construction, before it builds
:class:`reader.options.DecodeOptions`, so a wrong one fails there with a message
naming it and its value, never later in a worker.
"""

from __future__ import annotations

from typing import Any

from formats.errors import ArgumentTypeError

from .collate import check_collate
from .sample import Annotations, FieldDecoder
from .transforms import GEOMETRIC, ImagePipeline, Normalize, SampleTransform

__all__ = ["check_pipeline_options", "check_transform"]


def check_transform(value: Any) -> None:
    """None, a worker pipeline (``output_shape`` and ``run``), an ImagePipeline, a
    transform spec or callable, or a list or tuple of specs and callables.

    Raises:
        TypeError: names the item that is none of these (``transform[i]`` in a list).
    """
    def usable(t: Any) -> bool:
        return (isinstance(t, (*GEOMETRIC, Normalize, SampleTransform))
                or (callable(t) and not isinstance(t, type)))

    if value is None or isinstance(value, ImagePipeline) or (
            hasattr(value, "output_shape") and hasattr(value, "run")):
        return
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    for i, t in enumerate(items):
        if not usable(t):
            where = f"transform[{i}]" if isinstance(value, (list, tuple)) else "transform"
            raise ArgumentTypeError(
                f"{where} must be a transform spec from reader.transforms (e.g. "
                f"RandomResizedCrop(224)) or a callable on images, not "
                f"{type(t).__name__} {t!r}")


def check_pipeline_options(transform: Any = None, annotations: Any = None,
                           collate: Any = None, decoders: Any = None) -> None:
    """Check the Loader's ``transform``, ``annotations``, ``collate`` and ``decoders``
    keywords against the pipeline's types, in that order.

    Raises:
        TypeError: a keyword of the wrong type, naming it and its value.
        ValueError: a collate mode that is none of ``"padded"``, ``"ragged"``,
            ``Padded``.
    """
    check_transform(transform)
    if annotations is not None and not isinstance(annotations, Annotations):
        raise ArgumentTypeError("annotations must be a reader.Annotations or None, "
                                f"not {type(annotations).__name__} {annotations!r}")
    if collate is not None:
        check_collate(collate)
    if decoders is not None and (not isinstance(decoders, dict) or not all(
            isinstance(k, str) and isinstance(v, FieldDecoder) for k, v in decoders.items())):
        raise ArgumentTypeError("decoders must be a dict of field name -> reader.FieldDecoder, "
                                f"not {decoders!r}")
