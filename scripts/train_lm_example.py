"""Train a tiny byte-level language model on token blocks; resumable from a checkpoint.

    python -m scripts.train_lm_example --data /tmp/text.shards --make-data --steps 300 --checkpoint lm.pt
    python -m scripts.train_lm_example --data /tmp/text.shards --steps 600 --resume lm.pt
    python scripts/train_lm_example.py ...   # the same, run as a file

The data is a packed text dataset whose ``tokens`` field holds each document's
token ids (``scripts.pack_text_example`` makes one: UTF-8 bytes as ids 0-255, 256
ends a document). :class:`reader.TokenBlocks` cuts the stream of all documents
into shuffled blocks of ``block_size + 1`` tokens, across document boundaries;
the model learns to predict ``block[1:]`` from ``block[:-1]``. The checkpoint
(saved every ``--save-every`` steps and at the end of the run) holds the model, the
optimizer and the reader's ``state_dict()``, so a resumed run continues at exactly
the next unseen batch (see :mod:`scripts.checkpoint`).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

if not __package__:  # run as a file (python scripts/X.py): import as `python -m scripts.X` does
    sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the checkout, not scripts/

from scripts import checkpoint

VOCAB = 257  # byte values and the end-of-document id (scripts.pack_text_example)


def build_model(dim: int, layers: int, block: int):
    """A small causal transformer: token and position embeddings, pre-norm blocks."""
    import torch
    from torch import nn

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = nn.Embedding(VOCAB, dim)
            self.positions = nn.Embedding(block, dim)
            layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=4 * dim,
                                               dropout=0.0, batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, VOCAB, bias=False)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(block),
                                 persistent=False)

        def forward(self, x):
            n = x.shape[1]
            pos = torch.arange(n, device=x.device)
            h = self.tokens(x) + self.positions(pos)
            h = self.blocks(h, mask=self.mask[:n, :n], is_causal=True)
            return self.head(self.norm(h))

    return TinyLM()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="packed text dataset folder")
    p.add_argument("--make-data", action="store_true",
                   help="pack a generated corpus into --data first (scripts.pack_text_example)")
    p.add_argument("--documents", type=int, default=2000, help="documents for --make-data")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=300, help="total optimizer steps")
    p.add_argument("--lr", type=float, default=3e-3)
    checkpoint.add_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50)
    args = p.parse_args(argv)
    try:
        checkpoint.check_arguments(p, args)
    except checkpoint.CheckpointError as exc:
        print(f"train_lm_example: error: {exc}", file=sys.stderr)
        return 1

    try:
        import torch
        from torch import nn
    except ImportError:
        print("train_lm_example needs PyTorch: pip install 'shardpack[torch]'", file=sys.stderr)
        return 2
    from reader import TokenBlocks

    if args.make_data:
        from scripts.pack_text_example import main as pack_text

        if pack_text(["--out", str(args.data), "--docs", str(args.documents),
                      "--overwrite"]) not in (0, None):
            return 1
    torch.manual_seed(args.seed)
    blocks = TokenBlocks(args.data, args.block_size, args.batch_size, seed=args.seed,
                         drop_last=True)
    model = build_model(args.dim, args.layers, args.block_size)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    step, saved = 0, None  # saved: the step this run last saved at
    if args.resume is not None:
        try:
            step = checkpoint.load(args.resume, model, opt, "blocks", blocks)
        except checkpoint.CheckpointError as exc:
            blocks.close()
            print(f"train_lm_example: error: {exc}", file=sys.stderr)
            return 1
        print(f"resumed at step {step}, epoch {blocks.epoch}, batch {blocks.position}")
    print(f"{blocks.num_tokens:,} tokens, {blocks.num_blocks:,} blocks of {args.block_size} + 1; "
          f"{len(blocks)} batches per epoch; loss of a uniform guess {math.log(VOCAB):.2f}")

    t0, seen, loss_sum, logged = time.perf_counter(), 0, 0.0, 0
    with blocks:
        while step < args.steps:
            for batch in blocks:
                x = torch.from_numpy(batch).long()  # one copy: int32 ids to int64 indices
                logits = model(x[:, :-1])
                loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                                   x[:, 1:].reshape(-1))
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                seen += x[:, 1:].numel()
                loss_sum += loss.item()
                logged += 1
                if step % args.log_every == 0:
                    dt = time.perf_counter() - t0
                    print(f"step {step:5d}  epoch {blocks.epoch}  loss {loss_sum / logged:.3f}  "
                          f"{seen / dt:.0f} tokens/s", flush=True)
                    loss_sum, logged = 0.0, 0
                if args.checkpoint is not None and step % args.save_every == 0:
                    checkpoint.save(args.checkpoint, step, model, opt, "blocks", blocks)
                    saved = step
                if step >= args.steps:
                    break
        if args.checkpoint is not None and saved != step:
            checkpoint.save(args.checkpoint, step, model, opt, "blocks", blocks)
    print(f"done: {step} steps, {seen:,} tokens in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
