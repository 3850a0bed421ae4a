#!/usr/bin/env bash
# Issue 19 item 6 on the GPU box: the RGB encoder's CUDA kernels old vs new in one run. The old path is the same
# binary with FLOWEDGE_CUDA_GN_NO_CLUSTER=1 FLOWEDGE_CUDA_CONV2D_NO_KSTREAM=1 (one block per GroupNorm group, the
# conv2d output-tile kernel for every shape).
#
# Usage: tools/encoder_ab.sh [STAGE...]   (default: tests sanitize bench; build with tools/gpu_run.sh build first)
#   tests     ops_norm, ops_conv2d (new and old path), diffusion_rgb_encoder, diffusion_policy -> $OUT/tests.txt
#   sanitize  compute-sanitizer memcheck and racecheck on the GroupNorm and ResNet-shape conv2d op tests (Cuda instances)
#   bench     policy_bench on the PushT-size image policy, F32 and BF16 weights, old then new then old then new:
#             --encoder-only N (the encoder alone as a CUDA graph) and whole ticks (chunk vs U-Net sample)
#             -> $OUT/bench.txt, $OUT/policy_bench_{old,new}_{f32,bf16}.json
#   ncu       per-kernel times of one encoder call (F32), old and new path -> $OUT/ncu_encoder_{old,new}_f32.csv
# Env: BUILD_DIR (default build-cuda), OUT (default out), POLICY_FIXTURE (default .bench-fixtures/dp_pusht_image),
# ENC_ITERS (default 2000), TICKS (default 160).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build-cuda}
OUT=${OUT:-out}
FIX=${POLICY_FIXTURE:-.bench-fixtures/dp_pusht_image}
FOLDER=/tmp/dp_pusht_image
mkdir -p "$OUT"
OLD=(env FLOWEDGE_CUDA_GN_NO_CLUSTER=1 FLOWEDGE_CUDA_CONV2D_NO_KSTREAM=1)
rc_all=0

stage_tests() {
    local t rc=0
    for t in ops/ops_norm ops/ops_conv2d diffusion/diffusion_rgb_encoder diffusion/diffusion_policy; do
        echo "== $t" >> "$OUT/tests.txt"
        "$BUILD/test/$t" >> "$OUT/tests.txt" 2>&1 || { rc=$?; echo "FAILED rc=$rc: $t"; }
        grep -E "^\[doctest\] (test cases|assertions)" "$OUT/tests.txt" | tail -n 2
    done
    for t in ops/ops_norm ops/ops_conv2d; do
        echo "== $t (old path)" >> "$OUT/tests.txt"
        "${OLD[@]}" "$BUILD/test/$t" -tc='*<flowedge::Cuda>*' >> "$OUT/tests.txt" 2>&1 || { rc=$?; echo "FAILED rc=$rc: $t old"; }
        grep -E "^\[doctest\] (test cases|assertions)" "$OUT/tests.txt" | tail -n 2
    done
    return $rc
}

stage_sanitize() {
    local cs tool rc=0
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    for tool in memcheck racecheck; do
        timeout 150 "$cs" --tool $tool --error-exitcode 99 "$BUILD/test/ops/ops_norm" -tc='group_norm with*<flowedge::Cuda>*' \
            > "$OUT/sanitize_${tool}_norm.txt" 2>&1 || { rc=$?; echo "FAILED $tool norm rc=$rc"; }
        tail -n 3 "$OUT/sanitize_${tool}_norm.txt"
        timeout 200 "$cs" --tool $tool --error-exitcode 99 "$BUILD/test/ops/ops_conv2d" -tc='conv2d: the ResNet18*<flowedge::Cuda>*' \
            > "$OUT/sanitize_${tool}_conv2d.txt" 2>&1 || { rc=$?; echo "FAILED $tool conv2d rc=$rc"; }
        tail -n 3 "$OUT/sanitize_${tool}_conv2d.txt"
    done
    return $rc
}

stage_bench() {
    local dt path rc=0
    [ -f "$FOLDER/model.safetensors" ] || "$BUILD/policy_bench" "$FOLDER" --rebuild-from "$FIX" --device cpu --encoder-only 1 > /dev/null || return $?
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader >> "$OUT/bench.txt"
    for dt in f32 bf16; do
        for path in old new old new; do
            local run=("$BUILD/policy_bench")
            [ "$path" = old ] && run=("${OLD[@]}" "$BUILD/policy_bench")
            echo "== encoder-only $dt $path" >> "$OUT/bench.txt"
            "${run[@]}" "$FOLDER" --device cuda --dtype $dt --encoder-only "${ENC_ITERS:-2000}" >> "$OUT/bench.txt" 2>&1 || rc=$?
        done
        for path in old new; do
            local run=("$BUILD/policy_bench")
            [ "$path" = old ] && run=("${OLD[@]}" "$BUILD/policy_bench")
            echo "== ticks $dt $path" >> "$OUT/bench.txt"
            "${run[@]}" "$FOLDER" --device cuda --dtype $dt --ticks "${TICKS:-160}" --json "$OUT/policy_bench_${path}_$dt.json" \
                >> "$OUT/bench.txt" 2>&1 || rc=$?
        done
    done
    grep -E "^==|p50" "$OUT/bench.txt"
    return $rc
}

stage_ncu() {
    [ -f "$FOLDER/model.safetensors" ] || "$BUILD/policy_bench" "$FOLDER" --rebuild-from "$FIX" --device cpu --encoder-only 1 > /dev/null || return $?
    local path rc=0
    for path in old new; do
        local run=(ncu)
        [ "$path" = old ] && run=("${OLD[@]}" ncu)
        "${run[@]}" --clock-control none --metrics gpu__time_duration.sum --graph-profiling node --csv \
            "$BUILD/policy_bench" "$FOLDER" --device cuda --encoder-only 1 > "$OUT/ncu_encoder_${path}_f32.csv" 2>> "$OUT/ncu_stderr.txt" || rc=$?
    done
    return $rc
}

for stage in ${*:-tests sanitize bench}; do
    t0=$(date +%s)
    "stage_$stage"
    rc=$?
    [ $rc = 0 ] || rc_all=$rc
    echo "stage $stage rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
done
exit $rc_all
