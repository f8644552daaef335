"""The README's demo: make a small image dataset locally, pack it, verify it, read it.

1. generates an ImageFolder of natural-looking JPEGs (no download);
2. packs it with ``pack-dataset`` (the library call behind the CLI);
3. verifies every checksum, as ``inspect-shards DST verify`` does;
4. reads it back with ``reader.Loader`` (worker processes, shared-memory batches,
   random resized crop + flip) with the monitor on (``reader.enable_monitor``),
   which prints its interval report and names the bottleneck.

It does not train: a 10 ms sleep per batch stands in for the training step, so
it needs only the core dependencies (no PyTorch). ``scripts/train_example.py``
trains a small CNN with the same loader.

Run: ``bash dev.sh demo`` (or ``python -m scripts.demo [--out DIR]``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import formats
import reader
from formats.shard.verify import ALL_MATCH
from packer import PackOptions, format_summary, pack
from reader.transforms import RandomHorizontalFlip, RandomResizedCrop
from scripts.synth import make_image_folder


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("demo"), help="working folder (default: ./demo)")
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args(argv)

    src, dst = args.out / "images", args.out / "shards"
    t0 = time.perf_counter()
    if not src.exists():
        make_image_folder(src, args.classes, args.per_class, seed=0, workers=2)
    files = sorted(src.rglob("*.jpg"))
    mb = sum(f.stat().st_size for f in files) / 1e6
    print(f"== 1. {len(files)} JPEGs ({mb:.1f} MB) in {src}/ ({time.perf_counter() - t0:.1f} s)")

    print(f"\n== 2. pack-dataset {src} {dst} --shard-size 8MB --shuffle --overwrite")
    summary = pack(src, dst, PackOptions(shard_size=8_000_000, shuffle=True, overwrite=True))
    print(format_summary(summary))

    print(f"\n== 3. inspect-shards {dst} verify")
    problems = formats.verify_dataset(dst)
    print(ALL_MATCH if not problems else "\n".join(map(str, problems)))
    if problems:
        return 1

    print(f"\n== 4. reader.Loader: batch 64, 2 workers, RandomResizedCrop(160) + flip, "
          f"{args.epochs} epochs, monitor every 1 s")
    record = args.out / "monitor.jsonl"
    record.unlink(missing_ok=True)
    reader.enable_monitor(interval=1, output=sys.stdout, record=record)  # the seed's one line
    loader = reader.Loader(dst, batch_size=64, num_workers=2, shuffle="block", seed=0,
                           transform=[RandomResizedCrop(160), RandomHorizontalFlip()])
    t0 = time.perf_counter()
    images = 0
    with loader:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            for batch in loader:
                images += len(batch["label"])
                time.sleep(0.01)  # stands in for a training step
        loader.monitor.flush()
        stats = loader.stats()
    dt = time.perf_counter() - t0
    print(f"\nread {images} images as {tuple(batch['image'].shape[1:])} uint8 batches in "
          f"{dt:.1f} s ({images / dt:,.0f} images/s); labels are {batch['label'].dtype}")
    print(f"diagnosis: {stats['diagnosis']['message']}")
    print(f"monitor records in {record}: summarize with `inspect-shards {record} monitor-report`")
    print("a real training loop over the same Loader: python -m scripts.train_example "
          "--data /tmp/toy --make-data --steps 300 (needs PyTorch)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
