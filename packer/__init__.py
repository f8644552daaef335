"""The packer: turns small-file datasets into sharded, indexed record files.

``pack(src, dst, PackOptions(...), progress)`` is the library call;
``pack-dataset`` (:mod:`packer.cli`) is its command line. ``pack_samples(fn, inputs,
dst, PackOptions(...))`` packs what a user's function makes of each input
(:mod:`packer.samples`, its schema rules in :mod:`packer.schema`), through the same
pack loop, with the same options.

Modules, in the order a pack meets them: ``options`` (the frozen
:class:`PackOptions`), ``resolve`` (``--from``/``--to``: which source SRC is, which
sink), ``sources/`` (the listed sources: image folders, folders of any files, file
lists, COCO annotations, as a ``Listing``), ``remote`` (SRC or DST on object
storage) and ``source_copy`` (a local copy of a remote container), ``destination``
(claiming DST), ``plan`` (order, fingerprint, what each payload goes through),
``work`` (per-file read/parse/re-encode and its worker pool), ``loop`` (the ordered,
resumable write loop), ``run`` (``pack``), ``samples``, ``sample_runs`` and
``schema`` (``pack_samples``), ``engines/`` (the range driver, its ranges on disk,
the local process pool and Ray: ``--engine ray`` needs the ``ray`` extra, imported
only then), ``report`` (counters, progress callback, summary) and ``cli``.

Plugging in codecs (``formats/codecs/registry.py``)
-------------------------------------------
``--from X`` / ``--to Y`` are resolved by :mod:`packer.resolve`: the built-in
sources ``imagefolder``, ``files``, ``filelist``, ``coco`` first, and the sink ``shards``
(our :class:`formats.DatasetWriter`); every other name is asked of the module
``formats.codecs.registry``, imported lazily (when it is missing, the user is told
"format X not available"). It may define:

``open_source(name: str, path: pathlib.Path, options: Mapping[str, Any]) -> formats.Source``
    A :class:`formats.base.Source` (``fields``, ``classes``, ``__iter__`` of
    :class:`formats.Record`, ``__len__`` when known, for the progress total).
    Raise ``KeyError`` for a name it does not know. Records are written as
    given: ``record.fields`` must match ``fields``; ``record.meta`` may hold
    ``width``/``height``. Iteration order must be stable (``--resume`` skips the
    first N records of a fresh iterator).

``open_sink(name: str, path: pathlib.Path, fields: tuple[Field, ...], classes: tuple[str, ...] | None, options: Mapping[str, Any]) -> formats.Sink``
    A context manager with ``write(record: Record)``; a clean exit completes the
    output. ``KeyError`` for an unknown name. ``--resume`` is refused for sinks
    other than ``shards``.

``SOURCES``, ``SINKS`` (optional)
    Tuples of the names it reads and writes: an unknown ``--from``/``--to`` is then
    refused before anything is read or written, with the closest name and every
    choice; without them a name is checked when it is opened.

``detect(path: pathlib.Path) -> str | None`` (optional)
    The codec name for SRC (a ``.tfrecord`` file, a folder of ``.tar`` files, a
    folder with ``manifest.json``...), or None to let the built-in rules decide.

``options`` holds ``shard_size``, ``records_per_shard``, ``overwrite``,
``on_error`` and ``durable``.
"""

from .errors import DestinationError, PackError, PackInputError, PackInterrupted, UsageError
from .options import PackOptions, parse_size
from .report import PackProgress, PackSummary, format_summary
from .run import pack
from .samples import pack_samples

__all__ = [
    "DestinationError",
    "PackError",
    "PackInputError",
    "PackInterrupted",
    "PackOptions",
    "PackProgress",
    "PackSummary",
    "UsageError",
    "format_summary",
    "pack",
    "pack_samples",
    "parse_size",
]
