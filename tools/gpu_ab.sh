#!/usr/bin/env bash
# Same-call CUDA A/B of the whole PushT U-Net sample against a previous tree: builds flowedge_cuda_dp_mix from
# BASE_SRC (a `git archive` of the base commit, git-ignored, carried to the GPU box) and from this tree, then runs the
# two binaries alternately (ROUNDS rounds, base first) on the same demo checkpoint and tabulates section 4 (native
# sample latency per weight dtype, scheduler and batch) as median-of-rounds p50 per path.
#
# Usage: tools/gpu_ab.sh [BASE_SRC]    (default .base-src; its commit is read from BASE_SRC/COMMIT when present)
# Env: OUT (results, default out/), ROUNDS (default 2), JOBS (default nproc), MIX_ARGS (extra dp_mix arguments; default
# "--no-cpu-check --no-math --iters 20 --sample-iters 30"), PYTORCH_ARGS (default "--no-compile --batches 1 8 --runs 30
# --dtypes f32 bf16"; PYTORCH=0 skips it): the PyTorch baseline (bench/pytorch_vs_flowedge_cuda.py with this tree's
# Python module, built alongside) runs after the first round, in the same call.
# Writes $OUT/ab_summary.{md,json}, $OUT/dp_cuda_vs_pytorch.md and ab_raw.tar.gz (per-round dp_mix JSON/text, build logs,
# the PyTorch JSON/text).
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BASE_SRC=${1:-.base-src}
OUT=${OUT:-$ROOT/out}
ROUNDS=${ROUNDS:-2}
JOBS=${JOBS:-$(nproc)}
MIX_ARGS=${MIX_ARGS:---no-cpu-check --no-math --iters 20 --sample-iters 30}
mkdir -p "$OUT"
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
conf() {  # conf SRC BUILD
    [ -f "$2/CMakeCache.txt" ] || cmake -S "$1" -B "$2" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DFLOWEDGE_BACKEND=cuda \
        -DFLOWEDGE_CUDA_ARCHITECTURES=90 > "$OUT/ab_configure_$(basename "$2").log" 2>&1
}
t0=$(date +%s)
conf "$BASE_SRC" build-ab-base || { echo "gpu_ab: configure of $BASE_SRC failed"; tail -20 "$OUT/ab_configure_build-ab-base.log"; exit 1; }
conf . build-ab-head || { echo "gpu_ab: configure of this tree failed"; tail -20 "$OUT/ab_configure_build-ab-head.log"; exit 1; }
half=$(( JOBS > 2 ? JOBS / 3 : 1 ))  # base, head and the Python module build at once
cmake --build build-ab-base -j "$half" --target flowedge_cuda_dp_mix > "$OUT/ab_build_base.log" 2>&1 &
pb=$!
pp=
if [ "${PYTORCH:-1}" = 1 ]; then
    ( nbdir=$(python3 -m nanobind --cmake_dir) &&
      { [ -f build-ab-py/CMakeCache.txt ] || cmake -S . -B build-ab-py "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
            -DFLOWEDGE_BACKEND=cuda -DFLOWEDGE_CUDA_ARCHITECTURES=90 -DFLOWEDGE_BUILD_PYTHON=ON \
            -DPython_EXECUTABLE="$(command -v python3)" -Dnanobind_ROOT="$nbdir"; } &&
      cmake --build build-ab-py -j "$half" --target _flowedge ) > "$OUT/ab_build_py.log" 2>&1 &
    pp=$!
fi
cmake --build build-ab-head -j "$half" --target flowedge_cuda_dp_mix flowedge-make-demo-diffusion > "$OUT/ab_build_head.log" 2>&1
rh=$?
wait $pb; rb=$?
rp=0
[ -n "$pp" ] && { wait "$pp"; rp=$?; }
echo "gpu_ab: python module build rc $rp"
echo "gpu_ab: builds done in $(( $(date +%s) - t0 )) s (base rc $rb, head rc $rh)"
[ $rb -eq 0 ] && [ $rh -eq 0 ] || { tail -30 "$OUT/ab_build_base.log" "$OUT/ab_build_head.log"; exit 1; }
mkdir -p models
model=models/diffusion_pusht.flowedge.safetensors
[ -f "$model" ] || build-ab-head/flowedge-make-demo-diffusion "$model" > "$OUT/ab_demo.log" 2>&1 || { cat "$OUT/ab_demo.log"; exit 1; }
mix_base=$(find build-ab-base -name flowedge_cuda_dp_mix -type f -perm -u+x | head -1)
mix_head=$(find build-ab-head -name flowedge_cuda_dp_mix -type f -perm -u+x | head -1)
for r in $(seq 1 "$ROUNDS"); do
    for side in base head; do
        bin=$mix_base; [ $side = head ] && bin=$mix_head
        # shellcheck disable=SC2086
        "$bin" "$model" --json "$OUT/ab_${side}_r$r.json" $MIX_ARGS > "$OUT/ab_${side}_r$r.txt" 2>&1
        echo "gpu_ab: round $r $side rc $? ($(( $(date +%s) - t0 )) s)"
    done
    if [ "$r" = 1 ] && [ -n "$pp" ] && [ "$rp" = 0 ]; then
        # shellcheck disable=SC2086
        python3 bench/pytorch_vs_flowedge_cuda.py "$model" --flowedge-path build-ab-py/python \
            --json "$OUT/dp_cuda_vs_pytorch.json" --md "$OUT/dp_cuda_vs_pytorch.md" \
            ${PYTORCH_ARGS:---no-compile --batches 1 8 --runs 30 --dtypes f32 bf16} > "$OUT/dp_cuda_vs_pytorch.txt" 2>&1
        echo "gpu_ab: pytorch baseline rc $? ($(( $(date +%s) - t0 )) s)"
        tail -25 "$OUT/dp_cuda_vs_pytorch.txt"
    fi
done
base_commit=$(cat "$BASE_SRC/COMMIT" 2>/dev/null || echo "?")
python3 - "$OUT" "$ROUNDS" "$base_commit" <<'PY'
import json, statistics, sys, datetime, subprocess
out, rounds, base_commit = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(side):
    runs = []
    for r in range(1, rounds + 1):
        try:
            runs.append(json.load(open(f"{out}/ab_{side}_r{r}.json")))
        except Exception as e:  # a failed run is reported, not hidden
            print(f"gpu_ab: {side} round {r}: no JSON ({e})")
    return runs
res = {s: load(s) for s in ("base", "head")}
def key(s): return (s["weights"], s["scheduler"], s["steps"], s["batch"])
table = {}
for side, runs in res.items():
    for run in runs:
        for s in run.get("samples", []):
            table.setdefault(key(s), {}).setdefault(side, []).append(s["p50_ms"])
card = next((r.get("card") or r.get("device") for rs in res.values() for r in rs if r.get("card") or r.get("device")), "?")
lines = [f"# CUDA A/B: PushT demo U-Net sample, base {base_commit} vs this tree", "",
         f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, card {card}, {rounds} alternated rounds "
         "(base first), median over rounds of each run's p50 (host wall clock around sample(), 30 reps).", "",
         "| weights | scheduler | steps | batch | base p50 ms | head p50 ms | head / base |", "|---|---|---|---|---|---|---|"]
rows = []
for k in sorted(table, key=lambda k: (k[0], k[1], k[3])):
    b, h = table[k].get("base"), table[k].get("head")
    mb = statistics.median(b) if b else None
    mh = statistics.median(h) if h else None
    ratio = mh / mb if mb and mh else None
    rows.append(dict(weights=k[0], scheduler=k[1], steps=k[2], batch=k[3], base_p50_ms=b, head_p50_ms=h, ratio=ratio))
    f = lambda v: f"{v:.3f}" if v is not None else "-"
    lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {f(mb)} | {f(mh)} | {f(ratio)} |")
open(f"{out}/ab_summary.md", "w").write("\n".join(lines) + "\n")
json.dump({"base_commit": base_commit, "rounds": rounds, "rows": rows}, open(f"{out}/ab_summary.json", "w"), indent=1)
print("\n".join(lines))
PY
# The device tool returns only a few files: keep the two summaries and the PyTorch table, pack the rest.
( cd "$OUT" && tar -czf ab_raw.tar.gz ab_base_r* ab_head_r* ab_build_* ab_configure_* ab_demo.log dp_cuda_vs_pytorch.txt \
      dp_cuda_vs_pytorch.json 2> /dev/null && rm -f ab_base_r* ab_head_r* ab_build_* ab_configure_* ab_demo.log \
      dp_cuda_vs_pytorch.txt dp_cuda_vs_pytorch.json )
