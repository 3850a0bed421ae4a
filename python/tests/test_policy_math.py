# The `math` property of flowedge.DiffusionPolicy and flowedge.ActPolicy (the engine's names "f32" / "tf32" / "bf16"
# and its ValueError): on a CPU policy every mode is accepted; TF32 computes exactly there (no TF32 path), BF16 rounds
# the Diffusion U-Net's convolutions and ACT's linears where the CPU has AVX512_BF16.
import numpy as np
import pytest

import flowedge
from conftest import FIXTURES

ACT_REF = FIXTURES / "act_cam2_ref"


def dp_obs(t):
    return {"observation.state": np.array([100.0 + 37.0 * t, 111.0 + 37.0 * t], np.float32),
            "observation.environment_state": (0.1 * t - 0.2 * np.arange(4)).astype(np.float32)}


def first_action(policy, obs):
    policy.reset(seed=3)
    return policy.select_action(obs)


def check_names_and_errors(policy):
    assert policy.math == "f32"
    for bad in ("fp8", "F32", ""):
        with pytest.raises(ValueError, match=f"math must be 'f32', 'tf32' or 'bf16' \\(got '{bad}'\\)"):
            policy.math = bad
    assert policy.math == "f32"  # a refused name changes nothing


def test_diffusion_policy_math_on_the_cpu(dp_path):
    p = flowedge.DiffusionPolicy(dp_path, steps=10, scheduler="ddim", seed=7)
    check_names_and_errors(p)
    exact = first_action(p, dp_obs(0))
    p.math = "tf32"
    assert p.math == "tf32"
    np.testing.assert_array_equal(first_action(p, dp_obs(0)), exact)  # no TF32 path on the CPU
    p.math = "bf16"
    assert p.math == "bf16"
    # As the C API test: within 2e-2 relative of F32 after 10 DDIM steps (exact where the CPU lacks AVX512_BF16).
    np.testing.assert_allclose(first_action(p, dp_obs(0)), exact, rtol=0, atol=2e-2 * (1 + np.abs(exact).max()))
    p.math = "f32"
    np.testing.assert_array_equal(first_action(p, dp_obs(0)), exact)


def test_act_policy_math_on_the_cpu(act_folder):
    p = flowedge.ActPolicy(act_folder)
    check_names_and_errors(p)
    obs = {path.stem: np.load(path)[0] for path in ACT_REF.glob("observation*.npy")}
    exact = first_action(p, obs)
    p.math = "tf32"
    assert p.math == "tf32"
    np.testing.assert_array_equal(first_action(p, obs), exact)  # no TF32 path on the CPU
    p.math = "bf16"
    assert p.math == "bf16"
    bf16 = first_action(p, obs)
    assert np.all(np.isfinite(bf16))
    # BF16 operands (2^-9 relative) in the linears; un-normalised actions of these random-init weights are O(1).
    np.testing.assert_allclose(bf16, exact, rtol=0, atol=5e-2 * (1 + np.abs(exact).max()))
    p.math = "f32"
    np.testing.assert_array_equal(first_action(p, obs), exact)
