#!/usr/bin/env bash
# The batched whole Diffusion Policy on the CPU (PolicyOptions::batch): bench/policy_bench --batch N for N in BATCHES,
# environments in lockstep, OMP_NUM_THREADS threads; chunk tick (every environment samples in one U-Net call) per call
# and per environment against batch 1.
# Usage: bench/run_policy_batch_cpu.sh FOLDER [BUILD_DIR]   (env: BATCHES="1 4 10", THREADS=2, TICKS=24, SAMPLE_RUNS=3)
# Writes bench/results/policy_batch_cpu.{json,md} (one JSON per batch under bench/results/policy_batch_cpu_raw/).
set -euo pipefail
cd "$(dirname "$0")/.."
folder=${1:?usage: bench/run_policy_batch_cpu.sh FOLDER [BUILD_DIR]}
build=${2:-build}
threads=${THREADS:-2}
raw=bench/results/policy_batch_cpu_raw
mkdir -p "$raw"
for n in ${BATCHES:-1 4 10}; do
    OMP_NUM_THREADS=$threads "$build/policy_bench" "$folder" --device cpu --batch "$n" --warm 0 --ticks "${TICKS:-24}" \
        --sample-runs "${SAMPLE_RUNS:-3}" --json "$raw/batch_${n}.json"
done
python3 - "$raw" "$folder" "$threads" "${BATCHES:-1 4 10}" <<'PY'
import datetime, json, os, platform, subprocess, sys
raw, folder, threads, batches = sys.argv[1], sys.argv[2], int(sys.argv[3]), [int(b) for b in sys.argv[4].split()]
runs = {n: json.load(open(os.path.join(raw, f"batch_{n}.json"))) for n in batches}
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
base = runs[batches[0]]
lines = ["# Batched whole Diffusion Policy on the CPU (environments in lockstep)", "",
         f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, {cpu}, {os.cpu_count()} CPUs, "
         f"OMP_NUM_THREADS={threads}, commit {commit}{' (working tree)' if dirty else ''}, folder `{folder}`; "
         f"load average at the end {os.getloadavg()[0]:.1f}.", "",
         f"Command: `bench/run_policy_batch_cpu.sh {folder} BUILD` (policy_bench --batch N --warm 0 --ticks 24 --sample-runs 3: "
         "3 chunk ticks and 3 U-Net-alone samples per batch after load's warm_up).", "",
         "| batch | chunk tick p50 ms (min) | process CPU p50 ms | per environment ms | vs N batch-1 chunks | U-Net alone p50 ms (min) | pop tick p50 ms |",
         "|---|---|---|---|---|---|---|"]
for n in batches:
    r = runs[n]
    c, u = r["chunk"]["p50_ms"], r["unet_sample"]["p50_ms"]
    ratio = c / (n * base["chunk"]["p50_ms"] / batches[0])
    lines.append(f"| {n} | {c:.1f} ({r['chunk_min_ms']:.1f}) | {r['chunk_cpu']['p50_ms']:.1f} | {c / n:.1f} | {ratio:.2f} | "
                 f"{u:.1f} ({r['unet_sample_min_ms']:.1f}) | {r['other']['p50_ms']:.2f} |")
lines += ["", "\"vs N batch-1 chunks\": the batch-N chunk tick over N times the batch-1 chunk tick (1.00 = no gain from batching)."]
open("bench/results/policy_batch_cpu.md", "w").write("\n".join(lines) + "\n")
json.dump({"cpu": cpu, "threads": threads, "commit": commit, "folder": folder, "runs": runs},
          open("bench/results/policy_batch_cpu.json", "w"), indent=1)
print("\n".join(lines))
PY
