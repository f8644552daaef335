"""The house rules of the import graph (DESIGN.md, "The data path").

The graph is read from the source with ``ast``, so it holds every import a module
can run: at the top, inside functions (lazy imports) and relative ones. The rules:

* no import circle between modules of ``formats``, ``packer`` and ``reader``, not
  even through an import inside a function;
* no circle between the parts of a package either: a package's parts are its
  modules and its subpackages, and a subpackage imports another part when any
  module inside it does (``formats.shard`` and ``formats.storage``;
  ``packer.destination`` and ``packer.engines``), at the top or inside a function;
* no import inside a function that only dodges a circle: a lazy import ``A -> B``
  where ``B`` (or ``B``'s part) imports ``A`` (or ``A``'s part) back at module
  level, directly or through a chain. Such an import keeps a circle open that
  Python would refuse at import time; the cure is to move the shared record or
  constant down to a module both sides can import. (A lazy import that defers a
  cost, such as an optional dependency or a module only some calls need, dodges
  nothing and stays.)
* layers: ``formats`` imports neither ``packer`` nor ``reader``, and ``packer`` and
  ``reader`` never import each other.

A module importing its own package (or a package importing its own modules) is not
an edge here: that is how a package's face works, and Python runs the package's
``__init__`` first in either order.
"""

from __future__ import annotations

import ast
from collections import deque
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple

import pytest

PACKAGES = ("formats", "packer", "reader")
# Who may import whom: a package's own modules always; these others besides.
ALLOWED = {"formats": set(), "packer": {"formats"}, "reader": {"formats"}}
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _root() -> Path:
    here = Path(__file__).resolve().parent
    while not (here / "pyproject.toml").exists():
        here = here.parent
    return here


def modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Module name -> source file, for every ``.py`` under ``packages``."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The longest prefix of the dotted ``name`` that is one of ``mods``."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        candidate = ".".join(parts[:k])
        if candidate in mods:
            return candidate
    return None


class Import(NamedTuple):
    """One edge of the graph where the source spells it.

    Attributes:
        source, target: the importing module and the module it imports.
        line: the line of the import statement in ``source``.
        lazy: inside a function (runs at the first call, not when ``source`` is imported).
    """

    source: str
    target: str
    line: int
    lazy: bool


def _statements(tree: ast.AST):
    """Every import statement of ``tree``, with whether it sits inside a function."""
    todo = [(tree, False)]
    while todo:
        node, lazy = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, lazy
            todo.append((child, lazy or isinstance(child, _FUNCTIONS)))


def imports(mods: dict[str, Path]) -> list[Import]:
    """Every import of one of ``mods`` by another, sorted."""
    out: set[Import] = set()
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, lazy in _statements(ast.parse(path.read_text("utf-8"), str(path))):
            if isinstance(node, ast.Import):
                wanted = [a.name for a in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                # "from a import b": b may be a module of a (an edge to it) or a name
                # a defines (the edge is to a).
                wanted = [stem] + [f"{stem}.{a.name}" for a in node.names]
            for w in wanted:
                target = _resolve(w, mods)
                if target is None or target == name:
                    continue
                if target.startswith(name + ".") or name.startswith(target + "."):
                    continue  # a package and its own modules (module docstring)
                out.add(Import(name, target, node.lineno, lazy))
    return sorted(out)


def graph(mods: dict[str, Path], *, lazy: bool = True) -> dict[str, set[str]]:
    """Module -> the modules it imports (anywhere in its source; with ``lazy=False``,
    only at module level)."""
    return _edges(mods, imports(mods), lazy=lazy)


def _edges(mods, sites: list[Import], *, lazy: bool = True) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {name: set() for name in mods}
    for s in sites:
        if lazy or not s.lazy:
            out[s.source].add(s.target)
    return out


def cycles(edges: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Every group of modules that import each other, around a circle (Tarjan's
    strongly connected components of more than one module), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(tuple(sorted(group)))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def packages(mods: dict[str, Path]) -> list[str]:
    """The names of ``mods`` that are packages (an ``__init__.py``)."""
    return sorted(name for name, path in mods.items() if path.name == "__init__.py")


def part_of(package: str, module: str) -> str | None:
    """The part of ``package`` (a module or subpackage directly in it) that holds
    ``module``; None when ``module`` is not inside ``package``."""
    if not module.startswith(package + "."):
        return None
    return f"{package}.{module[len(package) + 1:].split('.')[0]}"


def _part_edges(edges: dict[str, set[str]], package: str) -> dict[str, dict[str, tuple[str, str]]]:
    """Part of ``package`` -> the parts it imports, each with one module edge that shows it."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for a in sorted(edges):
        pa = part_of(package, a)
        if pa is None:
            continue
        out.setdefault(pa, {})
        for b in sorted(edges[a]):
            pb = part_of(package, b)
            if pb is not None and pb != pa:
                out[pa].setdefault(pb, (a, b))
    return out


def part_graph(edges: dict[str, set[str]], package: str) -> dict[str, set[str]]:
    """The parts of ``package`` (its modules and subpackages) -> the parts they import:
    an import by or of any module inside a subpackage is one by or of the subpackage."""
    return {a: set(bs) for a, bs in _part_edges(edges, package).items()}


def part_cycles(edges: dict[str, set[str]], mods: dict[str, Path]) -> list[tuple[str, ...]]:
    """Every group of parts of one package that import each other around a circle."""
    return sorted(c for p in packages(mods) for c in cycles(part_graph(edges, p)))


def _chain(edges: dict, start: str, goal: str) -> list[str] | None:
    """The shortest path ``start -> ... -> goal`` along ``edges``, or None."""
    came: dict[str, str | None] = {start: None}
    todo = deque([start])
    while todo:
        v = todo.popleft()
        if v == goal:
            path = [v]
            while came[path[-1]] is not None:
                path.append(came[path[-1]])
            return path[::-1]
        for w in sorted(edges.get(v, ())):
            if w not in came:
                came[w] = v
                todo.append(w)
    return None


def _common_package(a: str, b: str, mods: dict[str, Path]) -> str | None:
    """The innermost package holding both ``a`` and ``b`` (in different parts of it)."""
    pa, pb = a.split("."), b.split(".")
    k = 0
    while k < min(len(pa), len(pb)) and pa[k] == pb[k]:
        k += 1
    while k:
        name = ".".join(pa[:k])
        if name in mods and mods[name].name == "__init__.py":
            return name
        k -= 1
    return None


def lazy_dodges(mods: dict[str, Path], sites: list[Import]) -> list[str]:
    """Every import inside a function whose target imports its source back at module
    level (directly or through a chain), as modules or as parts of their common
    package: the lazy import is what keeps that circle from failing at import time."""
    top = _edges(mods, sites, lazy=False)
    found, seen = [], set()
    # One line per statement, naming its innermost target ("from a import b": a.b).
    for s in sorted(sites, key=lambda s: (s.source, s.line, -s.target.count("."))):
        if not s.lazy or (s.source, s.line) in seen:
            continue
        where = f"{s.source}:{s.line} imports {s.target} inside a function"
        back = _chain(top, s.target, s.source)
        if back is not None:
            found.append(f"{where}; it imports {s.source} back at module level: "
                         + " -> ".join(back))
            seen.add((s.source, s.line))
            continue
        package = _common_package(s.source, s.target, mods)
        if package is None:
            continue
        parts = _part_edges(top, package)
        mine, theirs = part_of(package, s.source), part_of(package, s.target)
        back = _chain(parts, theirs, mine)
        if back is not None:
            shown = ", ".join(" -> ".join(parts[x][y]) for x, y in pairwise(back))
            found.append(f"{where}; {theirs} imports {mine} back at module level: {shown}")
            seen.add((s.source, s.line))
    return found


def layer_breaks(edges: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import of a package that ``a``'s package may not import."""
    out = []
    for a, targets in sorted(edges.items()):
        top = a.split(".")[0]
        for b in sorted(targets):
            other = b.split(".")[0]
            if other != top and other not in ALLOWED[top]:
                out.append(f"{a} -> {b}")
    return out


@pytest.fixture(scope="module")
def mods():
    return modules(_root())


@pytest.fixture(scope="module")
def sites(mods):
    return imports(mods)


@pytest.fixture(scope="module")
def edges(mods, sites):
    return _edges(mods, sites)


def test_no_module_imports_another_that_imports_it_back(edges):
    found = cycles(edges)
    assert not found, "import circles (a shared type or a dispatcher in the wrong module; " \
        "cut them):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_circle_between_the_subpackages_and_modules_of_a_package(edges, mods):
    found = part_cycles(edges, mods)
    shown = []
    for group in found:  # each with every import that makes it
        package = group[0].rpartition(".")[0]
        shown.append(" <-> ".join(group) + "".join(
            f"\n    {a} -> {b}" for a in sorted(edges) for b in sorted(edges[a])
            if part_of(package, a) in group and part_of(package, b) in group
            and part_of(package, a) != part_of(package, b)))
    assert not found, "circles between the parts of a package (move the shared record " \
        "or constant down to where both sides can import it):\n" + "\n".join(shown)


def test_no_import_inside_a_function_only_dodges_a_circle(mods, sites):
    found = lazy_dodges(mods, sites)
    assert not found, "lazy imports that keep a circle open (move what both sides " \
        "need down instead):\n" + "\n".join(found)


def test_formats_imports_no_orchestrator_and_packer_and_reader_never_each_other(edges):
    assert not layer_breaks(edges)


def test_the_graph_covers_every_package_and_sees_lazy_imports(edges, sites):
    assert {m.split(".")[0] for m in edges} == set(PACKAGES)
    # packer.run imports the remote module only inside pack(): the edge is there, lazy
    # (it defers a module most packs never need, and dodges nothing).
    assert "packer.remote" in edges["packer.run"]
    assert {s.lazy for s in sites if (s.source, s.target) == ("packer.run", "packer.remote")} \
        == {True}
    assert {"packer.engines", "packer.sources"} <= set(packages(modules(_root())))


def _tree(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules(root, ("formats", "packer", "reader"))


def test_a_circle_through_an_import_inside_a_function_is_found(tmp_path):
    mods = _tree(tmp_path, {
        "formats/__init__.py": "",
        "formats/codecs/__init__.py": "",
        "formats/codecs/a.py": "from .b import thing\n",
        "formats/codecs/b.py": "def f():\n    from . import a\n    return a\nthing = 1\n",
        "formats/c.py": "from formats import codecs\nfrom .codecs import a\n",
        "packer/__init__.py": "", "reader/__init__.py": "",
    })
    edges = graph(mods)
    assert edges["formats.codecs.b"] == {"formats.codecs.a"}
    assert edges["formats.c"] == {"formats.codecs", "formats.codecs.a"}
    assert graph(mods, lazy=False)["formats.codecs.b"] == set()
    assert cycles(edges) == [("formats.codecs.a", "formats.codecs.b")]
    assert lazy_dodges(mods, imports(mods)) == [
        "formats.codecs.b:2 imports formats.codecs.a inside a function; it imports "
        "formats.codecs.b back at module level: formats.codecs.a -> formats.codecs.b"]


def test_a_circle_between_subpackages_is_found_where_no_module_circle_is(tmp_path):
    # shard.column -> storage.location; storage.manifests -> shard.manifest (lazily);
    # and a plain module in the circle: packer.destination -> engines -> loop -> destination.
    mods = _tree(tmp_path, {
        "formats/__init__.py": "",
        "formats/shard/__init__.py": "", "formats/storage/__init__.py": "",
        "formats/shard/column.py": "from ..storage.location import Location\n",
        "formats/shard/manifest.py": "NAME = 'manifest.json'\n",
        "formats/storage/location.py": "class Location: pass\n",
        "formats/storage/manifests.py": "def f():\n    from formats.shard import manifest\n",
        "formats/media.py": "from .shard import manifest\n",
        "packer/__init__.py": "", "packer/engines/__init__.py": "",
        "packer/destination.py": "from .engines.ranges import STATE_DIR\n",
        "packer/engines/ranges.py": "STATE_DIR = '.state'\n",
        "packer/engines/driver.py": "from ..loop import pack_listing\n",
        "packer/loop.py": "from .destination import WORK\n",
        "reader/__init__.py": "",
    })
    edges = graph(mods)
    assert cycles(edges) == []
    assert part_graph(edges, "formats") == {
        "formats.media": {"formats.shard"}, "formats.shard": {"formats.storage"},
        "formats.storage": {"formats.shard"}}
    assert part_cycles(edges, mods) == [
        ("formats.shard", "formats.storage"),
        ("packer.destination", "packer.engines", "packer.loop")]
    # The lazy import in storage keeps the first circle from failing at import time.
    assert lazy_dodges(mods, imports(mods)) == [
        "formats.storage.manifests:2 imports formats.shard.manifest inside a function; "
        "formats.shard imports formats.storage back at module level: "
        "formats.shard.column -> formats.storage.location"]


def test_a_lazy_import_that_dodges_no_circle_is_allowed(tmp_path):
    # packer.run defers packer.remote (a cost most packs never pay); remote imports
    # packer.loop, not run: no circle, lazy or not.
    mods = _tree(tmp_path, {
        "formats/__init__.py": "", "reader/__init__.py": "",
        "packer/__init__.py": "from .run import pack\n",
        "packer/run.py": "from .loop import x\ndef pack():\n    from .remote import up\n",
        "packer/remote.py": "from .loop import x\nfrom packer import errors\nup = 1\n",
        "packer/loop.py": "x = 1\n", "packer/errors.py": "",
    })
    edges = graph(mods)
    assert edges["packer.run"] == {"packer.loop", "packer.remote"}
    assert cycles(edges) == [] and part_cycles(edges, mods) == []
    assert lazy_dodges(mods, imports(mods)) == []


def test_a_lazy_import_dodging_a_chain_is_found(tmp_path):
    mods = _tree(tmp_path, {
        "formats/__init__.py": "", "packer/__init__.py": "",
        "reader/__init__.py": "",
        "reader/options.py": "def check():\n    from .runtime.cache import Cache\n",
        "reader/runtime/__init__.py": "",
        "reader/runtime/cache.py": "Cache = 1\n",
        "reader/runtime/plan.py": "from ..order.batching import B\n",
        "reader/order/__init__.py": "",
        "reader/order/batching.py": "from reader.options import _int\nB = 1\n",
    })
    edges = graph(mods)
    assert cycles(edges) == []
    assert part_cycles(edges, mods) == [("reader.options", "reader.order", "reader.runtime")]
    assert lazy_dodges(mods, imports(mods)) == [
        "reader.options:2 imports reader.runtime.cache inside a function; reader.runtime "
        "imports reader.options back at module level: reader.runtime.plan -> "
        "reader.order.batching, reader.order.batching -> reader.options"]


def test_a_lower_layer_importing_a_higher_one_is_found(tmp_path):
    mods = _tree(tmp_path, {
        "formats/__init__.py": "def f():\n    import packer.run\n",
        "packer/__init__.py": "", "packer/run.py": "from formats import f\n",
        "reader/__init__.py": "from packer import run\n",
    })
    assert layer_breaks(graph(mods)) == ["formats -> packer.run", "reader -> packer",
                                         "reader -> packer.run"]
