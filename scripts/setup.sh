#!/usr/bin/env bash
# Create ./.venv (if missing) and install ragen_lit into it, CPU-lean: torch is pinned to 2.13.0 first
# so that no multi-GB CUDA build is pulled on a CPU machine. Usage: bash scripts/setup.sh [extras]
#   extras: comma-separated optional extras, e.g. "dev,smollm2" (default: dev)
# With the dev extra (the test tools) it also installs Triton, whose interpreter runs the kernels' tests on a CPU
# (tests/kernels/): plain `pytest` after this script is the README's fast tier, every test of it run. A CUDA build
# of torch brings its own Triton, which is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[${extras}]"
if [[ ",${extras}," == *,dev,* ]]; then
    python -c "import triton" 2>/dev/null || python -m pip install -q "triton>=3.6"
fi
