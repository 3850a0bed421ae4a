#!/usr/bin/env bash
# A downstream project's default-flags build against the project's own -march=native build, on one machine: the same
# program (test/consumers/consumer_sample.cpp, PushT-shaped 10-step DDIM) built both ways through add_subdirectory,
# run alternately, p50s and the kernel set each chose written to bench/results/consumer_default_flags.json.
# Usage: tools/consumer_speed.sh MODEL [runs-per-round] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:?usage: tools/consumer_speed.sh MODEL [runs] [rounds]}"
runs="${2:-5}"; rounds="${3:-3}"
work="${FLOWEDGE_CONSUMER_WORK:-build-consumer-speed}"
for kind in default native; do
  flags=""; [ "$kind" = native ] && flags="-march=native"
  cmake -S test/consumers/add_subdirectory -B "$work/$kind" -DCMAKE_BUILD_TYPE=Release \
        -DFLOWEDGE_SOURCE_DIR="$PWD" -DCMAKE_CXX_FLAGS="$flags" >/dev/null
  cmake --build "$work/$kind" --target consumer_sample -j "$(nproc)" >/dev/null
done
declare -A p50s
for r in $(seq "$rounds"); do
  for kind in default native; do
    line=$("$work/$kind/consumer_sample" "$model" "$runs" | tee /dev/stderr | grep 'p50' )
    p50s[$kind]+="$(sed -E 's/.*p50 ([0-9.]+) ms.*/\1/' <<<"$line") "
    sum[$kind]=$(sed -E 's/.*action sum (.*)$/\1/' <<<"$line") 2>/dev/null || true
  done
done
set_default=$("$work/default/consumer_sample" "$model" 1 | sed -n 's/.*kernel set //p' | head -1)
set_native=$("$work/native/consumer_sample" "$model" 1 | sed -n 's/.*kernel set //p' | head -1)
python3 - "$model" "$runs" "$rounds" "${p50s[default]}" "${p50s[native]}" "$set_default" "$set_native" <<'PY'
import json, statistics, sys, subprocess, datetime, platform
model, runs, rounds, d, n, sd, sn = sys.argv[1:8]
d = [float(x) for x in d.split()]; n = [float(x) for x in n.split()]
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), platform.machine())
commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()
out = {"bench": "consumer_default_flags", "model": model, "cpu": cpu, "commit": commit,
       "date": datetime.datetime.utcnow().strftime('%Y-%m-%dT%H:%MZ'), "runs_per_round": int(runs), "rounds": int(rounds),
       "default_flags": {"kernel_set": sd, "p50_ms_per_round": d, "p50_ms": statistics.median(d)},
       "native": {"kernel_set": sn, "p50_ms_per_round": n, "p50_ms": statistics.median(n)}}
out["default_over_native"] = out["default_flags"]["p50_ms"] / out["native"]["p50_ms"]
json.dump(out, open('bench/results/consumer_default_flags.json', 'w'), indent=1)
print(json.dumps(out, indent=1))
PY
