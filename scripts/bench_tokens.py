"""Token streams: blocks of 2,049 tokens against memcpy and LitData's TokensLoader.

    python -m scripts.bench_tokens [--tokens 75_000_000] [--data /tmp/sb_tokens]
                                   [--peers-python /tmp/peers-venv/bin/python]

One stream of int32 tokens (documents of 200 to 4,000 tokens, as a tokenizer
gives them; a few hundred MB, in the page cache) is packed two ways: one record
per chunk of 2^20 tokens (documents concatenated, as LitData's ``optimize``
fills its chunks for ``TokensLoader``), and one record per document. It is read,
in one run:

* ``TokenBlocks(block_size=2048, batch_size=16)``: shuffled blocks gathered into
  ``[16, 2049]`` batches (``shuffle="block"``, the default, and ``"full"``), and
  ``batch_size=None``: one block at a time, a zero-copy view when it lies in one
  record;
* memcpy of the same bytes: per batch, one ``np.copyto`` of as many bytes from the
  same mapped shard files into a batch buffer (the limit: what moving the tokens
  costs, without finding them);
* LitData's ``TokensLoader(block_size=2049)`` over the same documents written with
  ``litdata.optimize`` (in the peers' virtualenv, see BENCHMARKS.md), shuffled.

It also measures the padding of budgeted document batches
(``BudgetBatches(size="field:tokens")``) against fixed-size random batches.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from formats import DatasetWriter, Field, open_shards
from reader.batching.batching import BudgetBatches, field_sizes, padding_waste
from reader.batching.tokens import TokenBlocks
from reader.options import SamplerOptions
from scripts import harness as h

BLOCK = 2048
BATCH = 16
SHARD_BYTES = 64 << 20


def documents(total: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, offsets): documents of 200-4,000 int32 tokens, ``total`` tokens in all."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(200, 4001, total // 2100 + 1)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), total) + 1]
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    return tokens, offsets


def pack(root: Path, tokens: np.ndarray, offsets: np.ndarray) -> Path:
    """One record per document, or (``offsets`` of a few big steps) per chunk of documents."""
    if (root / "manifest.json").exists():
        return root
    field = Field("tokens", "ndarray", dtype="int32", shape=(None,))
    with DatasetWriter(root, [field], shard_size=SHARD_BYTES, durable=False) as w:
        for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
            w.write({"tokens": tokens[a:b]})
    return root


def chunked(offsets: np.ndarray, chunk: int) -> np.ndarray:
    """Record bounds that cut the same stream into ``chunk``-token records (the last
    shorter), as LitData's ``optimize`` fills its chunks: a block rarely crosses one."""
    total = int(offsets[-1])
    return np.append(np.arange(0, total, chunk, dtype=np.int64), total)


def ours(root: Path, batch_size: int | None, seconds: float, shuffle: str = "block") -> float:
    """Tokens per second delivered over whole epochs for about ``seconds``, after one
    untimed epoch (its checksums and the mapping's first touch of each page happen once
    per process; each later epoch's plan is timed)."""
    with TokenBlocks(root, BLOCK, batch_size, seed=0, shuffle=shuffle) as tb:
        for _ in tb:
            pass
        n = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for b in tb:
                n += b.size
        return n / (time.perf_counter() - t0)


def memcpy(root: Path, seconds: float) -> float:
    """The same bytes moved: per batch, one copy of BATCH blocks' worth of the mapped shards."""
    ds = open_shards(root)
    views = [ds.shard(s).data for s in range(len(ds.starts) - 1)]
    chunk = BATCH * (BLOCK + 1) * 4
    out = np.empty(chunk, np.uint8)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for v in views:
            for at in range(0, v.size - chunk, chunk):
                np.copyto(out, v[at:at + chunk])
                n += chunk // 4
    dt = time.perf_counter() - t0
    ds.close()
    return n / dt


_LITDATA = r"""
import json, os, sys, time
import numpy as np, torch
from litdata import optimize, StreamingDataset, TokensLoader


def doc(i):
    tokens = np.load(sys.argv[1], mmap_mode="r")
    offsets = np.load(sys.argv[2], mmap_mode="r")
    yield torch.from_numpy(np.array(tokens[offsets[i]:offsets[i + 1]]))


if __name__ == "__main__":
    out, seconds, block, workers = sys.argv[3], float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    if not os.path.exists(os.path.join(out, "index.json")):
        n = len(np.load(sys.argv[2], mmap_mode="r")) - 1
        optimize(fn=doc, inputs=list(range(n)), output_dir=out, chunk_bytes="64MB",
                 item_loader=TokensLoader(), num_workers=workers)
    ds = StreamingDataset(input_dir=out, item_loader=TokensLoader(block_size=block),
                          shuffle=True, seed=0)
    it = iter(ds)
    next(it)
    n, t0 = 0, time.perf_counter()
    for x in it:
        n += x.numel()
        if time.perf_counter() - t0 > seconds:
            break
    print(json.dumps({"tokens_per_s": n / (time.perf_counter() - t0)}))
"""


def litdata(peers: str | None, data: Path, tokens: np.ndarray, offsets: np.ndarray,
            seconds: float) -> float | str:
    if not peers:
        return "skipped: needs the peers virtualenv (--peers-python)"
    np.save(data / "tokens.npy", tokens)
    np.save(data / "offsets.npy", offsets)
    # A file, not -c: LitData's writer processes import the function from it.
    runner = data / "litdata_runner.py"
    runner.write_text(_LITDATA)
    out = data / f"litdata-{len(tokens)}"
    r = subprocess.run([peers, str(runner), str(data / "tokens.npy"), str(data / "offsets.npy"),
                        str(out), str(seconds), str(BLOCK + 1), str(os.cpu_count() or 1)],
                       capture_output=True, text=True, cwd=data)
    if r.returncode != 0:
        return f"skipped: litdata failed ({r.stderr.strip().splitlines()[-1:]})"
    return h.last_json(r.stdout)["tokens_per_s"]


def padding(root: Path, budget: int) -> tuple[float, float]:
    """Padding / all tokens: budgeted batches vs random batches of the same mean size."""
    ds = open_shards(root)
    opts = SamplerOptions(shuffle=True, seed=0)
    bound = BudgetBatches(budget, size="field:tokens").bind(ds, None, opts)
    sizes = field_sizes(ds, "tokens")
    offsets = bound.rank_offsets(0)
    order = bound.rank_indices(0)
    budgeted = [order[a:b] for a, b in itertools.pairwise(offsets)]
    mean = max(1, round(len(order) / max(len(budgeted), 1)))
    perm = np.random.default_rng(0).permutation(len(ds))
    fixed = [perm[i:i + mean] for i in range(0, len(perm), mean)]
    ds.close()
    return padding_waste(budgeted, sizes), padding_waste(fixed, sizes)


def main(argv: list[str] | None = None) -> None:
    p = h.parser(__doc__)
    p.add_argument("--tokens", type=int, default=75_000_000)
    h.add_data(p, Path(tempfile.gettempdir()) / "sb_tokens")
    p.add_argument("--seconds", type=float, default=5.0)
    h.add_peers_python(p)
    args = p.parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    tokens, offsets = documents(args.tokens)
    chunks = pack(args.data / f"chunks-{args.tokens}", tokens, chunked(offsets, 1 << 20))
    docs = pack(args.data / f"docs-{args.tokens}", tokens, offsets)
    h.warm(chunks)
    rows = {
        "memcpy of the same bytes": memcpy(chunks, args.seconds),
        "2^20-token records, batches of 16": ours(chunks, BATCH, args.seconds),
        "  one block at a time (views)": ours(chunks, None, args.seconds),
        "  batches of 16, shuffle='full'": ours(chunks, BATCH, args.seconds, "full"),
        "LitData TokensLoader": litdata(args.peers_python, args.data, tokens, offsets,
                                        args.seconds),
    }
    h.warm(docs)
    rows["document records, batches of 16"] = ours(docs, BATCH, args.seconds)
    limit = rows["memcpy of the same bytes"]
    peer = rows["LitData TokensLoader"]
    print(f"{len(tokens) / 1e6:.0f} M int32 tokens ({tokens.nbytes / 1e6:.0f} MB) in "
          f"{len(offsets) - 1:,} documents; block {BLOCK} (+1), batches of {BATCH}; "
          f"load {h.Load.now()[0]:.2f}")
    table = h.Table(h.Col("", 36), h.Col("M tokens/s", 11, ">"), h.Col("/ memcpy", 9, ">"),
                    h.Col("/ LitData", 10, ">"), sep=" ")
    print(table.head())
    for name, v in rows.items():
        if isinstance(v, str):
            print(table.note(name, v))
            continue
        vs = f"{v / peer:.2f}" if not isinstance(peer, str) else "-"
        print(table.line(name, f"{v / 1e6:.1f}", f"{v / limit:.2f}", vs))
    budgeted, fixed = padding(docs, budget=16 * 4096)
    print(f"padding / all tokens: budgeted batches {budgeted:.3f}, random batches of the same "
          f"mean size {fixed:.3f}")


if __name__ == "__main__":
    sys.exit(main())
