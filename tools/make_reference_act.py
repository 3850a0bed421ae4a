#!/usr/bin/env python3
"""LeRobot ACT references: random-init ACTPolicy checkpoints saved by LeRobot itself (pip lerobot, its ACTPolicy and
pre/post-processors) with per-chunk actions and whole select_action episodes, for flowedge's ActPolicy to match.

The ResNet18 backbone is 11.2 M parameters, too big to commit, so the weights are generated as for the Diffusion
Policy fixtures (tools/lerobot_fixture_weights.py: manifest.json, SplitMix64 normals) and
test/support/lerobot_fixture_folder.hpp rebuilds model.safetensors. Buffers that are not weights (the VAE encoder's
sinusoidal table) go to constants.safetensors.

Committed fixtures (test/fixtures/<name>/ and <name>_ref/):
  act_cam1: one camera 3x64x80, state, post-norm, ReLU, n_action_steps 4 (its _ref also holds a temporal-ensembling
            episode run with temporal_ensemble_coeff 0.05 and n_action_steps 1, as LeRobot's eval CLI override does)
  act_cam2: two cameras 96x96, state and environment state, pre-norm, GELU, temporal ensembling in config.json
            (coeff 0.01, n_action_steps 1); its _ref also holds a queue episode with n_action_steps 5
<name>_ref/: per camera the uint8 frames [T, H, W, 3], the states, actions.npy (the config's episode, un-normalised),
chunks.npy (predict_action_chunk, normalised, at every step of that episode: [T, chunk, A]), the other mode's episode
(actions_alt.npy).

Usage: make_reference_act.py [--only NAME] [--bench DIR]
  --bench DIR: one 480x640 camera at LeRobot's default sizes (dim 512, 8 heads, ff 3200, 4 encoder layers, chunk
               100) written to DIR (not committed) with 12-step episodes of both modes and LeRobot's time per chunk.
"""
import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from lerobot_fixture_weights import default_rule, fill_weights, save_fixture_folder  # noqa: E402
from make_reference_dp_image import episode_inputs, lerobot_frame  # noqa: E402

from lerobot.configs.types import FeatureType, PolicyFeature  # noqa: E402
from lerobot.policies.act.configuration_act import ACTConfig  # noqa: E402
from lerobot.policies.act.modeling_act import ACTPolicy  # noqa: E402
from lerobot.policies.act.processor_act import make_act_pre_post_processors  # noqa: E402


def rule_for(key: str, shape: tuple) -> tuple[str, float, float]:
    """(rule, a, b): learned position embeddings ~ N(0, 1) (nn.Embedding's init), the rest as default_rule."""
    if "pos_embed" in key or key.endswith("cls_embed.weight"):
        return "lin", 0.0, 1.0
    return default_rule(key, shape)


def is_constant(key: str) -> bool:
    """LeRobot's buffers that are not weights: the VAE encoder's sinusoidal table."""
    return key.endswith("vae_encoder_pos_enc")


def image_stats(mean, std):
    return {"mean": torch.tensor(mean).view(3, 1, 1), "std": torch.tensor(std).view(3, 1, 1)}


def configs():
    """The committed fixtures: small images and transformer so the C++ parity test stays cheap under ASan."""
    cam1 = ACTConfig(
        input_features={
            "observation.image": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 64, 80)),
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(3,)),
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(4,))},
        chunk_size=10, n_action_steps=4, pretrained_backbone_weights=None, pre_norm=False, dim_model=32, n_heads=4,
        dim_feedforward=64, feedforward_activation="relu", n_encoder_layers=2, n_decoder_layers=1, latent_dim=8,
        n_vae_encoder_layers=1, device="cpu", push_to_hub=False,
    )
    cam1_stats = {
        "observation.image": image_stats([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        "observation.state": {"mean": torch.tensor([5.0, -1.0, 3.0]), "std": torch.tensor([4.0, 2.5, 0.5])},
        "action": {"mean": torch.tensor([0.5, -2.0, 10.0, 0.0]), "std": torch.tensor([0.3, 1.5, 4.0, 2.0])},
    }
    cam2 = ACTConfig(
        input_features={
            "observation.images.top": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 96, 96)),
            "observation.images.wrist": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 96, 96)),
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(6,)),
            "observation.environment_state": PolicyFeature(type=FeatureType.ENV, shape=(5,)),
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(5,))},
        chunk_size=12, n_action_steps=1, temporal_ensemble_coeff=0.01, pretrained_backbone_weights=None, pre_norm=True,
        dim_model=48, n_heads=6, dim_feedforward=80, feedforward_activation="gelu", n_encoder_layers=3,
        n_decoder_layers=1, latent_dim=8, n_vae_encoder_layers=1, device="cpu", push_to_hub=False,
    )
    cam2_stats = {
        "observation.images.top": image_stats([0.5, 0.45, 0.4], [0.25, 0.2, 0.22]),
        "observation.images.wrist": image_stats([0.4, 0.5, 0.45], [0.2, 0.27, 0.24]),
        "observation.state": {"mean": torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
                              "std": torch.tensor([3.0, 3.5, 4.0, 4.5, 5.0, 5.5])},
        "observation.environment_state": {"mean": torch.zeros(5), "std": torch.ones(5)},
        "action": {"mean": torch.tensor([0.0, 1.0, -1.0, 5.0, 2.0]), "std": torch.tensor([1.0, 0.5, 2.0, 3.0, 0.1])},
    }
    return {
        "act_cam1": (cam1, cam1_stats, 7000, {"temporal_ensemble_coeff": 0.05, "n_action_steps": 1}),
        "act_cam2": (cam2, cam2_stats, 8000, {"temporal_ensemble_coeff": None, "n_action_steps": 5}),
    }


def bench_config():
    cfg = ACTConfig(
        input_features={
            "observation.images.front": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 480, 640)),
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(6,)),
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(6,))},
        pretrained_backbone_weights=None, device="cpu", push_to_hub=False,
    )
    stats = {
        "observation.images.front": image_stats([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        "observation.state": {"mean": torch.zeros(6), "std": torch.ones(6)},
        "action": {"mean": torch.zeros(6), "std": torch.ones(6)},
    }
    return cfg, stats, 9500, {"temporal_ensemble_coeff": 0.01, "n_action_steps": 1}


def batch_at(cfg: ACTConfig, obs: dict, t: int) -> dict:
    return {key: lerobot_frame(obs[key][t]) if f.type == FeatureType.VISUAL else torch.from_numpy(obs[key][t])
            for key, f in cfg.input_features.items()}


def run_episode(policy, pre, post, cfg, obs: dict, chunks: list | None = None) -> np.ndarray:
    """reset() then select_action per step; returns un-normalised actions [T, A] (and the normalised chunk LeRobot's
    predict_action_chunk gives for every step's observation, when `chunks` is a list)."""
    policy.reset()
    T = next(iter(obs.values())).shape[0]
    out = []
    for t in range(T):
        batch = pre(batch_at(cfg, obs, t))
        with torch.no_grad():
            a = post(policy.select_action(batch))
        if chunks is not None:
            with torch.no_grad():
                chunks.append(policy.predict_action_chunk(batch)[0].numpy().astype(np.float32))
        out.append(a.reshape(-1).numpy().astype(np.float32))
    return np.stack(out)


def lerobot_cuda_chunk_ms(policy, pre, cfg, obs: dict, iters: int = 50) -> dict:
    """LeRobot's eager predict_action_chunk on the GPU, batch already on the device (its best case: no H2D in the
    timing), exact F32 (TF32 off) and PyTorch's default TF32 matmul/conv setting; p50 and min over `iters` chunks."""
    torch.use_deterministic_algorithms(False)
    gpu = ACTPolicy(cfg)
    gpu.load_state_dict(policy.state_dict())
    gpu = gpu.to("cuda").eval()
    batch = {k: v.to("cuda") for k, v in pre(batch_at(cfg, obs, 0)).items() if torch.is_tensor(v)}
    out = {"lerobot_cuda_device": torch.cuda.get_device_name()}
    for label, tf32 in (("f32", False), ("tf32", True)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        times = []
        for i in range(iters + 5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.no_grad():
                gpu.predict_action_chunk(batch)
            torch.cuda.synchronize()
            if i >= 5:
                times.append(time.perf_counter() - t0)
        out[f"lerobot_cuda_chunk_ms_{label}"] = {"p50": 1e3 * float(np.median(times)), "min": 1e3 * float(np.min(times))}
    torch.use_deterministic_algorithms(True)
    return out


def build(name: str, cfg, stats, base_seed: int, alt: dict, out: str, ref: str, T: int, timing: bool = False) -> None:
    os.makedirs(ref, exist_ok=True)
    policy = ACTPolicy(cfg)
    manifest, constants = fill_weights(policy, base_seed, rule_for, is_constant)
    policy.eval()
    pre, post = make_act_pre_post_processors(cfg, dataset_stats=stats)
    save_fixture_folder(out, name, base_seed, policy, pre, post, manifest, constants)
    obs = episode_inputs(cfg, T, base_seed + 1)
    chunks: list = []
    actions = run_episode(policy, pre, post, cfg, obs, chunks)
    # The other select_action mode on the same weights: a policy built from the config with `alt` applied.
    alt_policy = ACTPolicy(dataclasses.replace(cfg, **alt))
    alt_policy.load_state_dict(policy.state_dict())
    alt_policy.eval()
    actions_alt = run_episode(alt_policy, pre, post, cfg, obs)
    for key, v in obs.items():
        np.save(os.path.join(ref, key + ".npy"), v)
    np.save(os.path.join(ref, "actions.npy"), actions)
    np.save(os.path.join(ref, "actions_alt.npy"), actions_alt)
    np.save(os.path.join(ref, "chunks.npy"), np.stack(chunks))
    info = {"T": T, "alt": alt, "torch": torch.__version__}
    if timing:
        # One chunk per step (pre-processor + predict_action_chunk), as a chunk tick of select_action costs.
        for threads in (1, 2):
            torch.set_num_threads(threads)
            times = []
            for t in range(T):
                t0 = time.perf_counter()
                with torch.no_grad():
                    policy.predict_action_chunk(pre(batch_at(cfg, obs, t)))
                times.append(time.perf_counter() - t0)
            info[f"lerobot_chunk_ms_{threads}t"] = {"p50": 1e3 * float(np.median(times)), "min": 1e3 * float(np.min(times))}
        if torch.cuda.is_available():
            info.update(lerobot_cuda_chunk_ms(policy, pre, cfg, obs))
    json.dump(info, open(os.path.join(ref, "info.json"), "w"), indent=1)
    print(name, json.dumps(info), "actions[0:2]", actions[:2].tolist(), "alt[0:2]", actions_alt[:2].tolist())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None)
    ap.add_argument("--bench", default=None, metavar="DIR")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    if args.bench:
        cfg, stats, seed, alt = bench_config()
        build("act_bench_480x640", cfg, stats, seed, alt, args.bench, args.bench.rstrip("/") + "_ref", T=12, timing=True)
        return 0
    for name, (cfg, stats, seed, alt) in configs().items():
        if args.only and name != args.only:
            continue
        out = os.path.join(REPO, "test", "fixtures", name)
        build(name, cfg, stats, seed, alt, out, out + "_ref", T=12)
    return 0


if __name__ == "__main__":
    sys.exit(main())
