"""Train a small object detector with the shardpack Loader; resumable from a checkpoint.

    python -m scripts.train_detection_example --data /tmp/det --make-data --steps 300 --checkpoint ckpt.pt
    python -m scripts.train_detection_example --data /tmp/det --steps 600 --resume ckpt.pt
    python scripts/train_detection_example.py ...   # the same, run as a file

``--make-data`` draws a COCO-style set (``scripts.synth.coco_detection``: coloured
rectangles and ellipses, the colour is the class) for training and a second one,
with another seed, held out; each is packed with ``pack-dataset --from coco``.

The model is CenterNet-style ("Objects as Points", Zhou et al. 2019), small enough
for a CPU: a convolutional backbone at stride 4, then three heads over its grid: a
heatmap per class (a peak at each object's centre, trained with the focal loss),
the box's width and height, and the centre's sub-cell offset (both L1, at the
centres only). Detections are the heatmap's local maxima.

The Loader does the data side in its worker processes: decode, a random short side,
a random flip that moves the boxes with the image, padding to a multiple of 32, and
batches of one orientation (``AspectRatioBatches``), so little of a batch is
padding. A batch holds the padded images with each one's size, and the boxes and
labels as ragged arrays; ``to_torch`` turns those into lists of tensors, one per
image. The checkpoint (saved every ``--save-every`` steps and at the end of the run)
holds the model, the optimizer and ``loader.state_dict()``, so a resumed run continues
at exactly the next unseen batch (see :mod:`scripts.checkpoint`); the loop and its
setup are :mod:`scripts.training`'s, shared by the example trainers.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file (python scripts/X.py): import as `python -m scripts.X` does
    sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the checkout, not scripts/

from scripts import training

NAME = "train_detection_example"

STRIDE = 4  # input pixels per cell of the model's output grid
WIDTH = 32  # channels of the backbone's last layer and of the heads


# -- data --------------------------------------------------------------------------------

def make_data(root: Path, train: int, held_out: int, seed: int, min_side: int,
              max_side: int) -> None:
    """Draw two COCO-style sets (train, held out) and pack each with ``pack-dataset``."""
    from scripts.synth import coco_detection

    for name, n, s in (("train", train, seed), ("held_out", held_out, seed + 1)):
        images, annotations = coco_detection(root / f"{name}-coco", n, seed=s, min_side=min_side,
                                             max_side=max_side, max_objects=6)
        # The same as `pack-dataset IMAGES DST --annotations FILE` on a command line.
        subprocess.run([sys.executable, "-m", "packer.cli", str(images), str(root / name),
                        "--annotations", str(annotations), "--overwrite", "--quiet"],
                       check=True, stdout=subprocess.DEVNULL)


def loader_for(path: Path, batch_size: int, *, train: bool, short: tuple[int, ...],
               max_size: int, seed: int, workers, ledger=False):
    from reader import Loader
    from reader.batching import AspectRatioBatches
    from reader.transforms import PadToMultiple, RandomHorizontalFlip, ResizeShortestEdge

    if train:
        transform = [ResizeShortestEdge(short, max_size=max_size), RandomHorizontalFlip(),
                     PadToMultiple(32)]
    else:  # held out: one size, no flip, the order as stored
        transform = [ResizeShortestEdge(max(short), max_size=max_size), PadToMultiple(32)]
    return Loader(path, batch_size, batch_sampler=AspectRatioBatches(), shuffle=train,
                  seed=seed, drop_last=train, num_workers=workers, transform=transform,
                  ledger=ledger)


# -- the model ---------------------------------------------------------------------------

def build_model(num_classes: int):
    from torch import nn

    def conv(cin: int, cout: int, stride: int = 1, dilation: int = 1) -> list:
        return [nn.Conv2d(cin, cout, 3, stride, padding=dilation, dilation=dilation, bias=False),
                nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    def head(out: int, bias: float = 0.0):
        h = nn.Sequential(nn.Conv2d(WIDTH, WIDTH, 3, padding=1), nn.ReLU(inplace=True),
                          nn.Conv2d(WIDTH, out, 1))
        nn.init.constant_(h[-1].bias, bias)
        return h

    # Two stride-2 layers reach the output grid; dilations then widen the view (about
    # 60 px) so that a cell at an object's centre sees the object's edges.
    backbone = nn.Sequential(*conv(3, 16, 2), *conv(16, 32, 2), *conv(32, 32),
                             *conv(32, 32, dilation=2), *conv(32, WIDTH, dilation=4))
    # -2.19 = logit(0.1): every cell starts as "probably no object", as CenterNet
    # initializes it, so the many empty cells do not swamp the first steps.
    return nn.ModuleDict({"backbone": backbone, "heatmap": head(num_classes, -2.19),
                          "size": head(2), "offset": head(2)})


def forward(model, images):
    features = model["backbone"](images)
    return model["heatmap"](features), model["size"](features), model["offset"](features)


# -- training targets and losses -----------------------------------------------------------

def targets(boxes: list, labels: list, num_classes: int, grid: tuple[int, int]):
    """CenterNet's targets for one batch: a Gaussian heatmap per class, and each object's
    centre cell with its size and sub-cell offset (in cells)."""
    import torch

    gh, gw = grid
    heat = np.zeros((len(boxes), num_classes, gh, gw), np.float32)
    where, size, offset = [], [], []
    ys, xs = np.arange(gh)[:, None], np.arange(gw)[None, :]
    for i, (b, lab) in enumerate(zip(boxes, labels, strict=True)):
        for (x0, y0, x1, y1), c in zip(b.numpy() / STRIDE, lab.tolist(), strict=True):
            cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
            px, py = min(int(cx), gw - 1), min(int(cy), gh - 1)
            sigma = max((x1 - x0) + (y1 - y0), 2.0) / 12  # a larger object, a wider peak
            g = np.exp(-((xs - px) ** 2 + (ys - py) ** 2) / (2 * sigma**2))
            np.maximum(heat[i, c], g, out=heat[i, c])  # g is exactly 1 at the centre cell
            where.append((i, py, px))
            size.append((x1 - x0, y1 - y0))
            offset.append((cx - px, cy - py))
    where_t = torch.tensor(where, dtype=torch.long).reshape(-1, 3)
    return (torch.from_numpy(heat), where_t, torch.tensor(size).reshape(-1, 2),
            torch.tensor(offset).reshape(-1, 2))


def focal_loss(logits, target):
    """CenterNet's focal loss: cells near a centre are penalized less for firing."""
    import torch

    p = logits.sigmoid().clamp(1e-4, 1 - 1e-4)
    pos = target.eq(1).float()
    pos_loss = torch.log(p) * (1 - p) ** 2 * pos
    neg_loss = torch.log(1 - p) * p**2 * (1 - target) ** 4 * (1 - pos)
    return -(pos_loss.sum() + neg_loss.sum()) / pos.sum().clamp(min=1)


def loss_of(model, batch, num_classes: int):
    import torch.nn.functional as F

    heat, size, offset = forward(model, batch["image"])
    target, where, size_t, offset_t = targets(batch["boxes"], batch["labels"], num_classes,
                                              heat.shape[-2:])
    i, y, x = where.unbind(1)
    # size and offset are learnt at the object centres only; 0.1 as in CenterNet.
    return (focal_loss(heat, target) + 0.1 * F.l1_loss(size[i, :, y, x], size_t)
            + F.l1_loss(offset[i, :, y, x], offset_t))


# -- evaluation -------------------------------------------------------------------------

def detect(model, images, score_threshold: float = 0.3, top_k: int = 50) -> list:
    """Per image: ``(boxes [K, 4] xyxy pixels, classes [K], scores [K])``."""
    import torch
    import torch.nn.functional as F

    heat, size, offset = forward(model, images)
    heat = heat.sigmoid()
    # A cell is a detection when it is the maximum of its 3x3 neighbourhood (CenterNet's NMS).
    heat = heat * (F.max_pool2d(heat, 3, stride=1, padding=1) == heat)
    n, c, h, w = heat.shape
    scores, index = heat.reshape(n, -1).topk(min(top_k, c * h * w))
    out = []
    for i in range(n):
        keep = scores[i] >= score_threshold
        cls, cell = index[i][keep] // (h * w), index[i][keep] % (h * w)
        y, x = cell // w, cell % w
        cx, cy = x + offset[i, 0, y, x], y + offset[i, 1, y, x]
        bw, bh = size[i, 0, y, x], size[i, 1, y, x]
        boxes = torch.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1) * STRIDE
        out.append((boxes, cls, scores[i][keep]))
    return out


def iou(a, b):
    """Pairwise IoU of boxes ``a [N, 4]`` and ``b [M, 4]`` (xyxy)."""
    import torch

    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).clamp(min=0).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).clamp(min=0).prod(-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter).clamp(min=1e-6)


def evaluate(model, loader) -> tuple[float, float]:
    """Recall and precision at IoU 0.5 (same class) over one pass of ``loader``."""
    import torch

    from reader.torch_adapter import to_torch

    found = total = correct = predicted = 0
    model.eval()
    with torch.no_grad():
        loader.set_epoch(0)
        for batch in loader:
            b = to_torch(batch, channels_first=True, dtype=torch.float32)
            for (boxes, cls, _), gt, gt_cls in zip(detect(model, b["image"]), b["boxes"],
                                                   b["labels"], strict=True):
                same = iou(boxes, gt) * (cls[:, None] == gt_cls[None, :])
                found += int((same >= 0.5).any(0).sum())
                correct += int((same >= 0.5).any(1).sum())
                total += len(gt)
                predicted += len(boxes)
    model.train()
    return found / max(total, 1), correct / max(predicted, 1)


# -- the training loop ------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True,
                   help="folder holding the packed sets 'train' and 'held_out'")
    p.add_argument("--make-data", action="store_true", help="draw and pack both sets first")
    p.add_argument("--images", type=int, default=1000, help="training images to draw")
    p.add_argument("--held-out", type=int, default=128, help="held-out images to draw")
    p.add_argument("--min-side", type=int, default=160, help="drawn images' smallest side")
    p.add_argument("--max-side", type=int, default=240, help="drawn images' largest side")
    p.add_argument("--short", type=int, nargs="+", default=[128, 160],
                   help="ResizeShortestEdge's short sides")
    p.add_argument("--max-size", type=int, default=224, help="ResizeShortestEdge's max_size")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--threads", type=int, default=max(1, len(os.sched_getaffinity(0)) // 2),
                   help="torch's threads (default: half the cores; the Loader's workers "
                        "use the rest)")
    training.add_arguments(p, batch_size=16, log_every=25)
    return training.run(p, argv, NAME, _train)


def _train(args: argparse.Namespace, torch) -> int:
    """Make the data if asked, then train (``main``'s arguments, checked)."""
    from reader.torch_adapter import to_torch

    if args.make_data:
        t = time.perf_counter()
        make_data(args.data, args.images, args.held_out, args.seed, args.min_side,
                  args.max_side)
        print(f"made and packed {args.images} + {args.held_out} images in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
    short = tuple(args.short)
    loader = loader_for(args.data / "train", args.batch_size, train=True, short=short,
                        max_size=args.max_size, seed=args.seed, workers=args.workers,
                        ledger=training.ledger_of(args))
    num_classes = len(loader.dataset.classes)
    # torch's threads wait for each other by spinning: when the Loader's workers (or
    # anything else) hold the cores they want, a step takes several times longer.
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = build_model(num_classes)
    untrained = build_model(num_classes)  # the same seed's starting point, kept for comparison
    untrained.load_state_dict(model.state_dict())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    step = training.resume(args, NAME, model, opt, "loader", loader)
    if step is None:
        return 1

    t0 = time.perf_counter()
    seen = 0
    window = {"loss": 0.0}  # since the last log line

    def fit(batch) -> None:
        nonlocal seen
        # images: float32 [B, 3, H, W] in 0..1, padded; boxes, labels: lists of tensors
        b = to_torch(batch, channels_first=True, dtype=torch.float32)
        loss = loss_of(model, b, num_classes)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen += len(b["boxes"])
        window["loss"] += loss.item()

    def log(step: int) -> None:
        print(f"step {step:5d}  epoch {loader.epoch}  loss "
              f"{window['loss'] / args.log_every:.4f}  "
              f"{seen / (time.perf_counter() - t0):.0f} img/s", flush=True)
        window["loss"] = 0.0

    step = training.train(args, loader, "loader", model, opt, step, fit, log)
    print(f"done: {step} steps, {seen} images in {time.perf_counter() - t0:.1f} s", flush=True)

    with loader_for(args.data / "held_out", args.batch_size, train=False, short=short,
                    max_size=args.max_size, seed=args.seed, workers=0) as held_out:
        recall, precision = evaluate(model, held_out)
        recall0, precision0 = evaluate(untrained, held_out)
    print(f"held out, IoU >= 0.5: recall {recall:.3f} precision {precision:.3f} "
          f"(untrained: recall {recall0:.3f} precision {precision0:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
