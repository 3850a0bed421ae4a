"""flowedge-lerobot-replay: the same recorded observations and noise through LeRobot's sampler and flowedge's (docs/contracts.md#matched-replay).

``--backend flowedge-policy`` instead replays the observations through the whole policy in flowedge.DiffusionPolicy
(reset, then select_action per step with the k-th chunk's noise) or, for an ACT folder, flowedge.ActPolicy, without
importing torch or lerobot.

Both runs use one LeRobot policy object (same PyTorch encoder, same pre/post-processors, same device); only
``DiffusionModel.conditional_sample`` differs: LeRobot's diffusers loop, or flowedge via :mod:`flowedge.lerobot`.
Every replay step is one full inference: the newest raw frame goes through LeRobot's preprocessor, the last
``n_obs_steps`` preprocessed frames (the first one repeated at the start, as LeRobot's queues do) go through
``generate_actions`` with that step's recorded noise, and the executed rows through the postprocessor.

Observation file (``.npz``): one array per raw policy input feature, ``[N, *feature shape]`` float32 (images
channel-first in [0, 1], as ``lerobot.envs.utils.preprocess_observation`` makes them), and ``noise``
``[N, horizon, action_dim]`` (optional: drawn from ``--seed`` when absent). Without ``--obs`` a deterministic
synthetic file of the right shapes is generated from ``--seed`` and saved (``--save-obs``) so the run can be
repeated.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from . import _stats
from ._deps import require_lerobot

# docs/numerics.md#whole-head-tolerances, max abs in normalised units: 10-step DDIM vs PyTorch float32.
PARITY_BOUND_DDIM = 6e-4


# ----------------------------------------------------------------------------------------------------------------
# Small helpers shared with flowedge.rollout
# ----------------------------------------------------------------------------------------------------------------

def set_threads(n: Optional[int]) -> Dict[str, Any]:
    """Sets intra-op threads for PyTorch and for flowedge's OpenMP runtime (one libgomp is shared in-process)."""
    import torch

    if n is not None:
        if n < 1:
            raise SystemExit(f"flowedge: replay: --threads must be >= 1 (got {n})")
        torch.set_num_threads(n)
        try:
            ctypes.CDLL("libgomp.so.1").omp_set_num_threads(ctypes.c_int(n))
        except OSError:
            pass
    return {"torch_threads": torch.get_num_threads(), "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS")}


def check_device(device: str, tool: str) -> None:
    """--device cuda needs both a CUDA PyTorch (LeRobot's encoder) and a flowedge build with the CUDA backend."""
    if device != "cuda":
        return
    import torch

    import flowedge

    if not torch.cuda.is_available():
        raise SystemExit(f"flowedge: {tool}: --device cuda needs a GPU visible to PyTorch "
                         "(expected torch.cuda.is_available() true, got false)")
    if not flowedge.cuda:
        raise SystemExit(f"flowedge: {tool}: --device cuda needs flowedge built with the CUDA backend "
                         "(expected flowedge.cuda true, got false; FLOWEDGE_BACKEND=cuda pip install .)")
    torch.backends.cuda.matmul.allow_tf32 = False  # docs/numerics.md#whole-head-tolerances: parity is against PyTorch float32 with TF32 off
    torch.backends.cudnn.allow_tf32 = False


def peak_rss_mib() -> float:
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(kib / 1024.0 if sys.platform != "darwin" else kib / 2**20, 1)


def percentiles_ms(seconds: List[float]) -> Dict[str, Optional[float]]:
    """p50/p95/p99/mean/max of a list of durations in seconds, reported in milliseconds."""
    return _stats.percentiles_ms(seconds, (50, 95, 99))


def versions() -> Dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("flowedge", "lerobot", "torch", "diffusers", "numpy", "gym-pusht"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    import flowedge

    out["flowedge_module"] = flowedge.__version__
    return out


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class Timed:
    """Wraps a callable and records its wall time per call (synchronising CUDA so device time is counted)."""

    def __init__(self, fn: Callable, device: Any):
        self.fn, self.device, self.times = fn, device, []

    def __call__(self, *args, **kwargs):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        out = self.fn(*args, **kwargs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times.append(time.perf_counter() - t0)
        return out


class Backends:
    """One LeRobot policy whose sampler can be switched between LeRobot's own and flowedge's, with timers.

    ``use("lerobot" | "flowedge")`` installs the chosen sampler; both are wrapped in :class:`Timed`
    (``sampler_timer``), and so is the encoder step ``_prepare_global_conditioning`` (``encoder_timer``).
    """

    def __init__(self, policy_dir: str, device: str, scheduler: str, steps: int, ddpm_seed: Optional[int] = None,
                 need_flowedge: bool = True):
        import torch

        from . import lerobot as fl

        self.policy_dir = policy_dir
        self.torch_device = torch.device(device)
        t0 = time.perf_counter()
        self.policy = fl.load_lerobot_policy(policy_dir, torch_device=device)
        self.pre, self.post = fl.load_processors(policy_dir, torch_device=device)
        self.lerobot_load_s = time.perf_counter() - t0
        fl.set_lerobot_scheduler(self.policy, scheduler, steps)  # LeRobot's loop runs the same algorithm
        self.sampler = None
        self.flowedge_load_s = 0.0
        if need_flowedge:
            t0 = time.perf_counter()
            fl.wrap(self.policy, policy_dir, device=device, scheduler=scheduler, num_inference_steps=steps,
                    ddpm_seed=ddpm_seed)
            self.flowedge_load_s = time.perf_counter() - t0
            self.sampler = self.policy.flowedge
            fl.unwrap(self.policy)
        self.scheduler, self.steps = scheduler, steps
        self.encoder_timer: Optional[Timed] = None
        self.sampler_timer: Optional[Timed] = None
        self.backend: Optional[str] = None

    @property
    def config(self):
        return self.policy.config

    def use(self, backend: str) -> None:
        d = self.policy.diffusion
        for name in ("conditional_sample", "_prepare_global_conditioning"):
            d.__dict__.pop(name, None)
        if backend == "flowedge":
            if self.sampler is None:
                raise SystemExit("flowedge: replay: the flowedge backend was not loaded")
            inner = self.sampler
        elif backend == "lerobot":
            inner = d.conditional_sample  # the class method, bound
        else:
            raise SystemExit(f"flowedge: replay: unknown backend (expected lerobot|flowedge, got {backend!r})")
        self.sampler_timer = Timed(inner, self.torch_device)
        self.encoder_timer = Timed(d._prepare_global_conditioning, self.torch_device)
        d.conditional_sample = self.sampler_timer
        d._prepare_global_conditioning = self.encoder_timer
        # flowedge.lerobot.is_wrapped() looks for this attribute
        if backend == "flowedge":
            self.policy.flowedge = self.sampler
        else:
            self.policy.__dict__.pop("flowedge", None)
        self.backend = backend


# ----------------------------------------------------------------------------------------------------------------
# Observations
# ----------------------------------------------------------------------------------------------------------------

def normalizer_stats(pre) -> Dict[str, Dict[str, np.ndarray]]:
    """Per-feature statistics held by LeRobot's normalizer step of a preprocessor pipeline (may be empty)."""
    for step in getattr(pre, "steps", []):
        stats = getattr(step, "stats", None)
        if isinstance(stats, dict) and stats:
            out = {}
            for key, d in stats.items():
                out[key] = {k: np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v, dtype=np.float32)
                            for k, v in d.items()}
            return out
    return {}


def synthetic_observations(config, pre, n: int, seed: int) -> Dict[str, np.ndarray]:
    """Deterministic random observations for every raw input feature, ``[n, *shape]`` float32, plus ``noise``.

    State-like features are drawn inside the preprocessor's MIN_MAX range (or mean +- std), images uniformly
    in [0, 1] (channel-first, as LeRobot's env preprocessing produces), and the initial noise ``x_T`` is
    standard normal ``[n, horizon, action_dim]``.
    """
    rng = np.random.default_rng(seed)
    stats = normalizer_stats(pre)
    out: Dict[str, np.ndarray] = {}
    for key, feat in config.input_features.items():
        shape = (n,) + tuple(feat.shape)
        kind = getattr(feat.type, "name", str(feat.type))
        st = stats.get(key, {})
        if kind == "VISUAL":
            out[key] = rng.random(shape, dtype=np.float32)
        elif "min" in st and "max" in st:
            lo, hi = st["min"].reshape(-1), st["max"].reshape(-1)
            out[key] = (lo + rng.random(shape, dtype=np.float32) * (hi - lo)).astype(np.float32)
        elif "mean" in st and "std" in st:
            out[key] = (st["mean"].reshape(-1) + st["std"].reshape(-1) * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[key] = rng.standard_normal(shape).astype(np.float32)
    H, A = config.horizon, config.action_feature.shape[0]
    out["noise"] = rng.standard_normal((n, H, A)).astype(np.float32)
    return out


def load_observations(path: str, config, n_steps: Optional[int], seed: int) -> Dict[str, np.ndarray]:
    with np.load(path) as z:
        obs = {k: np.asarray(z[k], dtype=np.float32) for k in z.files}
    n = None
    for key, feat in config.input_features.items():
        if key not in obs:
            raise SystemExit(f"flowedge: replay: {path} lacks observation {key!r} (expected keys "
                             f"{sorted(config.input_features)} [+ noise], got {sorted(obs)})")
        if tuple(obs[key].shape[1:]) != tuple(feat.shape):
            raise SystemExit(f"flowedge: replay: {key} shape (expected [N, {', '.join(map(str, feat.shape))}], "
                             f"got {list(obs[key].shape)})")
        n = obs[key].shape[0] if n is None else min(n, obs[key].shape[0])
    H, A = config.horizon, config.action_feature.shape[0]
    if "noise" not in obs:
        obs["noise"] = np.random.default_rng(seed).standard_normal((n, H, A)).astype(np.float32)
    if tuple(obs["noise"].shape[1:]) != (H, A):
        raise SystemExit(f"flowedge: replay: noise shape (expected [N, {H}, {A}], got {list(obs['noise'].shape)})")
    n = min(n, obs["noise"].shape[0])
    if n_steps is not None:
        if n_steps > n:
            raise SystemExit(f"flowedge: replay: --steps {n_steps} exceeds the {n} frames in {path}")
        n = n_steps
    return {k: v[:n] for k, v in obs.items()}


# ----------------------------------------------------------------------------------------------------------------
# Replay
# ----------------------------------------------------------------------------------------------------------------

def _stack_window(config, frames: List[Dict[str, Any]]):
    """LeRobot's queue layout: ``[1, n_obs_steps, ...]`` per key, images stacked over cameras at dim -4."""
    import torch

    from lerobot.utils.constants import OBS_IMAGES

    keys = [k for k in frames[0] if k in config.input_features]
    batch = {k: torch.stack([f[k] for f in frames], dim=1) for k in keys}
    if config.image_features:
        per_frame = [torch.stack([f[k] for k in config.image_features], dim=-4) for f in frames]
        batch[OBS_IMAGES] = torch.stack(per_frame, dim=1)
    return batch


def run_backend(bk: Backends, backend: str, obs: Dict[str, np.ndarray], warmup: int) -> Dict[str, Any]:
    """Replays every frame through ``backend``; returns timings and the produced actions."""
    import torch

    bk.use(backend)
    cfg = bk.config
    dev = bk.torch_device
    keys = list(cfg.input_features)
    n = obs["noise"].shape[0]
    n_obs = cfg.n_obs_steps
    norm_chunks, actions, e2e = [], [], []

    def step(i: int, record: bool):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        frame = {k: torch.from_numpy(obs[k][i]).unsqueeze(0) for k in keys}
        pre_frames.append(bk.pre(frame))
        window = [pre_frames[max(0, j)] for j in range(len(pre_frames) - n_obs, len(pre_frames))]
        batch = _stack_window(cfg, window)
        noise = torch.from_numpy(obs["noise"][i]).unsqueeze(0).to(dev)
        with torch.no_grad():
            chunk = bk.policy.diffusion.generate_actions(batch, noise=noise)  # [1, n_action_steps, A] normalised
            act = bk.post(chunk)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        dt = time.perf_counter() - t0
        if record:
            e2e.append(dt)
            norm_chunks.append(chunk[0].detach().float().cpu().numpy())
            actions.append(act[0].detach().float().cpu().numpy())

    pre_frames: List[Any] = []
    for i in range(min(warmup, n)):
        step(i, record=False)
    bk.sampler_timer.times.clear()
    bk.encoder_timer.times.clear()
    pre_frames = []
    for i in range(n):
        step(i, record=True)
    return {
        "policy_ms": percentiles_ms(bk.sampler_timer.times),
        "encoder_ms": percentiles_ms(bk.encoder_timer.times),
        "end_to_end_ms": percentiles_ms(e2e),
        "_norm": np.stack(norm_chunks),
        "_actions": np.stack(actions),
    }


def markdown_report(r: Dict[str, Any]) -> str:
    lr, fe = r["lerobot"], r["flowedge"]
    lines = [
        f"# Matched replay: LeRobot vs flowedge ({r['device']})",
        "",
        f"Policy `{r['policy']}` ({r['unet_parameters']:,} U-Net parameters), {r['steps']} replay steps "
        f"(+{r['warmup']} warm-up), {r['scheduler'].upper()} {r['diffusion_steps']} steps, "
        f"threads {r['threads']['torch_threads']}, CPU: {r['cpu']}.",
        f"Observations: {r['observations']}.",
        "",
        "| ms per inference | LeRobot p50 | p95 | p99 | flowedge p50 | p95 | p99 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, label in (("policy_ms", "policy (U-Net + scheduler)"), ("encoder_ms", "encoder (PyTorch, both)"),
                       ("end_to_end_ms", "end to end (pre + encoder + policy + post)")):
        a, b = lr[key], fe[key]
        lines.append(f"| {label} | {a['p50']} | {a['p95']} | {a['p99']} | {b['p50']} | {b['p95']} | {b['p99']} |")
    lines += [
        "",
        f"Policy p50 speed-up: **{r['speedup_policy_p50']}x**; end-to-end p50 speed-up: {r['speedup_end_to_end_p50']}x.",
        "",
        f"Max abs action difference: {r['max_abs_diff_normalized']:.3e} normalised "
        f"(bound {r['parity_bound_normalized']}), {r['max_abs_diff_actions']:.3e} in action units "
        f"-> parity {'OK' if r['parity_ok'] else 'NOT within bound' if r['parity_ok'] is False else 'n/a (DDPM)'}.",
        "",
        f"Peak RSS {r['peak_rss_mib']} MiB; 1-minute load average {r.get('load_average_1m')} during the run "
        f"(timings on a shared machine include contention). Versions: "
        + ", ".join(f"{k} {v}" for k, v in r["versions"].items()) + ".",
        "",
    ]
    if r.get("note"):
        lines += [r["note"], ""]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="flowedge-lerobot-replay",
                                 description="Matched replay: same observations + noise through LeRobot and flowedge.")
    ap.add_argument("policy_dir", help="LeRobot pretrained_model folder (config.json, model.safetensors, processors)")
    ap.add_argument("--obs", help="observation .npz (one [N, *shape] array per input feature, optional 'noise')")
    ap.add_argument("--save-obs", help="where to save the synthetic observations (default: next to --output)")
    ap.add_argument("--steps", type=int, default=None, help="replay steps (synthetic default 20; file default all)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed warm-up steps per backend (default 1)")
    ap.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                    help="auto is for --backend flowedge-policy (the GPU when usable, else the CPU)")
    ap.add_argument("--diffusion-steps", type=int, default=None,
                    help="default 10; with --backend flowedge-policy the checkpoint's num_inference_steps")
    ap.add_argument("--scheduler", choices=("ddim", "ddpm"), default=None,
                    help="default ddim; with --backend flowedge-policy the checkpoint's noise_scheduler_type")
    ap.add_argument("--seed", type=int, default=0, help="synthetic observations / noise seed (default 0)")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads for PyTorch and flowedge")
    ap.add_argument("--output", help="JSON result path (default: print to stdout)")
    ap.add_argument("--markdown", help="markdown summary path")
    ap.add_argument("--backend", choices=("both", "flowedge-policy"), default="both",
                    help="both: LeRobot's sampler vs flowedge's inside one LeRobot policy (needs torch + lerobot); "
                         "flowedge-policy: the whole policy in flowedge.DiffusionPolicy or ActPolicy (by config.json's "
                         "type), no torch or lerobot: --obs holds [T, ...] arrays per feature key (camera frames "
                         "[T, H, W, 3] uint8 or [T, 3, H, W] float32 in [0, 1]) and, for a Diffusion Policy, optionally "
                         "noise [K, horizon, action_dim], the k-th chunk's initial noise")
    ap.add_argument("--actions-out", help="flowedge-policy: write the [T, action_dim] actions here (.npy)")
    ap.add_argument("--reference-actions", help="flowedge-policy: [T, action_dim] .npy to compare the actions with")
    ap.add_argument("--dtype", choices=("f32", "bf16", "f16"), default=None, help="flowedge-policy: weight storage")
    ap.add_argument("--quantize", choices=("none", "int8", "w8a8"), default=None,
                    help="flowedge-policy, Diffusion Policy on the CPU: opt-in INT8 U-Net weights (int8: AVX2 / AVX-512) or INT8 "
                         "weights and activations (w8a8: AVX2, or AVX-512 with VNNI); error bounds in docs/numerics.md")
    args = ap.parse_args(argv)
    if args.backend == "flowedge-policy":
        return main_policy(args)
    from . import policy_type

    if policy_type(args.policy_dir) == "act":
        ap.error("an ACT folder replays with --backend flowedge-policy (--backend both swaps the Diffusion Policy's sampler)")
    require_lerobot("lerobot-replay")

    if args.device == "auto":
        ap.error("--device auto is for --backend flowedge-policy")
    args.diffusion_steps = 10 if args.diffusion_steps is None else args.diffusion_steps
    args.scheduler = args.scheduler or "ddim"
    check_device(args.device, "replay")
    threads = set_threads(args.threads)
    bk = Backends(args.policy_dir, args.device, args.scheduler, args.diffusion_steps)
    cfg = bk.config
    if args.obs:
        obs = load_observations(args.obs, cfg, args.steps, args.seed)
        obs_desc = f"file {args.obs}"
    else:
        n = args.steps if args.steps is not None else 20
        obs = synthetic_observations(cfg, bk.pre, n, args.seed)
        save = args.save_obs or (str(Path(args.output).with_suffix("")) + "_obs.npz" if args.output else None)
        if save:
            Path(save).parent.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(save, **obs)
        obs_desc = f"synthetic (seed {args.seed})" + (f", saved to {save}" if save else "")

    res_lr = run_backend(bk, "lerobot", obs, args.warmup)
    res_fe = run_backend(bk, "flowedge", obs, args.warmup)
    dn = float(np.abs(res_lr["_norm"] - res_fe["_norm"]).max())
    da = float(np.abs(res_lr["_actions"] - res_fe["_actions"]).max())
    ddim = args.scheduler == "ddim"
    bound = PARITY_BOUND_DDIM if ddim else None

    def ratio(a, b):
        return round(a / b, 3) if a and b else None

    result = {
        "tool": "flowedge-lerobot-replay",
        "policy": args.policy_dir,
        "unet_parameters": int(sum(p.numel() for p in bk.policy.diffusion.unet.parameters())),
        "flowedge_parameters": int(bk.sampler.head.n_parameters),
        "device": args.device,
        "flowedge_backend": bk.sampler.head.backend,
        "cuda_resident": bool(bk.sampler.head.cuda_resident),
        "cpu": cpu_name(),
        "threads": threads,
        "scheduler": args.scheduler,
        "diffusion_steps": args.diffusion_steps,
        "steps": int(obs["noise"].shape[0]),
        "warmup": args.warmup,
        "observations": obs_desc,
        "load_ms": {"lerobot": round(bk.lerobot_load_s * 1e3, 1), "flowedge_head": round(bk.flowedge_load_s * 1e3, 1)},
        "lerobot": {k: v for k, v in res_lr.items() if not k.startswith("_")},
        "flowedge": {k: v for k, v in res_fe.items() if not k.startswith("_")},
        "speedup_policy_p50": ratio(res_lr["policy_ms"]["p50"], res_fe["policy_ms"]["p50"]),
        "speedup_end_to_end_p50": ratio(res_lr["end_to_end_ms"]["p50"], res_fe["end_to_end_ms"]["p50"]),
        "max_abs_diff_normalized": dn,
        "max_abs_diff_actions": da,
        "parity_bound_normalized": bound,
        "parity_ok": (dn <= bound) if ddim else None,
        "peak_rss_mib": peak_rss_mib(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "versions": versions(),
    }
    if not ddim:
        result["note"] = ("DDPM: LeRobot draws its per-step noise from torch, flowedge from SplitMix64 (docs/models.md#seeded-noise), so "
                          "only the initial noise is shared and the actions are not expected to match.")
    text = json.dumps(result, indent=1)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text + "\n")
    else:
        print(text)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(markdown_report(result))
    print(f"replay: policy p50 LeRobot {res_lr['policy_ms']['p50']} ms, flowedge {res_fe['policy_ms']['p50']} ms; "
          f"max abs diff {dn:.3e} normalised ({da:.3e} action units)", file=sys.stderr)
    return 0 if (result["parity_ok"] is not False) else 1


def policy_observations(policy, n: int, seed: int) -> Dict[str, np.ndarray]:
    """Deterministic numpy observations for a flowedge whole policy: states standard normal, frames uint8 noise."""
    rng = np.random.default_rng(seed)
    obs = {policy.state_key: rng.standard_normal((n, policy.state_dim)).astype(np.float32)}
    if policy.env_key:
        obs[policy.env_key] = rng.standard_normal((n, policy.env_dim)).astype(np.float32)
    for key, (c, h, w) in policy.camera_shapes.items():
        obs[key] = rng.integers(0, 256, size=(n, h, w, c), dtype=np.uint8)
    return obs


def main_policy(args) -> int:
    """--backend flowedge-policy: reset() + select_action per step through flowedge.DiffusionPolicy or ActPolicy; no
    torch."""
    from . import policy_loop as pl

    t0 = time.perf_counter()
    policy = pl.load_whole_policy(args.policy_dir, device=args.device, dtype=args.dtype, steps=args.diffusion_steps,
                                  scheduler=args.scheduler, seed=args.seed, tool="replay",
                                  quantize=args.quantize)
    load_ms = (time.perf_counter() - t0) * 1e3
    noise = None
    if args.obs:
        with np.load(args.obs) as z:
            obs = {k: np.asarray(z[k]) for k in z.files}
        noise = obs.pop("noise", None)
        if noise is not None:
            noise = np.ascontiguousarray(noise, dtype=np.float32)
        obs_desc = f"file {args.obs}"
    else:
        obs = policy_observations(policy, args.steps if args.steps is not None else 20, args.seed)
        obs_desc = f"synthetic (seed {args.seed})" + ("" if isinstance(policy, pl.ActPolicy) else ", seeded noise")
    if args.steps is not None:
        obs = {k: v[:args.steps] for k, v in obs.items()}
    res = pl.replay(policy, obs, noise, args.warmup)
    actions = res.pop("actions")
    result: Dict[str, Any] = {
        "tool": "flowedge-lerobot-replay", "backend": "flowedge-policy", "policy": args.policy_dir,
        "device": args.device, "flowedge_backend": policy.backend, "cuda_resident": bool(policy.cuda_resident),
        "fallback_reason": policy.fallback_reason, **pl.sampler_fields(policy),
        "steps": int(actions.shape[0]), "warmup": args.warmup, "observations": obs_desc,
        "caller_noise": noise is not None, "load_ms": round(load_ms, 1), **res, "cpu": cpu_name(),
        "peak_rss_mib": peak_rss_mib(), "torch_imported": "torch" in sys.modules,
        "lerobot_imported": "lerobot" in sys.modules,
    }
    if args.actions_out:
        Path(args.actions_out).parent.mkdir(parents=True, exist_ok=True)
        np.save(args.actions_out, actions)
        result["actions_out"] = args.actions_out
    if args.reference_actions:
        ref = np.load(args.reference_actions)
        if ref.shape != actions.shape:
            raise SystemExit(f"flowedge: replay: --reference-actions shape (expected {list(actions.shape)}, got "
                             f"{list(ref.shape)})")
        result["max_abs_diff_actions"] = float(np.abs(ref - actions).max())
    text = json.dumps(result, indent=1)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text + "\n")
    else:
        print(text)
    print(f"replay (flowedge-policy on {policy.backend}): {result['steps']} steps, select_action p50 "
          f"{res['select_action_ms']['p50']} ms, chunk p50 {res['chunk_ms']['p50']} ms"
          + (f"; max abs diff vs reference {result['max_abs_diff_actions']:.3e}" if args.reference_actions else ""),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
