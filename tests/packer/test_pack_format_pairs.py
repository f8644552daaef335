"""Every pair of foreign formats through ``pack-dataset``: in → shards → out → shards.

The codec tests check each format against our shards (tests/formats/test_codec_roundtrip_exact.py,
whose dataset variants this module reuses: mixed JPEG and PNG, an empty class, twelve
unnamed classes, class names with spaces, slashes and unicode, keys with dots and
extensions, int/float/str/ndarray/json/bytes fields). Here every hop is a real pack,
through the one pack loop, so what the loop does to records (image checks, typing by
content, the order) is judged on every pair, record by record.
"""

from __future__ import annotations

import pytest

from formats import open_shards, verify_dataset
from packer import PackOptions, pack
from tests.formats.test_codec_roundtrip_exact import FOREIGN, _check, _write_shards, variants


def hop(src, dst, **kw) -> None:
    s = pack(src, dst, PackOptions(workers=0, durable=False, records_per_shard=4, **kw))
    assert s.complete and not s.skipped, (src, dst, s.skipped)


@pytest.mark.parametrize("first", FOREIGN)
def test_every_pair_of_formats_is_exact(tmp_path, rng, first):
    for v in variants(rng):
        base = _write_shards(tmp_path / v.name / "base", v)
        hop(base, tmp_path / v.name / first, sink=first)
        hop(tmp_path / v.name / first, tmp_path / v.name / "s1", source=first)
        for second in FOREIGN:
            out = tmp_path / v.name / f"{first}-{second}"
            hop(tmp_path / v.name / "s1", out, sink=second)
            back = tmp_path / v.name / f"{first}-{second}-back"
            hop(out, back, source=second)
            ds = open_shards(back)
            _check(f"{v.name}: {first} -> {second}", ds.fields, ds.classes,
                   [ds[i] for i in range(len(ds))], v)
            assert verify_dataset(back) == []
