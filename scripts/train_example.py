"""Train a small CNN with the shardpack Loader; resumable from a checkpoint.

    python -m scripts.train_example --data /tmp/tiny-ds --make-data --steps 300 --checkpoint ckpt.pt
    python -m scripts.train_example --data /tmp/tiny-ds --steps 600 --resume ckpt.pt
    python scripts/train_example.py ...   # the same, run as a file

The checkpoint (saved every ``--save-every`` steps and at the end of the run) holds
the model, the optimizer and the loader's ``state_dict()``, so a resumed run continues
at exactly the next unseen batch (see :mod:`scripts.checkpoint`); the loop and its
setup are :mod:`scripts.training`'s, shared by the example trainers.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file (python scripts/X.py): import as `python -m scripts.X` does
    sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the checkout, not scripts/

from scripts import training

NAME = "train_example"


def make_data(root: Path, n: int, classes: int, side: int, seed: int = 0) -> None:
    """A toy labelled dataset: the class decides the colour of a square."""
    import simplejpeg

    from formats import DatasetWriter, Field

    rng = np.random.default_rng(seed)
    palette = rng.integers(0, 256, (classes, 3), dtype=np.uint8)
    with DatasetWriter(root, [Field("image", "jpeg"), Field("label", "int")],
                       records_per_shard=max(1, n // 4), shard_size=None, overwrite=True,
                       classes=[f"c{i}" for i in range(classes)]) as w:
        for _ in range(n):
            label = int(rng.integers(classes))
            img = rng.integers(0, 60, (side, side, 3), dtype=np.uint8)
            y, x = rng.integers(0, side // 2, 2)
            img[y:y + side // 2, x:x + side // 2] = palette[label]
            w.write({"image": simplejpeg.encode_jpeg(img, quality=90), "label": label})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="packed dataset folder")
    p.add_argument("--make-data", action="store_true", help="create a toy dataset in --data first")
    p.add_argument("--records", type=int, default=2000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--size", type=int, default=32, help="crop size")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    training.add_arguments(p, batch_size=32, log_every=50)
    return training.run(p, argv, NAME, _train)


def _train(args: argparse.Namespace, torch) -> int:
    """Make the data if asked, then train (``main``'s arguments, checked)."""
    from torch import nn

    from reader import Loader
    from reader.torch_adapter import to_torch
    from reader.transforms import RandomHorizontalFlip, RandomResizedCrop

    if args.make_data:
        make_data(args.data, args.records, args.classes, side=args.size + args.size // 2)
    torch.manual_seed(args.seed)
    device_options = None
    if args.device == "cuda":
        from reader import DeviceOptions

        # uint8 crosses PCIe; the GPU converts to NCHW float32 in 0..1, as to_torch does
        # on the CPU path.
        device_options = DeviceOptions(dtype="float32", layout="NCHW", output="torch",
                                       mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0))
    loader = Loader(args.data, args.batch_size, num_workers=args.workers, shuffle=True,
                    seed=args.seed, drop_last=True, device=args.device,
                    ledger=training.ledger_of(args),
                    device_options=device_options,
                    transform=[RandomResizedCrop(args.size, scale=(0.5, 1.0)),
                               RandomHorizontalFlip()])
    classes = len(loader.dataset.classes or ()) or args.classes
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, classes))
    if args.device == "cuda":
        model = model.cuda(loader.device_options.device_id or 0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = training.resume(args, NAME, model, opt, "loader", loader)
    if step is None:
        return 1

    t0 = time.perf_counter()
    seen = 0
    window = {"correct": 0, "total": 0, "loss": 0.0}  # since the last log line

    def fit(batch) -> None:
        nonlocal seen
        if args.device == "cuda":
            x, y = batch["image"], batch["label"]  # already float32 NCHW on the GPU
        else:
            b = to_torch(batch, channels_first=True, dtype=torch.float32)
            x, y = b["image"], b["label"]
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen += len(y)
        window["loss"] += loss.item()
        window["correct"] += int((logits.argmax(1) == y).sum())
        window["total"] += len(y)

    def log(step: int) -> None:
        dt = time.perf_counter() - t0
        print(f"step {step:5d}  epoch {loader.epoch}  loss {window['loss'] / args.log_every:.3f}  "
              f"acc {window['correct'] / window['total']:.3f}  {seen / dt:.0f} img/s", flush=True)
        window.update(correct=0, total=0, loss=0.0)

    step = training.train(args, loader, "loader", model, opt, step, fit, log)
    print(f"done: {step} steps, {seen} images in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
