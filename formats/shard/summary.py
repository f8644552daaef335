"""What ``inspect-shards`` reports, as JSON-ready values: the CLI only formats them.

Everything here reads the manifest and the small metadata tables; only
:func:`describe_record` and :func:`field_bytes` touch data files, one record each.
A dataset whose files are symlinks out of its folder is refused unless the caller
passes ``follow_symlinks=True`` (FORMAT.md, §8), as everywhere else.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from ..fields import BYTES_TYPES
from ..sniff import sniff
from .dataset import ShardDataset, read_metadata
from .layout import MAJOR
from .manifest import read_manifest

__all__ = ["dataset_info", "dataset_stats", "describe_record", "field_bytes", "list_records",
           "resolve_label"]

_HEAD_BYTES = 16


def dataset_info(path: str | Path, *, follow_symlinks: bool = False) -> dict[str, Any]:
    """Records, shards, bytes, schema, classes, format version and provenance.

    Reads ``manifest.json`` only.
    """
    root = Path(path)
    m = read_manifest(root, follow_symlinks=follow_symlinks)
    return {
        "path": str(root),
        "format_version": f"{MAJOR}.{m.minor}",
        "records": m.records,
        "shards": len(m.shards),
        "data_bytes": m.data_bytes,
        "total_bytes": sum(s.data_bytes + s.index_bytes + s.meta_bytes for s in m.shards),
        "alignment": m.alignment,
        "fields": [
            {**f.to_json(), **({"dictionary": m.dictionaries[f.name][0]}
                               if f.name in m.dictionaries else {})}
            for f in m.fields
        ],
        "classes": None if m.classes is None else list(m.classes),
        "created_by": m.created_by,
    }


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
    """One record's fields: bytes fields summarized (size, sniffed type, first bytes)."""
    s, r = ds.locate(index)
    out: dict[str, Any] = {"index": index, "shard": ds.shard(s).data_path.name, "record": r,
                           "fields": {}}
    for f in ds.fields:
        value = ds.get(index, f.name)
        stored = len(ds.payload(index, f.name))
        if f.type in BYTES_TYPES:
            out["fields"][f.name] = {"type": f.type, "size": len(value), "stored": stored,
                                     "sniffed": sniff(value),
                                     "head": bytes(value[:_HEAD_BYTES]).hex(" ")}
        elif f.type == "ndarray":
            out["fields"][f.name] = {"type": f.type, "dtype": str(value.dtype),
                                     "shape": list(value.shape), "stored": stored}
        else:
            out["fields"][f.name] = {"type": f.type, "value": value, "stored": stored}
    return out


def field_bytes(ds: ShardDataset, index: int, field: str) -> bytes:
    """A field's value as file content: bytes as stored (decompressed), text as UTF-8,
    JSON as JSON text, scalars as their decimal text, arrays as ``.npy``."""
    f = ds.fields[ds.field_index[field]]
    value = ds.get(index, field)
    if f.type in BYTES_TYPES:
        return bytes(value)
    if f.type == "str":
        return value.encode("utf-8")
    if f.type == "json":
        return json.dumps(value, ensure_ascii=False, sort_keys=True).encode("utf-8")
    if f.type == "ndarray":
        import io
        buf = io.BytesIO()
        np.save(buf, value, allow_pickle=False)
        return buf.getvalue()
    return f"{value}\n".encode("ascii")


def _dist(values: np.ndarray) -> dict[str, Any] | None:
    if values.size == 0:
        return None
    q = np.percentile(values, [0, 10, 50, 90, 99, 100])
    return {"count": int(values.size), "mean": float(values.mean()), "min": float(q[0]),
            "p10": float(q[1]), "p50": float(q[2]), "p90": float(q[3]), "p99": float(q[4]),
            "max": float(q[5])}


def dataset_stats(path: str | Path, *, top: int = 10, with_arrays: bool = False,
                  follow_symlinks: bool = False) -> dict[str, Any]:
    """Label histogram, record size and image resolution distributions.

    Args:
        top: how many of the most common resolutions to list.
        with_arrays: add ``arrays`` (size, width, height, labels as numpy), for plots.
        follow_symlinks: read files that are symlinks out of the dataset folder.
    """
    m = read_manifest(path, follow_symlinks=follow_symlinks)
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
        "records": table.num_rows,
        "labels": hist,
        "size_bytes": _dist(size),
        "width": _dist(w),
        "height": _dist(h),
        "pixels": _dist(w * h),
        "top_resolutions": res,
    }
    if with_arrays:
        out["arrays"] = {"size": size, "width": w, "height": h, "labels": labels}
    return out
