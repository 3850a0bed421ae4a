# flowedge.ActPolicy and flowedge.load_policy: LeRobot's whole ACT policy from numpy observation dicts. The act_cam2
# fixture (two 96x96 cameras, state and environment state; a random-init ACTPolicy saved by pip LeRobot, weights
# rebuilt here from its manifest) against LeRobot's own per-step chunks and select_action episodes, with the
# checkpoint's temporal ensembling and with a queue of 5; the class choice by config.json's type; devices and errors.
import numpy as np
import pytest

import flowedge
from conftest import FIXTURES
from lerobot_fixture import read_safetensors

REF = FIXTURES / "act_cam2_ref"
BOUND = 1e-4  # max abs, normalised action units (issue 23), as test/act bounds ActPolicy<Cpu>


@pytest.fixture(scope="module")
def episode():
    """LeRobot's recorded observations, [T, ...] per feature key (uint8 HWC frames)."""
    return {p.stem: np.load(p) for p in REF.glob("observation*.npy")}


def action_std():
    return read_safetensors(FIXTURES / "act_cam2" / "policy_postprocessor_step_0_unnormalizer_processor.safetensors")["action.std"]


def run_episode(policy, episode):
    policy.reset()
    T = episode["observation.state"].shape[0]
    return np.stack([policy.select_action({k: v[t] for k, v in episode.items()}) for t in range(T)])


def test_properties(act_folder):
    p = flowedge.ActPolicy(act_folder)
    assert p.policy_type == "act" and flowedge.policy_type(act_folder) == "act"
    assert p.cameras == ["observation.images.top", "observation.images.wrist"]
    assert p.camera_shapes == {"observation.images.top": (3, 96, 96), "observation.images.wrist": (3, 96, 96)}
    assert (p.state_key, p.state_dim, p.env_key, p.env_dim, p.action_dim) == ("observation.state", 6, "observation.environment_state", 5, 5)
    assert (p.chunk_size, p.horizon, p.n_obs_steps, p.n_action_steps) == (12, 12, 1, 1)
    assert p.temporal_ensemble_coeff == pytest.approx(0.01)
    assert p.device == p.backend == "cpu" and not p.cuda_resident and p.fallback_reason == ""
    assert p.chunks_generated == 0 and p.device_bytes > 0


@pytest.mark.parametrize("selection, ref, chunks", [({}, "actions.npy", 12), ({"n_action_steps": 5}, "actions_alt.npy", 3)])
def test_episode_matches_lerobot(act_folder, episode, selection, ref, chunks):
    p = flowedge.ActPolicy(act_folder, **selection)
    got = run_episode(p, episode)
    want = np.load(REF / ref)
    assert got.shape == want.shape == (12, 5) and got.dtype == np.float32
    err = float((np.abs(got.astype(np.float64) - want) / action_std()).max())
    assert err <= BOUND, err
    assert p.chunks_generated == chunks
    p.reset(seed=123)  # accepted and ignored: ACT draws no noise
    np.testing.assert_array_equal(run_episode(p, episode), got)


def test_predict_action_chunk_matches_lerobot_with_uint8_and_float_frames(act_folder, episode):
    p = flowedge.ActPolicy(act_folder)
    chunks = np.load(REF / "chunks.npy")
    for t in (0, 7):
        obs = {k: v[t] for k, v in episode.items()}
        c = p.predict_action_chunk(obs)
        assert c.shape == (12, 5)
        assert float(np.abs(c - chunks[t]).max()) <= BOUND
    # float CHW frames in [0, 1] and a leading batch of 1 are the same observation
    obs = {k: v[0] for k, v in episode.items()}
    chw = dict(obs, **{k: (obs[k].transpose(2, 0, 1) / np.float32(255))[None] for k in p.cameras})
    assert float(np.abs(p.predict_action_chunk(chw) - chunks[0]).max()) <= BOUND
    assert p.chunks_generated == 3  # every predicted chunk counts


def test_load_policy_chooses_by_config_type(act_folder, dp_path):
    a = flowedge.load_policy(act_folder, n_action_steps=4)
    assert isinstance(a, flowedge.ActPolicy) and a.n_action_steps == 4 and a.temporal_ensemble_coeff is None
    d = flowedge.load_policy(dp_path, steps=10, scheduler="ddim")
    assert isinstance(d, flowedge.DiffusionPolicy) and d.steps == 10
    assert flowedge.policy_type(dp_path) == "diffusion"
    with pytest.raises(flowedge.FlowEdgeValueError, match="ACT policy, which takes no option 'steps'"):
        flowedge.load_policy(act_folder, steps=10)
    with pytest.raises(flowedge.FlowEdgeValueError, match="Diffusion policy, which takes no option 'n_action_steps'"):
        flowedge.load_policy(dp_path, n_action_steps=2)


def test_act_follows_the_residency_contract(act_folder, clean_env):
    p = flowedge.load_policy(act_folder, device="auto")
    if p.cuda_resident:
        assert p.backend == "cuda" and p.fallback_reason == ""
        return
    assert p.backend == "cpu" and p.fallback_reason
    with pytest.raises(flowedge.FlowEdgeError, match="pass device='auto'"):
        flowedge.ActPolicy(act_folder, device="cuda")
    clean_env.setenv("FLOWEDGE_CUDA_REQUIRED", "1")
    with pytest.raises(flowedge.FlowEdgeError, match="FLOWEDGE_CUDA_REQUIRED=1"):
        flowedge.ActPolicy(act_folder, device="auto")


def test_bad_selection_and_observations_are_value_errors(act_folder, episode):
    with pytest.raises(flowedge.FlowEdgeValueError, match="expected <= chunk_size 12, got 13"):
        flowedge.ActPolicy(act_folder, n_action_steps=13)
    with pytest.raises(flowedge.FlowEdgeValueError, match="1 with temporal_ensemble_coeff set"):
        flowedge.ActPolicy(act_folder, temporal_ensemble_coeff=0.01, n_action_steps=5)
    with pytest.raises(flowedge.FlowEdgeValueError, match="unsupported 'n_action_steps' \\(expected >= 1, got 0\\)"):
        flowedge.ActPolicy(act_folder, n_action_steps=0)
    p = flowedge.ActPolicy(act_folder)
    obs = {k: v[0] for k, v in episode.items()}
    with pytest.raises(flowedge.FlowEdgeError, match="before reset"):
        p.select_action(obs)
    p.reset()
    with pytest.raises(flowedge.FlowEdgeValueError, match="lacks 'observation.images.wrist'"):
        p.select_action({k: v for k, v in obs.items() if k != "observation.images.wrist"})
    with pytest.raises(flowedge.FlowEdgeValueError, match="'observation.environment_state' has the wrong shape"):
        p.select_action(dict(obs, **{"observation.environment_state": np.zeros(4, np.float32)}))
    with pytest.raises(TypeError):
        p.select_action(obs, noise=np.zeros((12, 5), np.float32))  # an ACT policy draws no noise
    assert p.chunks_generated == 0
    assert p.select_action(obs).shape == (5,) and p.chunks_generated == 1
    assert p.set_realtime() == {"memory_locked": False, "prefaulted": False, "prefaulted_bytes": 0, "threads_placed": 0,
                                "threads_moved": 0, "cpus": [], "rt_priority": 0, "high_priority_stream": False, "pinned_staging": False}
