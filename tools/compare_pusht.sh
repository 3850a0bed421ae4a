#!/usr/bin/env bash
# Full PushT parity run: the LeRobot-saved PushT Diffusion Policy (models/dp_pusht, ~1 GB) through flowedge on the
# CPU vs LeRobot's float32 references (models/dp_pusht_ref), stored as bench/results/parity_pusht_cpu.{json,md}.
#
# Usage: tools/compare_pusht.sh [--dtype f32|bf16]
# Env:   BUILD (build dir, default build), PY (default .venv/bin/python), JOBS (default 2).
# (a) makes models/dp_pusht + models/dp_pusht_ref with tools/make_reference_diffusion.py --pusht when missing;
# (b) builds and runs flowedge-compare-reference MODEL_DIR REF_DIR --json; (c) writes the JSON and a Markdown table
# with date, machine and commit. Exit status: the driver's (0 all checks within bounds, 1 some exceed, 2 error).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build}"
PY="${PY:-$ROOT/.venv/bin/python}"
JOBS="${JOBS:-2}"
DTYPE=f32
if [ "${1:-}" = "--dtype" ]; then DTYPE="${2:?--dtype needs f32 or bf16}"; fi
MODEL="$ROOT/models/dp_pusht"
REF="$ROOT/models/dp_pusht_ref"
OUT_DIR="$ROOT/bench/results"
SUFFIX=""
[ "$DTYPE" = "f32" ] || SUFFIX="_$DTYPE"
OUT_JSON="$OUT_DIR/parity_pusht_cpu$SUFFIX.json"
OUT_MD="$OUT_DIR/parity_pusht_cpu$SUFFIX.md"

if [ ! -f "$MODEL/model.safetensors" ] || [ ! -f "$REF/refs.json" ]; then
  if [ ! -x "$PY" ]; then
    echo "compare_pusht.sh: $MODEL or $REF missing and no Python at $PY (run tools/setup_python.sh first)" >&2
    exit 2
  fi
  echo "compare_pusht.sh: generating the PushT policy and references (~1 GB, a few minutes)"
  "$PY" "$ROOT/tools/make_reference_diffusion.py" --pusht
fi

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$BUILD" --target flowedge-compare-reference -j"$JOBS"

mkdir -p "$OUT_DIR"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
set +e
"$BUILD/flowedge-compare-reference" "$MODEL" "$REF" --dtype "$DTYPE" --json "$TMP/run.json" | tee "$TMP/table.txt"
RC=${PIPESTATUS[0]}
set -e
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
if [ ! -f "$TMP/run.json" ]; then
  echo "compare_pusht.sh: the driver wrote no result (exit $RC)" >&2
  exit "$RC"
fi

COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
DIRTY="$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | head -c1)"
[ -z "$DIRTY" ] || COMMIT="$COMMIT (+ uncommitted changes)"
CPU="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //' || echo unknown)"
python3 - "$TMP/run.json" "$OUT_JSON" "$OUT_MD" "$COMMIT" "$CPU" "$(nproc)" "$(hostname)" "$LOAD_BEFORE" "$LOAD_AFTER" <<'PYEOF'
import datetime, json, sys
run_path, out_json, out_md, commit, cpu, ncpu, host, load_before, load_after = sys.argv[1:]
r = json.load(open(run_path))
r["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
r["machine"] = {"host": host, "cpu": cpu, "cores": int(ncpu), "loadavg_before": load_before, "loadavg_after": load_after}
r["commit"] = commit
r["command"] = "tools/compare_pusht.sh" + ("" if r["weights"] == "f32" else " --dtype " + r["weights"])
json.dump(r, open(out_json, "w"), indent=1)
open(out_json, "a").write("\n")
lines = [
    f"# PushT Diffusion Policy: flowedge (CPU, {r['weights']} weights) vs LeRobot float32",
    "",
    f"- date: {r['date']}; commit {commit}; machine: {cpu}, {ncpu} cores ({host})",
    f"- command: `{r['command']}`",
    f"- load average (1/5/15 min) before {load_before}, after {load_after}: the ms column is wall time on a shared "
    "machine, not a benchmark",
    f"- model: LeRobot {r['reference_versions'].get('lerobot', '?')} folder `models/dp_pusht` loaded directly "
    f"(U-Net {r['unet_parameters']:,} parameters, load {r['load_ms']:.0f} ms); references `models/dp_pusht_ref` "
    f"(torch {r['reference_versions'].get('torch', '?')}, diffusers {r['reference_versions'].get('diffusers', '?')}, "
    "CPU float32, TF32 off); batch " + str(r["batch"]),
    f"- bounds: {r['bounds_source']}; action rows are |d| / ((max - min) / 2), i.e. normalised units",
    f"- result: {'all checks within bounds' if r['all_pass'] else 'SOME CHECKS EXCEED THEIR BOUND'}",
    "",
    "| check | what | max abs (normalised) | max abs (raw) | bound | ok | flowedge ms |",
    "|---|---|---|---|---|---|---|",
]
for c in r["checks"]:
    lines.append(f"| {c['name']} | {c['what']} | {c['max_abs_norm']:.3e} | {c['max_abs_raw']:.3e} | {c['bound']:.0e} | "
                 f"{'yes' if c['pass'] else 'NO'} | {c['ms']:.0f} |")
open(out_md, "w").write("\n".join(lines) + "\n")
print("wrote", out_json, "and", out_md)
PYEOF
exit "$RC"
