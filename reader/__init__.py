"""Reading packed datasets: random access, and a multiprocess loader into shared memory.

``open_dataset(path)`` gives random access; ``Loader(path, batch_size, ...)`` gives
batches (dict of field -> numpy array) built by worker processes straight into a
ring of shared-memory slots (see :mod:`reader.loader` for the protocol).
``reader.__version__`` is the installed shardpack's version, the one
``pack-dataset --version`` and ``inspect-shards --version`` print.

This module exports what the README teaches. The stages behind it live in
subpackages: :mod:`reader.data` (opening datasets, local or remote),
:mod:`reader.batching` (which records make each batch), :mod:`reader.transforms` (what a
worker does to each sample), :mod:`reader.runtime` (the processes, slots and sinks)
and :mod:`reader.monitor`; :mod:`reader.inspect` is ``inspect-shards``.

Layering (DESIGN.md, "Layers call downward and hear upward"), from the top:

* :class:`Loader` (:mod:`reader.loader`) is assembly: it checks its keywords into
  the records of :mod:`reader.options`, builds the order (:mod:`reader.batching`), the
  batch plan with its pipeline (:func:`reader.runtime.plan.plan_batch` over
  :mod:`reader.transforms`) and a :class:`reader.runtime.runtime.Runtime`, then
  iterates. It keeps the cursor rules of ``iter()``, ``set_epoch`` and the state.
* the runtime owns the ring, the worker pool, the sink (CPU or CUDA), the decoded
  cache, the shard prefetch and ``num_workers="auto"``'s scaler. The Loader calls
  it downward (start an epoch at a position, next batch, resize, close); it calls
  nothing above it, and what happens in it (a batch timed, the worker count
  changed) goes upward as events to its listeners (the monitor).
* the pipeline (decode, the per-kind kernels, the bad-input policy) runs inside
  the workers, the order is a pure function of (seed, epoch, rank, world_size),
  and both import neither the runtime nor the Loader. Over several datasets
  (:class:`Mix`) the order has a plan above the per-dataset orders
  (:mod:`reader.batching.mixture`): one global stream whose every position maps to a
  source and a record by pure functions, so a state names positions, not ranks, and
  resumes at another world size; :mod:`reader.data.mixed` presents the sources to the
  runtime as one dataset, and :mod:`reader.ledger` (a listener) hashes what was served.
* the option records (:mod:`reader.options`: every record of the Loader's
  keywords) sit below them all and import nothing of the reader, so each layer
  takes its record from there; the checks that need a layer's types (the
  transforms, annotations, decoders, collate) live beside those types
  (:mod:`reader.transforms.checks`) and the Loader runs them at construction.
"""

from formats.storage.cache import CacheOptions
from formats.version import package_version

from .batching import AspectRatioBatches, BudgetBatches, Mix, TokenBlocks
from .data.dataset import open_dataset, read_many
from .errors import (
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
from .loader import Loader
from .monitor import Monitor, Thresholds, disable_monitor, enable_monitor
from .options import DecodedCacheOptions, DeviceOptions
from .torch_adapter import TorchLoader
from .transforms import (
    CenterCrop,
    ImagePipeline,
    Normalize,
    Pad,
    PadToMultiple,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    ResizeShortestEdge,
    SampleTransform,
    UserTransform,
)
from .transforms.collate import Padded, Ragged
from .transforms.sample import Annotations, FieldDecoder

__version__ = package_version()  # "0+unknown" in a source checkout that is not installed

__all__ = [
    "Annotations",
    "AspectRatioBatches",
    "BudgetBatches",
    "CacheOptions",
    "CenterCrop",
    "DecodeError",
    "DecodedCacheOptions",
    "DeviceOptions",
    "FieldDecoder",
    "ImagePipeline",
    "LedgerError",
    "Loader",
    "LoaderError",
    "LoaderTimeoutError",
    "Mix",
    "Monitor",
    "MonitorRecordError",
    "MonitorSinkError",
    "Normalize",
    "Pad",
    "PadToMultiple",
    "Padded",
    "Ragged",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "RegionError",
    "Resize",
    "ResizeShortestEdge",
    "SampleTransform",
    "StateError",
    "Thresholds",
    "TokenBlocks",
    "TorchLoader",
    "UserTransform",
    "WorkerDiedError",
    "WorkerError",
    "__version__",
    "disable_monitor",
    "enable_monitor",
    "open_dataset",
    "read_many",
]
