#!/usr/bin/env python3
"""Batched U-Net convolutions: is cuDNN's implicit-GEMM Conv1d faster than an explicit im2col panel + one GEMM?

Issue 21 asks for a batch-64 PushT sample at <= 7 ms (TF32) / 5 ms (BF16). flowedge's batched convs write an im2col
panel (kernels/cuda/gemm_lt.cu, 5x the input for the 5-tap convs) and run one cuBLASLt GEMM on it. Before writing an
implicit GEMM or moving to cuDNN, this measures, per conv of one U-Net call (LeRobot's DiffusionConditionalUnet1d at
the PushT sizes, every Conv1d and ConvTranspose1d), with PyTorch on the GPU:
  cudnn    torch.nn.functional.conv1d / conv_transpose1d (cuDNN, benchmark mode: its fastest algorithm);
  panel+mm the panel made by unfold + one torch.matmul (cuBLAS) on it: the shape of flowedge's path;
  mm       the GEMM alone on a ready panel: what an implicit GEMM at cuBLAS's efficiency would cost.
Each op runs REPS times inside one CUDA graph (no launch gaps), median of ROUNDS replays; TF32 (F32 tensors,
TF32 allowed) and BF16 tensors. Prints a table and the per-U-Net-call totals; --json writes them.
Usage: probe_conv1d_paths.py [--batch 64] [--reps 20] [--rounds 15] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def unet_convs(action_dim=2, down_dims=(512, 1024, 2048), horizon=16, k=5):
    """(name, kind, c_in, c_out, length_in, kernel, stride, pad) of every conv in one U-Net call, in call order."""
    convs = []
    dims = [action_dim, *down_dims]
    L = horizon

    def res(tag, cin, cout, length):
        convs.append((f"{tag}.conv1", "conv", cin, cout, length, k, 1, k // 2))
        convs.append((f"{tag}.conv2", "conv", cout, cout, length, k, 1, k // 2))
        if cin != cout:
            convs.append((f"{tag}.residual", "conv", cin, cout, length, 1, 1, 0))

    for i in range(len(down_dims)):
        res(f"down{i}.res0", dims[i], dims[i + 1], L)
        res(f"down{i}.res1", dims[i + 1], dims[i + 1], L)
        if i < len(down_dims) - 1:
            convs.append((f"down{i}.downsample", "conv", dims[i + 1], dims[i + 1], L, 3, 2, 1))
            L //= 2
    res("mid0", down_dims[-1], down_dims[-1], L)
    res("mid1", down_dims[-1], down_dims[-1], L)
    pairs = list(zip(dims[:-1], dims[1:]))[1:]
    for i, (d_in, d_out) in enumerate(reversed(pairs)):
        res(f"up{i}.res0", d_out * 2, d_in, L)
        res(f"up{i}.res1", d_in, d_in, L)
        convs.append((f"up{i}.upsample", "convT", d_in, d_in, L, 4, 2, 1))
        L *= 2
    convs.append(("final.block", "conv", down_dims[0], down_dims[0], L, k, 1, k // 2))
    convs.append(("final.conv", "conv", down_dims[0], action_dim, L, 1, 1, 0))
    return convs


def graph_time_us(fn, reps: int, rounds: int) -> float:
    """Median time of one fn() call: REPS calls captured in one CUDA graph, replayed ROUNDS times."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(times)


def probe(conv, batch: int, dtype: torch.dtype, reps: int, rounds: int) -> dict:
    name, kind, cin, cout, L, k, stride, pad = conv
    dev = "cuda"
    x = torch.randn(batch, cin, L, device=dev, dtype=dtype)
    if kind == "conv":
        w = torch.randn(cout, cin, k, device=dev, dtype=dtype) * 0.02
        out_len = (L + 2 * pad - k) // stride + 1
        cudnn = lambda: F.conv1d(x, w, None, stride, pad)  # noqa: E731
        # panel [B * out_len, cin * k] (row = one output position), weights [cout, cin * k]
        w2 = w.reshape(cout, cin * k)

        def make_panel():
            cols = F.unfold(x.unsqueeze(2), (1, k), padding=(0, pad), stride=(1, stride))  # [B, cin*k, out_len]
            return cols.transpose(1, 2).reshape(batch * out_len, cin * k)

        panel = make_panel().contiguous()
        out = torch.empty(batch * out_len, cout, device=dev, dtype=dtype)
        panel_mm = lambda: torch.matmul(make_panel().contiguous(), w2.t(), out=out)  # noqa: E731
        mm = lambda: torch.matmul(panel, w2.t(), out=out)  # noqa: E731
        panel_bytes = panel.numel() * panel.element_size()
        macs = batch * out_len * cout * cin * k
    else:  # ConvTranspose1d, weights [cin, cout, k]: x^T [B*L, cin] times [cin, cout*k], then the tap gather
        w = torch.randn(cin, cout, k, device=dev, dtype=dtype) * 0.02
        cudnn = lambda: F.conv_transpose1d(x, w, None, stride, pad)  # noqa: E731
        w2 = w.reshape(cin, cout * k)
        xt = x.transpose(1, 2).reshape(batch * L, cin).contiguous()
        out = torch.empty(batch * L, cout * k, device=dev, dtype=dtype)
        panel_mm = lambda: torch.matmul(x.transpose(1, 2).reshape(batch * L, cin).contiguous(), w2, out=out)  # noqa: E731
        mm = lambda: torch.matmul(xt, w2, out=out)  # noqa: E731
        panel_bytes = xt.numel() * xt.element_size()
        macs = batch * L * cin * cout * k
    r = {"name": name, "kind": kind, "c_in": cin, "c_out": cout, "length": L, "kernel": k, "stride": stride,
         "macs": macs, "panel_bytes": panel_bytes}
    for label, fn in (("cudnn", cudnn), ("panel_mm", panel_mm), ("mm", mm)):
        r[label + "_us"] = graph_time_us(fn, reps, rounds)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("probe_conv1d_paths: no CUDA device")
        return 3
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
              "batch": a.batch, "rows": {}}
    for dtype, label in ((torch.float32, "tf32"), (torch.bfloat16, "bf16")):
        rows = [probe(c, a.batch, dtype, a.reps, a.rounds) for c in unet_convs()]
        result["rows"][label] = rows
        print(f"\n{label} batch {a.batch}: per conv, us (one U-Net call)")
        print(f"{'conv':22s} {'cin':>5s} {'cout':>5s} {'L':>3s} {'k':>2s} {'GMAC':>6s} {'cudnn':>8s} {'panel+mm':>9s} {'mm':>8s}")
        for r in rows:
            print(f"{r['name']:22s} {r['c_in']:5d} {r['c_out']:5d} {r['length']:3d} {r['kernel']:2d} {r['macs'] / 1e9:6.2f} "
                  f"{r['cudnn_us']:8.1f} {r['panel_mm_us']:9.1f} {r['mm_us']:8.1f}")
        tot = {k: sum(r[k] for r in rows) for k in ("cudnn_us", "panel_mm_us", "mm_us")}
        macs = sum(r["macs"] for r in rows)
        print(f"{'total':22s} {'':5s} {'':5s} {'':3s} {'':2s} {macs / 1e9:6.2f} {tot['cudnn_us']:8.1f} "
              f"{tot['panel_mm_us']:9.1f} {tot['mm_us']:8.1f}   (x10 steps per sample: "
              f"{tot['cudnn_us'] / 100:.2f} / {tot['panel_mm_us'] / 100:.2f} / {tot['mm_us'] / 100:.2f} ms)")
        result[label + "_totals_us"] = tot
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
