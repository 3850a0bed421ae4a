"""Generated weights for the LeRobot reference fixtures, shared by make_reference_dp_image.py and make_reference_act.py.

A ResNet18 backbone is 11.2 M parameters, too big to commit, so a fixture's weights are *generated*: every
floating-point tensor of the policy's state dict except its constants gets
    value = float32(a + b * n)          (rule "lin")    or    float32(a + b * n * n)   (rule "sq")
with n the float32 SplitMix64/Box-Muller normals 0, 1, ... of stream seed (base_seed + k), k the tensor's index in
sorted key order (tools/splitmix_noise.py; include/flowedge/noise.hpp computes the same numbers). The folder keeps
manifest.json (key, shape, seed, rule, a, b, sum and first values per generated tensor) and constants.safetensors
(the tensors not generated); test/support/lerobot_fixture_folder.hpp rebuilds model.safetensors from them.
"""
import json
import math
import os

import numpy as np
import torch
from safetensors.numpy import save_file

from splitmix_noise import stream_normals


def default_rule(key: str, shape: tuple) -> tuple[str, float, float]:
    """(rule, a, b): weights ~ N(0, 1/fan_in), norm gains ~ 1 + 0.1 N, biases / BN means ~ 0.1 N, BN vars 0.5 + 0.5 N^2."""
    if key.endswith("running_var"):
        return "sq", 0.5, 0.5
    if key.endswith("running_mean"):
        return "lin", 0.0, 0.1
    if len(shape) >= 2:
        return "lin", 0.0, 1.0 / math.sqrt(int(np.prod(shape[1:])))
    if key.endswith(".weight"):  # GroupNorm / BatchNorm / LayerNorm gain
        return "lin", 1.0, 0.1
    return "lin", 0.0, 0.1


def generate(rule: str, a: float, b: float, seed: int, shape: tuple) -> np.ndarray:
    n = stream_normals(seed, int(np.prod(shape))).astype(np.float64)
    v = a + b * (n * n if rule == "sq" else n)
    return v.astype(np.float32).reshape(shape)


def fill_weights(policy, base_seed: int, rule_for, is_constant) -> tuple[list, dict]:
    """Overwrites the policy's state dict with generated values (rule_for(key, shape) -> (rule, a, b)); tensors that
    are not floating point or for which is_constant(key) holds keep their values. Returns the manifest entries and
    the constant tensors."""
    sd = policy.state_dict()
    manifest, constants, new_sd = [], {}, {}
    for k, key in enumerate(sorted(sd)):
        t = sd[key]
        if not t.is_floating_point() or is_constant(key):
            constants[key] = t.detach().cpu().numpy()
            new_sd[key] = t
            continue
        shape = tuple(t.shape)
        rule, a, b = rule_for(key, shape)
        v = generate(rule, a, b, base_seed + k, shape)
        manifest.append({"key": key, "shape": list(shape), "seed": base_seed + k, "rule": rule, "a": a, "b": b,
                         "sum": float(v.astype(np.float64).sum()), "first": [float(x) for x in v.reshape(-1)[:4]]})
        new_sd[key] = torch.from_numpy(v)
    policy.load_state_dict(new_sd)
    return manifest, constants


def save_fixture_folder(out: str, name: str, base_seed: int, policy, pre, post, manifest: list, constants: dict) -> None:
    """Writes the pretrained_model folder `out` as LeRobot saves it (config, weights, processors), plus manifest.json
    and constants.safetensors, from which the weights are rebuilt once model.safetensors is left out of the commit."""
    os.makedirs(out, exist_ok=True)
    policy.save_pretrained(out)
    pre.save_pretrained(out)
    post.save_pretrained(out)
    lerobot = __import__("lerobot")
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"name": name, "base_seed": base_seed, "lerobot": getattr(lerobot, "__version__", "0.4.4"), "generated": manifest},
                  f, indent=1)
    save_file({k: np.ascontiguousarray(v) for k, v in constants.items()}, os.path.join(out, "constants.safetensors"))
