"""Train a small CNN with the shardpack Loader; resumable from a checkpoint.

    python -m scripts.train_example --data /tmp/tiny-ds --make-data --steps 300 --checkpoint ckpt.pt
    python -m scripts.train_example --data /tmp/tiny-ds --steps 600 --resume ckpt.pt
    python scripts/train_example.py ...   # the same, run as a file

The checkpoint (saved every ``--save-every`` steps and at the end of the run) holds
the model, the optimizer and the loader's ``state_dict()``, so a resumed run continues
at exactly the next unseen batch (see :mod:`scripts.checkpoint`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

if not __package__:  # run as a file (python scripts/X.py): import as `python -m scripts.X` does
    sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the checkout, not scripts/

from scripts import checkpoint


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
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=300, help="total optimizer steps")
    p.add_argument("--workers", default="auto")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    checkpoint.add_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50)
    args = p.parse_args(argv)
    try:
        checkpoint.check_arguments(p, args)
    except checkpoint.CheckpointError as exc:
        print(f"train_example: error: {exc}", file=sys.stderr)
        return 1

    try:
        import torch
        from torch import nn
    except ImportError:
        print("train_example needs PyTorch: pip install 'shardpack[torch]'", file=sys.stderr)
        return 2
    from reader import Loader
    from reader.torch_adapter import to_torch
    from reader.transforms import RandomHorizontalFlip, RandomResizedCrop

    if args.make_data:
        make_data(args.data, args.records, args.classes, side=args.size + args.size // 2)
    torch.manual_seed(args.seed)
    workers = args.workers if args.workers == "auto" else int(args.workers)
    device_options = None
    if args.device == "cuda":
        from reader.device import DeviceOptions

        # uint8 crosses PCIe; the GPU converts to NCHW float32 in 0..1, as to_torch does
        # on the CPU path.
        device_options = DeviceOptions(dtype="float32", layout="NCHW", output="torch",
                                       mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0))
    loader = Loader(args.data, args.batch_size, num_workers=workers, shuffle=True,
                    seed=args.seed, drop_last=True, device=args.device,
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
    step, saved = 0, None  # saved: the step this run last saved at
    if args.resume is not None:
        try:
            step = checkpoint.load(args.resume, model, opt, "loader", loader)
        except checkpoint.CheckpointError as exc:
            loader.close()
            print(f"train_example: error: {exc}", file=sys.stderr)
            return 1
        print(f"resumed at step {step}, epoch {loader.epoch}, batch {loader.position}")

    t0, seen, correct, total, loss_sum = time.perf_counter(), 0, 0, 0, 0.0
    with loader:
        while step < args.steps:
            for batch in loader:
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
                step += 1
                seen += len(y)
                loss_sum += loss.item()
                correct += int((logits.argmax(1) == y).sum())
                total += len(y)
                if step % args.log_every == 0:
                    dt = time.perf_counter() - t0
                    print(f"step {step:5d}  epoch {loader.epoch}  loss {loss_sum / args.log_every:.3f}  "
                          f"acc {correct / total:.3f}  {seen / dt:.0f} img/s", flush=True)
                    loss_sum, correct, total = 0.0, 0, 0
                if args.checkpoint is not None and step % args.save_every == 0:
                    checkpoint.save(args.checkpoint, step, model, opt, "loader", loader)
                    saved = step
                if step >= args.steps:
                    break
        if args.checkpoint is not None and saved != step:
            checkpoint.save(args.checkpoint, step, model, opt, "loader", loader)
    print(f"done: {step} steps, {seen} images in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
