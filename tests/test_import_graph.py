"""The house rules of the import graph (DESIGN.md, "The data path").

The graph is read from the source with ``ast``, so it holds every import a module
can run: at the top, inside functions (lazy imports) and relative ones. Two rules:

* no import circle between modules of ``formats``, ``packer`` and ``reader``, not
  even through an import inside a function;
* layers: ``formats`` imports neither ``packer`` nor ``reader``, and ``packer`` and
  ``reader`` never import each other.

A module importing its own package (or a package importing its own modules) is not
an edge here: that is how a package's face works, and Python runs the package's
``__init__`` first in either order.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGES = ("formats", "packer", "reader")
# Who may import whom: a package's own modules always; these others besides.
ALLOWED = {"formats": set(), "packer": {"formats"}, "reader": {"formats"}}


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


def graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules it imports (anywhere in its source)."""
    out: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
            if isinstance(node, ast.Import):
                wanted = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                # "from a import b": b may be a module of a (an edge to it) or a name
                # a defines (the edge is to a).
                wanted = [stem] + [f"{stem}.{a.name}" for a in node.names]
            else:
                continue
            for w in wanted:
                target = _resolve(w, mods)
                if target is None or target == name:
                    continue
                if target.startswith(name + ".") or name.startswith(target + "."):
                    continue  # a package and its own modules (module docstring)
                targets.add(target)
        out[name] = targets
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
def edges():
    return graph(modules(_root()))


def test_no_module_imports_another_that_imports_it_back(edges):
    found = cycles(edges)
    assert not found, "import circles (a shared type or a dispatcher in the wrong module; " \
        "cut them):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_formats_imports_no_orchestrator_and_packer_and_reader_never_each_other(edges):
    assert not layer_breaks(edges)


def test_the_graph_covers_every_package_and_sees_lazy_imports(edges):
    assert {m.split(".")[0] for m in edges} == set(PACKAGES)
    # packer.run imports the remote module only inside pack(): the edge is there.
    assert "packer.remote" in edges["packer.run"]


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
    assert cycles(edges) == [("formats.codecs.a", "formats.codecs.b")]


def test_a_lower_layer_importing_a_higher_one_is_found(tmp_path):
    mods = _tree(tmp_path, {
        "formats/__init__.py": "def f():\n    import packer.run\n",
        "packer/__init__.py": "", "packer/run.py": "from formats import f\n",
        "reader/__init__.py": "from packer import run\n",
    })
    assert layer_breaks(graph(mods)) == ["formats -> packer.run", "reader -> packer",
                                         "reader -> packer.run"]
