"""The handlers of ``inspect-shards`` (:mod:`reader.inspect.cli`) and their tables.

Each ``cmd_*`` takes the parsed arguments and returns an exit status: 0 ok, 1
damaged or bad data, or anything else found by reading DATASET (a record index out of
range, a field or a label it does not have): one line, through :func:`refuse`.
Usage (status 2, with the usage block) is argparse's alone: what the command line
says by itself. The figures come from :mod:`formats.shard.summary` and
:func:`formats.verify_dataset`; this module only formats them (a table for
people, ``--json`` for scripts); a record's values print as one line each,
excerpted (``show``). Names and values come from files that may hold anything:
what cannot be printed as is (a lone surrogate) is printed escaped (``\\udc80``).
Files the user names (``extract --out``, ``stats --plot``) get their missing
parent folders created; ``extract`` never replaces an existing file unless
``--force`` (it says which). The file ``extract`` names in a folder holds the field's
name, which comes from the dataset: it is mapped by :func:`formats.names.safe_name`
(``../../x`` becomes ``x``; nothing is written outside the folder), and a mapped
name that meets an existing file is refused as any other.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from formats import verify_dataset
from formats.names import safe_name
from formats.shard.summary import (
    dataset_info,
    dataset_stats,
    default_field,
    describe_record,
    extension_of,
    field_bytes,
    list_records,
    resolve_label,
)
from formats.shard.verify import ALL_MATCH

from ..data.dataset import open_dataset

__all__ = ["cmd_extract", "cmd_info", "cmd_ledger_diff", "cmd_ls", "cmd_monitor_report",
           "cmd_show", "cmd_stats", "cmd_verify", "error", "refuse", "say"]


def _printable(text: str, stream) -> str:
    """``text`` as ``stream`` can encode it: what it cannot, backslash-escaped."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    return text.encode(encoding, "backslashreplace").decode(encoding)


def say(text: str, stream=None) -> None:
    """Print ``text`` on ``stream`` (stdout), escaping what it cannot encode."""
    stream = stream or sys.stdout
    print(_printable(text, stream), file=stream)


def error(text: str) -> None:
    """Print ``inspect-shards: error: <text>`` on stderr."""
    say(f"inspect-shards: error: {text}", sys.stderr)


def refuse(args: argparse.Namespace, message: str) -> int:
    """Report what DATASET does not allow (with ``--json``, also as ``{"ok": false}`` on
    stdout); returns exit status 1."""
    if getattr(args, "json", False):
        say(json.dumps({"ok": False, "error": message}))
    error(message)
    return 1


def _emit(args, obj, text: str) -> None:
    if args.json:  # ensure_ascii: any string, lone surrogates too, is printable
        say(json.dumps(obj, indent=1, sort_keys=True, default=str))
    else:
        say(text)


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


def _out_path(out: str | Path) -> Path:
    """A file the user asked for, with its missing parent folders created."""
    path = Path(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # a file where a folder should be
        raise NotADirectoryError(f"cannot write {path}: a part of {path.parent} is a file, "
                                 "not a folder") from None
    return path


# -- info ------------------------------------------------------------------------------

def cmd_info(args: argparse.Namespace) -> int:
    info = dataset_info(args.dst, follow_symlinks=args.follow_symlinks,
                        fetch_index=getattr(args, "fetch_index", None))
    made = info["created_by"] or {}
    rows = [
        ["records", f"{info['records']:,}"],
        ["shards", f"{info['shards']:,}"],
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
    text = (_table(rows, ["dataset", str(args.dst)]) + "\n\n"
            + _table(fields, ["field", "type", "compression"]))
    if info.get("field_lengths"):
        text += "\n\n" + _ragged_table(info["field_lengths"])
    _emit(args, info, text)
    return 0


def _mmm(d: dict | None) -> str:
    """min / median / max of a distribution, or ``-``."""
    return "-" if d is None else f"{d['min']:,.0f} / {d['p50']:,.0f} / {d['max']:,.0f}"


def _ragged_table(lengths: dict) -> str:
    rows = []
    for name, d in lengths.items():
        if d["unit"] == "elements":
            rows.append([name, _mmm(d.get("rows")), _mmm(d["lengths"]),
                         f"{d['elements_total']:,}",
                         f"{d['malformed']:,} malformed" if d["malformed"] else ""])
        else:  # compressed: its stored sizes say nothing of its shape
            rows.append([name, "-", "-", "-", f"{d['compression']}: stored bytes "
                         f"{_mmm(d['lengths'])}"])
    return _table(rows, ["variable-shape array", "rows min/median/max",
                         "elements min/median/max", "elements total", "note"])


# -- verify ----------------------------------------------------------------------------

def cmd_verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    total = dataset_info(args.dst, follow_symlinks=args.follow_symlinks)["data_bytes"]
    with tqdm(total=total, unit="B", unit_scale=True, desc="verify", file=sys.stderr,
              disable=True if args.json or args.quiet else None) as bar:
        problems = verify_dataset(args.dst, progress=bar.update,
                                  follow_symlinks=args.follow_symlinks)
    obj = {"ok": not problems, "problems": [p.to_json() for p in problems]}
    if problems:
        rows = [[p.file, p.record, p.field, p.offset, p.what] for p in problems]
        text = (f"DAMAGED: {len(problems)} problem(s)\n"
                + _table(rows, ["file", "record", "field", "offset", "what"]))
        if not args.follow_symlinks and any(
                (Path(args.dst) / p.file).is_symlink() for p in problems):
            text += ("\nsome files are symlinks out of the dataset folder: "
                     "pass --follow-symlinks to check the files they point to")
    else:
        text = f"{ALL_MATCH} ({_size(total)} checked)"
    _emit(args, obj, text)
    return 1 if problems else 0


# -- ls / show / extract -----------------------------------------------------------------

def cmd_ls(args: argparse.Namespace) -> int:
    label = args.label
    if label is not None:
        classes = dataset_info(args.dst, follow_symlinks=args.follow_symlinks)["classes"]
        try:
            label = resolve_label(classes, label)
        except ValueError as exc:  # names no class of this dataset
            return refuse(args, str(exc))
    rows = list_records(args.dst, offset=args.offset, limit=args.limit, label=label,
                        follow_symlinks=args.follow_symlinks)
    text = _table([[r["index"], r["key"], r["label"], r["size"],
                    "" if r["width"] is None else f"{r['width']}x{r['height']}"] for r in rows],
                  ["index", "key", "label", "size", "w x h"])
    _emit(args, rows, text)
    return 0


def _number(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else repr(v)


def _audio(a: dict) -> str:
    if "error" in a:
        return f"{a['kind']}, {a['error']}"
    parts = [a["kind"]]
    if "duration_s" in a:
        parts.append(f"{a['duration_s']:.2f} s")
        if "present_s" in a:
            parts.append(f"truncated: {a['present_s']:.2f} s present")
    parts += [f"{a['sample_rate']} Hz", f"{a['channels']} ch"]
    if "bits" in a:
        parts.append(f"{a['bits']} bit")
    if "bitrate_kbps" in a:
        parts.append(f"{a['bitrate_kbps']} kbit/s")
    return ", ".join(parts)


def _shown(f: dict) -> str:
    """One field of :func:`describe_record` on one line."""
    if "value" in f:
        return repr(f["value"])
    if "excerpt" in f:  # str, or json as its compact text
        cut = "..." if f["truncated"] else ""
        if f["type"] == "str":
            return f"{f['excerpt']!r}{cut} ({f['length']:,} chars)"
        items = "" if "items" not in f else \
            f", {f['items']:,} {'keys' if f['json_type'] == 'object' else 'items'}"
        return f"{f['excerpt']}{cut} ({f['json_type']}{items}, {f['length']:,} chars)"
    if "dtype" in f:
        shape = "x".join(map(str, f["shape"])) if f["shape"] else "scalar"
        schema = "" if None not in f["schema_shape"] else \
            " of [" + ", ".join("None" if d is None else str(d) for d in f["schema_shape"]) + "]"
        values = ", ".join(_number(v) for v in f["values"])
        more = ", ..." if f["elements"] > len(f["values"]) else ""
        rng = f", min {_number(f['min'])} max {_number(f['max'])}" if "min" in f else ""
        return f"{f['dtype']} {shape}{schema}: [{values}{more}]{rng}"
    text = f"{f['size']:,} bytes, "
    if "audio" in f:
        return text + _audio(f["audio"])
    if "width" in f:
        return text + f"{f['sniffed']} {f['width']}x{f['height']}, {f['head']}"
    return text + f"{f['sniffed']}, {f.get('image_error', f['head'])}"


def cmd_show(args: argparse.Namespace) -> int:
    with open_dataset(args.dst, check_crc=True, follow_symlinks=args.follow_symlinks) as ds:
        info = describe_record(ds, args.index)
    rows = [[name, f["type"], _shown(f)] for name, f in info["fields"].items()]
    _emit(args, info, f"record {info['index']} ({info['shard']} record {info['record']})\n"
          + _table(rows, ["field", "type", "value"]))
    return 0


# INDEX.FIELD.EXT within a file name's 255 bytes: 20 digits, two dots, an extension of 10.
_FIELD_NAME_BYTES = 200


def _is_folder(out: str) -> bool:
    return out.endswith(("/", "\\")) or Path(out).is_dir()


def cmd_extract(args: argparse.Namespace) -> int:
    with open_dataset(args.dst, check_crc=True, follow_symlinks=args.follow_symlinks) as ds:
        field = args.field
        if field is None:
            try:
                field = default_field(ds)
            except ValueError as exc:
                return refuse(args, str(exc))
        if field not in ds.field_index:
            return refuse(args, f"no field {field!r}; fields are {[f.name for f in ds.fields]}")
        data = field_bytes(ds, args.index, field)
        out, mapped = Path(args.out), ""
        if _is_folder(args.out):
            index = args.index % len(ds)  # named by position, also for a negative index
            ext = extension_of(ds, args.index, field)
            # The field name comes from the dataset: mapped by the one rule for names
            # that become paths, so "../x" names a file in --out, never beside it.
            name = safe_name(field, "field", limit=_FIELD_NAME_BYTES)
            out = out / f"{index}.{name}{'' if name.lower().endswith(ext) else ext}"
            if name != field:
                mapped = f" (the file name for field {field!r}, made safe)"
    if os.path.lexists(out) and not args.force:  # a link too: never written through
        return refuse(args, f"{out} exists{mapped}: pass --force to overwrite it")
    _out_path(out).write_bytes(data)
    _emit(args, {"index": args.index, "field": field, "out": str(out), "bytes": len(data)},
          f"wrote {len(data):,} bytes to {out}")
    return 0


# -- stats -------------------------------------------------------------------------------

def _plot(stats: dict, out: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("inspect-shards: --plot needs matplotlib: pip install "
                         "'shardpack[plot]'") from None
    arrays = stats["arrays"]
    lengths = arrays["field_lengths"]
    # The first row as always; then one histogram per variable-size field, three a row.
    extra = -(-len(lengths) // 3)
    fig, axes = plt.subplots(1 + extra, 3, figsize=(15, 4 * (1 + extra)), squeeze=False)
    labels = stats["labels"]
    axes[0, 0].bar(range(len(labels)), [v["count"] for v in labels.values()])
    axes[0, 0].set_title("records per label")
    axes[0, 0].set_xlabel("label")
    axes[0, 1].hist(arrays["size"] / 1000, bins=50)
    axes[0, 1].set_title("record size (KB)")
    if arrays["width"].size:
        axes[0, 2].scatter(arrays["width"], arrays["height"], s=2, alpha=0.3)
    axes[0, 2].set_title("resolution (width x height)")
    cells = [ax for row in axes[1:] for ax in row]
    for ax, (name, values) in zip(cells, lengths.items()):  # noqa: B905 - spare cells stay
        ax.hist(values, bins=min(50, max(1, len(np.unique(values)))))
        ax.set_title(f"{name}: {stats['field_lengths'][name]['unit']} per record")
    for ax in cells[len(lengths):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(_out_path(out), dpi=100)
    plt.close(fig)


def cmd_stats(args: argparse.Namespace) -> int:
    stats = dataset_stats(args.dst, with_arrays=bool(args.plot),
                          follow_symlinks=args.follow_symlinks,
                          fetch_index=getattr(args, "fetch_index", None),
                          max_shards=None if args.all else args.shards)
    if args.plot:
        _plot(stats, args.plot)
        stats.pop("arrays")
    lines = [f"records: {stats['records']:,}"]
    sample = stats["sampled"]
    if sample:
        lines.append(f"sampled: {sample['shards']:,} of {sample['of_shards']:,} shards at "
                     f"random (seed {sample['seed']}), {sample['records']:,} records: the "
                     "figures below describe these; --all reads every shard")
    lines += ["", _table(
        [[k, v["class"] or "", v["count"]] for k, v in stats["labels"].items()],
        ["label", "class", "records"]) if stats["labels"] else "labels: none"]
    dist_rows = [[name, *(("-",) * 6 if d is None else
                          (f"{d['min']:.0f}", f"{d['p10']:.0f}", f"{d['p50']:.0f}",
                           f"{d['p90']:.0f}", f"{d['max']:.0f}", f"{d['mean']:.0f}"))]
                 for name, d in (("size (bytes)", stats["size_bytes"]), ("width", stats["width"]),
                                 ("height", stats["height"]))]
    lines += ["", _table(dist_rows, ["", "min", "p10", "p50", "p90", "max", "mean"])]
    if stats["field_lengths"]:
        lines += ["", _lengths_table(stats["field_lengths"])]
    if stats["top_resolutions"]:
        lines += ["", _table([[k, v] for k, v in stats["top_resolutions"].items()],
                             ["resolution", "records"])]
    if args.plot:
        lines += ["", f"plot written to {args.plot}"]
    _emit(args, stats, "\n".join(lines))
    return 0


def _lengths_table(lengths: dict) -> str:
    rows = []
    for name, d in lengths.items():
        q = d["lengths"]
        figures = ("-",) * 7 if q is None else (
            f"{q['min']:.0f}", f"{q['p10']:.0f}", f"{q['p50']:.0f}", f"{q['p90']:.0f}",
            f"{q['max']:.0f}", f"{q['mean']:.0f}", f"{q['total']:,}")
        rows.append([name, d["unit"], *figures])
    return _table(rows, ["field size", "unit", "min", "p10", "p50", "p90", "max", "mean",
                         "total"])


# -- ledger-diff -------------------------------------------------------------------------

def cmd_ledger_diff(args: argparse.Namespace) -> int:
    """Compare two ledger logs (``Loader(ledger=path)``): 0 when they agree, 1 naming
    the first step and rank where they differ."""
    from ..ledger import diff_ledgers, read_ledger

    a, b = args.dst, args.other
    diff = diff_ledgers(a, b)
    steps = read_ledger(a)
    ranks = sorted({rank for rank, _ in steps})
    if args.json:
        print(json.dumps({"same": diff is None, "steps": len(steps), "ranks": ranks,
                          "first_difference": diff}))
        return 0 if diff is None else 1
    if diff is None:
        say(f"the ledgers agree: {len(steps)} steps of {len(ranks)} rank(s)")
        return 0

    def side(line) -> str:
        if line is None:
            return "no such step"
        return f"epoch {line['epoch']} batch {line['batch']}, hash {line['hash']}"

    say(f"first difference at step {diff['step']} of rank {diff['rank']}:\n"
        f"  {a}: {side(diff['a'])}\n  {b}: {side(diff['b'])}")
    return 1


# -- monitor-report ----------------------------------------------------------------------

def cmd_monitor_report(args: argparse.Namespace) -> int:
    from ..monitor.report import monitor_report_command

    if getattr(args, "plot", None):
        args.plot = _out_path(args.plot)  # missing folders made, as for stats --plot
    return monitor_report_command(args)
