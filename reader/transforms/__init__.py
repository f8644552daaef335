"""The per-sample pipeline a worker runs: encoded bytes in, the slot's arrays out.

The face of the pipeline exports the transform specs: ``from reader.transforms import
RandomResizedCrop, ...`` (each also on :mod:`reader`). The modules behind it:
:mod:`~reader.transforms.transforms` (the transform specs and the planner that folds
them into one :class:`~reader.transforms.geometry.Plan`), :mod:`~reader.transforms.geometry`
(the plan, and the boxes and keypoints that follow it), :mod:`~reader.transforms.kernels`
(how the plan applies to each kind of field: image, mask, boxes, keypoints; one table),
:mod:`~reader.transforms.decode`
(decoding at the scale the plan needs, resampled straight into the slot),
:mod:`~reader.transforms.imaging` (a pipeline as a worker calls it), :mod:`~reader.transforms.sample`
(whole samples: annotations and user-decoded fields) and :mod:`~reader.transforms.collate`
(fields whose size varies per sample, padded or ragged in the slot).
"""

from .transforms import (
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
