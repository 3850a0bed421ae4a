"""flowedge.lerobot: a drop-in LeRobot DiffusionPolicy whose U-Net + scheduler run on flowedge (LeRobot keeps the rest).

LeRobot 0.4.4 splits a Diffusion Policy into PyTorch pieces: the pre/post-processor pipelines (normalisation),
``DiffusionPolicy.select_action`` (observation and action queues), ``DiffusionModel._prepare_global_conditioning``
(RGB encoder + state concatenation) and ``DiffusionModel.conditional_sample`` (the iterative U-Net denoising loop).
This module replaces only the last one, per policy instance, with a call into a ``flowedge.DiffusionHead`` loaded
from the same pretrained folder. Everything else -- queues, the ``n_obs_steps - 1`` executed-row slice, the
encoder, normalisation -- stays LeRobot's own code, so ``select_action`` keeps its semantics.

Noise contract: the initial noise ``x_T`` is drawn exactly as LeRobot draws it (``torch.randn`` of shape
``[B, horizon, action_dim]`` with the policy's dtype/device and the caller's generator, i.e. the global torch RNG
inside ``select_action``) and handed to flowedge. With DDIM (eta 0) the sampler consumes no other randomness, so
``torch.manual_seed(s)`` + the same observations give LeRobot's actions within docs/numerics.md#whole-head-tolerances (10-step DDIM:
6e-4 max abs in normalised units). DDPM adds fresh noise at every step: LeRobot draws it from torch, flowedge
from its own seeded SplitMix64 stream (docs/models.md#seeded-noise), so DDPM runs match LeRobot only when LeRobot's per-step noise
is replaced by the same SplitMix64 draws (tools/make_reference_diffusion.py does that); the initial noise is
still LeRobot's.

Typical use::

    from flowedge.lerobot import FlowEdgeDiffusionPolicy, load_processors
    policy = FlowEdgeDiffusionPolicy.from_pretrained("outputs/pretrained_model", flowedge_device="cpu")
    pre, post = load_processors("outputs/pretrained_model")
    action = post(policy.select_action(pre(observation)))
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ._deps import missing_lerobot_message

try:
    import torch
    from lerobot.policies.diffusion import modeling_diffusion as _lr_diffusion
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
except ImportError as _e:  # exercised by test_lerobot_tools.py in a subprocess that hides torch
    raise ImportError(missing_lerobot_message("lerobot", _e)) from _e

from . import DiffusionHead, FlowEdgeError, FlowEdgeValueError, policy_type

__all__ = [
    "FlowEdgeDiffusionPolicy",
    "FlowEdgeSampler",
    "SCHEDULERS",
    "is_wrapped",
    "load_lerobot_policy",
    "load_processors",
    "set_lerobot_scheduler",
    "unwrap",
    "wrap",
]

#: Scheduler names accepted by :func:`wrap` and :func:`set_lerobot_scheduler`.
SCHEDULERS = ("ddim", "ddpm")

# docs/numerics.md#whole-head-tolerances: one U-Net call vs PyTorch float32, max abs (normalised units). Reduced-precision weights get a
# loose bound that still catches a wrong checkpoint (a mismatched folder gives O(1) differences).
_VERIFY_ATOL_F32 = 3e-4
_VERIFY_ATOL_LOWP = 5e-2


#: What an ACT policy given to the Diffusion Policy wrapper is told: the sampler swap has no ACT counterpart.
_ACT_ADVICE = ("; an ACT policy runs whole in flowedge.ActPolicy / flowedge.load_policy(folder), and in the replay and "
               "rollout tools with --backend flowedge-policy")


def _err(what: str) -> FlowEdgeValueError:
    return FlowEdgeValueError(f"flowedge: lerobot: {what}")


def _check_scheduler(scheduler: str) -> str:
    s = str(scheduler).lower()
    if s not in SCHEDULERS:
        raise _err(f"unknown scheduler (expected one of {SCHEDULERS}, got {scheduler!r})")
    return s


def _config_steps(config: Any) -> int:
    """LeRobot's own rule: ``num_inference_steps`` from the config, else ``num_train_timesteps``."""
    n = getattr(config, "num_inference_steps", None)
    return int(n) if n is not None else int(config.num_train_timesteps)


def _global_cond_dim(policy: "DiffusionPolicy") -> int:
    """Width of the condition the policy's U-Net consumes ([B, global_cond_dim]); read from the FiLM encoder."""
    unet = policy.diffusion.unet
    film = unet.down_modules[0][0].cond_encoder[1]
    return int(film.in_features) - int(policy.config.diffusion_step_embed_dim)


def _sync(device: "torch.device") -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class FlowEdgeSampler:
    """Stands in for ``DiffusionModel.conditional_sample(batch_size, global_cond, generator, noise)``.

    global_cond: torch ``[B, global_cond_dim]`` (LeRobot's layout: per observation step, oldest first,
    ``[state | image features | env state]``); noise: optional torch ``[B, horizon, action_dim]``.
    Returns the denoised sample, normalised units, torch ``[B, horizon, action_dim]`` on the policy's device
    and dtype -- the same thing LeRobot's loop returns.
    """

    def __init__(self, head: DiffusionHead, policy: "DiffusionPolicy", scheduler: str, steps: int,
                 ddpm_seed: Optional[int]):
        self.head = head
        self.scheduler = _check_scheduler(scheduler)
        if not 1 <= int(steps) <= head.num_train_timesteps:
            raise _err(f"diffusion steps out of range (expected 1..{head.num_train_timesteps}, got {steps})")
        self.steps = int(steps)
        self.ddpm_seed = ddpm_seed
        self._config = policy.config
        self._param = next(iter(policy.diffusion.parameters()))
        #: Seconds spent in the last flowedge ``sample`` call (host copies included), and the call count.
        self.last_sample_s = 0.0
        self.n_calls = 0

    def _seed_for_call(self, generator: Optional["torch.Generator"]) -> int:
        if self.scheduler != "ddpm":
            return 0  # DDIM (eta 0) is deterministic: no draw, so the torch RNG stream stays LeRobot's
        if self.ddpm_seed is not None:
            return int(self.ddpm_seed)
        # One draw from the same torch RNG LeRobot would use, so torch.manual_seed still controls the run.
        gen_ok = generator is not None and generator.device.type == "cpu"
        return int(torch.randint(0, 2**62, (1,), generator=generator if gen_ok else None).item())

    def __call__(self, batch_size: int, global_cond: Optional["torch.Tensor"] = None,
                 generator: Optional["torch.Generator"] = None, noise: Optional["torch.Tensor"] = None
                 ) -> "torch.Tensor":
        device, dtype = self._param.device, self._param.dtype
        H, A = self._config.horizon, self._config.action_feature.shape[0]
        if global_cond is None:
            raise _err("conditional_sample needs global_cond (LeRobot always passes it)")
        if noise is None:
            # Same call as LeRobot's DiffusionModel.conditional_sample: shape, dtype, device, generator.
            noise = torch.randn(size=(batch_size, H, A), dtype=dtype, device=device, generator=generator)
        if tuple(noise.shape) != (batch_size, H, A):
            raise _err(f"noise shape (expected {(batch_size, H, A)}, got {tuple(noise.shape)})")
        if batch_size > self.head.max_batch:
            raise _err(f"batch {batch_size} exceeds the flowedge head's max_batch {self.head.max_batch} "
                       "(pass max_batch= to wrap / from_pretrained)")
        seed = self._seed_for_call(generator)
        cond_np = np.ascontiguousarray(global_cond.detach().to("cpu", torch.float32).numpy())
        noise_np = np.ascontiguousarray(noise.detach().to("cpu", torch.float32).numpy())
        t0 = time.perf_counter()
        out = self.head.sample(cond_np, noise_np, steps=self.steps, scheduler=self.scheduler, seed=seed,
                               normalized=True)
        self.last_sample_s = time.perf_counter() - t0
        self.n_calls += 1
        return torch.from_numpy(out).to(device=device, dtype=dtype)


def is_wrapped(policy: Any) -> bool:
    """True when :func:`wrap` has installed a flowedge sampler on this policy instance."""
    return isinstance(getattr(policy, "flowedge", None), FlowEdgeSampler)


def _resolve_path(policy: "DiffusionPolicy", path: Optional[os.PathLike]) -> str:
    if path is None:
        path = getattr(policy.config, "pretrained_path", None) or getattr(policy, "name_or_path", None)
    if path is None or not os.path.exists(str(path)):
        raise _err("need the pretrained folder (or *.flowedge.safetensors) the policy was loaded from "
                   f"(expected an existing path, got {path!r}); pass path=")
    return str(path)


def _verify(policy: "DiffusionPolicy", head: DiffusionHead, atol: float) -> float:
    """One U-Net call through PyTorch and flowedge on a fixed random input; returns the max abs difference."""
    cfg = policy.config
    H, A = cfg.horizon, cfg.action_feature.shape[0]
    gcd = _global_cond_dim(policy)
    g = torch.Generator().manual_seed(20240607)  # private generator: the global RNG stream is left untouched
    x = torch.randn(1, H, A, generator=g)
    cond = torch.randn(1, gcd, generator=g)
    t = head.num_train_timesteps // 2
    p = next(iter(policy.diffusion.parameters()))
    with torch.no_grad():
        ref = policy.diffusion.unet(x.to(p.device, p.dtype), torch.full((1,), t, dtype=torch.long, device=p.device),
                                    global_cond=cond.to(p.device, p.dtype)).float().cpu().numpy()
    got = head.denoise(cond.numpy(), x.numpy(), t)
    diff = float(np.abs(got - ref).max())
    if not diff <= atol:
        raise FlowEdgeError(f"flowedge: lerobot: the flowedge head does not reproduce this policy's U-Net "
                            f"(expected max abs epsilon diff <= {atol:g} at t={t}, got {diff:.3e}); "
                            "was it loaded from the same checkpoint?")
    return diff


def wrap(policy: "DiffusionPolicy", path: Optional[os.PathLike] = None, *, device: str = "cpu",
         scheduler: str = "ddim", num_inference_steps: Optional[int] = None, ddpm_seed: Optional[int] = None,
         max_batch: int = 1, dtype: Any = None, verify: bool = True) -> "DiffusionPolicy":
    """Makes ``policy`` (a LeRobot ``DiffusionPolicy``) sample through flowedge; returns the same object.

    path: the pretrained folder (config.json + model.safetensors + policy_postprocessor*) or a compact
    ``*.flowedge.safetensors`` holding the same weights; default ``policy.config.pretrained_path``.
    device: flowedge device: "cpu", "cuda" (raises unless the head is CUDA-resident, docs/contracts.md#device-residency) or "auto" (the GPU
    when usable, else the CPU; ``policy.flowedge.head.fallback_reason`` says why).
    scheduler: "ddim" (default) or "ddpm"; num_inference_steps: default the config's, else num_train_timesteps.
    ddpm_seed: fixed SplitMix64 seed for DDPM step noise; None draws one per call from the torch RNG.
    verify: compare one U-Net call against the policy's PyTorch U-Net and raise FlowEdgeError on mismatch.
    The LeRobot U-Net stays in memory (``unwrap`` restores it); only ``conditional_sample`` is replaced.
    """
    if not isinstance(policy, DiffusionPolicy):
        is_act = getattr(getattr(policy, "config", None), "type", None) == "act"
        raise _err(f"expected a lerobot DiffusionPolicy (got {type(policy).__name__})" + (_ACT_ADVICE if is_act else ""))
    if is_wrapped(policy):
        unwrap(policy)
    cfg = policy.config
    steps = int(num_inference_steps) if num_inference_steps is not None else _config_steps(cfg)
    head = DiffusionHead(_resolve_path(policy, path), device=device, max_batch=int(max_batch), dtype=dtype)
    want = {"horizon": cfg.horizon, "action_dim": cfg.action_feature.shape[0], "n_obs_steps": cfg.n_obs_steps,
            "n_action_steps": cfg.n_action_steps, "num_train_timesteps": cfg.num_train_timesteps,
            "global_cond_dim": _global_cond_dim(policy)}
    for name, expected in want.items():
        got = getattr(head, name)
        if int(got) != int(expected):
            raise _err(f"checkpoint does not match the policy config: {name} (expected {expected}, got {got})")
    sampler = FlowEdgeSampler(head, policy, scheduler, steps, ddpm_seed)
    if verify:
        low_precision = dtype is not None and str(dtype).lower() not in ("f32", "float32", "fp32")
        sampler.verify_max_abs = _verify(policy, head, _VERIFY_ATOL_LOWP if low_precision else _VERIFY_ATOL_F32)
    policy.diffusion.conditional_sample = sampler  # instance attribute shadows DiffusionModel.conditional_sample
    policy.flowedge = sampler
    return policy


def unwrap(policy: "DiffusionPolicy") -> "DiffusionPolicy":
    """Undoes :func:`wrap`: LeRobot's own ``conditional_sample`` runs again. Returns the same object."""
    if is_wrapped(policy):
        policy.diffusion.__dict__.pop("conditional_sample", None)
        del policy.flowedge
    return policy


def set_lerobot_scheduler(policy: "DiffusionPolicy", scheduler: str, num_inference_steps: Optional[int] = None
                          ) -> "DiffusionPolicy":
    """Switches LeRobot's own sampler to ``scheduler``/steps (same diffusers kwargs LeRobot builds from the
    config), so a plain LeRobot run and a flowedge run use the same algorithm. Returns the same object."""
    s = _check_scheduler(scheduler)
    cfg = policy.config
    policy.diffusion.noise_scheduler = _lr_diffusion._make_noise_scheduler(
        s.upper(), num_train_timesteps=cfg.num_train_timesteps, beta_start=cfg.beta_start, beta_end=cfg.beta_end,
        beta_schedule=cfg.beta_schedule, clip_sample=cfg.clip_sample, clip_sample_range=cfg.clip_sample_range,
        prediction_type=cfg.prediction_type)
    policy.diffusion.num_inference_steps = (int(num_inference_steps) if num_inference_steps is not None
                                            else _config_steps(cfg))
    return policy


def load_lerobot_policy(path: os.PathLike, *, torch_device: str = "cpu") -> "DiffusionPolicy":
    """LeRobot's own ``DiffusionPolicy.from_pretrained`` (eval mode) with ``config.pretrained_path`` recorded."""
    from lerobot.configs.policies import PreTrainedConfig

    config = PreTrainedConfig.from_pretrained(str(path))
    config.device = torch_device
    policy = DiffusionPolicy.from_pretrained(str(path), config=config)
    policy.config.pretrained_path = Path(path)
    policy.eval()
    return policy


def load_processors(path: os.PathLike, *, torch_device: Optional[str] = None):
    """LeRobot's saved pre/post-processor pipelines of a pretrained folder: ``(preprocessor, postprocessor)``."""
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import make_pre_post_processors

    config = PreTrainedConfig.from_pretrained(str(path))
    overrides = {}
    if torch_device is not None:
        overrides = {"preprocessor_overrides": {"device_processor": {"device": torch_device}}}
    return make_pre_post_processors(config, pretrained_path=str(path), **overrides)


class FlowEdgeDiffusionPolicy(DiffusionPolicy):
    """A LeRobot ``DiffusionPolicy`` that samples through flowedge; everything else is LeRobot's.

    ``FlowEdgeDiffusionPolicy.from_pretrained(folder, flowedge_device="cpu", scheduler="ddim",
    num_inference_steps=None, ddpm_seed=None, max_batch=1, dtype=None, verify=True, **lerobot_kwargs)``
    loads the LeRobot policy (PyTorch encoder, queues) and a flowedge head from the same folder.
    ``select_action`` / ``predict_action_chunk`` / ``reset`` behave as LeRobot's and return normalised
    actions; apply LeRobot's postprocessor (:func:`load_processors`) to get robot units.
    """

    name = "diffusion"

    @classmethod
    def from_pretrained(cls, pretrained_name_or_path, *, flowedge_device: str = "cpu", scheduler: str = "ddim",
                        num_inference_steps: Optional[int] = None, ddpm_seed: Optional[int] = None,
                        max_batch: int = 1, dtype: Any = None, verify: bool = True, flowedge_path=None,
                        **kwargs):
        if not os.path.isdir(str(pretrained_name_or_path)):
            raise _err(f"pretrained folder not found (expected a local LeRobot pretrained_model folder, "
                       f"got {str(pretrained_name_or_path)!r})")
        if policy_type(pretrained_name_or_path) == "act":
            raise _err(f"{pretrained_name_or_path} holds an ACT policy, not a Diffusion Policy" + _ACT_ADVICE)
        policy = super().from_pretrained(pretrained_name_or_path, **kwargs)
        policy.config.pretrained_path = Path(pretrained_name_or_path)
        policy.eval()
        return wrap(policy, flowedge_path or pretrained_name_or_path, device=flowedge_device, scheduler=scheduler,
                    num_inference_steps=num_inference_steps, ddpm_seed=ddpm_seed, max_batch=max_batch, dtype=dtype,
                    verify=verify)
