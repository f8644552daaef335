"""The reader's layers (reader/__init__'s docstring): who may import whom, read with ast.

The whole-project rules (no circles between modules or subpackages) live in
tests/test_import_graph.py; these are the reader's own: the order sits below the
Loader's option records, and the runtime never reaches up into the Loader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import reader

ROOT = Path(reader.__file__).resolve().parent


def imports(path: Path) -> list[tuple[str, bool]]:
    """``(absolute module, at the top)`` for every import in ``path``."""
    package = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])
    tree = ast.parse(path.read_text("utf-8"))
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] \
                if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            out.extend((f"{name}.{a.name}" if not node.module else name, id(node) in top)
                       for a in node.names)
        elif isinstance(node, ast.Import):
            out.extend((a.name, id(node) in top) for a in node.names)
    return out


def modules(sub: str) -> list[Path]:
    return sorted((ROOT / sub).rglob("*.py"))


@pytest.mark.parametrize("path", modules("batching"), ids=lambda p: p.name)
def test_the_order_imports_no_layer_above_it(path):
    bad = [m for m, _ in imports(path)
           if m.startswith(("reader.options", "reader.loader", "reader.runtime",
                            "reader.transforms"))]
    assert not bad, f"{path.name} imports {bad}: the order sits below them"


@pytest.mark.parametrize("path", modules("runtime"), ids=lambda p: p.name)
def test_the_runtime_never_imports_the_loader(path):
    bad = [m for m, _ in imports(path) if m.startswith(("reader.loader", "reader.options"))]
    assert not bad, f"{path.name} imports {bad}: the runtime is called by the Loader, never calls it"


def test_the_option_records_import_what_they_check_at_the_top():
    lazy = [m for m, top in imports(ROOT / "options.py") if not top and m.startswith("reader")]
    assert not lazy, f"reader/options.py imports {lazy} inside functions"
