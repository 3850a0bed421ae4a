#!/usr/bin/env python3
"""Per-kernel GPU time of one U-Net call from an ncu CSV, aggregated per kernel (bench/results/dp_cuda_h200.md).

The CSV comes from (on the GPU machine; clocks left alone, kernels inside CUDA graphs profiled node by node):
  ncu --clock-control none --metrics gpu__time_duration.sum --csv --graph-profiling node \\
      build-cuda/diffusion_sample MODEL 1 --device cuda --repeats 1 --batch B [--math tf32|bf16] [--dtype bf16]
That runs the 1-step sample twice (warm-up + one timed call), so the second half of the kernels is one U-Net call.
With --all every kernel of the CSV counts (a bench that brackets the one call it wants with cudaProfilerStart / Stop,
e.g. act_bench --profile under ncu --profile-from-start off). Other metrics in the CSV are ignored here.
Usage: tools/ncu_kernel_summary.py FILE.csv [TOP] [--all]
"""
import collections
import csv
import re
import sys


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--all"]
    every = "--all" in sys.argv[1:]
    path = args[0]
    top = int(args[1]) if len(args) > 1 else 20
    rows = list(csv.reader(line for line in open(path) if line.startswith('"')))
    hdr, rows = rows[0], rows[1:]
    ik, iv, iu, im = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Unit"), hdr.index("Metric Name")
    rows = [r for r in rows if r[im] == "gpu__time_duration.sum"]
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
    per = [(r[ik], float(r[iv].replace(",", "")) * scale[r[iu]]) for r in rows]
    if not every:
        per = per[len(per) // 2:]  # the timed call
    agg = collections.OrderedDict()
    for name, us in per:
        key = re.sub(r"\(.*", "", name).replace("void ", "").replace("flowedge::<unnamed>::", "")[:90]
        n, t = agg.get(key, (0, 0.0))
        agg[key] = (n + 1, t + us)
    total = sum(t for _, t in agg.values())
    print(f"{path}: {len(per)} kernels, sum of isolated kernel times {total:.1f} us")
    for key, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {t:8.1f} us {100 * t / total:5.1f}% x{n:3d}  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
