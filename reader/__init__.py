"""Reading packed datasets: random access, and a multiprocess loader into shared memory.

``open_dataset(path)`` gives random access; ``Loader(path, batch_size, ...)`` gives
batches (dict of field -> numpy array) built by worker processes straight into a
ring of shared-memory slots (see :mod:`reader.loader` for the protocol).
``reader.__version__`` is the installed shardpack's version, the one
``pack-dataset --version`` and ``inspect-shards --version`` print.
"""

from formats.version import package_version

from .data.cache import CacheOptions
from .data.dataset import open_dataset, read_many
from .errors import LoaderError, LoaderTimeoutError, WorkerDiedError, WorkerError
from .loader import Loader
from .monitor.diagnosis import Thresholds
from .monitor.monitor import Monitor, disable_monitor, enable_monitor
from .options import DecodeOptions, SamplerOptions, WorkerOptions
from .order.sampler import Sampler
from .order.tokens import TokenBlocks
from .pipeline.collate import Padded, Ragged
from .pipeline.sample import Annotations, FieldDecoder
from .runtime.decoded_cache import DecodedCacheOptions
from .runtime.sinks import CpuSink
from .runtime.slots import FieldLayout, SlotLayout, SlotRing
from .runtime.timing import BatchTiming

__version__ = package_version()  # "0+unknown" in a source checkout that is not installed

__all__ = [
    "Annotations",
    "BatchTiming",
    "CacheOptions",
    "CpuSink",
    "DecodeOptions",
    "DecodedCacheOptions",
    "FieldDecoder",
    "FieldLayout",
    "Loader",
    "LoaderError",
    "LoaderTimeoutError",
    "Monitor",
    "Padded",
    "Ragged",
    "Sampler",
    "SamplerOptions",
    "SlotLayout",
    "SlotRing",
    "Thresholds",
    "TokenBlocks",
    "WorkerDiedError",
    "WorkerError",
    "WorkerOptions",
    "__version__",
    "disable_monitor",
    "enable_monitor",
    "open_dataset",
    "read_many",
]

