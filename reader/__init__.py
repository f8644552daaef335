"""Reading packed datasets: random access, and a multiprocess loader into shared memory.

``open_dataset(path)`` gives random access; ``Loader(path, batch_size, ...)`` gives
batches (dict of field -> numpy array) built by worker processes straight into a
ring of shared-memory slots (see :mod:`reader.loader` for the protocol).
"""

from .cache import CacheOptions
from .dataset import open_dataset, read_many
from .errors import LoaderError, LoaderTimeoutError, WorkerDiedError, WorkerError
from .loader import CpuSink, Loader
from .options import DecodeOptions, SamplerOptions, WorkerOptions
from .sampler import Sampler
from .slots import FieldLayout, SlotLayout, SlotRing
from .timing import BatchTiming

__all__ = [
    "BatchTiming",
    "CacheOptions",
    "CpuSink",
    "DecodeOptions",
    "FieldLayout",
    "Loader",
    "LoaderError",
    "LoaderTimeoutError",
    "Sampler",
    "SamplerOptions",
    "SlotLayout",
    "SlotRing",
    "WorkerDiedError",
    "WorkerError",
    "WorkerOptions",
    "disable_monitor",
    "enable_monitor",
    "open_dataset",
    "read_many",
]


def enable_monitor(*args, **kwargs):
    """See :func:`reader.monitor.enable_monitor` (imported on first use)."""
    from .monitor import enable_monitor as _enable

    return _enable(*args, **kwargs)


def disable_monitor() -> None:
    """See :func:`reader.monitor.disable_monitor`."""
    from .monitor import disable_monitor as _disable

    _disable()
