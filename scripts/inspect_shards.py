"""inspect-shards DST COMMAND: look into a shardpack dataset (thin CLI over formats.summary).

Subcommands are rows of :data:`COMMANDS` (name, handler, configure_parser); add
one by appending a row. Every handler takes the parsed args and returns an exit
status: 0 ok, 1 damaged or bad data, 2 usage. No traceback reaches the user for
bad data or a failing disk: those print ``inspect-shards: error: <message>``.
Names come from files that may hold anything: what cannot be printed as is (a
lone surrogate) is printed escaped (``\udc80``), never crashes the command.

DST may be a URI (``s3://bucket/dataset``): the dataset is read through the local
shard cache (``$SHARDPACK_CACHE``), fetching only what the command needs: the
manifest for ``info``, the small metadata tables for ``ls`` and ``stats``, one
shard for ``show`` and ``extract``, and every shard for ``verify`` (each download
is checked against the manifest's CRC32C, then every record is).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from formats import ShardpackError, verify_dataset
from formats.storage import is_uri
from formats.summary import (
    dataset_info,
    dataset_stats,
    describe_record,
    field_bytes,
    list_records,
)
from reader.dataset import open_dataset

__all__ = ["COMMANDS", "build_parser", "main"]


def _printable(text: str, stream) -> str:
    """``text`` as ``stream`` can encode it: what it cannot, backslash-escaped."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    return text.encode(encoding, "backslashreplace").decode(encoding)


def _say(text: str, stream=None) -> None:
    stream = stream or sys.stdout
    print(_printable(text, stream), file=stream)


def _error(text: str) -> None:
    _say(f"inspect-shards: error: {text}", sys.stderr)


def _emit(args, obj, text: str) -> None:
    if args.json:  # ensure_ascii: any string, lone surrogates too, is printable
        _say(json.dumps(obj, indent=1, sort_keys=True, default=str))
    else:
        _say(text)


def _table(rows: list[list], header: list[str]) -> str:
    cells = [header] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _compact(value) -> str:
    """A provenance value on one line: dicts as ``k=v`` pairs, long text cut."""
    if isinstance(value, dict):
        text = ", ".join(f"{k}={_compact(v)}" for k, v in sorted(value.items()))
    else:
        text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 160 else text[:157] + "..."


# -- info ------------------------------------------------------------------------------

def cmd_info(args) -> int:
    info = dataset_info(args.dst)
    made = info["created_by"] or {}
    rows = [
        ["records", f"{info['records']:,}"],
        ["shards", info["shards"]],
        ["data bytes", f"{_size(info['data_bytes'])} ({info['data_bytes']:,})"],
        ["bytes on disk", _size(info["total_bytes"])],
        ["format version", info["format_version"]],
        ["alignment", info["alignment"]],
        ["classes", "-" if info["classes"] is None else
         f"{len(info['classes'])}: " + ", ".join(info["classes"][:8])
         + (" ..." if len(info["classes"]) > 8 else "")],
    ]
    rows += [[f"made: {k}", _compact(v)] for k, v in sorted(made.items())] or [["made", "-"]]
    fields = [[f["name"], f["type"] + (f" {f['dtype']}{f['shape']}" if "dtype" in f else ""),
               f["compression"] + (f" (dict {f['dictionary']})" if "dictionary" in f else "")]
              for f in info["fields"]]
    _emit(args, info, _table(rows, ["dataset", str(args.dst)]) + "\n\n"
          + _table(fields, ["field", "type", "compression"]))
    return 0


# -- verify ----------------------------------------------------------------------------

def cmd_verify(args) -> int:
    from tqdm import tqdm
    total = dataset_info(args.dst)["data_bytes"]
    with tqdm(total=total, unit="B", unit_scale=True, desc="verify", file=sys.stderr,
              disable=True if args.json or args.quiet else None) as bar:
        problems = verify_dataset(args.dst, progress=bar.update)
    obj = {"ok": not problems, "problems": [p.to_json() for p in problems]}
    if problems:
        rows = [[p.file, p.record, p.field, p.offset, p.what] for p in problems]
        text = (f"DAMAGED: {len(problems)} problem(s)\n"
                + _table(rows, ["file", "record", "field", "offset", "what"]))
    else:
        text = f"ok: every checksum matches ({_size(total)} checked)"
    _emit(args, obj, text)
    return 1 if problems else 0


# -- ls / show / extract -----------------------------------------------------------------

def cmd_ls(args) -> int:
    rows = list_records(args.dst, offset=args.offset, limit=args.limit, label=args.label)
    text = _table([[r["index"], r["key"], r["label"], r["size"],
                    "" if r["width"] is None else f"{r['width']}x{r['height']}"] for r in rows],
                  ["index", "key", "label", "size", "w x h"])
    _emit(args, rows, text)
    return 0


def cmd_show(args) -> int:
    with open_dataset(args.dst, check_crc=True) as ds:
        info = describe_record(ds, args.index)
    rows = []
    for name, f in info["fields"].items():
        if "value" in f:
            shown = repr(f["value"])
        elif "head" in f:
            shown = f"{f['size']:,} bytes, {f['sniffed']}, {f['head']}"
        else:
            shown = f"{f['dtype']} {f['shape']}"
        rows.append([name, f["type"], shown])
    _emit(args, info, f"record {info['index']} ({info['shard']} record {info['record']})\n"
          + _table(rows, ["field", "type", "value"]))
    return 0


def cmd_extract(args) -> int:
    with open_dataset(args.dst, check_crc=True) as ds:
        if args.field not in ds.field_index:
            _error(f"no field {args.field!r}; fields are {[f.name for f in ds.fields]}")
            return 2
        data = field_bytes(ds, args.index, args.field)
    Path(args.out).write_bytes(data)
    _emit(args, {"index": args.index, "field": args.field, "out": str(args.out),
                 "bytes": len(data)}, f"wrote {len(data):,} bytes to {args.out}")
    return 0


# -- stats -------------------------------------------------------------------------------

def _plot(stats: dict, out: str, classes) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("inspect-shards: --plot needs matplotlib: pip install matplotlib") from None
    arrays = stats["arrays"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    labels = stats["labels"]
    axes[0].bar(range(len(labels)), [v["count"] for v in labels.values()])
    axes[0].set_title("records per label")
    axes[0].set_xlabel("label")
    axes[1].hist(arrays["size"] / 1000, bins=50)
    axes[1].set_title("record size (KB)")
    if arrays["width"].size:
        axes[2].scatter(arrays["width"], arrays["height"], s=2, alpha=0.3)
    axes[2].set_title("resolution (width x height)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def cmd_stats(args) -> int:
    stats = dataset_stats(args.dst, with_arrays=bool(args.plot))
    if args.plot:
        _plot(stats, args.plot, None)
        stats.pop("arrays")
    lines = [f"records: {stats['records']:,}", "", _table(
        [[k, v["class"] or "", v["count"]] for k, v in stats["labels"].items()],
        ["label", "class", "records"])]
    dist_rows = [[name, *(("-",) * 6 if d is None else
                          (f"{d['min']:.0f}", f"{d['p10']:.0f}", f"{d['p50']:.0f}",
                           f"{d['p90']:.0f}", f"{d['max']:.0f}", f"{d['mean']:.0f}"))]
                 for name, d in (("size (bytes)", stats["size_bytes"]), ("width", stats["width"]),
                                 ("height", stats["height"]))]
    lines += ["", _table(dist_rows, ["", "min", "p10", "p50", "p90", "max", "mean"])]
    if stats["top_resolutions"]:
        lines += ["", _table([[k, v] for k, v in stats["top_resolutions"].items()],
                             ["resolution", "records"])]
    if args.plot:
        lines += ["", f"plot written to {args.plot}"]
    _emit(args, stats, "\n".join(lines))
    return 0


# -- wiring ------------------------------------------------------------------------------

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


def _conf_ls(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=_count, default=20, help="rows to show (default 20)")
    p.add_argument("--offset", type=_count, default=0, help="skip this many rows")
    p.add_argument("--label", type=int, default=None, help="only records with this label")


def _conf_show(p: argparse.ArgumentParser) -> None:
    p.add_argument("index", type=int, help="global record index")


def _conf_extract(p: argparse.ArgumentParser) -> None:
    p.add_argument("index", type=int, help="global record index")
    p.add_argument("--out", required=True, help="file to write")
    p.add_argument("--field", default="image", help="field to write (default image)")


def _conf_stats(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plot", metavar="FILE.png", help="draw the distributions (needs matplotlib)")


def cmd_monitor_report(args: argparse.Namespace) -> int:
    from reader.monitor_report import monitor_report_command

    return monitor_report_command(args)


def _conf_monitor_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plot", metavar="FILE.png", help="draw a timeline of stage times and "
                   "throughput (needs matplotlib)")


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
     "summarize a Loader monitor record (DST is the .jsonl file the monitor wrote)"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inspect-shards", description=__doc__.splitlines()[0])
    parser.add_argument("dst", metavar="DST", help="the dataset folder, or its URI (s3://...)")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    common.add_argument("--quiet", action="store_true", help="no progress bar")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, handler, configure, help_text in COMMANDS:
        p = sub.add_parser(name, help=help_text, parents=[common])
        configure(p)
        p.set_defaults(handler=handler)
    return parser


def _fetch_remote(args) -> None:
    """Point ``args.dst`` at the cached copy of a remote dataset, with what the command reads."""
    if not is_uri(args.dst) or args.command in ("show", "extract", "monitor-report"):
        return  # show/extract open the remote dataset themselves: one shard is fetched
    ds = open_dataset(args.dst)
    if args.command in ("ls", "stats", "verify"):
        for e in ds.manifest.shards:
            ds.cache.ensure_meta(ds.location, ds.root, e)
    if args.command == "verify":
        for e in ds.manifest.shards:
            ds.cache.ensure(ds.location, ds.root, e)
    args.dst = ds.root


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _fetch_remote(args)
        return args.handler(args)
    except IndexError as exc:  # a record index out of range: a usage error
        _error(str(exc.args[0]) if exc.args else str(exc))
        return 2
    except (ShardpackError, OSError) as exc:
        if args.json:
            _say(json.dumps({"ok": False, "error": str(exc)}))
        _error(str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
