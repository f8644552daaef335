"""Checkpoints of the example trainers: the model, the optimizer, the reader's position.

The trainers share these command-line rules: ``--checkpoint PATH`` saves every
``--save-every`` steps and at the end of the run (a run shorter than ``--save-every``
still leaves one); ``--resume PATH`` must name a checkpoint that exists, else the
trainer says so in one line and exits 1 (as the project's CLIs do for a path they
cannot read) before anything starts; ``--save-every`` without ``--checkpoint``, or
below 1, is a usage error (exit 2). A checkpoint is written under a temporary name
and moved into place, so a run stopped while saving keeps the previous one.
"""

from __future__ import annotations

import argparse
import os
import pickle
from pathlib import Path
from typing import Any

__all__ = ["CheckpointError", "add_arguments", "check_arguments", "load", "save"]

SAVE_EVERY = 100


class CheckpointError(Exception):
    """A ``--resume`` file that is missing or cannot be resumed from (the message says which)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--checkpoint``, ``--save-every`` and ``--resume``, the same in every trainer."""
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="save here every --save-every steps and at the end of the run")
    p.add_argument("--save-every", type=int, default=None,
                   help=f"steps between checkpoints (default {SAVE_EVERY}; needs --checkpoint)")
    p.add_argument("--resume", type=Path, default=None,
                   help="checkpoint to resume from (saved with --checkpoint)")


def check_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what the trainer would ignore or fail on (usage errors, exit 2) and a
    ``--resume`` file that does not exist (:class:`CheckpointError`)."""
    if args.save_every is not None:
        if args.checkpoint is None:
            p.error("--save-every needs --checkpoint (where to save)")
        if args.save_every < 1:
            p.error(f"--save-every must be at least 1, not {args.save_every}")
    else:
        args.save_every = SAVE_EVERY
    if args.resume is not None and not args.resume.is_file():
        what = "is not a file" if args.resume.exists() else "does not exist"
        raise CheckpointError(f"{args.resume}: the --resume checkpoint {what}")


def save(path: Path, step: int, model: Any, optimizer: Any, reader_key: str, reader: Any) -> None:
    """Write the checkpoint whole under a temporary name, then move it to ``path``."""
    import torch

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    reader_key: reader.state_dict(), "step": step}, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: Path, model: Any, optimizer: Any, reader_key: str, reader: Any) -> int:
    """Restore the model, the optimizer and the reader from ``path``; the step it was saved at.

    Raises:
        CheckpointError: the file is not such a checkpoint, or was saved by a run of other
            settings (another model size, seed, batch size or dataset).
    """
    import torch

    try:
        ckpt = torch.load(path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        reader.load_state_dict(ckpt[reader_key])
        return int(ckpt["step"])
    except (OSError, EOFError, pickle.UnpicklingError, RuntimeError, ValueError, KeyError,
            TypeError) as exc:
        why = f"no {exc} entry" if isinstance(exc, KeyError) else str(exc).strip()
        raise CheckpointError(f"{path}: cannot resume from this checkpoint: {why}") from exc
