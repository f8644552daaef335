"""What scripts/gpu_check.sh installs from ``--wheels DIR``, as pip arguments, one a line.

pyproject.toml is the one list: its core dependencies, its ``gpu`` extra and the test
runner of its ``dev`` extra (pytest, hypothesis), then the newest wheel DIR holds of each
optional package the check uses when it imports (DALI for CUDA 12 or 13, a CUDA torch,
nvImageCodec with nvJPEG for the GPU decode: the ``gpu-decode`` extra, installed from DIR
when its wheels are there, since DIR may not hold them all).
Standard library only: it runs before anything is installed.

Run: ``python -m scripts.gpu_requirements [DIR]``
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Installed from DIR when DIR holds them (wheel file-name prefixes).
OPTIONAL_WHEELS = ("nvidia_dali_cuda120-", "nvidia_dali_cuda130-", "torch-",
                   # the gpu-decode extra (nvImageCodec and the nvJPEG it loads): ~36 MB
                   "nvidia_nvimgcodec_cu12-", "nvidia_nvjpeg_cu12-")
TEST_RUNNER = ("pytest", "hypothesis")


def requirements(wheels: Path | None = None) -> list[str]:
    """pip arguments: requirement specifiers from pyproject.toml, then optional wheel files."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            sys.exit("reading pyproject.toml needs Python 3.11 or the tomli package")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    runner = [r for r in extras["dev"] if r.split(">")[0].split("=")[0].strip() in TEST_RUNNER]
    out = [*project["dependencies"], *extras["gpu"], *runner]
    if wheels is not None:
        for prefix in OPTIONAL_WHEELS:
            found = sorted(wheels.glob(prefix + "*.whl"))
            if found:
                out.append(str(found[-1]))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print("usage: python -m scripts.gpu_requirements [DIR]", file=sys.stderr)
        return 2
    wheels = Path(argv[0]) if argv else None
    if wheels is not None and not wheels.is_dir():
        print(f"gpu_requirements: {wheels}: no such folder", file=sys.stderr)
        return 2
    print("\n".join(requirements(wheels)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
