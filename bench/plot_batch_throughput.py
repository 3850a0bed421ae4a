#!/usr/bin/env python3
"""Samples per second vs batch for every row of a bench/pytorch_vs_flowedge_cuda.py JSON (flowedge at each weight
dtype x math, PyTorch eager / CUDA graph / torch.compile), on log-log axes against the card's roofs:

  compute roof    = peak FLOP/s / (2 x multiply-adds of one sample's sampling run), one line per arithmetic
                    (F32 CUDA cores, TF32 and BF16 tensor cores);
  bandwidth roof  = batch x bandwidth / (weight bytes x steps): every step streams the weights once, whatever the
                    batch, so at small batches a sample can go no faster than this (F32 and BF16 weights).

The work per sample is the JSON's unet_gflop_per_sample (torch's FLOP counter on one U-Net call) x steps, the weight
bytes its unet_parameters x 4 (F32) or x 2 (BF16). The peaks default to the H200 SXM's datasheet (dense): F32 67
TFLOP/s, TF32 495, BF16 989, 4.8 TB/s; measured ceilings of the card in use are better (--bandwidth-tbs, --peak-*).

Usage: bench/plot_batch_throughput.py RESULT.json --png OUT.png [--peak-f32 67] [--peak-tf32 495] [--peak-bf16 989]
           [--bandwidth-tbs 4.8] [--title TEXT]
"""
from __future__ import annotations

import argparse
import json
import sys


def series(rows: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """impl name -> [(batch, samples/s)] from the rows that have a p50 (failed variants carry only a note)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if "p50_ms" not in r:
            continue
        out.setdefault(r["impl"], []).append((int(r["batch"]), 1e3 * int(r["batch"]) / float(r["p50_ms"])))
    return {k: sorted(v) for k, v in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json")
    ap.add_argument("--png", required=True)
    ap.add_argument("--peak-f32", type=float, default=67.0, help="TFLOP/s, F32 on CUDA cores")
    ap.add_argument("--peak-tf32", type=float, default=495.0, help="TFLOP/s, TF32 tensor cores, dense")
    ap.add_argument("--peak-bf16", type=float, default=989.0, help="TFLOP/s, BF16 tensor cores, dense")
    ap.add_argument("--bandwidth-tbs", type=float, default=4.8, help="TB/s of device memory")
    ap.add_argument("--title", default=None)
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plot_batch_throughput: matplotlib is not importable ({e})", file=sys.stderr)
        return 2
    with open(args.json) as f:
        r = json.load(f)
    gflop_call = r.get("unet_gflop_per_sample")
    if not gflop_call:
        print(f"plot_batch_throughput: {args.json} has no unet_gflop_per_sample (made before the FLOP count was added?)",
              file=sys.stderr)
        return 2
    steps, params = int(r["steps"]), int(r["unet_parameters"])
    flop_sample = gflop_call * 1e9 * steps
    data = series(r["results"])
    if not data:
        print(f"plot_batch_throughput: {args.json} has no timed rows", file=sys.stderr)
        return 2
    batches = sorted({b for pts in data.values() for b, _ in pts})
    lo, hi = min(batches), max(batches)
    xs = [lo * (hi / lo) ** (i / 63) for i in range(64)] if hi > lo else [lo, lo * 2]

    fig, ax = plt.subplots(figsize=(11, 6))
    for name, peak in (("F32", args.peak_f32), ("TF32", args.peak_tf32), ("BF16", args.peak_bf16)):
        ax.axhline(peak * 1e12 / flop_sample, ls="--", lw=1, color="grey")
        ax.text(xs[0], peak * 1e12 / flop_sample * 1.05, f"{name} compute roof ({peak:g} TFLOP/s)", fontsize=8, color="grey")
    for name, bytes_per_weight in (("F32", 4), ("BF16", 2)):
        per_step = params * bytes_per_weight / (args.bandwidth_tbs * 1e12)
        ax.plot(xs, [x / (per_step * steps) for x in xs], ls=":", lw=1, color="black")
        ax.text(xs[0], xs[0] / (per_step * steps) * 1.1, f"{name} weights bandwidth roof ({args.bandwidth_tbs:g} TB/s)",
                fontsize=8)
    for name, pts in sorted(data.items()):
        ax.plot([b for b, _ in pts], [s for _, s in pts], marker="o", ls="-" if name.startswith("flowedge") else "--",
                label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch (environments per call)")
    ax.set_ylabel(f"samples / s ({steps}-step {r.get('scheduler', '').upper()}, p50)")
    ax.set_title(args.title or f"PushT U-Net on {r.get('card', '?')}: {gflop_call:.2f} GFLOP per sample per step, "
                 f"{params / 1e6:.0f} M parameters", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)
    print(f"wrote {args.png}: {len(data)} rows x batches {batches}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
