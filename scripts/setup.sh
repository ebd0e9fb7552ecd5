#!/usr/bin/env bash
# Create ./.venv (if missing) and install ragen_lit into it, CPU-lean: torch is pinned to 2.13.0 first
# so that no multi-GB CUDA build is pulled on a CPU machine. Usage: bash scripts/setup.sh [extras]
#   extras: comma-separated optional extras, e.g. "dev,smollm2" (default: dev)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[${extras}]"
