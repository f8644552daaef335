"""A tiny dataset written by format 1.0, committed: later code must keep reading it."""


import formats
from tests.helpers_paths import DATA

GOLDEN = DATA / "golden-v1"


def test_golden_v1_reads_back():
    ds = formats.open_shards(GOLDEN, check_crc=True)
    assert len(ds) == 2
    assert ds[0] == {"label": 7, "key": "cat/1.jpg"}
    assert ds[1] == {"label": 1, "key": "dog"}
    assert formats.verify_dataset(GOLDEN) == []


def test_golden_v1_bytes_match_the_spec_example():
    # FORMAT.md's worked example is this file; these are its landmarks.
    data = (GOLDEN / "shard-00000.rec").read_bytes()
    assert data[:8] == b"SHPKREC\x00" and len(data) == 99
    assert data[64:72] == (7).to_bytes(8, "little") and data[72:81] == b"cat/1.jpg"
    index = (GOLDEN / "shard-00000.idx").read_bytes()
    assert index[:8] == b"SHPKIDX\x00" and len(index) == 208
