"""The transform specs, where the README teaches them: ``from reader.transforms import
RandomResizedCrop, ...`` (they live in :mod:`reader.pipeline.transforms`)."""

from .pipeline.transforms import (
    CenterCrop,
    ImagePipeline,
    Normalize,
    Pad,
    PadToMultiple,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ResizeShortestEdge,
    SampleTransform,
    UserTransform,
)

__all__ = [
    "CenterCrop",
    "ImagePipeline",
    "Normalize",
    "Pad",
    "PadToMultiple",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "ResizeShortestEdge",
    "SampleTransform",
    "UserTransform",
]
