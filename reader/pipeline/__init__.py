"""The per-sample pipeline a worker runs: encoded bytes in, the slot's arrays out.

:mod:`~reader.pipeline.transforms` (the transform specs and the planner that folds
them into one :class:`~reader.pipeline.geometry.Plan`), :mod:`~reader.pipeline.geometry`
(the plan, and the boxes and keypoints that follow it), :mod:`~reader.pipeline.kernels`
(how the plan applies to each kind of field: image, mask, boxes, keypoints; one table),
:mod:`~reader.pipeline.decode`
(decoding at the scale the plan needs, resampled straight into the slot),
:mod:`~reader.pipeline.imaging` (a pipeline as a worker calls it), :mod:`~reader.pipeline.sample`
(whole samples: annotations and user-decoded fields) and :mod:`~reader.pipeline.collate`
(fields whose size varies per sample, padded or ragged in the slot).
"""
