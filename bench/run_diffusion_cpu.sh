#!/usr/bin/env bash
# Runs diffusion_cpu_bench (flowedge F32/BF16 weights x F32/BF16 math, 1 and 2 threads, memory floor, action difference
# from F32) and the PyTorch/LeRobot eager baseline
# on the same PushT weights back to back, and writes bench/results/diffusion_cpu.json + .md.
# Usage: bench/run_diffusion_cpu.sh [LEROBOT_FOLDER]   (env: BUILD, PY, RUNS, PT_RUNS, THREADS, MATH, DTYPES (default
# "f32 bf16"; int8 / w8a8 too), BW_MIB (bandwidth buffer, default 1024; make it >> the L3), OUT_NAME (default
# diffusion_cpu: bench/results/<OUT_NAME>.json|md))
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
FOLDER="${1:-$ROOT/models/dp_pusht}"
PY="${PY:-$ROOT/.venv/bin/python}"
RUNS="${RUNS:-20}"
PT_RUNS="${PT_RUNS:-5}"
THREADS="${THREADS:-1 2}"
MATH="${MATH:-f32 bf16}"
DTYPES="${DTYPES:-f32 bf16}"
BW_MIB="${BW_MIB:-1024}"
OUT_NAME="${OUT_NAME:-diffusion_cpu}"
OUT_DIR="$ROOT/bench/results"
mkdir -p "$OUT_DIR"
if [ ! -d "$FOLDER" ]; then
  echo "run_diffusion_cpu.sh: no LeRobot folder at $FOLDER (make one: $PY tools/make_reference_diffusion.py --pusht)" >&2
  exit 1
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# Both implementations read the same LeRobot folder (flowedge maps its diffusion.unet.* tensors directly).
# shellcheck disable=SC2086
"$BUILD/diffusion_cpu_bench" "$FOLDER" --runs "$RUNS" --threads $THREADS --dtype $DTYPES --math $MATH --bw-mib "$BW_MIB" \
  --json "$TMP/flowedge.json"
if [ -x "$PY" ]; then
  # shellcheck disable=SC2086
  "$PY" "$ROOT/bench/pytorch_diffusion_cpu.py" "$FOLDER" --runs "$PT_RUNS" --threads $THREADS --json "$TMP/pytorch.json"
else
  echo "run_diffusion_cpu.sh: no Python at $PY (run tools/setup_python.sh); PyTorch baseline skipped" >&2
fi
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
DIRTY="$(git -C "$ROOT" status --porcelain --untracked-files=no -- include bench 2>/dev/null | wc -l)"
MACHINE="$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc --all) cores"
python3 - "$TMP" "$OUT_DIR/$OUT_NAME" "$COMMIT" "$DIRTY" "$MACHINE" <<'PYEOF'
import datetime, json, os, sys
tmp, out, commit, dirty, machine = sys.argv[1:6]
fe = json.load(open(os.path.join(tmp, "flowedge.json")))
pt = json.load(open(os.path.join(tmp, "pytorch.json"))) if os.path.exists(os.path.join(tmp, "pytorch.json")) else None
merged = {"bench": "diffusion_cpu", "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
          "machine": machine, "commit": commit + ("+dirty" if int(dirty) else ""), "flowedge": fe, "pytorch": pt}
pt_p50 = {r["threads"]: r["ms"]["p50"] for r in pt["results"]} if pt else {}
rows = []
for r in fe["results"]:
    sp = pt_p50.get(r["threads"])
    r["speedup_vs_pytorch_p50"] = sp / r["ms"]["p50"] if sp else None
    rows.append(r)
f32 = {r["threads"]: r["ms"]["p50"] for r in rows if r["weights"] == "f32" and r.get("math", "f32") == "f32"}
for r in rows:
    if (r["weights"] != "f32" or r.get("math", "f32") != "f32") and r["threads"] in f32:
        r["over_f32_p50"] = r["ms"]["p50"] / f32[r["threads"]]
json.dump(merged, open(out + ".json", "w"), indent=2)
md = [f"# PushT Diffusion Policy on the CPU (batch 1, {fe['steps']}-step DDIM)", "",
      f"- date: {merged['date']}", f"- machine: {machine}", f"- commit: {merged['commit']}",
      f"- read bandwidth (best of several streaming sums): " + ", ".join(f"{k} thread(s) {v:.1f} GB/s" for k, v in fe["read_bandwidth_gbs"].items()),
      f"- floor = weight bytes x {fe['steps']} / read bandwidth at that thread count", "",
      "| impl | weights | math | threads | min ms | p50 ms | p99 ms | max ms | floor ms | p50/floor | p50 / F32 p50 | max abs action diff vs F32 | vs PyTorch p50 | load avg before |",
      "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
for r in rows:
    m = r["ms"]
    sp = f"{r['speedup_vs_pytorch_p50']:.2f}x" if r.get("speedup_vs_pytorch_p50") else "-"
    of = f"{r['over_f32_p50']:.2f}" if r.get("over_f32_p50") else "1.00"
    dv = f"{r['max_abs_action_diff_vs_f32']:.3g}" if "max_abs_action_diff_vs_f32" in r else "-"
    md.append(f"| flowedge | {r['weights']} | {r.get('math', 'f32')} | {r['threads']} | {m['min']:.0f} | {m['p50']:.0f} | {m['p99']:.0f} | {m['max']:.0f} | "
              f"{r['floor_ms']:.0f} | {r['p50_over_floor']:.2f} | {of} | {dv} | {sp} | {r['loadavg_before']} |")
if pt:
    for r in pt["results"]:
        m = r["ms"]
        md.append(f"| PyTorch {pt['torch']} eager (LeRobot) | f32 | f32 | {r['threads']} | {m['min']:.0f} | {m['p50']:.0f} | - | {m['max']:.0f} | - | - | - | - | 1.00x | {r['loadavg_before']} |")
md += ["", "math bf16 = DiffusionHead::set_math(MathMode::BF16): convs and linears on vdpbf16ps with BF16-rounded activations",
       "(F32 weights are rounded to BF16 too); the action difference is in action units against F32 weights + F32 math.",
       "", "The machine is shared (2 cores, several engineers compiling): the load average column is the 1/5/15-minute",
       "load when each row started. Rows taken at load > 2 are contended and overstate the time; min is the least",
       "contended sample."]
open(out + ".md", "w").write("\n".join(md) + "\n")
print("wrote", out + ".json", "and", out + ".md")
PYEOF
