#!/usr/bin/env bash
# Tail latency of the whole Diffusion Policy with the real-time options off vs on, on a quiet host and under
# stress-ng CPU + memory load on the other cores (issue 25). Runs rt_stress_bench four times (quiet/stress x off/on)
# and writes OUT_DIR/rt_stress_<device>.json (every case), rt_stress_<device>.md (the table), one PNG histogram per
# case (matplotlib; without it the JSON's histogram bins are the record) and the raw per-tick samples.
#
# Usage: bench/run_rt_stress.sh FOLDER [--rebuild-from SRC] [--device cpu|cuda] [--threads N] [--ticks N | --seconds S]
#                              [--bench PATH] [--out DIR] [--tag NAME] [--cases "quiet_off quiet_on stress_off stress_on"]
#                              (also stress_diag: options on + --occupants; stress_sys: + --isolate-system;
#                              stress_block / quiet_block (CUDA): options on + --blocking-sync + --occupants)
#   --tag NAME: files are rt_stress_<device>_NAME.* (a machine or a smoke run kept apart from the GPU box's numbers).
# Env: RT_CPUS (CPUs of the loop: default 2,3 / 2 (cuda) when the host has >= 4 cores, else its last N cores),
#      RT_PRIORITY (SCHED_FIFO priority with the options on; default 80, 0 = none), STRESS_VM_BYTES (per vm worker,
#      default 256M), PYTHON (the interpreter that merges and plots; matplotlib for the PNGs). stress-ng loads every core not in RT_CPUS (`apt-get install -y stress-ng`); without it a
#      built-in load (busy shells + python3 page-touching loops, pinned the same way) is used and recorded as such.
# A 2-core machine leaves one core to the stressors and shares everything else: its numbers are noisy smoke, not a
# measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
folder="" rebuild="" device=cpu threads="" ticks="" seconds="" bench="" out=bench/results tag="" cases="quiet_off quiet_on stress_off stress_on"
while [ $# -gt 0 ]; do
    case $1 in
        --rebuild-from) rebuild=$2; shift 2 ;;
        --device) device=$2; shift 2 ;;
        --threads) threads=$2; shift 2 ;;
        --ticks) ticks=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --bench) bench=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --tag) tag=_$2; shift 2 ;;
        --cases) cases=$2; shift 2 ;;
        -*) echo "run_rt_stress.sh: unknown option $1" >&2; exit 2 ;;
        *) folder=$1; shift ;;
    esac
done
[ -n "$folder" ] || { echo "usage: bench/run_rt_stress.sh FOLDER [--rebuild-from SRC] [--device cpu|cuda] ..." >&2; exit 2; }
[ -n "$threads" ] || { [ "$device" = cuda ] && threads=1 || threads=2; }
[ -n "$ticks$seconds" ] || seconds=30
if [ -z "$bench" ]; then
    for b in build/rt_stress_bench build-cuda/rt_stress_bench "${BUILD_DIR:-build}/rt_stress_bench"; do [ -x "$b" ] && bench=$b; done
fi
[ -x "$bench" ] || { echo "run_rt_stress.sh: no rt_stress_bench binary (cmake --build <dir> --target rt_stress_bench; --bench PATH)" >&2; exit 2; }
mkdir -p "$out"

ncpu=$(nproc)
if [ -z "${RT_CPUS:-}" ]; then
    n_loop=$([ "$device" = cuda ] && echo 1 || echo "$threads")
    if [ "$ncpu" -ge 4 ] && [ "$n_loop" -le 2 ]; then
        RT_CPUS=$([ "$n_loop" = 1 ] && echo 2 || echo 2,3)
    else
        RT_CPUS=$(seq -s, $((ncpu - n_loop)) $((ncpu - 1)))
    fi
fi
# Every core not in RT_CPUS takes one CPU and one memory stressor.
stress_cpus=$(python3 -c "
import sys
loop = set()
for part in sys.argv[2].split(','):
    lo, _, hi = part.partition('-'); loop.update(range(int(lo), int(hi or lo) + 1))
print(','.join(str(c) for c in range(int(sys.argv[1])) if c not in loop))" "$ncpu" "$RT_CPUS")
[ -n "$stress_cpus" ] || stress_cpus=$RT_CPUS  # no other core: the load shares the loop's
n_stress=$(echo "$stress_cpus" | tr ',' '\n' | wc -l)
rt_priority=${RT_PRIORITY:-80}
vm_bytes=${STRESS_VM_BYTES:-256M}
stressor=$(command -v stress-ng > /dev/null && echo "stress-ng --cpu $n_stress --vm $n_stress --vm-bytes $vm_bytes --taskset $stress_cpus" \
           || echo "built-in: $n_stress busy shell(s) + $n_stress python3 page-touching loop(s) on CPUs $stress_cpus")
echo "rt_stress: $device, $threads thread(s), loop CPUs $RT_CPUS, load on $stress_cpus ($stressor)"

stress_pids=()
start_stress() {
    if command -v stress-ng > /dev/null; then
        stress-ng --cpu "$n_stress" --vm "$n_stress" --vm-bytes "$vm_bytes" --taskset "$stress_cpus" --timeout 0 --quiet &
        stress_pids+=($!)
    else
        for c in ${stress_cpus//,/ }; do
            taskset -c "$c" sh -c 'while :; do :; done' & stress_pids+=($!)
            taskset -c "$c" python3 -c '
while True:
    b = bytearray(64 << 20)
    for i in range(0, len(b), 4096): b[i] = 1
    del b' & stress_pids+=($!)
        done
    fi
    sleep 2  # let the load ramp up before the first timed tick
}
stop_stress() {
    for p in "${stress_pids[@]}"; do kill "$p" 2> /dev/null || true; done
    for p in "${stress_pids[@]}"; do wait "$p" 2> /dev/null || true; done
    stress_pids=()
}
trap stop_stress EXIT

common=("$folder" --device "$device" --threads "$threads")
[ -n "$rebuild" ] && common+=(--rebuild-from "$rebuild")
[ -n "$ticks" ] && common+=(--ticks "$ticks")
[ -n "$seconds" ] && common+=(--seconds "$seconds")
on=(--lock-memory --cpus "$RT_CPUS" --isolate-cpus)
[ "$rt_priority" -gt 0 ] && on+=(--rt-priority "$rt_priority")
[ "$device" = cuda ] && on+=(--high-priority-stream --pinned-staging)
prefix="$out/rt_stress_$device$tag"
commands=()
for c in $cases; do
    args=("${common[@]}" --label "$c" --json "${prefix}_$c.json" --samples "${prefix}_$c.samples.txt")
    # *_diag: the options plus the occupant sampler; *_sys: also every other process moved off the loop CPUs.
    case $c in
        *_on) args+=("${on[@]}") ;;
        *_diag) args+=("${on[@]}" --occupants) ;;
        *_sys) args+=("${on[@]}" --isolate-system --occupants) ;;
        *_block) args+=("${on[@]}" --blocking-sync --occupants) ;;
    esac
    case $c in stress_*) start_stress ;; esac
    commands+=("$bench ${args[*]}")
    echo "== $c: $bench ${args[*]}"
    "$bench" "${args[@]}"
    case $c in stress_*) stop_stress ;; esac
done

"${PYTHON:-python3}" - "$prefix" "$device" "$stressor" "$(uname -srm)" "$(nproc)" "${commands[@]}" <<'PY'
import json, os, sys
prefix, device, stressor, kernel, ncpu = sys.argv[1:6]
commands = sys.argv[6:]
cases = []
for cmd in commands:
    label = cmd.split("--label ")[1].split()[0]
    with open(f"{prefix}_{label}.json") as f:
        r = json.load(f)
    r["command"] = cmd
    cases.append(r)
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    plt = None
pngs = {}
for r in cases:
    if plt is None:
        break
    samples = [float(line.split()[0]) for line in open(f"{prefix}_{r['label']}.samples.txt") if not line.startswith("#")]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    edges = r["histogram"]["edges_ms"]
    ax.hist(samples, bins=edges, log=True)
    ax.set_xscale("log")
    for q, style in (("p50_ms", "-"), ("p99_99_ms", "--"), ("max_ms", ":")):
        ax.axvline(r[q], color="k", linestyle=style, linewidth=0.8, label=f"{q[:-3]} {r[q]:.3f} ms")
    ax.set_xlabel("select_action latency (ms)")
    ax.set_ylabel("ticks")
    ax.set_title(f"{device} {r['label']}: {r['ticks']} ticks, {r['threads']} thread(s)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = f"{prefix}_{r['label']}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    pngs[r["label"]] = os.path.basename(path)
summary = {"device": device, "stressor": stressor, "kernel": kernel, "host_cpus": int(ncpu), "cases": cases,
           "histogram_png": pngs or "matplotlib unavailable: see each case's histogram bins"}
with open(f"{prefix}.json", "w") as f:
    json.dump(summary, f, indent=1)
def trio(t):
    return f"{t['p50_ms']:.3f} / {t['p99_99_ms']:.3f} / {t['max_ms']:.3f} (n {t['n']})"
rows = ["| case | ticks | p50 ms | p99 ms | p99.9 ms | p99.99 ms | max ms | max/p50 | p99.99/p50 | chunk ticks p50 / p99.99 / "
        "max | other ticks p50 / p99.99 / max | faults (minor+major) | ctx switches (vol/invol) | loop thread invol. | "
        "slow ticks (> p50 + 1 ms): n / preempted / mean off-CPU ms | steal on loop CPUs ms | locked | CPUs | SCHED_FIFO |",
        "|" + "---|" * 19]
for r in cases:
    c, o, a, lt = r["tick_counters"], r["options"], r["applied"], r.get("loop_thread", {})
    rows.append(f"| {r['label']} | {r['ticks']} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['p99_9_ms']:.3f} | "
                f"{r['p99_99_ms']:.3f} | {r['max_ms']:.3f} | {r['max_over_p50']:.2f} | {r['p99_99_over_p50']:.2f} | "
                f"{trio(r['chunk_ticks'])} | {trio(r['other_ticks'])} | "
                f"{c['minor_page_faults']}+{c['major_page_faults']} | {c['voluntary_context_switches']}/"
                f"{c['involuntary_context_switches']} | {lt.get('involuntary_context_switches', '-')} | "
                f"{lt.get('slow_ticks', '-')} / {lt.get('slow_ticks_preempted', '-')} / {lt.get('slow_ticks_mean_off_cpu_ms', 0):.3f} | "
                f"{lt.get('steal_ms_on_loop_cpus', '-')} | {a['memory_locked']} | {','.join(map(str, o['cpus'])) or '-'}{' (others moved off)' if o.get('isolate_cpus') else ''} | "
                f"{o['rt_priority'] or '-'} |")
loop = []
for r in cases:
    t = r.get("loop_cpu_ms")
    if not t:
        continue
    line = (f"- {r['label']}: loop CPUs user {t['user']:.0f} / system {t['system']:.0f} / irq {t['irq']:.0f} / softirq "
            f"{t['softirq']:.0f} / steal {t['steal']:.0f} ms")
    iso = r.get("isolate_system", {})
    if iso.get("requested"):
        line += f"; other processes' threads moved off: {iso['threads_moved']} ({iso['threads_not_moved']} could not be)"
    if r.get("occupants_ms"):
        line += "; other tasks there: " + ", ".join(f"{o['task']} {o['ms']:.0f} ms" for o in r["occupants_ms"])
    loop.append(line)
md = [f"# rt_stress on {device} ({cases[0]['device']})", "",
      f"Host: {kernel}, {ncpu} CPUs. Load in the stress cases: {stressor}.", "", *rows, "",
      *(["Who else ran on the loop CPUs:", "", *loop, ""] if loop else []),
      "Commands:", "", *[f"    {c}" for c in commands], ""]
with open(f"{prefix}.md", "w") as f:
    f.write("\n".join(md))
print("\n".join(rows))
print(f"wrote {prefix}.json, {prefix}.md" + (f", {len(pngs)} PNG" if pngs else " (no matplotlib: no PNG)"))
PY
