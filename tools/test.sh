#!/usr/bin/env bash
# The one test command: configure, build and run the whole CPU test suite (C++ doctest + consumers).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --workflow --preset test
