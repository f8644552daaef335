"""Packing options as one frozen value, and the size parser the CLI uses."""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from typing import Any

from formats.media import MAX_PIXELS

from .errors import UsageError

__all__ = ["DEFAULT_TASK_RECORDS", "ENGINES", "ON_ERROR", "SOURCE_OPTIONS", "PackOptions",
           "parse_size"]

ON_ERROR = ("fail", "skip")
ENGINES = ("local", "ray")
# Records per Ray task: big enough that a task (seconds of work) dwarfs its
# scheduling cost, small enough that a retry redoes little and the bar moves.
DEFAULT_TASK_RECORDS = 10_000
# PackOptions fields about a source's files, which pack_samples (a function's samples) has not.
SOURCE_OPTIONS = ("source", "sink", "max_side", "quality", "to_jpeg", "shuffle", "seed",
                  "tfrecord_index", "image_root", "annotations", "drop_empty", "field_types")

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes from ``"64MB"``, ``"1GiB"``, ``"1.5 GB"`` or a plain number.

    MB/GB are powers of 1000, MiB/GiB powers of 1024 (as ``ls --si`` / ``ls -h``).

    Raises:
        UsageError: the text is not a positive size.
    """
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(text)
        unit = m and m.group(2).lower()
        if not m or unit not in _UNITS:
            raise UsageError(f"not a size: {text!r} (e.g. 256MB, 1GiB, 65536)")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise UsageError(f"size must be positive: {text!r}")
    return value


@dataclass(frozen=True)
class PackOptions:
    """How to pack: the options of :func:`packer.pack` and :func:`packer.pack_samples`.

    Every field has a default; the CLI maps one flag to each. Those of
    :data:`SOURCE_OPTIONS` read, convert or order a source's files: they are
    ``pack``'s alone, and ``pack_samples`` refuses them.

    Args:
        source: ``imagefolder``, ``files``, ``filelist``, a ``formats.codecs.registry``
            codec name, or ``None`` to detect it from SRC.
        sink: ``shards`` (our format) or a ``formats.codecs.registry`` codec name.
        shard_size: seal a shard once its data file holds this many bytes (an int,
            or a size such as ``"64MB"``: :func:`parse_size`).
        records_per_shard: or once it holds this many records.
        workers: processes reading and parsing files; ``0`` reads in the calling
            process; ``None`` means all cores. With the ``ray`` engine: ranges
            packed at once (``None``: one per CPU of the cluster).
        max_side: shrink images whose longer side exceeds this to exactly it (JPEGs
            re-encoded; other formats stored as PNG unless ``to_jpeg``).
        quality: JPEG quality for re-encoded images.
        to_jpeg: convert non-JPEG images (PNG, WebP, GIF, BMP, TIFF) to JPEG (OpenCV).
        on_error: ``fail`` stops at the first bad input; ``skip`` lists it in
            ``skipped.jsonl`` and goes on.
        resume: keep the shards an interrupted run of the same pack sealed.
        overwrite: replace a dataset already in DST.
        shuffle: write records in a seeded random order.
        seed: the shuffle seed.
        durable: fsync shards before they get their final names.
        engine: ``local`` (this machine) or ``ray`` (tasks on a Ray cluster; each
            packs a contiguous range of records into its own shards).
        ray_address: the Ray cluster to join (``ray`` engine; default: start one here).
        task_records: records per range, each packed by one task into its own
            shards: ``pack`` cuts ranges with the ``ray`` engine only (default
            :data:`DEFAULT_TASK_RECORDS`); ``pack_samples`` with either engine (inputs
            per range; default :func:`packer.samples.default_range_records`).
        tfrecord_index: with ``sink="tfrecord"``, write a DALI ``.idx`` file beside
            each TFRecord file (False: none; refused for other sinks).
        image_root: with ``source="parquet"``, the folder that image paths in the
            Parquet files may lead into, besides the Parquet file's own folder.
        annotations: the COCO detection JSON of ``source="coco"`` (which it implies
            when ``source`` is None); SRC is then the images folder.
        drop_empty: with ``source="coco"``, images without annotations are left out
            (listed and counted as skipped, kind ``no-annotations``).
        field_types: with ``source="filelist"``, ``(column, type)`` pairs that replace
            the inferred type of a column (:data:`packer.sources.columns.TYPES`).
        max_pixels: the pixel budget: an image whose header declares more pixels
            (width x height) is bad input, kind ``too-large`` (default
            :data:`formats.media.MAX_PIXELS`, 2^28). A dataset packed with a larger
            budget is read with ``reader.Loader(max_pixels=N)``: the Loader's own
            budget is the default one unless told.
        keep_unsupported: a JPEG the Loader's decoder cannot read (12- or 16-bit,
            4:4:1 or other sampling it does not know, hierarchical, lossless with a
            colour transform: kind ``unsupported-jpeg``) is kept byte for byte
            instead of being bad input; the Loader refuses such a record (a typed
            error naming it, or skipped with ``on_error="skip"``): read it with
            ``ds[i]`` and a decoder of your own.
        verify_decode: decode every image once, as the Loader will, so an image damaged
            inside its compressed data but whole at both ends is bad input now (kind
            ``corrupt``), not a failed batch later. Off by default: the checks read
            signature, header and end marker only (5 us per image), and a decode
            makes a pack about 5x slower on one core (1.2 ms against 0.2 ms per 95 kB
            JPEG; the pack runs it in its workers).
    """

    source: str | None = None
    sink: str = "shards"
    shard_size: int | None = 256 * 1000**2
    records_per_shard: int | None = None
    workers: int | None = None
    max_side: int | None = None
    quality: int = 90
    to_jpeg: bool = False
    on_error: str = "fail"
    resume: bool = False
    overwrite: bool = False
    shuffle: bool = False
    seed: int = 0
    durable: bool = True
    engine: str = "local"
    ray_address: str | None = None
    task_records: int | None = None
    tfrecord_index: bool = True
    image_root: str | None = None
    annotations: str | None = None
    drop_empty: bool = False
    field_types: tuple[tuple[str, str], ...] = ()
    max_pixels: int = MAX_PIXELS
    keep_unsupported: bool = False
    verify_decode: bool = False

    def __post_init__(self) -> None:
        self._check_source_options()
        if self.on_error not in ON_ERROR:
            raise UsageError(f"on_error must be one of {ON_ERROR}, not {self.on_error!r}")
        if self.shard_size is None and self.records_per_shard is None:
            raise UsageError("give shard_size or records_per_shard")
        if self.engine not in ENGINES:
            raise UsageError(f"engine must be one of {ENGINES}, not {self.engine!r}")
        if self.engine != "ray" and self.ray_address is not None:
            raise UsageError("ray_address (--ray-address) needs engine='ray' (--engine ray)")
        if isinstance(self.shard_size, str):
            try:
                object.__setattr__(self, "shard_size", parse_size(self.shard_size))
            except UsageError as exc:
                raise UsageError(f"shard_size: {exc}") from None
        for name in ("shard_size", "records_per_shard", "max_side", "task_records",
                     "max_pixels"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise UsageError(f"{name} must be a positive integer, not {v!r}")
        if self.workers is not None and (not isinstance(self.workers, int) or
                                         isinstance(self.workers, bool) or self.workers < 0):
            raise UsageError(f"workers must be an integer >= 0, not {self.workers!r}")
        for name in ("keep_unsupported", "verify_decode"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"{name} must be True or False, not {getattr(self, name)!r}")
        if not 1 <= self.quality <= 100:
            raise UsageError(f"quality must be in 1..100, not {self.quality}")
        if self.image_root is not None and self.source != "parquet":
            raise UsageError("image_root (--image-root) is for --from parquet only "
                             "(source='parquet': image columns holding paths)")
        if not self.tfrecord_index and self.sink != "tfrecord":
            raise UsageError("tfrecord_index=False (--no-tfrecord-index) is for --to tfrecord only "
                             "(sink='tfrecord')")
        if self.resume and self.overwrite:
            raise UsageError("resume (--resume) and overwrite (--overwrite) contradict each other")

    def _check_source_options(self) -> None:
        if self.annotations is not None:
            if self.source is None:
                object.__setattr__(self, "source", "coco")  # the one source that reads it
            elif self.source != "coco":
                raise UsageError(f"--annotations is for --from coco, not --from {self.source}")
            object.__setattr__(self, "annotations", str(self.annotations))
        elif self.source == "coco":
            raise UsageError("--from coco needs --annotations FILE (the COCO detection JSON)")
        if self.drop_empty and self.source != "coco":
            raise UsageError("drop_empty (--drop-empty) drops images without annotations: it "
                             "is for source='coco' (--from coco)")
        if not self.field_types:
            return
        from .sources.columns import TYPES

        given = self.field_types
        pairs = tuple(given.items() if isinstance(given, dict) else (tuple(p) for p in given))
        object.__setattr__(self, "field_types", pairs)
        if self.source not in (None, "filelist"):
            raise UsageError(f"--field types the columns of a file list, not of --from "
                             f"{self.source}")
        names = [n for n, _ in pairs]
        if len(set(names)) != len(names):
            raise UsageError(f"--field gives a column twice: {sorted({n for n in names if names.count(n) > 1})}")
        for name, type_ in pairs:
            if type_ not in TYPES:
                raise UsageError(f"--field {name}={type_}: unknown type; choose from "
                                 f"{', '.join(TYPES)}")
        if "path" in names:
            raise UsageError("--field cannot type 'path': it names the file to read")
        if ("label", "str") in pairs:
            raise UsageError("--field label=str: a text 'label' column always becomes class "
                             "indices (their names are the manifest's classes); give the "
                             "column another name to keep it as text")

    @property
    def num_workers(self) -> int:
        return (os.cpu_count() or 1) if self.workers is None else self.workers

    @property
    def range_records(self) -> int:
        """Records per Ray task, the default filled in."""
        return self.task_records or DEFAULT_TASK_RECORDS

    def recorded(self) -> dict[str, Any]:
        """The options that shape the output, for the manifest's ``created_by``.

        Leaves out what never changes the bytes (workers, resume, overwrite,
        durability, the Ray address), so runs that differ only in those write
        identical manifests. The Ray engine starts new shards at every task's
        range, so ``engine`` and ``task_records`` are recorded for it; a local
        pack records neither (its manifest is as before engines existed).
        """
        out = asdict(self)
        for k in ("workers", "resume", "overwrite", "durable", "ray_address", "tfrecord_index",
                  "image_root"):
            del out[k]
        # Source options appear only when given: manifests of other packs stay as they were.
        for k in ("annotations", "drop_empty", "field_types", "keep_unsupported",
                  "verify_decode"):
            if not out[k]:
                del out[k]
        if out["max_pixels"] == MAX_PIXELS:
            del out["max_pixels"]
        if self.engine == "local":
            del out["engine"], out["task_records"]
        else:
            out["task_records"] = self.range_records
        return out
