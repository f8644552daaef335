"""The reader's own errors: the loader's failures, and images that do not decode.

Each is a :class:`formats.ShardpackError` (the one root of shardpack's errors) that
keeps the standard base code catches: a :class:`LoaderError` is a ``RuntimeError``,
a :class:`DecodeError` a ``ValueError``, a :class:`StateError` (a state
``load_state_dict`` cannot resume from) a ``ValueError``. A wrong value passed to the
reader (a Loader option, ``set_epoch``'s epoch) is a :class:`formats.ArgumentError`, or
a :class:`formats.ArgumentTypeError` (a ``TypeError`` too) for a wrong type, raised
where it is given. Bad data in a dataset raises the ``formats`` errors.

A data error found in a worker (a corrupt JPEG, a damaged record) is re-raised in
the main process as the original :class:`formats.ShardpackError` subclass, which
names shard and record, with a note saying which worker found it. Anything else a
worker raises (a bug in a user transform) becomes a :class:`WorkerError` that
names the worker, its pid and the record, and carries the original traceback text.
"""

from __future__ import annotations

from formats.errors import ArgumentError, ShardpackError

__all__ = ["DecodeError", "LedgerError", "LoaderError", "LoaderTimeoutError", "MonitorRecordError",
           "MonitorSinkError", "RegionError", "StateError", "WorkerDiedError", "WorkerError"]


class DecodeError(ShardpackError, ValueError):
    """Encoded bytes that cannot be decoded; the loader adds shard and record."""


class StateError(ArgumentError):
    """A state handed to ``load_state_dict`` that this reader cannot resume from
    exactly: not a state (``{}``, ``None``), or saved with another order, batching,
    partitioning or dataset; the message names what differs."""


class LoaderError(ShardpackError, RuntimeError):
    """Base class for loader failures that are not bad data."""

    def __reduce__(self):
        # Rebuilt from the message, then its attributes (a WorkerError's worker, pid, ...),
        # as a RuntimeError pickles: the root's reduce passes location keywords that
        # WorkerError does not take.
        return (type(self), (self.message,), self.__dict__)


class WorkerError(LoaderError):
    """A worker raised while building a batch.

    Attributes:
        worker: the worker id (0-based).
        pid: its process id.
        record: the global record index it was working on (None if not known).
        exc_type: the original exception's class name.
        traceback: the original traceback, as text.
    """

    def __init__(self, message: str, *, worker: int | None = None, pid: int | None = None,
                 record: int | None = None, exc_type: str | None = None,
                 traceback: str | None = None) -> None:
        super().__init__(message)
        self.worker = worker
        self.pid = pid
        self.record = record
        self.exc_type = exc_type
        self.traceback = traceback


class WorkerDiedError(LoaderError):
    """A worker process exited without being asked to (killed, crashed, out of memory)."""


class LoaderTimeoutError(LoaderError):
    """No batch arrived within the loader's ``timeout`` although every worker is alive."""


class RegionError(DecodeError):
    """libjpeg-turbo refused the data (the message is its own); the decoder re-raises
    it as the whole-image path's ``DecodeError``, naming the bytes."""


class MonitorRecordError(ShardpackError, ValueError):
    """A monitor record file is missing, empty, or has a malformed line."""


class MonitorSinkError(ShardpackError, OSError):
    """A monitor's metric sink cannot start or write: its port is in use, its log folder
    cannot be created or written, no W&B run is active (:mod:`reader.monitor.sinks`).
    An ``OSError``, as the failure underneath mostly is; the message names the port or
    folder."""


class LedgerError(ShardpackError, ValueError):
    """A ledger file (``Loader(ledger=path)``) cannot be opened, appended to or read, is
    not a shardpack ledger, or holds another run's steps (:mod:`reader.ledger`)."""
