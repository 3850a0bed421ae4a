#!/usr/bin/env bash
# Whole LeRobot image Diffusion Policy on the CPU: flowedge (bench/policy_bench) and LeRobot's own select_action
# (bench/lerobot_policy_bench.py) on the same folder, in the same run, alternated per thread count.
# Usage: bench/run_policy_cpu.sh FOLDER [BUILD_DIR] [PYTHON]
#   FOLDER: a LeRobot pretrained_model folder (e.g. written by tools/make_reference_dp_image.py --pusht DIR)
#   PYTHON: a Python with lerobot 0.4.4 (tools/setup_python.sh); default .venv/bin/python
# Writes bench/results/policy_cpu.{json,md} (one JSON per run under bench/results/policy_cpu_raw/).
set -euo pipefail
cd "$(dirname "$0")/.."
folder=${1:?usage: bench/run_policy_cpu.sh FOLDER [BUILD_DIR] [PYTHON]}
build=${2:-build}
py=${3:-.venv/bin/python}
raw=bench/results/policy_cpu_raw
mkdir -p "$raw"
for t in 1 2; do
    OMP_NUM_THREADS=$t "$build/policy_bench" "$folder" --device cpu --ticks ${TICKS:-48} --json "$raw/flowedge_${t}t.json"
    "$py" bench/lerobot_policy_bench.py "$folder" --device cpu --threads "$t" --episodes 1 --ticks ${LEROBOT_TICKS:-16} \
        --json "$raw/lerobot_${t}t.json"
done
python3 - "$raw" "$folder" <<'PY'
import json, os, platform, subprocess, sys, datetime
raw, folder = sys.argv[1], sys.argv[2]
def load(n):
    with open(os.path.join(raw, n)) as f:
        return json.load(f)
def lr(j, *path):
    for p in path:
        j = j.get(p, {}) if isinstance(j, dict) else {}
    return j
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
rows = []
lines = [f"# Whole image Diffusion Policy on the CPU: flowedge vs LeRobot, same run", "",
         f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, {cpu}, {os.cpu_count()} CPUs, "
         f"commit {commit}, folder `{folder}`; load average at the end {os.getloadavg()[0]:.1f}.", "",
         "| threads | flowedge chunk tick p50 ms | flowedge other tick p50 ms | flowedge U-Net alone p50 ms | flowedge encoder/frame p50 ms | LeRobot chunk tick p50 ms | LeRobot other tick p50 ms | LeRobot encoder/frame p50 ms | chunk speed-up |",
         "|---|---|---|---|---|---|---|---|---|"]
for t in (1, 2):
    fe, le = load(f"flowedge_{t}t.json"), load(f"lerobot_{t}t.json")
    fc, fo, fu, fenc = fe["chunk"]["p50_ms"], fe["other"]["p50_ms"], fe["unet_sample"]["p50_ms"], fe["encoder_one_frame"]["p50_ms"]
    lc = lr(le, "step", "chunk", "p50") or lr(le, "step_ms", "chunk", "p50")
    lo = lr(le, "step", "non_chunk", "p50") or lr(le, "step_ms", "non_chunk", "p50")
    lenc = lr(le, "encoder", "p50") or lr(le, "encoder_ms", "p50")
    rows.append(dict(threads=t, flowedge=fe, lerobot=le))
    f = lambda v: f"{v:.1f}" if isinstance(v, (int, float)) and v else "?"
    sp = f"{lc / fc:.1f}x" if isinstance(lc, (int, float)) and lc and fc else "?"
    lines.append(f"| {t} | {f(fc)} | {f(fo)} | {f(fu)} | {f(fenc)} | {f(lc)} | {f(lo)} | {f(lenc)} | {sp} |")
open("bench/results/policy_cpu.md", "w").write("\n".join(lines) + "\n")
json.dump(rows, open("bench/results/policy_cpu.json", "w"), indent=1)
print("\n".join(lines))
PY
