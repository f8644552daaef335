"""MkDocs hook: the reference pages that are generated from the code, so they cannot drift.

A page holds a marker and the hook replaces it at build time:

- ``<!-- cli: pack-dataset -->`` / ``<!-- cli: inspect-shards -->``: the ``--help`` of the
  command and of each of its subcommands, from the argparse parsers themselves;
- ``<!-- errors -->``: one table per package face of its public error classes, their
  standard bases (what an ``except`` clause of the standard library catches) and the
  first line of their docstrings, read from the classes;
- ``<!-- metrics -->``: the monitor's table of metrics, each figure's name, meaning,
  default limit (the report's threshold column) and the path it exists on, read from
  ``reader.monitor.report.METRICS`` and ``Thresholds``: a guide explains the table
  without a second copy of what each figure means;
- ``<!-- include: FORMAT.md -->``: a document of the repository's root, included whole
  (one copy of each fact), its links to other files of the repository made site links
  (``FORMAT.md``, ``BENCHMARKS.md``) or code (``scripts/bench.py``), since the site holds
  only ``docs/``. A link to a file that does not exist is left as it is, and fails the
  strict build.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The root documents the site shows, and their pages (relative to docs/).
PAGES = {"FORMAT.md": "reference/format.md", "BENCHMARKS.md": "benchmarks.md",
         "README.md": "index.md"}
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s#]+)(#[^)\s]*)?\)")

MARKER = re.compile(r"<!-- (cli: [\w-]+|errors|metrics|include: [\w.-]+) -->")
ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc):(`[^`]+`)")


def _help(parser: argparse.ArgumentParser) -> str:
    # A fixed width: the page must not depend on the terminal that built it.
    os.environ["COLUMNS"] = "100"
    return parser.format_help()


def cli_markdown(command: str) -> str:
    """``--help`` of ``command`` and of each of its subcommands, as fenced text blocks."""
    if command == "pack-dataset":
        from packer.cli import build_parser
        parsers = [("pack-dataset", build_parser())]
    elif command == "inspect-shards":
        from reader.inspect.cli import build_parser
        top = build_parser()
        parsers = [("inspect-shards", top)]
        for action in top._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers += [(f"inspect-shards DATASET {name}", sub)
                            for name, sub in action.choices.items()]
    else:
        raise ValueError(f"no command line named {command!r} (pack-dataset, inspect-shards)")
    out = []
    for title, parser in parsers:
        heading = "##" if " " not in title else "###"
        out += [f"{heading} `{title}`", "", "```text", _help(parser).rstrip(), "```", ""]
    return "\n".join(out)


def errors_markdown() -> str:
    """A table per package face: each public error, its standard bases, what it means."""
    import formats
    import packer
    import reader

    out = []
    for face in (formats, packer, reader):
        rows = []
        for name in face.__all__:
            obj = getattr(face, name)
            if not (isinstance(obj, type) and issubclass(obj, BaseException)):
                continue
            ours = [b.__name__ for b in obj.__mro__[1:]
                    if b.__module__.split(".")[0] in ("formats", "packer", "reader")]
            std = [b.__name__ for b in obj.__mro__[1:]
                   if b.__module__ == "builtins" and b not in (Exception, BaseException, object)]
            doc = (inspect.getdoc(obj) or "").split("\n\n")[0].replace("\n", " ").replace("|", "\\|")
            doc = ROLE.sub(r"\1", doc).replace("``", "`")  # reST roles and literals, as Markdown
            rows.append(f"| `{face.__name__}.{name}` | {', '.join(f'`{b}`' for b in ours) or '—'}"
                        f" | {', '.join(f'`{b}`' for b in std) or '—'} | {doc} |")
        out += [f"## `{face.__name__}`", "",
                "| error | shardpack bases | standard bases (what catches it) | meaning |",
                "| --- | --- | --- | --- |", *rows, ""]
    return "\n".join(out)


def metrics_markdown() -> str:
    """The monitor's metrics as a table: name, meaning, default limit, where it exists."""
    from reader.monitor.diagnosis import Thresholds
    from reader.monitor.report import METRICS

    defaults = Thresholds()
    rows = ["| metric | what it measures | threshold (default, `Thresholds` attribute) |",
            "| --- | --- | --- |"]
    for m in METRICS:
        limit = (f"{m.op} {getattr(defaults, m.limit):g} (`{m.limit}`)" if m.limit else "—")
        only = f" Only with `{m.only}`." if m.only else ""
        meaning = m.meaning.replace("|", "\\|")
        rows.append(f"| `{m.key}` | {meaning[:1].upper()}{meaning[1:]}.{only} | {limit} |")
    return "\n".join(rows) + "\n"


def include_markdown(name: str, page_path: str) -> str:
    """The root document ``name``, its relative links pointed at the site's pages."""
    depth = page_path.count("/")  # the page's folder, relative to docs/

    def link(m: re.Match) -> str:
        text, target, anchor = m.group(1), m.group(2), m.group(3) or ""
        if "://" in target or target.startswith("mailto:") or not (ROOT / target).exists():
            return m.group(0)
        if target in PAGES:
            return f"[{text}]({'../' * depth}{PAGES[target]}{anchor})"
        return text if text.strip("`") == target else f"{text} (`{target}`)"
    return LINK.sub(link, (ROOT / name).read_text())


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Replace each marker with what it names."""
    def render(m: re.Match) -> str:
        kind, _, arg = m.group(1).partition(": ")
        if kind == "errors":
            return errors_markdown()
        if kind == "metrics":
            return metrics_markdown()
        if kind == "include":
            return include_markdown(arg, page.file.src_uri)
        return cli_markdown(arg)
    return MARKER.sub(render, markdown)


HTML_ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj):(?=<code>)")


def on_page_content(html: str, page, config, files) -> str:
    """The docstrings mark names with reST roles (``:class:`X```, as STYLE.md's Google
    style allows): show the name as code, without the role's prefix."""
    return HTML_ROLE.sub("", html)
