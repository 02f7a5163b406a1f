#!/usr/bin/env bash
# Makes (once) the separate environment holding onnxruntime-genai and the plain onnxruntime it needs (they clash
# with specc's onnxruntime-gpu), keyed on requirements-genai.txt, and prints its python. Used by
# tests/test_onnx_genai.py; safe to run concurrently (a lock), never touches specc's own environment.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQ="${1:-$ROOT/requirements-genai.txt}"
KEY="$(sha256sum "$REQ" | cut -c1-16)"
VENV="${XDG_CACHE_HOME:-$HOME/.cache}/specc/genai-$KEY"
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.complete" ]; then
  echo "specc: creating the onnxruntime-genai environment in $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ" >&2
  touch "$VENV/.complete"
fi
echo "$VENV/bin/python"
