#!/usr/bin/env bash
# Builds and tests the Python package: creates/reuses a venv, `pip install .[test]`, runs pytest, prints timings.
# Usage: tools/test_python.sh [pytest args...]   (VENV=path overrides .venv-py; FLOWEDGE_NATIVE=OFF builds without -march=native)
# FLOWEDGE_PY_OPT (e.g. -O1): the module's optimisation flags instead of the Release build type's -O3. CI sets -O1: the
# three binding TUs instantiate every model, ~590 s of the 2-core CI machine's CPU at -O3 and ~0.4x that at -O1; the
# tests check numbers and errors, not speed, and `pip install .` still gives users -O3.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${VENV:-$root/.venv-py}"
python="${PYTHON:-python3}"
cd "$root"
if [[ ! -x "$venv/bin/python" ]]; then
  echo "== creating venv $venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
fi
t0=$(date +%s)
echo "== pip install .[test]  (build log: pip -v; CMake build dir build-py/)"
opt=()
[ -n "${FLOWEDGE_PY_OPT:-}" ] && opt=(-C "cmake.define.CMAKE_CXX_FLAGS_RELEASE=${FLOWEDGE_PY_OPT} -DNDEBUG")
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" "$venv/bin/pip" install -q "${opt[@]}" "$root[test]"
t1=$(date +%s)
echo "== pip install took $((t1 - t0)) s"
# Run from outside the source tree so `import flowedge` resolves to the installed package, not python/flowedge.
(cd /tmp && "$venv/bin/python" -m pytest -q "$root/python/tests" "$@")
t2=$(date +%s)
echo "== pytest took $((t2 - t1)) s; total $((t2 - t0)) s"
