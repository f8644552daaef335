"""A dataset on object storage, read through the local shard cache.

:class:`RemoteDataset` is a :class:`ShardDataset` whose shards are mapped on
first use: opening one pins it in the cache (downloading it if it is not there)
and maps it as usual, so every read after that is the same index lookup and
slice as on a local disk. When the cache cannot hold the whole dataset, each
process keeps at most ``max_open`` shards mapped and unpins the least recently
used, so eviction can make room.

:class:`Prefetcher` downloads the shards a rank's sampler will need next, in
order of first use, a few shards ahead of the batches in flight; it only warms
the cache (a shard it has not fetched yet is downloaded on demand by whoever
reads it first).
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from formats import ShardDataset
from formats.errors import FormatError
from formats.files import atomic_write_bytes
from formats.shard.dataset import default_max_open, read_metadata
from formats.shard.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES
from formats.shard.shard import ShardReader
from formats.storage import Location, Place, open_location
from formats.storage.cache import CacheOptions, Pin
from formats.storage.manifests import decode_remote_manifest

__all__ = ["Prefetcher", "RemoteDataset"]

_log = logging.getLogger("shardpack")



class RemoteDataset(ShardDataset):
    """A read-only dataset at a URI, mapped from a local cache folder.

    Args:
        uri: ``s3://bucket/dataset`` or any URI :func:`formats.storage.open_location` opens.
        cache: the cache folder, its bound and prefetching (default: ``CacheOptions()``).
        filesystem: a ``pyarrow.fs.FileSystem`` to use instead of the URI's own.
        check_crc: as for :class:`ShardDataset` (downloads are always checked).
        max_open: shards each process keeps mapped (default: all of them when the
            cache can hold the dataset, within the open-file limit, else 2).

    Raises:
        StorageError: the manifest cannot be fetched (names the object).
        ManifestError, VersionError: as for a local dataset.
    """

    def __init__(self, uri: str | Place, *, cache: CacheOptions | None = None, filesystem: Any = None,
                 check_crc: bool = True, max_open: int | None = None) -> None:
        self.location: Location = open_location(uri, filesystem)
        self.cache_options = cache or CacheOptions()
        self.cache = self.cache_options.open()
        raw = self.location.read_bytes(MANIFEST_NAME, MAX_MANIFEST_BYTES)
        root = self.cache.dataset_dir(self.location.uri, raw)
        manifest = decode_remote_manifest(self.location, raw, root)
        for name, crc in manifest.dictionaries.values():
            if not (root / name).exists():
                self.location.download(name, root / name, crc=crc)
        if not (root / MANIFEST_NAME).exists():
            atomic_write_bytes(root / MANIFEST_NAME, raw, durable=False)
        self._pins: dict[int, Pin] = {}
        stored = int(manifest.shards.data_bytes.sum() + manifest.shards.index_bytes.sum())
        fits = self.cache.max_bytes is None or stored <= self.cache.max_bytes
        if max_open is None:
            # A pinned shard holds a third descriptor (its lock): two thirds of the
            # local default keep the same share of the open-file limit.
            max_open = min(len(manifest.shards), default_max_open() * 2 // 3) if fits else 2
        super().__init__(root, check_crc=check_crc, max_open=max_open)

    def __repr__(self) -> str:
        return f"Remote{super().__repr__()[:-1]}, uri={self.location.uri!r})"

    # -- lazy, pinned shards (ShardDataset keeps the least-recently-used order) --------

    # Shards may be fetched anew (evicted, or damaged and discarded): new files, same bytes.
    _same_files = False
    local_files = False  # a read of a data file downloads its shard into the cache

    def _forget_shards(self) -> None:
        super()._forget_shards()
        self._pins = {}

    def _open_all(self) -> None:
        pass  # shards are fetched and mapped on first use

    def _map_shard(self, s: int) -> ShardReader:
        """Pin shard ``s`` in the cache (fetching it if needed), then map it.

        ShardDataset unmaps least recently used shards before calling this, so
        their unpinning lets the cache evict to make room.
        """
        entry = self.manifest.shards[s]
        pin = self.cache.acquire(self.location, self.root, entry)
        try:
            try:
                reader = super()._map_shard(s)
            except FormatError:
                # The cached copy went bad after it was checked (a crash before the
                # page cache reached the disk, a bad sector): fetch it again, once.
                pin.release()
                self.cache.discard(self.root, entry)
                pin = self.cache.acquire(self.location, self.root, entry)
                reader = super()._map_shard(s)
        except BaseException:
            pin.release()
            raise
        self._pins[s] = pin
        return reader

    def _close_shard(self, s: int) -> None:
        super()._close_shard(s)
        self._pins.pop(s).release()

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.pop("_pins", None)
        return state

    # -- metadata and prefetching -----------------------------------------------------

    def metadata(self, columns: list[str] | None = None, *,
                 shard: int | None = None) -> pa.Table:
        for e in self.manifest.shards if shard is None else [self.manifest.shards[shard]]:
            self.cache.ensure_meta(self.location, self.root, e)
        return read_metadata(self.root, columns, self.manifest,
                             shards=None if shard is None else [shard])

    def prefetcher(self, batch_of: Callable[[int], np.ndarray], num_batches: int,
                   first_batch: int, processes: int = 1) -> Prefetcher:
        """A started :class:`Prefetcher` for a rank's epoch of ``num_batches`` batches
        (``batch_of(k)``: batch ``k``'s records) from ``first_batch``, for a loader of
        ``processes`` processes that map shards (workers + main)."""
        return Prefetcher(self, batch_of, num_batches, first_batch, processes)


class Prefetcher:
    """Downloads shards in order of first use, ``prefetch_shards`` ahead of the batches issued.

    The order of first use is found as downloads need it, batch by batch (the epoch's
    order is computed, never stored: a billion records cost nothing here until read),
    keeping a bit per shard for those already met. Shards already in the cache are
    left out (one stat each, once per epoch).

    Errors are left for the reader to meet (it retries and raises with the
    object's name); the prefetcher only counts them.
    """

    def __init__(self, ds: RemoteDataset, batch_of: Callable[[int], np.ndarray],
                 num_batches: int, first_batch: int, processes: int = 1) -> None:
        self.ds = ds
        opts = ds.cache_options
        self._batch_of = batch_of
        self._num_batches = num_batches
        self._scanned = first_batch  # batches before this one are in shards / need_batch
        self._met = np.zeros(len(ds.starts) - 1, bool)
        self.shards: list[int] = []  # missing shards, in order of first use
        self.need_batch: list[int] = []  # the batch that first needs each
        self.ahead = opts.prefetch_shards
        if ds.cache.max_bytes is not None:
            # Never prefetch so far ahead that shards fetched early evict each other
            # or the ones every process has mapped.
            largest = int((ds.manifest.shards.data_bytes + ds.manifest.shards.index_bytes).max())
            fit = ds.cache.max_bytes // max(largest, 1)
            self.ahead = max(0, min(self.ahead, fit - processes * ds.max_open - 1))
        self.errors = 0
        self._issued = first_batch
        self._cv = threading.Condition()
        self._stop = False
        self._pool = ThreadPoolExecutor(opts.download_threads, thread_name_prefix="shardpack-fetch")
        self._thread = threading.Thread(target=self._run, name="shardpack-prefetch", daemon=True)
        if self.ahead and first_batch < num_batches:
            self._thread.start()

    def _scan(self, upto: int) -> None:
        """Find the missing shards first used by the batches before ``upto``."""
        ds = self.ds
        while self._scanned < min(upto, self._num_batches) and not self._stop:
            k = self._scanned
            used = np.unique(np.searchsorted(ds.starts, self._batch_of(k), side="right") - 1)
            new = used[~self._met[used]]
            self._met[new] = True
            for s in new.tolist():
                if not ds.cache.present(ds.root, ds.manifest.shards[s]):
                    self.shards.append(s)
                    self.need_batch.append(k)
            self._scanned = k + 1

    def advance(self, issued: int) -> None:
        """Batches before ``issued`` have been handed to the workers."""
        if not self._thread.is_alive():
            return
        with self._cv:
            self._issued = issued
            self._cv.notify()

    def _window_end(self, issued: int) -> int:
        """How far into ``self.shards`` downloads may run once ``issued`` batches were."""
        return bisect.bisect_right(self.need_batch, issued) + self.ahead

    def _run(self) -> None:
        i = 0
        while True:
            with self._cv:
                issued = self._issued
            # Everything first needed up to the batch issued, and shard i, must be known.
            self._scan(issued + 1)
            while len(self.shards) <= i and self._scanned < self._num_batches and not self._stop:
                self._scan(self._scanned + 1)
            if len(self.shards) <= i:
                return  # the epoch's every shard is in the cache or on its way
            with self._cv:
                if self._stop:
                    return
                if i >= self._window_end(self._issued):
                    self._cv.wait(0.5)
                    continue
            self._pool.submit(self._fetch, self.shards[i])
            i += 1

    def _fetch(self, s: int) -> None:
        if self._stop:
            return
        try:
            self.ds.cache.ensure(self.ds.location, self.ds.root, self.ds.manifest.shards[s],
                                 optional=True)
        except Exception as exc:
            self.errors += 1
            if self.errors == 1:  # the reader meets it again, and raises it, in order
                _log.warning("shardpack: prefetching a shard failed (%s); it will be "
                             "fetched when it is read", exc)

    def close(self) -> None:
        """Stop and wait for downloads in progress (before the loader forks workers)."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
