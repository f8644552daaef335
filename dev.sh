#!/usr/bin/env bash
# The README's two commands: `bash dev.sh demo` and `bash dev.sh test`; and
# `bash dev.sh docs`, which serves the documentation site (mkdocs.yml) on 127.0.0.1:8000.
# Each sets itself up from scratch on a machine that has only python3 and pip, in one
# virtual environment (.venv, or $SHARDPACK_VENV) with shardpack installed (editable):
# the demo needs only the core dependencies; the tests add the dev and ray extras
# (about 1.4 GB, the docs site's tools included) and, where a wheel exists, the roi extra (2 MB) to the same
# environment, so a later demo reuses it as it is.
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
        # An old bundled pip (before 21.3) cannot install a pyproject-only package editable.
        "$VENV/bin/python" -m pip install -q --upgrade pip
    fi
}

# fresh STAMP: true when $VENV/.installed-STAMP exists and is newer than pyproject.toml.
fresh() {
    [ -f "$VENV/.installed-$1" ] && [ ! pyproject.toml -nt "$VENV/.installed-$1" ]
}

# install STAMP SPEC: pip install -e SPEC, unless done since pyproject.toml last changed.
install() {
    if ! fresh "$1"; then
        "$VENV/bin/python" -m pip install -q -e "$2"
        touch "$VENV/.installed-$1"
    fi
}

case "${1:-}" in
    demo)
        setup
        fresh dev || install core "."   # the test environment holds the core too
        shift
        "$VENV/bin/python" -m scripts.demo "$@"
        ;;
    test)
        setup
        install dev ".[dev,ray]"
        if ! fresh roi; then
            # The roi extra comes as wheels for some platforms only, and never builds from
            # source here: without it the region-of-interest tests skip, saying so, and
            # the whole-image decode they compare against is tested as ever.
            "$VENV/bin/python" -m pip install -q --only-binary turbojpeg -e ".[roi]" ||
                echo "note: no wheel of the roi extra for this platform: its tests will skip" >&2
            touch "$VENV/.installed-roi"
        fi
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
    docs)
        setup
        fresh dev || install docs ".[docs]"   # the test environment holds the docs tools too
        shift
        NO_MKDOCS_2_WARNING=1 "$VENV/bin/python" -m mkdocs serve "$@"
        ;;
    *)
        echo "usage: bash dev.sh demo|test|docs [args...]" >&2
        exit 2
        ;;
esac
