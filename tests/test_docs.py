"""The documentation site: it builds strict, every public name has a docstring, and every
Python block of the guides runs.

A guide's ```python blocks run in order, as one script, in a temporary folder that holds
the small data the guides name (``pets/``, an image folder; ``pets.shards``, it packed;
``texts/``, text files; ``coco/``, a synthetic COCO detection set). A block that needs what
the tests cannot have (a GPU, S3, torch, Ray) is preceded by ``<!-- skip: REASON -->``.
A ```console block preceded by ``<!-- run -->`` runs too: each ``$ `` command, in bash,
after the Python blocks, and must exit 0 (``pack-dataset`` and ``inspect-shards`` are
this checkout's).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDES = sorted((ROOT / "docs" / "guides").glob("*.md"))
CONSOLE = re.compile(r"<!-- run -->\n```console\n(?P<code>.*?)```", re.S)
SHELL = f"""set -e
pack-dataset() {{ {sys.executable} -c 'import sys; from packer.cli import main; sys.exit(main())' "$@"; }}
inspect-shards() {{ {sys.executable} -c 'import sys; from reader.inspect.cli import main; sys.exit(main())' "$@"; }}
"""
BLOCK = re.compile(r"(?:<!-- skip: (?P<skip>[^>]*?) -->\n)?```python\n(?P<code>.*?)```", re.S)


def test_the_site_builds_strict(tmp_path):
    """A broken link, a missing page, a reference to a name that does not exist or a
    docstring that names a parameter the signature lacks fails the build. (Never ``-q``:
    mkdocs then drops the warnings that --strict counts, and a broken link passes.)"""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed")
    pytest.importorskip("material", reason="the docs extra is not installed")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                          "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    site = tmp_path / "site"
    # The generated pages hold what the code says today.
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "--on-error" in cli and "monitor-report" in cli and "ledger-diff" in cli
    errors = (site / "reference" / "errors" / "index.html").read_text()
    assert "UnknownKeyError" in errors and "KeyError" in errors and "PackInputError" in errors
    api = (site / "reference" / "reader" / "index.html").read_text()
    assert "load_state_dict" in api and "open_dataset" in api
    assert ":class:<code>" not in api  # reST roles are shown as the names they mark
    for face in ("reader", "formats", "packer"):  # every public name has its entry
        page = (site / "reference" / face / "index.html").read_text()
        shown = set(re.findall(rf'id="{face}\.(\w+)"', page))
        assert set(importlib.import_module(face).__all__) <= shown, face
    assert "manifest.json" in (site / "reference" / "format" / "index.html").read_text()
    assert "scripts" in (site / "benchmarks" / "index.html").read_text()
    for guide in GUIDES:
        assert (site / "guides" / guide.stem / "index.html").exists(), guide.name
    assert not (site / "hooks.py").exists()  # the build's own code is not a page


@pytest.mark.parametrize("fault, named", [("[gone](guides/no-such-guide.md)", "no-such-guide.md"),
                                          ("::: reader.NoSuchName", "NoSuchName")])
def test_a_broken_link_or_a_missing_name_fails_the_build(tmp_path, fault, named):
    """The strictness the site's test relies on: a copy of the docs with a link to no page,
    or an API reference to a name that does not exist, does not build, naming it."""
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed")
    pytest.importorskip("material", reason="the docs extra is not installed")
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "docs", copy / "docs")
    for name in ("mkdocs.yml", "FORMAT.md", "BENCHMARKS.md"):
        shutil.copy(ROOT / name, copy / name)
    with open(copy / "docs" / "index.md", "a") as f:
        f.write(f"\n{fault}\n")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                          "-d", str(tmp_path / "site")],
                         cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert named in run.stdout + run.stderr


@pytest.mark.parametrize("face", ["reader", "formats", "packer"])
def test_every_public_name_has_a_docstring(face):
    """Each class, function and module a package face exports says what it is (data such
    as ``__version__`` is described by the module's own docstring)."""
    module = importlib.import_module(face)
    named = {name: getattr(module, name) for name in module.__all__}
    code = {n: o for n, o in named.items()
            if inspect.isclass(o) or inspect.isroutine(o) or inspect.ismodule(o)}
    assert len(code) >= len(named) - 3, sorted(set(named) - set(code))
    missing = [n for n, o in code.items() if not (o.__doc__ or "").strip()]
    assert missing == [], f"{face}: no docstring: {missing}"


def test_every_guide_is_short_and_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    assert len(GUIDES) >= 11
    for guide in GUIDES:
        lines = guide.read_text().count("\n")
        assert lines < 250, f"{guide.name}: {lines} lines (a guide stays under 250)"
        assert f"guides/{guide.name}" in nav, f"{guide.name} is not in mkdocs.yml's nav"


def test_the_readme_is_a_landing_page_linking_into_the_guides():
    text = (ROOT / "README.md").read_text()
    assert text.count("\n") <= 200
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / target).exists(), target
    assert "bash dev.sh demo" in text and "bash dev.sh test" in text and "BENCHMARKS.md" in text


def _data(folder: Path) -> None:
    """The small data the guides' examples read and write."""
    sys.path.insert(0, str(ROOT))
    from packer import PackOptions, pack
    from scripts.synth import coco_detection, make_image_folder

    make_image_folder(folder / "pets", 2, 6, min_side=64, max_side=96)
    pack(folder / "pets", folder / "pets.shards", PackOptions(durable=False))
    (folder / "texts").mkdir()
    for i in range(6):
        (folder / "texts" / f"doc{i}.txt").write_text(f"document {i} " * (i + 3))
    coco_detection(folder / "coco", 8, min_side=64, max_side=96, max_objects=3)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("guide-data")
    _data(folder)
    return folder


# What the README's two short examples leave to the reader: their inputs, the checkpoint
# and the step of a training loop.
README_PRELUDE = """import glob
paths = sorted(glob.glob("texts/*.txt"))
checkpoint, epochs = {}, 1
def train_step(images, labels):
    assert images.shape[1:] == (224, 224, 3) and len(labels) == len(images)
"""


@pytest.mark.parametrize("guide", [*GUIDES, ROOT / "README.md"],
                         ids=[*(g.stem for g in GUIDES), "README"])
def test_the_python_blocks_of_each_guide_run(guide, data, tmp_path):
    blocks = list(BLOCK.finditer(guide.read_text()))
    runnable = [m.group("code") for m in blocks if m.group("skip") is None]
    if guide.name == "README.md":
        runnable = [README_PRELUDE, *runnable]
    skipped = [m.group("skip") for m in blocks if m.group("skip") is not None]
    assert all(reason.strip() for reason in skipped), f"{guide.name}: a skip without a reason"
    commands = [re.sub(r"\\\n\s*", "", line[2:]) for m in CONSOLE.finditer(guide.read_text())
                for line in re.split(r"\n(?=\$ )", m.group("code")) if line.startswith("$ ")]
    if not runnable and not commands:
        pytest.skip(f"{guide.name}: no block runs here ({'; '.join(skipped) or 'no code'})")
    work = tmp_path / "work"
    subprocess.run(["cp", "-a", str(data), str(work)], check=True)
    script = work / "guide.py"
    script.write_text("\n".join(runnable))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SHARDPACK_CACHE": str(tmp_path / "cache")}
    run = subprocess.run([sys.executable, str(script)], cwd=work, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{guide.name}:\n{script.read_text()}\n{run.stdout}{run.stderr}"
    if commands:
        shell = SHELL + "\n".join(c.split("\n")[0] for c in commands)
        run = subprocess.run(["bash", "-c", shell], cwd=work, env=env, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, f"{guide.name}:\n{shell}\n{run.stdout}{run.stderr}"


def test_an_included_root_document_links_into_the_site(tmp_path, monkeypatch):
    """FORMAT.md and BENCHMARKS.md link to each other and to scripts/ as files of the
    repository; on the site those become pages and code, and a link to a file that does
    not exist stays a link, so the strict build names it."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "bench.py").write_text("")
    (tmp_path / "FORMAT.md").write_text("# spec\n")
    (tmp_path / "BENCHMARKS.md").write_text(
        "[the spec](FORMAT.md#1-goals), [bench](scripts/bench.py), "
        "[`scripts/bench.py`](scripts/bench.py), [gone](scripts/gone.py), "
        "[site](https://example.org/x.md)\n")
    monkeypatch.setattr(hooks, "ROOT", tmp_path)
    assert hooks.include_markdown("BENCHMARKS.md", "benchmarks.md") == (
        "[the spec](reference/format.md#1-goals), bench (`scripts/bench.py`), "
        "`scripts/bench.py`, [gone](scripts/gone.py), [site](https://example.org/x.md)\n")
    assert hooks.include_markdown("BENCHMARKS.md", "reference/x.md").startswith(
        "[the spec](../reference/format.md#1-goals)")
