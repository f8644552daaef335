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
the next unseen batch (see :mod:`scripts.checkpoint`); the loop and its setup are
:mod:`scripts.training`'s, shared by the example trainers.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

if not __package__:  # run as a file (python scripts/X.py): import as `python -m scripts.X` does
    sys.path[0] = str(Path(__file__).resolve().parent.parent)  # the checkout, not scripts/

from scripts import training

NAME = "train_lm_example"
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
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    training.add_arguments(p, batch_size=16, log_every=50, workers=False)
    return training.run(p, argv, NAME, _train)


def _train(args: argparse.Namespace, torch) -> int:
    """Make the data if asked, then train (``main``'s arguments, checked)."""
    from torch import nn

    from reader import TokenBlocks

    if args.make_data:
        from scripts.pack_text_example import main as pack_text

        if pack_text(["--out", str(args.data), "--docs", str(args.documents),
                      "--overwrite"]) not in (0, None):
            return 1
    torch.manual_seed(args.seed)
    blocks = TokenBlocks(args.data, args.block_size, args.batch_size, seed=args.seed,
                         drop_last=True, ledger=training.ledger_of(args))
    model = build_model(args.dim, args.layers, args.block_size)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    step = training.resume(args, NAME, model, opt, "blocks", blocks)
    if step is None:
        return 1
    print(f"{blocks.num_tokens:,} tokens, {blocks.num_blocks:,} blocks of {args.block_size} + 1; "
          f"{len(blocks)} batches per epoch; loss of a uniform guess {math.log(VOCAB):.2f}")

    t0 = time.perf_counter()
    seen = 0
    window = {"loss": 0.0, "steps": 0}  # since the last log line

    def fit(batch) -> None:
        nonlocal seen
        x = torch.from_numpy(batch).long()  # one copy: int32 ids to int64 indices
        logits = model(x[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen += x[:, 1:].numel()
        window["loss"] += loss.item()
        window["steps"] += 1

    def log(step: int) -> None:
        dt = time.perf_counter() - t0
        print(f"step {step:5d}  epoch {blocks.epoch}  loss {window['loss'] / window['steps']:.3f}  "
              f"{seen / dt:.0f} tokens/s", flush=True)
        window.update(loss=0.0, steps=0)

    step = training.train(args, blocks, "blocks", model, opt, step, fit, log)
    print(f"done: {step} steps, {seen:,} tokens in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
