"""The reader's layers (reader/__init__'s docstring): who may import whom, read with ast.

The whole-project rules (no circles between modules or subpackages) live in
tests/test_import_graph.py; these are the reader's own: the option records sit at
the bottom and import nothing of the reader, the order sits below the pipeline,
the runtime and the Loader, and the runtime never reaches up into the Loader.
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
           if m.startswith(("reader.loader", "reader.runtime", "reader.transforms"))]
    assert not bad, f"{path.name} imports {bad}: the order sits below them"


@pytest.mark.parametrize("path", modules("runtime"), ids=lambda p: p.name)
def test_the_runtime_never_imports_the_loader(path):
    bad = [m for m, _ in imports(path) if m.startswith("reader.loader")]
    assert not bad, f"{path.name} imports {bad}: the runtime is called by the Loader, never calls it"


def test_the_option_records_import_nothing_of_the_reader():
    # Every layer imports its records from reader.options, so it imports no layer,
    # at the top or inside a function: no circle, and none dodged.
    mine = [m for m, _ in imports(ROOT / "options.py") if m.split(".")[0] == "reader"]
    assert not mine, f"reader/options.py imports {mine}: the option records sit below every layer"


def test_every_option_record_of_the_loader_is_defined_in_reader_options():
    import reader.options as options

    records = [n for n in reader.__all__ if n.endswith("Options")] + [
        "SamplerOptions", "DecodeOptions", "WorkerOptions"]
    assert {"DeviceOptions", "DecodedCacheOptions"} <= set(records)
    for name in records:
        cls = getattr(reader, name, None) or getattr(options, name)
        if name == "CacheOptions":  # formats' own record (the dataset's cache folder)
            assert cls.__module__.startswith("formats."), cls.__module__
            continue
        assert cls.__module__ == "reader.options", f"{name} is defined in {cls.__module__}"
    defined = [(p.relative_to(ROOT).as_posix(), n.name) for p in ROOT.rglob("*.py")
               for n in ast.walk(ast.parse(p.read_text("utf-8")))
               if isinstance(n, ast.ClassDef) and n.name.endswith("Options")]
    assert all(path == "options.py" for path, _ in defined), defined
