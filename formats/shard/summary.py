"""What ``inspect-shards`` reports, as JSON-ready values: the CLI only formats them.

Everything here reads the manifest, the small metadata tables and, for the sizes
of variable-size fields, the index files' lengths (:mod:`.field_lengths`); only
:func:`describe_record` and :func:`field_bytes` touch data files, one record each.
A record's values are shown as excerpts (text cut at 80 characters, JSON at 120, an
array's first values), so a field of any size prints as a line.
A dataset whose files are symlinks out of its folder is refused unless the caller
passes ``follow_symlinks=True`` (FORMAT.md, §8), as everywhere else.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from ..audio_header import audio_info
from ..fields import BYTES_TYPES, IMAGE_TYPES, Field
from ..media import AUDIO_EXTENSIONS, IMAGE_EXTENSION, IMAGE_KINDS
from ..sniff import image_size, sniff
from .dataset import ShardDataset, check_dataset_path, read_metadata
from .field_lengths import distribution, field_lengths, length_fields, ragged_fields
from .manifest import ShardEntry, read_manifest

__all__ = ["dataset_info", "dataset_stats", "default_field", "describe_record", "extension_of",
           "field_bytes", "list_records", "resolve_label"]

_HEAD_BYTES = 16
_TEXT_CHARS = 80   # of a str value shown
_JSON_CHARS = 120  # of a JSON value's compact text shown
_ARRAY_VALUES = 6  # first values of an array shown

# Gives an index file's bytes by shard entry: a remote dataset's (field_lengths' fetch).
IndexFetch = Callable[[ShardEntry], bytes]


def dataset_info(path: str | Path, *, follow_symlinks: bool = False,
                 fetch_index: IndexFetch | None = None) -> dict[str, Any]:
    """Records, shards, bytes, schema, classes, format version and provenance, and the
    length distribution of each variable-shape ``ndarray`` field (``field_lengths``,
    see :func:`formats.shard.field_lengths.field_lengths`; absent without such fields).

    Reads ``manifest.json``, and the index files when there are variable-shape arrays
    (through ``fetch_index`` for a remote dataset).
    """
    root = Path(path)
    if fetch_index is None:  # a local dataset: a missing path is said as such
        check_dataset_path(root)
    m = read_manifest(root, follow_symlinks=follow_symlinks)
    out = {
        "path": str(root),
        "format_version": m.version,
        "records": m.records,
        "shards": len(m.shards),
        "data_bytes": m.data_bytes,
        "total_bytes": int(m.shards.data_bytes.sum() + m.shards.index_bytes.sum()
                           + m.shards.meta_bytes.sum()),
        "alignment": m.alignment,
        "fields": [
            {**f.to_json(), **({"dictionary": m.dictionaries[f.name][0]}
                               if f.name in m.dictionaries else {})}
            for f in m.fields
        ],
        "classes": None if m.classes is None else list(m.classes),
        "created_by": m.created_by,
    }
    ragged = ragged_fields(m.fields)
    if ragged:
        out["field_lengths"] = field_lengths(root, m, ragged, follow_symlinks=follow_symlinks,
                                             fetch=fetch_index)
    return out


def resolve_label(classes: Sequence[str] | None, label: int | str) -> int:
    """The label number that ``label`` names: a class name, or a label number.

    A class whose name is exactly ``label`` wins over reading ``label`` as a number
    (a class named ``"3"`` is that class, whatever its index).

    Raises:
        ValueError: ``label`` is neither a class name nor an integer (the message
            lists the class names).
    """
    if isinstance(label, int):
        return label
    if classes is not None and label in classes:
        return list(classes).index(label)
    try:
        return int(label)
    except ValueError:
        pass
    if classes is None:
        raise ValueError(f"no class named {label!r}: the dataset has no class names; "
                         "pass a label number") from None
    shown = ", ".join(repr(c) for c in classes[:20]) + (" ..." if len(classes) > 20 else "")
    raise ValueError(f"no class named {label!r}; classes are {shown} "
                     "(or pass a label number)") from None


def list_records(path: str | Path, *, offset: int = 0, limit: int | None = 20,
                 label: int | str | None = None,
                 follow_symlinks: bool = False) -> list[dict[str, Any]]:
    """Rows of the metadata table (index, key, label, size, width, height).

    Args:
        offset: skip this many (matching) records.
        limit: at most this many rows; None for all.
        label: only records with this label: a label number or a class name
            (see :func:`resolve_label`).
        follow_symlinks: read files that are symlinks out of the dataset folder.

    Raises:
        ValueError: ``label`` names no class (see :func:`resolve_label`).
    """
    m = read_manifest(path, follow_symlinks=follow_symlinks)
    if label is not None:
        label = resolve_label(m.classes, label)
    table = read_metadata(path, manifest=m, follow_symlinks=follow_symlinks)
    index = np.arange(table.num_rows)
    if label is not None:
        mask = pc.fill_null(pc.equal(table.column("label"), label), False)
        table = table.filter(mask)
        index = index[np.asarray(mask.to_numpy(zero_copy_only=False), bool)]
    end = None if limit is None else offset + limit
    table = table.slice(offset, None if limit is None else limit)
    rows = table.to_pylist()
    for i, row in zip(index[offset:end].tolist(), rows, strict=True):
        row["index"] = i
    return [{"index": r.pop("index"), **r} for r in rows]


def describe_record(ds: ShardDataset, index: int) -> dict[str, Any]:
    """One record's fields, each summarized so any size prints as a line.

    ``str``: ``length`` (characters), ``excerpt``, ``truncated``; ``json``: its compact
    text the same way, and ``json_type``/``items``; ``ndarray``: ``dtype``, ``shape`` (this
    record's), ``schema_shape``, the first ``values``, ``min``/``max``; bytes fields:
    ``size``, ``sniffed`` kind, ``head`` (first bytes, hex), an image's ``width`` and
    ``height``, an audio payload's header (``audio``, see
    :func:`formats.audio_header.audio_info`); ``int``/``float``: ``value``. Every field
    has ``type`` and ``stored`` (its stored, possibly compressed, size).
    """
    s, r = ds.locate(index)
    out: dict[str, Any] = {"index": index, "shard": ds.shard(s).data_path.name, "record": r,
                           "fields": {}}
    for f in ds.fields:
        value = ds.get(index, f.name)
        entry: dict[str, Any] = {"type": f.type, "stored": len(ds.payload(index, f.name))}
        if f.type in BYTES_TYPES:
            entry.update(_bytes_summary(value))
        elif f.type == "ndarray":
            entry.update(_array_summary(f, value))
        elif f.type == "str":
            entry.update(_excerpt(value, _TEXT_CHARS))
        elif f.type == "json":
            entry.update(_json_summary(value))
        else:
            entry["value"] = value
        out["fields"][f.name] = entry
    return out


def _excerpt(text: str, limit: int) -> dict[str, Any]:
    return {"length": len(text), "excerpt": text[:limit], "truncated": len(text) > limit}


def _json_summary(value: Any) -> dict[str, Any]:
    text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    kind = {dict: "object", list: "array", str: "string", bool: "boolean",
            type(None): "null"}.get(type(value), "number")
    out = {"json_type": kind, **_excerpt(text, _JSON_CHARS)}
    if kind in ("object", "array"):
        out["items"] = len(value)
    return out


def _array_summary(f: Field, value: np.ndarray) -> dict[str, Any]:
    flat = value.reshape(-1)
    out: dict[str, Any] = {"dtype": str(value.dtype), "shape": list(value.shape),
                           "schema_shape": list(f.shape), "elements": int(flat.size),
                           "values": flat[:_ARRAY_VALUES].tolist()}
    if flat.size and (np.issubdtype(value.dtype, np.number) or value.dtype == bool):
        out["min"], out["max"] = flat.min().item(), flat.max().item()
    return out


def _bytes_summary(value) -> dict[str, Any]:
    out: dict[str, Any] = {"size": len(value), "sniffed": sniff(value),
                           "head": bytes(value[:_HEAD_BYTES]).hex(" ")}
    if out["sniffed"] in IMAGE_KINDS:
        try:
            out["height"], out["width"] = image_size(value, out["sniffed"])
        except ValueError as exc:
            out["image_error"] = f"unreadable header: {exc}"
    else:
        audio = audio_info(value)
        if audio is not None:
            out["sniffed"] = audio["kind"]
            out["audio"] = audio
    return out


def default_field(ds: ShardDataset) -> str:
    """The field ``extract`` writes when none is named: ``image``, else the only
    image field, else the only field.

    Raises:
        ValueError: no such field (the message lists the fields).
    """
    names = [f.name for f in ds.fields]
    images = [f.name for f in ds.fields if f.type in IMAGE_TYPES]
    if "image" in names:
        return "image"
    if len(images) == 1 or len(names) == 1:
        return images[0] if images else names[0]
    raise ValueError(f"name the field to write with --field; fields are {names}")


# Extensions a field's name may itself be (WebDataset names fields by extension).
_NAMED_EXTENSIONS = AUDIO_EXTENSIONS | {"npy", "txt", "json", "bin", "cls", "jpg", "jpeg",
                                        "png", "webp", "gif", "bmp", "tif", "tiff", "mp4"}
_SNIFFED_EXTENSION = {**IMAGE_EXTENSION, "npy": "npy", "gzip": "gz", "zstd": "zst",
                      "parquet": "parquet", "json": "json", "text": "txt",
                      "wav": "wav", "flac": "flac", "mp3": "mp3"}


def extension_of(ds: ShardDataset, index: int, field: str) -> str:
    """The file extension (with its dot) that :func:`field_bytes`' output is best
    saved under: ``.txt`` for text and numbers, ``.json``, ``.npy`` for arrays, an
    image's by its signature; raw bytes get the extension their field's name or
    the record's key gives (``audio.wav``, a field named ``flac``, a key
    ``clips/a.mp3``), else the sniffed kind's, else ``.bin``."""
    f = ds.fields[ds.field_index[field]]
    if f.type in ("str", "int", "float"):
        return ".txt"
    if f.type in ("json", "ndarray"):
        return ".json" if f.type == "json" else ".npy"
    value = ds.get(index, field)
    if f.type == "bytes":
        named = Path(field).suffix[1:] or (field if field.lower() in _NAMED_EXTENSIONS else "")
        key = ds.get(index, "key") if "key" in ds.field_index and \
            ds.fields[ds.field_index["key"]].type == "str" else ""
        from_key = Path(key).suffix[1:]
        for ext in (named, from_key):
            if ext and len(ext) <= 10 and ext.isalnum():
                return "." + ext.lower()
        audio = audio_info(value)
        kind = audio["kind"] if audio else sniff(value)
    else:
        kind = sniff(value)
    return "." + _SNIFFED_EXTENSION.get(kind, "bin")


def field_bytes(ds: ShardDataset, index: int, field: str) -> bytes:
    """A field's value as file content: bytes as stored (decompressed), text as UTF-8,
    JSON as JSON text, scalars as their decimal text, arrays as ``.npy`` (no pickles)."""
    f = ds.fields[ds.field_index[field]]
    value = ds.get(index, field)
    if f.type in BYTES_TYPES:
        return bytes(value)
    if f.type == "str":
        return value.encode("utf-8")
    if f.type == "json":
        return json.dumps(value, ensure_ascii=False, sort_keys=True).encode("utf-8")
    if f.type == "ndarray":
        buf = io.BytesIO()
        np.save(buf, value, allow_pickle=False)
        return buf.getvalue()
    return f"{value}\n".encode("ascii")


def dataset_stats(path: str | Path, *, top: int = 10, with_arrays: bool = False,
                  follow_symlinks: bool = False, fetch_index: IndexFetch | None = None,
                  max_shards: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Label histogram, record size and image resolution distributions, and the size
    distribution of every variable-size field (``field_lengths``: text, JSON and raw
    bytes in bytes, variable-shape arrays in elements and rows; from the index files,
    see :func:`formats.shard.field_lengths.field_lengths`).

    Args:
        top: how many of the most common resolutions to list.
        with_arrays: add ``arrays`` (size, width, height, labels as numpy, and each
            variable-size field's per-record ``values``), for plots.
        follow_symlinks: read files that are symlinks out of the dataset folder.
        fetch_index: gives a remote dataset's index files (default: read them in ``path``).
        max_shards: read at most this many shards (None: all), a seeded random sample
            of them when the dataset has more; ``sampled`` then says which share the
            figures describe (its records, of how many).
        seed: the sample's seed.
    """
    m = read_manifest(path, follow_symlinks=follow_symlinks)
    total, shards = m.records, len(m.shards)
    sampled = None
    if max_shards is not None and shards > max_shards:
        rows = np.sort(np.random.default_rng(seed).choice(shards, max_shards, replace=False))
        m = replace(m, shards=m.shards.take(rows))
        sampled = {"shards": max_shards, "of_shards": shards, "records": m.records,
                   "of_records": total, "seed": seed}
    table = read_metadata(path, manifest=m, follow_symlinks=follow_symlinks)
    classes = m.classes
    labels = table.column("label").to_numpy(zero_copy_only=False)
    labels = labels[~np.isnan(labels.astype(float))].astype(np.int64) if labels.size else labels
    hist = {}
    if labels.size:
        values, counts = np.unique(labels, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist(), strict=True):
            name = classes[v] if classes is not None and 0 <= v < len(classes) else None
            hist[str(v)] = {"count": c, "class": name}
    size = np.asarray(table.column("size").to_numpy(zero_copy_only=False), float)
    w = table.column("width").to_numpy(zero_copy_only=False).astype(float)
    h = table.column("height").to_numpy(zero_copy_only=False).astype(float)
    known = ~(np.isnan(w) | np.isnan(h))
    w, h = w[known], h[known]
    res = {}
    if w.size:
        pairs, counts = np.unique(np.stack([w, h], 1).astype(np.int64), axis=0, return_counts=True)
        order = np.argsort(-counts, kind="stable")[:top]
        res = {f"{int(pairs[i, 0])}x{int(pairs[i, 1])}": int(counts[i]) for i in order}
    out = {
        "records": total,
        "sampled": sampled,
        "labels": hist,
        "size_bytes": distribution(size),
        "width": distribution(w),
        "height": distribution(h),
        "pixels": distribution(w * h),
        "top_resolutions": res,
        "field_lengths": field_lengths(path, m, length_fields(m.fields), with_arrays=with_arrays,
                                       follow_symlinks=follow_symlinks, fetch=fetch_index),
    }
    if with_arrays:
        out["arrays"] = {"size": size, "width": w, "height": h, "labels": labels,
                         "field_lengths": {k: v.pop("values")
                                           for k, v in out["field_lengths"].items()}}
    return out
