"""A small source of every kind ``pack-dataset`` reads, for matrix tests."""

from __future__ import annotations

from pathlib import Path

from formats.codecs.registry import convert
from tests.formats.test_codec_mds import write_mds
from tests.helpers_codecs import make_dataset, make_records
from tests.helpers_packer import image_folder

SOURCES = ("imagefolder", "files", "filelist", "tfrecord", "webdataset", "parquet", "mds",
           "shards")


def make_source(kind: str, root: Path, rng, n: int = 9, seed_shift: int = 0,
                corrupt: int | None = None) -> Path:
    """A source of ``kind`` under ``root`` holding ``n`` records; returns SRC.

    Args:
        corrupt: the input order index of a record whose JPEG is cut in half (truncated).
    """
    recs = make_records(rng, n + seed_shift)[seed_shift:]
    if corrupt is not None:
        recs[corrupt]["image"] = recs[corrupt]["image"][: len(recs[corrupt]["image"]) // 2]
    if kind == "imagefolder":
        image_folder(root / "if", rng, per_class=(n + 1) // 2)
        if corrupt is not None:
            victim = sorted((root / "if").rglob("*.jpg"))[corrupt]
            victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
        return root / "if"
    if kind == "files":
        (root / "files").mkdir(parents=True)
        for i, r in enumerate(recs):
            (root / "files" / f"{i:03d}.jpg").write_bytes(r["image"])
        return root / "files"
    if kind == "filelist":
        (root / "fl").mkdir(parents=True)
        lines = ["path,label"]
        for i, r in enumerate(recs):
            (root / "fl" / f"{i:03d}.jpg").write_bytes(r["image"])
            lines.append(f"{i:03d}.jpg,{r['label']}")
        (root / "fl" / "list.csv").write_text("\n".join(lines) + "\n")
        return root / "fl" / "list.csv"
    if kind == "mds":
        samples = [{"image": r["image"], "label": r["label"]} for r in recs]
        write_mds(root / "mds", {"image": "jpeg", "label": "int"}, samples)
        return root / "mds"
    shards = make_dataset(root / "shards", recs, records_per_shard=3)
    if kind == "shards":
        return shards
    convert("shards", shards, kind, root / kind, records_per_shard=3)
    return root / kind
