# Shared by scripts/*: find the repository, make .venv if needed and install heddle into it.
# Sourced, not run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"

ensure_venv() {
  local extras="${1:-}"
  if [ ! -x "$VENV/bin/python" ]; then
    echo "==> creating $VENV" >&2
    "$PY" -m venv "$VENV"
  fi
  local stamp="$VENV/.heddle-installed${extras:+-$extras}"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "==> installing heddle${extras:+[$extras]} into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e ".${extras:+[$extras]}" 2>&1 \
      | grep -v "^WARNING: Location" >&2 || true
    "$VENV/bin/python" -c "import heddle" # fail here, not later, when the install did not work
    touch "$stamp"
  fi
  # Every `heddle` a test or a user starts reads heddle's bytecode; where PYTHONDONTWRITEBYTECODE is
  # set nothing would write it, and each process would compile the package again.
  "$VENV/bin/python" -m compileall -q -j 0 "$ROOT/heddle" >/dev/null
  # Tools written as `#!/usr/bin/env python3` find this interpreter first: a version manager's
  # shim in front of it costs a shell and a dozen processes on every tool call.
  export PATH="$VENV/bin:$PATH"
}
