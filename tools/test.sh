#!/usr/bin/env bash
# The one test command: configure, build and run the whole CPU test suite (C++ doctest, C test, consumers) under
# AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer (the `asan` configure preset: -Og -g1, assertions on).
# -Og, not -O1: every test TU compiles the CPU kernels of all three instruction sets under both sanitizers, and the
# -O1 passes over that instrumented code are most of the build; -Og keeps the kernels inlined, so the tests stay fast
# (-O0 would compile cheaper still but runs the op tests for minutes). Measured: bench/results/ci_build_cost.md.
# The optimised build of the same suite: cmake --workflow --preset test-release.
set -euo pipefail
cd "$(dirname "$0")/.."
# No detect_stack_use_after_return: GCC's ASan fake stack frames are only 32-byte aligned, and with -march=native the
# compiler zero-fills 64-byte-aligned stack slots with vmovdqa64 (AVX-512), which faults there (seen at -O1 in
# ops_no_alloc on `LinearBatchParams lb;`: a store to a 32-byte-aligned fake-frame address, not a bug in the code).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
t0=$(date +%s)
cmake --workflow --preset test
echo "flowedge test: sanitized CPU suite passed in $(( $(date +%s) - t0 )) s"
