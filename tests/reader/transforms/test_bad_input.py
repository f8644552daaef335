"""One bad-input rule (on_error), decided by one policy on every path of a batch."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_reader import make_dataset, spy_rejects

from formats.errors import CorruptRecordError
from reader import CenterCrop, Loader
from reader.errors import DecodeError
from reader.transforms import bad_input
from reader.transforms.bad_input import BadInput

BAD = (3, 9)


@pytest.fixture(scope="module")
def corrupt_path(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("bad") / "ds", 16, records_per_shard=8,
                        corrupt=BAD, extra=False)


# The classification path (a fixed crop: reader.runtime.worker's fused decode) and the
# sample path (no transform: images of their own sizes, reader.transforms.sample).
PATHS = {"classification": [CenterCrop(16)], "sample": None}


@pytest.mark.parametrize("path", list(PATHS))
def test_skip_is_one_rule_on_every_path(corrupt_path, path, monkeypatch):
    calls = spy_rejects(monkeypatch)
    with Loader(corrupt_path, 8, transform=PATHS[path], num_workers=0, on_error="skip",
                copy=True) as lo:
        batches = list(lo)
        assert lo.skipped == len(BAD)
    assert calls == [i % 8 for i in BAD], "every bad sample goes through the one policy"
    valid = np.concatenate([b["valid"] for b in batches])
    assert [i for i in range(16) if not valid[i]] == list(BAD)
    for i in BAD:
        image = batches[i // 8]["image"]
        sample = image[i % 8]
        assert not np.asarray(sample).any(), "a skipped sample's image is zeros"
    labels = np.concatenate([b["label"] for b in batches])
    assert labels.tolist() == list(range(16)), "a skipped sample keeps its place"


@pytest.mark.parametrize("path", list(PATHS))
def test_fail_names_the_record_on_every_path(corrupt_path, path):
    with Loader(corrupt_path, 8, transform=PATHS[path], num_workers=0) as lo, \
            pytest.raises(CorruptRecordError, match="record 3 does not decode"):
        list(lo)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_fail_names_the_records_key_where_the_dataset_has_keys(tmp_path, num_workers):
    # The user knows the file (its key), not the global record number.
    path = make_dataset(tmp_path / "keyed", 16, records_per_shard=8, corrupt=(11,))
    with Loader(path, 8, num_workers=num_workers) as lo, \
            pytest.raises(CorruptRecordError, match=r"record 11 \(key 'k11'\) does not decode"):
        list(lo)


def test_the_policy_raises_or_marks():
    exc = DecodeError("bad bytes")
    valid = np.ones(4, bool)
    with pytest.raises(DecodeError):
        BadInput("fail").reject(exc, valid, 1)
    assert valid.all()
    BadInput("skip").reject(exc, valid, 1)
    assert valid.tolist() == [True, False, True, True]
    with pytest.raises(DecodeError):
        BadInput("skip").reject(exc, None, 1)  # no mask to mark: nothing may pass silently
    assert BadInput("fail").slot_specs(4) == []
    assert BadInput("skip").slot_specs(4) == [(bad_input.VALID_FIELD, np.bool_, (4,))]


def test_no_builder_reads_on_error_itself():
    # The classification path used to test spec.on_error and zero-fill on its own.
    import inspect

    from reader.runtime import epoch, plan, worker
    from reader.transforms import sample

    for module in (worker, sample, plan, epoch):
        source = inspect.getsource(module)
        for value in ("fail", "skip", "replace"):
            assert f'== "{value}"' not in source and f'!= "{value}"' not in source, module.__name__
        assert ".on_error" not in source, module.__name__
