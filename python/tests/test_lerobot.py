# pytest for flowedge.lerobot: the wrapped LeRobot DiffusionPolicy vs LeRobot's own sampler (same seed, same
# observations), queue semantics, reset, DDPM seeding, checkpoint verification, and the fixture references.
import copy
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lerobot")

import flowedge  # noqa: E402
from flowedge import lerobot as fl  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
DP_DIR = ROOT / "test" / "fixtures" / "dp_small"
DP_REF = ROOT / "test" / "fixtures" / "dp_small_ref"
DDIM10_BOUND = 6e-4  # docs/numerics.md#whole-head-tolerances, max abs, normalised units
DDPM_BOUND = 8e-4

pytestmark = pytest.mark.skipif(not (DP_DIR / "config.json").is_file(), reason="test/fixtures/dp_small missing")


@pytest.fixture(scope="module")
def processors():
    return fl.load_processors(DP_DIR)


@pytest.fixture(scope="module")
def lerobot_ddim10():
    return fl.set_lerobot_scheduler(fl.load_lerobot_policy(DP_DIR), "ddim", 10)


@pytest.fixture(scope="module")
def flowedge_ddim10():
    return fl.FlowEdgeDiffusionPolicy.from_pretrained(str(DP_DIR), num_inference_steps=10)


def observations(n, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [{"observation.state": 13.5 + torch.rand(1, 2, generator=g) * 480.0,
             "observation.environment_state": torch.randn(1, 4, generator=g)} for _ in range(n)]


def run_select_action(policy, pre, obs, seed):
    policy.reset()
    torch.manual_seed(seed)
    out = []
    for o in obs:
        out.append(policy.select_action(pre(dict(o))).detach().clone())
    return torch.cat(out).numpy()  # [n, A] normalised


def test_wrapped_policy_is_a_lerobot_policy(flowedge_ddim10):
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

    assert isinstance(flowedge_ddim10, DiffusionPolicy)
    assert fl.is_wrapped(flowedge_ddim10)
    s = flowedge_ddim10.flowedge
    assert s.scheduler == "ddim" and s.steps == 10
    assert s.head.backend == "cpu" and s.head.horizon == 16 and s.head.global_cond_dim == 12
    assert s.verify_max_abs <= 3e-4


def test_select_action_matches_lerobot_across_refills(lerobot_ddim10, flowedge_ddim10, processors):
    pre, _ = processors
    obs = observations(20)  # n_action_steps 8: chunks sampled at ticks 0, 8, 16
    calls0 = flowedge_ddim10.flowedge.n_calls
    a_lr = run_select_action(lerobot_ddim10, pre, obs, seed=11)
    a_fe = run_select_action(flowedge_ddim10, pre, obs, seed=11)
    assert flowedge_ddim10.flowedge.n_calls - calls0 == 3
    assert a_fe.shape == (20, 2)
    assert np.abs(a_fe - a_lr).max() <= DDIM10_BOUND
    # the comparison is not vacuous: different chunks and a different seed give different actions
    assert np.abs(a_fe[0] - a_fe[8]).max() > 1e-3
    a_other = run_select_action(flowedge_ddim10, pre, obs, seed=12)
    assert np.abs(a_other - a_fe).max() > 1e-2


def test_reset_clears_queues_and_repeats(flowedge_ddim10, processors):
    from lerobot.utils.constants import ACTION

    pre, _ = processors
    obs = observations(5, seed=4)
    first = run_select_action(flowedge_ddim10, pre, obs, seed=2)
    assert len(flowedge_ddim10._queues[ACTION]) == 8 - 5
    flowedge_ddim10.reset()
    assert len(flowedge_ddim10._queues[ACTION]) == 0
    again = run_select_action(flowedge_ddim10, pre, obs, seed=2)
    np.testing.assert_array_equal(first, again)


def test_end_to_end_matches_fixture(processors):
    pre, post = processors
    policy = fl.FlowEdgeDiffusionPolicy.from_pretrained(str(DP_DIR), num_inference_steps=10, max_batch=2)
    state = torch.from_numpy(np.load(DP_REF / "obs_state.npy"))
    env = torch.from_numpy(np.load(DP_REF / "obs_env.npy"))
    noise = torch.from_numpy(np.load(DP_REF / "noise.npy"))
    batch = pre({"observation.state": state, "observation.environment_state": env})
    with torch.no_grad():
        executed = policy.diffusion.generate_actions(batch, noise=noise)
    assert np.abs(executed.numpy() - np.load(DP_REF / "obs_ddim10_executed_norm.npy")).max() <= DDIM10_BOUND
    actions = post(executed).numpy()
    ref = np.load(DP_REF / "obs_ddim10_executed_action.npy")
    span = (np.array([511.0, 497.0]) - np.array([12.0, 25.0])) / 2
    assert np.all(np.abs(actions - ref).max(axis=(0, 1)) <= DDIM10_BOUND * span)


def test_ddpm_with_fixed_seed_matches_splitmix_reference():
    policy = fl.load_lerobot_policy(DP_DIR)
    fl.wrap(policy, DP_DIR, scheduler="ddpm", num_inference_steps=100, ddpm_seed=7, max_batch=2)
    cond = torch.from_numpy(np.load(DP_REF / "cond.npy"))
    noise = torch.from_numpy(np.load(DP_REF / "noise.npy"))
    out = policy.diffusion.conditional_sample(2, global_cond=cond, noise=noise)
    assert np.abs(out.numpy() - np.load(DP_REF / "ddpm100_norm.npy")).max() <= DDPM_BOUND


def test_ddpm_seed_follows_torch_rng(processors):
    pre, _ = processors
    policy = fl.wrap(fl.load_lerobot_policy(DP_DIR), DP_DIR, scheduler="ddpm", num_inference_steps=10)
    obs = observations(2, seed=5)
    a = run_select_action(policy, pre, obs, seed=21)
    b = run_select_action(policy, pre, obs, seed=21)
    c = run_select_action(policy, pre, obs, seed=22)
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 1e-3


def test_unwrap_restores_lerobot_sampler(lerobot_ddim10, processors):
    pre, _ = processors
    policy = fl.set_lerobot_scheduler(fl.load_lerobot_policy(DP_DIR), "ddim", 10)
    obs = observations(3, seed=6)
    ref = run_select_action(lerobot_ddim10, pre, obs, seed=1)
    fl.wrap(policy, DP_DIR, num_inference_steps=10)
    calls = policy.flowedge.n_calls
    run_select_action(policy, pre, obs, seed=1)
    assert policy.flowedge.n_calls == calls + 1
    sampler = policy.flowedge
    fl.unwrap(policy)
    assert not fl.is_wrapped(policy)
    np.testing.assert_allclose(run_select_action(policy, pre, obs, seed=1), ref, rtol=0, atol=1e-6)
    assert sampler.n_calls == calls + 1  # LeRobot's loop ran, not flowedge


def test_verify_rejects_other_weights():
    policy = fl.load_lerobot_policy(DP_DIR)
    with torch.no_grad():
        policy.diffusion.unet.final_conv[1].bias.add_(0.05)
    with pytest.raises(flowedge.FlowEdgeError, match="does not reproduce"):
        fl.wrap(policy, DP_DIR)
    assert not fl.is_wrapped(policy)
    fl.wrap(policy, DP_DIR, verify=False)  # the caller can opt out
    assert fl.is_wrapped(policy)


def test_errors():
    policy = fl.load_lerobot_policy(DP_DIR)
    with pytest.raises(flowedge.FlowEdgeValueError, match="unknown scheduler"):
        fl.wrap(policy, DP_DIR, scheduler="euler")
    with pytest.raises(flowedge.FlowEdgeValueError, match="diffusion steps out of range"):
        fl.wrap(policy, DP_DIR, num_inference_steps=101)
    with pytest.raises(flowedge.FlowEdgeValueError, match="pretrained folder"):
        fl.wrap(copy.deepcopy(policy), "/nonexistent/folder")
    with pytest.raises(flowedge.FlowEdgeValueError, match="DiffusionPolicy"):
        fl.wrap(object(), DP_DIR)
    fl.wrap(policy, DP_DIR, num_inference_steps=10)
    cond = torch.zeros(2, 12)
    with pytest.raises(flowedge.FlowEdgeValueError, match="max_batch"):
        policy.diffusion.conditional_sample(2, global_cond=cond)
    with pytest.raises(flowedge.FlowEdgeValueError, match="noise shape"):
        policy.diffusion.conditional_sample(1, global_cond=cond[:1], noise=torch.zeros(1, 8, 2))
