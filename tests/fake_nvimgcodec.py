"""A stand-in for the part of nvImageCodec (``nvidia.nvimgcodec``) that
reader/runtime/gpu_decode.py uses: decodes with simplejpeg on the CPU, the region
cut from the whole image, and returns "device" images that are fake-cupy arrays
(tests/fake_cupy.py) with a ``__cuda_array_interface__``. It records every region it
was asked for, so tests can compare them with the CPU path's plans.

(nvImageCodec's own CPU backend cannot stand in: on a machine without a GPU even a
CPU_ONLY decoder fails with "CUDA Runtime failure '#35'", issue 38.)
"""

from __future__ import annotations

import threading
import time

import numpy as np
import simplejpeg

regions: list[tuple[int, int, int, int]] = []  # (y0, x0, y1, x1) of every decode
threads: list[str] = []  # the thread of every decode call
fail: set[bytes] = set()  # payloads whose decode returns None, as nvImageCodec does
unreadable: set[bytes] = set()  # payloads whose CodeStream raises, as a bad header does
ignore_region: set[bytes] = set()  # payloads decoded whole, as if the region were not applied
gray: set[bytes] = set()  # payloads decoded to one channel
slow: set[bytes] = set()  # payloads whose decode call takes 2 s (a hung decoder)


def reset() -> None:
    """Forget every recorded call and every payload marked above (a test's fixture)."""
    for recorded in (regions, threads, fail, unreadable, ignore_region, gray, slow):
        recorded.clear()


# Signatures are nvImageCodec 0.9's (read from the wheel), keywords included, so a
# call the real library would refuse fails here too.


class Region:
    def __init__(self, start_y, start_x, end_y, end_x, out_of_bounds_sample=0):
        self.box = (int(start_y), int(start_x), int(end_y), int(end_x))


class CodeStream:
    """Keeps the array it is given (no copy) and parses its header when first asked,
    raising as nvImageCodec 0.9's does ("Failed to get image info")."""

    def __init__(self, data, bitstream_offset=None, *, _region=None):
        self.array = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
        self.region = _region

    @property
    def data(self) -> bytes:
        return bytes(self.array)

    def _size(self) -> tuple[int, int]:
        try:
            if self.data in unreadable:
                raise ValueError
            return simplejpeg.decode_jpeg_header(self.data)[:2]
        except ValueError:
            raise RuntimeError("Failed to get image info") from None

    @property
    def height(self) -> int:
        return self._size()[0]

    @property
    def width(self) -> int:
        return self._size()[1]

    def get_sub_code_stream(self, image_idx=0, region=None, bitstream_offset=None):
        return CodeStream(self.array, _region=region)


class DecodeParams:
    def __init__(self, apply_exif_orientation=True, color_spec=None, allow_any_depth=False,
                 sample_format=None):
        self.apply_exif_orientation = apply_exif_orientation


class Image:
    def __init__(self, array):
        self.array = array

    @property
    def __cuda_array_interface__(self):
        face = self.array.__array_interface__
        contiguous = self.array.flags.c_contiguous  # nvImageCodec then says None
        return {"shape": self.array.shape, "typestr": "|u1", "data": face["data"],
                "strides": None if contiguous else self.array.strides, "version": 3}


class Decoder:
    def __init__(self, device_id=-1, max_num_cpu_threads=0, backends=None, options=""):
        self.device_id = device_id
        self.options = options

    def decode(self, srcs, *, images=None, params=None, cuda_stream=0):
        threads.append(threading.current_thread().name)
        if any(cs.data in slow for cs in srcs):
            time.sleep(2.0)
        out = []
        for cs in srcs:
            if cs.data in fail:
                out.append(None)
                continue
            image = simplejpeg.decode_jpeg(cs.data, colorspace="RGB")
            if cs.data in gray:
                image = np.ascontiguousarray(image[..., :1])
            if cs.region is not None and cs.data not in ignore_region:
                y0, x0, y1, x1 = cs.region.box
                regions.append(cs.region.box)
                image = image[y0:y1, x0:x1]  # a strided view: its pitch is the whole row
            out.append(Image(image))
        return out
