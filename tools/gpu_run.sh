#!/usr/bin/env bash
# The one script the lead runs on the GPU box: build the CUDA tree, run GPU + CPU tests, compare the seed's programs
# on --device cpu vs cuda, run flowedge_cuda_dp_mix, mamba_flow_bench and compute-sanitizer; everything lands in $OUT
# (few flat files).
#
# Usage: tools/gpu_run.sh [STAGE...]      (no stage = all, in this order)
#   info      nvidia-smi, nvcc, cmake, compute-sanitizer versions
#   build     configure build-cuda (-DFLOWEDGE_BACKEND=cuda -DFLOWEDGE_CUDA_ARCHITECTURES=90, the fused Mamba-flow
#             kernels at every block size FLOW_BLOCK_SIZES (default "256;512;1024") for the flow stage's A/B; Ninja if
#             present) and build (all targets, or BUILD_TARGETS="t1 t2 ...")
#   gputests  ctest -L gpu --output-on-failure
#   cputests  ctest -LE gpu (the whole CPU suite)
#   demo      flowedge-make-demo-diffusion / flowedge-make-demo-mamba-flow into models/ (skipped if present)
#   seed      the seed's programs with --device cpu and --device cuda, numbers compared
#   mix       flowedge_cuda_dp_mix models/diffusion_pusht.flowedge.safetensors --json $OUT/dp_mix.json
#   mamba     mamba_flow_bench models/mamba_flow.safetensors --device cuda (prefix 4, 10 Euler steps, batch 1: per action
#             and per decode step, graph census) -> $OUT/mamba_flow_cuda.{json,txt}; the same binary on the CPU, one
#             thread -> $OUT/mamba_flow_cpu_on_gpu_box.json; bench/pytorch_mamba_flow.py --device cuda (PyTorch eager,
#             transformers MambaModel) -> $OUT/mamba_flow_pytorch_cuda.json (needs torch with CUDA and transformers)
#   sanitize  compute-sanitizer memcheck + racecheck on the small-config GPU tests
#   pytorch   build the CUDA Python module in build-py (nanobind from `python3 -m nanobind --cmake_dir`; with
#             BUILD_PYTHON=1 in $BUILD instead, sharing the other stages' kernel objects), then
#             bench/pytorch_vs_flowedge_cuda.py: PyTorch eager / CUDA graph / torch.compile vs flowedge F32/BF16/F16
#             on the PushT demo checkpoint (needs torch with CUDA, numpy, safetensors, nanobind for python3); samples/s vs
#             batch against the roofs in dp_cuda_vs_pytorch.png (issue 21's sweep: PYTORCH_ARGS="--batches 8 16 32 64
#             128 256 --maths f32 tf32 bf16 --dtypes f32 bf16")
#   lerobot   issue 7 on the GPU: LeRobot + gym-pusht from carried wheels (.whl, see below) into /tmp/site_lerobot,
#             `FLOWEDGE_BACKEND=cuda pip install .` (sm_90) into /tmp/site_flowedge, models/dp_pusht made by LeRobot
#             itself (tools/make_reference_diffusion.py --pusht --policy-only), then flowedge-lerobot-replay --device
#             cuda (dp_small and PushT) and flowedge-lerobot-rollout --env pusht --device cuda --backend both
#             -> $OUT/lerobot_{replay_cuda,replay_pusht_cuda,rollout_pusht_cuda}.{json,md}, rollout histogram PNG.
#             LEROBOT_PARTS="replay rollout" (default) picks the parts; ROLLOUT_STEPS / ROLLOUT_EPISODES size the rollout.
#             Wheels (cp312, --no-deps): lerobot 0.4.4 and the modules its DiffusionPolicy / processor / dataset-
#             metadata imports need that the GPU image lacks (diffusers, draccus, datasets, deepdiff, dill,
#             multiprocess, pydantic(_core), gymnasium, gym-pusht, pymunk, pygame, shapely, ...), plus transformers
#             4.57.6 / tokenizers 0.22.2 / huggingface_hub 0.35.3 (LeRobot 0.4.4's range: the image's transformers 5
#             breaks the import of lerobot.policies, whose groot config dataclass it rejects). PyAV (a 40 MB
#             wheel: video decoding, never called with live or recorded array observations) does not fit the 64 MiB
#             carry, so an import-only stand-in is written whose functions raise if anything ever calls them.
#   policy    issue 19: diffusion_policy / diffusion_rgb_encoder tests (CPU and CUDA instances), bench/policy_bench on
#             the PushT-size image policy (F32, BF16), Python select_action overhead (needs BUILD_PYTHON=1 and target
#             _flowedge), LeRobot's select_action from carried wheels on the GPU and both on this CPU -> $OUT/policy.txt,
#             policy_bench_cuda_{f32,bf16}.json, python_overhead_{cuda,cpu}.json, lerobot_policy_cuda.json, policy_cpu.*
#   batch     issue 21: the batched policy's CUDA tests (diffusion_policy_batch; BATCH_TESTS=0 skips them) and
#             policy_bench --batch N for N in BATCH_SIZES (default 1 8 50 256) on the PushT-size image policy: time per
#             call and device bytes per batch, then with FLOWEDGE_CUDA_NO_LT=1 for N in BATCH_AB_SIZES (default 50 256;
#             empty skips) -> $OUT/batch.txt, policy_batch_cuda_b<N>{,_no_lt}.json
#   soak      issue 19: flowedge-lerobot-rollout --backend flowedge-policy --env pusht, 10,000 ticks at 10 ms on the GPU
#             and SOAK_CPU_TICKS at SOAK_CPU_PERIOD_MS on the CPU (gym-pusht wheels in .whl/gym; BUILD_PYTHON=1)
#             -> $OUT/soak_{cuda,cpu}.{json,png}
#   eval      issue 21 item 3 on the GPU: tools/compare_lerobot_eval.py (flowedge-lerobot-eval in its own process vs
#             LeRobot 0.4.4's eval_policy on the same seeds and initial noise, step for step) on the PushT-size image
#             policy, --policy.device cuda then cpu (EVAL_DEVICES), EVAL_EPISODES (default 50) episodes in batches of
#             EVAL_BATCH (50) of EVAL_STEPS (300, gym-pusht's own limit) steps on the GPU, EVAL_CPU_EPISODES (10) /
#             EVAL_CPU_BATCH (10) / EVAL_CPU_STEPS (100) on this host's cores -> $OUT/lerobot_eval_{cuda,cpu}.{json,md},
#             eval.txt. Needs BUILD_PYTHON=1 (target _flowedge), .bench-fixtures/dp_pusht_image, LeRobot's wheels in .whl
#             (tools/fetch_lerobot_wheels.sh) and gym-pusht's in .whl/gym (tools/fetch_lerobot_wheels.sh --gym).
#   rt        issue 25: builds rt_stress_bench + the real-time tests, runs reliability_realtime_options and
#             diffusion_policy_realtime (CPU and CUDA instances) -> $OUT/rt_tests.txt, then bench/run_rt_stress.sh on
#             the PushT-size image policy (.bench-fixtures/dp_pusht_image) quiet vs under stress-ng (or the script's
#             built-in load when stress-ng is absent), options off vs on: CUDA RT_CUDA_TICKS ticks per case (default
#             20000), CPU at 2 threads RT_CPU_SECONDS per case (default 40) -> $OUT/rt_stress_{cuda,cpu}.{json,md},
#             one PNG histogram per case. About 6 minutes after the build stage. RT_CASES picks the cases (e.g.
#             "stress_on stress_diag stress_sys": who else runs on the loop CPU, and every other process moved off it).
#   act       issue 23: builds act_policy + act_bench + ops_conv2d; the ACT tests' Cuda instances (transformer op bodies,
#             ActPolicy parity with LeRobot in F32 and within the TF32/BF16 bounds, no allocation after load on the
#             act_cam1 / act_cam2 fixtures) and the conv2d op test's (tensor-core path) -> $OUT/act.txt;
#             compute-sanitizer memcheck on all of them, racecheck + synccheck on the op tests; then, with LeRobot
#             wheels carried in .whl (as the lerobot stage), tools/make_reference_act.py --bench /tmp/act_bench (one
#             480x640 camera at LeRobot's default sizes; LeRobot's own CPU chunk time in /tmp/act_bench_ref/info.json)
#             and act_bench on it: chunk error vs LeRobot and chunk latency, CUDA F32 weights at math f32 / tf32 /
#             bf16, BF16 weights at f32, the previous paths for the A/B (exact kernels; previous attention tiling + flat
#             im2col: *_prev.json), and the CPU (ACT_CPU=0 skips it) -> $OUT/act_bench_cuda_<weights>_<math>.json,
#             act_bench_cpu.json, act_lerobot_info.json. About 6 minutes after the build.
#   prof      ncu per-kernel tables (clocks left alone, graph nodes one by one): one ACT chunk (act_bench --profile on
#             .bench-fixtures/act_bench, a weightless copy of tools/make_reference_act.py --bench's folder) at math
#             PROF_ACT_MATHS (default "f32 tf32 bf16"), and one PushT encoder call (policy_bench --encoder-only 1);
#             time, DRAM bytes, SM / memory throughput, grid, registers and active warps per kernel
#             -> $OUT/ncu_act_<math>.csv, ncu_encoder.csv, and the per-kernel summaries in $OUT/prof.txt
#   encoder   issue 19: the conv2d op test and the encoder / policy tests (CUDA instances), the PushT encoder alone in
#             rounds (ENC_ROUNDS x ENC_ITERS) with its features' bits hash, the policy chunk, ncu of one encoder call,
#             memcheck + racecheck on the conv op test (ENC_NCU=0 / ENC_SANITIZERS="..." trim them);
#             ENC_PREV_ENV="VAR=1 ..." alternates a previous kernel path, ENC_CUR_ENV sets the current path's switches,
#             ENC_BASE_SRC=DIR (a carried `git archive` of an earlier commit) times that tree's encoder in the same rounds
#             -> $OUT/encoder.txt and the files it names
#   flow      issue 20: the fused batch-1 flow solve and the fused whole action vs the per-op path (CUDA tests, also at
#             every block size and exchange of FLOW_MODES, default "256:barrier 512:barrier 1024:barrier 256:mbarrier
#             512:mbarrier 1024:mbarrier"; mamba_flow_bench per-op / --fused-solve / --fused-act in each mode,
#             alternated in FLOW_ROUNDS rounds, and FLOW_BASE_SRC's (default .base-src, when carried) fused paths;
#             the cluster exchange probe; PyTorch eager; sanitizers: FLOW_SANITIZE="tool:threads:exchange ...", each
#             cut at FLOW_SANITIZER_TIMEOUT s; the phase clock of each fused kernel (mamba_flow_bench --phases); ncu of
#             the fused kernels (FLOW_NCU=0 skips it) -> $OUT/flow.txt, cluster_exchange_probe.json,
#             mamba_flow_cuda_fused_{act,solve}_phases.json, ncu_flow__fused_{act,solve}.txt
#   unet      issues 20 / 21 (and 19's chunk): ops_norm / ops_conv1d / ops_elementwise / ops_math_mode CUDA cases, the
#             diffusion head, policy, batched policy and CUDA model tests (UNET_TEST_LIST picks them; UNET_ALT_TESTS
#             again under UNET_ALT_ENV),
#             memcheck + racecheck (under UNET_ALT_ENV) on UNET_SAN_TESTS ("test:filter" pairs; default ops_norm's CUDA
#             cases and the conv_transpose1d GEMM's; "none": no sanitizer run) (UNET_TESTS=0 skips them); flowedge_cuda_dp_mix
#             --samples-only / --math-only (UNET_PARTS, default "samples math") of this tree (cur), of this tree under
#             UNET_ALT_ENV="VAR=value ..." (alt) and of UNET_BASE_SRC's (base: a carried `git archive` of an earlier
#             commit with its COMMIT file), alternated UNET_ROUNDS (2) times; policy_bench chunk ticks (F32) of each
#             (UNET_POLICY=0 skips them); ncu per-kernel tables of one U-Net call per UNET_PROF spec
#             ("batch:math[:dtype]", e.g. "64:tf32 64:bf16:bf16") and tree; this tree's whole dp_mix with its kernel
#             table (UNET_MIX=0 skips it); bench/probe_conv1d_paths.py at each UNET_PROBE batch -> $OUT/unet.txt,
#             dp_mix_{cur,alt,base}_{samples,math}_rN.txt, policy_bench_cuda_f32_{cur,alt,base}.json,
#             ncu_unet_<tree>_b<batch>_<math>_<dtype>.csv, probe_conv1d_b<batch>.{txt,json}, dp_mix.{txt,json}
#   cpudiff   issue 22 on this host's CPU: PushT 10-step DDIM batch 1 (models/dp_pusht made by LeRobot from .whl) through
#             bench/run_diffusion_cpu.sh: flowedge (a CPU-only Release build in build-cpu) F32 / BF16 / INT8 weights at F32
#             and BF16 math, LeRobot's PyTorch U-Net, at CPUDIFF_THREADS ("1 2 4 8 16"), the read-bandwidth floor, lscpu
#             -> $OUT/cpudiff_xeon_host.{json,md}, lscpu.txt
#   cpuenc    issue 19 on this host's CPU: rgb_encoder_bench (a CPU-only Release build in build-cpu) on core CPUENC_CORE (2),
#             1 thread, --layers, Winograd (the default) and FLOWEDGE_CPU_CONV2D_NO_WINOGRAD=1 (direct) alternated
#             CPUENC_ROUNDS (3) times -> $OUT/cpuenc.txt, cpuenc_{wino,direct}_rN.json, lscpu.txt
#   cpumamba  issue 22 item 5 on this host's CPU: mamba_flow_bench (a CPU-only Release build in build-cpu) on core
#             CPUMAMBA_CORE (2), 1 thread, --parts, weights f32 / bf16 x math f32 / bf16, CPUMAMBA_ROUNDS (3) rounds
#             -> $OUT/cpumamba.txt, cpumamba_{dtype}_{math}_rN.json, lscpu.txt
#   asan      the whole CPU test suite under ASan + UBSan (tools/sanitize.sh on all cores) -> $OUT/asan{,_full}.txt
# Aliases: tests = gputests cputests; all = every stage (asan last).
# Every stage runs even if an earlier one failed; $OUT/summary.txt has one line per stage (exit code, seconds).
# At the end every other file of $OUT is packed into $OUT/results.tar.gz (the device tool returns few files). Files: summary.txt, gpu_tests.log, seed_compare.txt, dp_mix.txt, dp_mix.json, mamba_flow_cuda.{txt,json},
# mamba_flow_cpu_on_gpu_box.json, mamba_flow_pytorch_cuda.json, dp_cuda_vs_pytorch.{txt,json,md}, logs.tar.gz (all logs).
# Env: BUILD_DIR (default build-cuda), BUILD_PY_DIR (default build-py), JOBS (default nproc), MIX_ARGS (extra
# flowedge_cuda_dp_mix arguments), MAMBA_ARGS (extra mamba_flow_bench arguments, e.g. --iters 20000), PYTORCH_ARGS
# (extra bench/pytorch_vs_flowedge_cuda.py arguments, e.g. --no-compile).
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${OUT:-$ROOT/out}
BUILD=${BUILD_DIR:-build-cuda}
BUILD_PY=${BUILD_PY_DIR:-build-py}
JOBS=${JOBS:-$(nproc)}
LOGS=$OUT/logs
mkdir -p "$OUT" "$LOGS"
# A call that carries .whl and the fixtures may not fit .deps beside them in the 64 MiB carry: .carry/deps.tar.gz
# (`tar -czf .carry/deps.tar.gz --exclude=eigen3/unsupported --exclude=catch2 .deps`, ~1.3 MB) stands in for it.
[ -d .deps ] || [ ! -f .carry/deps.tar.gz ] || tar -xzf .carry/deps.tar.gz
SUMMARY=$OUT/summary.txt
T_START=$(date +%s)
echo "gpu_run.sh $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') stages: ${*:-all}" >> "$SUMMARY"

# run_stage NAME FUNCTION [ARG...]: runs FUNCTION ARG..., logs to $LOGS/NAME.log, records exit code and duration.
run_stage() {
    local name=$1 fn=$2 t0 rc
    shift 2
    t0=$(date +%s)
    echo "=== stage $name ($(date -u +%T))"
    ( set -o pipefail; "$fn" "$@" ) > "$LOGS/$name.log" 2>&1
    rc=$?
    printf '%-9s rc=%-3d %4ds\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" | tee -a "$SUMMARY"
    tail -n 5 "$LOGS/$name.log" | sed 's/^/    /'
}

stage_info() {
    nvidia-smi || true
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
    nvcc --version || /usr/local/cuda/bin/nvcc --version || true
    cmake --version; g++ --version | head -1; nproc; free -g || true
    ls "$ROOT/.deps" 2>/dev/null || echo "no .deps (nlohmann_json/CLI11 must be installed)"
    command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer || true
}

stage_build() {
    local gen=()
    command -v ninja > /dev/null && gen=(-G Ninja)
    local py=()
    # BUILD_PYTHON=1: the _flowedge extension in the same tree (shares flowedge_cuda; see python_site).
    [ "${BUILD_PYTHON:-0}" = 1 ] && py=(-DFLOWEDGE_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)"
                                      -Dnanobind_ROOT="$(python3 -m nanobind --cmake_dir)")
    if [ ! -f "$BUILD/CMakeCache.txt" ]; then
        cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DFLOWEDGE_BACKEND=cuda \
              -DFLOWEDGE_CUDA_ARCHITECTURES=90 -DFLOWEDGE_CUDA_FLOW_BLOCK_SIZES="${FLOW_BLOCK_SIZES:-256;512;1024}" \
              "${py[@]}" || return $?
    fi
    # BUILD_TARGETS="a b ...": only those targets (a short device call); default: everything. Under BUILD_PYTHON=1
    # _flowedge joins any such list: its bindings are the slowest translation units (~2 min on 16 cores, session 32),
    # so they compile alongside the kernels instead of after them in a later stage.
    local targets=${BUILD_TARGETS:-}
    [ -n "$targets" ] && [ "${BUILD_PYTHON:-0}" = 1 ] && [[ " $targets " != *" _flowedge "* ]] && targets+=" _flowedge"
    # shellcheck disable=SC2086
    cmake --build "$BUILD" -j "$JOBS" ${targets:+--target $targets}
}

stage_gputests() {
    ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 300 -j 1
    local rc=$?
    # Per-test detail (doctest MESSAGEs: measured errors, free bytes) of the model tests, even when they pass.
    [ -x "$BUILD/test/cuda/cuda_models" ] && "$BUILD/test/cuda/cuda_models" > "$LOGS/cuda_models_verbose.log" 2>&1
    return $rc
}

stage_cputests() { ctest --test-dir "$BUILD" -LE gpu --output-on-failure --timeout 300 -j "$JOBS"; }

# stage_demo [diffusion]: the demo checkpoints (only the U-Net's with "diffusion": the pytorch stage needs no other).
stage_demo() {
    mkdir -p models
    local rc=0
    [ -f models/diffusion_pusht.flowedge.safetensors ] || "$BUILD/flowedge-make-demo-diffusion" models/diffusion_pusht.flowedge.safetensors || rc=$?
    [ "${1:-}" = diffusion ] || [ -f models/mamba_flow.safetensors ] ||
        "$BUILD/flowedge-make-demo-mamba-flow" models/mamba_flow.safetensors || rc=$?
    ls -la models
    return $rc
}

# compare_numbers CPU_FILE CUDA_FILE LABEL: every number on every line (latency/device lines dropped) must agree to
# 1e-4 relative (printed precision is 6 significant digits; the seed saw 226.249 vs 226.25).
compare_numbers() {
    python3 - "$1" "$2" "$3" <<'PY'
import re, sys
a_path, b_path, label = sys.argv[1:4]
num = re.compile(r'[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?')
def rows(p):
    out = []
    for line in open(p, errors='replace'):
        if 'latency' in line or line.startswith('flowedge cuda'):
            continue
        line = re.sub(r'device=\S+', '', line)
        out.append(num.findall(line))
    return out
a, b = rows(a_path), rows(b_path)
worst, bad = 0.0, 0
if len(a) != len(b):
    print(f"{label}: MISMATCH line count {len(a)} (cpu) vs {len(b)} (cuda)"); sys.exit(1)
for ra, rb in zip(a, b):
    if len(ra) != len(rb):
        bad += 1; continue
    for x, y in zip(ra, rb):
        x, y = float(x), float(y)
        d = abs(x - y) / max(1.0, abs(x))
        worst = max(worst, d)
        if d > 1e-4: bad += 1
print(f"{label}: {'OK' if bad == 0 else 'MISMATCH'} ({sum(map(len, a))} numbers, worst rel diff {worst:.3g}, {bad} beyond 1e-4)")
sys.exit(1 if bad else 0)
PY
}

stage_seed() {
    local rc=0 cmp=$OUT/seed_compare.txt
    : > "$cmp"
    run_pair() {  # run_pair LABEL PROGRAM ARGS... : runs with --device cpu and --device cuda, compares
        local label=$1; shift
        for dev in cpu cuda; do
            echo "\$ $* --device $dev" > "$LOGS/seed_${label}_$dev.txt"
            "$@" --device "$dev" >> "$LOGS/seed_${label}_$dev.txt" 2>&1
            local r=$?
            echo "[exit $r]" >> "$LOGS/seed_${label}_$dev.txt"
            [ $r -eq 0 ] || { echo "$label --device $dev: exit $r" >> "$cmp"; rc=1; }
        done
        { echo "--- $label: $*"; cat "$LOGS/seed_${label}_cpu.txt" "$LOGS/seed_${label}_cuda.txt"; } >> "$cmp"
        compare_numbers "$LOGS/seed_${label}_cpu.txt" "$LOGS/seed_${label}_cuda.txt" "$label" >> "$cmp" 2>&1 || rc=1
    }
    for s in euler heun rk4; do run_pair "flow_$s" "$BUILD/flow_sample" models/mamba_flow.safetensors "$s" 10; done
    run_pair mamba_forward "$BUILD/mamba_forward" models/mamba_flow.safetensors 1 2 3 4
    run_pair diffusion_ddim10 "$BUILD/diffusion_sample" models/diffusion_pusht.flowedge.safetensors 10
    run_pair diffusion_ddpm10 "$BUILD/diffusion_sample" models/diffusion_pusht.flowedge.safetensors 10 --scheduler ddpm --seed 7
    run_pair dp_small_ddim10_b2 "$BUILD/diffusion_sample" test/fixtures/dp_small 10 --batch 2 \
        --cond test/fixtures/dp_small_ref/cond.npy --noise test/fixtures/dp_small_ref/noise.npy
    # --device cuda must fail closed when residency is impossible (FORCE_HOST) and succeed on the CPU path.
    FLOWEDGE_CUDA_FORCE_HOST=1 "$BUILD/mamba_forward" models/mamba_flow.safetensors 1 2 3 4 --device cuda > "$LOGS/seed_force_host.txt" 2>&1
    local r=$?
    echo "FORCE_HOST=1 mamba_forward --device cuda: exit $r (expected 2: fails closed)" >> "$cmp"
    [ $r -eq 2 ] || rc=1
    grep -E 'OK|MISMATCH|exit' "$cmp"
    return $rc
}

stage_mix() {
    "$BUILD/flowedge_cuda_dp_mix" models/diffusion_pusht.flowedge.safetensors --json "$OUT/dp_mix.json" ${MIX_ARGS:-} 2>&1 \
        | tee "$OUT/dp_mix.txt"
}

# mamba: flowedge on the GPU (fails closed, exit 2, unless resident), the same binary on one CPU thread, PyTorch eager
# on the GPU; a three-line comparison at the end (the summary shows the log's tail).
stage_mamba() {
    local rc=0 r
    "$BUILD/mamba_flow_bench" models/mamba_flow.safetensors --device cuda --json "$OUT/mamba_flow_cuda.json" ${MAMBA_ARGS:-} \
        2>&1 | tee "$OUT/mamba_flow_cuda.txt"
    r=${PIPESTATUS[0]}
    [ "$r" -eq 0 ] || { echo "mamba_flow_bench --device cuda: exit $r"; rc=$r; }
    OMP_NUM_THREADS=1 "$BUILD/mamba_flow_bench" models/mamba_flow.safetensors --device cpu --threads 1 \
        --json "$OUT/mamba_flow_cpu_on_gpu_box.json" ${MAMBA_ARGS:-}
    r=$?
    [ "$r" -eq 0 ] || { echo "mamba_flow_bench --device cpu: exit $r"; rc=$r; }
    # PyTorch eager baseline on the GPU (exit 77 without CUDA, 3 without transformers; it says why).
    python3 bench/pytorch_mamba_flow.py models/mamba_flow.safetensors --device cuda --json "$OUT/mamba_flow_pytorch_cuda.json"
    r=$?
    [ "$r" -eq 0 ] || { echo "pytorch_mamba_flow.py --device cuda: exit $r"; [ "$rc" -ne 0 ] || rc=$r; }
    python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
for label, name in (("flowedge cuda", "mamba_flow_cuda.json"), ("flowedge cpu 1 thread", "mamba_flow_cpu_on_gpu_box.json"),
                    ("pytorch eager cuda", "mamba_flow_pytorch_cuda.json")):
    try:
        j = json.load(open(os.path.join(out, name)))
    except (OSError, ValueError) as e:
        print(f"{label:22s} no result ({e.__class__.__name__})"); continue
    if "skipped" in j:
        print(f"{label:22s} skipped: {j['skipped']}"); continue
    a, d = j["action_us"], j.get("decode_step_us") or {}
    print(f"{label:22s} action p50 {a['p50']:9.1f} us  min {a['min']:9.1f}  p99 {a['p99']:9.1f} | decode p50 {d.get('p50', float('nan')):8.1f} us"
          + (f"  [{j['graph_census']['per_action']['kernel_nodes']} kernels/action]" if "graph_census" in j else ""))
PY
    return $rc
}

stage_sanitize() {
    local cs rc=0
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    [ -x "$cs" ] || { echo "compute-sanitizer not found"; return 3; }
    local models="$BUILD/test/cuda/cuda_models" family
    # The op tests' Cuda instances (test/ops, one binary per op family; -tc picks the TEST_CASE_TEMPLATE<flowedge::Cuda>).
    local op_families="linear conv1d conv_transpose1d norm elementwise mamba diffusion_step"
    # memcheck: the model tests (small fixtures) and the op tests; leak check on the model tests.
    timeout 150 "$cs" --tool memcheck --leak-check full --error-exitcode 99 "$models" \
        > "$LOGS/sanitize_memcheck_models.log" 2>&1 || rc=$?
    tail -n 3 "$LOGS/sanitize_memcheck_models.log"
    for family in $op_families; do
        timeout 90 "$cs" --tool memcheck --error-exitcode 99 "$BUILD/test/ops/ops_$family" -tc='*<flowedge::Cuda>*' \
            > "$LOGS/sanitize_memcheck_ops_$family.log" 2>&1 || rc=$?
        tail -n 3 "$LOGS/sanitize_memcheck_ops_$family.log"
    done
    # racecheck (shared-memory hazards): the paths that run every kernel family at small sizes.
    # (the diffusion model test's 100-step DDPM takes minutes under racecheck: its denoiser subcase runs every
    # U-Net kernel; the op tests below cover each kernel family at odd sizes)
    timeout 150 "$cs" --tool racecheck --racecheck-report hazard --error-exitcode 99 "$models" \
        -tc='DiffusionHead<Cuda> matches*' -sc='denoiser*' > "$LOGS/sanitize_racecheck_diffusion.log" 2>&1 || rc=$?
    tail -n 3 "$LOGS/sanitize_racecheck_diffusion.log"
    timeout 150 "$cs" --tool racecheck --racecheck-report hazard --error-exitcode 99 "$models" \
        -tc='Mamba<Cuda> matches*,FlowHead<Cuda> matches*' > "$LOGS/sanitize_racecheck_mamba_flow.log" 2>&1 || rc=$?
    tail -n 3 "$LOGS/sanitize_racecheck_mamba_flow.log"
    for family in $op_families; do
        timeout 90 "$cs" --tool racecheck --error-exitcode 99 "$BUILD/test/ops/ops_$family" -tc='*<flowedge::Cuda>*' \
            > "$LOGS/sanitize_racecheck_ops_$family.log" 2>&1 || rc=$?
        tail -n 3 "$LOGS/sanitize_racecheck_ops_$family.log"
    done
    return $rc
}

# asan: the whole CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer (tools/sanitize.sh, preset asan),
# on this box's cores (a 2-core CI machine needs ~1 h for it); summary -> $OUT/asan.txt.
stage_asan() {
    FLOWEDGE_JOBS=$JOBS CTEST_PARALLEL_LEVEL=$JOBS CTEST_OUTPUT_ON_FAILURE=1 bash tools/sanitize.sh 2>&1 | tee "$OUT/asan_full.txt"
    local rc=${PIPESTATUS[0]}
    grep -E "tests passed|tests failed|Total Test time|flowedge sanitize|\*\*\*Failed|Not Run|ERROR: AddressSanitizer|runtime error" \
        "$OUT/asan_full.txt" > "$OUT/asan.txt"
    return "$rc"
}

stage_pytorch() {
    local nbdir gen=() rc pydir
    if [ "${BUILD_PYTHON:-0}" = 1 ]; then
        # The module in $BUILD, sharing its flowedge_cuda objects with the other stages' targets (one CUDA build per
        # call; the separate build-py tree costs a second whole build of the kernels).
        BUILD_TARGETS=_flowedge stage_build || return $?
        pydir=$(python_site) || return $?
    else
        command -v ninja > /dev/null && gen=(-G Ninja)
        nbdir=$(python3 -m nanobind --cmake_dir) || { echo "python3 cannot import nanobind (pip install nanobind)"; return 3; }
        if [ ! -f "$BUILD_PY/CMakeCache.txt" ]; then
            cmake -S . -B "$BUILD_PY" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DFLOWEDGE_BACKEND=cuda \
                  -DFLOWEDGE_CUDA_ARCHITECTURES=90 -DFLOWEDGE_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" \
                  -Dnanobind_ROOT="$nbdir" || return $?
        fi
        cmake --build "$BUILD_PY" --target _flowedge -j "$JOBS" || return $?
        pydir=$BUILD_PY/python
    fi
    ls "$pydir"
    python3 bench/pytorch_vs_flowedge_cuda.py models/diffusion_pusht.flowedge.safetensors \
        --flowedge-path "$pydir" --json "$OUT/dp_cuda_vs_pytorch.json" --md "$OUT/dp_cuda_vs_pytorch.md" \
        --png "$OUT/dp_cuda_vs_pytorch.png" ${PYTORCH_ARGS:-} 2>&1 | tee "$OUT/dp_cuda_vs_pytorch.txt"
    rc=${PIPESTATUS[0]}
    # Also into the checkout, ready to commit with the other results.
    [ -f "$OUT/dp_cuda_vs_pytorch.json" ] && cp "$OUT/dp_cuda_vs_pytorch.json" "$OUT/dp_cuda_vs_pytorch.md" bench/results/
    return "$rc"
}

# LeRobot and the modules it imports, from the wheels carried in .whl, into SITE; PyAV (too large to carry) as an
# import-only stand-in.
lerobot_site() {
    local site=$1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl || return $?
    if ! PYTHONPATH=$site python3 -c "import av" 2> /dev/null; then
        mkdir -p "$site/av"
        cat > "$site/av/__init__.py" << 'PYEOF'
"""Import-only stand-in for PyAV on the GPU box (the real wheel exceeds the carry limit). LeRobot's
video_utils imports av at module level; nothing in a replay/rollout decodes video. Any use raises."""
import types as _types
logging = _types.SimpleNamespace(WARNING=30, ERROR=40, INFO=20, DEBUG=10,
                                 set_level=lambda *a, **k: None, restore_default_callback=lambda *a, **k: None)
def __getattr__(name):
    raise RuntimeError(f"av.{name}: PyAV is not installed on this machine (import-only stand-in)")
PYEOF
    fi
}

# gym-pusht and its env stack, from the wheels carried in .whl/gym, into SITE.
gym_site() {
    ls .whl/gym/*.whl > /dev/null 2>&1 || { echo "no .whl/gym/*.whl (tools/fetch_lerobot_wheels.sh --gym) carried"; return 3; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$1" .whl/gym/*.whl
}

stage_lerobot() {
    local site=/tmp/site_lerobot fe=/tmp/site_flowedge rc=0
    ls .whl/*.whl > /dev/null 2>&1 || { echo "no .whl/*.whl carried (see the lerobot stage comment)"; return 3; }
    lerobot_site "$site" || return $?
    FLOWEDGE_BACKEND=cuda python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir \
        --upgrade --target "$fe" -C cmake.define.FLOWEDGE_CUDA_ARCHITECTURES=90 -C build-dir=build-pip-cuda . || return $?
    export PYTHONPATH=$fe:$site
    python3 -c "import flowedge, lerobot, torch; print('flowedge', flowedge.__version__, 'cuda', flowedge.cuda, '| lerobot', lerobot.__version__, '| torch', torch.__version__)" || return $?
    [ -f models/dp_pusht/config.json ] || python3 tools/make_reference_diffusion.py --pusht --policy-only --threads "$JOBS" || return $?
    if [[ " ${LEROBOT_PARTS:-replay rollout} " == *" replay "* ]]; then
        python3 -m flowedge.replay test/fixtures/dp_small --device cuda --steps 50 --warmup 2 --threads 4 \
            --save-obs "$OUT/lerobot_replay_cuda_obs.npz" \
            --output "$OUT/lerobot_replay_cuda.json" --markdown "$OUT/lerobot_replay_cuda.md" || rc=$?
        python3 -m flowedge.replay models/dp_pusht --device cuda --steps 50 --warmup 2 --threads 4 \
            --save-obs /tmp/pusht_obs_cuda.npz \
            --output "$OUT/lerobot_replay_pusht_cuda.json" --markdown "$OUT/lerobot_replay_pusht_cuda.md" || rc=$?
    fi
    [[ " ${LEROBOT_PARTS:-replay rollout} " == *" rollout "* ]] || return "$rc"
    python3 -m flowedge.rollout --env pusht --policy models/dp_pusht --device cuda --steps ${ROLLOUT_STEPS:-150} \
        --episodes ${ROLLOUT_EPISODES:-2} --backend both --threads 4 --period-ms 100 --no-progress \
        --output "$OUT/lerobot_rollout_pusht_cuda.json" --histogram "$OUT/lerobot_rollout_pusht_cuda.png" || rc=$?
    return "$rc"
}

# The flowedge package as pip would lay it out (python/flowedge + the _flowedge built by `BUILD_PYTHON=1 ... build`
# with target _flowedge) in /tmp/site_flowedge_build; prints that folder.
python_site() {
    local site=/tmp/site_flowedge_build
    ls "$BUILD"/python/_flowedge*.so > /dev/null 2>&1 || { echo "no $BUILD/python/_flowedge*.so: build with BUILD_PYTHON=1 and target _flowedge" >&2; return 3; }
    rm -rf "$site" && mkdir -p "$site/flowedge" && cp python/flowedge/*.py "$BUILD"/python/_flowedge*.so "$site/flowedge/"
    echo "$site"
}

# The PushT-size image policy folder (model.safetensors rebuilt from the weightless fixture in POLICY_FIXTURE, default
# .bench-fixtures/dp_pusht_image, written by tools/make_reference_dp_image.py --pusht) in /tmp/dp_pusht_image.
POLICY_FOLDER=/tmp/dp_pusht_image
policy_folder() {
    local fix=${POLICY_FIXTURE:-.bench-fixtures/dp_pusht_image}
    [ -f "$POLICY_FOLDER/model.safetensors" ] && return 0
    [ -d "$fix" ] || { echo "no $fix (see tools/README.md: the image-policy fixtures)"; return 3; }
    "$BUILD/policy_bench" "$POLICY_FOLDER" --rebuild-from "$fix" --device cpu --encoder-only 1 > /dev/null
}

# Issue 19 on the GPU: the whole-policy tests' CUDA instances; the PushT-size image policy timed by bench/policy_bench
# (F32, BF16 weights); LeRobot's own select_action on the same folder (wheels in .whl, tools/fetch_lerobot_wheels.sh)
# on the GPU and, with bench/run_policy_cpu.sh, flowedge vs LeRobot on this host's CPU; and, when _flowedge was built,
# the Python select_action overhead over the C++ call (python/tests/time_select_action.py).
stage_policy() {
    local rc=0 site=/tmp/site_lerobot fe
    for t in diffusion_policy diffusion_rgb_encoder; do
        "$BUILD/test/diffusion/$t" > "$LOGS/test_$t.log" 2>&1 || rc=$?
        grep -E "MESSAGE|ERROR|test cases|skipped" "$LOGS/test_$t.log" | tee -a "$OUT/policy.txt"
    done
    policy_folder || return $?
    for dt in f32 bf16; do
        "$BUILD/policy_bench" "$POLICY_FOLDER" --device cuda --dtype "$dt" --ticks ${POLICY_TICKS:-200} \
            --json "$OUT/policy_bench_cuda_$dt.json" 2>&1 | tee -a "$OUT/policy.txt" || rc=$?
    done
    if fe=$(python_site); then
        for dev in cuda cpu; do
            PYTHONPATH=$fe OMP_NUM_THREADS=4 python3 python/tests/time_select_action.py "$POLICY_FOLDER" --device $dev \
                --n ${POLICY_PY_N:-400} > "$OUT/python_overhead_$dev.json" 2>> "$OUT/policy.txt" || rc=$?
            cat "$OUT/python_overhead_$dev.json" >> "$OUT/policy.txt"
        done
    fi
    if ls .whl/*.whl > /dev/null 2>&1 && [ -f bench/lerobot_policy_bench.py ]; then
        lerobot_site "$site" || return $?
        PYTHONPATH=$site python3 bench/lerobot_policy_bench.py "$POLICY_FOLDER" --device cuda --ticks ${POLICY_TICKS:-200} \
            --json "$OUT/lerobot_policy_cuda.json" 2>&1 | tee -a "$OUT/policy.txt" || rc=$?
        if [ "${POLICY_CPU:-1}" = 1 ]; then
            PYTHONPATH=$site bash bench/run_policy_cpu.sh "$POLICY_FOLDER" "$BUILD" python3 2>&1 | tee -a "$OUT/policy.txt" || rc=$?
            cp bench/results/policy_cpu.json bench/results/policy_cpu.md "$OUT/" 2>/dev/null
        fi
    fi
    return "$rc"
}

# Issue 21 items 2 and 4 on the GPU: the batched policy's CUDA test instances (batch 3 vs three batch-1 policies, no
# allocation after load, a batch the card cannot hold refused at load before allocating), then policy_bench on the
# PushT-size image policy at each of BATCH_SIZES (select_action and the U-Net sample per call, device bytes per batch)
# -> $OUT/batch.txt, policy_batch_cuda_b<N>.json.
# The batched policy's CUDA tests, the batched F32 U-Net's GEMM op test and the head against the CPU at batch 16.
batch_tests() {
    local rc=0
    "$BUILD/test/diffusion/diffusion_policy_batch" > "$LOGS/diffusion_policy_batch.log" 2>&1 || rc=$?
    grep -E "MESSAGE|ERROR|CHECK|test cases|skipped|needs" "$LOGS/diffusion_policy_batch.log" | tee -a "$OUT/batch.txt"
    "$BUILD/test/ops/ops_math_mode" -tc='conv1d_gemm*' > "$LOGS/batch_conv1d_gemm.log" 2>&1 || rc=$?
    grep -E "f32 gemm|ERROR|CHECK|test cases" "$LOGS/batch_conv1d_gemm.log" | tail -n 12 | tee -a "$OUT/batch.txt"
    "$BUILD/test/cuda/cuda_models" -tc='DiffusionHead*' > "$LOGS/batch_cuda_models.log" 2>&1 || rc=$?
    grep -E "MESSAGE|batch 16|ERROR|CHECK|test cases" "$LOGS/batch_cuda_models.log" | tail -n 14 | tee -a "$OUT/batch.txt"
    return "$rc"
}

stage_batch() {
    local rc=0
    BUILD_TARGETS="diffusion_policy_batch policy_bench cuda_models ops_math_mode" stage_build || return $?
    if [ "${BATCH_TESTS:-1}" = 1 ]; then batch_tests || rc=$?; fi
    policy_folder || return $?
    for b in ${BATCH_SIZES:-1 8 50 256}; do
        "$BUILD/policy_bench" "$POLICY_FOLDER" --device cuda --batch "$b" --ticks "${BATCH_TICKS:-64}" \
            --json "$OUT/policy_batch_cuda_b$b.json" 2>&1 | tee -a "$OUT/batch.txt" || rc=$?
    done
    # The previous batched F32 path (exact kernels, no library GEMM) in the same call, for the A/B.
    for b in ${BATCH_AB_SIZES-50 256}; do
        FLOWEDGE_CUDA_NO_LT=1 "$BUILD/policy_bench" "$POLICY_FOLDER" --device cuda --batch "$b" --ticks "${BATCH_TICKS:-64}" \
            --json "$OUT/policy_batch_cuda_b${b}_no_lt.json" 2>&1 | tee -a "$OUT/batch.txt" || rc=$?
    done
    return "$rc"
}

# Issue 19 item 7: the closed loop with no torch. flowedge-lerobot-rollout --backend flowedge-policy --env pusht
# (gym-pusht from the wheels in .whl/gym) on the PushT-size image policy: SOAK_TICKS ticks at a 10 ms period on the
# GPU, then SOAK_CPU_TICKS at SOAK_CPU_PERIOD_MS on the CPU (SOAK_CPU_THREADS threads); JSON with RSS / device memory
# at start, after warm-up and at the end, latency percentiles and a histogram PNG per run.
stage_soak() {
    local rc=0 gym=/tmp/site_gym fe steps=${SOAK_STEPS:-1000}
    gym_site "$gym" || return $?
    fe=$(python_site) || return $?
    policy_folder || return $?
    PYTHONPATH=$fe:$gym python3 -m flowedge.rollout --backend flowedge-policy --env pusht --policy "$POLICY_FOLDER" \
        --device cuda --steps "$steps" --episodes $(( (${SOAK_TICKS:-10000} + steps - 1) / steps )) --period-ms 10 \
        --on-miss hold --no-progress --output "$OUT/soak_cuda.json" --histogram "$OUT/soak_cuda.png" 2>&1 \
        | grep -v "UserWarning\|logger.warn" | tee -a "$OUT/soak.txt" || rc=$?
    [ "${SOAK_CPU_TICKS:-250}" -gt 0 ] || return "$rc"
    PYTHONPATH=$fe:$gym OMP_NUM_THREADS=${SOAK_CPU_THREADS:-12} python3 -m flowedge.rollout --backend flowedge-policy \
        --env pusht --policy "$POLICY_FOLDER" --device cpu --steps ${SOAK_CPU_TICKS:-250} --episodes 1 \
        --period-ms ${SOAK_CPU_PERIOD_MS:-600} --on-miss hold --no-progress --output "$OUT/soak_cpu.json" \
        --histogram "$OUT/soak_cpu.png" 2>&1 | grep -v "UserWarning\|logger.warn" | tee -a "$OUT/soak.txt" || rc=$?
    return "$rc"
}

stage_eval() {
    local rc=0 site=/tmp/site_lerobot gym=/tmp/site_gym fe dev
    ls .whl/*.whl > /dev/null 2>&1 || { echo "no .whl/*.whl carried (tools/fetch_lerobot_wheels.sh)"; return 3; }
    lerobot_site "$site" || return $?
    gym_site "$gym" || return $?
    fe=$(python_site) || return $?
    policy_folder || return $?
    for dev in ${EVAL_DEVICES:-cuda cpu}; do
        local size=(--eval.batch_size="${EVAL_BATCH:-50}" --eval.n_episodes="${EVAL_EPISODES:-50}" --env.episode_length="${EVAL_STEPS:-300}")
        [ "$dev" = cpu ] && size=(--eval.batch_size="${EVAL_CPU_BATCH:-10}" --eval.n_episodes="${EVAL_CPU_EPISODES:-10}" \
            --env.episode_length="${EVAL_CPU_STEPS:-100}")
        PYTHONPATH=$fe:$site:$gym python3 tools/compare_lerobot_eval.py --policy.path="$POLICY_FOLDER" --env.type=pusht \
            "${size[@]}" --policy.device="$dev" --threads "$JOBS" --max-render-videos 0 --no-progress \
            --report "$OUT/lerobot_eval_$dev" > "$LOGS/eval_$dev.log" 2>&1 || rc=$?
        grep -v "UserWarning\|logger.warn" "$LOGS/eval_$dev.log" | tail -n 30 | sed "s/^/$dev: /" | tee -a "$OUT/eval.txt"
    done
    return "$rc"
}

stage_rt() {
    local rc=0 fix=${POLICY_FIXTURE:-.bench-fixtures/dp_pusht_image} folder=/tmp/dp_pusht_image
    BUILD_TARGETS="rt_stress_bench diffusion_policy_realtime reliability_realtime_options" stage_build || return $?
    for t in reliability/reliability_realtime_options diffusion/diffusion_policy_realtime; do
        "$BUILD/test/$t" > "$LOGS/rt_$(basename "$t").log" 2>&1 || rc=$?
        grep -E "MESSAGE|ERROR|test cases|skipped" "$LOGS/rt_$(basename "$t").log" | tee -a "$OUT/rt_tests.txt"
    done
    [ -d "$fix" ] || { echo "no $fix: skipping the stress benchmark" | tee -a "$OUT/rt_tests.txt"; return 1; }
    # The GPU image has no stress-ng and no network: a binary and its libraries carried in .deps/stress-ng/{bin,lib}
    # (tools/carry_stress_ng.sh) are used when present.
    command -v stress-ng > /dev/null || [ ! -x .deps/stress-ng/bin/stress-ng ] || export PATH=$ROOT/.deps/stress-ng/bin:$PATH
    stress-ng --version 2>&1 | tee -a "$OUT/rt_tests.txt"
    for dev in ${RT_DEVICES:-cuda cpu}; do
        local size=(--seconds "${RT_CPU_SECONDS:-40}" --threads 2)
        [ "$dev" = cuda ] && size=(--ticks "${RT_CUDA_TICKS:-20000}")
        local cases=${RT_CASES:-quiet_off quiet_on stress_off stress_on}
        bench/run_rt_stress.sh "$folder" --rebuild-from "$fix" --device "$dev" "${size[@]}" --bench "$BUILD/rt_stress_bench" \
            --out "$OUT" --cases "$cases" || rc=$?
        for c in $cases; do  # kept in rt_stress_$dev.json and the PNGs
            rm -f "$OUT/rt_stress_${dev}_$c.json" "$OUT/rt_stress_${dev}_$c.samples.txt"
        done
    done
    return "$rc"
}

stage_prof() {
    local rc=0 ncu act=/tmp/act_prof fix=${POLICY_FIXTURE:-.bench-fixtures/dp_pusht_image}
    ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    BUILD_TARGETS="act_bench policy_bench" stage_build || return $?
    local metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed
    metrics+=,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size
    metrics+=,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
    local ncu_run=("$ncu" --clock-control none --graph-profiling node --csv --metrics "$metrics")
    if [ -d .bench-fixtures/act_bench ]; then
        [ -f "$act/model.safetensors" ] || "$BUILD/act_bench" "$act" --rebuild-from .bench-fixtures/act_bench --device cuda --chunks 8 \
            > "$LOGS/prof_act_rebuild.log" 2>&1 || rc=$?
        for math in ${PROF_ACT_MATHS:-f32 tf32 bf16}; do
            "${ncu_run[@]}" --profile-from-start off "$BUILD/act_bench" "$act" --device cuda --math "$math" --profile \
                > "$OUT/ncu_act_$math.csv" 2> "$LOGS/prof_act_$math.err" || rc=$?
            python3 tools/ncu_kernel_summary.py "$OUT/ncu_act_$math.csv" 40 --all 2>&1 | tee -a "$OUT/prof.txt"
        done
    else
        echo "no .bench-fixtures/act_bench: no ACT profile" | tee -a "$OUT/prof.txt"
    fi
    [ -f /tmp/dp_pusht_image/model.safetensors ] || [ ! -d "$fix" ] || "$BUILD/policy_bench" /tmp/dp_pusht_image --rebuild-from "$fix" \
        --device cuda --encoder-only 1 > "$LOGS/prof_encoder_rebuild.log" 2>&1 || rc=$?
    "${ncu_run[@]}" "$BUILD/policy_bench" /tmp/dp_pusht_image --device cuda --encoder-only 1 > "$OUT/ncu_encoder.csv" \
        2> "$LOGS/prof_encoder.err" || rc=$?
    python3 tools/ncu_kernel_summary.py "$OUT/ncu_encoder.csv" 40 2>&1 | tee -a "$OUT/prof.txt"
    return "$rc"
}

# Issue 20's Mamba-flow action on the GPU: the fused batch-1 flow solve (kernels/cuda/flow_solve.cu) against the per-op
# solve: the FlowHead / MambaFlowPolicy CUDA tests (bit-equality of the two, parity with the CPU and PyTorch), then
# mamba_flow_bench on the demo checkpoint per-op, --fused-solve and --fused-act alternated FLOW_ROUNDS times, PyTorch
# eager in the same call, ncu of the two fused kernels (FLOW_NCU=0 skips it), compute-sanitizer memcheck / racecheck /
# synccheck on the fused tests -> $OUT/flow.txt, mamba_flow_cuda_{per_op,fused_solve,fused_act}_r<N>.json,
# mamba_flow_pytorch_cuda.json, ncu_flow__fused_{act,solve}.txt
stage_flow() {
    local rc=0 r path m modes=${FLOW_MODES:-256:barrier 512:barrier 1024:barrier 256:mbarrier 512:mbarrier 1024:mbarrier}
    local fused_cases='*fused batch-1 solve*,*fused action*'
    # FLOW_BASE_SRC (default .base-src, a `git archive` of an earlier commit, carried): its mamba_flow_bench is built
    # alongside and timed in the same rounds (its default fused mode), for the A/B against that tree.
    local base=${FLOW_BASE_SRC:-.base-src} base_bin='' bpid=''
    if [ -f "$base/CMakeLists.txt" ]; then
        base_bin=build-flow-base/mamba_flow_bench
        build_base_tree "$base" build-flow-base flow mamba_flow_bench
        bpid=$!
    fi
    BUILD_TARGETS="mamba_flow_bench cuda_models flowedge-make-demo-mamba-flow cuda_cluster_exchange_probe" stage_build || return $?
    if [ -n "$bpid" ]; then
        wait "$bpid" || { echo "base tree $base ($(cat "$base/COMMIT" 2>/dev/null)): build failed" | tee -a "$OUT/flow.txt"; base_bin=; }
    fi
    mkdir -p models
    [ -f models/mamba_flow.safetensors ] || "$BUILD/flowedge-make-demo-mamba-flow" models/mamba_flow.safetensors || rc=$?
    "$BUILD/test/cuda/cuda_models" -tc='FlowHead*,MambaFlow*,Mamba<Cuda>*' > "$LOGS/flow_tests.log" 2>&1 || rc=$?
    grep -E "MESSAGE|ERROR|CHECK|test cases|skipped|x " "$LOGS/flow_tests.log" | tee -a "$OUT/flow.txt"
    # The fused kernels at every block size and exchange (threads:exchange; the bits must not depend on either).
    for m in $modes; do
        FLOWEDGE_CUDA_FLOW_THREADS=${m%:*} FLOWEDGE_CUDA_FLOW_EXCHANGE=${m#*:} "$BUILD/test/cuda/cuda_models" -tc="$fused_cases" \
            > "$LOGS/flow_tests_${m/:/_}.log" 2>&1 || rc=$?
        grep -E "ERROR|CHECK|test cases" "$LOGS/flow_tests_${m/:/_}.log" | sed "s/^/$m: /" | tee -a "$OUT/flow.txt"
    done
    for r in $(seq 1 ${FLOW_ROUNDS:-2}); do
        "$BUILD/mamba_flow_bench" models/mamba_flow.safetensors --device cuda --json "$OUT/mamba_flow_cuda_per_op_r$r.json" \
            ${MAMBA_ARGS:-} 2>&1 | sed "s/^/per_op r$r: /" | tee -a "$OUT/flow.txt" || rc=$?
        if [ -n "$base_bin" ]; then
            for path in fused_solve fused_act; do
                "$base_bin" models/mamba_flow.safetensors --device cuda --${path/_/-} --json "$OUT/mamba_flow_cuda_${path}_base_r$r.json" \
                    ${MAMBA_ARGS:-} 2>&1 | grep -E "action|solve|prefill|Error|error" | sed "s/^/$path base r$r: /" | tee -a "$OUT/flow.txt" || rc=$?
            done
        fi
        for m in $modes; do
            for path in fused_solve fused_act; do
                FLOWEDGE_CUDA_FLOW_THREADS=${m%:*} FLOWEDGE_CUDA_FLOW_EXCHANGE=${m#*:} "$BUILD/mamba_flow_bench" \
                    models/mamba_flow.safetensors --device cuda --${path/_/-} --json "$OUT/mamba_flow_cuda_${path}_${m/:/_}_r$r.json" \
                    ${MAMBA_ARGS:-} 2>&1 | grep -E "action|solve|prefill|Error|error" | sed "s/^/$path $m r$r: /" | tee -a "$OUT/flow.txt" || rc=$?
            done
        done
    done
    # The default mode's phase clock: cycles per phase of one fused launch (block 0), each path.
    for path in fused_act fused_solve; do
        "$BUILD/mamba_flow_bench" models/mamba_flow.safetensors --device cuda --${path/_/-} --phases --iters 200 --warmup 20 \
            --json "$OUT/mamba_flow_cuda_${path}_phases.json" 2>&1 | sed "s/^/phases $path: /" | tee -a "$OUT/flow.txt" || rc=$?
    done
    # One exchange step alone (cluster barrier vs st.async + mbarrier), the floor under each fused layer.
    "$BUILD/cuda_cluster_exchange_probe" --json "$OUT/cluster_exchange_probe.json" 2>&1 | tee -a "$OUT/flow.txt" || rc=$?
    python3 bench/pytorch_mamba_flow.py models/mamba_flow.safetensors --device cuda --json "$OUT/mamba_flow_pytorch_cuda.json" \
        2>&1 | tail -n 3 | tee -a "$OUT/flow.txt"
    # Sanitizers (FLOW_SANITIZE="tool:threads:exchange ...", each cut at FLOW_SANITIZER_TIMEOUT s): memcheck on the
    # fused tests, racecheck and synccheck on their one-configuration case (the loops outrun racecheck's time).
    local san item tool cases
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    for item in ${FLOW_SANITIZE-memcheck:512:mbarrier racecheck:512:mbarrier synccheck:512:mbarrier racecheck:512:barrier}; do
        tool=${item%%:*} m=${item#*:} cases=$fused_cases
        [ "$tool" = memcheck ] || cases='*one configuration each*'
        FLOWEDGE_CUDA_FLOW_THREADS=${m%:*} FLOWEDGE_CUDA_FLOW_EXCHANGE=${m#*:} timeout ${FLOW_SANITIZER_TIMEOUT:-120} "$san" \
            --tool $tool --error-exitcode 9 "$BUILD/test/cuda/cuda_models" -tc="$cases" > "$LOGS/flow_${item//:/_}.log" 2>&1 || rc=$?
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test cases" "$LOGS/flow_${item//:/_}.log" | sed "s/^/$item: /" | tee -a "$OUT/flow.txt"
    done
    # Where the fused kernels' time goes (bench/results/mamba_flow_cuda_fused.md): speed of light, warp stall
    # reasons, occupancy, two launches of each, at the default block size and exchange.
    if [ "${FLOW_NCU:-1}" = 1 ]; then
        local ncu path_flag
        ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
        for path_flag in --fused-act --fused-solve; do
            "$ncu" --clock-control none -k regex:'mamba_flow_act|flow_solve' -c 2 --section SpeedOfLight --section WarpStateStats \
                --section Occupancy --section LaunchStats --section SchedulerStats --print-details all \
                "$BUILD/mamba_flow_bench" models/mamba_flow.safetensors --device cuda $path_flag --iters 10 --warmup 0 \
                > "$OUT/ncu_flow${path_flag//-/_}.txt" 2>&1 || rc=$?
            grep -E "Duration|Stall|Issued|Achieved Occupancy|Registers|Eligible" "$OUT/ncu_flow${path_flag//-/_}.txt" \
                | head -n 40 | sed "s/^/ncu $path_flag: /" | tee -a "$OUT/flow.txt"
        done
    fi
    return "$rc"
}

# Issue 19's GPU encoder: the conv op tests and the encoder / policy tests (CUDA instances), then the PushT encoder alone
# (policy_bench --encoder-only, ENC_ITERS runs, ENC_ROUNDS rounds, with the features' bits hash), the whole policy's
# chunk, ncu per-kernel table of one encoder call, compute-sanitizer memcheck + racecheck on the conv op test. With
# ENC_PREV_ENV="VAR=1 ..." (the switches that select a previous kernel path) every test and timing also runs under
# those variables, alternated with the current path, for the A/B
# -> $OUT/encoder.txt, encoder_{cur,prev,base}_r<N>.txt, policy_bench_cuda_f32_{cur,prev}.json, ncu_encoder.csv.
stage_encoder() {
    local rc=0 cuda_cases='*<flowedge::Cuda>*' prev=${ENC_PREV_ENV:-} cur=${ENC_CUR_ENV:-} paths=cur
    [ -n "$prev" ] && paths="cur prev"
    # ENC_BASE_SRC (a `git archive` of an earlier commit with its COMMIT file, carried; unset: none): its policy_bench
    # is built alongside and timed in the same rounds, for the A/B against that tree's kernels.
    local base=${ENC_BASE_SRC:-} base_bin='' bpid=''
    if [ -n "$base" ] && [ -f "$base/CMakeLists.txt" ]; then
        base_bin=build-enc-base/policy_bench
        build_base_tree "$base" build-enc-base enc policy_bench
        bpid=$!
    fi
    BUILD_TARGETS="policy_bench ops_conv2d diffusion_rgb_encoder diffusion_policy" stage_build || return $?
    if [ -n "$bpid" ]; then
        wait "$bpid" || { echo "base tree $base ($(cat "$base/COMMIT" 2>/dev/null)): build failed" | tee -a "$OUT/encoder.txt"; base_bin=; }
    fi
    local path e t
    for path in $paths; do
        e=$cur; [ $path = prev ] && e=$prev
        env $e "$BUILD/test/ops/ops_conv2d" -tc="$cuda_cases" > "$LOGS/enc_conv2d_$path.log" 2>&1 || rc=$?
        for t in diffusion_rgb_encoder diffusion_policy; do
            env $e "$BUILD/test/diffusion/$t" -tc="$cuda_cases" > "$LOGS/enc_${t}_$path.log" 2>&1 || rc=$?
        done
        grep -hE "MESSAGE|ERROR|CHECK|test cases|skipped" "$LOGS"/enc_*_$path.log | sed "s/^/$path: /" | tee -a "$OUT/encoder.txt"
    done
    policy_folder || return $?
    local r
    for r in $(seq 1 ${ENC_ROUNDS:-3}); do
        for path in $paths; do
            e=$cur; [ $path = prev ] && e=$prev
            env $e "$BUILD/policy_bench" "$POLICY_FOLDER" --device cuda --encoder-only ${ENC_ITERS:-400} \
                > "$OUT/encoder_${path}_r$r.txt" 2>&1 || rc=$?
            sed "s/^/$path r$r: /" "$OUT/encoder_${path}_r$r.txt" | tee -a "$OUT/encoder.txt"
        done
        if [ -n "$base_bin" ]; then
            "$base_bin" "$POLICY_FOLDER" --device cuda --encoder-only ${ENC_ITERS:-400} > "$OUT/encoder_base_r$r.txt" 2>&1 || rc=$?
            sed "s/^/base r$r: /" "$OUT/encoder_base_r$r.txt" | tee -a "$OUT/encoder.txt"
        fi
    done
    for path in $paths; do
        e=$cur; [ $path = prev ] && e=$prev
        env $e "$BUILD/policy_bench" "$POLICY_FOLDER" --device cuda --dtype f32 --ticks ${POLICY_TICKS:-200} \
            --json "$OUT/policy_bench_cuda_f32_$path.json" 2>&1 | sed "s/^/$path: /" | tee -a "$OUT/encoder.txt" || rc=$?
    done
    if [ "${ENC_NCU:-1}" = 1 ]; then
        local ncu metrics=gpu__time_duration.sum,dram__bytes_read.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed
        ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
        metrics+=,launch__grid_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
        "$ncu" --clock-control none --graph-profiling node --csv --metrics "$metrics" "$BUILD/policy_bench" "$POLICY_FOLDER" \
            --device cuda --encoder-only 1 > "$OUT/ncu_encoder.csv" 2> "$LOGS/enc_ncu.err" || rc=$?
        python3 tools/ncu_kernel_summary.py "$OUT/ncu_encoder.csv" 40 2>&1 | tee -a "$OUT/encoder.txt"
    fi
    local san
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    for tool in ${ENC_SANITIZERS-memcheck racecheck}; do
        "$san" --tool $tool --error-exitcode 9 "$BUILD/test/ops/ops_conv2d" -tc="$cuda_cases" > "$LOGS/enc_$tool.log" 2>&1 || rc=$?
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test cases" "$LOGS/enc_$tool.log" | sed "s/^/$tool: /" | tee -a "$OUT/encoder.txt"
    done
    return "$rc"
}

# build_base_tree SRC DIR NAME TARGET...: starts, in the background, a CUDA Release build of TARGETs from the carried
# source tree SRC (a `git archive` of an earlier commit) in DIR, logging to $LOGS/NAME_base_build.log; the caller
# waits on $!.
build_base_tree() {
    local src=$1 dir=$2 name=$3
    shift 3
    ( cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLOWEDGE_BACKEND=cuda \
          -DFLOWEDGE_CUDA_ARCHITECTURES=90 -DFLOWEDGE_DEPS_DIR="$ROOT/.deps" && \
          cmake --build "$dir" -j "$JOBS" --target "$@" ) > "$LOGS/${name}_base_build.log" 2>&1 &
}

stage_unet() {
    local rc=0 cuda_cases='*<flowedge::Cuda>*' base=${UNET_BASE_SRC:-} bdir=build-unet-base bpid='' trees=cur t r tree bin part e spec
    if [ -n "$base" ] && [ -f "$base/CMakeLists.txt" ]; then
        build_base_tree "$base" $bdir unet flowedge_cuda_dp_mix policy_bench diffusion_sample
        bpid=$!
    fi
    local targets="flowedge_cuda_dp_mix policy_bench flowedge-make-demo-diffusion diffusion_sample"
    local tests=${UNET_TEST_LIST:-ops/ops_norm ops/ops_conv1d ops/ops_elementwise ops/ops_math_mode diffusion/diffusion_head \
        diffusion/diffusion_policy diffusion/diffusion_policy_batch cuda/cuda_models}
    if [ "${UNET_TESTS:-1}" = 1 ]; then
        for t in $tests ${UNET_ALT_TESTS:-}; do targets+=" $(basename "$t")"; done
        for spec in ${UNET_SAN_TESTS:-ops/ops_norm ops/ops_math_mode}; do [ "$spec" = none ] && continue; targets+=" $(basename "${spec%%:*}")"; done  # default: below
    fi
    BUILD_TARGETS=$targets stage_build || return $?
    if [ -n "$bpid" ]; then
        if wait "$bpid"; then trees="cur base"; else echo "base tree $base: build failed" | tee -a "$OUT/unet.txt"; fi
    fi
    [ -n "${UNET_ALT_ENV:-}" ] && trees="cur alt ${trees#cur}"
    echo "base tree: $(cat "$base/COMMIT" 2>/dev/null || echo none); alt: ${UNET_ALT_ENV:-none}" | tee -a "$OUT/unet.txt"
    if [ "${UNET_TESTS:-1}" = 1 ]; then
        # Only the templated op tests name their backend (`<flowedge::Cuda>`); the others run whole.
        local tc=()
        for t in $tests; do
            tc=(); [ "$t" != ops/ops_math_mode ] && [ "${t#ops/}" != "$t" ] && tc=(-tc="$cuda_cases")
            "$BUILD/test/$t" "${tc[@]}" > "$LOGS/unet_$(basename $t).log" 2>&1 || rc=$?
        done
        if [ -n "${UNET_ALT_ENV:-}" ]; then  # the alternative path's own test run (UNET_ALT_TESTS)
            for t in ${UNET_ALT_TESTS:-ops/ops_conv1d diffusion/diffusion_head cuda/cuda_models}; do
                tc=(); [ "$t" != ops/ops_math_mode ] && [ "${t#ops/}" != "$t" ] && tc=(-tc="$cuda_cases")
                env $UNET_ALT_ENV "$BUILD/test/$t" "${tc[@]}" > "$LOGS/unet_alt_$(basename $t).log" 2>&1 || rc=$?
            done
        fi
        grep -HE "ERROR|test cases" "$LOGS"/unet_*.log | sed "s|$LOGS/||" | tee -a "$OUT/unet.txt"
        local san
        san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
        # UNET_SAN_TESTS: "test:filter" pairs, each run under memcheck and racecheck (UNET_ALT_ENV set for the alt path's),
        # cut at UNET_SAN_TIMEOUT s. Racecheck reports hazards inside cuBLASLt's sm_90 GEMMs (nvjet*, whose asynchronous
        # copies it does not follow); excluding them (--kernel-name-exclude kns=nvjet) made it fail with an internal
        # error on an H100, so they stay in and the report names the kernel.
        local san_t san_f
        local san_tools="memcheck racecheck"
        [ "${UNET_SAN_TESTS:-}" = none ] && san_tools=""
        for tool in $san_tools; do
            for spec in ${UNET_SAN_TESTS:-"ops/ops_norm:*<flowedge::Cuda>*" "ops/ops_math_mode:conv_transpose1d_gemm*"}; do
                san_t=${spec%%:*} san_f=${spec#*:}
                env ${UNET_ALT_ENV:-} timeout "${UNET_SAN_TIMEOUT:-150}" "$san" --tool $tool --error-exitcode 9 \
                    "$BUILD/test/$san_t" -tc="$san_f" \
                    > "$LOGS/unet_${tool}_$(basename $san_t).log" 2>&1 || rc=$?
                grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test cases" "$LOGS/unet_${tool}_$(basename $san_t).log" \
                    | sed "s|^|$tool $san_t $san_f: |" | tee -a "$OUT/unet.txt"
            done
        done
    fi
    mkdir -p models
    [ -f models/diffusion_pusht.flowedge.safetensors ] ||
        "$BUILD/flowedge-make-demo-diffusion" models/diffusion_pusht.flowedge.safetensors > "$LOGS/unet_demo.log" 2>&1 || return $?
    for r in $(seq 1 ${UNET_ROUNDS:-2}); do
        for tree in $trees; do
            bin=$BUILD; [ $tree = base ] && bin=$bdir
            e=; [ $tree = alt ] && e=$UNET_ALT_ENV
            for part in ${UNET_PARTS:-samples math}; do
                env $e "$bin/flowedge_cuda_dp_mix" models/diffusion_pusht.flowedge.safetensors --no-cpu-check --$part-only \
                    > "$OUT/dp_mix_${tree}_${part}_r$r.txt" 2>&1 || rc=$?
                grep -E "^  (F32|BF16|F16|TF32)|math|batch" "$OUT/dp_mix_${tree}_${part}_r$r.txt" | sed "s/^/$tree $part r$r: /" \
                    | tee -a "$OUT/unet.txt"
            done
        done
    done
    if [ "${UNET_POLICY:-1}" = 1 ]; then
        policy_folder || return $?
        for tree in $trees; do
            bin=$BUILD; [ $tree = base ] && bin=$bdir
            e=; [ $tree = alt ] && e=$UNET_ALT_ENV
            env $e "$bin/policy_bench" "$POLICY_FOLDER" --device cuda --dtype f32 --ticks ${POLICY_TICKS:-200} \
                --json "$OUT/policy_bench_cuda_f32_$tree.json" 2>&1 | sed "s/^/$tree: /" | tee -a "$OUT/unet.txt" || rc=$?
        done
    fi
    # UNET_PROF: "batch:math[:dtype]" specs; ncu's per-kernel table of one U-Net call (a 1-step sample, the second
    # of two) for each spec and tree -> ncu_unet_<tree>_b<batch>_<math>_<dtype>.csv, summaries in unet.txt.
    local ncu pb pm pd csv
    ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    for spec in ${UNET_PROF:-}; do
        IFS=: read -r pb pm pd <<< "$spec"
        pd=${pd:-f32}
        for tree in $trees; do
            [ $tree = alt ] && continue
            bin=$BUILD; [ $tree = base ] && bin=$bdir
            csv=$OUT/ncu_unet_${tree}_b${pb}_${pm}_${pd}.csv
            "$ncu" --clock-control none --graph-profiling node --csv \
                --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size \
                "$bin/diffusion_sample" models/diffusion_pusht.flowedge.safetensors 1 --device cuda --repeats 1 \
                --batch "$pb" --math "$pm" --dtype "$pd" > "$csv" 2> "$LOGS/unet_ncu_${tree}_${pb}_${pm}_${pd}.err" || rc=$?
            python3 tools/ncu_kernel_summary.py "$csv" 30 2>&1 | sed "s/^/$tree /" | tee -a "$OUT/unet.txt"
        done
    done
    # UNET_PROBE: batch sizes for bench/probe_conv1d_paths.py (cuDNN conv vs im2col panel + GEMM vs the GEMM alone,
    # per conv of one U-Net call, PyTorch) -> probe_conv1d_b<batch>.{txt,json}
    for pb in ${UNET_PROBE:-}; do
        python3 bench/probe_conv1d_paths.py --batch "$pb" --json "$OUT/probe_conv1d_b$pb.json" > "$OUT/probe_conv1d_b$pb.txt" 2>&1 || rc=$?
        grep -E "^(tf32|bf16)|^total" "$OUT/probe_conv1d_b$pb.txt" | tee -a "$OUT/unet.txt"
    done
    if [ "${UNET_MIX:-1}" = 1 ]; then stage_mix > "$LOGS/unet_mix.log" 2>&1 || rc=$?; fi
    return "$rc"
}

# build_cpu_bench DIR TARGET: a CPU-only Release build (no tests, no examples) of one bench program, logs in $LOGS.
build_cpu_bench() {
    cmake -S . -B "$1" -DCMAKE_BUILD_TYPE=Release -DFLOWEDGE_BUILD_TESTS=OFF -DFLOWEDGE_BUILD_EXAMPLES=OFF \
        > "$LOGS/$2_configure.log" 2>&1 || return $?
    cmake --build "$1" -j "$JOBS" --target "$2" > "$LOGS/$2_build.log" 2>&1
}

stage_cpudiff() {
    local dir=build-cpu site=/tmp/site_lerobot
    lscpu > "$OUT/lscpu.txt"
    build_cpu_bench "$dir" diffusion_cpu_bench || return $?
    ls .whl/*.whl > /dev/null 2>&1 || { echo "no .whl/*.whl carried: LeRobot makes the PushT folder"; return 3; }
    lerobot_site "$site" || return $?
    [ -f models/dp_pusht/config.json ] || PYTHONPATH=$site python3 tools/make_reference_diffusion.py --pusht --policy-only --threads "$JOBS" || return $?
    PYTHONPATH=$site BUILD=$dir PY=$(command -v python3) RUNS=${CPUDIFF_RUNS:-5} PT_RUNS=${CPUDIFF_PT_RUNS:-3} \
        THREADS="${CPUDIFF_THREADS:-1 2 4 8 16}" DTYPES="f32 bf16 int8" MATH="f32 bf16" OUT_NAME=cpudiff_xeon_host \
        bench/run_diffusion_cpu.sh models/dp_pusht || return $?
    cp bench/results/cpudiff_xeon_host.json bench/results/cpudiff_xeon_host.md "$OUT/"
}

stage_cpuenc() {
    local rc=0 dir=build-cpu r path e
    lscpu > "$OUT/lscpu.txt"
    build_cpu_bench "$dir" rgb_encoder_bench || return $?
    for r in $(seq 1 ${CPUENC_ROUNDS:-3}); do
        # Winograd F(2x2, 3x3) for layer1-3's 3x3 convs (the default) against the direct paths, same binary.
        for path in wino direct; do
            e=FLOWEDGE_CPU_CONV2D_NO_WINOGRAD=0; [ $path = direct ] && e=FLOWEDGE_CPU_CONV2D_NO_WINOGRAD=1
            env $e OMP_NUM_THREADS=1 taskset -c "${CPUENC_CORE:-2}" "$dir/rgb_encoder_bench" --iters ${CPUENC_ITERS:-100} --threads 1 --layers \
                --json "$OUT/cpuenc_${path}_r$r.json" > "$OUT/cpuenc_${path}_r$r.txt" 2>&1 || rc=$?
            sed "s/^/$path r$r: /" "$OUT/cpuenc_${path}_r$r.txt" | tee -a "$OUT/cpuenc.txt"
        done
    done
    return "$rc"
}
stage_cpumamba() {
    local rc=0 dir=build-cpu r d m
    lscpu > "$OUT/lscpu.txt"
    build_cpu_bench "$dir" mamba_flow_bench || return $?
    for r in $(seq 1 ${CPUMAMBA_ROUNDS:-3}); do
        for d in f32 bf16; do
            for m in f32 bf16; do
                OMP_NUM_THREADS=1 taskset -c "${CPUMAMBA_CORE:-2}" "$dir/mamba_flow_bench" models/mamba_flow.safetensors \
                    --threads 1 --iters 3000 --dtype $d --math $m --parts --json "$OUT/cpumamba_${d}_${m}_r$r.json" \
                    > "$LOGS/cpumamba_${d}_${m}_r$r.txt" 2>&1 || rc=$?
                sed "s/^/$d weights $m math r$r: /" "$LOGS/cpumamba_${d}_${m}_r$r.txt" | tee -a "$OUT/cpumamba.txt"
            done
        done
    done
    return "$rc"
}
stage_act() {
    local rc=0 bin="$BUILD/test/act/act_policy" cuda_cases='*<flowedge::Cuda>*'
    BUILD_TARGETS="act_policy act_bench ops_conv2d ops_math_mode" stage_build || return $?
    "$bin" -tc="$cuda_cases" > "$LOGS/act_policy_cuda.log" 2>&1 || rc=$?
    grep -E "MESSAGE|ERROR|CHECK|test cases|skipped" -A1 "$LOGS/act_policy_cuda.log" | tee -a "$OUT/act.txt"
    # The library GEMM conv2d and linear paths (TF32/BF16 math, F32 with f32_gemm) against the double reference.
    "$BUILD/test/ops/ops_conv2d" -tc="$cuda_cases" > "$LOGS/act_conv2d_cuda.log" 2>&1 || rc=$?
    grep -E "ERROR|CHECK|test cases|skipped" -A1 "$LOGS/act_conv2d_cuda.log" | tee -a "$OUT/act.txt"
    # The previous attention tiling and im2col kernel, still selectable for the A/B, against the same references.
    FLOWEDGE_CUDA_ATTN_TILE16=1 FLOWEDGE_CUDA_IM2COL_FLAT=1 "$bin" -tc="$cuda_cases" -tce='ActPolicy*' > "$LOGS/act_ops_prev_cuda.log" 2>&1 || rc=$?
    FLOWEDGE_CUDA_IM2COL_FLAT=1 "$BUILD/test/ops/ops_conv2d" -tc="$cuda_cases" >> "$LOGS/act_ops_prev_cuda.log" 2>&1 || rc=$?
    grep -E "ERROR|CHECK|test cases|skipped" -A1 "$LOGS/act_ops_prev_cuda.log" | sed 's/^/previous kernels: /' | tee -a "$OUT/act.txt"
    "$BUILD/test/ops/ops_math_mode" -tc='linear_gemm*' > "$LOGS/act_linear_gemm_cuda.log" 2>&1 || rc=$?
    grep -E "MESSAGE|ERROR|CHECK|test cases|skipped" -A1 "$LOGS/act_linear_gemm_cuda.log" | grep -E "variant 0|ERROR|CHECK|test cases" \
        | tail -n 20 | tee -a "$OUT/act.txt"
    # The bench runs before the sanitizers so that a call running out of time still brings the numbers back.
    if ls .whl/*.whl > /dev/null 2>&1; then
        act_bench_480x640 || rc=$?
    else
        echo "no .whl/*.whl: no 480x640 bench folder (LeRobot makes it)" | tee -a "$OUT/act.txt"
    fi
    act_sanitize "$bin" "$cuda_cases" || rc=$?
    return "$rc"
}

# LeRobot (wheels in .whl) makes the one-camera 480x640 folder and times its own chunk on this CPU and GPU; act_bench
# times flowedge's chunk (CUDA: F32 weights at every math mode, BF16 weights exact; the CPU) and its error against
# LeRobot's chunks.
act_bench_480x640() {
    local rc=0 site=/tmp/site_lerobot
    lerobot_site "$site" || return $?
    if [ ! -f /tmp/act_bench/model.safetensors ]; then
        PYTHONPATH=$site python3 tools/make_reference_act.py --bench /tmp/act_bench 2>&1 | tail -n 2 | tee -a "$OUT/act.txt" || return $?
    fi
    cp /tmp/act_bench_ref/info.json "$OUT/act_lerobot_info.json"
    local run dt math
    for run in f32:f32 f32:tf32 f32:bf16 bf16:f32; do
        dt=${run%:*} math=${run#*:}
        "$BUILD/act_bench" /tmp/act_bench --ref /tmp/act_bench_ref --device cuda --dtype "$dt" --math "$math" \
            --chunks ${ACT_CHUNKS:-500} --json "$OUT/act_bench_cuda_${dt}_${math}.json" 2>&1 | tee -a "$OUT/act.txt" || rc=$?
    done
    # The previous paths in the same call, for the A/B: the exact CUDA-core kernels (no library GEMM) at F32, and the
    # previous attention tiling + flat im2col kernel at F32 and TF32.
    FLOWEDGE_CUDA_NO_LT=1 "$BUILD/act_bench" /tmp/act_bench --ref /tmp/act_bench_ref --device cuda --dtype f32 --math f32 \
        --chunks ${ACT_CHUNKS:-500} --json "$OUT/act_bench_cuda_f32_f32_no_lt.json" 2>&1 | tee -a "$OUT/act.txt" || rc=$?
    for math in f32 tf32; do
        FLOWEDGE_CUDA_ATTN_TILE16=1 FLOWEDGE_CUDA_IM2COL_FLAT=1 "$BUILD/act_bench" /tmp/act_bench --ref /tmp/act_bench_ref --device cuda \
            --dtype f32 --math $math --chunks ${ACT_CHUNKS:-500} --json "$OUT/act_bench_cuda_f32_${math}_prev.json" 2>&1 | tee -a "$OUT/act.txt" || rc=$?
    done
    # ACT_CPU=0: no CPU rows (a short call).
    [ "${ACT_CPU:-1}" = 0 ] && return "$rc"
    OMP_PROC_BIND=close OMP_PLACES=cores "$BUILD/act_bench" /tmp/act_bench --ref /tmp/act_bench_ref --device cpu --chunks 20 \
        --threads 1,2 --json "$OUT/act_bench_cpu.json" 2>&1 | tee -a "$OUT/act.txt" || rc=$?
    return "$rc"
}

# memcheck on every Cuda instance (ops, the two parity fixtures through their recorded graphs, no-allocation);
# racecheck + synccheck on the transformer kernels' shared-memory tiles and barriers, at the op tests' sizes.
act_sanitize() {
    local rc=0 bin=$1 cases=$2 cs
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    [ -x "$cs" ] || { echo "compute-sanitizer not found" | tee -a "$OUT/act.txt"; return 3; }
    timeout "${ACT_SANITIZE_S:-300}" "$cs" --tool memcheck --error-exitcode 99 "$bin" -tc="$cases" \
        > "$LOGS/act_sanitize_memcheck.log" 2>&1 || rc=$?
    for tool in racecheck synccheck; do
        local extra=()
        [ "$tool" = racecheck ] && extra=(--racecheck-report hazard)
        timeout "${ACT_SANITIZE_S:-300}" "$cs" --tool "$tool" "${extra[@]}" --error-exitcode 99 "$bin" -tc="$cases" \
            -tce='ActPolicy*' > "$LOGS/act_sanitize_$tool.log" 2>&1 || rc=$?
    done
    for f in "$LOGS"/act_sanitize_*.log; do echo "--- $(basename "$f")"; tail -n 3 "$f"; done | tee -a "$OUT/act.txt"
    return "$rc"
}

STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(all)
EXPANDED=()
for s in "${STAGES[@]}"; do
    case $s in
        all) EXPANDED+=(info build gputests cputests demo seed mix mamba sanitize pytorch lerobot asan) ;;
        tests) EXPANDED+=(gputests cputests) ;;
        info|build|gputests|cputests|demo|seed|mix|mamba|sanitize|pytorch|lerobot|policy|batch|soak|eval|rt|act|prof|encoder|unet|flow|cpudiff|cpuenc|cpumamba|asan) EXPANDED+=("$s") ;;
        *) echo "unknown stage '$s' (expected info build gputests cputests tests demo seed mix mamba sanitize pytorch lerobot policy batch soak eval rt act prof encoder unet flow cpudiff cpuenc cpumamba asan all)" >&2; exit 2 ;;
    esac
done
for s in "${EXPANDED[@]}"; do
    # seed, mix and mamba need both demo checkpoints, pytorch the U-Net's.
    if [ "$s" = seed ] || [ "$s" = mix ] || [ "$s" = mamba ]; then
        [ -f models/diffusion_pusht.flowedge.safetensors ] && [ -f models/mamba_flow.safetensors ] || run_stage demo stage_demo
    elif [ "$s" = pytorch ]; then
        [ -f models/diffusion_pusht.flowedge.safetensors ] || run_stage demo stage_demo diffusion
    fi
    run_stage "$s" "stage_$s"
done
[ -f "$LOGS/gputests.log" ] && cp "$LOGS/gputests.log" "$OUT/gpu_tests.log"
echo "total $(( $(date +%s) - T_START ))s" | tee -a "$SUMMARY"
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOGS"
# The device tool brings back only a few files per call: everything else travels in results.tar.gz.
( cd "$OUT" && find . -maxdepth 1 -type f ! -name summary.txt ! -name results.tar.gz -printf '%P\n' > /tmp/gpu_run_files \
  && tar -czf results.tar.gz -T /tmp/gpu_run_files && xargs -a /tmp/gpu_run_files rm -f )
exit 0
