"""The decoded-sample cache: same crops as decoding, bounded, shared, released."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest
from helpers_reader import make_dataset

from reader import DecodedCacheOptions, Loader
from reader.transforms import CenterCrop, RandomHorizontalFlip, RandomResizedCrop
from tests.helpers_paths import TESTS

BIG = 1 << 26


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("dcache") / "ds", 96, extra=False)


def epochs(path, n=2, **kw) -> list[list[dict]]:
    kw.setdefault("transform", [CenterCrop(24), RandomHorizontalFlip()])
    out = []
    with Loader(path, 16, shuffle=True, seed=3, copy=True, **kw) as lo:
        for _ in range(n):
            out.append([{k: v for k, v in b.items() if isinstance(v, np.ndarray)} for b in lo])
        stats = lo.decoded_cache.stats() if lo.decoded_cache is not None else None
    return out, stats


def same(a, b):
    assert len(a) == len(b)
    for ea, eb in zip(a, b, strict=True):
        for x, y in zip(ea, eb, strict=True):
            assert np.array_equal(x["label"], y["label"]) and np.array_equal(x["image"], y["image"])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_cached_epochs_are_the_decoded_ones(ds_path, num_workers):
    # CenterCrop needs no scaling, so cached pixels resample to exactly the same output.
    want, _ = epochs(ds_path, num_workers=num_workers)
    got, stats = epochs(ds_path, num_workers=num_workers,
                        decoded_cache=DecodedCacheOptions(max_bytes=BIG))
    same(got, want)
    assert stats["records"] == 96 and stats["bytes"] == 96 * 40 * 48 * 3


def test_random_crops_are_drawn_the_same_way(ds_path):
    t = [RandomResizedCrop(16), RandomHorizontalFlip()]
    (want, _), (got, _) = (epochs(ds_path, 3, transform=t, num_workers=2),
                           epochs(ds_path, 3, transform=t, num_workers=2,
                                  decoded_cache=DecodedCacheOptions(max_bytes=BIG)))
    for ew, eg in zip(want, got, strict=True):
        for w, g in zip(ew, eg, strict=True):
            assert np.array_equal(w["label"], g["label"])
            # The same box, flip and DCT scale: the same pixels (test_decoded_cache_pixels.py).
            assert np.array_equal(w["image"], g["image"])


def test_a_cache_smaller_than_the_dataset_keeps_what_fits(ds_path):
    one = 40 * 48 * 3
    want, _ = epochs(ds_path, num_workers=2)
    got, stats = epochs(ds_path, num_workers=2,
                        decoded_cache=DecodedCacheOptions(max_bytes=30 * one + 100))
    same(got, want)
    assert stats["records"] == 30 and stats["bytes"] <= 30 * one + 100


def test_resume_and_persistent_workers_with_a_cache(ds_path):
    opts = DecodedCacheOptions(max_bytes=BIG)
    t = [CenterCrop(24), RandomHorizontalFlip()]
    with Loader(ds_path, 16, shuffle=True, seed=3, transform=t, copy=True) as lo:
        lo.set_epoch(1)
        want = [b["label"] for b in lo]
    with Loader(ds_path, 16, shuffle=True, seed=3, transform=t, copy=True, decoded_cache=opts,
                persistent_workers=True) as lo:
        for _ in lo:
            pass  # epoch 0 fills the cache
        it = iter(lo)
        first = [next(it)["label"] for _ in range(2)]
        state = lo.state_dict()
        it.shutdown()
        lo.load_state_dict(state)
        rest = [b["label"] for b in lo]
    assert all(np.array_equal(a, b) for a, b in zip(first + rest, want, strict=True))


@pytest.mark.parametrize(("kw", "error", "words"), [
    ({"decoded_cache": DecodedCacheOptions(max_bytes=100)}, ValueError,
     "smaller than one output image"),
    ({"decoded_cache": DecodedCacheOptions(max_bytes=BIG), "decode": False}, ValueError,
     "decodes none"),
    ({"decoded_cache": {"max_bytes": BIG}}, TypeError, "DecodedCacheOptions"),
])
def test_bad_cache_options_are_refused(ds_path, kw, error, words):
    kw.setdefault("transform", [CenterCrop(24)])
    with pytest.raises(error, match=words):
        Loader(ds_path, 16, **kw)


def test_options_are_checked():
    with pytest.raises(TypeError, match="max_bytes"):
        DecodedCacheOptions(max_bytes="1GB")
    with pytest.raises(TypeError, match="short_side"):
        DecodedCacheOptions(max_bytes=BIG, short_side=0)


def test_a_file_backed_cache_is_reserved_then_deleted(ds_path, tmp_path):
    f = tmp_path / "pixels.cache"
    lo = Loader(ds_path, 16, transform=[CenterCrop(24)], num_workers=2,
                decoded_cache=DecodedCacheOptions(max_bytes=BIG, path=f))
    assert f.stat().st_size >= BIG  # reserved whole at the start
    for _ in lo:
        pass
    lo.close()
    assert not f.exists()
    f.write_bytes(b"mine")
    with pytest.raises(FileExistsError, match="must not exist"):
        Loader(ds_path, 16, transform=[CenterCrop(24)],
               decoded_cache=DecodedCacheOptions(max_bytes=BIG, path=f))
    assert f.read_bytes() == b"mine"  # never the user's file


def test_a_cache_file_that_cannot_be_reserved_names_it(ds_path, tmp_path):
    f = tmp_path / "huge.cache"
    with pytest.raises(OSError, match=r"cannot reserve .* bytes for the decoded cache.*huge.cache"):
        Loader(ds_path, 16, transform=[CenterCrop(24)],
               decoded_cache=DecodedCacheOptions(max_bytes=1 << 60, path=f))
    assert not f.exists()


def test_spawned_workers_share_a_named_cache_released_at_close(ds_path):
    want, _ = epochs(ds_path, num_workers=2)
    lo = Loader(ds_path, 16, shuffle=True, seed=3,
                transform=[CenterCrop(24), RandomHorizontalFlip()],
                decoded_cache=DecodedCacheOptions(max_bytes=BIG),
                num_workers=2, start_method="spawn", copy=True)
    name = lo.decoded_cache.path
    assert name is not None and Path(name).exists()
    got = [[{k: v for k, v in b.items() if isinstance(v, np.ndarray)} for b in lo]
           for _ in range(2)]
    assert lo.decoded_cache.stats()["records"] == 96
    lo.close()
    gc.collect()
    same(got, want)
    assert not os.path.exists(name)


def test_a_cache_file_left_by_a_killed_loader_is_taken_over(ds_path, tmp_path):
    import subprocess
    import sys

    f = tmp_path / "left.cache"
    script = (f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
              "import os, signal\n"
              "from reader import Loader, DecodedCacheOptions\n"
              "from reader.transforms import CenterCrop\n"
              f"lo = Loader({str(ds_path)!r}, 16, transform=[CenterCrop(24)], num_workers=0,\n"
              f"           decoded_cache=DecodedCacheOptions(max_bytes={BIG}, path={str(f)!r}))\n"
              "next(iter(lo))\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    subprocess.run([sys.executable, "-c", script], timeout=60)
    assert f.exists()  # killed: nothing could delete it
    with Loader(ds_path, 16, transform=[CenterCrop(24)], num_workers=0,
                decoded_cache=DecodedCacheOptions(max_bytes=BIG, path=f)) as lo:
        assert sum(len(b["label"]) for b in lo) == 96
    assert not f.exists()
