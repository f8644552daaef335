"""Every value a user hands the reader is checked where it is given, and a wrong one is
a ShardpackError that keeps the stdlib base code already catches (ValueError, and
TypeError for a wrong type), naming the argument, the value and what is allowed."""

from __future__ import annotations

import numpy as np
import pytest
from helpers_reader import make_dataset

import formats
import reader
from formats import ArgumentError, ArgumentTypeError, DatasetWriter, Field, ShardpackError
from reader import Loader, StateError, TokenBlocks
from tests.reader.test_reader_api import BAD_OPTIONS


@pytest.fixture(scope="module")
def ds_path(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("opts") / "ds", 40, records_per_shard=10)


@pytest.fixture(scope="module")
def tokens_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokens") / "ds"
    field = Field("tokens", "ndarray", dtype="int32", shape=(None,))
    with DatasetWriter(root, [field], shard_size=None, records_per_shard=4, durable=False) as w:
        for i in range(12):
            w.write({"tokens": np.arange(i * 50, i * 50 + 50, dtype=np.int32)})
    return root


def test_the_argument_errors_are_on_the_root_with_their_stdlib_bases():
    assert issubclass(ArgumentError, ShardpackError) and issubclass(ArgumentError, ValueError)
    assert issubclass(ArgumentTypeError, ArgumentError) and issubclass(ArgumentTypeError, TypeError)
    assert issubclass(StateError, ArgumentError)
    assert "StateError" in reader.__all__
    assert {"ArgumentError", "ArgumentTypeError"} <= set(formats.__all__)


@pytest.mark.parametrize(("cls", "kwargs", "exc", "match"), BAD_OPTIONS,
                         ids=[f"{c.__name__}-{next(iter(k))}" for c, k, _, _ in BAD_OPTIONS])
def test_every_refused_option_is_an_option_error_of_its_kind(cls, kwargs, exc, match):
    with pytest.raises(ArgumentError, match=match) as info:
        cls(**kwargs)
    # A wrong type is an ArgumentTypeError (a TypeError); a wrong value is not one.
    assert isinstance(info.value, TypeError) == (exc is TypeError)


# Loader keywords, each wrong in a way users get wrong: the exception's type and what
# the message must name.
BAD_LOADER = [
    ({"batch_size": "32"}, TypeError, "batch_size .* str '32'"),
    ({"batch_size": 0}, ValueError, "batch_size must be an int >= 1, not 0"),
    ({"num_workers": -2}, ValueError, "num_workers"),
    ({"num_workers": 1.5}, TypeError, "num_workers .* float 1.5"),
    ({"shuffle": "yes"}, ValueError, "shuffle .* 'yes'"),
    ({"seed": -3}, ValueError, "seed must be an int >= 0, not -3"),
    ({"rank": 3, "world_size": 2}, ValueError, r"rank 3 is not in \[0, world_size=2\)"),
    ({"device": "gpu"}, ValueError, "device must be 'cpu' or 'cuda', not 'gpu'"),
    ({"on_error": "ignore"}, ValueError, "on_error"),
    ({"fields": ("label", "nope")}, ValueError, "no field 'nope'"),
    ({"timeout": -1}, ValueError, "timeout"),
    ({"batch_sampler": [[0, 1]]}, TypeError, "batch_sampler"),
]


@pytest.mark.parametrize(("kwargs", "base", "match"), BAD_LOADER,
                         ids=[next(iter(k)) + "-" + repr(k[next(iter(k))]) for k, _, _ in BAD_LOADER])
def test_a_wrong_loader_keyword_is_an_option_error(ds_path, kwargs, base, match):
    kwargs = {"batch_size": 4, "num_workers": 0, **kwargs}
    with pytest.raises(ArgumentError, match=match) as info:
        Loader(ds_path, **kwargs)
    assert isinstance(info.value, base)
    assert isinstance(info.value, TypeError) == (base is TypeError)


# The settings objects a Loader takes, each wrong once: built where the user builds them.
BAD_SETTINGS = [
    (lambda: reader.RandomResizedCrop(-1), ValueError, "size must be a positive int"),
    (lambda: reader.RandomResizedCrop(8, scale=(0.9, 0.1)), ValueError, "scale and ratio"),
    (lambda: reader.Resize(0), ValueError, "size must be positive"),
    (lambda: reader.Normalize(mean=(0, 0), std=(1, 1)), ValueError, "mean and std need 3"),
    (lambda: reader.PadToMultiple(0), ValueError, "multiple must be an int >= 1"),
    (lambda: reader.Padded(multiple=0), ValueError, "needs an int >= 1"),
    (lambda: reader.DecodedCacheOptions(max_bytes="1GB"), TypeError, "max_bytes must be an int"),
    (lambda: reader.Thresholds(max_load_latency_ms=-1), ValueError, "expected a number >= 0"),
    (lambda: reader.FieldDecoder(3, "float32", 1), TypeError, "fn must be callable"),
    (lambda: reader.open_dataset(3), TypeError, "path must be a str or os.PathLike"),
]


@pytest.mark.parametrize(("make", "base", "match"), BAD_SETTINGS,
                         ids=[m.split()[0] + f"-{i}" for i, (_, _, m) in enumerate(BAD_SETTINGS)])
def test_a_wrong_setting_object_is_an_argument_error(make, base, match):
    with pytest.raises(ArgumentError, match=match) as info:
        make()
    assert isinstance(info.value, base)


def test_a_transform_that_does_not_fit_the_dataset_is_an_argument_error(ds_path):
    with pytest.raises(ArgumentError, match="collate names 'nope'"):
        Loader(ds_path, batch_size=4, num_workers=0, collate={"nope": "ragged"})


@pytest.mark.parametrize("make", ["loader", "tokens"])
@pytest.mark.parametrize(("epoch", "base", "match"), [
    ("1", TypeError, "epoch must be an int >= 0, not str '1'"),
    (1.5, TypeError, "not float 1.5"),
    (1.0, TypeError, "not float 1.0"),  # never truncated, even when it would be exact
    (True, TypeError, "not bool True"),
    (None, TypeError, "not NoneType None"),
    (-1, ValueError, "epoch must be an int >= 0, not -1"),
])
def test_set_epoch_refuses_what_is_not_an_epoch_and_keeps_its_place(
        ds_path, tokens_path, make, epoch, base, match):
    r = (Loader(ds_path, batch_size=4, num_workers=0, decode=False) if make == "loader"
         else TokenBlocks(tokens_path, 8, batch_size=2))
    with r:
        r.set_epoch(2)
        with pytest.raises(ArgumentError, match=match) as info:
            r.set_epoch(epoch)
        assert isinstance(info.value, base)
        assert r.state_dict()["epoch"] == 2  # the refused call changed nothing
        r.set_epoch(np.int64(3))  # numpy integers are ints
        assert r.state_dict()["epoch"] == 3


@pytest.mark.parametrize("make", ["loader", "tokens"])
@pytest.mark.parametrize(("state", "match"), [
    (None, "state must be the dict that state_dict.. returned, not NoneType None"),
    ([1, 2], "state must be the dict .* not list"),
    ({}, "the state has no 'epoch' or 'batch'"),
    ({"epoch": 1}, "the state has no 'batch'"),
    ({"epoch": -1, "batch": 0}, r"state\['epoch'\] must be an int >= 0, not int -1"),
    ({"epoch": 0, "batch": 1.5}, r"state\['batch'\] must be an int >= 0, not float 1.5"),
    ({"epoch": "0", "batch": 0}, r"state\['epoch'\] must be an int >= 0, not str '0'"),
])
def test_load_state_dict_names_what_is_wrong_with_the_state(ds_path, tokens_path, make,
                                                            state, match):
    r = (Loader(ds_path, batch_size=4, num_workers=0, decode=False) if make == "loader"
         else TokenBlocks(tokens_path, 8, batch_size=2))
    with r:
        with pytest.raises(StateError, match=match):
            r.load_state_dict(state)
        good = r.state_dict()
        r.load_state_dict(good)  # a real state still loads after a refused one


def test_a_state_of_another_order_is_a_state_error(ds_path):
    with Loader(ds_path, batch_size=4, num_workers=0, decode=False, seed=1,
                shuffle=True) as a, \
            Loader(ds_path, batch_size=4, num_workers=0, decode=False, seed=2,
                   shuffle=True) as b, \
            pytest.raises(StateError, match="seed=1, this loader has seed=2"):
        b.load_state_dict(a.state_dict())


def test_iterating_a_closed_loader_is_a_loader_error(ds_path):
    loader = Loader(ds_path, batch_size=4, num_workers=0, decode=False)
    loader.close()
    with pytest.raises(reader.LoaderError, match="closed"):
        iter(loader)
