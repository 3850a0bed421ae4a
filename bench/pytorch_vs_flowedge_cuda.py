#!/usr/bin/env python3
"""Side-by-side GPU benchmark of the PushT Diffusion Policy head in one process on one card: PyTorch (LeRobot's U-Net
when importable, else our bench/torch_dp_unet.py re-implementation; eager, one CUDA graph of the whole sampling loop,
torch.compile) vs flowedge (F32, BF16, F16 weights) on the same weights, condition and noise.

Usage: bench/pytorch_vs_flowedge_cuda.py MODEL.flowedge.safetensors [--batches 1 8 64] [--runs N] [--steps 10]
           [--json bench/results/dp_cuda_vs_pytorch.json] [--md bench/results/dp_cuda_vs_pytorch.md]
           [--flowedge-path DIR] [--no-compile] [--no-tf32] [--compile-budget-s S] [--png FILE]

Latency = host wall time of one call from numpy condition/noise to numpy actions (inputs copied to the device, the
N-step sampler, result copied back), the way a robot control loop calls a policy; p50/p99/max over --runs calls after
--warmup calls. Accuracy = max |a - b| of the normalised [B, horizon, A] actions (the sampler output before MIN_MAX
un-normalisation) against flowedge F32 and against PyTorch eager. PyTorch runs float32 with TF32 OFF
(torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False) so the F32 rows are a parity check;
one more row, "torch cuda graph tf32", is PyTorch's default TF32 convolutions in one CUDA graph (diff reported, not
bounded; --no-tf32 skips it).
Exit 77 ("skipped: no CUDA device") without a usable GPU; 1 when a F32 variant exceeds the 10-step DDIM bound of docs/numerics.md#whole-head-tolerances.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

DDIM_BOUND = 6e-4  # docs/numerics.md#whole-head-tolerances: 10-step DDIM vs PyTorch float32 (TF32 off), max abs, normalised units


def import_flowedge(path: str | None):
    """Imports flowedge. path: a folder holding the flowedge package (an install/site-packages layout), or a CMake build
    folder holding only the built _flowedge extension (build-py/python): then the package sources come from python/
    of this checkout and the extension is registered as flowedge._flowedge before the package imports it."""
    if path:
        path = os.path.abspath(path)
        if os.path.isfile(os.path.join(path, "flowedge", "__init__.py")):
            sys.path.insert(0, path)
        else:
            import glob
            import importlib

            if not glob.glob(os.path.join(path, "_flowedge*")):
                raise SystemExit(f"pytorch_vs_flowedge_cuda: --flowedge-path {path} holds neither flowedge/ nor _flowedge*")
            sys.path.insert(0, path)
            ext = importlib.import_module("_flowedge")
            sys.modules["flowedge._flowedge"] = ext
            sys.path.insert(0, os.path.join(ROOT, "python"))
    import flowedge

    return flowedge


def git_commit() -> str | None:
    try:
        r = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return r.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def nvidia_smi() -> dict:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            f = [x.strip() for x in r.stdout.strip().splitlines()[0].split(",")]
            return {"name": f[0], "driver": f[1], "memory": f[2], "max_sm_clock": f[3]}
    except (OSError, subprocess.SubprocessError):
        pass
    return {}


def stats(ms: list[float]) -> dict:
    a = np.asarray(ms, dtype=np.float64)
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max()),
            "min_ms": float(a.min()), "mean_ms": float(a.mean()), "n": int(a.size)}


def timed(fn, warmup: int, runs: int) -> tuple[dict, np.ndarray]:
    out = None
    for _ in range(warmup):
        out = fn()
    ms = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        ms.append((time.perf_counter() - t0) * 1e3)
    return stats(ms), out


def build_torch_unet(cfg, model_path: str, torch_dp_unet, flowedge, which: str = "auto"):
    """LeRobot's DiffusionConditionalUnet1d when lerobot is importable (which="auto"), else ours (or always ours with
    which="ours"); weights from the compact file."""
    impl = "ours (bench/torch_dp_unet.py)"
    unet = None
    if which == "auto":
        try:
            unet = torch_dp_unet._lerobot_unet(cfg)
            impl = "lerobot DiffusionConditionalUnet1d"
        except ImportError:
            pass
    ours = torch_dp_unet.ConditionalUnet1d(cfg)
    rng = torch_dp_unet.load_compact_weights(ours, model_path, flowedge.diffusion_compact_name)
    if unet is None:
        return ours, impl, rng
    unet.load_state_dict(ours.state_dict(), strict=True)
    unet.cfg = cfg  # the Sampler reads cfg (timesteps, clip)
    return unet, impl, rng


class TorchCall:
    """One PyTorch variant: numpy (cond, noise) -> numpy normalised actions."""

    def __init__(self, torch, sampler, device, batch: int, cfg, graph: bool, bf16: bool = False):
        self.torch = torch
        self.sampler = sampler
        self.cond = torch.zeros(batch, cfg.global_cond_dim, device=device)
        self.noise = torch.zeros(batch, cfg.horizon, cfg.action_dim, device=device)
        self.graph = None
        self.out = None
        if graph:
            # bf16: convs and linears under autocast (BF16 operands, F32 accumulate), the rest in float32: PyTorch's
            # usual mixed precision, the counterpart of flowedge's BF16 math.
            amp = lambda: torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16)  # noqa: E731
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s), torch.no_grad(), amp():
                for _ in range(3):  # warm cuDNN/cuBLAS handles and workspaces outside the capture
                    sampler.run(self.cond, self.noise)
            torch.cuda.current_stream().wait_stream(s)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph), torch.no_grad(), amp():
                self.out = sampler.run(self.cond, self.noise)

    def __call__(self, cond_np: np.ndarray, noise_np: np.ndarray) -> np.ndarray:
        torch = self.torch
        self.cond.copy_(torch.from_numpy(cond_np))
        self.noise.copy_(torch.from_numpy(noise_np))
        if self.graph is not None:
            self.graph.replay()
            out = self.out
        else:
            with torch.no_grad():
                out = self.sampler.run(self.cond, self.noise)
        return out.float().cpu().numpy()  # synchronises


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="compact *.flowedge.safetensors (flowedge-make-demo-diffusion output)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0, help="numpy seed of the condition and noise")
    ap.add_argument("--dtypes", nargs="+", default=["f32", "bf16", "f16"], help="flowedge weight dtypes")
    ap.add_argument("--maths", nargs="+", default=["f32"], choices=["f32", "tf32", "bf16"],
                    help="flowedge math modes (DiffusionHead.math) timed for every weight dtype; rows 'flowedge <dtype> math=<m>'")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    ap.add_argument("--no-tf32", action="store_true",
                    help="skip the 'torch cuda graph tf32' (PyTorch default TF32) and 'torch cuda graph bf16' (autocast) variants")
    ap.add_argument("--compile-budget-s", type=float, default=180.0,
                    help="skip torch.compile for later batches once one compile took longer than this")
    ap.add_argument("--flowedge-path", default=None, help="folder with the flowedge package or the built _flowedge")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--png", default=None, help="samples/s vs batch per row, against the card's compute and bandwidth roofs "
                    "(bench/plot_batch_throughput.py; needs matplotlib)")
    ap.add_argument("--torch-unet", choices=["auto", "ours"], default="auto",
                    help="auto: LeRobot's U-Net module when lerobot is importable, else bench/torch_dp_unet.py")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="check the pipeline without a GPU: flowedge and PyTorch eager on the CPU (no graph/compile)")
    args = ap.parse_args()

    try:
        import torch
    except ImportError as e:
        print(f"pytorch_vs_flowedge_cuda: PyTorch is not importable ({e})", file=sys.stderr)
        return 2
    on_gpu = not args.cpu_smoke
    if on_gpu and not torch.cuda.is_available():
        print("skipped: no CUDA device (torch.cuda.is_available() is False)")
        return 77
    import torch_dp_unet

    flowedge = import_flowedge(args.flowedge_path)
    if on_gpu and not flowedge.cuda:
        print("pytorch_vs_flowedge_cuda: this flowedge build has no CUDA backend (build with -DFLOWEDGE_BACKEND=cuda)",
              file=sys.stderr)
        return 2
    if not os.path.isfile(args.model):
        print(f"pytorch_vs_flowedge_cuda: {args.model}: no such file", file=sys.stderr)
        return 2

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda" if on_gpu else "cpu")
    fe_device = "cuda" if on_gpu else "cpu"
    cfg = torch_dp_unet.config_from_compact(args.model)
    max_b = max(args.batches)

    heads = {}
    for dt in args.dtypes:
        t0 = time.perf_counter()
        h = flowedge.DiffusionHead(args.model, device=fe_device, max_batch=max_b, dtype=dt)
        heads[dt] = (h, (time.perf_counter() - t0) * 1e3)
        if on_gpu and not h.cuda_resident:
            print(f"pytorch_vs_flowedge_cuda: flowedge {dt} head is not CUDA-resident: {h.fallback_reason}", file=sys.stderr)
            return 2
    h0 = heads[args.dtypes[0]][0]
    got = dict(action_dim=h0.action_dim, horizon=h0.horizon, global_cond_dim=h0.global_cond_dim,
               down_dims=list(h0.down_dims), kernel_size=h0.kernel_size, n_groups=h0.n_groups,
               step_embed_dim=h0.step_embed_dim, clip_sample=h0.clip_sample)
    for k, v in got.items():
        if getattr(cfg, k) != v:
            print(f"pytorch_vs_flowedge_cuda: config mismatch {k}: file {getattr(cfg, k)} vs flowedge {v}", file=sys.stderr)
            return 1

    unet, impl, _ = build_torch_unet(cfg, args.model, torch_dp_unet, flowedge, args.torch_unet)
    unet = unet.to(dev).eval()
    n_params = sum(p.numel() for p in unet.parameters())
    compiled = None
    if args.cpu_smoke:
        args.no_compile = True
    compile_note = "skipped (--no-compile)" if args.no_compile else ""
    if not args.no_compile:
        try:
            compiled = torch.compile(unet)
        except Exception as e:  # noqa: BLE001 - any failure is reported, the other variants still run
            compile_note = f"torch.compile failed: {type(e).__name__}: {e}"

    # Multiply-add work of one U-Net call per sample (torch's FLOP counter: convolutions, ConvTranspose, linears),
    # for the throughput roofs of --png.
    from torch.utils.flop_counter import FlopCounterMode
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        unet(torch.zeros(1, cfg.horizon, cfg.action_dim, device=dev), torch.full((1,), 10, dtype=torch.long, device=dev),
             torch.zeros(1, cfg.global_cond_dim, device=dev))
    unet_gflop = fc.get_total_flops() / 1e9

    smi = nvidia_smi()
    meta = {
        "bench": "dp_cuda_vs_pytorch", "model": os.path.relpath(os.path.abspath(args.model), ROOT),
        "card": torch.cuda.get_device_name(0) if on_gpu else f"CPU smoke run ({platform.processor() or platform.machine()})", "driver": smi.get("driver"), "nvidia_smi": smi,
        "torch": torch.__version__, "torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "flowedge_version": flowedge.__version__, "flowedge_commit": git_commit(), "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch_unet": impl, "unet_parameters": n_params, "unet_gflop_per_sample": unet_gflop, "scheduler": "ddim", "steps": args.steps,
        "runs": args.runs, "warmup": args.warmup, "seed": args.seed, "tf32": False, "torch_dtype": "float32",
        "timing": "host wall time per call, numpy in -> numpy out (H2D inputs, sampler, D2H output)",
        "diff_units": "normalised actions (sampler output before MIN_MAX un-normalisation), max abs",
        "flowedge_load_ms": {dt: ms for dt, (_, ms) in heads.items()},
    }
    print(f"card {meta['card']} driver {meta['driver']} torch {meta['torch']} flowedge {meta['flowedge_version']} "
          f"commit {meta['flowedge_commit']}")
    print(f"PyTorch U-Net: {impl}, {n_params:,} params, float32, TF32 off; DDIM {args.steps} steps; "
          f"{args.runs} runs after {args.warmup} warm-up")

    rows = []
    failures = []
    compile_spent = 0.0
    for B in args.batches:
        rs = np.random.RandomState(args.seed + B)
        cond = rs.standard_normal((B, cfg.global_cond_dim)).astype(np.float32)
        noise = rs.standard_normal((B, cfg.horizon, cfg.action_dim)).astype(np.float32)
        outs = {}

        def add(name, st, out, extra=None):
            outs[name] = out
            rows.append({"batch": B, "impl": name, **st, **(extra or {})})

        for dt, (h, _) in heads.items():
            for mth in args.maths:
                if mth != "f32":
                    h.math = mth
                st, out = timed(lambda: h.sample(cond, noise, steps=args.steps, scheduler="ddim", normalized=True),
                                args.warmup, args.runs)
                add(f"flowedge {dt}" if mth == "f32" else f"flowedge {dt} math={mth}", st, out)
                h.math = "f32"
        sampler = torch_dp_unet.Sampler(unet, "ddim", args.steps, B, dev)
        eager = TorchCall(torch, sampler, dev, B, cfg, graph=False)
        st, out = timed(lambda: eager(cond, noise), args.warmup, args.runs)
        add("torch eager", st, out)
        # The whole loop in one CUDA graph, TF32 off (an F32 parity row) and, unless --no-tf32, with PyTorch's default
        # TF32 convolutions (TF32 rounds conv inputs to 10 mantissa bits) and under BF16 autocast: diffs reported only.
        graph_variants = [("torch cuda graph", False, False)]
        if not args.no_tf32:
            graph_variants += [("torch cuda graph tf32", True, False), ("torch cuda graph bf16", True, True)]
        for name, tf32, bf16 in graph_variants if on_gpu else []:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
            try:
                g = TorchCall(torch, sampler, dev, B, cfg, graph=True, bf16=bf16)
                st, out = timed(lambda: g(cond, noise), args.warmup, args.runs)
                add(name, st, out)
                del g
            except Exception as e:  # noqa: BLE001
                rows.append({"batch": B, "impl": name, "note": f"capture failed: {type(e).__name__}: {e}"})
            finally:
                torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        if compiled is not None and compile_spent <= args.compile_budget_s:
            try:
                csampler = torch_dp_unet.Sampler(compiled, "ddim", args.steps, B, dev)
                comp = TorchCall(torch, csampler, dev, B, cfg, graph=False)
                t0 = time.perf_counter()
                comp(cond, noise)  # compiles (or recompiles for a new batch)
                compile_s = time.perf_counter() - t0
                compile_spent = max(compile_spent, compile_s)
                st, out = timed(lambda: comp(cond, noise), args.warmup, args.runs)
                add("torch.compile", st, out, {"compile_s": compile_s})
            except Exception as e:  # noqa: BLE001
                compile_note = f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
                rows.append({"batch": B, "impl": "torch.compile", "note": compile_note})
                compiled = None
        elif compiled is not None:
            rows.append({"batch": B, "impl": "torch.compile",
                         "note": f"skipped: a compile took {compile_spent:.0f} s > --compile-budget-s {args.compile_budget_s:g}"})
        ref_fe, ref_torch = outs.get("flowedge f32"), outs["torch eager"]
        for r in rows:
            if r["batch"] != B or r["impl"] not in outs:
                continue
            o = outs[r["impl"]]
            if not np.all(np.isfinite(o)):
                r["note"] = "non-finite output"
                failures.append(f"B={B} {r['impl']}: non-finite output")
            if ref_fe is not None:
                r["max_abs_diff_vs_flowedge_f32"] = float(np.abs(o - ref_fe).max())
            r["max_abs_diff_vs_torch_eager"] = float(np.abs(o - ref_torch).max())
            f32_pair = r["impl"] in ("flowedge f32", "torch eager", "torch cuda graph", "torch.compile")
            d = r.get("max_abs_diff_vs_flowedge_f32") if r["impl"] != "flowedge f32" else r["max_abs_diff_vs_torch_eager"]
            if f32_pair and d is not None and d > DDIM_BOUND:
                failures.append(f"B={B} {r['impl']}: max abs diff {d:.3g} > {DDIM_BOUND:g}")
        del eager, sampler
        if on_gpu:
            torch.cuda.empty_cache()

    meta["torch_compile_note"] = compile_note or "default mode"
    result = {**meta, "results": rows, "failures": failures, "ddim_bound": DDIM_BOUND}
    table = markdown(result)
    print(table)
    if failures:
        print("FAIL: " + "; ".join(failures), file=sys.stderr)
    for path, text in ((args.json, json.dumps(result, indent=2) + "\n"), (args.md, table)):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
    if args.png:
        if not args.json:
            print("pytorch_vs_flowedge_cuda: --png needs --json (the plot reads it)", file=sys.stderr)
            return 2
        subprocess.run([sys.executable, os.path.join(HERE, "plot_batch_throughput.py"), args.json, "--png", args.png], check=False)
    return 1 if failures else 0


def markdown(r: dict) -> str:
    def num(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    lines = [
        f"# PushT Diffusion Policy head: PyTorch vs flowedge on {r['card']}",
        "",
        f"- driver {r['driver']}, torch {r['torch']} (CUDA {r['torch_cuda']}, cuDNN {r['cudnn']}), flowedge "
        f"{r['flowedge_version']} commit `{r['flowedge_commit']}`, {r['date']}",
        f"- model `{r['model']}`, {r['unet_parameters']:,} U-Net parameters; PyTorch U-Net: {r['torch_unet']}, float32, "
        f"**TF32 off** (except the \"torch cuda graph tf32\" row: PyTorch default TF32 convolutions, and \"torch cuda graph bf16\": BF16 autocast); torch.compile: {r['torch_compile_note']}",
        f"- DDIM {r['steps']} steps; {r['runs']} timed calls after {r['warmup']} warm-up; {r['timing']}",
        f"- diff: {r['diff_units']}; F32 parity bound (docs/numerics.md#whole-head-tolerances, 10-step DDIM) {r['ddim_bound']:g}",
        "",
        "| batch | implementation | p50 ms | p99 ms | max ms | max abs diff vs flowedge f32 | vs torch eager | note |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for x in r["results"]:
        note = x.get("note", "")
        if "compile_s" in x:
            note = (note + "; " if note else "") + f"compile {x['compile_s']:.1f} s"
        lines.append(f"| {x['batch']} | {x['impl']} | {num(x.get('p50_ms'), '.3f')} | {num(x.get('p99_ms'), '.3f')} | "
                     f"{num(x.get('max_ms'), '.3f')} | {num(x.get('max_abs_diff_vs_flowedge_f32'), '.3g')} | "
                     f"{num(x.get('max_abs_diff_vs_torch_eager'), '.3g')} | {note} |")
    if r["failures"]:
        lines += ["", "**Failures:** " + "; ".join(r["failures"])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
