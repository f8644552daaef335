"""The sample path: boxes, masks and per-sample arrays that follow their image through
the workers, padded or ragged in the slot (reader.transforms.sample, reader.transforms.collate, reader.transforms.geometry)."""

from __future__ import annotations

import functools

import cv2
import numpy as np
import pytest
import simplejpeg

import reader
from formats import DatasetWriter, Field
from formats.errors import CorruptRecordError
from reader import Loader, Padded, Ragged
from reader.transforms import (
    CenterCrop,
    Normalize,
    PadToMultiple,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ResizeShortestEdge,
    SampleTransform,
)
from reader.transforms.decode import decode_full
from reader.transforms.geometry import Plan, move_boxes

RED = (255, 0, 0)


def _record(rng: np.random.Generator, i: int) -> dict:
    """An image with 0-3 red rectangles on black, their boxes, labels and a label mask."""
    h, w = int(rng.integers(5, 12)) * 8, int(rng.integers(5, 12)) * 8
    img = np.zeros((h, w, 3), np.uint8)
    mask = np.zeros((h, w), np.uint8)
    boxes, labels = [], []
    for j in range(i % 4):
        bw, bh = int(rng.integers(2, w // 16 + 2)) * 8, int(rng.integers(2, h // 16 + 2)) * 8
        x0, y0 = int(rng.integers(0, (w - bw) // 8 + 1)) * 8, int(rng.integers(0, (h - bh) // 8 + 1)) * 8
        if any(x0 < b[2] and b[0] < x0 + bw and y0 < b[3] and b[1] < y0 + bh for b in boxes):
            continue  # keep the rectangles apart: one colour region per box
        img[y0:y0 + bh, x0:x0 + bw] = RED
        mask[y0:y0 + bh, x0:x0 + bw] = j + 1
        boxes.append((x0, y0, x0 + bw, y0 + bh))
        labels.append(j + 1)
    return {"_meta": {"height": h, "width": w},
            "image": simplejpeg.encode_jpeg(img, quality=98),
            "mask": cv2.imencode(".png", mask)[1].tobytes(),
            "boxes": np.array(boxes, np.float32).reshape(-1, 4),
            "labels": np.array(labels, np.int64),
            "tokens": np.arange(i % 5, dtype=np.int32),
            "label": i, "name": f"r{i}"}


@pytest.fixture(scope="module")
def det_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("det") / "ds"
    rng = np.random.default_rng(0)
    fields = [Field("image", "jpeg"), Field("mask", "png"),
              Field("boxes", "ndarray", dtype="float32", shape=(None, 4)),
              Field("labels", "ndarray", dtype="int64", shape=(None,)),
              Field("tokens", "ndarray", dtype="int32", shape=(None,)),
              Field("label", "int"), Field("name", "str")]
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=16, durable=False) as w:
        for i in range(48):
            rec = _record(rng, i)
            w.write(rec, meta=rec.pop("_meta"))
    return root


DETECTION = [ResizeShortestEdge((48, 64, 80), max_size=120), RandomHorizontalFlip(),
             PadToMultiple(32)]


def _red_box(image: np.ndarray, region) -> tuple[int, int, int, int] | None:
    red = (image[..., 0] > 128) & (image[..., 1] < 100) & (image[..., 2] < 100)
    ys, xs = np.nonzero(red & region)
    if not len(xs):
        return None
    return xs.min(), ys.min(), xs.max() + 1, ys.max() + 1


@pytest.mark.parametrize("workers", [0, 2])
def test_boxes_and_masks_follow_the_image(det_path, workers):
    with Loader(det_path, 8, transform=DETECTION, shuffle=True, seed=3,
                num_workers=workers) as lo:
        seen = 0
        for b in lo:
            images, sizes, boxes, labels = b["image"], b["image_size"], b["boxes"], b["labels"]
            assert isinstance(boxes, Ragged) and isinstance(labels, Ragged)
            assert images.shape[1] % 32 == 0 and images.shape[2] % 32 == 0
            assert b["mask"].shape == images.shape[:3]
            for i in range(len(images)):
                h, w = sizes[i]
                assert h % 32 == 0 and w % 32 == 0  # PadToMultiple is part of each sample
                assert not images[i, h:].any() and not images[i, :, w:].any()
                m = b["mask"][i]
                assert set(np.unique(m)) <= {0, 1, 2, 3}  # nearest: never a blended label
                assert len(boxes[i]) == len(labels[i])
                for box, label in zip(boxes[i], labels[i], strict=True):
                    ys, xs = np.nonzero(m == label)
                    # The mask's region of this label and the moved box agree to a pixel.
                    assert np.allclose((xs.min(), ys.min(), xs.max() + 1, ys.max() + 1), box,
                                       atol=1.5)
                    x0, y0, x1, y1 = np.round(box).astype(int)
                    inside = np.zeros(m.shape, bool)
                    inside[y0 + 2:y1 - 2, x0 + 2:x1 - 2] = True
                    assert _red_box(images[i], inside) is not None  # the pixels are red there
                    seen += 1
        assert seen > 20


def test_workers_do_not_change_batches(det_path):
    def batches(workers):
        with Loader(det_path, 6, transform=DETECTION, shuffle=True, seed=5,
                    num_workers=workers, copy=True) as lo:
            return list(lo)

    a, b = batches(0), batches(2)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x["image"], y["image"])
        assert np.array_equal(x["boxes"].values, y["boxes"].values)
        assert np.array_equal(x["boxes"].offsets, y["boxes"].offsets)
        assert x["name"] == y["name"]


def test_crops_drop_boxes_with_their_labels(det_path):
    with Loader(det_path, 48, transform=[RandomResizedCrop(32, scale=(0.05, 0.2))],
                num_workers=0) as lo:
        b = next(iter(lo))
    with Loader(det_path, 48, decode=False, fields=("boxes",)) as raw:
        before = sum(len(x) for x in next(iter(raw))["boxes"])
    after = len(b["boxes"].values)
    assert after < before  # small crops leave boxes behind...
    assert np.array_equal(b["boxes"].lengths, b["labels"].lengths)  # ...with their labels
    v = b["boxes"].values
    assert (v[:, 2] - v[:, 0] >= 1).all() and (v[:, 3] - v[:, 1] >= 1).all()
    assert v.min() >= 0 and v.max() <= 32
    assert b["image"].shape == (48, 32, 32, 3)  # a fixed size: one plain array


def test_whole_images_without_a_transform(det_path):
    with Loader(det_path, 5, num_workers=0, fields=("image", "boxes")) as lo, \
            Loader(det_path, 5, decode=False, fields=("image", "boxes")) as raw:
        b, r = next(iter(lo)), next(iter(raw))
    for i in range(5):
        full = decode_full(r["image"][i])
        h, w = b["image_size"][i]
        assert np.array_equal(b["image"][i, :h, :w], full)
        assert np.array_equal(b["boxes"][i], r["boxes"][i])


def test_ragged_images_and_padded_arrays(det_path):
    kw = dict(transform=DETECTION, seed=1, num_workers=0, copy=True)
    with Loader(det_path, 8, **kw) as lo:
        padded = next(iter(lo))
    with Loader(det_path, 8, collate={"image": "ragged", "mask": "ragged",
                                      "boxes": "padded", "tokens": Padded(to=6)}, **kw) as lo:
        ragged = next(iter(lo))
    assert isinstance(ragged["image"], Ragged)
    for i, im in enumerate(ragged["image"]):
        h, w = padded["image_size"][i]
        assert im.shape == (h, w, 3)
        assert np.array_equal(im, padded["image"][i, :h, :w])
        assert np.array_equal(ragged["mask"][i], padded["mask"][i, :h, :w])
    boxes, counts = ragged["boxes"], ragged["boxes_size"][:, 0]
    assert boxes.shape == (8, counts.max(), 4)
    for i in range(8):
        assert np.array_equal(boxes[i, :counts[i]], padded["boxes"][i])
        assert not boxes[i, counts[i]:].any()
    assert ragged["tokens"].shape == (8, 6)
    assert np.array_equal(ragged["tokens_size"][:, 0], [len(t) for t in padded["tokens"]])


def test_padded_to_a_size_smaller_than_a_sample_names_it(det_path):
    with Loader(det_path, 8, transform=DETECTION, num_workers=0,
                collate={"tokens": Padded(to=2)}) as lo, \
            pytest.raises(reader.WorkerError, match="larger than Padded"):
        list(lo)


def _plus_one(sample):
    sample["labels"] = sample["labels"] + 10
    return sample


def _bad_type(sample):
    return [sample]


def _bad_dtype(sample):
    sample["boxes"] = sample["boxes"].astype(np.float64)
    return sample


def test_sample_transforms_run_in_workers(det_path):
    specs = [*DETECTION, SampleTransform(_plus_one)]
    with Loader(det_path, 8, transform=specs, num_workers=2, seed=2) as lo, \
            Loader(det_path, 8, transform=DETECTION, num_workers=2, seed=2) as plain:
        for a, b in zip(lo, plain, strict=True):
            assert np.array_equal(a["labels"].values, b["labels"].values + 10)
            assert np.array_equal(a["image"], b["image"])


@pytest.mark.parametrize(("fn", "words"), [(_bad_type, "returned list"),
                                           (_bad_dtype, "'boxes' as float64")])
def test_a_wrong_sample_transform_names_the_record(det_path, fn, words):
    with Loader(det_path, 8, transform=[*DETECTION, SampleTransform(fn)], num_workers=2) as lo, \
            pytest.raises(reader.WorkerError, match=words) as err:
        next(iter(lo))
    assert err.value.record is not None
    assert "Original traceback" in str(err.value)


def test_normalize_gives_float_images(det_path):
    norm = Normalize(channels_first=True)
    with Loader(det_path, 4, transform=[*DETECTION, norm], num_workers=0) as lo, \
            Loader(det_path, 4, transform=DETECTION, num_workers=0) as plain:
        a, b = next(iter(lo)), next(iter(plain))
    assert a["image"].dtype == np.float32 and a["image"].shape[1] == 3
    h, w = a["image_size"][0]
    want = (b["image"][0, :h, :w] / 255 - np.array(norm.mean)) / np.array(norm.std)
    assert np.allclose(a["image"][0, :, :h, :w], want.transpose(2, 0, 1), atol=1e-5)
    assert not a["image"][0, :, h:].any()
    with Loader(det_path, 4, transform=[CenterCrop(32), Normalize()], num_workers=0) as lo:
        assert next(iter(lo))["image"].shape == (4, 32, 32, 3)


def test_per_box_fields_must_match_the_boxes(tmp_path):
    root = tmp_path / "bad"
    fields = [Field("image", "jpeg"), Field("boxes", "ndarray", dtype="float32", shape=(None, 4)),
              Field("labels", "ndarray", dtype="int64", shape=(None,))]
    rng = np.random.default_rng(0)
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=8, durable=False) as w:
        for i in range(4):
            rec = _record(rng, 3)
            labels = rec["labels"] if i != 2 else rec["labels"][:1]
            w.write({"image": rec["image"], "boxes": rec["boxes"], "labels": labels})
    with Loader(root, 4, transform=DETECTION, num_workers=0) as lo, \
            pytest.raises(reader.WorkerError, match="record 2: field 'labels' has 1 rows"):
        next(iter(lo))


def test_a_mask_of_another_size_is_an_error(tmp_path):
    root = tmp_path / "mask"
    fields = [Field("image", "jpeg"), Field("mask", "png")]
    rng = np.random.default_rng(0)
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=8, durable=False) as w:
        for i in range(3):
            rec = _record(rng, 1)
            mask = rec["mask"] if i != 1 else cv2.imencode(".png", np.zeros((9, 9), np.uint8))[1]
            w.write({"image": rec["image"], "mask": bytes(mask)})
    with Loader(root, 3, transform=DETECTION, num_workers=0) as lo, \
            pytest.raises(CorruptRecordError, match="mask is 9x9"):
        next(iter(lo))
    with Loader(root, 3, transform=DETECTION, num_workers=0, on_error="skip") as lo:
        b = next(iter(lo))
        assert b["valid"].tolist() == [True, False, True]
        assert not b["image"][1].any() and not b["mask"][1].any()  # a skipped sample is zeros


def test_options_that_do_not_fit_are_refused(det_path):
    with pytest.raises(ValueError, match="collate names 'nope'"):
        Loader(det_path, 4, transform=DETECTION, collate={"nope": "ragged"})
    with pytest.raises(ValueError, match="fixed shape"):
        Loader(det_path, 4, transform=DETECTION, collate={"label": "ragged"})
    with pytest.raises(ValueError, match="lists of values"):
        Loader(det_path, 4, transform=DETECTION, collate={"name": "padded"})
    with pytest.raises(ValueError, match="all have the shape"):
        Loader(det_path, 4, transform=[CenterCrop(32)], collate={"image": "ragged"})
    with pytest.raises(ValueError, match="annotations, collate would have no effect"):
        Loader(det_path, 4, decode=False, annotations=reader.Annotations(),
               collate={"boxes": "ragged"})
    with pytest.raises(ValueError, match="annotations boxes='nope'"):
        Loader(det_path, 4, transform=DETECTION, annotations=reader.Annotations(boxes="nope"))
    with pytest.raises(ValueError, match="decoded_cache serves"):
        Loader(det_path, 4, transform=DETECTION,
               decoded_cache=reader.DecodedCacheOptions(max_bytes=1 << 20))


def test_move_boxes_maps_clips_and_flips():
    plan = Plan(box=(10.0, 20.0, 110.0, 70.0), size=(100, 200), flip=False)  # 2x scale
    moved, keep = move_boxes(np.array([[10, 20, 60, 45], [0, 0, 5, 5], [100, 60, 130, 90]],
                                      np.float32), plan)
    assert keep.tolist() == [True, False, True]
    assert moved.tolist() == [[0, 0, 100, 50], [180, 80, 200, 100]]
    flipped, _ = move_boxes(np.array([[10, 20, 60, 45]], np.float32),
                            Plan(plan.box, plan.size, True))
    assert flipped.tolist() == [[100, 0, 200, 50]]


def test_resize_with_max_size_matches_torchvision_rule():
    # torchvision: short side 100 -> long 300 > max 200: long = 200, short = int(200 * 100 / 300).
    from reader.transforms import ImagePipeline

    plan = ImagePipeline([Resize(100, max_size=200)]).plan(50, 150, np.random.default_rng(0))
    assert plan.size == (66, 200)
    assert ImagePipeline([Resize(100, max_size=200)]).max_output([50, 100], [150, 100]) == (100, 200)
    with pytest.raises(ValueError, match="max_size must be larger"):
        Resize(100, max_size=100)


def test_resize_shortest_edge_bound_covers_every_draw():
    from reader.transforms import ImagePipeline

    pipe = ImagePipeline([ResizeShortestEdge((32, 48, 64), max_size=100), PadToMultiple(32)])
    hs, ws = np.array([40, 80, 30]), np.array([90, 40, 30])
    bh, bw = pipe.max_output(hs, ws)
    rng = np.random.default_rng(0)
    for _ in range(200):
        for h, w in zip(hs, ws, strict=True):
            size = pipe.plan(int(h), int(w), rng).size
            assert size[0] <= bh and size[1] <= bw and size[0] % 32 == 0


def test_torch_adapter_gives_lists_and_masks(det_path):
    torch = pytest.importorskip("torch", reason="the torch adapter needs PyTorch")
    from reader.torch_adapter import TorchLoader

    with Loader(det_path, 4, transform=DETECTION, num_workers=0) as lo:
        b = next(iter(TorchLoader(lo, channels_first=True, padding_mask=True)))
    assert isinstance(b["boxes"], list) and all(isinstance(t, torch.Tensor) for t in b["boxes"])
    assert b["image"].shape[1] == 3
    h, w = b["image_size"][0].tolist()
    assert b["image_mask"][0, :h, :w].all() and not b["image_mask"][0, h:].any()


def _box_sum(sample, rng):
    sample["boxes"] = np.full_like(sample["boxes"], rng.integers(1, 5))
    return sample


def test_sample_transforms_pickle_to_spawned_workers(det_path):
    fn = SampleTransform(functools.partial(_box_sum), takes_rng=True)
    with Loader(det_path, 8, transform=[*DETECTION, fn],
                num_workers=1, start_method="spawn") as lo:
        b = next(iter(lo))
    v = b["boxes"].values
    assert v.size == 0 or ((v >= 1) & (v <= 4)).all()


def test_aspect_ratio_batches_through_the_loader(det_path):
    from reader.batching import AspectRatioBatches

    spec = AspectRatioBatches()
    resize = [ResizeShortestEdge((48, 64)), RandomHorizontalFlip()]  # keeps the orientation
    with Loader(det_path, 4, batch_sampler=spec, transform=resize, shuffle=True, seed=1,
                num_workers=2, copy=True) as lo:
        n = len(lo)
        batches = list(lo)
        state_at_end = lo.state_dict()
    assert len(batches) == n and state_at_end["epoch"] == 1
    with Loader(det_path, 4, decode=False, fields=("name",)) as raw:
        names = [x for b in raw for x in b["name"]]
    seen = [x for b in batches for x in b["name"]]
    assert sorted(seen) == sorted(names)  # every record once
    for b in batches:  # one orientation per batch (sizes before the transform)
        wide = b["image_size"][:, 1] >= b["image_size"][:, 0]
        assert wide.all() or not wide.any()


def test_budget_batches_vary_in_size_and_resume_exactly(det_path):
    from reader.batching import BudgetBatches

    def loader():
        return Loader(det_path, batch_sampler=BudgetBatches(8 * 64 * 64, size="pixels"),
                      transform=DETECTION, shuffle=True, seed=2, num_workers=1, copy=True)

    with loader() as lo:
        lo.set_epoch(1)
        n = len(lo)
        it = iter(lo)
        first = [next(it) for _ in range(2)]
        state = lo.state_dict()
        rest = list(it)
    sizes = {len(b["name"]) for b in first + rest}
    assert len(sizes) > 1 and len(first) + len(rest) == n
    with loader() as again:
        again.load_state_dict(state)
        resumed = list(again)
    assert [b["name"] for b in resumed] == [b["name"] for b in rest]
    with Loader(det_path, 4, transform=DETECTION, shuffle=True, seed=2) as plain, \
            pytest.raises(ValueError, match="cannot resume exactly"):
        plain.load_state_dict(state)
    with pytest.raises(ValueError, match="max_batch_size"):
        Loader(det_path, 4, batch_sampler=BudgetBatches(8 * 64 * 64), transform=DETECTION)


def test_a_pipelines_backend_reaches_the_decoder(det_path):
    from reader.transforms import ImagePipeline

    pytest.importorskip("PIL", reason="backend='pillow' needs Pillow")
    pipe = ImagePipeline([CenterCrop(32)], backend="pillow")
    with Loader(det_path, 4, transform=pipe, num_workers=0) as lo:
        next(iter(lo))
        assert lo.spec.pipeline.backend == "pillow"
        assert lo.spec.pipeline.decoder().backend == "pillow"


def test_backend_auto_says_why_opencv_is_missing(det_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "cv2", None)  # "import cv2" now raises ImportError
    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(ImportError, match=r"OpenCV cannot be imported .*import of cv2 halted"):
        Loader(det_path, 4, transform=[CenterCrop(32)])


def test_keypoints_move_swap_and_hide():
    from reader.transforms.geometry import move_keypoints

    plan = Plan(box=(0.0, 0.0, 100.0, 50.0), size=(50, 100), flip=True)
    points = np.array([[[10, 5, 2], [90, 5, 2], [150, 5, 2]]], np.float32)  # left, right, outside
    moved = move_keypoints(points, plan, pairs=((0, 1),))
    # Mirrored: x -> 100 - x, and the pair swaps roles (the left point is now the right one).
    assert moved[0, 0].tolist() == [10, 5, 2] and moved[0, 1].tolist() == [90, 5, 2]
    assert moved[0, 2, 2] == 0  # outside the output: not visible
    assert points[0, 2, 2] == 2  # the input is left alone


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_keypoints_follow_their_boxes_through_the_loader(tmp_path, p):
    root = tmp_path / "kp"
    fields = [Field("image", "jpeg"), Field("boxes", "ndarray", dtype="float32", shape=(None, 4)),
              Field("labels", "ndarray", dtype="int64", shape=(None,)),
              Field("keypoints", "ndarray", dtype="float32", shape=(None, 2, 3))]
    rng = np.random.default_rng(1)
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=8, durable=False) as w:
        for _ in range(6):
            rec = _record(rng, 3)
            b = rec["boxes"]
            kp = np.stack([np.c_[b[:, :2], np.full(len(b), 2)],
                           np.c_[b[:, 2:], np.full(len(b), 2)]], axis=1).astype(np.float32)
            w.write({"image": rec["image"], "boxes": b, "labels": rec["labels"], "keypoints": kp})
    specs = [ResizeShortestEdge(40), RandomHorizontalFlip(p)]
    with Loader(root, 6, transform=specs, num_workers=0) as lo:
        b = next(iter(lo))
    assert len(b["keypoints"].values) == len(b["boxes"].values) > 0
    for boxes, kps in zip(b["boxes"], b["keypoints"], strict=True):
        corners = boxes[:, [2, 1, 0, 3]] if p else boxes  # mirrored: the left corner is now right
        assert np.allclose(kps[:, 0, :2], corners[:, :2], atol=1e-3)
        assert np.allclose(kps[:, 1, :2], corners[:, 2:], atol=1e-3)


def test_the_writer_records_image_sizes_when_not_given(tmp_path):
    root = tmp_path / "sizes"
    rng = np.random.default_rng(0)
    with DatasetWriter(root, [Field("image", "jpeg")], shard_size=None, records_per_shard=4,
                       durable=False) as w:
        for _ in range(3):
            w.write({"image": _record(rng, 0)["image"]})
        w.write({"image": b"not an image"})  # no size to read: left null
    from formats import open_shards

    table = open_shards(root).metadata(["width", "height"]).to_pydict()
    assert all(v and v % 8 == 0 for v in table["width"][:3] + table["height"][:3])
    assert table["width"][3] is None and table["height"][3] is None


def _pcm(data):
    """A stand-in audio decoder: 16-bit little-endian PCM after a 4-byte rate header."""
    return np.frombuffer(data, "<i2", offset=4).astype(np.float32) / 32768


def _wrong(data):
    return np.zeros(3, np.float64)


def test_field_decoders_run_in_workers(tmp_path):
    from reader import FieldDecoder

    root = tmp_path / "audio"
    rng = np.random.default_rng(0)
    clips = [rng.integers(-3000, 3000, n).astype("<i2") for n in (5, 0, 12, 7)]
    with DatasetWriter(root, [Field("audio", "bytes"), Field("label", "int")], shard_size=None,
                       records_per_shard=2, durable=False) as w:
        for i, c in enumerate(clips):
            w.write({"audio": b"RATE" + c.tobytes(), "label": i})
    dec = FieldDecoder(_pcm, "float32", max_rows=16)
    with Loader(root, 4, decoders={"audio": dec}, num_workers=2) as lo:
        b = next(iter(lo))
    assert isinstance(b["audio"], Ragged) and b["label"].tolist() == [0, 1, 2, 3]
    for got, c in zip(b["audio"], clips, strict=True):
        assert np.allclose(got, c / 32768)
    with Loader(root, 4, decoders={"audio": dec}, collate={"audio": "padded"},
                num_workers=0) as lo:
        b = next(iter(lo))
    assert b["audio"].shape == (4, 12) and b["audio_size"][:, 0].tolist() == [5, 0, 12, 7]
    with Loader(root, 4, decoders={"audio": FieldDecoder(_pcm, "float32", max_rows=8)},
                num_workers=0) as lo, pytest.raises(reader.WorkerError, match="max_rows=8"):
        next(iter(lo))
    with Loader(root, 4, decoders={"audio": FieldDecoder(_wrong, "float32", max_rows=8)},
                num_workers=0) as lo, pytest.raises(reader.WorkerError, match="returned float64"):
        next(iter(lo))
    with pytest.raises(ValueError, match="'label' is int"):
        Loader(root, 4, decoders={"label": dec})


def test_a_field_named_like_a_size_column_is_refused(tmp_path):
    root = tmp_path / "clash"
    rng = np.random.default_rng(0)
    with DatasetWriter(root, [Field("image", "jpeg"), Field("image_size", "int")], shard_size=None,
                       records_per_shard=4, durable=False) as w:
        for _ in range(2):
            w.write({"image": _record(rng, 0)["image"], "image_size": 1})
    with pytest.raises(ValueError, match="carry 'image_size' beside it"):
        Loader(root, 2, transform=DETECTION)
    with Loader(root, 2, num_workers=0, transform=DETECTION, fields=("image",)) as lo:
        assert next(iter(lo))["image_size"].shape == (2, 2)


def test_pad_to_multiple_pads_with_zeros_when_slots_are_reused(tmp_path):
    root = tmp_path / "noise"
    rng = np.random.default_rng(0)
    shapes = [(37, 50), (50, 37), (41, 41), (64, 33)]
    with DatasetWriter(root, [Field("image", "jpeg")], shard_size=None, records_per_shard=4,
                       durable=False) as w:
        for h, wd in shapes:
            img = rng.integers(100, 256, (h, wd, 3), dtype=np.uint8)  # never zero
            w.write({"image": simplejpeg.encode_jpeg(img, quality=95)})
    with Loader(root, 2, transform=[Resize(40), PadToMultiple(32)], shuffle=True,
                num_workers=0, copy=True) as lo:
        for _ in range(3):  # later epochs reuse slots that held other images
            for b in lo:
                for im in b["image"]:
                    rows = np.flatnonzero(im.any(axis=(1, 2)))
                    cols = np.flatnonzero(im.any(axis=(0, 2)))
                    h, w = rows[-1] + 1, cols[-1] + 1  # the resized image's extent
                    assert min(h, w) == 40 and len(rows) == h and len(cols) == w
                    assert not im[h:].any() and not im[:, w:].any()


def test_padded_to_a_multiple_keeps_each_images_size(det_path):
    resize = [ResizeShortestEdge((48, 64, 80), max_size=120), RandomHorizontalFlip()]
    with Loader(det_path, 8, transform=resize, collate={"image": Padded(multiple=32)},
                num_workers=0, seed=3) as lo:
        for b in lo:
            sizes = b["image_size"]
            n, hb, wb, _ = b["image"].shape
            assert hb % 32 == 0 and wb % 32 == 0
            assert hb - 32 < sizes[:, 0].max() <= hb and wb - 32 < sizes[:, 1].max() <= wb
            assert sizes.min() >= 48 and (sizes % 32).any()  # the images' own sizes
            assert b["mask"].shape == (n, hb, wb)  # masks pad like their image
            for i, (h, w) in enumerate(sizes):
                assert not b["image"][i, h:].any() and not b["image"][i, :, w:].any()
    with pytest.raises(ValueError, match="not both"):
        Padded(to=64, multiple=32)


@pytest.mark.parametrize("workers", [0, 2])
def test_one_short_side_per_batch(det_path, workers):
    per_batch = [ResizeShortestEdge((48, 64, 80), per_batch=True), CenterCrop(40)]
    with Loader(det_path, 6, transform=[ResizeShortestEdge((48, 64, 80), per_batch=True)],
                num_workers=workers, seed=1) as lo:
        shorts = []
        for b in lo:
            s = b["image_size"].min(axis=1)
            assert (s == s[0]).all()  # one short side for the whole batch
            shorts.append(int(s[0]))
    assert len(set(shorts)) > 1  # but not the same for every batch
    with Loader(det_path, 6, transform=per_batch, num_workers=0) as lo:
        assert lo.spec.sample is not None  # drawn where a whole batch is planned
        assert next(iter(lo))["image"].shape == (6, 40, 40, 3)


# -- regressions found by review ---------------------------------------------------------

def test_torch_conversion_never_writes_the_slot(det_path):
    torch = pytest.importorskip("torch", reason="the torch adapter needs PyTorch")
    from reader.torch_adapter import to_torch

    with Loader(det_path, 2, transform=[*DETECTION, Normalize()], num_workers=0) as lo:
        b = next(iter(lo))
        before = b["image"].copy()
        t = to_torch(b, dtype=torch.float32, padding_mask=True)
        assert np.array_equal(b["image"], before)  # normalized images are cast, not scaled
        assert np.allclose(t["image"].numpy(), before)
        n, hb, wb, _ = b["image"].shape
        assert t["image_mask"].shape == (n, hb, wb)
    with Loader(det_path, 2, transform=[*DETECTION, Normalize(channels_first=True)],
                num_workers=0) as lo:
        b = next(iter(lo))
        t = to_torch(b, padding_mask=True)
        assert t["image_mask"].shape == (2, *b["image"].shape[2:])


def test_review_refusals(det_path):
    with pytest.raises(ValueError, match="masks all have the size"):
        Loader(det_path, 4, transform=[CenterCrop(32)], collate={"mask": "ragged"})
    with pytest.raises(ValueError, match="give one count"):
        Loader(det_path, 4, transform=DETECTION, collate={"boxes": Padded(to=(4, 4))})
    with pytest.raises(ValueError, match=r"give \(height, width\)"):
        Loader(det_path, 4, transform=DETECTION, collate={"image": Padded(to=64)})
    from reader.batching import AspectRatioBatches, BudgetBatches

    with Loader(det_path, 4, batch_sampler=AspectRatioBatches(),
                transform=DETECTION) as lo:  # the Loader's batch size, the one way
        assert lo.batch_size == 4
    with Loader(det_path, batch_sampler=BudgetBatches(8 * 128 * 128), transform=DETECTION) as lo:
        assert len(lo) > 0


def test_boxes_of_another_shape_are_refused(tmp_path):
    root = tmp_path / "b5"
    rng = np.random.default_rng(0)
    fields = [Field("image", "jpeg"), Field("boxes", "ndarray", dtype="float32", shape=(None, 5))]
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=4, durable=False) as w:
        w.write({"image": _record(rng, 1)["image"], "boxes": np.zeros((1, 5), np.float32)})
    with pytest.raises(ValueError, match=r"not the \[None, 4\] xyxy boxes"):
        Loader(root, 1, transform=DETECTION)
    with Loader(root, 1, transform=DETECTION, annotations=reader.Annotations(boxes=""),
                num_workers=0) as lo:
        assert next(iter(lo))["boxes"][0].shape == (1, 5)


def test_integer_boxes_are_moved_as_floats(tmp_path):
    root = tmp_path / "intboxes"
    rng = np.random.default_rng(0)
    fields = [Field("image", "jpeg"), Field("boxes", "ndarray", dtype="int32", shape=(None, 4))]
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=4, durable=False) as w:
        img = np.zeros((64, 64, 3), np.uint8)
        w.write({"image": simplejpeg.encode_jpeg(img), "boxes": np.array([[10, 10, 21, 31]],
                                                                         np.int32)})
    with Loader(root, 1, transform=[Resize((32, 32))], num_workers=0) as lo:
        boxes = next(iter(lo))["boxes"][0]
    assert boxes.dtype == np.float32 and boxes.tolist() == [[5.0, 5.0, 10.5, 15.5]]
    del rng


def test_a_decode_failure_after_layout_empties_the_sample(tmp_path):
    root = tmp_path / "trunc"
    rng = np.random.default_rng(0)
    fields = [Field("image", "image"), Field("boxes", "ndarray", dtype="float32", shape=(None, 4)),
              Field("labels", "ndarray", dtype="int64", shape=(None,))]
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=4, durable=False) as w:
        for i in range(2):
            rec = _record(rng, 2)
            data = rec["image"]
            if i == 1:  # a PNG whose header reads but whose body does not decode
                png = cv2.imencode(".png", rng.integers(0, 255, (40, 48, 3), dtype=np.uint8))[1]
                data = png.tobytes()[:200]
            w.write({"image": data, "boxes": np.array([[1, 1, 9, 9]], np.float32),
                     "labels": np.array([1])})
    with Loader(root, 2, transform=DETECTION, num_workers=0, on_error="skip") as lo:
        b = next(iter(lo))
    assert b["valid"].tolist() == [True, False]
    assert len(b["boxes"][1]) == 0 and len(b["labels"][1]) == 0
    assert tuple(b["image_size"][1]) == (0, 0)


def test_compressed_arrays_are_bounded_from_the_manifest(tmp_path):
    root = tmp_path / "z"
    fields = [Field("image", "jpeg"),
              Field("boxes", "ndarray", dtype="float32", shape=(None, 4), compression="zstd"),
              Field("labels", "ndarray", dtype="int64", shape=(None,), compression="zstd")]
    rng = np.random.default_rng(0)
    most = 0
    with DatasetWriter(root, fields, shard_size=None, records_per_shard=4, durable=False) as w:
        for i in range(6):
            rec = _record(rng, i)
            most = max(most, len(rec["boxes"]))
            w.write({k: rec[k] for k in ("image", "boxes", "labels")}, meta=rec["_meta"])
    with Loader(root, 3, transform=DETECTION, num_workers=0) as lo:
        boxes = lo.plan.var_fields[[v.name for v in lo.plan.var_fields].index("boxes")]
        assert boxes.bound == (most,) and most > 0  # the most boxes of a record
        for b in lo:
            assert np.array_equal(b["boxes"].lengths, b["labels"].lengths)
