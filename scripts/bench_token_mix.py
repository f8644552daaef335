"""Token blocks of a mixture: the cost of a batch of two sources against one.

    python -m scripts.bench_token_mix [--tokens 8_000_000] [--batches 2000] [--repeat 3]

Two token datasets of ``--tokens`` int32 tokens each (records of 2^20 tokens, as
LitData's ``optimize`` fills its chunks; in the page cache) are read as
``TokenBlocks(..., block_size=2048, batch_size=8)``:

* one dataset (the sampler's order: one gather per batch);
* ``Mix`` of that one source (the mixture's plan: elastic resume, by global positions);
* ``Mix`` of the two, by size (a batch draws from both: a gather per source);
* the bound: one ``np.copyto`` of a batch's bytes from the mapped shard.

Each case first serves one untimed epoch (its checksums and the first touch of each
page happen once per process), then ``--batches`` batches are timed; cases run in
rotated rounds and each figure is the median over rounds, in microseconds per batch.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from formats import DatasetWriter, Field, open_shards
from reader import Mix, TokenBlocks
from scripts import harness as h

BLOCK = 2048
BATCH = 8


def pack(root: Path, tokens: int, seed: int) -> Path:
    if (root / "manifest.json").exists():
        return root
    rng = np.random.default_rng(seed)
    field = Field("tokens", "ndarray", dtype="int32", shape=(None,))
    with DatasetWriter(root, [field], shard_size=64 << 20, durable=False) as w:
        for at in range(0, tokens, 1 << 20):
            w.write({"tokens": rng.integers(0, 50_000, min(1 << 20, tokens - at),
                                            dtype=np.int32)})
    return root


def serve(source, batches: int, shuffle: str) -> float:
    """Microseconds per batch over ``batches`` batches, after one untimed epoch."""
    with TokenBlocks(source, BLOCK, BATCH, seed=0, shuffle=shuffle) as tb:
        for _ in tb:
            pass
        n = 0
        t0 = time.perf_counter()
        while n < batches:
            for _ in tb:
                n += 1
                if n == batches:
                    break
        return (time.perf_counter() - t0) / batches * 1e6


def memcpy(root: Path, batches: int) -> float:
    """Microseconds per batch to copy a batch's bytes from the mapped shard."""
    ds = open_shards(root)
    view = ds.shard(0).data
    size = BATCH * (BLOCK + 1) * 4
    out = np.empty(size, np.uint8)
    places = np.random.default_rng(0).integers(0, view.size - size, batches).tolist()
    t0 = time.perf_counter()
    for at in places:
        np.copyto(out, view[at:at + size])
    dt = time.perf_counter() - t0
    ds.close()
    return dt / batches * 1e6


def main(argv: list[str] | None = None) -> None:
    p = h.parser(__doc__)
    p.add_argument("--tokens", type=int, default=8_000_000)
    p.add_argument("--batches", type=int, default=2000)
    h.add_data(p, Path(tempfile.gettempdir()) / "sb_token_mix")
    h.add_repeat(p)
    args = p.parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    a = pack(args.data / f"a-{args.tokens}", args.tokens, 0)
    b = pack(args.data / f"b-{args.tokens}", args.tokens, 1)
    h.warm(a, b)
    load = h.Load()
    cases = {
        "one dataset": lambda s: serve(a, args.batches, s),
        "Mix of one source": lambda s: serve(Mix({"a": a}), args.batches, s),
        "Mix of two sources, by size": lambda s: serve(Mix({"a": a, "b": b}), args.batches, s),
    }
    rows = [(name, shuffle) for shuffle in ("block", "full") for name in cases]
    got: dict = {r: [] for r in rows}
    bound: list = []

    def run(case, r):
        if case == "memcpy":
            bound.append(memcpy(a, args.batches))
        else:
            got[case].append(cases[case[0]](case[1]))

    h.rounds([*rows, "memcpy"], args.repeat, run)
    print(f"2 x {args.tokens / 1e6:.0f} M int32 tokens; block {BLOCK} (+1), batches of {BATCH}; "
          f"{args.batches} batches timed, median of {args.repeat} rounds")
    table = h.Table(h.Col("", 30), h.Col("shuffle", 8), h.Col("us/batch", 9, ">"),
                    h.Col("spread", 7, ">"), h.Col("/ one dataset", 14, ">"), sep=" ")
    print(table.head())
    for name, shuffle in rows:
        xs, base = got[(name, shuffle)], got[("one dataset", shuffle)]
        print(table.line(name, shuffle, f"{h.median(xs):.1f}", f"{h.spread(xs):.2f}",
                         f"{h.paired_ratio(xs, base):.2f}"))
    print(table.line("memcpy of a batch's bytes", "", f"{h.median(bound):.1f}",
                     f"{h.spread(bound):.2f}", ""))
    print(load.line())


if __name__ == "__main__":
    sys.exit(main())
