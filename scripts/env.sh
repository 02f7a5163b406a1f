# Sourced by the set-up scripts: makes (once) and activates a virtual environment outside the checkout,
# keyed on the dependency files, so that torch is not reinstalled on every run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KEY="$(cat "$ROOT/requirements.txt" "$ROOT/requirements-test.txt" | sha256sum | cut -c1-16)"
VENV="${SPECC_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/specc/venv-$KEY}"
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.complete" ]; then
  # Two first runs at once (scripts/test beside scripts/demo) must not delete each other's half-made venv.
  mkdir -p "$(dirname "$VENV")"
  exec 9>"$VENV.lock"
  flock 9
fi
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.complete" ]; then
  echo "specc: creating the environment in $VENV (once per dependency set)" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  # torch first and pinned: 2.13.0 is the CPU build these machines hold; an unpinned torch is a multi-GB CUDA build.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$ROOT/requirements-test.txt"
  touch "$VENV/.complete"
fi
exec 9>&- 2>/dev/null || true
export PATH="$VENV/bin:$PATH"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT"
