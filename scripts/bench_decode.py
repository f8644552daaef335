"""Single-core rates of the per-sample decode path, and the resize backend comparison.

Usage: ``python -m scripts.bench_decode [--count 300] [--rounds 3]``. Every rate is
the best of ``--rounds`` passes over the same synthetic ~100 KB JPEGs (300-500 px),
since other processes share the machine. OpenCV is optional; its rows are skipped
when it is not installed.

The last table splits the classification pipeline's per-image CPU time (this
thread's, so that time the shared machine gives to others does not count) into
decode, resample (with the flip) and the rest (header, plan, checks, Python), with and
without the region-of-interest decode (:mod:`reader.transforms.roi`), in alternated
rounds: medians over ``--rounds`` (at least 5), the median of the two sides' ratio in
each round, and the spread of the totals.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable, Sequence

import numpy as np
import simplejpeg
from PIL import Image

from reader.transforms import ImagePipeline, RandomHorizontalFlip, RandomResizedCrop, roi
from reader.transforms.decode import Decoder
from scripts import harness as h
from scripts.synth import make_jpeg

SIZE = 224


def _rate(fn: Callable[[bytes], object], jpegs: list[bytes], rounds: int) -> float:
    """Items per second, the best of ``rounds`` passes."""

    def one_pass() -> None:
        for data in jpegs:
            fn(data)

    return len(jpegs) / min(h.timed(one_pass) for _ in range(rounds))


def _naive(rng: np.random.Generator) -> Callable[[bytes], np.ndarray]:
    """What a torchvision user does: full decode, crop, resize with Pillow, flip, HWC->CHW."""
    crop = RandomResizedCrop(SIZE)

    def run(data: bytes) -> np.ndarray:
        full = simplejpeg.decode_jpeg(data)
        top, left, h, w = crop.get_params(full.shape[0], full.shape[1], rng)
        img = Image.fromarray(full).crop((left, top, left + w, top + h))
        img = img.resize((SIZE, SIZE), Image.Resampling.BILINEAR)
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1))

    return run


def _ours(backend: str, rng: np.random.Generator,
          use_roi: bool = False) -> Callable[[bytes], np.ndarray]:
    pipe = ImagePipeline([RandomResizedCrop(SIZE), RandomHorizontalFlip()], backend=backend,
                         roi=use_roi)
    out = np.empty(pipe.output_shape, np.uint8)
    return lambda data: pipe(data, out, rng)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def _backend_table(
    jpegs: list[bytes], rounds: int, has_cv2: bool
) -> list[tuple[str, float, float]]:
    """Resize-only cost and quality on crops as the fused path sees them."""
    rng = np.random.default_rng(1)
    crop = RandomResizedCrop(SIZE)
    crops = []
    for data in jpegs[:100]:
        full = simplejpeg.decode_jpeg(data)
        top, left, h, w = crop.get_params(full.shape[0], full.shape[1], rng)
        crops.append(np.ascontiguousarray(full[top : top + h, left : left + w]))

    def pil(c):
        return np.asarray(Image.fromarray(c).resize((SIZE, SIZE), Image.Resampling.BILINEAR))

    methods = {"pillow bilinear (antialiased)": pil}
    if has_cv2:
        import cv2

        cv2.setNumThreads(0)
        out = np.empty((SIZE, SIZE, 3), np.uint8)

        def cv(flag_shrink, flag_grow, area_from):
            def run(c):
                flag = flag_shrink if min(c.shape[:2]) >= area_from * SIZE else flag_grow
                return cv2.resize(c, (SIZE, SIZE), dst=out, interpolation=flag).copy()

            return run

        methods["cv2 area (linear to enlarge)"] = cv(cv2.INTER_AREA, cv2.INTER_LINEAR, 1)
        methods["cv2 linear (ours below 2x)"] = cv(cv2.INTER_AREA, cv2.INTER_LINEAR, 2)
    refs = [pil(c) for c in crops]
    rows = []
    for name, fn in methods.items():
        us = 1e6 / _rate(fn, crops, rounds)
        quality = np.mean([_psnr(fn(c), r) for c, r in zip(crops, refs, strict=True)])
        rows.append((name, us, quality))
    return rows


def _parts(use_roi: bool) -> tuple[Callable[[list[bytes]], None], dict[str, float]]:
    """A pass of the cv2 pipeline over some JPEGs, and the CPU seconds it spent in
    step 2 (decode) and step 3 (resample and flip) since the last reset; the timers
    add about 2 µs an image to the rest."""
    dec = Decoder(ImagePipeline([RandomResizedCrop(SIZE), RandomHorizontalFlip()]),
                  backend="cv2", roi=use_roi)
    spent = {"decode": 0.0, "resample": 0.0}

    def timer(fn, key):
        def run(*args):
            t = time.thread_time()
            result = fn(*args)
            spent[key] += time.thread_time() - t
            return result

        return run

    dec._decode_box = timer(dec._decode_box, "decode")
    dec._resample = timer(dec._resample, "resample")
    out = np.empty((SIZE, SIZE, 3), np.uint8)

    def one_pass(jpegs: list[bytes]) -> None:
        rng = np.random.default_rng(2)  # the same crops on both sides
        for data in jpegs:
            dec.decode_into(data, out, rng)

    return one_pass, spent


def _roi_table(jpegs: list[bytes], rounds: int) -> list[tuple[str, ...]]:
    """Per-image CPU µs of each part, today's whole-image decode against the region one."""
    sides = {"whole image (today)": _parts(False), "region of interest": _parts(True)}
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in sides}

    def run(name: str, r: int) -> None:
        one_pass, spent = sides[name]
        spent.update(decode=0.0, resample=0.0)
        t = time.thread_time()
        one_pass(jpegs)
        total = time.thread_time() - t
        parts = {**spent, "rest": total - spent["decode"] - spent["resample"], "total": total}
        for key, seconds in parts.items():
            figures[name].setdefault(key, []).append(seconds / len(jpegs) * 1e6)

    h.rounds(list(sides), max(rounds, 5), run)
    base = figures["whole image (today)"]
    rows = []
    for name, fig in figures.items():
        cells = [f"{h.median(fig[k]):.0f}" for k in ("decode", "resample", "rest", "total")]
        ratio = h.paired_ratio(fig["total"], base["total"])
        rows.append((name, *cells, f"{ratio:.2f}", f"{h.spread(fig['total']):.2f}"))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the tables."""
    parser = h.parser(__doc__)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--roi-only", action="store_true",
                        help="only the region-of-interest table (a short run)")
    args = parser.parse_args(argv)
    try:
        import cv2  # noqa: F401

        has_cv2 = True
    except ImportError:
        has_cv2 = False

    rng = np.random.default_rng(0)
    sides = rng.integers(300, 501, (args.count, 2))
    jpegs = [make_jpeg(rng, int(w), int(h)) for w, h in sides]
    print(f"{len(jpegs)} JPEGs, mean {np.mean([len(j) for j in jpegs]) / 1e3:.1f} KB, 300-500 px")
    if args.roi_only:
        _print_roi(jpegs, args.rounds, has_cv2)
        return 0

    rates = {
        "simplejpeg full decode": _rate(simplejpeg.decode_jpeg, jpegs, args.rounds),
        "pillow full decode": _rate(
            lambda d: np.asarray(Image.open(io.BytesIO(d)).convert("RGB")), jpegs, args.rounds
        ),
        "naive: decode, pillow crop+resize, flip, CHW": _rate(
            _naive(np.random.default_rng(2)), jpegs, args.rounds
        ),
        "ours (RRC 224 + flip), pillow": _rate(
            _ours("pillow", np.random.default_rng(2)), jpegs, args.rounds
        ),
    }
    if has_cv2:
        rates["ours (RRC 224 + flip), cv2"] = _rate(
            _ours("cv2", np.random.default_rng(2)), jpegs, args.rounds
        )
        if roi.available():
            rates["ours (RRC 224 + flip), cv2, region of interest"] = _rate(
                _ours("cv2", np.random.default_rng(2), use_roi=True), jpegs, args.rounds
            )
    decode, naive = (
        rates["simplejpeg full decode"],
        rates["naive: decode, pillow crop+resize, flip, CHW"],
    )
    print()
    h.Table(h.Col("path (one core)", 48), h.Col("img/s", 8, ">"), h.Col("/naive", 7, ">"),
            h.Col("/decode", 8, ">"), sep=" ").print(
        [(name, f"{r:.0f}", f"{r / naive:.2f}", f"{r / decode:.2f}") for name, r in rates.items()])
    print()
    h.Table(h.Col("resize backend (crop -> 224x224)", 32), h.Col("µs/img", 8, ">"),
            h.Col("PSNR vs pillow", 15, ">"), sep=" ").print(
        [(name, f"{us:.0f}", f"{quality:.1f}")
         for name, us, quality in _backend_table(jpegs, args.rounds, has_cv2)])
    print()
    _print_roi(jpegs, args.rounds, has_cv2)
    return 0


def _print_roi(jpegs: list[bytes], rounds: int, has_cv2: bool) -> None:
    if not has_cv2:
        print("region of interest: skipped (the table times the cv2 backend)")
        return
    if not roi.available():
        print(f"region of interest: skipped ({roi.unavailable_reason()})")
        return
    load = h.Load()
    rows = _roi_table(jpegs, rounds)
    print(f"region of interest with {roi.library_path()}")
    h.Table(h.Col("RRC 224 + flip, cv2, CPU µs/img", 32), h.Col("decode", 7, ">"),
            h.Col("resample", 9, ">"), h.Col("rest", 5, ">"), h.Col("total", 6, ">"),
            h.Col("/today", 7, ">"), h.Col("spread", 7, ">"), sep=" ").print(rows)
    print(load.line())


if __name__ == "__main__":
    raise SystemExit(main())
