#!/usr/bin/env python3
"""Builds LeRobot Diffusion Policy checkpoints with LeRobot's own code and writes float32 reference outputs for them.

Default: a small no-camera policy committed under test/fixtures/dp_small (+ dp_small_ref/).
--pusht: the full PushT-shaped policy (ResNet18 + 251,511,938-parameter U-Net) under models/dp_pusht (never committed).

Everything runs on CPU in float32 with TF32 off. Initial noise enters through LeRobot's own `noise=` argument of
DiffusionModel.conditional_sample; DDPM per-step noise is replaced by tools/splitmix_noise.py draws by patching the
`randn_tensor` that diffusers' DDPMScheduler.step calls (the update math is untouched).
"""
import argparse
import copy
import json
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import splitmix_noise  # noqa: E402

import diffusers  # noqa: E402
import diffusers.schedulers.scheduling_ddpm as ddpm_mod  # noqa: E402
import lerobot  # noqa: E402
from lerobot.configs.types import FeatureType, PolicyFeature  # noqa: E402
from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig  # noqa: E402
from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy  # noqa: E402
from lerobot.policies.diffusion.processor_diffusion import make_diffusion_pre_post_processors  # noqa: E402

ACTION_MIN = [12.0, 25.0]
ACTION_MAX = [511.0, 497.0]
DDPM_SEED = 7
BATCH = 2


def lerobot_version() -> str:
    try:
        from importlib.metadata import version
        return version("lerobot")
    except Exception:  # pragma: no cover
        return getattr(lerobot, "__version__", "unknown")


def small_config() -> tuple[DiffusionConfig, dict]:
    cfg = DiffusionConfig(
        input_features={
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(2,)),
            "observation.environment_state": PolicyFeature(type=FeatureType.ENV, shape=(4,)),
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(2,))},
        n_obs_steps=2, horizon=16, n_action_steps=8,
        down_dims=(16, 32, 64), kernel_size=5, n_groups=8, diffusion_step_embed_dim=32,
        use_film_scale_modulation=True, noise_scheduler_type="DDPM", num_train_timesteps=100,
        beta_schedule="squaredcos_cap_v2", prediction_type="epsilon", clip_sample=True, clip_sample_range=1.0,
        device="cpu", push_to_hub=False,
    )
    stats = {
        "observation.state": {"min": torch.tensor([13.5, 32.0]), "max": torch.tensor([496.1, 510.9])},
        "observation.environment_state": {"min": torch.tensor([-1.0, -2.0, 0.0, 5.0]),
                                          "max": torch.tensor([1.0, 3.0, 6.2831855, 9.0])},
        "action": {"min": torch.tensor(ACTION_MIN), "max": torch.tensor(ACTION_MAX)},
    }
    return cfg, stats


def pusht_config() -> tuple[DiffusionConfig, dict]:
    cfg = DiffusionConfig(
        input_features={
            "observation.image": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 96, 96)),
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(2,)),
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(2,))},
        crop_shape=(84, 84), device="cpu", push_to_hub=False,
    )
    stats = {
        "observation.image": {"mean": torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1),
                              "std": torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)},
        "observation.state": {"min": torch.tensor([13.456, 32.938]), "max": torch.tensor([496.146, 510.958])},
        "action": {"min": torch.tensor(ACTION_MIN), "max": torch.tensor(ACTION_MAX)},
    }
    return cfg, stats


def perturb(policy: DiffusionPolicy, seed: int) -> None:
    """Make every parameter matter: GroupNorm gains ~ 1 + 0.25 N(0,1), all biases + 0.1 N(0,1) (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, mod in policy.named_modules():
            if isinstance(mod, torch.nn.GroupNorm) and mod.affine:
                mod.weight.add_(0.25 * torch.randn(mod.weight.shape, generator=gen))
                mod.bias.add_(0.1 * torch.randn(mod.bias.shape, generator=gen))
        for name, p in policy.named_parameters():
            if name.endswith(".bias") and "norm" not in name and ".block.1." not in name:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))


class SplitmixPatch:
    """Replaces diffusers' randn_tensor inside DDPMScheduler.step with the SplitMix64 draws of docs/models.md#seeded-noise."""

    def __init__(self, seed: int, batch: int, horizon: int, action_dim: int):
        self.seed, self.batch, self.horizon, self.action_dim = seed, batch, horizon, action_dim
        self.step = 0
        self.orig = None

    def __call__(self, shape, generator=None, device=None, dtype=None, layout=None):
        assert tuple(shape) == (self.batch, self.horizon, self.action_dim), shape
        z = splitmix_noise.step_noise(self.seed, self.batch, self.step, self.horizon, self.action_dim)
        self.step += 1
        return torch.from_numpy(z).to(device=device or "cpu", dtype=dtype or torch.float32)

    def __enter__(self):
        self.orig = ddpm_mod.randn_tensor
        ddpm_mod.randn_tensor = self
        return self

    def __exit__(self, *exc):
        ddpm_mod.randn_tensor = self.orig


def spec_sample(unet, noise, cond, kind: str, n_steps: int, T: int, clip: float, seed: int) -> torch.Tensor:
    """Independent re-derivation of the sampler from the formulas of docs/models.md#schedulers (only the U-Net is shared), used to check
    that docs/models.md and LeRobot/diffusers agree on these references."""
    def abar(tau):
        return math.cos((tau + 0.008) / 1.008 * math.pi / 2) ** 2
    betas = torch.tensor([min(1 - abar((i + 1) / T) / abar(i / T), 0.999) for i in range(T)],
                         dtype=torch.float64).to(torch.float32)
    ac = torch.cumprod(1.0 - betas, dim=0)
    ratio = T // n_steps
    x = noise.clone()
    b, h, a = x.shape
    k_noise = 0
    for i in range(n_steps):
        t = (n_steps - 1 - i) * ratio
        prev = t - ratio
        at = ac[t]
        ap = ac[prev] if prev >= 0 else torch.tensor(1.0)
        eps = unet(x, torch.full((b,), t, dtype=torch.long), global_cond=cond)
        x0 = ((x - torch.sqrt(1 - at) * eps) / torch.sqrt(at)).clamp(-clip, clip)
        if kind == "DDIM":
            x = torch.sqrt(ap) * x0 + torch.sqrt(1 - ap) * eps
        else:
            al = at / ap
            be = 1 - al
            x = (torch.sqrt(ap) * be / (1 - at)) * x0 + (torch.sqrt(al) * (1 - ap) / (1 - at)) * x
            if prev >= 0:
                z = torch.from_numpy(splitmix_noise.step_noise(seed, b, k_noise, h, a))
                k_noise += 1
                x = x + torch.sqrt(torch.clamp((1 - ap) / (1 - at) * be, min=1e-20)) * z
    return x


def with_scheduler(policy: DiffusionPolicy, kind: str, steps: int) -> DiffusionPolicy:
    """A second LeRobot policy whose config differs only in scheduler type / inference steps, same weights."""
    cfg = copy.deepcopy(policy.config)
    cfg.noise_scheduler_type = kind
    cfg.num_inference_steps = steps
    p = DiffusionPolicy(cfg)
    p.load_state_dict(policy.state_dict())
    p.eval()
    return p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pusht", action="store_true", help="build the full PushT-shaped policy (~1 GB, not committed)")
    ap.add_argument("--out", default=None, help="policy folder (default test/fixtures/dp_small or models/dp_pusht)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--policy-only", action="store_true",
                    help="save the policy folder (config, weights, processors) and skip the reference outputs")
    args = ap.parse_args()

    out = args.out or (os.path.join(REPO, "models", "dp_pusht") if args.pusht
                       else os.path.join(REPO, "test", "fixtures", "dp_small"))
    ref = out.rstrip("/") + "_ref"
    os.makedirs(out, exist_ok=True)
    if not args.policy_only:
        os.makedirs(ref, exist_ok=True)

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(args.threads or (2 if args.pusht else 1))
    torch.use_deterministic_algorithms(True)

    cfg, stats = pusht_config() if args.pusht else small_config()
    torch.manual_seed(args.seed)
    policy = DiffusionPolicy(cfg)
    perturb(policy, args.seed + 1)
    policy.eval()
    unet = policy.diffusion.unet
    n_unet = sum(p.numel() for p in unet.parameters())
    n_all = sum(p.numel() for p in policy.parameters())
    print(f"U-Net parameters: {n_unet:,} (policy total {n_all:,})")
    if args.pusht and n_unet != 251_511_938:
        raise SystemExit(f"PushT U-Net parameter count {n_unet} != 251511938")

    # LeRobot's own save path: config.json + model.safetensors, then the processor pipelines.
    policy.save_pretrained(out)
    pre, post = make_diffusion_pre_post_processors(cfg, dataset_stats=stats)
    pre.save_pretrained(out)
    post.save_pretrained(out)
    if args.policy_only:
        print(f"policy saved to {out} (--policy-only: no references)")
        return 0

    H, A = cfg.horizon, cfg.action_feature.shape[0]
    gcd = policy.diffusion.unet.down_modules[0][0].cond_encoder[1].in_features - cfg.diffusion_step_embed_dim
    gen = torch.Generator().manual_seed(args.seed + 2)
    cond = torch.randn(BATCH, gcd, generator=gen)
    noise = torch.randn(BATCH, H, A, generator=gen)

    files = {}

    def save(name: str, t: torch.Tensor | np.ndarray, what: str) -> None:
        a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t
        a = np.ascontiguousarray(a, dtype=np.float32)
        np.save(os.path.join(ref, name + ".npy"), a)
        files[name + ".npy"] = {"shape": list(a.shape), "what": what}

    save("cond", cond, "global condition [B, global_cond_dim] (random)")
    save("noise", noise, "initial noise x_T [B, horizon, A] (random)")

    with torch.no_grad():
        for t in (99, 50, 0):
            eps = unet(noise, torch.full((BATCH,), t, dtype=torch.long), global_cond=cond)
            save(f"eps_t{t}", eps, f"policy.diffusion.unet(noise, t={t}, global_cond=cond) [B, horizon, A]")

        amin, amax = stats["action"]["min"], stats["action"]["max"]

        def unnormalize(x: torch.Tensor) -> torch.Tensor:
            y = post(x.clone())
            manual = (x + 1.0) / 2.0 * (amax - amin) + amin
            assert torch.allclose(y, manual, rtol=0, atol=1e-4), (y - manual).abs().max()
            return y

        spec_check = {}
        runs = [("ddim10", "DDIM", 10), ("ddpm100", "DDPM", 100), ("ddpm10", "DDPM", 10)]
        for tag, kind, steps in runs:
            p = with_scheduler(policy, kind, steps)
            if kind == "DDPM":
                with SplitmixPatch(DDPM_SEED, BATCH, H, A) as patch:
                    x = p.diffusion.conditional_sample(BATCH, global_cond=cond, noise=noise.clone())
                assert patch.step == steps - 1, (patch.step, steps)
                what = f"{steps}-step DDPM, SplitMix64 seed {DDPM_SEED} step noise, normalized [B, horizon, A]"
            else:
                x = p.diffusion.conditional_sample(BATCH, global_cond=cond, noise=noise.clone())
                what = f"{steps}-step DDIM (eta 0), normalized [B, horizon, A]"
            x_spec = spec_sample(unet, noise, cond, kind, steps, cfg.num_train_timesteps, cfg.clip_sample_range,
                                 DDPM_SEED)
            spec_check[tag] = float((x_spec - x).abs().max())
            print(f"{tag}: LeRobot vs docs-formula sampler max abs {spec_check[tag]:.3e}")
            assert spec_check[tag] < 1e-4, spec_check
            save(f"{tag}_norm", x, what)
            save(f"{tag}_action", unnormalize(x), what.replace("normalized", "un-normalized MIN_MAX"))

        # End to end through LeRobot's observation path (small, camera-free config only): raw observations ->
        # preprocessor (MIN_MAX state) -> generate_actions (condition layout + executed slice) -> postprocessor.
        if not args.pusht:
            n_obs = cfg.n_obs_steps
            obs = {
                "observation.state": stats["observation.state"]["min"] + torch.rand(BATCH, n_obs, 2, generator=gen)
                * (stats["observation.state"]["max"] - stats["observation.state"]["min"]),
                "observation.environment_state": torch.randn(BATCH, n_obs, 4, generator=gen),
            }
            batch = pre(dict(obs))
            p = with_scheduler(policy, "DDIM", 10)
            obs_cond = p.diffusion._prepare_global_conditioning(batch)
            executed = p.diffusion.generate_actions(batch, noise=noise.clone())
            save("obs_state", obs["observation.state"], "raw observation.state [B, n_obs_steps, 2], oldest first")
            save("obs_env", obs["observation.environment_state"],
                 "raw observation.environment_state [B, n_obs_steps, 4], oldest first")
            save("obs_cond", obs_cond, "global condition LeRobot builds from obs_* [B, gcd]")
            save("obs_ddim10_executed_norm", executed, "10-step DDIM executed rows, normalized [B, n_action_steps, A]")
            save("obs_ddim10_executed_action", unnormalize(executed),
                 "10-step DDIM executed rows, un-normalized [B, n_action_steps, A]")

    doc = {
        "about": "LeRobot DiffusionPolicy references made by tools/make_reference_diffusion.py (CPU, float32, TF32 off)",
        "policy_dir": os.path.relpath(out, REPO),
        "versions": {"lerobot": lerobot_version(), "torch": torch.__version__, "diffusers": diffusers.__version__,
                     "numpy": np.__version__},
        "seeds": {"torch_manual_seed_init": args.seed, "perturb": args.seed + 1, "cond_noise_generator": args.seed + 2,
                  "ddpm_splitmix": DDPM_SEED},
        "batch": BATCH,
        "unet_parameters": n_unet,
        "global_cond_dim": gcd,
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in {
            "horizon": H, "action_dim": A, "n_obs_steps": cfg.n_obs_steps, "n_action_steps": cfg.n_action_steps,
            "down_dims": cfg.down_dims, "kernel_size": cfg.kernel_size, "n_groups": cfg.n_groups,
            "diffusion_step_embed_dim": cfg.diffusion_step_embed_dim,
            "use_film_scale_modulation": cfg.use_film_scale_modulation, "num_train_timesteps": cfg.num_train_timesteps,
            "beta_schedule": cfg.beta_schedule, "prediction_type": cfg.prediction_type,
            "clip_sample": cfg.clip_sample, "clip_sample_range": cfg.clip_sample_range}.items()},
        "action_min": [float(v) for v in stats["action"]["min"]],
        "action_max": [float(v) for v in stats["action"]["max"]],
        "executed_rows": {"start": cfg.n_obs_steps - 1, "stop": cfg.n_obs_steps - 1 + cfg.n_action_steps,
                          "note": "LeRobot executes sample[:, start:stop] of the horizon"},
        "noise_injection": {
            "initial": "DiffusionModel.conditional_sample(noise=...) (LeRobot's own argument)",
            "ddpm_steps": "diffusers.schedulers.scheduling_ddpm.randn_tensor patched; called only when t > 0, "
                          "step k uses splitmix normals [k*H*A, (k+1)*H*A) per batch element b with seed+b"},
        "spec_formula_sampler_max_abs_diff": spec_check,
        "files": files,
    }
    with open(os.path.join(ref, "refs.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote", out, "and", ref, f"({len(files)} arrays)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
