"""Writes a whole dataset: rolls shards, keeps a resume journal, writes the manifest last.

Crash safety (FORMAT.md, "Writing"): each shard's files get their final names only
when complete, a sealed shard is then appended to ``_journal.jsonl``, and
``manifest.json`` is written atomically after the last shard. A folder without a
manifest is never a dataset; a journal lets ``resume=True`` keep every sealed shard.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from ..checksum import crc32c
from ..errors import ManifestError, SchemaError
from ..fields import IMAGE_TYPES, Field, ImageKinds, encode_value
from ..files import atomic_write_bytes, fsync_dir
from ..sniff import image_kind, image_size
from .columns import EncodedColumn, column_of, encode_column
from .layout import DEFAULT_ALIGNMENT, MAX_ALIGNMENT, MIN_ALIGNMENT
from .manifest import (
    MANIFEST_NAME,
    Manifest,
    ShardEntry,
    Written,
    build_manifest,
    write_manifest,
)
from .ownership import (
    JOURNAL_NAME,
    SKIPPED_NAME,
    SKIPPED_PARTIAL_NAME,
    WorkNames,
    remove_ours,
    survey,
)
from .shard_writer import ShardWriter, entry_matches_files

__all__ = ["JOURNAL_NAME", "DatasetWriter", "shard_name"]

# write_run lays out and appends at most this many records (and, but for a single
# record, bytes) at a time: the shard writer joins each window into one buffer.
_RUN_WINDOW = 4096
_RUN_BYTES = 4 << 20


def shard_name(number: int) -> str:
    return f"shard-{number:05d}"


class DatasetWriter:
    """Append records; shards roll at a byte size or a record count.

    Use as a context manager: a clean exit seals the last shard and writes the
    manifest; an exception leaves the sealed shards and the journal for resume.

    Args:
        root: the dataset folder (created if missing).
        fields: the schema, in order.
        shard_size: a shard is sealed once its data file reaches this many bytes.
        records_per_shard: or once it holds this many records.
        alignment: payload alignment, a power of two in [8, 4096].
        classes: class names, index = label.
        class_info: per class, an object describing it (the manifest's ``class_info``);
            needs ``classes`` of the same length.
        created_by: how the dataset was made (tool, source, options), for the manifest.
        dictionaries: trained zstd dictionaries by field name (zstd fields only).
        overwrite: replace an existing dataset in ``root`` (its files are deleted
            first: not atomic; ``packer.pack`` builds the new one beside the old
            one instead). Only files :mod:`formats.shard.ownership` proves ours are
            ever deleted; anything else in ``root`` stays.
        resume: keep the shards a previous, interrupted writer sealed with the same
            schema and options; :attr:`resumed` holds their ``progress`` values.
        durable: fsync every file before it is renamed.
        working: the names the program writing here works under (the packer's:
            :class:`formats.shard.ownership.WorkNames`), cleared with our other
            leftovers; its first-pass folders are kept on a resume.

    Raises:
        ManifestError: ``root`` already holds a dataset and ``overwrite`` is false,
            or a ``manifest.json`` that is not a valid one (never replaced).
        SchemaError: a bad schema.
    """

    def __init__(
        self,
        root: str | Path,
        fields: list[Field] | tuple[Field, ...],
        *,
        shard_size: int | None = 256 << 20,
        records_per_shard: int | None = None,
        alignment: int = DEFAULT_ALIGNMENT,
        classes: list[str] | None = None,
        class_info: list[dict[str, Any]] | None = None,
        created_by: dict[str, Any] | None = None,
        dictionaries: Mapping[str, bytes] | None = None,
        overwrite: bool = False,
        resume: bool = False,
        durable: bool = True,
        working: WorkNames | None = None,
    ) -> None:
        self.root = Path(root)
        self.fields = tuple(fields)
        if not self.fields:
            raise SchemaError("a dataset needs at least one field")
        if len({f.name for f in self.fields}) != len(self.fields):
            raise SchemaError("two fields share a name")
        if alignment < MIN_ALIGNMENT or alignment > MAX_ALIGNMENT or alignment & (alignment - 1):
            raise SchemaError("alignment must be a power of two in [8, 4096]", found=alignment)
        if shard_size is None and records_per_shard is None:
            raise SchemaError("give shard_size or records_per_shard")
        self.shard_size = shard_size
        self.records_per_shard = records_per_shard
        self.alignment = alignment
        self.classes = None if classes is None else tuple(classes)
        self.class_info = None if class_info is None else tuple(class_info)
        if self.class_info is not None and len(self.class_info) != len(self.classes or ()):
            raise SchemaError("class_info needs one entry per class",
                              found=len(self.class_info), expected=len(self.classes or ()))
        self.created_by = dict(created_by or {})
        self.durable = durable
        self._names = [f.name for f in self.fields]
        self._name_set = frozenset(self._names)
        # The metadata table's width and height come from this field's header when the
        # caller gives none: size-aware batching and slot sizing read them, not the images.
        self._sized = next((f.name for f in self.fields if f.type in IMAGE_TYPES), None)
        self._max_raw = {f.name: 0 for f in self.fields if f.compression != "none"}
        # Image fields are typed by what they hold (see close()): the formats seen.
        self._kinds = ImageKinds(self.fields)

        self.root.mkdir(parents=True, exist_ok=True)
        if (self.root / MANIFEST_NAME).exists() and not overwrite:
            raise ManifestError(
                "already a dataset (manifest.json exists); pass overwrite to replace it",
                path=self.root,
            )
        self._working = working
        found = survey(self.root, working)
        if found.bad_manifest is not None:
            raise ManifestError(
                f"holds a manifest.json that is not a valid shardpack manifest "
                f"({found.bad_manifest}); not replacing what may not be ours: remove it yourself",
                path=self.root / MANIFEST_NAME)
        self._journal_header = {
            "fields": [f.to_json() for f in self.fields],
            "alignment": alignment,
            "shard_size": shard_size,
            "records_per_shard": records_per_shard,
        }
        self.sealed: list[ShardEntry] = []
        self.resumed: list[Any] = []
        if resume:
            self._load_journal()
        self._clear(found, keep={e.name for e in self.sealed})
        self._dictionaries = self._write_dictionaries(dictionaries or {})
        self._compressors = self._make_compressors(dictionaries or {})
        if not self.sealed:
            self._append_journal(self._journal_header)
        self._shard: ShardWriter | None = None
        self.records_written = sum(e.records for e in self.sealed)

    # -- setup ------------------------------------------------------------------------

    def _load_journal(self) -> None:
        path = self.root / JOURNAL_NAME
        try:
            lines = path.read_text("utf-8").splitlines()
        except (FileNotFoundError, UnicodeDecodeError):
            return
        try:
            header = json.loads(lines[0]) if lines else None
        except json.JSONDecodeError:
            header = None
        if header != self._journal_header:
            ours = self._journal_header
            if isinstance(header, dict):
                keys = sorted(k for k in set(header) | set(ours) if header.get(k) != ours.get(k))
                found = {k: header.get(k) for k in keys}
                expected = {k: ours.get(k) for k in keys}
            else:
                keys, found, expected = [], "no readable header", None
            raise ManifestError(
                "cannot resume: the interrupted run used another "
                + (" and ".join(keys) if keys else "schema or shard options"),
                path=path, found=found, expected=expected,
            )
        kept: list[dict] = []
        for line in lines[1:]:
            try:
                item = json.loads(line)
                entry = ShardEntry(**{k: (int(v, 16) if k.endswith("crc32c") else v)
                                      for k, v in item["shard"].items()})
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                break  # a torn last line: everything before it stands
            if entry.name != shard_name(len(self.sealed)) or not entry_matches_files(self.root, entry):
                break
            self.sealed.append(entry)
            self.resumed.append(item.get("progress"))
            kept.append(item)
        if kept:  # what the sealed shards hold, as of the last of them
            self._restore(kept[-1].get("written"))
        # Rewrite the journal to exactly the shards kept, dropping any torn tail.
        text = "".join(json.dumps(x, sort_keys=True) + "\n" for x in [self._journal_header, *kept])
        atomic_write_bytes(path, text.encode("utf-8"), durable=self.durable)

    def _written(self) -> dict:
        """What the sealed shards hold that the manifest reports (for the journal)."""
        return {"max_raw": dict(self._max_raw),
                "formats": self._kinds.state()}

    def _restore(self, written: Any) -> None:
        if not isinstance(written, dict):
            return
        for k, v in (written.get("max_raw") or {}).items():
            if k in self._max_raw and isinstance(v, int):
                self._max_raw[k] = v
        self._kinds.restore(written.get("formats"))

    def _clear(self, found, keep: set[str]) -> None:
        """Delete what earlier writers of ours left, except the sealed shards kept
        (and, when resuming, the journal and the skip list that go with them)."""
        kept = {n for e in self.sealed for n in (e.data_file, e.index_file, e.meta_file)}
        if keep:
            kept |= {JOURNAL_NAME, SKIPPED_PARTIAL_NAME, SKIPPED_NAME}
            kept |= set(self._working.scratch if self._working is not None else ())
        remove_ours(self.root, found.leftovers, keep=kept, work=self._working)

    def _write_dictionaries(self, dictionaries: Mapping[str, bytes]) -> dict[str, tuple[str, int]]:
        out = {}
        for i, f in enumerate(self.fields):
            if f.name not in dictionaries:
                continue
            if f.compression != "zstd":
                raise SchemaError(f"field {f.name!r}: a dictionary needs zstd compression")
            data = bytes(dictionaries[f.name])
            name = f"dict-{i:03d}.zstd"
            atomic_write_bytes(self.root / name, data, durable=self.durable)
            out[f.name] = (name, crc32c(data))
        unknown = set(dictionaries) - {f.name for f in self.fields}
        if unknown:
            raise SchemaError("dictionaries for unknown fields", found=sorted(unknown))
        return out

    def _make_compressors(self, dictionaries: Mapping[str, bytes]) -> list:
        out = []
        for f in self.fields:
            if f.compression == "zstd":
                d = dictionaries.get(f.name)
                out.append(zstandard.ZstdCompressor(
                    level=f.level, write_content_size=True, write_checksum=False,
                    dict_data=None if d is None else zstandard.ZstdCompressionDict(bytes(d)),
                ))
            else:
                out.append(None)
        return out

    def _append_journal(self, obj: Any) -> None:
        with open(self.root / JOURNAL_NAME, "a", encoding="utf-8") as f:
            f.write(json.dumps(obj, sort_keys=True) + "\n")
            if self.durable:
                f.flush()
                os.fsync(f.fileno())

    # -- writing ----------------------------------------------------------------------

    def write(self, record: Mapping[str, Any], meta: Mapping[str, Any] | None = None,
              progress: Any = None) -> None:
        """Append one record (field name -> value).

        Args:
            record: a value for every field of the schema, nothing else.
            meta: metadata table values: ``width``, ``height`` (and ``label``,
                ``key``, which default to the ``label``/``key`` fields).
            progress: a JSON value describing the caller's input position after
                this record; stored with the shard if this record seals it, and
                given back through :attr:`resumed` on resume.

        Raises:
            SchemaError: missing or unknown fields, or a value of the wrong type.
        """
        if record.keys() != self._name_set:
            missing = [n for n in self._names if n not in record]
            extra = [n for n in record if n not in self._names]
            raise SchemaError("record does not match the schema", record=self.records_written,
                              found=f"missing {missing}, unknown {extra}", expected=self._names)
        for name in self._kinds.names:
            self._kinds.note(name, record[name])
        payloads = []
        for f, comp in zip(self.fields, self._compressors, strict=True):
            payload = encode_value(f, record[f.name])
            if comp is not None:
                self._max_raw[f.name] = max(self._max_raw[f.name], len(payload))
                payload = comp.compress(payload)
            payloads.append(payload)
        if self._shard is None:
            self._shard = ShardWriter(self.root, shard_name(len(self.sealed)), self.fields,
                                      self.alignment, self.durable)
        self._shard.append(payloads, self._meta(record, meta))
        self.records_written += 1
        if (self.records_per_shard is not None and self._shard.records >= self.records_per_shard) or (
            self.shard_size is not None and self._shard.nbytes >= self.shard_size
        ):
            self._seal(progress)

    def write_run(self, columns: Mapping[str, Sequence[Any]],
                  meta: Mapping[str, Sequence[Any]] | None = None,
                  progress: Callable[[int], Any] | None = None) -> None:
        """Append a run of records given column by column (field name -> one value
        per record): the same files as :meth:`write` record by record, for a fraction
        of the per-record Python work (many small records).

        Args:
            columns: a value list for every field of the schema, all of one length.
            meta: metadata table columns, as :meth:`write`'s ``meta`` per record.
            progress: ``progress(k)`` is the progress value after the run's first
                ``k`` records, asked for only when a shard seals after record ``k``.

        Raises:
            SchemaError: missing or unknown fields, columns of different lengths, or
                a value of the wrong type (naming its record); nothing of the run is
                written then.
        """
        if columns.keys() != self._name_set:
            missing = [n for n in self._names if n not in columns]
            extra = [n for n in columns if n not in self._names]
            raise SchemaError("columns do not match the schema",
                              found=f"missing {missing}, unknown {extra}", expected=self._names)
        n = len(columns[self._names[0]])
        given = [*columns.items(), *((f"meta {k}", v) for k, v in (meta or {}).items())]
        if any(len(v) != n for _, v in given):
            raise SchemaError("columns of different lengths",
                              found={name: len(v) for name, v in given})
        if not n:
            return
        encoded = [self._encode_column(f, comp, columns[f.name])
                   for f, comp in zip(self.fields, self._compressors, strict=True)]
        for name in self._kinds.names:  # after encoding: a bad value writes nothing
            for value in columns[name]:
                self._kinds.note(name, value)
        lengths = np.stack([c.lengths for c in encoded], axis=1)
        ends = np.cumsum(lengths.sum(axis=1))  # payload bytes up to each record
        meta_cols = self._meta_columns(columns, meta, n)
        i = 0
        while i < n:
            if self._shard is None:
                self._shard = ShardWriter(self.root, shard_name(len(self.sealed)), self.fields,
                                          self.alignment, self.durable)
            shard = self._shard
            # A bounded window (records and bytes): a run of many small shards stays
            # linear in its length, and large records are not all joined at once.
            budget = int(np.searchsorted(ends, (ends[i - 1] if i else 0) + _RUN_BYTES, "right"))
            k = min(n - i, _RUN_WINDOW, max(1, budget - i))
            if self.records_per_shard is not None:
                k = min(k, max(1, self.records_per_shard - shard.records))
            offsets, sizes = shard.layout(lengths[i:i + k])
            if self.shard_size is not None:  # the record that reaches the size seals
                k = min(k, int(np.searchsorted(sizes, self.shard_size)) + 1)
            part = slice(i, i + k)
            whole = k == n  # the common case: no slicing
            shard.append_run([c if whole else _column_part(c, part) for c in encoded],
                             {key: v if whole else v[part] for key, v in meta_cols.items()},
                             lengths[part], offsets[:k])
            self.records_written += k
            i += k
            if (self.records_per_shard is not None and shard.records >= self.records_per_shard) or (
                self.shard_size is not None and shard.nbytes >= self.shard_size
            ):
                self._seal(None if progress is None else progress(i))

    def _encode_column(self, f: Field, comp, values: Sequence[Any]) -> EncodedColumn:
        column = encode_column(f, values, self.records_written)
        if comp is None:
            return column
        heads = column.heads or [b""] * len(column.bodies)
        # Joined even without a head: a body may be an array, whose len() is not bytes.
        raws = [b"".join((h, b)) for h, b in zip(heads, column.bodies, strict=True)]
        self._max_raw[f.name] = max(self._max_raw[f.name], max(map(len, raws)))
        return column_of([comp.compress(r) for r in raws])

    def _meta_columns(self, columns: Mapping[str, Sequence[Any]],
                      meta: Mapping[str, Sequence[Any]] | None, n: int) -> dict[str, list]:
        """:meth:`_meta` for a run: the caller's columns, else the ``label``/``key``
        fields' values and the image header's size."""
        out = {k: list(v) for k, v in (meta or {}).items()}
        if "label" not in out and "label" in columns:
            out["label"] = [v if isinstance(v, int) else None for v in columns["label"]]
        if "key" not in out and "key" in columns:
            out["key"] = [v if isinstance(v, str) else None for v in columns["key"]]
        if self._sized is not None and ("width" not in out or "height" not in out):
            sizes = [_header_size(v) for v in columns[self._sized]]
            for k in ("width", "height"):  # as _meta: a readable header gives both
                given = out.get(k) or [None] * n
                out[k] = [size.get(k, g) for size, g in zip(sizes, given, strict=True)]
        return out

    def _meta(self, record: Mapping[str, Any], meta: Mapping[str, Any] | None) -> dict:
        out = dict(meta or {})
        label = record.get("label")
        if "label" not in out and isinstance(label, int):
            out["label"] = label
        key = record.get("key")
        if "key" not in out and isinstance(key, str):
            out["key"] = key
        if self._sized is not None and ("width" not in out or "height" not in out):
            out.update(_header_size(record.get(self._sized)))
        return out

    def _seal(self, progress: Any) -> None:
        entry = self._shard.seal()
        self._shard = None
        self.sealed.append(entry)
        self._append_journal({"shard": entry.to_json(), "progress": progress,
                              "written": self._written()})

    def close(self, progress: Any = None) -> Manifest:
        """Seal the last shard and write the manifest; returns it.

        Args:
            progress: stored with the last shard like :meth:`write`'s, so a crash
                between sealing it and writing the manifest still resumes exactly.
        """
        if self._shard is not None and self._shard.records:
            self._seal(progress)
        written = Written(tuple(self.sealed), self.alignment, self._max_raw, self._kinds.state())
        manifest = build_manifest(self.fields, [written], classes=self.classes,
                                  class_info=self.class_info, created_by=self.created_by,
                                  dictionaries=self._dictionaries)
        write_manifest(self.root, manifest, durable=self.durable)
        (self.root / JOURNAL_NAME).unlink(missing_ok=True)
        if self.durable:
            fsync_dir(self.root)
        return manifest

    def typed_fields(self) -> tuple[Field, ...]:
        """The schema as stored: an image field is ``jpeg`` (or ``png``) when every
        payload written is one, else ``image`` (readers sniff each record); the type
        declared is only where writing started. A field with no payload yet keeps it."""
        return self._kinds.typed(self.fields)

    def abort(self) -> None:
        """Drop the unfinished shard; sealed shards and the journal stay for resume."""
        if self._shard is not None:
            self._shard.abort()
            self._shard = None

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _column_part(column: EncodedColumn, part: slice) -> EncodedColumn:
    return EncodedColumn(None if column.heads is None else column.heads[part], column.bodies[part],
                  column.lengths[part], column.crcs[part])


def _header_size(data: Any) -> dict:
    """``{"width", "height"}`` from an encoded image's header; nothing when unreadable."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return {}
    kind = image_kind(data)
    if kind is None:
        return {}
    try:
        height, width = image_size(data, kind)
    except ValueError:
        return {}  # a damaged header: the reader reports it when it decodes the record
    return {"width": width, "height": height}
