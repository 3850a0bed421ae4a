#!/usr/bin/env bash
# Runs the flowedge Mamba + flow bench and the PyTorch eager baseline back to back (same checkpoint, same
# single thread) and merges both JSON results into bench/results/mamba_flow_<host>_<date>.json.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
MODEL="${1:-$ROOT/models/mamba_flow.safetensors}"
THREADS="${THREADS:-1}"
PY="${PY:-$ROOT/.venv/bin/python}"
OUT_DIR="$ROOT/bench/results"
mkdir -p "$OUT_DIR"
[ -f "$MODEL" ] || "$BUILD/flowedge-make-demo-mamba-flow" "$MODEL"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS="$THREADS"
for dt in f32 bf16; do
  "$BUILD/mamba_flow_bench" "$MODEL" --threads "$THREADS" --dtype "$dt" --json "$TMP/flowedge_$dt.json"
done
if [ -x "$PY" ]; then
  "$PY" "$ROOT/bench/pytorch_mamba_flow.py" "$MODEL" --threads "$THREADS" --json "$TMP/pytorch.json"
else
  echo "run_mamba_flow.sh: no Python at $PY (run tools/setup_python.sh); PyTorch baseline skipped" >&2
fi
OUT="$OUT_DIR/mamba_flow_$(hostname)_$(date +%Y%m%d_%H%M%S).json"
python3 - "$TMP" "$OUT" <<'PYEOF'
import json, os, sys
tmp, out = sys.argv[1], sys.argv[2]
runs = {name[:-5]: json.load(open(os.path.join(tmp, name))) for name in sorted(os.listdir(tmp)) if name.endswith(".json")}
merged = {"bench": "mamba_flow", "runs": runs}
if "pytorch" in runs and "flowedge_f32" in runs:
    fe, pt = runs["flowedge_f32"], runs["pytorch"]
    merged["speedup_action_p50"] = pt["action_us"]["p50"] / fe["action_us"]["p50"]
    merged["speedup_decode_p50"] = pt["decode_step_us"]["p50"] / fe["decode_step_us"]["p50"]
    merged["max_abs_action_diff_0_2"] = max(abs(a - b) for a, b in zip(fe["action_0_2"], pt["action_0_2"]))
json.dump(merged, open(out, "w"), indent=2)
print("wrote", out)
PYEOF
