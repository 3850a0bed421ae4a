#!/usr/bin/env bash
# Builds the whole CPU test suite with AddressSanitizer + UndefinedBehaviorSanitizer (the "asan" preset:
# -DFLOWEDGE_SANITIZE=ON, -Og -g1, LeakSanitizer on; the consumer projects excluded, tools/test.sh runs them too) and
# runs it, or a subset of targets/tests; with --tsan instead builds the
# reliability concurrency test with ThreadSanitizer (OpenMP off: libgomp is not TSan-instrumented).
# Usage: tools/sanitize.sh [--tsan] [ctest -R regex]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${FLOWEDGE_JOBS:-2}"
if [ "${1:-}" = "--tsan" ]; then
  shift
  build=build-tsan
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLOWEDGE_OPENMP=OFF -DFLOWEDGE_BUILD_BENCH=OFF \
    -DFLOWEDGE_BUILD_EXAMPLES=OFF -DFLOWEDGE_BUILD_C_API=OFF \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" >/dev/null
  cmake --build "$build" --target reliability_concurrency -j"$jobs"
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "$build/test/reliability/reliability_concurrency"
  exit 0
fi
# (No detect_stack_use_after_return: its 32-byte-aligned fake frames fault on AVX-512 aligned stack stores; tools/test.sh.)
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
t0=$(date +%s)
cmake --preset asan >/dev/null
# FLOWEDGE_SANITIZE_TARGETS="a b": build only those targets (a quick subset); default: everything.
if [ -n "${FLOWEDGE_SANITIZE_TARGETS:-}" ]; then
  # shellcheck disable=SC2086
  cmake --build --preset asan -j"$jobs" --target $FLOWEDGE_SANITIZE_TARGETS
else
  cmake --build --preset asan -j"$jobs"
fi
t1=$(date +%s)
echo "flowedge sanitize: build took $((t1 - t0)) s"
if [ $# -gt 0 ]; then
  ctest --preset asan -R "$1" --no-tests=error
else
  ctest --preset asan
fi
echo "flowedge sanitize: tests took $(( $(date +%s) - t1 )) s"
