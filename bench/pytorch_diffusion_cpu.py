#!/usr/bin/env python3
"""PyTorch eager baseline for bench/diffusion_cpu_bench: LeRobot's DiffusionConditionalUnet1d with the PushT weights,
batch 1, N-step DDIM through LeRobot's own DiffusionModel.conditional_sample (U-Net calls plus diffusers scheduler
math), torch.set_num_threads(T), p50 over the timed runs. Loads a LeRobot pretrained_model folder (config.json +
model.safetensors), e.g. models/dp_pusht written by tools/make_reference_diffusion.py --pusht."""
import argparse
import copy
import json
import math
import os
import statistics
import sys
import time

import torch
from safetensors.torch import load_file

from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy


def loadavg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="LeRobot pretrained_model folder (config.json + model.safetensors)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    cfg = PreTrainedConfig.from_pretrained(args.folder)
    cfg = copy.deepcopy(cfg)
    cfg.noise_scheduler_type = "DDIM"
    cfg.num_inference_steps = args.steps
    cfg.pretrained_backbone_weights = None  # the folder's state dict carries every backbone weight
    cfg.device = "cpu"
    policy = DiffusionPolicy(cfg)
    state = load_file(os.path.join(args.folder, "model.safetensors"))
    missing, unexpected = policy.load_state_dict(state, strict=False)
    unet_missing = [k for k in missing if k.startswith("diffusion.unet.")]
    if unet_missing:
        print(f"pytorch_diffusion_cpu: U-Net weights missing from the folder: {unet_missing[:5]}", file=sys.stderr)
        return 1
    policy.eval()
    model = policy.diffusion
    unet = model.unet
    n_params = sum(p.numel() for p in unet.parameters())
    # cond_encoder's Linear takes [step embedding | global cond].
    global_cond_dim = unet.down_modules[0][0].cond_encoder[1].in_features - unet.diffusion_step_encoder[3].out_features
    horizon, action_dim = cfg.horizon, cfg.action_feature.shape[0]
    # Same deterministic inputs as diffusion_cpu_bench.cpp.
    cond = torch.tensor([0.5 * math.sin(0.11 * (i + 1)) for i in range(global_cond_dim)], dtype=torch.float32)[None]
    noise = torch.tensor([math.sin(0.37 * (i + 1)) for i in range(horizon * action_dim)],
                         dtype=torch.float32).reshape(1, horizon, action_dim)

    out = {"bench": "diffusion_cpu", "impl": "pytorch_eager", "torch": torch.__version__, "folder": args.folder,
           "unet_parameters": n_params, "batch": 1, "scheduler": "ddim", "steps": args.steps, "runs": args.runs,
           "scheduler_class": type(model.noise_scheduler).__name__, "results": []}
    for t in args.threads:
        torch.set_num_threads(t)
        with torch.inference_mode():
            for _ in range(args.warmup):
                model.conditional_sample(1, global_cond=cond, noise=noise.clone())
            load0 = loadavg()
            ms = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                x = model.conditional_sample(1, global_cond=cond, noise=noise.clone())
                ms.append((time.perf_counter() - t0) * 1e3)
        s = sorted(ms)
        r = {"threads": t, "ms": {"min": s[0], "p50": statistics.median(s), "max": s[-1], "mean": statistics.fmean(s)},
             "all_ms": ms, "loadavg_before": load0, "loadavg_after": loadavg(),
             "normalized_0_2": [float(v) for v in x.flatten()[:3]]}
        out["results"].append(r)
        print(f"pytorch eager F32, {t} thread(s): min {s[0]:.1f}  p50 {r['ms']['p50']:.1f}  max {s[-1]:.1f} ms "
              f"({args.steps}-step DDIM, {n_params} U-Net params) | load {load0}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
