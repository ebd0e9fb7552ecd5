#!/usr/bin/env bash
# Creates ./.venv-floors (or $FLOORS_VENV): ragen_lit[dev] with every runtime dependency that
# pyproject.toml declares with a floor installed at exactly that floor (scripts/dependency_floors.py),
# for the end-to-end tests marked `floors` (scripts/test.sh). A floor that no longer installs or
# passes is raised in pyproject.toml, never left untested.
#
# Usage: bash .ci/floors_env.sh   (idempotent: returns at once when the venv holds today's floors)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FLOORS_VENV:-$ROOT/.venv-floors}"
PY="$VENV/bin/python"
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
python3 "$ROOT/scripts/dependency_floors.py" > "$CONSTRAINTS"

works() {
  [ -x "$PY" ] && "$PY" - "$CONSTRAINTS" <<'EOF_PY' 2>/dev/null
import importlib.metadata as md
import importlib.util
import re
import sys

for name in ("ragen_lit", "pytest", "hypothesis"):
    assert importlib.util.find_spec(name) is not None, name
for line in open(sys.argv[1]):
    name, floor = line.strip().split("==")
    installed = md.version(name)
    # 2.13 pins 2.13.0 and its local builds (2.13.0+cpu)
    assert re.fullmatch(re.escape(floor) + r"(\.0)*(\+.*)?", installed), (name, installed, floor)
EOF_PY
}

if works; then
  echo "floors_env: $VENV already holds the floors"
  exit 0
fi

start=$(date +%s)
step() { echo "floors_env: $1 ($(( $(date +%s) - start )) s so far)"; }
# This machine's pip config lists local indexes with missing folders; pip warns once per package.
pip_quietly() { "$PY" -m pip "$@" 2>&1 | { grep -v -e "is ignored: it is neither a file nor a directory" || true; }; }

[ -x "$PY" ] || python3 -m venv "$VENV"
pip_quietly install -q --upgrade pip
# torch first on its own, as scripts/setup.sh does: the CPU build, never a multi-GB CUDA one
step "installing $(grep '^torch==' "$CONSTRAINTS")"
pip_quietly install -q "$(grep '^torch==' "$CONSTRAINTS")"
step "installing ragen_lit[dev] at the floors: $(tr '\n' ' ' < "$CONSTRAINTS")"
pip_quietly install -q -c "$CONSTRAINTS" -e "$ROOT[dev]"

works || { echo "floors_env: $VENV was built but does not hold the floors (see works())" >&2; exit 1; }
step "built $VENV"
