#!/usr/bin/env bash
# The README's two commands: `bash dev.sh demo` and `bash dev.sh test`.
# Each sets itself up from scratch on a machine that has only python3 and pip:
# a virtual environment in .venv with shardpack installed (editable) and its test tools.
set -euo pipefail
cd "$(dirname "$0")"

VENV=${SHARDPACK_VENV:-.venv}

setup() {
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV" 2>/dev/null || {
            # Debian's python3 without python3-venv: bootstrap virtualenv through pip.
            python3 -m pip install -q --user virtualenv
            python3 -m virtualenv -q "$VENV"
        }
    fi
    if [ ! -f "$VENV/.installed" ] || [ pyproject.toml -nt "$VENV/.installed" ]; then
        "$VENV/bin/python" -m pip install -q --upgrade pip
        "$VENV/bin/python" -m pip install -q -e ".[dev,ray]"
        touch "$VENV/.installed"
    fi
}

case "${1:-}" in
    demo)
        setup
        shift
        "$VENV/bin/python" -m scripts.demo "$@"
        ;;
    test)
        setup
        if [ ! -f "$VENV/.torch-tried" ]; then
            # PyTorch's CPU build, where pip can find one (a local wheel house); the
            # torch adapter tests skip, saying so, where it can't. Never the multi-GB
            # CUDA build for a test run.
            "$VENV/bin/python" -m pip install -q "torch==2.13.0+cpu" >/dev/null 2>&1 ||
                echo "note: no CPU build of PyTorch available to pip: the torch tests will skip" >&2
            touch "$VENV/.torch-tried"
        fi
        shift
        "$VENV/bin/ruff" check .
        "$VENV/bin/python" -m pytest -q "$@"
        ;;
    *)
        echo "usage: bash dev.sh demo|test [args...]" >&2
        exit 2
        ;;
esac
