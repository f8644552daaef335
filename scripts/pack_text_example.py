"""Pack a text corpus for language-model training with ``packer.pack_samples``.

    python -m scripts.pack_text_example --out /tmp/text.shards [--docs 4000] [--workers 2]

The corpus is generated here (no download): documents of sentences made from a
fixed vocabulary by a small grammar, seeded by the document's index, so the same
arguments give the same bytes. Each document is tokenized byte-level (its UTF-8
bytes as token ids 0-255, then the end-of-document id 256) and packed as one
record. The schema the LM example reads (``scripts/train_lm_example.py``):

=========  ==================  =====================================================
field      type                value
=========  ==================  =====================================================
text       ``str``             the document
tokens     ``<i4 [None]``      its UTF-8 bytes, then :data:`EOD` (vocabulary size 257)
=========  ==================  =====================================================

The last line printed is the output folder.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

__all__ = ["EOD", "SCHEMA", "VOCAB_SIZE", "document", "main", "tokenize"]

#: The end-of-document token id (after the 256 byte values).
EOD = 256
VOCAB_SIZE = 257
SCHEMA = {"text": "str", "tokens": "int32[None]"}

_SUBJECTS = ("the loader", "a worker", "the sampler", "every shard", "the trainer",
             "our model", "a small batch", "the monitor", "each epoch", "the café")
_VERBS = ("reads", "maps", "shuffles", "decodes", "checks", "writes", "skips", "waits for",
          "counts", "resumes")
_OBJECTS = ("the next record", "zero-copy views", "token blocks", "a checksum", "the page cache",
            "its own slot", "every byte", "the last shard", "ragged arrays", "naïve copies")
_ENDS = (".", ".", ".", "!", "?")


def document(i: int) -> str:
    """Document ``i``: 2-12 sentences of subject, verb and object (some with an adverb)."""
    rng = np.random.default_rng(i)
    sentences = []
    for _ in range(int(rng.integers(2, 13))):
        s, v, o = (rng.choice(len(w)) for w in (_SUBJECTS, _VERBS, _OBJECTS))
        words = f"{_SUBJECTS[s]} {_VERBS[v]} {_OBJECTS[o]}"
        if rng.random() < 0.3:
            words += " quickly" if rng.random() < 0.5 else " again"
        sentences.append(words[0].upper() + words[1:] + _ENDS[int(rng.integers(len(_ENDS)))])
    return " ".join(sentences)


def tokenize(text: str) -> np.ndarray:
    """Byte-level: the UTF-8 bytes as ids 0-255, then :data:`EOD`."""
    data = np.frombuffer(text.encode("utf-8"), np.uint8)
    out = np.empty(len(data) + 1, np.int32)
    out[:-1] = data
    out[-1] = EOD
    return out


def sample(i: int) -> dict:
    """The record of document ``i`` (module level: worker processes receive it pickled)."""
    text = document(i)
    return {"text": text, "tokens": tokenize(text)}


def main(argv: list[str] | None = None) -> int:
    from packer import (
        DestinationError,
        PackOptions,
        UsageError,
        format_summary,
        pack_samples,
    )

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="/tmp/shardpack-text.shards", help="output folder")
    p.add_argument("--docs", type=int, default=4000, help="documents (default 4,000)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--overwrite", action="store_true", help="replace a dataset in --out")
    args = p.parse_args(argv)
    if args.docs <= 0:
        p.error("--docs must be positive")
    try:
        options = PackOptions(workers=args.workers, overwrite=args.overwrite,
                              shard_size="64MB", task_records=max(1, args.docs // 4 or 1))
        summary = pack_samples(sample, range(args.docs), args.out, options, schema=SCHEMA)
    except UsageError as exc:
        print(f"pack_text_example: error: {exc}", file=sys.stderr)
        return 2
    except DestinationError as exc:  # --out holds a dataset or other files: found there
        print(f"pack_text_example: error: {exc}", file=sys.stderr)
        return 1
    print(format_summary(summary), file=sys.stderr)
    print(os.path.abspath(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
