"""Small inputs for the packer tests: tiny JPEGs, folders, file comparison."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import simplejpeg

from packer import PackOptions, PackProgress, PackSummary, pack_samples


def jpeg(rng: np.random.Generator, width: int = 24, height: int = 16, quality: int = 85) -> bytes:
    """A small, valid JPEG of random content."""
    arr = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    return simplejpeg.encode_jpeg(arr, quality)


def png(rng: np.random.Generator, width: int = 20, height: int = 12) -> bytes:
    from PIL import Image

    arr = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def image_folder(root: Path, rng: np.random.Generator, classes=("cat", "dog"), per_class: int = 5,
                 sizes=None) -> dict[str, bytes]:
    """Write ``root/<class>/<i>.jpg``; returns key -> bytes."""
    out = {}
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = sizes(i) if sizes else (16 + i, 12 + 2 * i)
            data = jpeg(rng, w, h)
            (root / c / f"{i:03d}.jpg").write_bytes(data)
            out[f"{c}/{i:03d}.jpg"] = data
    return out


def dataset_files(root: Path) -> dict[str, bytes]:
    """Every file in a dataset folder, name -> bytes (for byte-for-byte comparisons)."""
    return {p.name: p.read_bytes() for p in sorted(Path(root).iterdir()) if p.is_file()}



class StopAfter(PackProgress):
    """A pack's progress that simulates Ctrl-C once ``n`` inputs are done."""

    def __init__(self, n: int) -> None:
        self.n, self.done = n, 0

    def advance(self, records, nbytes):
        self.done += records
        if self.done >= self.n:
            raise KeyboardInterrupt


def pack_fn(fn, inputs, dst, *, schema=None, progress=False, **options) -> PackSummary:
    """``pack_samples`` with its :class:`packer.PackOptions` written as keywords, as the
    tests spell them (``workers=0, records_per_shard=5``); no bar by default."""
    return pack_samples(fn, inputs, dst, PackOptions(**options), schema=schema,
                        progress=progress)
