# flowedge.DiffusionPolicy with batch=N: select_action_batch over N environments equals N batch-1 policies fed the same
# per-environment observations (seeded noise: environment e of seed s draws what a batch-1 policy of seed s + (e << 32)
# draws; caller noise rows), with environments reset at different ticks; the batched API's errors.
import numpy as np
import pytest

import flowedge
from conftest import FIXTURES
from lerobot_fixture import rebuild

N = 3
RESET_AT = {1: 3, 2: 6}  # environment -> tick at which its episode restarts (queues out of phase)
TOL = 1e-4  # batch rows differ from batch 1 only in the last bits (docs/status.md "Batch rows"); the C++ test bounds
# the same runs at 5e-5 in normalised action units


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    src = FIXTURES / "dp_image_bn"
    if not (src / "manifest.json").is_file():
        pytest.skip(f"fixture {src} not present")
    return rebuild(src, tmp_path_factory.mktemp("dp_image_bn"))


def observations(p, ref, t):
    """Per-environment observations at tick t: environment e walks the episode from offset 5 e."""
    T = ref[p.state_key].shape[0]
    idx = [(t + 5 * e) % T for e in range(N)]
    obs = {p.state_key: ref[p.state_key][idx], p.env_key: ref[p.env_key][idx]}
    for cam in p.cameras:
        obs[cam] = ref[cam][idx]
    return obs


def row(obs, e):
    return {k: v[e] for k, v in obs.items()}


@pytest.mark.parametrize("caller_noise", [False, True])
def test_select_action_batch_equals_single_policies(image_folder, caller_noise):
    ref = {p.stem: np.load(p) for p in (FIXTURES / "dp_image_bn_ref").glob("*.npy")}
    b = flowedge.DiffusionPolicy.load(image_folder, batch=N, seed=11)
    singles = [flowedge.DiffusionPolicy(image_folder, seed=11 + (e << 32)) for e in range(N)]
    assert b.batch == N and singles[0].batch == 1
    b.reset()
    for s in singles:
        s.reset()
    rng = np.random.default_rng(0)
    for t in range(24):
        for e, tick in RESET_AT.items():
            if t == tick:
                b.reset(env=e)
                singles[e].reset()
        obs = observations(b, ref, t)
        noise = rng.standard_normal((N, b.horizon, b.action_dim)).astype(np.float32) if caller_noise else None
        got = b.select_action_batch(obs, noise=noise)
        assert got.shape == (N, b.action_dim) and got.dtype == np.float32
        want = np.stack([s.select_action(row(obs, e), noise=None if noise is None else noise[e]) for e, s in enumerate(singles)])
        for e, s in enumerate(singles):
            assert b.env_chunks_generated(e) == s.chunks_generated
        np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)


def test_batch_api_errors(image_folder, tmp_path):
    with pytest.raises(flowedge.FlowEdgeValueError, match="batch must be >= 1"):
        flowedge.DiffusionPolicy(image_folder, batch=0)
    ref = {p.stem: np.load(p) for p in (FIXTURES / "dp_image_bn_ref").glob("*.npy")}
    b = flowedge.DiffusionPolicy(image_folder, batch=N)
    b.reset(seed=4)
    obs = observations(b, ref, 0)
    with pytest.raises(flowedge.FlowEdgeError, match="serves a batch"):
        b.select_action(row(obs, 0))
    short = dict(obs)
    short[b.state_key] = obs[b.state_key][:2]
    with pytest.raises(flowedge.FlowEdgeValueError, match=r"'observation.state' has the wrong shape \(expected \[batch, 3\] = \[3, 3\]"):
        b.select_action_batch(short)
    with pytest.raises(flowedge.FlowEdgeValueError, match="with a leading batch of 3"):
        b.select_action_batch({**obs, b.cameras[0]: obs[b.cameras[0]][0]})
    with pytest.raises(flowedge.FlowEdgeValueError, match=r"noise has the wrong shape \(expected \[batch, horizon, action_dim\]"):
        b.select_action_batch(obs, noise=np.zeros((N, 3), np.float32))
    with pytest.raises(flowedge.FlowEdgeError, match="environment index out of range"):
        b.reset(env=N)
    bad = dict(obs)
    bad[b.state_key] = obs[b.state_key].copy()
    bad[b.state_key][2, 0] = np.nan
    with pytest.raises(flowedge.FlowEdgeError, match="policy env 2: 'observation.state' element 0 is not finite"):
        b.select_action_batch(bad)
    # float32 CHW frames for every environment give the uint8 frames' actions (LeRobot divides by 255 first)
    b.reset(seed=4)
    u8 = b.select_action_batch(obs)
    f32 = dict(obs)
    for cam in b.cameras:
        f32[cam] = np.ascontiguousarray(obs[cam].transpose(0, 3, 1, 2)).astype(np.float32) / np.float32(255)
    b.reset(seed=4)
    np.testing.assert_allclose(b.select_action_batch(f32), u8, rtol=0, atol=1e-4)


def test_batch_too_large_for_memory_is_a_load_error(image_folder):
    # 2**30 environments need far more than any host's memory (each has at least [channels, horizon] U-Net
    # activations): the load is refused before anything batch-sized is allocated, naming the batch that fits.
    with pytest.raises(flowedge.FlowEdgeError, match=r"out of host memory: batch 1073741824 needs \d+ MiB at load but only "
                                                     r"\d+ MiB is available \(the largest batch that fits now is \d+\)"):
        flowedge.DiffusionPolicy.load(image_folder, batch=1 << 30)
