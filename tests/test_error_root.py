"""One exception root: every error formats/ and packer/ raise on purpose is a
ShardpackError, and keeps the standard base users catch today."""

from __future__ import annotations

import importlib
import inspect
import pickle
from pathlib import Path

import pytest

from formats.codecs.tfexample import decode_example
from formats.errors import (
    ArgumentError,
    ArgumentTypeError,
    CacheError,
    CorruptRecordError,
    DatasetNotFoundError,
    DecompressionError,
    DuplicateKeyError,
    ExampleError,
    FormatError,
    InputError,
    InputUsageError,
    KeyLookupError,
    ManifestError,
    MissingFileError,
    MissingObjectError,
    ObjectTooLargeError,
    RecordIndexError,
    SchemaError,
    ShardpackError,
    StorageError,
    UnknownFormatError,
    UnknownKeyError,
    UnsafePathError,
    URIError,
    VersionError,
)
from packer import DestinationError, PackError, PackInputError, PackInterrupted, UsageError
from reader.errors import (
    DecodeError,
    LedgerError,
    LoaderError,
    LoaderTimeoutError,
    MonitorRecordError,
    MonitorSinkError,
    RegionError,
    StateError,
    WorkerDiedError,
    WorkerError,
)

ROOT = Path(__file__).resolve().parents[1]

# Each public error and the standard bases code catching it today relies on.
BASES = {
    FormatError: (ValueError,), VersionError: (ValueError,), ManifestError: (ValueError,),
    SchemaError: (ValueError,), CorruptRecordError: (ValueError,),
    DecompressionError: (ValueError,), InputError: (ValueError,),
    InputUsageError: (ValueError,), UnsafePathError: (ValueError,),
    StorageError: (ValueError,), MissingObjectError: (ValueError,),
    ObjectTooLargeError: (ValueError,), URIError: (ValueError,),
    DatasetNotFoundError: (ValueError, FileNotFoundError),
    KeyLookupError: (ValueError, KeyError), UnknownKeyError: (ValueError, KeyError),
    DuplicateKeyError: (ValueError, KeyError),
    UnknownFormatError: (ValueError, KeyError), ExampleError: (ValueError,),
    PackError: (ValueError,), UsageError: (ValueError,), DestinationError: (ValueError,),
    PackInputError: (ValueError,),
    ArgumentError: (ValueError,), ArgumentTypeError: (ValueError, TypeError),
    RecordIndexError: (IndexError,), MissingFileError: (ValueError, FileNotFoundError),
    DecodeError: (ValueError,), RegionError: (ValueError,), StateError: (ValueError,),
    LoaderError: (RuntimeError,), WorkerError: (RuntimeError,),
    WorkerDiedError: (RuntimeError,), LoaderTimeoutError: (RuntimeError,),
    MonitorRecordError: (ValueError,), LedgerError: (ValueError,),
    MonitorSinkError: (OSError,),
    CacheError: (OSError,),
}


def test_the_root_is_an_exception_of_its_own_not_a_value_error():
    assert ShardpackError.__bases__ == (Exception,)
    assert not issubclass(ShardpackError, ValueError)


@pytest.mark.parametrize("cls", list(BASES), ids=lambda c: c.__name__)
def test_every_public_error_is_a_shardpack_error_keeping_its_standard_bases(cls):
    assert issubclass(cls, ShardpackError)
    for base in BASES[cls]:
        assert issubclass(cls, base), f"{cls.__name__} is no longer a {base.__name__}"


def test_an_interrupted_pack_stays_a_keyboard_interrupt_outside_the_root():
    assert issubclass(PackInterrupted, KeyboardInterrupt)
    assert not issubclass(PackInterrupted, ShardpackError)


def _modules(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield importlib.import_module(".".join(parts))


@pytest.mark.parametrize("package", ["formats", "packer", "reader"])
def test_every_error_class_a_package_defines_is_under_the_root(package):
    errors = {}
    for module in _modules(package):
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) \
                    and obj.__module__ == module.__name__ and name.endswith("Error"):
                errors[f"{module.__name__}.{name}"] = obj
    assert errors  # the sweep found the errors it checks
    outside = sorted(n for n, cls in errors.items() if not issubclass(cls, ShardpackError))
    assert not outside, f"errors outside ShardpackError: {outside}"
    for cls in errors.values():
        if cls is not ShardpackError:
            assert cls in BASES, f"{cls.__name__}: say which standard bases it keeps (BASES)"


def test_errors_render_and_pickle_as_before():
    exc = UnknownFormatError("unknown source format 'zip'; known: tfrecord")
    assert str(exc) == "unknown source format 'zip'; known: tfrecord"  # not KeyError's repr
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is UnknownFormatError and str(again) == str(exc)
    with pytest.raises(ExampleError, match="varint runs past the end") as info:
        decode_example(b"\x0a")
    assert isinstance(info.value, ValueError) and isinstance(info.value, ShardpackError)


@pytest.mark.parametrize("package", ["formats", "packer", "reader"])
def test_every_public_error_is_defined_in_its_package_errors_module_and_on_its_face(package):
    """One place per error, one spelling: a package's errors live in its ``errors.py``
    and are imported from the package itself (``from formats import UnknownKeyError``)."""
    face = importlib.import_module(package)
    errors = importlib.import_module(f"{package}.errors")
    elsewhere, missing = [], []
    for module in _modules(package):
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, ShardpackError) \
                    and obj.__module__ == module.__name__ and not name.startswith("_"):
                if module is not errors:
                    elsewhere.append(f"{module.__name__}.{name}")
                if name not in face.__all__:
                    missing.append(name)
    assert not elsewhere, f"errors defined outside {package}/errors.py: {elsewhere}"
    assert not missing, f"errors {package} does not export: {missing}"

