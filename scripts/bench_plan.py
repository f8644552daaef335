"""Issue 37's targets for a mixture's plan: scale, proportions, shard locality, speed, peers.

    python -m scripts.bench_plan [--quick] [--data DIR] [--repeat R] [--workers W]
                                 [--peers-python PY] [--only scale,proportions,...]

* **scale**: 10 sources of 10^8 records (synthetic shard starts, 10^5 shards of 1,000
  records each, as ``scripts/bench_scale.py`` builds them; no data is read), a
  ``MixOrder`` built directly. Construct + first batch in a fresh process; the cost
  of one batch of 256 (rank 0 of 8 and of 64, mean over 2,000 batches at random
  positions, and over the first 2,000 in order), split into the arrangement's
  (``Arrangement.__call__``) and the sources' orders'; beside them the single
  dataset's ``Sampler`` at 10^8 and an O(batch) floor (a keyed bijection and a
  ``searchsorted`` over the batch's positions: the least a pure function of the
  position does in numpy). Plan memory: tracemalloc peak beyond the sources' own
  shard starts, at the first batch and over the 2,000 random batches; the state
  dict's JSON size. Then the arrangement alone for other spellings of the weights.
* **proportions**: 10^5 stream positions at weights 0.5/0.3/0.15/0.05 (5 seeds):
  each source's share as standard errors (z) from its weight, over every prefix and
  every window of 10^4; the longest run of one source; each rank's share at world
  size 8 and the spread of a source's count per batch of 256; beside i.i.d. draws.
* **locality**: distinct shards a rank reads per 10^4 of its samples and over an
  epoch (10^7 records in 10^4 shards, ``shuffle="block"``), world sizes 8 and 64:
  the single-dataset order (contiguous runs per rank), a one-source mixture (ranks
  interleaved over one stream) and, simulated, canonical partitions (C = 64 runs
  of the block order, rank r reading runs r, r + W, ... in turn).
* **speed**: the classification pipeline of ``scripts/bench.py`` (decode + RRC 224 +
  flip, batch 256, workers = cores, ``shuffle="block"``) through
  ``Loader(Mix({"only": path}))`` and ``Loader(path)``, each run a fresh process,
  alternated rounds; the ratio is the median of the per-round ratios.
* **peers**: the same 3-source mixture (small JPEGs, weights 0.5/0.3/0.2) read raw
  (every payload copied out, 1 process) by ours, MosaicML Streaming
  (``StreamingDataset(streams=[Stream(proportion=...)])``) and LitData
  (``CombinedStreamingDataset``), converted by ``scripts/bench_peers.py``'s writers;
  then what each does with a re-plan (weights changed at a checkpoint), a source's
  pass across epochs and a resume at another batch size. The peers run in
  ``--peers-python`` (a virtualenv of their own: BENCHMARKS.md, "Setting up the
  peers"); a peer that does not import there is skipped with the error.

This module's top imports are the standard library's and the harness's alone: its
peer runners run in the peers' virtualenv, where shardpack is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the peers' virtualenv does not install shardpack
    sys.path.insert(0, str(ROOT))

from scripts import harness as h  # noqa: E402  (after the path, in the peers' virtualenv)

BATCH = 256
SOURCES = 10
RECORDS = 10**8
SECTIONS = ("scale", "proportions", "locality", "speed", "peers")
PEER_WEIGHTS = (0.5, 0.3, 0.2)
REPLAN_WEIGHTS = (0.2, 0.3, 0.5)
PEERS = ("ours", "mds", "litdata")
PEER_LABELS = {"ours": "shardpack Loader(Mix)", "mds": "MosaicML Streaming (MDS)",
               "litdata": "LitData CombinedStreamingDataset"}


# -- scale --------------------------------------------------------------------------------

def scale_order(mode: str, world: int, sizes=None, weights=None, batch: int = BATCH):
    """A ``MixOrder`` of ``SOURCES`` sources of ``RECORDS`` records (one synthetic set of
    shard starts stands for every source's, as one 10^8 dataset would), rank 0."""
    import numpy as np

    from reader.batching.mixture import MixOrder
    from reader.options import SamplerOptions
    from scripts.bench_scale import RECORDS_PER_SHARD, boundaries

    sizes = sizes or [RECORDS] * SOURCES
    starts = boundaries(sizes[0], sizes[0] // RECORDS_PER_SHARD)
    names = tuple(f"s{i}" for i in range(len(sizes)))
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    opts = SamplerOptions(shuffle=mode, seed=0, rank=0, world_size=world)
    return lambda: MixOrder(names, sizes, [starts] * len(sizes), offsets, weights, None, batch,
                            opts)


def probe_first(mode: str, world: int, batches: int) -> dict:
    """In a fresh process: construct + first batch (untraced), then the same again under
    tracemalloc (the sources' shard starts are made before it starts: not counted), then
    ``batches`` batches at random positions, and the state dict's JSON size."""
    import numpy as np

    make = scale_order(mode, world)
    t = time.perf_counter()
    order = make()
    order.batch(0, 0)
    first = time.perf_counter() - t
    del order
    tracemalloc.start()
    order = make()
    order.batch(0, 0)
    first_peak = tracemalloc.get_traced_memory()[1]
    for k in np.random.default_rng(1).integers(0, order.num_batches_in(0), batches).tolist():
        order.batch(0, k)
    steady_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    state = json.dumps(order.state(0, 1000), separators=(",", ":"))
    return {"first": first, "first_peak": first_peak, "steady_peak": steady_peak,
            "state_bytes": len(state)}


def _mean_us(fn, items) -> float:
    t = time.perf_counter()
    for x in items:
        fn(x)
    return (time.perf_counter() - t) / len(items) * 1e6


def batch_costs(mode: str, world: int, batches: int = 2000) -> dict:
    """Mean µs per batch of 256: the whole batch, the arrangement, the sources' orders (at
    random positions, each part on the same positions), the whole batch in order, the
    single dataset's Sampler at 10^8, and the O(batch) floor."""
    import numpy as np

    from reader.batching.sampler import Sampler
    from scripts.bench_scale import RECORDS_PER_SHARD, boundaries

    order = scale_order(mode, world)()
    order.batch(0, 0)
    ks = np.random.default_rng(0).integers(0, order.num_batches_in(0), batches).tolist()
    total = _mean_us(lambda k: order.batch(0, k), ks)
    # Each part on a fresh order, so that it pays what it paid inside ``total`` (its
    # caches cold: the blocks' layouts, the windows' permutations).
    positions = [order.positions(0, k) for k in ks]
    placed = [order.plan.arrangement(p) for p in positions]
    arrangement = scale_order(mode, world)().plan.arrangement
    arrange = _mean_us(arrangement, positions)
    # The sources' orders: (source, number since the run began) -> record, the half of
    # MixOrder.sources_of that is not the arrangement.
    cold = scale_order(mode, world)()
    sources = _mean_us(lambda sn: cold._records(*sn), placed)
    fresh = scale_order(mode, world)()
    in_order = _mean_us(lambda k: fresh.batch(0, k), list(range(batches)))
    sampler = Sampler(RECORDS, boundaries(RECORDS, RECORDS // RECORDS_PER_SHARD), BATCH,
                      order.options)
    sampler.batch(0, 0)
    single = _mean_us(lambda k: sampler.batch(0, k),
                      np.random.default_rng(0).integers(0, len(sampler), batches).tolist())
    return {"total": total, "arrangement": arrange, "sources": sources, "in_order": in_order,
            "single": single, "floor": floor_us(positions, arrangement)}


def floor_us(positions, arrangement) -> float:
    """The least a pure function of the position costs per batch in numpy: a keyed
    bijection of each position within its block (two affine steps around a xorshift)
    and a ``searchsorted`` into the sources' cumulative counts: O(batch), whatever the
    world size, against the arrangement's O(block) layout of every block it touches."""
    import numpy as np

    cum = np.cumsum(arrangement.counts)
    mask = arrangement.block - 1

    def source_of(g):
        x = (g * 0x9E3779B1 + 12345) & mask
        x ^= x >> 6
        x = (x * 0x85EBCA6B + 777) & mask
        return np.searchsorted(cum, x, side="right")

    return _mean_us(source_of, positions)


def scale(args) -> None:
    modes = [(m, w) for m in ("full", "block") for w in (8, 64)]
    print(f"\n## Scale: {SOURCES} sources x 10^8 records (10^5 shards of 1,000 each), batches "
          f"of {BATCH}, rank 0\n", flush=True)
    rows = []
    for mode, world in modes:
        first = h.last_json(subprocess.run(
            [sys.executable, "-m", "scripts.bench_plan", "probe-first", mode, str(world),
             str(args.batches)],
            capture_output=True, text=True, check=True, cwd=ROOT).stdout)
        c = batch_costs(mode, world, args.batches)
        rows.append((mode, str(world), f"{first['first'] * 1e3:.0f} ms",
                     f"{c['total']:.0f}", f"{c['arrangement']:.0f}", f"{c['sources']:.0f}",
                     f"{c['in_order']:.0f}", f"{c['single']:.0f}", f"{c['floor']:.0f}",
                     f"{c['arrangement'] / 50:.1f}x",
                     f"{first['first_peak'] / 1e6:.1f} / {first['steady_peak'] / 1e6:.0f} MB",
                     f"{first['state_bytes']:,} B"))
        print(f"  {mode} W={world} done", file=sys.stderr, flush=True)
    h.Table(h.Col("mode"), h.Col("W", align=">"), h.Col("first batch", align=">"),
            h.Col("batch µs", align=">"), h.Col("arrangement", align=">"),
            h.Col("sources", align=">"), h.Col("in order", align=">"),
            h.Col("1 dataset", align=">"), h.Col("floor", align=">"),
            h.Col("arr. ÷ 50 µs", align=">"), h.Col("plan memory first / 2000", align=">"),
            h.Col("state", align=">")).print(rows, rule=True)
    print("\nfirst batch: construct + first batch in a fresh process (imports and the sources' "
          "shard starts not counted), target < 0.5 s. batch µs: one batch's records, mean of "
          f"{args.batches:,} at random positions = arrangement (Arrangement.__call__) + sources "
          "(each source's pass order, MixOrder._records) + a gather; in order: the first "
          f"{args.batches:,} batches in sequence; 1 dataset: bench_scale's Sampler over one "
          "10^8 dataset (random positions); floor: a keyed bijection + searchsorted on the "
          "batch's 256 positions (O(batch)); arr. ÷ 50 µs: the arrangement against the target "
          "of 50 µs. plan memory: tracemalloc peak beyond the sources' shard starts, at the "
          f"first batch / over {args.batches:,} random batches (target < 16 MB). state: "
          "state_dict() as JSON (target < 4 KB)")
    weight_spellings(args.batches // 10)


def weight_spellings(batches: int) -> None:
    """The arrangement alone per batch for other spellings of the weights: its cycle (and
    so its blocks) follows from them."""
    import numpy as np

    from reader.batching.arrangement import Arrangement, integer_weights

    cases = (("by size (None): 10 x 10^8 records", [RECORDS] * SOURCES),
             ("floats: 10 x 0.1", integer_weights([0.1] * SOURCES)),
             ("floats: 0.5/0.3/0.15/0.05", integer_weights([0.5, 0.3, 0.15, 0.05])),
             ("integers: 10 x 1", [1] * SOURCES),
             ("integers: 3:1", [3, 1]))
    print(f"\nThe arrangement alone, µs per batch of {BATCH} (rank 0), by how the weights are "
          f"spelled: random positions / the first {batches:,} batches in order\n")
    rows = []
    for label, weights in cases:
        cells = []
        for world in (8, 64):
            step = world * BATCH
            lanes = np.arange(BATCH, dtype=np.int64) * world
            ks = np.random.default_rng(0).integers(0, 10**6, batches).tolist()
            rnd = _mean_us(Arrangement(weights, 0), [k * step + lanes for k in ks])
            seq = _mean_us(Arrangement(weights, 0), [k * step + lanes
                                                      for k in range(batches)])
            cells.append(f"{rnd:,.0f} / {seq:,.0f}")
        arr = Arrangement(weights, 0)
        rows.append((label, f"{arr.cycle:,}", f"{arr.cycle % arr.block or arr.block:,}", *cells))
    h.Table(h.Col("weights"), h.Col("cycle", align=">"), h.Col("last block", align=">"),
            h.Col("W=8", align=">"), h.Col("W=64", align=">")).print(rows, rule=True)


# -- proportions -------------------------------------------------------------------------

def proportions(args) -> None:
    import numpy as np

    from reader.batching.mixture import MixOrder
    from reader.options import SamplerOptions

    weights = np.array([0.5, 0.3, 0.15, 0.05])
    n, part, world, seeds = 10**5, 10**4, 8, 5
    steps = args.batches // 2  # steps of all ranks for the per-batch figures
    names = ("w50", "w30", "w15", "w05")
    size = 10**7
    offsets = np.arange(len(names) + 1, dtype=np.int64) * size
    g = np.arange(max(n, steps * world * BATCH), dtype=np.int64)
    draws = {"ours": [], "i.i.d.": []}
    for seed in range(seeds):
        opts = SamplerOptions(shuffle="full", seed=seed, rank=0, world_size=1)
        order = MixOrder(names, [size] * len(names), [[0, size]] * len(names), offsets,
                         dict(zip(names, weights.tolist(), strict=True)), None, BATCH, opts)
        draws["ours"].append(order.sources_of(g)[0])
        draws["i.i.d."].append(np.random.default_rng(seed).choice(len(names), g.size, p=weights))
    print(f"\n## Proportions: {n:,} stream positions, weights "
          f"{'/'.join(f'{w:g}' for w in weights)}, {seeds} seeds (max over seeds)\n")
    rows = []
    for kind, runs in draws.items():
        for s, w in enumerate(weights):
            stats = [composition(src == s, w, n, part, world, steps) for src in runs]
            rows.append((kind, names[s], f"{w:g}",
                         f"{max(abs(x['z_all']) for x in stats):.2f}",
                         f"{max(x['z_prefix'] for x in stats):.2f}",
                         f"{max(x['z_window'] for x in stats):.2f}",
                         f"{max(x['run'] for x in stats):,}",
                         f"{max(x['z_rank'] for x in stats):.2f}",
                         f"{np.mean([x['batch_sd'] for x in stats]):.2f} "
                         f"({np.sqrt(BATCH * w * (1 - w)):.2f})",
                         f"{min(x['batch_min'] for x in stats)}-"
                         f"{max(x['batch_max'] for x in stats)}",
                         f"{sum(x['batch_out'] for x in stats)}"))
    h.Table(h.Col("draw"), h.Col("source"), h.Col("weight", align=">"),
            h.Col("|z| all", align=">"), h.Col("|z| prefixes", align=">"),
            h.Col("|z| windows", align=">"), h.Col("longest run", align=">"),
            h.Col(f"|z| per rank (W={world})", align=">"),
            h.Col("count sd / batch (binomial)", align=">"),
            h.Col("count min-max", align=">"), h.Col("batches |z| > 4", align=">")
            ).print(rows, rule=True)
    print(f"\nz: (share - weight) / sqrt(weight (1 - weight) / n), target |z| <= 4: over all "
          f"{n:,}, every prefix of k x {part:,} (k = 1..10), every window of {part:,}; longest "
          f"run: of one source among the {n:,}; per rank: each rank's {n // world:,} samples "
          f"(positions r, r + {world}, ...). Per batch (the source's count in each batch of "
          f"{BATCH} of each rank, {steps:,} steps of {world} ranks a seed: "
          f"{seeds * steps * world:,} batches, where a binomial count would put about "
          f"{seeds * steps * world * 6.3e-5:.1f} beyond 4 sd). i.i.d.: numpy's choice with "
          "the same weights (a per-sample weighted draw)")


def composition(hit, w: float, n: int, part: int, world: int, steps: int) -> dict:
    """One source's figures over one draw: ``hit`` marks the stream positions it feeds
    (the first ``n`` for the shares, ``steps`` steps of ``world`` ranks for the batches)."""
    import numpy as np

    def z(x, m):
        return (x / m - w) / np.sqrt(w * (1 - w) / m)

    # Batch k of rank r holds positions k * W * b + i * W + r (i < b): axis 1 below.
    per_batch = hit[: steps * world * BATCH].reshape(-1, BATCH, world).sum(axis=1).ravel()
    hit = hit[:n]
    counts = np.cumsum(hit)
    ends = np.arange(part, n + 1, part)
    windows = hit[: n // part * part].reshape(-1, part).sum(axis=1)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], hit.astype(np.int8), [0]])))
    runs = edges[1::2] - edges[::2]
    per_rank = [z(hit[r::world].sum(), hit[r::world].size) for r in range(world)]
    return {"z_all": z(hit.sum(), n), "z_prefix": float(np.abs(z(counts[ends - 1], ends)).max()),
            "z_window": float(np.abs(z(windows, part)).max()),
            "run": int(runs.max()) if runs.size else 0,
            "z_rank": float(np.abs(per_rank).max()), "batch_sd": float(per_batch.std()),
            "batch_min": int(per_batch.min()), "batch_max": int(per_batch.max()),
            "batch_out": int((np.abs(z(per_batch, BATCH)) > 4).sum())}


# -- locality ------------------------------------------------------------------------------

def locality(args) -> None:
    import numpy as np

    from reader.batching.mixture import MixOrder
    from reader.batching.sampler import EpochOrder, Sampler
    from reader.options import SamplerOptions
    from scripts.bench_scale import RECORDS_PER_SHARD, boundaries

    n = args.locality_records
    starts = boundaries(n, n // RECORDS_PER_SHARD)
    shards = len(starts) - 1
    part, canonical = 10**4, 64
    print(f"\n## Block-order shard locality: {n:,} records in {shards:,} shards of "
          f"{RECORDS_PER_SHARD:,}, shuffle=\"block\" (windows of 4,096), rank 0\n")
    rows = []
    for world in (8, 64):
        opts = SamplerOptions(shuffle="block", seed=0, rank=0, world_size=world)
        single = Sampler(n, starts, BATCH, opts).rank_indices(0)
        mix = MixOrder(("only",), [n], [starts], np.array([0, n]), None, None, BATCH, opts)
        mixed = np.concatenate([mix.batch(0, k) for k in range(mix.num_batches_in(0))])
        # Canonical partitions: C contiguous runs of the source's block order (the pass
        # order the mixture uses); rank r reads runs r, r + W, ... one sample of each in
        # turn (C / W runs a rank: W must divide C).
        per = canonical // world
        j = np.arange(n // world, dtype=np.int64)
        run = opts.rank + world * (j % per)
        pos = run * (n // canonical) + j // per
        parts = EpochOrder(n, starts, opts, 0, stream=int(mix.streams[0])).records(pos)
        figures = {name: shard_figures(np.searchsorted(starts, rec, side="right") - 1, part)
                   for name, rec in (("single", single), ("mix", mixed), ("canon", parts))}
        base = figures["single"]
        for name, label in (("single", "1 dataset: contiguous run per rank (today)"),
                            ("mix", "mixture: ranks interleaved over one stream"),
                            ("canon", f"canonical partitions, C = {canonical} (simulated)")):
            f = figures[name]
            rows.append((str(world), label, f"{f['per_part']:.1f}",
                         f"{f['per_part'] / base['per_part']:.1f}x",
                         f"{f['epoch']:,} of {shards:,}", f"{f['epoch'] / base['epoch']:.1f}x",
                         f"{f['samples']:,}"))
    h.Table(h.Col("W", align=">"), h.Col("order"), h.Col(f"shards / {part:,} samples", align=">"),
            h.Col("ratio", align=">"), h.Col("shards / epoch", align=">"),
            h.Col("ratio", align=">"), h.Col("samples", align=">")).print(rows, rule=True)
    print(f"\nshards / {part:,} samples: distinct shards among each run of {part:,} consecutive "
          "samples of rank 0, mean; shards / epoch: distinct shards rank 0 reads in one epoch; "
          "ratio: against the single dataset's order at the same world size")


def shard_figures(shard, part: int) -> dict:
    import numpy as np

    full = shard[: shard.size // part * part].reshape(-1, part)
    per = np.mean([np.unique(row).size for row in full]) if full.size else float("nan")
    return {"per_part": float(per), "epoch": int(np.unique(shard).size), "samples": int(shard.size)}


# -- speed ----------------------------------------------------------------------------------

def speed_run(kind: str, root: Path, workers: int) -> dict:
    """One fresh process: the classification pipeline over ``root`` (``kind``: "loader"
    or "mix"), timed from the Loader's construction to its last batch; its CPU seconds
    (this process and its workers, user + system: they are waited for at close)."""
    import reader
    from scripts.bench_peers import BATCH as PIPE_BATCH
    from scripts.bench_peers import SIZE

    cpu = sum(os.times()[:4])
    t = time.perf_counter()
    source = reader.Mix({"only": str(root)}) if kind == "mix" else root
    with reader.Loader(source, PIPE_BATCH, num_workers=workers, shuffle="block", seed=0,
                       transform=h.rrc_flip(SIZE)) as lo:
        n = sum(len(b["label"]) for b in lo)
    return {"seconds": time.perf_counter() - t, "records": n, "cpu": sum(os.times()[:4]) - cpu}


def speed(args) -> None:
    root = h.packed_dataset(args.data, args.images)
    h.warm(root)
    kinds = {"loader": "Loader(path)", "mix": 'Loader(Mix({"only": path}))'}
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    per_cpu: dict[str, list[float]] = {k: [] for k in kinds}

    def run(kind, r):
        res = h.last_json(subprocess.run(
            [sys.executable, "-m", "scripts.bench_plan", "speed-run", kind, str(root),
             str(args.workers)], capture_output=True, text=True, check=True, cwd=ROOT).stdout)
        if r >= 0:
            rates[kind].append(res["records"] / res["seconds"])
            per_cpu[kind].append(res["records"] / res["cpu"])

    for kind in kinds:  # once each, not counted: one-time costs (a cache folder) paid
        run(kind, -1)
    h.rounds(list(kinds), args.repeat, run)
    print(f"\n## Speed: classification pipeline (decode + RRC 224 + flip, batch 256, "
          f"{args.workers} workers, shuffle=\"block\"), {args.images:,} JPEGs, median of "
          f"{args.repeat} alternated rounds, each run a fresh process\n")
    rows = []
    for kind, label in kinds.items():
        for figures, unit in ((rates, "img/s"), (per_cpu, "img/CPU-s")):
            x = figures[kind]
            rows.append((label, f"{h.median(x):,.0f} {unit}", f"{h.spread(x):.0%}",
                         " ".join(f"{v:,.0f}" for v in x),
                         f"{h.paired_ratio(x, figures['loader']):.3f}",
                         ">= 0.97" if kind == "mix" and unit == "img/s" else ""))
    h.Table(h.Col("reader"), h.Col("median", align=">"), h.Col("spread", align=">"),
            h.Col("rounds", align=">"), h.Col("ratio", align=">"), h.Col("target")
            ).print(rows, rule=True)
    print("\nimg/s: wall time from the Loader's construction to its last batch; img/CPU-s: "
          "the same images per CPU-second of the process and its workers (less sensitive to "
          "other processes on the machine); ratio: the median of the per-round ratios against "
          "Loader(path)")


# -- peers ----------------------------------------------------------------------------------

def peer_sources(args) -> dict[str, Path]:
    """Three image folders of small JPEGs (64-128 px, distinct seeds: every payload is
    its own, so a payload's CRC names its record and source)."""
    sizes = (6000, 4000, 2000) if not args.quick else (3000, 2000, 1000)
    return {name: h.image_folder(args.data, n, name=f"plan-src-{name}-{{n}}", min_side=64,
                                 max_side=128, seed=seed)
            for (name, n, seed) in zip("abc", sizes, (11, 12, 13), strict=True)}


def _ids(payloads) -> list[int]:
    return [zlib.crc32(p) for p in payloads]


def _ours(dirs: list[str], weights, batch_size: int = BATCH, samples_per_epoch=None):
    import reader

    mix = reader.Mix(dict(zip("abc", dirs, strict=True)),
                     weights=dict(zip("abc", weights, strict=True)),
                     samples_per_epoch=samples_per_epoch)
    return reader.Loader(mix, batch_size, decode=False, shuffle=True, seed=0, num_workers=0)


def read_ours(dirs: list[str], weights, count: int, state=None, batch_size: int = BATCH,
              samples_per_epoch=None, epochs: int = 1):
    """Payload CRCs of ``count`` samples (per epoch, whole batches) of our mixture, and
    the Loader (for its state)."""
    lo = _ours(dirs, weights, batch_size, samples_per_epoch)
    if state is not None:
        lo.load_state_dict(state)
    out = []
    for epoch in range(epochs):
        if state is None:
            lo.set_epoch(epoch)
        got = 0
        for b in lo:
            out += _ids(b["image"])
            got += len(b["image"])
            if got >= count:
                break
    return out, lo


def _mds(dirs: list[str], weights, epoch_size=None):
    from streaming import Stream, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()  # a killed run's blocks would make this one refuse to start
    streams = [Stream(local=d, proportion=w) for d, w in zip(dirs, weights, strict=True)]
    return StreamingDataset(streams=streams, shuffle=True, shuffle_seed=0, batch_size=BATCH,
                            epoch_size=epoch_size)


def read_mds(dirs: list[str], weights, count: int, state=None, epoch_size=None,
             epochs: int = 1):
    ds = _mds(dirs, weights, epoch_size)
    if state is not None:
        ds.load_state_dict(state)
    return [x for _ in range(epochs) for x in _take(ds, count)], ds


def _litdata(dirs: list[str], weights):
    from litdata import CombinedStreamingDataset, StreamingDataset

    return CombinedStreamingDataset([StreamingDataset(d, shuffle=True, seed=0) for d in dirs],
                                    seed=0, weights=list(weights), iterate_over_all=False)


def read_litdata(dirs: list[str], weights, count: int, epochs: int = 1):
    ds = _litdata(dirs, weights)
    out = []
    for epoch in range(epochs):
        ds.set_epoch(epoch + 1)
        out += _take(ds, count)
    return out, ds


def _take(dataset, count: int) -> list[int]:
    """Payload CRCs of a peer's first ``count`` samples (fewer where its epoch ends)."""
    from itertools import islice

    return _ids(s["image"] for s in islice(dataset, count))


def _litdata_loader(dirs, weights, batch_size: int):
    from litdata import StreamingDataLoader

    return StreamingDataLoader(_litdata(dirs, weights), batch_size=batch_size, num_workers=0,
                               collate_fn=list)


def _payloads(system: str, dirs: list[str]):
    """The mixture's payloads, one by one, as ``system`` serves them."""
    if system == "ours":
        with _ours(dirs, PEER_WEIGHTS) as lo:
            for b in lo:
                yield from b["image"]
        return
    yield from (s["image"] for s in (_mds(dirs, PEER_WEIGHTS) if system == "mds"
                                     else _litdata(dirs, PEER_WEIGHTS)))


def peer_read(system: str, dirs: list[str], count: int) -> dict:
    """Raw read of ``count`` samples of the 3-source mixture, every payload copied out:
    the seconds to open and serve the first, then the rest's seconds, records and bytes."""
    sink = h.Sink()
    t = time.perf_counter()
    first = None
    for x in _payloads(system, dirs):
        sink(x)
        if first is None:
            first, first_bytes = time.perf_counter(), sink.bytes
        if sink.records >= count:
            break
    return {"first": first - t, "seconds": time.perf_counter() - first,
            "records": sink.records - 1, "bytes": sink.bytes - first_bytes}


def peer_probe(system: str, dirs: list[str], count: int, per_epoch: int) -> dict:
    """What ``system`` serves around a checkpoint whose weights change (re-plan: the two
    segments' payload CRCs), over 4 epochs of ``per_epoch`` samples (passes), and whether
    a state resumes at another batch size (elastic, one process)."""
    out: dict = {}
    if system == "ours":
        before, lo = read_ours(dirs, PEER_WEIGHTS, count)
        after, _ = read_ours(dirs, REPLAN_WEIGHTS, count, state=lo.state_dict())
        out["replan"] = [before, after]
        out["passes"] = read_ours(dirs, PEER_WEIGHTS, per_epoch, samples_per_epoch=per_epoch,
                                  epochs=4)[0]
        state = lo.state_dict()
        out["elastic"] = _try(lambda: read_ours(dirs, PEER_WEIGHTS, 8, state=state,
                                                batch_size=BATCH // 2))
    elif system == "mds":
        before, ds = read_mds(dirs, PEER_WEIGHTS, count)
        state = ds.state_dict(len(before), True)
        out["replan"] = [before, read_mds(dirs, REPLAN_WEIGHTS, count, state=state)[0]]
        out["passes"] = read_mds(dirs, PEER_WEIGHTS, per_epoch, epoch_size=per_epoch,
                                 epochs=4)[0]
        out["elastic"] = ("not run (ranks share memory per node); documented: at another "
                          "node count, num_canonical_nodes fixed")
    else:
        lo = _litdata_loader(dirs, PEER_WEIGHTS, BATCH)
        before = []
        for b in lo:
            before += _ids(s["image"] for s in b)
            if len(before) >= count:
                break
        state = lo.state_dict()
        again = _litdata_loader(dirs, REPLAN_WEIGHTS, BATCH)
        again.load_state_dict(state)
        after = []
        for b in again:
            after += _ids(s["image"] for s in b)
            if len(after) >= count:
                break
        out["replan"] = [before, after]
        out["passes"] = read_litdata(dirs, PEER_WEIGHTS, per_epoch, epochs=4)[0]

        def other_batch_size():
            lo2 = _litdata_loader(dirs, PEER_WEIGHTS, BATCH // 2)
            lo2.load_state_dict(state)
            next(iter(lo2))

        out["elastic"] = _try(other_batch_size)
    return out


def _try(fn) -> str:
    try:
        fn()
    except Exception as exc:  # a peer's refusal is the figure: its type and text
        return f"refused: {type(exc).__name__}: {exc}"
    return "resumed"


def peers(args) -> None:
    from scripts.bench import Runner

    srcs = peer_sources(args)
    write = Runner(args.peers_python, cold=False)
    fmt_dirs = {"ours": "shards", "mds": "mds", "litdata": "litdata"}
    dirs: dict[str, list[str]] = {}
    why: dict[str, str] = {}
    for system, fmt in fmt_dirs.items():
        if write.python(fmt) is None:  # no peers' virtualenv: the Runner says so
            why[system] = write(fmt)["skipped"]
            continue
        out = []
        for src in srcs.values():
            dst = args.data / f"plan-{fmt}-{src.name}"
            if not (dst / ".complete").exists():
                res = write(fmt, "write", fmt, str(src), str(dst), "--workers", "1")
                if "skipped" in res:
                    why[system] = res["skipped"]
                    break
                (dst / ".complete").touch()
            out.append(str(dst))
        dirs[system] = out
    python = {"ours": sys.executable, "mds": args.peers_python, "litdata": args.peers_python}
    live = [s for s in PEERS if s not in why]
    rates: dict[str, list[float]] = {s: [] for s in live}
    count = 6000 if not args.quick else 3000

    def call(system, *argv) -> dict:
        proc = subprocess.run([python[system], str(Path(__file__)), *argv, system,
                               *dirs[system]], capture_output=True, text=True, cwd=ROOT)
        res = h.last_json(proc.stdout)
        if proc.returncode or res is None:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return {"skipped": f"failed (exit {proc.returncode}): {tail[:200]}"}
        return res

    def run(system, _r):
        if system in why:
            return
        res = call(system, "peer-read", "--count", str(count))
        if "skipped" in res:
            why[system] = res["skipped"]
        else:
            rates[system].append(res["records"] / res["seconds"])
            rates.setdefault(system + " MB/s", []).append(res["bytes"] / res["seconds"] / 1e6)
            rates.setdefault(system + " first", []).append(res["first"])

    h.rounds(live, args.repeat, run)
    sizes = {name: len(list(src.rglob("*.jpg"))) for name, src in srcs.items()}
    print(f"\n## Peers: one mixture of 3 sources ({', '.join(f'{k} {v:,}' for k, v in sizes.items())}"
          f" JPEGs of ~6.6 KB, 64-128 px), weights {'/'.join(map(str, PEER_WEIGHTS))}, raw "
          f"bytes copied out, 1 process, {count:,} samples, median of {args.repeat} rounds\n")
    rows = []
    for system in PEERS:
        if system in why:
            rows.append(f"{PEER_LABELS[system]:34}  skipped: {why[system]}")
            continue
        r = rates[system]
        rows.append((PEER_LABELS[system], f"{h.median(rates[system + ' first']):.3f} s",
                     f"{h.median(r):,.0f} samples/s", f"{h.spread(r):.0%}",
                     f"{h.median(rates[system + ' MB/s']):,.0f} MB/s",
                     f"{h.paired_ratio(rates['ours'], r):.2f}" if "ours" in rates else ""))
    h.Table(h.Col("reader"), h.Col("open + first sample", align=">"),
            h.Col("then", align=">"), h.Col("spread", align=">"), h.Col("bytes", align=">"),
            h.Col("ours ÷ it", align=">")).print(rows, rule=True)
    support(srcs, {s: call(s, "peer-probe", "--count", str(count // 3), "--per-epoch",
                           str(sizes["a"] // 2)) for s in PEERS if s not in why},
            count // 3, sizes["a"] // 2)


def support(srcs: dict[str, Path], probes: dict[str, dict], count: int, per_epoch: int) -> None:
    """What the probes show: re-plan repeats, source a's repeats within its pass, and a
    resume at another batch size."""
    source_of = {zlib.crc32(f.read_bytes()): name for name, src in srcs.items()
                 for f in src.rglob("*.jpg")}
    print(f"\nRe-plan: {count:,} samples at weights {'/'.join(map(str, PEER_WEIGHTS))}, a "
          f"checkpoint, {count:,} more at {'/'.join(map(str, REPLAN_WEIGHTS))}: records served "
          f"again after the checkpoint. Passes: 4 epochs of {per_epoch:,} samples, source a "
          f"({len(list(srcs['a'].rglob('*.jpg'))):,} records, weight 0.5): records of a served "
          "twice before its pass ends. Elastic: the state loaded at batch size 128 (taken at "
          "256), one process. Ledger: a hash of what was served, kept in the state.\n")
    rows = []
    for system, res in probes.items():
        if "skipped" in res:
            rows.append(f"{PEER_LABELS[system]:34}  skipped: {res['skipped']}")
            continue
        before, after = res["replan"]
        again = len(set(after) & set(before))
        a = [x for x in res["passes"] if source_of.get(x) == "a"]
        rows.append((PEER_LABELS[system], f"{again:,} of {len(after):,} served again",
                     f"{len(a) - len(set(a)):,} repeats in {len(a):,}",
                     res["elastic"][:100], "yes" if system == "ours" else "no"))
    h.Table(h.Col("reader"), h.Col("re-plan"), h.Col("source a's pass"), h.Col("elastic"),
            h.Col("ledger")).print(rows, rule=True)


# -- the command line ----------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("probe-first", "speed-run", "peer-read", "peer-probe"):
        return subcommand(argv)
    p = h.parser(__doc__)
    h.add_data(p, h.DATA / "plan", help="where the datasets are built (kept)")
    h.add_repeat(p, 5, help="alternated rounds of the speed and peer sections (default 5)")
    h.add_workers(p, len(os.sched_getaffinity(0)), help="the speed section's workers")
    h.add_peers_python(p, help="python of the virtualenv with mosaicml-streaming and litdata")
    p.add_argument("--quick", action="store_true",
                   help="smaller data and fewer batches: 500 batches, 10^6 records for "
                        "locality, 1,280 JPEGs, 3 rounds")
    p.add_argument("--only", default=",".join(SECTIONS),
                   help=f"sections to run, comma-separated ({', '.join(SECTIONS)})")
    args = p.parse_args(argv)
    args.peers_python = args.peers_python or None  # an empty $SHARDPACK_PEERS_PYTHON: none
    unknown = set(args.only.split(",")) - set(SECTIONS)
    if unknown:
        p.error(f"--only: no section {', '.join(sorted(unknown))}; one of {', '.join(SECTIONS)}")
    args.batches = 500 if args.quick else 2000
    args.locality_records = 10**6 if args.quick else 10**7
    args.images = 1280 if args.quick else 2560  # multiples of 256: every batch full on both sides
    if args.quick and args.repeat == 5:
        args.repeat = 3
    args.data.mkdir(parents=True, exist_ok=True)
    load = h.Load()
    t = time.perf_counter()
    print(f"bench_plan {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load average {h.Load.text(load.before)}, {h.CORES} cores", flush=True)
    for name in SECTIONS:
        if name in args.only.split(","):
            globals()[name](args)
            print(f"  {name} done ({time.perf_counter() - t:.0f} s)", file=sys.stderr, flush=True)
    print(f"\n{load.line()}; total {time.perf_counter() - t:.0f} s")
    return 0


def subcommand(argv: list[str]) -> int:
    """The subprocess entry points: each prints one JSON line (:func:`scripts.harness.emit`)."""
    cmd, rest = argv[0], argv[1:]
    if cmd == "probe-first":
        h.emit(**probe_first(rest[0], int(rest[1]), int(rest[2])))
    elif cmd == "speed-run":
        h.emit(**speed_run(rest[0], Path(rest[1]), int(rest[2])))
    else:
        p = h.parser(cmd)
        p.add_argument("--count", type=int, required=True)
        p.add_argument("--per-epoch", type=int, default=0)
        p.add_argument("system", choices=PEERS)
        p.add_argument("dirs", nargs=3)
        a = p.parse_args(rest)
        try:
            if cmd == "peer-read":
                h.emit(**peer_read(a.system, a.dirs, a.count))
            else:
                h.emit(**peer_probe(a.system, a.dirs, a.count, a.per_epoch))
        except ImportError as exc:
            h.emit(skipped=f"{type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
