#!/usr/bin/env bash
# Runs the flowedge Mamba + flow bench and the PyTorch eager baseline back to back (same checkpoint, same
# single thread) and merges both JSON results into bench/results/mamba_flow_cpu.json + .md (date, CPU model, commit),
# with each flowedge run's per-part table (mamba_flow_bench --parts) and the core's FMA / L2 floors.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
MODEL="${1:-$ROOT/models/mamba_flow.safetensors}"
THREADS="${THREADS:-1}"
PY="${PY:-$ROOT/.venv/bin/python}"  # e.g. PY=/work/notes/venv-ref/bin/python
OUT_DIR="$ROOT/bench/results"
mkdir -p "$OUT_DIR"
[ -f "$MODEL" ] || "$BUILD/flowedge-make-demo-mamba-flow" "$MODEL"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS="$THREADS"
for dt in f32 bf16; do
  "$BUILD/mamba_flow_bench" "$MODEL" --threads "$THREADS" --dtype "$dt" --parts --json "$TMP/flowedge_$dt.json"
done
# Opt-in BF16 arithmetic (set_math(MathMode::BF16); exact where the build has no BF16 kernel): both weight dtypes.
for dt in f32 bf16; do
  "$BUILD/mamba_flow_bench" "$MODEL" --threads "$THREADS" --dtype "$dt" --math bf16 --parts --json "$TMP/flowedge_${dt}_mathbf16.json"
done
if [ -x "$PY" ]; then
  "$PY" "$ROOT/bench/pytorch_mamba_flow.py" "$MODEL" --threads "$THREADS" --json "$TMP/pytorch.json"
else
  echo "run_mamba_flow.sh: no Python at $PY (run tools/setup_python.sh); PyTorch baseline skipped" >&2
fi
OUT="$OUT_DIR/${OUT_NAME:-mamba_flow_cpu}"  # OUT_NAME=mamba_flow_cpu_xeon keeps another machine's table beside this one
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
DIRTY="$(git -C "$ROOT" status --porcelain --untracked-files=no -- include bench 2>/dev/null | wc -l)"
MACHINE="$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc --all) cores"
python3 - "$TMP" "$OUT" "$COMMIT" "$DIRTY" "$MACHINE" "$THREADS" <<'PYEOF'
import datetime, json, os, sys
tmp, out, commit, dirty, machine, threads = sys.argv[1:7]
runs = {name[:-5]: json.load(open(os.path.join(tmp, name))) for name in sorted(os.listdir(tmp)) if name.endswith(".json")}
merged = {"bench": "mamba_flow", "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
          "machine": machine, "commit": commit + ("+dirty" if int(dirty) else ""), "threads": int(threads),
          "loadavg_end": open("/proc/loadavg").read().split()[:3], "runs": runs}
if "pytorch" in runs and "flowedge_f32" in runs:
    fe, pt = runs["flowedge_f32"], runs["pytorch"]
    merged["speedup_action_p50"] = pt["action_us"]["p50"] / fe["action_us"]["p50"]
    merged["speedup_decode_p50"] = pt["decode_step_us"]["p50"] / fe["decode_step_us"]["p50"]
    merged["max_abs_action_diff_0_2"] = max(abs(a - b) for a, b in zip(fe["action_0_2"], pt["action_0_2"]))
json.dump(merged, open(out + ".json", "w"), indent=2)
md = ["# Mamba + flow head on the CPU (2 layers, d_model 128, prefix 4 tokens, 10 Euler steps, batch 1)", "",
      f"- date: {merged['date']}", f"- machine: {machine}", f"- commit: {merged['commit']}", f"- threads: {threads}",
      f"- load average at the end: {' '.join(merged['loadavg_end'])} (shared 2-core machine: p50 is inflated by other jobs;",
      "  min and the thread-CPU columns are the least load-dependent numbers)", "",
      "| impl | weights | math | action min us | action p50 us | action p99 us | decode min us | decode p50 us | prefill p50 us | solve p50 us | max abs action diff vs F32 math |",
      "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
for name, r in runs.items():
    if name.startswith("flowedge"):
        md.append(f"| flowedge | {r['weights']} | {r.get('math', 'f32')} | {r['action_us']['min']:.1f} | {r['action_us']['p50']:.1f} | {r['action_us']['p99']:.1f} | {r['decode_step_us']['min']:.1f} | "
                  f"{r['decode_step_us']['p50']:.1f} | {r['prefill_us']['p50']:.1f} | {r['flow_solve_us']['p50']:.1f} | "
                  f"{r.get('max_abs_action_diff_vs_f32_math', 0):.3g} |")
    else:
        md.append(f"| PyTorch eager ({r.get('torch', '')}) | f32 | f32 | {r['action_us'].get('min', float('nan')):.1f} | {r['action_us']['p50']:.1f} | {r['action_us'].get('p99', float('nan')):.1f} | "
                  f"{r['decode_step_us'].get('min', float('nan')):.1f} | {r['decode_step_us']['p50']:.1f} | {r['prefill_us']['p50']:.1f} | {r['flow_solve_us']['p50']:.1f} | |")
md += ["", "Targets (issue 4): action p50 <= 40 us, decode step p50 <= 10 us.",
       "math bf16 = opt-in set_math(MathMode::BF16): activations (and F32 weights) rounded to BF16 per product, float",
       "accumulation; its last column is max |action - action under F32 math| with the same weights (bound: test/mamba_flow/test_math.cpp)."]
for k in ("speedup_action_p50", "speedup_decode_p50", "max_abs_action_diff_0_2"):
    if k in merged:
        md.append(f"- {k}: {merged[k]:.4g}")
# Per-part tables (mamba_flow_bench --parts): each op of one action replayed alone on the model's weights, with the floors.
for name, r in runs.items():
    parts = r.get("parts")
    if not parts:
        continue
    bf16_note = ""
    if any(q.get("bf16_dot") for q in parts["parts"]):
        bf16_note = (f" Parts marked * run on vdpbf16ps (BF16 math): their multiply-add floor is the vdpbf16ps peak,"
                     f" {parts['bf16_dot_peak_gmacs']:.1f} G MAC/s (assembly probe, 12 independent chains).")
    if any(q.get("amx") for q in parts["parts"]):
        bf16_note += (" Parts marked [amx] run on AMX tiles (TDPBF16PS, BF16 math): their floor is their weight bytes at the L2 rate.")
    md += ["", f"## Parts of one action, {r['weights']} weights, {r.get('math', 'f32')} math ({r.get('kernel_set', '')})", "",
           f"Each op replayed alone through Ops<Cpu> on the loaded weights at act()'s shapes (batches of 40 calls, min per call);"
           f" floor per part = max(multiply-adds / FMA peak, weight bytes / L2 read rate). FMA peak {parts['fma_peak_gmacs']:.1f} G MAC/s"
           f" (assembly probe, 12 independent vfmadd231ps chains), L2 read {parts['l2_read_gbs']:.0f} GB/s, L3 read {parts['l3_read_gbs']:.0f} GB/s"
           f" (256 KiB / 8 MiB buffers, 1 thread).{bf16_note}", "",
           "| part | calls per action | multiply-adds per call | exps per call | weight KiB per call | us per call | us per action | floor us per action |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for q in parts["parts"]:
        md.append(f"| {q['part']}{' *' if q.get('bf16_dot') else ' [amx]' if q.get('amx') else ''} | {q['calls_per_action']} | {q['macs_per_call']:.0f} | {q['exps_per_call']:.0f} | "
                  f"{q['weight_bytes_per_call'] / 1024:.1f} | {q['min_us_per_call']:.3f} | {q['min_us_per_call'] * q['calls_per_action']:.2f} | "
                  f"{q['floor_us_per_action']:.2f} |")
    md += ["", f"- sum of parts {parts['sum_min_us']:.1f} us (min) vs the whole act() {r['action_us']['min']:.1f} us min, "
               f"{r['action_us']['p50']:.1f} us p50 (the difference: glue, and caches shared between the ops in one action)",
           f"- per action: {parts['macs_per_action'] / 1e6:.3f} M multiply-adds, {parts['exps_per_action'] / 1e3:.1f} k exps, "
           f"{parts['weight_bytes_per_action'] / 1e6:.2f} MB of weights read",
           f"- floors: FMA {parts['fma_floor_us']:.1f} us; weight bytes at the L2 rate {parts['weight_byte_floor_us']:.1f} us; "
           f"sum of the per-part floors {parts['sum_part_floors_us']:.1f} us; act() p50 / FMA floor = {parts['action_p50_over_fma_floor']:.2f}",
           f"- act() thread-CPU min / p50: {r['action_us'].get('thread_cpu_min', float('nan')):.1f} / {r['action_us'].get('thread_cpu_p50', float('nan')):.1f} us; p99 {r['action_us']['p99']:.1f} us"]
open(out + ".md", "w").write("\n".join(md) + "\n")
print("wrote", out + ".json", "and", out + ".md")
PYEOF
