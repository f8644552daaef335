#!/usr/bin/env bash
# The GPU path checked in one command: its tests with real cupy, host-to-device from the
# slot ring ÷ a raw pinned copy, the pipeline to the GPU ÷ to the CPU, DALI's GPU pipeline
# when it imports, the GPU decode (nvImageCodec) and the CPU's scaling; every figure in one
# JSON file and a table (--only picks steps, --seconds each rate's interval). The work is done by
# `python -m scripts.bench_gpu` (its docstring lists the steps); this script only picks the
# Python and installs the wheels it is given.
#
#   bash scripts/gpu_check.sh [--wheels DIR] [--out FILE] [scripts.bench_gpu options]
#   bash scripts/gpu_check.sh --download DIR     # where pip reaches an index: fill DIR
#
# --wheels DIR installs, from DIR alone (pip --no-index), what
# `python -m scripts.gpu_requirements DIR` lists: pyproject.toml's core dependencies, `gpu`
# extra and test runner, and the DALI and torch wheels DIR holds. Nothing is
# fetched from the network unless --download is given.
# Without a usable GPU (none, or a driver the wheels do not match) it says so in one line
# and exits 0 once the GPU path's tests have passed on the numpy stand-in.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${SHARDPACK_VENV:-.venv}
PY=python3
if [ -x "$VENV/bin/python" ]; then
    PY=$VENV/bin/python
fi

wheels="" download=""
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --wheels|--download)
            if [ $# -lt 2 ] || [ -z "$2" ]; then
                echo "gpu_check.sh: $1 needs a folder" >&2
                exit 2
            fi
            if [ "$1" = --wheels ]; then wheels=$2; else download=$2; fi
            shift 2
            ;;
        -h|--help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
            echo
            exec "$PY" -m scripts.bench_gpu --help
            ;;
        --wheels=*) wheels=${1#--wheels=}; shift ;;
        --download=*) download=${1#--download=}; shift ;;
        *) args+=("$1"); shift ;;
    esac
done

if [ -n "$download" ]; then
    if [ -n "$wheels" ] || [ ${#args[@]} -gt 0 ]; then
        echo "gpu_check.sh: --download DIR takes no other option" >&2
        exit 2
    fi
    list=$("$PY" -m scripts.gpu_requirements)
    mapfile -t reqs <<<"$list"
    exec "$PY" -m pip download -q --only-binary=:all: -d "$download" "${reqs[@]}"
fi

if [ -n "$wheels" ]; then
    if [ ! -d "$wheels" ]; then
        echo "gpu_check.sh: --wheels $wheels: no such folder" >&2
        exit 2
    fi
    list=$("$PY" -m scripts.gpu_requirements "$wheels")
    mapfile -t reqs <<<"$list"
    "$PY" -m pip install -q --no-index --find-links "$wheels" "${reqs[@]}"
fi

exec "$PY" -m scripts.bench_gpu ${args[@]+"${args[@]}"}
