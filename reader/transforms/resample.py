"""The resample of a crop to the output size, as the CPU path does it, written once
for the GPU: its rules, its numpy definition and its CUDA kernel.

The CPU path (:func:`reader.transforms.decode._resample_cv2`) crops the plan's box
rounded to whole pixels (:func:`integer_box`) and resizes it with OpenCV:
``INTER_AREA`` when the crop is at least twice the output both ways
(:func:`uses_area`), ``INTER_LINEAR`` otherwise, then mirrors. The GPU decode path
(:mod:`reader.runtime.gpu_decode`) decodes exactly that box (nvImageCodec's region
decode) at full resolution and resizes it with :data:`RESAMPLE_CUDA`, the same two
filters with OpenCV's coordinate conventions:

* linear: source coordinate ``(d + 0.5) * scale - 0.5``, clamped at the edges
  (the two taps of the edge pixel collapse onto it);
* area: each output pixel averages the source interval ``[d * scale, (d + 1) * scale)``,
  weighted by overlap (OpenCV's exact rule for non-integer scales; for integer
  ones it is the plain block mean).

:func:`resample_reference` is the numpy definition of that kernel (separable weight
matrices, float64): the stand-in runs it in CI and the GPU test compares the
kernel with it. Against ``cv2.resize`` both differ by at most one level: OpenCV's
``INTER_LINEAR`` on uint8 uses 11-bit fixed-point weights and the kernel float32.

One difference from the CPU path remains and is inherent: the CPU decodes at the
largest DCT scale (1/2, 1/4, 1/8) that keeps the box at least the output size and
resizes from there, while the GPU decodes at full size and area-averages. Both
approximate the same box filter; their pixels differ by a few levels
(tests/reader/runtime/test_gpu_decode.py bounds it; scripts/bench_gpu.py measures it on
real decoders).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["RESAMPLE_CUDA", "integer_box", "resample_reference", "uses_area"]

Box = tuple[float, float, float, float]


def integer_box(box: Box, height: int, width: int) -> tuple[int, int, int, int]:
    """``(x0, y0, x1, y1)`` whole pixels of an image ``height`` x ``width`` that the
    resample reads for ``box`` (inside the image): rounding moves an edge by at most
    half a pixel, and the crop keeps at least one pixel each way."""
    x0, y0, x1, y1 = box
    ix0, iy0 = min(round(x0), width - 1), min(round(y0), height - 1)
    ix1, iy1 = max(round(x1), ix0 + 1), max(round(y1), iy0 + 1)
    return ix0, iy0, ix1, iy1


def uses_area(src_hw: tuple[int, int], dst_hw: tuple[int, int]) -> bool:
    """Area averaging when the crop is at least twice the output both ways: past 2x
    bilinear aliases badly, below it bilinear is 3.5x faster at 42.7 dB against
    Pillow's antialiased filter (:mod:`reader.transforms.decode`)."""
    return min(src_hw[0] / dst_hw[0], src_hw[1] / dst_hw[1]) >= 2


def _weights(src: int, dst: int, area: bool) -> np.ndarray:
    """``[dst, src]`` weights of one axis (rows sum to 1)."""
    w = np.zeros((dst, src), np.float64)
    scale = src / dst
    for d in range(dst):
        if area:
            lo, hi = d * scale, (d + 1) * scale
            for s in range(math.floor(lo), min(math.ceil(hi), src)):
                w[d, s] = (min(hi, s + 1) - max(lo, s)) / scale
        else:
            f = (d + 0.5) * scale - 0.5
            s0 = math.floor(f)
            a = f - s0
            if s0 < 0:
                s0, a = 0, 0.0
            if s0 >= src - 1:
                s0, a = src - 1, 0.0
            w[d, s0] += 1.0 - a
            w[d, min(s0 + 1, src - 1)] += a
    return w


def resample_reference(src: np.ndarray, size: tuple[int, int], flip: bool) -> np.ndarray:
    """The numpy definition of :data:`RESAMPLE_CUDA`: uint8 ``[h, w, 3]`` (the decoded
    crop) -> uint8 ``[*size, 3]``, mirrored left-right when ``flip``."""
    h, w = src.shape[:2]
    area = uses_area((h, w), size)
    wy, wx = _weights(h, size[0], area), _weights(w, size[1], area)
    rows = np.tensordot(wy, src.astype(np.float64), axes=(1, 0))  # [oh, w, 3]
    out = np.tensordot(rows, wx, axes=(1, 1)).transpose(0, 2, 1)  # [oh, ow, 3]
    out = np.clip(np.rint(out), 0, 255).astype(np.uint8)
    return out[:, ::-1].copy() if flip else out


# One thread per output pixel of one sample (grid: x blocks, output rows, samples).
# Sample s reads its decoded crop at src[s] (row pitch pitch[s], HWC uint8) and writes
# row dst_row[s] of the batch's uint8 NHWC image array.
RESAMPLE_CUDA = r"""
extern "C" __global__ void shardpack_resample(
        const unsigned long long* src, const int* sh, const int* sw, const long long* pitch,
        const int* dst_row, const unsigned char* flip, unsigned char* out,
        const int OH, const int OW, const int n) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    const int y = blockIdx.y;
    const int s = blockIdx.z;
    if (x >= OW || y >= OH || s >= n) return;
    const unsigned char* img = (const unsigned char*)src[s];
    const int H = sh[s], W = sw[s];
    const long long P = pitch[s];
    const float scale_x = (float)W / OW, scale_y = (float)H / OH;
    float acc0 = 0.f, acc1 = 0.f, acc2 = 0.f;
    if (scale_x >= 2.f && scale_y >= 2.f) {
        const float fx0 = x * scale_x, fx1 = (x + 1) * scale_x;
        const float fy0 = y * scale_y, fy1 = (y + 1) * scale_y;
        const int ix_end = min((int)ceilf(fx1), W), iy_end = min((int)ceilf(fy1), H);
        for (int iy = (int)floorf(fy0); iy < iy_end; ++iy) {
            const float wy = fminf(fy1, iy + 1.f) - fmaxf(fy0, (float)iy);
            const unsigned char* row = img + iy * P;
            for (int ix = (int)floorf(fx0); ix < ix_end; ++ix) {
                const float wgt = wy * (fminf(fx1, ix + 1.f) - fmaxf(fx0, (float)ix));
                acc0 += wgt * row[ix * 3];
                acc1 += wgt * row[ix * 3 + 1];
                acc2 += wgt * row[ix * 3 + 2];
            }
        }
        const float inv = 1.f / (scale_x * scale_y);
        acc0 *= inv; acc1 *= inv; acc2 *= inv;
    } else {
        float fx = (x + 0.5f) * scale_x - 0.5f, fy = (y + 0.5f) * scale_y - 0.5f;
        int x0 = (int)floorf(fx), y0 = (int)floorf(fy);
        float ax = fx - x0, ay = fy - y0;
        if (x0 < 0) { x0 = 0; ax = 0.f; }
        if (x0 >= W - 1) { x0 = W - 1; ax = 0.f; }
        if (y0 < 0) { y0 = 0; ay = 0.f; }
        if (y0 >= H - 1) { y0 = H - 1; ay = 0.f; }
        const int x1 = min(x0 + 1, W - 1), y1 = min(y0 + 1, H - 1);
        const unsigned char* r0 = img + y0 * P;
        const unsigned char* r1 = img + y1 * P;
        for (int c = 0; c < 3; ++c) {
            const float top = (1.f - ax) * r0[x0 * 3 + c] + ax * r0[x1 * 3 + c];
            const float bot = (1.f - ax) * r1[x0 * 3 + c] + ax * r1[x1 * 3 + c];
            const float v = (1.f - ay) * top + ay * bot;
            if (c == 0) acc0 = v; else if (c == 1) acc1 = v; else acc2 = v;
        }
    }
    const int ox = flip[s] ? OW - 1 - x : x;
    unsigned char* o = out + (((long long)dst_row[s] * OH + y) * OW + ox) * 3;
    o[0] = (unsigned char)fminf(fmaxf(rintf(acc0), 0.f), 255.f);
    o[1] = (unsigned char)fminf(fmaxf(rintf(acc1), 0.f), 255.f);
    o[2] = (unsigned char)fminf(fmaxf(rintf(acc2), 0.f), 255.f);
}
"""
