"""What `pip install` puts in site-packages: formats, packer and reader, never `scripts`."""

from __future__ import annotations

import ast
import importlib
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LIBRARY = ("formats", "packer", "reader")


def test_only_the_library_packages_are_installed():
    """setuptools' packages.find rule: dotted names of folders with __init__.py, fnmatch'ed."""
    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    tops = [d for d in ROOT.iterdir() if (d / "__init__.py").is_file()]
    found = [".".join(p.parent.relative_to(ROOT).parts) for d in tops for p in d.rglob("__init__.py")]
    installed = [n for n in found
                 if any(fnmatchcase(n, pat) for pat in find["include"])
                 and not any(fnmatchcase(n, pat) for pat in find.get("exclude", ()))]
    assert "scripts" in found and "formats" in installed
    assert {n.split(".")[0] for n in installed} == set(LIBRARY), installed


def test_console_scripts_live_in_the_library():
    for name, target in PYPROJECT["project"]["scripts"].items():
        module, _, attr = target.partition(":")
        assert module.split(".")[0] in LIBRARY, (name, target)
        assert callable(getattr(importlib.import_module(module), attr)), (name, target)


def test_library_code_never_imports_scripts():
    offenders = []
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                         else [])
                offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                              if n == "scripts" or n.startswith("scripts.")]
    assert offenders == []


def test_every_install_hint_names_an_extra_that_exists():
    """`pip install 'shardpack[X]'` in the library, the scripts, the README or the docs names an extra
    of pyproject.toml; plots (matplotlib) have theirs."""
    import re

    extras = PYPROJECT["project"]["optional-dependencies"]
    files = [p for d in (*LIBRARY, "scripts") for p in sorted((ROOT / d).rglob("*.py"))]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {(str(p.relative_to(ROOT)), m) for p in [*files, *pages]
             for m in re.findall(r"shardpack\[([\w-]+)\]", p.read_text())}
    assert {m for _, m in named} >= {"plot", "ray", "gpu"}
    assert [(f, m) for f, m in sorted(named) if m not in extras] == []
    assert any(d.startswith("matplotlib") for d in extras["plot"])
