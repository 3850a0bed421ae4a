#!/usr/bin/env bash
# Creates (or reuses) the Python venv that runs the reference generators in tools/ (LeRobot, transformers, torch on CPU).
# Usage: tools/setup_python.sh [VENV_DIR]   (default: <repo>/.venv, git-ignored)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
venv="${1:-$repo/.venv}"
req="$here/requirements-ref.txt"
py="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "setup_python: creating venv $venv"
  "$py" -m venv "$venv"
fi
# Idempotent: a stamp holds the hash of the requirements file that was last installed successfully.
stamp="$venv/.flowedge-ref-stamp"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && "$venv/bin/python" -c "import lerobot, torch, transformers, diffusers, safetensors, numpy" 2>/dev/null; then
  echo "setup_python: $venv already up to date"
  exit 0
fi
start=$(date +%s)
# PyPI serves only the CUDA-enabled torch wheel for Linux x86_64 (the +cpu wheels live elsewhere); it runs fine on CPU.
"$venv/bin/python" -m pip install --upgrade --quiet pip
"$venv/bin/python" -m pip install --quiet --no-cache-dir -r "$req"
"$venv/bin/python" -c "import lerobot, torch, transformers, diffusers; print('setup_python: lerobot', lerobot.__version__ if hasattr(lerobot,'__version__') else '?', 'torch', torch.__version__, 'transformers', transformers.__version__, 'diffusers', diffusers.__version__)"
echo "$want" > "$stamp"
echo "setup_python: installed in $(( $(date +%s) - start )) s, venv size $(du -sh "$venv" | cut -f1)"
