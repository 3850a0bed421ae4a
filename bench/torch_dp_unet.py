#!/usr/bin/env python3
"""Our own PyTorch Diffusion Policy head (LeRobot's conditional 1-D U-Net + DDIM/DDPM, docs/models.md#diffusion-policy-u-net and #schedulers): the PyTorch side of
the GPU benchmark on machines without lerobot/diffusers, with LeRobot's exact state_dict names.

Module contents:
  DpConfig                  U-Net + scheduler settings (flowedge DiffusionConfig fields); config_from_compact(path) reads
                            them from a *.flowedge.safetensors file (dp.meta / dp.dims, docs/formats.md#dp-meta).
  ConditionalUnet1d         == lerobot DiffusionConditionalUnet1d: forward(x [B, H, A], timestep [B], global_cond [B, G])
                            -> epsilon [B, H, A]; parameter names equal LeRobot's keys without "diffusion.unet.".
  Sampler                   DDIM (eta 0) / DDPM loop with per-step coefficients precomputed in float32 exactly as
                            include/flowedge/models/diffusion/schedulers.hpp (and diffusers as LeRobot configures it) does, and
                            timestep tensors allocated up front: no host sync inside, so the whole loop can be captured
                            in one torch.cuda.CUDAGraph.
  load_compact_weights      fills a ConditionalUnet1d from a compact file (names mapped with flowedge.diffusion_compact_name).

Run as a script: `torch_dp_unet.py --check-against-lerobot` builds LeRobot's U-Net and ours with the same random
weights (small configs and the PushT shape) and prints max |diff| of the U-Net output, a 10-step DDIM sample through
LeRobot's DiffusionModel.conditional_sample with its diffusers DDIMScheduler, and a seeded 10-step DDPM sample (the
diffusers noise draws replaced by our SplitMix64 noise). Exit 0 when every diff is within the bounds of docs/numerics.md#whole-head-tolerances, 1 otherwise.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

# ----------------------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------------------


@dataclass
class DpConfig:
    """flowedge DiffusionConfig / LeRobot DiffusionConfig fields that define the U-Net and the sampler (PushT defaults)."""

    action_dim: int = 2
    horizon: int = 16
    global_cond_dim: int = 132
    down_dims: list[int] = field(default_factory=lambda: [512, 1024, 2048])
    kernel_size: int = 5
    n_groups: int = 8
    step_embed_dim: int = 128
    film_scale_modulation: bool = True
    num_train_timesteps: int = 100
    clip_sample: bool = True
    clip_sample_range: float = 1.0

    @classmethod
    def from_dict(cls, d: dict) -> "DpConfig":
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"torch_dp_unet: unknown config keys {sorted(unknown)} (expected a subset of {sorted(known)})")
        c = cls(**d)
        c.down_dims = [int(x) for x in c.down_dims]
        return c


META_FIELDS = ("schema", "action_dim", "horizon", "n_action_steps", "n_obs_steps", "global_cond_dim", "stages",
               "kernel_size", "n_groups", "step_embed_dim", "num_train_timesteps", "beta_code", "prediction_code",
               "clip_sample", "clip_sample_range", "action_norm_code")


def config_from_compact(path: str) -> DpConfig:
    """Reads dp.meta (F32[16], docs/formats.md#dp-meta order) and dp.dims of a *.flowedge.safetensors file."""
    from safetensors import safe_open

    with safe_open(path, framework="numpy") as f:
        keys = set(f.keys())
        for k in ("dp.meta", "dp.dims"):
            if k not in keys:
                raise ValueError(f"torch_dp_unet: {path}: missing tensor '{k}' (not a compact flowedge diffusion file)")
        meta = np.asarray(f.get_tensor("dp.meta"), dtype=np.float64)
        dims = np.asarray(f.get_tensor("dp.dims"), dtype=np.float64)
    if meta.shape != (16,):
        raise ValueError(f"torch_dp_unet: {path}: dp.meta has shape {meta.shape} (expected (16,))")
    m = dict(zip(META_FIELDS, meta.tolist()))
    if int(m["schema"]) != 1:
        raise ValueError(f"torch_dp_unet: {path}: dp.meta schema {m['schema']} (expected 1)")
    if int(m["beta_code"]) != 0 or int(m["prediction_code"]) != 0 or int(m["action_norm_code"]) != 0:
        raise ValueError(f"torch_dp_unet: {path}: only squaredcos_cap_v2 / epsilon / MIN_MAX are supported (meta {meta})")
    if len(dims) != int(m["stages"]):
        raise ValueError(f"torch_dp_unet: {path}: dp.dims has {len(dims)} entries but dp.meta says {int(m['stages'])} stages")
    return DpConfig(action_dim=int(m["action_dim"]), horizon=int(m["horizon"]), global_cond_dim=int(m["global_cond_dim"]),
                    down_dims=[int(d) for d in dims], kernel_size=int(m["kernel_size"]), n_groups=int(m["n_groups"]),
                    step_embed_dim=int(m["step_embed_dim"]), film_scale_modulation=True,
                    num_train_timesteps=int(m["num_train_timesteps"]), clip_sample=bool(int(m["clip_sample"])),
                    clip_sample_range=float(np.float32(m["clip_sample_range"])))


# ----------------------------------------------------------------------------------------------------------------------
# U-Net (docs/models.md#diffusion-policy-u-net); submodule indices chosen so that state_dict keys equal LeRobot's
# ----------------------------------------------------------------------------------------------------------------------


class StepEmbedding(nn.Module):
    """Sinusoidal timestep features: f_i = exp(-i ln(10000)/(half-1)), e = [sin(t f) | cos(t f)]; t [B] -> [B, dim]."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        freqs = torch.exp(torch.arange(half, device=t.device) * -(math.log(10000) / (half - 1)))
        arg = t.unsqueeze(-1) * freqs.unsqueeze(0)
        return torch.cat((arg.sin(), arg.cos()), dim=-1)


class ConvBlock(nn.Module):
    """Conv1d(k, pad k//2) -> GroupNorm(groups, eps 1e-5) -> Mish, on [B, C, L] (LeRobot DiffusionConv1dBlock)."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, n_groups: int):
        super().__init__()
        self.block = nn.Sequential(nn.Conv1d(c_in, c_out, kernel_size, padding=kernel_size // 2),
                                   nn.GroupNorm(n_groups, c_out), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class ResBlock(nn.Module):
    """FiLM residual block (LeRobot DiffusionConditionalResidualBlock1d): x [B, c_in, L], g [B, cond] -> [B, c_out, L]."""

    def __init__(self, c_in: int, c_out: int, cond_dim: int, kernel_size: int, n_groups: int, film_scale: bool):
        super().__init__()
        self.c_out = c_out
        self.film_scale = film_scale
        self.conv1 = ConvBlock(c_in, c_out, kernel_size, n_groups)
        self.cond_encoder = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * c_out if film_scale else c_out))
        self.conv2 = ConvBlock(c_out, c_out, kernel_size, n_groups)
        self.residual_conv = nn.Conv1d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        a = self.conv1(x)
        film = self.cond_encoder(g).unsqueeze(-1)
        if self.film_scale:
            a = film[:, : self.c_out] * a + film[:, self.c_out:]  # plain scale (not 1 + scale)
        else:
            a = a + film
        return self.conv2(a) + self.residual_conv(x)


class ConditionalUnet1d(nn.Module):
    """LeRobot DiffusionConditionalUnet1d: x [B, horizon, A], timestep [B] (any numeric dtype), global_cond [B, G]
    -> epsilon [B, horizon, A]. Works channel-major [B, C, L] inside."""

    def __init__(self, cfg: DpConfig):
        super().__init__()
        self.cfg = cfg
        td = cfg.step_embed_dim
        self.diffusion_step_encoder = nn.Sequential(StepEmbedding(td), nn.Linear(td, 4 * td), nn.Mish(), nn.Linear(4 * td, td))
        cond = td + cfg.global_cond_dim
        kw = dict(cond_dim=cond, kernel_size=cfg.kernel_size, n_groups=cfg.n_groups, film_scale=cfg.film_scale_modulation)
        widths = [cfg.action_dim] + list(cfg.down_dims)
        pairs = list(zip(widths[:-1], widths[1:]))  # (in, out) per down stage
        self.down_modules = nn.ModuleList()
        for s, (ci, co) in enumerate(pairs):
            last = s == len(pairs) - 1
            self.down_modules.append(nn.ModuleList([
                ResBlock(ci, co, **kw), ResBlock(co, co, **kw),
                nn.Identity() if last else nn.Conv1d(co, co, 3, 2, 1)]))
        wide = cfg.down_dims[-1]
        self.mid_modules = nn.ModuleList([ResBlock(wide, wide, **kw), ResBlock(wide, wide, **kw)])
        self.up_modules = nn.ModuleList()
        # Deepest first; one up stage per down stage except the first (the full-resolution skip is never used).
        for lo, hi in reversed(pairs[1:]):
            self.up_modules.append(nn.ModuleList([
                ResBlock(2 * hi, lo, **kw), ResBlock(lo, lo, **kw), nn.ConvTranspose1d(lo, lo, 4, 2, 1)]))
        d0 = cfg.down_dims[0]
        # The final conv block uses 8 groups whatever n_groups is (LeRobot's default argument).
        self.final_conv = nn.Sequential(ConvBlock(d0, d0, cfg.kernel_size, 8), nn.Conv1d(d0, cfg.action_dim, 1))

    def forward(self, x: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)
        g = torch.cat([self.diffusion_step_encoder(timestep), global_cond], dim=-1)
        skips = []
        for r0, r1, down in self.down_modules:
            x = r1(r0(x, g), g)
            skips.append(x)
            x = down(x)
        for r in self.mid_modules:
            x = r(x, g)
        for r0, r1, up in self.up_modules:
            x = torch.cat((x, skips.pop()), dim=1)
            x = up(r1(r0(x, g), g))
        return self.final_conv(x).transpose(1, 2)


# ----------------------------------------------------------------------------------------------------------------------
# Schedulers (docs/models.md#schedulers)
# ----------------------------------------------------------------------------------------------------------------------


def alphas_cumprod(num_train_timesteps: int) -> np.ndarray:
    """squaredcos_cap_v2: betas in double stored as float32, then the float32 running product of (1 - beta)."""
    T = num_train_timesteps

    def abar(tau: float) -> float:
        return math.cos((tau + 0.008) / 1.008 * math.pi / 2) ** 2

    betas = np.array([min(1 - abar((i + 1) / T) / abar(i / T), 0.999) for i in range(T)], dtype=np.float64).astype(np.float32)
    out = np.empty(T, dtype=np.float32)
    prod = np.float32(1.0)
    for i in range(T):
        prod = np.float32(prod * (np.float32(1.0) - betas[i]))
        out[i] = prod
    return out


@dataclass
class Step:
    """Scalar coefficients of one denoising step, each a float32 value (held as a Python float, exactly)."""

    t: int
    sqrt_abar: float
    sqrt_one_minus_abar: float
    c_x0: float
    c_other: float  # DDIM: multiplies eps; DDPM: multiplies x
    noise_std: float  # DDPM only; 0 when no noise is added


def plan_steps(kind: str, n_steps: int, num_train_timesteps: int) -> list[Step]:
    """Per-step coefficients for n_steps of "ddim" or "ddpm" ("leading" spacing), in float32, in the order diffusers
    (and flowedge's NoiseSchedule::step_coefficients) evaluates them."""
    kind = kind.lower()
    if kind not in ("ddim", "ddpm"):
        raise ValueError(f"torch_dp_unet: unknown scheduler '{kind}' (expected ddim or ddpm)")
    T = num_train_timesteps
    if not 1 <= n_steps <= T:
        raise ValueError(f"torch_dp_unet: steps must be in [1, {T}] (got {n_steps})")
    ac = alphas_cumprod(T)
    f32, one = np.float32, np.float32(1.0)
    ratio = T // n_steps
    plan = []
    for i in range(n_steps):
        t = (n_steps - 1 - i) * ratio
        prev = t - ratio
        a_t = ac[t]
        a_prev = ac[prev] if prev >= 0 else one
        beta_t = f32(one - a_t)
        sa, s1 = f32(np.sqrt(a_t)), f32(np.sqrt(beta_t))
        if kind == "ddim":
            plan.append(Step(t, float(sa), float(s1), float(f32(np.sqrt(a_prev))), float(f32(np.sqrt(f32(one - a_prev)))), 0.0))
            continue
        beta_prev = f32(one - a_prev)
        cur_alpha = f32(a_t / a_prev)
        cur_beta = f32(one - cur_alpha)
        c_x0 = f32(f32(np.sqrt(a_prev) * cur_beta) / beta_t)
        c_x = f32(f32(np.sqrt(cur_alpha) * beta_prev) / beta_t)
        std = 0.0
        if prev >= 0:
            var = max(f32(f32(f32(one - a_prev) / f32(one - a_t)) * cur_beta), f32(1e-20))
            std = float(f32(np.sqrt(f32(var))))
        plan.append(Step(t, float(sa), float(s1), float(c_x0), float(c_x), std))
    return plan


class Sampler:
    """N-step DDIM / DDPM sampling of a ConditionalUnet1d for a fixed batch on one device.

    All per-step values are prepared here (timestep tensors, float32 coefficients), so `run` launches kernels only:
    no allocation of host data, no host<->device copy, no sync; it can be captured in a CUDA graph as it is.
    """

    def __init__(self, unet: ConditionalUnet1d, kind: str, n_steps: int, batch: int, device, timestep_dtype=torch.long):
        self.unet = unet
        self.kind = kind.lower()
        self.plan = plan_steps(self.kind, n_steps, unet.cfg.num_train_timesteps)
        self.clip = unet.cfg.clip_sample
        self.clip_range = float(np.float32(unet.cfg.clip_sample_range))
        # LeRobot passes torch.full((B,), t, dtype=long); the embedding promotes it to float32.
        self.timesteps = [torch.full((batch,), s.t, dtype=timestep_dtype, device=device) for s in self.plan]
        self.n_noisy = sum(1 for s in self.plan if s.noise_std > 0.0)

    def run(self, cond: torch.Tensor, noise: torch.Tensor, ddpm_noise: torch.Tensor | None = None) -> torch.Tensor:
        """cond [B, G], noise [B, H, A] (x at the first step), ddpm_noise [n_noisy, B, H, A] (DDPM only: the z of
        each noise-adding step, in order) -> normalised actions [B, H, A]."""
        if self.kind == "ddpm" and self.n_noisy and (ddpm_noise is None or ddpm_noise.shape[0] < self.n_noisy):
            raise ValueError(f"torch_dp_unet: DDPM needs ddpm_noise [{self.n_noisy}, B, H, A]")
        x = noise
        k = 0
        for s, t in zip(self.plan, self.timesteps):
            eps = self.unet(x, t, cond)
            x0 = (x - s.sqrt_one_minus_abar * eps) / s.sqrt_abar
            if self.clip:
                x0 = x0.clamp(-self.clip_range, self.clip_range)
            if self.kind == "ddim":
                x = s.c_x0 * x0 + s.c_other * eps
            else:
                x = s.c_x0 * x0 + s.c_other * x
                if s.noise_std > 0.0:
                    x = x + s.noise_std * ddpm_noise[k]
                    k += 1
        return x


def splitmix_ddpm_noise(seed: int, batch: int, n_noisy: int, horizon: int, action_dim: int) -> np.ndarray:
    """Seeded DDPM noise (docs/models.md#seeded-noise) as float32 [n_noisy, B, H, A] (tools/splitmix_noise.py), row b seeded with seed + b."""
    import os

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    import splitmix_noise

    return np.stack([splitmix_noise.step_noise(seed, batch, k, horizon, action_dim) for k in range(n_noisy)])


# ----------------------------------------------------------------------------------------------------------------------
# Weights from a compact flowedge file
# ----------------------------------------------------------------------------------------------------------------------

COMPACT_NON_UNET = ("dp.meta", "dp.dims", "dp.action_min", "dp.action_max")


def load_compact_weights(unet: ConditionalUnet1d, path: str, compact_name=None) -> dict:
    """Loads every U-Net parameter from a *.flowedge.safetensors file into `unet` (strict). compact_name maps a
    LeRobot U-Net key to its compact name (default: flowedge.diffusion_compact_name). Every dp.* U-Net tensor of the
    file must be used. Returns {"action_min", "action_max"} (float32 numpy)."""
    from safetensors import safe_open

    if compact_name is None:
        import flowedge

        compact_name = flowedge.diffusion_compact_name
    state = {}
    with safe_open(path, framework="pt") as f:
        keys = set(f.keys())
        for name in unet.state_dict().keys():
            cname = compact_name(name)
            if cname not in keys:
                raise ValueError(f"torch_dp_unet: {path}: missing tensor '{cname}' (for U-Net parameter '{name}')")
            state[name] = f.get_tensor(cname).to(torch.float32)
            keys.discard(cname)
        extra = sorted(k for k in keys if k.startswith("dp.") and k not in COMPACT_NON_UNET)
        if extra:
            raise ValueError(f"torch_dp_unet: {path}: tensors not used by the U-Net: {extra[:5]}")
        rng = {k: f.get_tensor(k).to(torch.float32).numpy() for k in ("dp.action_min", "dp.action_max")}
    unet.load_state_dict(state, strict=True)
    return {"action_min": rng["dp.action_min"], "action_max": rng["dp.action_max"]}


# ----------------------------------------------------------------------------------------------------------------------
# --check-against-lerobot
# ----------------------------------------------------------------------------------------------------------------------


def _lerobot_unet(cfg: DpConfig):
    """LeRobot's DiffusionConditionalUnet1d for cfg (it only reads these config attributes)."""
    from types import SimpleNamespace

    from lerobot.policies.diffusion.modeling_diffusion import DiffusionConditionalUnet1d

    lc = SimpleNamespace(action_feature=SimpleNamespace(shape=(cfg.action_dim,)), down_dims=tuple(cfg.down_dims),
                         kernel_size=cfg.kernel_size, n_groups=cfg.n_groups, diffusion_step_embed_dim=cfg.step_embed_dim,
                         use_film_scale_modulation=cfg.film_scale_modulation)
    return DiffusionConditionalUnet1d(lc, global_cond_dim=cfg.global_cond_dim)


def _lerobot_sample(unet, cfg: DpConfig, kind: str, n_steps: int, cond, noise, ddpm_noise=None):
    """LeRobot's DiffusionModel.conditional_sample (its code, on a stand-in holding the U-Net and the scheduler LeRobot
    builds); for DDPM the diffusers noise draws are replaced, in order, by ddpm_noise."""
    from types import SimpleNamespace

    import diffusers.schedulers.scheduling_ddpm as ddpm_mod
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionModel, _make_noise_scheduler

    d = DiffusionConfig  # class defaults (beta_start/end are unused by squaredcos_cap_v2)
    sched = _make_noise_scheduler(kind.upper(), num_train_timesteps=cfg.num_train_timesteps, beta_start=d.beta_start,
                                  beta_end=d.beta_end, beta_schedule="squaredcos_cap_v2", clip_sample=cfg.clip_sample,
                                  clip_sample_range=cfg.clip_sample_range, prediction_type="epsilon")

    class Stand(nn.Module):
        def __init__(self):
            super().__init__()
            self.unet = unet
            self.noise_scheduler = sched
            self.num_inference_steps = n_steps
            self.config = SimpleNamespace(horizon=cfg.horizon, action_feature=SimpleNamespace(shape=(cfg.action_dim,)))

    stand = Stand()
    orig = ddpm_mod.randn_tensor
    draws = iter(ddpm_noise) if ddpm_noise is not None else None
    if draws is not None:
        ddpm_mod.randn_tensor = lambda shape, **kw: next(draws).reshape(shape).clone()
    try:
        with torch.no_grad():
            return DiffusionModel.conditional_sample(stand, noise.shape[0], global_cond=cond, noise=noise.clone())
    finally:
        ddpm_mod.randn_tensor = orig


def _randomise(module: nn.Module, seed: int) -> None:
    """Deterministic random weights, with GroupNorm affine parameters away from their 1/0 defaults."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if isinstance(_owner(module, name), nn.GroupNorm):
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.2 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel() if p.dim() > 1 else max(1, p.numel())
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))


def _owner(module: nn.Module, param_name: str) -> nn.Module:
    return module.get_submodule(param_name.rsplit(".", 1)[0])


def check_against_lerobot(configs: list[tuple[str, DpConfig]], batch: int, steps: int) -> int:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # Whole-head bounds (docs/numerics.md#whole-head-tolerances) (max abs, normalised units) for a PyTorch float32 re-implementation vs LeRobot float32.
    bounds = {"unet_eps": 3e-4, "ddim": 6e-4, "ddpm": 8e-4}
    worst_ok = True
    print(f"torch {torch.__version__}; CPU float32; batch {batch}; {steps} sampling steps")
    for label, cfg in configs:
        ref = _lerobot_unet(cfg).eval()
        _randomise(ref, seed=1234)
        ours = ConditionalUnet1d(cfg).eval()
        ref_keys, our_keys = set(ref.state_dict()), set(ours.state_dict())
        if ref_keys != our_keys:
            print(f"[{label}] state_dict keys differ: only LeRobot {sorted(ref_keys - our_keys)[:5]}, "
                  f"only ours {sorted(our_keys - ref_keys)[:5]}")
            return 1
        ours.load_state_dict(ref.state_dict(), strict=True)
        n_params = sum(p.numel() for p in ours.parameters())
        g = torch.Generator().manual_seed(7)
        cond = torch.randn(batch, cfg.global_cond_dim, generator=g)
        noise = torch.randn(batch, cfg.horizon, cfg.action_dim, generator=g)
        res = {}
        with torch.no_grad():
            for t in (0, 37, 99):
                ts = torch.full((batch,), t, dtype=torch.long)
                d = (ref(noise, ts, global_cond=cond) - ours(noise, ts, cond)).abs().max().item()
                res["unet_eps"] = max(res.get("unet_eps", 0.0), d)
            a = _lerobot_sample(ref, cfg, "ddim", steps, cond, noise)
            b = Sampler(ours, "ddim", steps, batch, "cpu").run(cond, noise)
            res["ddim"] = (a - b).abs().max().item()
            sampler = Sampler(ours, "ddpm", steps, batch, "cpu")
            z = torch.from_numpy(splitmix_ddpm_noise(42, batch, sampler.n_noisy, cfg.horizon, cfg.action_dim))
            a = _lerobot_sample(ref, cfg, "ddpm", steps, cond, noise, ddpm_noise=z)
            b = sampler.run(cond, noise, ddpm_noise=z)
            res["ddpm"] = (a - b).abs().max().item()
            res["ddim_range"] = float(b.abs().max().item())
        ok = all(res[k] <= bounds[k] for k in bounds)
        worst_ok &= ok
        print(f"[{label}] {n_params:,} params; max|diff| U-Net eps {res['unet_eps']:.3g}, DDIM{steps} {res['ddim']:.3g}, "
              f"DDPM{steps} (seeded) {res['ddpm']:.3g}  -> {'OK' if ok else 'FAIL'} (bounds {bounds})")
    return 0 if worst_ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check-against-lerobot", action="store_true", help="compare with LeRobot's U-Net + diffusers")
    ap.add_argument("--no-pusht", action="store_true", help="skip the PushT-shape (251.5M-parameter) configuration")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    if not args.check_against_lerobot:
        ap.print_help()
        return 2
    try:
        import lerobot  # noqa: F401
        import diffusers  # noqa: F401
    except ImportError as e:
        print(f"skipped: lerobot/diffusers not importable ({e})")
        return 77
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    configs = [
        ("small 3 stages", DpConfig(action_dim=2, horizon=16, global_cond_dim=10, down_dims=[32, 64, 128], kernel_size=5,
                                    n_groups=8, step_embed_dim=16)),
        ("small 2 stages, k3, 4 groups, bias-only FiLM", DpConfig(action_dim=3, horizon=8, global_cond_dim=6,
                                                                  down_dims=[16, 48], kernel_size=3, n_groups=4,
                                                                  step_embed_dim=8, film_scale_modulation=False)),
    ]
    if not args.no_pusht:
        configs.append(("PushT shape", DpConfig()))
    return check_against_lerobot(configs, args.batch, args.steps)


if __name__ == "__main__":
    sys.exit(main())
