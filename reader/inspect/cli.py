"""inspect-shards: look into a shardpack dataset (the console script over formats.shard.summary).

``inspect-shards DATASET COMMAND [options]`` and ``inspect-shards COMMAND DATASET [options]``
are the same command. When the first word is a command name and the second is
not, the command comes first; otherwise (``inspect-shards info ls``: a dataset
folder named ``info``?) the first word is the dataset, as it always was.

Subcommands are rows of :data:`COMMANDS` (name, handler, configure_parser, help);
add one by appending a row. Handlers live in :mod:`reader.inspect.commands`; each
returns an exit status: 0 ok, 1 damaged or bad data or anything else found by
reading DATASET (a record index out of range, a field it does not have), 2 usage: the
command line by itself (argparse, with the usage block). No traceback reaches the
user for bad data or a failing disk: those print one line,
``inspect-shards: error: <message>``.

DATASET may be a URI (``s3://bucket/dataset``): the dataset is read through the local
shard cache (``$SHARDPACK_CACHE``), fetching only what the command needs: the
manifest for ``info``, the small metadata tables for ``ls`` and ``stats``, one
shard for ``show`` and ``extract``, and every shard for ``verify`` (each download
is checked against the manifest's CRC32C, then every record is). ``stats``, and
``info`` on a dataset with variable-shape arrays, also read every index file (about
24 bytes per record and field), for the lengths of variable-size fields.

A local dataset whose files are symlinks to files outside its folder is refused
unless ``--follow-symlinks`` (FORMAT.md, §8).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from formats import ShardpackError, UnsafePathError
from formats.storage import is_uri, local_path
from formats.version import package_version

from ..data.dataset import open_dataset
from .commands import (
    cmd_extract,
    cmd_info,
    cmd_ledger_diff,
    cmd_ls,
    cmd_monitor_report,
    cmd_show,
    cmd_stats,
    cmd_verify,
    refuse,
)

__all__ = ["COMMANDS", "build_parser", "main"]

_DATASET_HELP = "the dataset folder, or its URI (s3://...)"
# stats reads every shard's metadata table (about 0.6 ms each here): a sample of this
# many answers in about a second, at any shard count.
STATS_SHARDS = 2000


def _conf_none(p: argparse.ArgumentParser) -> None:
    pass


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text}")
    return value


def _positive(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more: {text}")
    return value


def _conf_ls(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=_count, default=20, help="rows to show (default 20)")
    p.add_argument("--offset", type=_count, default=0, help="skip this many rows")
    p.add_argument("--label", default=None, metavar="LABEL",
                   help="only records with this label: a class name as `info` shows it, or "
                        "a label number (a class named exactly LABEL wins)")


def _conf_show(p: argparse.ArgumentParser) -> None:
    p.add_argument("index", type=int, help="global record index")


def _conf_extract(p: argparse.ArgumentParser) -> None:
    p.add_argument("index", type=int, help="global record index")
    p.add_argument("--out", required=True,
                   help="file to write, or a folder (an existing one, or a path ending in /) "
                        "to write INDEX.FIELD.EXT in; missing folders are created")
    p.add_argument("--field", default=None,
                   help="field to write (default: image, or the only image field)")
    p.add_argument("--force", action="store_true",
                   help="overwrite the file if it exists (refused by default, naming it)")


def _conf_stats(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shards", type=_positive, default=STATS_SHARDS, metavar="N",
                   help=f"read at most N shards, a random sample of a larger dataset "
                        f"(default {STATS_SHARDS:,}; its figures then describe the sample, "
                        "and say so)")
    p.add_argument("--all", action="store_true", help="read every shard, however many")
    p.add_argument("--plot", metavar="FILE.png", help="draw the distributions (needs "
                   "matplotlib: pip install 'shardpack[plot]'; missing folders are created)")


def _conf_monitor_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("more", nargs="*", metavar="FILE", help="more ranks' record files (or "
                   "folders of them): each summarized, and the slowest rank named")
    p.add_argument("--plot", metavar="FILE.png", help="draw a timeline of stage times and "
                   "throughput (needs matplotlib: pip install 'shardpack[plot]')")


def _conf_ledger_diff(p: argparse.ArgumentParser) -> None:
    p.add_argument("other", metavar="OTHER", help="the ledger to compare with (DATASET is "
                   "the first ledger: a file a Loader wrote with ledger=PATH)")


#: (name, handler, configure_parser, help): one row per subcommand.
COMMANDS: list[tuple[str, Callable[[argparse.Namespace], int],
                     Callable[[argparse.ArgumentParser], None], str]] = [
    ("info", cmd_info, _conf_none, "summary: records, shards, bytes, schema, classes, provenance"),
    ("verify", cmd_verify, _conf_none, "check every checksum; exit 1 listing damaged records"),
    ("ls", cmd_ls, _conf_ls, "list records from the metadata table"),
    ("show", cmd_show, _conf_show, "one record's fields"),
    ("extract", cmd_extract, _conf_extract, "write one field of one record to a file"),
    ("stats", cmd_stats, _conf_stats, "label histogram, size and resolution distributions"),
    ("monitor-report", cmd_monitor_report, _conf_monitor_report,
     "summarize a Loader monitor record (give the .jsonl file the monitor wrote as DATASET; "
     "several ranks' files, or a folder of them, are compared)"),
    ("ledger-diff", cmd_ledger_diff, _conf_ledger_diff,
     "compare two Loader ledgers (LEDGER ledger-diff OTHER): the first step and rank "
     "where they differ"),
]


def build_parser(command_first: bool = False) -> argparse.ArgumentParser:
    """The parser for ``DATASET COMMAND ...``, or for ``COMMAND DATASET ...`` if ``command_first``."""
    parser = argparse.ArgumentParser(
        prog="inspect-shards",
        description="Look into a shardpack dataset: summary, checksums, records, statistics.",
        usage="%(prog)s [-h] [--version] DATASET COMMAND ... (or: %(prog)s COMMAND DATASET ...)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    if not command_first:
        parser.add_argument("dst", metavar="DATASET", help=_DATASET_HELP)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    common.add_argument("--follow-symlinks", action="store_true",
                        help="read dataset files that are symlinks to files outside its folder "
                             "(refused by default)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                prog="inspect-shards" if command_first else "inspect-shards DATASET")
    for name, handler, configure, help_text in COMMANDS:
        p = sub.add_parser(name, help=help_text, parents=[common])
        if command_first:
            p.add_argument("dst", metavar="DATASET", help=_DATASET_HELP)
        configure(p)
        p.set_defaults(handler=handler)
    return parser


def _is_command_first(argv: Sequence[str]) -> bool:
    names = {c[0] for c in COMMANDS}
    return bool(argv) and argv[0] in names and (len(argv) < 2 or argv[1] not in names)


def _fetch_remote(args: argparse.Namespace) -> None:
    """Point ``args.dst`` at the cached copy of a remote dataset, with what the command reads."""
    args.fetch_index = None  # index files are read in args.dst
    if not is_uri(args.dst) or args.command in ("show", "extract", "monitor-report",
                                                 "ledger-diff"):
        return  # show/extract open the remote dataset themselves: one shard is fetched
    ds = open_dataset(args.dst)
    if args.command in ("info", "stats"):
        location = ds.location
        # Read in memory, not through the cache: the cache holds whole shards only.
        args.fetch_index = lambda e: location.read_bytes(e.index_file, limit=e.index_bytes)
    if args.command in ("ls", "stats", "verify"):
        for e in ds.manifest.shards:
            ds.cache.ensure_meta(ds.location, ds.root, e)
    if args.command == "verify":
        for e in ds.manifest.shards:
            ds.cache.ensure(ds.location, ds.root, e)
    args.dst = ds.root


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``inspect-shards`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(command_first=_is_command_first(argv))
    args = parser.parse_args(argv)
    args.dst = str(local_path(args.dst))  # file:///data/ds is the folder /data/ds
    if args.follow_symlinks and is_uri(args.dst):
        parser.error("--follow-symlinks applies to local datasets only "
                     "(a remote dataset's cache holds no links)")
    try:
        _fetch_remote(args)
        return args.handler(args)
    except BrokenPipeError:  # `inspect-shards DATASET ls | head`: the reader has all it wanted
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - nothing more is flushed to the pipe
        return 0
    except IndexError as exc:  # a record index out of range: found by reading DATASET
        return refuse(args, str(exc.args[0]) if exc.args else str(exc))
    except (ShardpackError, OSError) as exc:
        message = str(exc)
        if _links_out(exc, args):
            message += " (inspect-shards: pass --follow-symlinks)"
        return refuse(args, message)


def _links_out(exc: BaseException, args: argparse.Namespace) -> bool:
    """Whether ``--follow-symlinks`` would get past ``exc``: a refusal of a dataset
    file that is a symlink, and no other (a name such as ``../x.arrow`` is refused
    whatever the flag says). The dataset folder itself may always be a link."""
    path = getattr(exc, "path", None)
    return (isinstance(exc, UnsafePathError) and not args.follow_symlinks
            and path is not None and os.path.islink(path)
            and os.path.abspath(path) != os.path.abspath(args.dst))


if __name__ == "__main__":
    sys.exit(main())
