"""The per-kind kernels (reader.transforms.kernels): a new kind of annotation is one kernel
registered in KERNELS, with no edit to the sample path or the batch plan."""

from __future__ import annotations

import numpy as np
import simplejpeg

from formats import DatasetWriter, Field
from reader import Loader
from reader.transforms import RandomHorizontalFlip, Resize
from reader.transforms.geometry import move_keypoints
from reader.transforms.kernels import KERNELS, Kernel


class _CentersKernel(Kernel):
    """Centre points ``[N, 2]``: moved as keypoints without visibility."""

    kind = "centers"
    fractional = True

    def finds(self, field):
        return field.name == "centers"

    def move(self, value, plan, params):
        return move_keypoints(value[:, None, :], plan)[:, 0, :], None


def test_a_registered_kind_follows_the_image(tmp_path, monkeypatch):
    monkeypatch.setitem(KERNELS, "centers", _CentersKernel())
    root = tmp_path / "ds"
    fields = [Field("image", "jpeg"), Field("centers", "ndarray", dtype="int32", shape=(None, 2))]
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=16, durable=False) as w:
        w.write({"image": simplejpeg.encode_jpeg(np.zeros((40, 80, 3), np.uint8)),
                 "centers": np.array([[10, 20], [70, 5]], np.int32)},
                meta={"height": 40, "width": 80})
    loader = Loader(root, 1, num_workers=0,
                    transform=[Resize((20, 40)), RandomHorizontalFlip(1.0)])
    batch = next(iter(loader))
    # Halved, then mirrored in a 40 px wide image; int32 becomes float32 (fractional).
    assert batch["centers"][0].dtype == np.float32
    np.testing.assert_array_equal(batch["centers"][0], [[35, 10], [5, 2.5]])


def test_every_kind_is_registered_under_its_own_name():
    assert {"image", "mask", "boxes", "keypoints"} <= set(KERNELS)
    assert all(kind == k.kind for kind, k in KERNELS.items())
