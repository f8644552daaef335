"""What the reader's safety checks cost (DESIGN.md: safe by default when it costs < 2 %).

In one run, page cache warm, the same packed JPEGs read by ``reader.Loader`` with each
check on (the default) and off, alternated (which goes first alternates too), best of
``--repeat`` and the median of the ratios of runs made side by side (robust to the
load of a shared machine, which moves either figure by several per cent from one
minute to the next); each run times the
Loader's second epoch (the first maps the shards and starts the workers):

* checksums: ``check_crc=True`` ÷ ``check_crc=False``, on the full pipeline (decode +
  RandomResizedCrop(224) + flip, workers = cores; target >= 0.98) and on the raw path
  (no decode: image bytes and labels, zero-copy, where a check costs the most relative
  to the work: unchecked, no payload byte is touched at all); and the checked raw path
  in payload bytes/s ÷ a numpy memcpy of the same bytes (one array, 8 MB chunks into
  a reused buffer; target >= 0.75: the check reads every byte once, as a copy does);
* leases (:mod:`reader.runtime.leases`): the batches handed out as leased views ÷ the same
  views handed out bare, their slot reused at the next ``next()`` (the sink the Loader
  had before leases, rebuilt here for the comparison; target >= 0.99), on the full
  pipeline and on a light one (64 px crops, batch 32: the per-batch cost is largest
  against the work);
* ``on_error="replace"`` (:mod:`reader.transforms.bad_input`) ÷ ``on_error="fail"`` on a
  clean dataset, where it replaces nothing (target >= 0.99), on the same two pipelines:
  what it adds to every batch is saving the batch's random stream, reading the
  ``valid`` mask and checking the main-process fields' checksums in the worker.

Usage: ``python -m scripts.bench_safety [--count 2000] [--repeat 5] [--only replace]``.
"""

from __future__ import annotations

import time
from pathlib import Path

from reader.runtime.sinks import CpuSink
from scripts import harness as h

__all__ = ["main"]


class BareSink(CpuSink):
    """The CPU sink without leases: bare views, the slot back at the next ``next()``."""

    def deliver(self, slot, batch, timing):
        self._back.append(slot)
        return batch, timing


def _epoch(ds_path: Path, *, check: bool = True, leases: bool = True, decode: bool = True,
           side: int = 224, batch_size: int = 128, workers: int = 1,
           bytes_per_s: bool = False, replace: bool = False) -> float:
    import reader

    transform = h.rrc_flip(side) if decode else None
    fields = None if decode else ("image", "label")
    with reader.Loader(ds_path, batch_size=batch_size, num_workers=workers if decode else 0,
                       shuffle=decode, seed=0, transform=transform, decode=decode,
                       check_crc=check, fields=fields,
                       on_error="replace" if replace else "fail") as lo:
        if not leases:
            lo.runtime.make_sink = BareSink
        for _ in lo:  # untimed: maps the shards into this process, starts the code paths
            pass
        t = time.perf_counter()
        n = nbytes = 0
        for batch in lo:
            n += len(batch["label"])
            if not decode:
                nbytes += sum(map(len, batch["image"]))
        dt = time.perf_counter() - t
        return nbytes / dt if bytes_per_s else n / dt


def _lease_cost_us(rounds: int = 20000) -> float:
    """Microseconds a lease adds to one batch: wrapping its slot arrays, and the slot's
    return when the batch is freed (what a CpuSink does beyond the bare views)."""
    import numpy as np

    from reader.runtime.leases import SlotLeases

    slot = {"image": np.zeros((128, 224, 224, 3), np.uint8)[:128],
            "label": np.zeros(128, np.int64)[:128], "valid": np.ones(128, bool)[:128]}
    leases = SlotLeases(limit=1 << 30)
    fields = tuple(slot)
    t = time.perf_counter()
    for i in range(rounds):
        batch = leases.lease(i % 8, dict(slot), fields)
        del batch
        leases.collect()
    return (time.perf_counter() - t) / rounds * 1e6


def _replace_cost_us(ds_path: Path, batch_size: int = 128, rounds: int = 2000) -> tuple[float, int]:
    """Microseconds ``on_error="replace"`` adds to a clean batch in the worker
    (:meth:`reader.runtime.worker.BatchBuilder._build_replacing`): the batch's random
    stream saved, the ``valid`` mask read, and the checksums of the fields the main
    process reads; and how many such fields the dataset has."""
    import numpy as np

    import reader

    with reader.Loader(ds_path, batch_size, num_workers=0, on_error="replace") as lo:
        main = lo.spec.main_fields
        ds = lo.dataset
        rng = np.random.default_rng(0)
        valid = np.ones(batch_size, bool)
        n = len(ds) // batch_size
        t = time.perf_counter()
        for i in range(rounds):
            idx = np.arange(i % n * batch_size, (i % n + 1) * batch_size)
            rng.bit_generator.state  # noqa: B018 (the read is the cost)
            np.flatnonzero(~valid[:batch_size])
            for name in main:
                ds.payloads(idx, name)
        return (time.perf_counter() - t) / rounds * 1e6, len(main)


def _memcpy(ds_path: Path) -> float:
    """numpy memcpy bytes/s of as many bytes as the dataset's images, 8 MB at a time."""
    import numpy as np

    import reader

    ds = reader.open_dataset(ds_path)
    _, _, lengths = ds.spans(np.arange(len(ds)), "image")
    ds.close()
    src = np.ones(int(lengths.sum()), np.uint8)
    dst = np.empty(8 << 20, np.uint8)
    t = time.perf_counter()
    for at in range(0, src.size, dst.size):
        chunk = src[at : at + dst.size]
        np.copyto(dst[: chunk.size], chunk)
    return src.size / (time.perf_counter() - t)


def main(argv=None) -> int:
    p = h.parser(__doc__)
    h.add_data(p)
    p.add_argument("--count", type=int, default=2000)
    h.add_repeat(p, 5)
    p.add_argument("--only", choices=("checksums", "leases", "replace"),
                   help="measure one check's rows alone")
    args = p.parse_args(argv)
    ds_path = h.packed_dataset(args.data, args.count)
    workers = h.CORES
    print(f"{args.count} JPEGs, best of {args.repeat}, alternated, page cache warm; "
          f"pipelines: {workers} workers")
    table = h.Table(h.Col("check", 9), h.Col("path", 50), h.Col("on", 9, ">"),
                    h.Col("off", 9, ">"), h.Col("on ÷ off", 9, ">"), h.Col("median", 7, ">"),
                    h.Col("target", 0, gap="  "), sep=" ")
    print(table.head())
    full = {"workers": workers}
    rows = (
        ("checksums", "full pipeline (decode + RRC 224 + flip) img/s, batch 128", "check",
         full, ">= 0.98"),
        ("checksums", "raw image bytes + labels, sequential, rec/s, batch 128", "check",
         {"decode": False}, "(no decode: the worst case)"),
        ("leases", "full pipeline (decode + RRC 224 + flip) img/s, batch 128", "leases",
         full, ">= 0.99"),
        ("leases", "light pipeline (decode + RRC 64 + flip) img/s, batch 32", "leases",
         {**full, "side": 64, "batch_size": 32}, ">= 0.99"),
        ("replace", "full pipeline (decode + RRC 224 + flip) img/s, batch 128", "replace",
         full, ">= 0.99"),
        ("replace", "light pipeline (decode + RRC 64 + flip) img/s, batch 32", "replace",
         {**full, "side": 64, "batch_size": 32}, ">= 0.99"),
    )
    best_full = best_replace = None
    for check, label, key, kw, target in rows:
        if args.only is not None and check != args.only:
            continue
        rates: dict[bool, list[float]] = {True: [], False: []}
        for i in range(args.repeat):
            for on in h.rotated((True, False), i):
                rates[on].append(_epoch(ds_path, **kw, **{key: on}))
        best = {on: max(r) for on, r in rates.items()}
        if key == "leases" and "side" not in kw:
            best_full = best[True]
        if key == "replace" and "side" not in kw:
            best_replace = best[False]
        paired = h.paired_ratio(rates[True], rates[False])
        print(table.line(check, label, f"{best[True]:,.0f}", f"{best[False]:,.0f}",
                         f"{best[True] / best[False]:.3f}", f"{paired:.3f}", target), flush=True)
    if best_full is not None:
        cost = _lease_cost_us()
        batch_ms = 128 / best_full * 1e3
        print(table.line("leases", "cost per batch (lease + free + collect, 3 fields), us",
                         f"{cost:.2f}", "", f"{1 - cost / (batch_ms * 1e3):.5f}")
              + f"  bound for a {batch_ms:.0f} ms batch", flush=True)
    if best_replace is not None:
        cost, fields = _replace_cost_us(ds_path)
        batch_ms = 128 / best_replace * 1e3
        print(table.line("replace", f"cost per clean batch (stream, mask, {fields} main-process "
                         "fields' checksums), us", f"{cost:.2f}", "",
                         f"{1 - cost / (batch_ms * 1e3):.5f}")
              + f"  bound for a {batch_ms:.0f} ms batch", flush=True)
    if args.only not in (None, "checksums"):
        return 0
    on = memcpy = 0.0
    for _ in range(args.repeat):
        on = max(on, _epoch(ds_path, decode=False, bytes_per_s=True))
        memcpy = max(memcpy, _memcpy(ds_path))
    print(table.line("checksums", "raw, checks on, MB/s ÷ numpy memcpy MB/s", f"{on / 1e6:,.0f}",
                     f"{memcpy / 1e6:,.0f}", f"{on / memcpy:.3f}") + "  >= 0.75 of memcpy",
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
