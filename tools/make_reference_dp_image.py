#!/usr/bin/env python3
"""LeRobot image Diffusion Policy references: whole select_action episodes run by LeRobot itself (pip lerobot, its
DiffusionPolicy and pre/post-processors), for flowedge's DiffusionPolicy to match.

A ResNet18 encoder is 11.2 M parameters, too big to commit, so the weights are generated (tools/lerobot_fixture_weights.py;
every floating-point tensor except LeRobot's constants, SpatialSoftmax pos_grid). Committed per
fixture (test/fixtures/<name>/): config.json, the processor json + state files, constants.safetensors (the tensors
not generated), manifest.json (key, shape, seed, rule, a, b per generated tensor), and <name>_ref/: the episode's
uint8 frames, states, per-chunk initial noise and LeRobot's actions, plus per-camera encoder features of frame 0.
test/support/lerobot_fixture_folder.hpp rebuilds model.safetensors from those files.

Usage: make_reference_dp_image.py [--only NAME] [--pusht DIR]
  default: the small committed fixtures dp_image_gn and dp_image_bn (CPU, float32, TF32 off)
  --pusht DIR: the full PushT image policy (96x96, crop 84, GroupNorm, down_dims 512/1024/2048, DDIM 10) written to
               DIR (not committed) with a 3-chunk reference episode and LeRobot's select_action timing (1 and 2 threads).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from lerobot_fixture_weights import default_rule, fill_weights, save_fixture_folder  # noqa: E402
from splitmix_noise import stream_normals  # noqa: E402

from lerobot.configs.types import FeatureType, PolicyFeature  # noqa: E402
from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig  # noqa: E402
from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy  # noqa: E402
from lerobot.policies.diffusion.processor_diffusion import make_diffusion_pre_post_processors  # noqa: E402

def is_constant(key: str) -> bool:
    """LeRobot's buffers that are not weights: SpatialSoftmax's pos_grid."""
    return key.endswith("pos_grid")


def configs():
    """The committed fixtures: small images so the C++ parity test stays cheap under ASan."""
    gn = DiffusionConfig(
        input_features={
            "observation.image": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 40, 48)),
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(2,)),
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(2,))},
        n_obs_steps=2, horizon=16, n_action_steps=8, crop_shape=(32, 40), crop_is_random=True,
        pretrained_backbone_weights=None, use_group_norm=True, spatial_softmax_num_keypoints=32,
        down_dims=(32, 64, 128), kernel_size=5, n_groups=8, diffusion_step_embed_dim=32,
        noise_scheduler_type="DDIM", num_train_timesteps=100, num_inference_steps=10, device="cpu", push_to_hub=False,
    )
    gn_stats = {
        "observation.image": {"mean": torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1),
                              "std": torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)},
        "observation.state": {"min": torch.tensor([13.456, 32.938]), "max": torch.tensor([496.146, 510.958])},
        "action": {"min": torch.tensor([12.0, 25.0]), "max": torch.tensor([511.0, 497.0])},
    }
    bn = DiffusionConfig(
        input_features={
            "observation.images.top": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 36, 44)),
            "observation.images.wrist": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 36, 44)),
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(3,)),
            "observation.environment_state": PolicyFeature(type=FeatureType.ENV, shape=(5,)),
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(4,))},
        n_obs_steps=2, horizon=16, n_action_steps=8, resize_shape=(30, 38), crop_ratio=1.0, crop_shape=None,
        pretrained_backbone_weights=None, use_group_norm=False, use_separate_rgb_encoder_per_camera=True,
        spatial_softmax_num_keypoints=16, down_dims=(32, 64, 128), kernel_size=5, n_groups=8,
        diffusion_step_embed_dim=32, noise_scheduler_type="DDIM", num_train_timesteps=100, num_inference_steps=10,
        device="cpu", push_to_hub=False,
    )
    bn_stats = {
        "observation.images.top": {"mean": torch.tensor([0.5, 0.45, 0.4]).view(3, 1, 1),
                                   "std": torch.tensor([0.25, 0.2, 0.22]).view(3, 1, 1)},
        "observation.images.wrist": {"mean": torch.tensor([0.4, 0.5, 0.45]).view(3, 1, 1),
                                     "std": torch.tensor([0.2, 0.27, 0.24]).view(3, 1, 1)},
        "observation.state": {"min": torch.tensor([-1.0, 0.0, 2.0]), "max": torch.tensor([1.0, 5.0, 2.5])},
        "observation.environment_state": {"min": torch.tensor([-3.0, -1.0, 0.0, 0.0, 4.0]),
                                          "max": torch.tensor([3.0, 1.0, 1.0, 6.2831855, 9.0])},
        "action": {"min": torch.tensor([-0.5, -1.0, 0.0, 10.0]), "max": torch.tensor([0.5, 1.0, 3.0, 20.0])},
    }
    return {"dp_image_gn": (gn, gn_stats, 1000), "dp_image_bn": (bn, bn_stats, 5000)}


def pusht_config():
    cfg = DiffusionConfig(
        input_features={
            "observation.image": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 96, 96)),
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(2,)),
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(2,))},
        crop_shape=(84, 84), pretrained_backbone_weights=None, use_group_norm=True,
        noise_scheduler_type="DDIM", num_inference_steps=10, device="cpu", push_to_hub=False,
    )
    return cfg, configs()["dp_image_gn"][1], 9000


def episode_inputs(cfg: DiffusionConfig, T: int, seed: int) -> dict:
    """Deterministic observations: uint8 frames [T, H, W, 3] per camera (smooth pattern + noise), states [T, d]."""
    rng = np.random.default_rng(seed)
    obs = {}
    for key, f in cfg.input_features.items():
        if f.type == FeatureType.VISUAL:
            _, h, w = f.shape
            yy, xx = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
            frames = []
            for t in range(T):
                base = 128 + 60 * np.sin(0.3 * xx[..., None] + 0.2 * yy[..., None] + 0.5 * t + np.arange(3))
                frames.append(np.clip(base + rng.normal(0, 25, size=(h, w, 3)), 0, 255).astype(np.uint8))
            obs[key] = np.stack(frames)
        elif f.type in (FeatureType.STATE, FeatureType.ENV):
            obs[key] = rng.uniform(-2, 12, size=(T, f.shape[0])).astype(np.float32)
    return obs


def lerobot_frame(frame_hwc: np.ndarray) -> torch.Tensor:
    """lerobot-eval's preprocess_observation for one frame: uint8 HWC -> float32 CHW / 255 (batch dim added later)."""
    return torch.from_numpy(frame_hwc).permute(2, 0, 1).contiguous().type(torch.float32) / 255


def run_episode(policy, pre, post, cfg, obs: dict, noise: np.ndarray, times: list | None = None) -> np.ndarray:
    """reset() then select_action per step with the k-th chunk's initial noise; returns un-normalised actions [T, A]."""
    policy.reset()
    T = next(iter(obs.values())).shape[0]
    out, k = [], 0
    for t in range(T):
        batch = {}
        for key, f in cfg.input_features.items():
            batch[key] = lerobot_frame(obs[key][t]) if f.type == FeatureType.VISUAL else torch.from_numpy(obs[key][t])
        t0 = time.perf_counter()
        batch = pre(batch)
        chunk_due = len(policy._queues["action"]) == 0
        nz = torch.from_numpy(noise[k][None]) if chunk_due else None
        with torch.no_grad():
            a = policy.select_action(batch, noise=nz)
        a = post(a)
        if times is not None:
            times.append(time.perf_counter() - t0)
        k += int(chunk_due)
        out.append(a.reshape(-1).numpy().astype(np.float32))
    return np.stack(out)


def encoder_features(policy, pre, cfg, obs: dict) -> dict:
    """Per camera: LeRobot's rgb_encoder on the normalised frame 0 -> [feature_dim]."""
    feats = {}
    cams = [k for k, f in cfg.input_features.items() if f.type == FeatureType.VISUAL]
    batch = {k: (lerobot_frame(obs[k][0]) if cfg.input_features[k].type == FeatureType.VISUAL else torch.from_numpy(obs[k][0]))
             for k in cfg.input_features}
    batch = pre(batch)
    enc = policy.diffusion.rgb_encoder
    with torch.no_grad():
        for i, key in enumerate(cams):
            e = enc[i] if isinstance(enc, torch.nn.ModuleList) else enc
            feats[key] = e(batch[key]).reshape(-1).numpy().astype(np.float32)
    return feats


def build(name: str, cfg, stats, base_seed: int, out: str, ref: str, T: int, n_chunks_noise: int, timing: bool = False) -> None:
    os.makedirs(ref, exist_ok=True)
    policy = DiffusionPolicy(cfg)
    manifest, constants = fill_weights(policy, base_seed, default_rule, is_constant)
    policy.eval()
    pre, post = make_diffusion_pre_post_processors(cfg, dataset_stats=stats)
    save_fixture_folder(out, name, base_seed, policy, pre, post, manifest, constants)
    obs = episode_inputs(cfg, T, base_seed + 1)
    A = cfg.output_features["action"].shape[0]
    noise = np.stack([stream_normals(base_seed + 100 + k, cfg.horizon * A).reshape(cfg.horizon, A) for k in range(n_chunks_noise)])
    actions = run_episode(policy, pre, post, cfg, obs, noise)
    for key, v in obs.items():
        np.save(os.path.join(ref, key + ".npy"), v)
    np.save(os.path.join(ref, "noise.npy"), noise)
    np.save(os.path.join(ref, "actions.npy"), actions)
    for key, f in encoder_features(policy, pre, cfg, obs).items():
        np.save(os.path.join(ref, "features." + key + ".npy"), f)
    info = {"T": T, "chunks": int(math.ceil(T / cfg.n_action_steps)), "scheduler": cfg.noise_scheduler_type,
            "steps": cfg.num_inference_steps, "torch": torch.__version__}
    if timing:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            times: list = []
            run_episode(policy, pre, post, cfg, obs, noise, times)
            chunk_times = [times[i] for i in range(0, T, cfg.n_action_steps)]
            info[f"lerobot_select_action_ms_{threads}t"] = {
                "p50_all": 1e3 * float(np.median(times)), "p50_chunk": 1e3 * float(np.median(chunk_times)),
                "max": 1e3 * float(np.max(times))}
    json.dump(info, open(os.path.join(ref, "info.json"), "w"), indent=1)
    print(name, json.dumps(info), "actions[0:3]", actions[:3].tolist())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None)
    ap.add_argument("--pusht", default=None, metavar="DIR")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    if args.pusht:
        cfg, stats, seed = pusht_config()
        build("dp_pusht_image", cfg, stats, seed, args.pusht, args.pusht.rstrip("/") + "_ref", T=24, n_chunks_noise=3, timing=True)
        return 0
    for name, (cfg, stats, seed) in configs().items():
        if args.only and name != args.only:
            continue
        out = os.path.join(REPO, "test", "fixtures", name)
        build(name, cfg, stats, seed, out, out + "_ref", T=20, n_chunks_noise=3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
