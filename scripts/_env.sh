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
  # "compat": the editable install is a path in a .pth file. The default mode imports a finder module
  # (pathlib, re, urllib) into every Python process the venv starts, ~20 ms each: every heddle, tool,
  # plugin and model server of the tests and the corpora. (The stamp's name changed with the mode.)
  local stamp="$VENV/.heddle-installed-compat${extras:+-$extras}"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "==> installing heddle${extras:+[$extras]} into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
      --config-settings editable_mode=compat -e ".${extras:+[$extras]}" 2>&1 \
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

# Where the scratch folder goes: TMPDIR when the user set one; else /dev/shm when it is there and a file
# in it may run (tools are written and run from the scratch folder), since the suite makes and removes
# tens of thousands of small files, several times faster in memory than on a disk-backed /tmp; else /tmp.
scratch_parent() {
  local probe
  if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ] \
      && probe="$(mktemp /dev/shm/heddle-probe.XXXXXX 2>/dev/null)"; then
    printf '#!/bin/sh\nexit 0\n' >"$probe" && chmod 0700 "$probe"
    if "$probe" 2>/dev/null; then
      rm -f "$probe"
      echo /dev/shm
      return
    fi
    rm -f "$probe"
  fi
  echo "${TMPDIR:-/tmp}"
}

# Point everything this shell runs from now on (pytest, each heddle and heddle-server it starts, the
# corpus runners) at one folder made here for the XDG cache, config and data homes and TMPDIR, and
# remove it when the shell exits: a run of the tests writes nothing into the user's own folders and
# leaves nothing in the temporary folder. Sets SCRATCH; replaces any EXIT trap.
private_homes() {
  SCRATCH="$(mktemp -d "$(scratch_parent)/heddle-test.XXXXXX")"
  # Cache entries are read-only folders: made writable again so that a user other than root can remove them.
  trap 'chmod -R u+w "$SCRATCH" 2>/dev/null; rm -rf "$SCRATCH"' EXIT
  # Laid out as / and /tmp are: the tests start Postgres as its own user, with its folder in TMPDIR.
  chmod 0755 "$SCRATCH"
  mkdir -m 0700 "$SCRATCH/cache" "$SCRATCH/config" "$SCRATCH/data"
  mkdir -m 1777 "$SCRATCH/tmp"
  export XDG_CACHE_HOME="$SCRATCH/cache" XDG_CONFIG_HOME="$SCRATCH/config" XDG_DATA_HOME="$SCRATCH/data" \
    TMPDIR="$SCRATCH/tmp"
}
