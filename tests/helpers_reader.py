"""Small datasets and pipelines for the reader tests (tiny images, seconds to build)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import simplejpeg

from formats import DatasetWriter, Field
from reader.errors import DecodeError

SIDE = 32


def tiny_jpeg(rng: np.random.Generator, label: int, h: int = 40, w: int = 48) -> bytes:
    img = np.full((h, w, 3), (label * 37) % 256, np.uint8)
    img[: h // 2] = rng.integers(0, 256, (h // 2, w, 3), dtype=np.uint8)
    return simplejpeg.encode_jpeg(img, quality=90)


def make_dataset(root: Path, n: int = 200, *, records_per_shard: int = 50, seed: int = 0,
                 corrupt: tuple[int, ...] = (), extra: bool = True) -> Path:
    """``n`` records: image (jpeg), label = index, score = index / 2, key = "k<index>"."""
    rng = np.random.default_rng(seed)
    fields = [Field("image", "jpeg"), Field("label", "int")]
    if extra:
        fields += [Field("score", "float"), Field("key", "str")]
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=records_per_shard,
                       durable=False) as w:
        for i in range(n):
            data = b"not a jpeg at all" * 3 if i in corrupt else tiny_jpeg(rng, i)
            rec = {"image": data, "label": i}
            if extra:
                rec.update(score=i / 2, key=f"k{i}")
            w.write(rec)
    return root


class CropPipeline:
    """Decode, crop the top-left SIDE x SIDE, flip with p=0.5 from the batch rng.

    ``fail_on``: raise ZeroDivisionError when the decoded image's first pixel (the
    fill value) equals ``(label * 37) % 256`` of that label (a "user transform bug").
    """

    output_shape = (SIDE, SIDE, 3)

    def __init__(self, fail_on: int | None = None, sleep: float = 0.0) -> None:
        self.fail_on = fail_on
        self.sleep = sleep

    def run(self, view, out, rng):
        t = time.perf_counter()
        try:
            img = simplejpeg.decode_jpeg(view)
        except ValueError as exc:
            raise DecodeError(f"cannot decode ({exc})") from None
        d = time.perf_counter() - t
        if self.fail_on is not None and int(img[-1, 0, 0]) == (self.fail_on * 37) % 256:
            raise ZeroDivisionError(f"user transform failed on label {self.fail_on}")
        if self.sleep:
            time.sleep(self.sleep)
        crop = img[:SIDE, :SIDE]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        out[...] = crop
        return d, time.perf_counter() - t - d


def spy_rejects(monkeypatch) -> list[int]:
    """The batch rows :meth:`reader.transforms.bad_input.BadInput.reject` is called with,
    from now on (it still rejects): what shows every bad sample went through the policy."""
    from reader.transforms.bad_input import BadInput

    calls: list[int] = []
    reject = BadInput.reject

    def spy(self, exc, valid, i):
        calls.append(i)
        return reject(self, exc, valid, i)

    monkeypatch.setattr(BadInput, "reject", spy)
    return calls
