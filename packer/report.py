"""What a pack did: counters, the progress callback protocol, and the summary text."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PackProgress", "PackSummary", "TqdmProgress", "format_summary"]


class PackProgress:
    """Progress callback: subclass and override; the default does nothing.

    The packer calls :meth:`start` once with the number of inputs (None when a
    source cannot tell), :meth:`advance` as inputs are done (written or
    skipped), and :meth:`close` at the end, also on error.
    """

    def start(self, total: int | None, done: int = 0) -> None:
        """The pack begins; ``done`` inputs were already packed by an earlier run."""

    def advance(self, records: int, nbytes: int) -> None:
        """``records`` more inputs are done, ``nbytes`` source bytes with them."""

    def close(self) -> None:
        """The pack ended (successfully or not)."""


class TqdmProgress(PackProgress):
    """A tqdm bar on stderr (``pack-dataset``'s, and ``pack_samples(progress=True)``'s);
    silent when stderr is not a terminal (``disable=None``). tqdm is imported only here.

    Args:
        quiet: no bar at all.
        unit: what a step counts (``file``, ``input``).
    """

    def __init__(self, quiet: bool = False, unit: str = "file") -> None:
        self.quiet, self.unit = quiet, unit
        self.bar = None

    def start(self, total, done=0):
        if self.quiet:
            return
        import sys

        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=done, unit=self.unit, disable=None, file=sys.stderr,
                        dynamic_ncols=True, smoothing=0.1)
        self._bytes = 0

    def advance(self, records, nbytes):
        if self.bar is not None:
            self._bytes += nbytes
            elapsed = self.bar.format_dict.get("elapsed") or 0
            if elapsed:
                self.bar.set_postfix_str(f"{self._bytes / elapsed / 1e6:.0f} MB/s", refresh=False)
            self.bar.update(records)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


@dataclass
class PackSummary:
    """Counters of one pack (the resumed part included).

    ``records_in == records_written + records_skipped`` always holds.
    """

    src: str
    dst: str
    source: str
    sink: str
    records_in: int = 0
    records_written: int = 0
    skipped: Counter = field(default_factory=Counter)
    shards: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    resumed_records: int = 0
    empty_classes: tuple[str, ...] = ()
    image_type: str | None = None
    boxes_clipped: int = 0  # --from coco: boxes cut to their image (packer.sources.coco)
    #: Detection fields whose schema was inferred with a variable first dimension by
    #: their name (``pack_samples``: :func:`packer.schema.per_box_fields`).
    per_box_fields: tuple[str, ...] = ()
    complete: bool = False
    #: After Ctrl-C (set by :func:`packer.destination.claimed`): where the finished
    #: shards wait for ``--resume`` when that is not DST (a replace writes beside
    #: it, "claiming DST" step 3), and whether anything was kept at all (a foreign
    #: sink's output appears whole or not at all: an interrupted one is deleted).
    kept_in: str | None = None
    resumable: bool = True

    @property
    def records_skipped(self) -> int:
        return sum(self.skipped.values())

    def to_json(self) -> dict[str, Any]:
        s = max(self.seconds, 1e-9)
        return {
            "src": self.src,
            "dst": self.dst,
            "source": self.source,
            "sink": self.sink,
            "complete": self.complete,
            "records_in": self.records_in,
            "records_written": self.records_written,
            "records_skipped": self.records_skipped,
            "skipped_by_kind": dict(sorted(self.skipped.items())),
            "resumed_records": self.resumed_records,
            "shards": self.shards,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "seconds": round(self.seconds, 3),
            "records_per_second": round(self.records_in / s, 1),
            "mb_per_second": round(self.bytes_in / s / 1e6, 1),
            "empty_classes": list(self.empty_classes),
            "image_type": self.image_type,
            "boxes_clipped": self.boxes_clipped,
            "per_box_fields": list(self.per_box_fields),
        }


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError  # unreachable


def interrupted_text(s: PackSummary, resume: str) -> str:
    """What ``pack-dataset`` says after Ctrl-C: where the finished shards are, and the
    command that finishes the pack (``resume``), or that nothing was kept."""
    if not s.resumable:
        return (f"interrupted; nothing kept: a --to {s.sink} output is written whole or not "
                f"at all, and {s.dst} is as it was; run the command again to start over")
    where = s.dst if s.kept_in is None else (
        f"{s.kept_in} (the new dataset, staged beside DST until it is complete; {s.dst} "
        "still holds the old one)")
    return f"interrupted; {s.shards} finished shard(s) kept in {where}\nresume with: {resume}"


#: The summary's words for the stored type of the image field (formats.fields.stored_image_type).
_IMAGE_KINDS = {"jpeg": "all JPEG", "png": "all PNG", "image": "mixed kinds, sniffed per record"}


def format_summary(s: PackSummary) -> str:
    """The end-of-pack table for people."""
    sec = max(s.seconds, 1e-9)
    rows = [
        ("source", f"{s.src} ({s.source})"),
        ("destination", f"{s.dst} ({s.sink})"),
        ("records in", f"{s.records_in}"),
        ("records written", f"{s.records_written}" + (
            f" ({s.resumed_records} kept from an earlier run)" if s.resumed_records else "")),
        ("skipped", f"{s.records_skipped}" + (
            " (" + ", ".join(f"{k}: {v}" for k, v in sorted(s.skipped.items())) + ")"
            if s.skipped else "")),
        ("shards" if s.sink == "shards" else "files out", f"{s.shards}"),
        ("bytes in", _bytes(s.bytes_in)),
        ("bytes out", _bytes(s.bytes_out)),
        ("wall time", f"{s.seconds:.2f} s"),
        ("throughput", f"{s.records_in / sec:,.0f} files/s, {s.bytes_in / sec / 1e6:,.1f} MB/s"),
    ]
    if s.image_type:
        # Said as what the images are: "image field  jpeg" read as a field named jpeg.
        rows.insert(2, ("images", f"{_IMAGE_KINDS.get(s.image_type, s.image_type)} "
                                  f"(field type {s.image_type})"))
    if s.empty_classes:
        rows.append(("empty classes", ", ".join(s.empty_classes)))
    if s.boxes_clipped:
        rows.append(("boxes clipped", f"{s.boxes_clipped} (cut to their image's edges)"))
    if s.per_box_fields:
        rows.append(("per-box fields", ", ".join(s.per_box_fields) + " (inferred with a "
                     "variable first dimension: one row per box)"))
    if s.records_skipped:
        rows.append(("skip list", f"{s.dst}/skipped.jsonl"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
