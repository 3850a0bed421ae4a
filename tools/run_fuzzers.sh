#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) in build-fuzz with clang and runs each for SECONDS (default 600),
# at most FLOWEDGE_FUZZ_PARALLEL (default 2) at a time, niced; prints exec counts / coverage per target.
# Usage: tools/run_fuzzers.sh [SECONDS] [target ...]   (targets: safetensors lerobot_folder compact mamba_state npz
# policy_folder)
# Exit status is non-zero when a build fails or any target reports a crash, leak, timeout or OOM.
# New inputs go to build-fuzz/corpus/<target> (the committed seeds in fuzz/corpus/<target> are only read);
# reproducers land in build-fuzz/artifacts/<target>/.
# FLOWEDGE_FUZZ_OPT: the targets' optimisation/debug flags (default -g -O1, for campaigns). CI's smoke run sets
# -O0 -g1: the build takes a third of the CPU, the targets run 2-17x fewer inputs per second.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(safetensors lerobot_folder compact mamba_state npz policy_folder)
parallel="${FLOWEDGE_FUZZ_PARALLEL:-2}"
build="${FLOWEDGE_FUZZ_BUILD_DIR:-build-fuzz}"
cxx="${CXX_FUZZ:-$(command -v clang++ || true)}"
if [ -z "$cxx" ]; then
  echo "flowedge fuzz: clang++ not found (libFuzzer needs clang)" >&2
  exit 1
fi

names=()
for t in "${targets[@]}"; do names+=("flowedge_fuzz_$t"); done
# The targets build as one goal (flowedge_compile_check), so make compiles two of them at a time.
cmake -S . -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFLOWEDGE_BUILD_FUZZERS=ON -DFLOWEDGE_BUILD_TESTS=OFF -DFLOWEDGE_BUILD_EXAMPLES=OFF -DFLOWEDGE_BUILD_BENCH=OFF \
  -DFLOWEDGE_BUILD_C_API=OFF -DFLOWEDGE_OPENMP=OFF -DFLOWEDGE_NATIVE=OFF \
  -DFLOWEDGE_FUZZ_OPT_FLAGS="${FLOWEDGE_FUZZ_OPT:--g -O1}" \
  -DFLOWEDGE_COMPILE_CHECK_TARGETS="$(IFS=';'; echo "${names[*]}")" >/dev/null
nice -n 10 cmake --build "$build" --target flowedge_compile_check -j2

max_len() {
  case "$1" in
    safetensors) echo 16384 ;;
    mamba_state) echo 40000 ;;
    *) echo 131072 ;;
  esac
}

run_one() {
  local t="$1" log="$build/logs/$1.log"
  mkdir -p "$build/corpus/$t" "$build/artifacts/$t" "$build/logs"
  local start end rc=0
  start=$(date +%s)
  ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    nice -n 10 "$build/fuzz/flowedge_fuzz_$t" "$build/corpus/$t" "fuzz/corpus/$t" \
    -max_total_time="$seconds" -max_len="$(max_len "$t")" -timeout=20 -rss_limit_mb=2560 -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$t/" >"$log" 2>&1 || rc=$?
  end=$(date +%s)
  local execs cov ft corp
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || echo "?")
  ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || echo "?")
  corp=$(ls "$build/corpus/$t" | wc -l)
  printf 'fuzz %-15s rc=%d seconds=%d execs=%s cov=%s ft=%s corpus=%s log=%s\n' "$t" "$rc" "$((end - start))" \
    "$execs" "$cov" "$ft" "$corp" "$log" | tee "$build/logs/$t.summary"
  return "$rc"
}

fail=0
pids=()
declare -A pid_target
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do sleep 1; done
  run_one "$t" &
  pid_target[$!]="$t"
  pids+=("$!")
done
for p in "${pids[@]}"; do
  if ! wait "$p"; then
    echo "flowedge fuzz: target ${pid_target[$p]} FAILED (see $build/logs/${pid_target[$p]}.log, $build/artifacts/${pid_target[$p]}/)" >&2
    fail=1
  fi
done
exit "$fail"
