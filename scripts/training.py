"""What the example trainers share: their common arguments, PyTorch, resuming, and the
training loop with its checkpoints.

A trainer (``scripts/train_*.py``) keeps what is its own: its data, its reader (a
``Loader`` or ``TokenBlocks``), its model and one optimizer step::

    def main(argv=None) -> int:
        p = argparse.ArgumentParser(...)       # the trainer's own arguments, then
        training.add_arguments(p, batch_size=32, log_every=50)
        return training.run(p, argv, NAME, _train)

    def _train(args, torch) -> int:
        ...                                    # data, reader, model, optimizer
        step = training.resume(args, NAME, model, opt, "loader", loader)
        if step is None:
            return 1
        step = training.train(args, loader, "loader", model, opt, step, fit, log)

Exit codes and messages are the trainers' as before (:mod:`scripts.checkpoint` has the
command-line rules of ``--checkpoint``, ``--save-every`` and ``--resume``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scripts import checkpoint

__all__ = ["add_arguments", "ledger_of", "resume", "run", "train"]


def add_arguments(p: argparse.ArgumentParser, *, batch_size: int, log_every: int,
                  workers: bool = True) -> None:
    """``--batch-size``, ``--steps``, ``--workers`` (a Loader's; ``workers=False`` for a
    reader without), the checkpoint's, ``--seed``, ``--log-every`` and ``--ledger``."""
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--steps", type=int, default=300, help="total optimizer steps")
    if workers:
        p.add_argument("--workers", type=_workers, default="auto",
                       help="the Loader's workers: a number or auto")
    checkpoint.add_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=log_every)
    p.add_argument("--ledger", type=Path, default=None, metavar="FILE.jsonl",
                   help="also log each batch's ledger line here (the running hash of what "
                        "was served is printed at the end either way); compare two runs with "
                        "inspect-shards A ledger-diff B")


def ledger_of(args: argparse.Namespace) -> Path | bool:
    """The reader's ``ledger=``: the ``--ledger`` file, else the running hash alone."""
    return args.ledger if args.ledger is not None else True


def _workers(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number or auto, not {text!r}") from None


def run(p: argparse.ArgumentParser, argv: list[str] | None, name: str,
        body: Callable[[argparse.Namespace, Any], int]) -> int:
    """``body(args, torch)``'s exit code, once the arguments are checked
    (:func:`scripts.checkpoint.check_arguments`: a usage error exits 2) and PyTorch is
    imported; 1 after one line saying why a ``--resume`` file cannot be used, 2 after
    the install hint when PyTorch is missing."""
    args = p.parse_args(argv)
    try:
        checkpoint.check_arguments(p, args)
    except checkpoint.CheckpointError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 1
    try:
        import torch
    except ImportError:
        print(f"{name} needs PyTorch: pip install 'shardpack[torch]'", file=sys.stderr)
        return 2
    return body(args, torch)


def resume(args: argparse.Namespace, name: str, model: Any, optimizer: Any, key: str,
           reader: Any) -> int | None:
    """The step to start at: 0, or with ``--resume`` the checkpoint's, the model, the
    optimizer and ``reader`` restored; None (``reader`` closed) after one line saying
    why the checkpoint cannot be resumed from."""
    if args.resume is None:
        return 0
    try:
        step = checkpoint.load(args.resume, model, optimizer, key, reader)
    except checkpoint.CheckpointError as exc:
        reader.close()
        print(f"{name}: error: {exc}", file=sys.stderr)
        return None
    print(f"resumed at step {step}, epoch {reader.epoch}, batch {reader.position}")
    return step


def train(args: argparse.Namespace, reader: Any, key: str, model: Any, optimizer: Any,
          step: int, fit: Callable[[Any], None], log: Callable[[int], None]) -> int:
    """Epoch after epoch of ``reader``, ``fit(batch)`` (one optimizer step) until
    ``args.steps`` steps; ``log(step)`` every ``args.log_every`` steps; a checkpoint
    every ``args.save_every`` steps and at the end (with ``--checkpoint``). Closes
    ``reader``; returns the step reached."""
    saved = None  # the step this run last saved at
    with reader:
        while step < args.steps:
            for batch in reader:
                fit(batch)
                step += 1
                if step % args.log_every == 0:
                    log(step)
                if args.checkpoint is not None and step % args.save_every == 0:
                    checkpoint.save(args.checkpoint, step, model, optimizer, key, reader)
                    saved = step
                if step >= args.steps:
                    break
        if args.checkpoint is not None and saved != step:
            checkpoint.save(args.checkpoint, step, model, optimizer, key, reader)
    ledger = getattr(reader, "ledger", None)
    if ledger is not None:  # a resumed run ends with a straight run's hash, or data moved
        print(f"ledger: {ledger.state()['hash']} after {ledger.steps} batches")
    return step
