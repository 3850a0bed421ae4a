# flowedge.DiffusionPolicy: the whole LeRobot policy from numpy observation dicts. dp_small (state + environment
# state, no camera) for the API and its errors; the image fixtures dp_image_gn / dp_image_bn (rebuilt here from their
# manifests) against LeRobot's own select_action episodes.
import threading

import numpy as np
import pytest

import flowedge
from conftest import FIXTURES
from lerobot_fixture import read_safetensors, rebuild


def dp_obs(t):
    return {"observation.state": np.array([100.0 + 37.0 * t, 111.0 + 37.0 * t], np.float32),
            "observation.environment_state": (0.1 * t - 0.2 * np.arange(4)).astype(np.float32)}


@pytest.fixture
def policy(dp_path):
    return flowedge.DiffusionPolicy(dp_path, steps=10, scheduler="ddim", seed=7)


def test_properties(dp_path):
    p = flowedge.DiffusionPolicy(dp_path)
    assert p.cameras == [] and p.camera_shapes == {}
    assert (p.state_key, p.state_dim) == ("observation.state", 2)
    assert (p.env_key, p.env_dim) == ("observation.environment_state", 4)
    assert (p.action_dim, p.horizon, p.n_obs_steps, p.n_action_steps) == (2, 16, 2, 8)
    assert (p.steps, p.scheduler) == (100, "ddpm")  # the checkpoint's: num_inference_steps null, DDPM
    assert p.device == p.backend == "cpu" and not p.cuda_resident and p.fallback_reason == ""
    assert p.chunks_generated == 0 and p.device_bytes > 0


def test_episode_is_deterministic_and_follows_the_queues(policy):
    def episode(seed=None):
        policy.reset(seed)
        out = []
        for t in range(20):
            out.append(policy.select_action(dp_obs(t)))
            assert policy.chunks_generated == t // 8 + 1
        return np.stack(out)

    a = episode()
    assert a.shape == (20, 2) and a.dtype == np.float32 and np.isfinite(a).all()
    np.testing.assert_array_equal(episode(), a)
    b = episode(seed=8)
    assert not np.array_equal(a, b)
    policy.reset(7)
    np.testing.assert_array_equal(np.stack([policy.select_action(dp_obs(t)) for t in range(20)]), a)


def test_caller_noise_is_used_per_chunk(policy):
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((3, 16, 2)).astype(np.float32)

    def episode(n):
        policy.reset()
        return np.stack([policy.select_action(dp_obs(t), noise=n[min(policy.chunks_generated, 2)]) for t in range(20)])

    a = episode(noise)
    np.testing.assert_array_equal(episode(noise), a)
    other = noise.copy()
    other[1] += 1.0  # only the second chunk changes
    b = episode(other)
    np.testing.assert_array_equal(a[:8], b[:8])
    assert not np.array_equal(a[8:16], b[8:16])


def test_batch_of_one_and_dtype_conversion_give_the_same_action(policy):
    policy.reset()
    a = [policy.select_action(dp_obs(t)) for t in range(3)]
    policy.reset()
    b = [policy.select_action({k: v[None].astype(np.float64) for k, v in dp_obs(t).items()}) for t in range(3)]
    np.testing.assert_array_equal(np.stack(a), np.stack(b))


def test_bad_observations_raise_value_errors_naming_the_key(policy):
    with pytest.raises(flowedge.FlowEdgeValueError, match=r"before reset\(\)"):
        policy.select_action(dp_obs(0))
    policy.reset()
    obs = dp_obs(0)
    del obs["observation.environment_state"]
    with pytest.raises(ValueError, match=r"lacks 'observation.environment_state' \(expected \[4\] float32; got keys \['observation.state'\]\)"):
        policy.select_action(obs)
    with pytest.raises(ValueError, match=r"'observation.state' has the wrong shape \(expected \[2\] or \[1, 2\], got \(3,\)\)"):
        policy.select_action({**dp_obs(0), "observation.state": np.zeros(3, np.float32)})
    with pytest.raises(flowedge.FlowEdgeError, match=r"'observation.state' element 1 is not finite"):  # a RuntimeError
        policy.select_action({**dp_obs(0), "observation.state": np.array([1.0, np.nan], np.float32)})
    with pytest.raises(TypeError, match="observation.state"):
        policy.select_action({**dp_obs(0), "observation.state": np.array(["a", "b"])})
    with pytest.raises(ValueError, match=r"noise has the wrong shape \(expected \[horizon, action_dim\] = \[16, 2\], got \(16, 3\)\)"):
        policy.select_action(dp_obs(0), noise=np.zeros((16, 3), np.float32))
    assert policy.chunks_generated == 0  # nothing above touched the queues
    policy.select_action(dp_obs(0))
    assert policy.chunks_generated == 1


def test_load_errors(dp_path, tmp_path):
    with pytest.raises(flowedge.FlowEdgeError, match="no config.json"):
        flowedge.DiffusionPolicy(tmp_path)
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        flowedge.DiffusionPolicy(dp_path, device="tpu")
    with pytest.raises(ValueError, match=r"steps out of range \(expected 1..100, got 1000\)"):
        flowedge.DiffusionPolicy(dp_path, steps=1000)
    with pytest.raises(ValueError, match="scheduler"):
        flowedge.DiffusionPolicy(dp_path, scheduler="euler")
    if not flowedge.cuda:
        with pytest.raises(flowedge.FlowEdgeError, match="no CUDA backend"):
            flowedge.DiffusionPolicy(dp_path, device="cuda")
        p = flowedge.DiffusionPolicy(dp_path, device="auto")
        assert not p.cuda_resident and "CUDA" in p.fallback_reason


def test_quantize_is_an_opt_in_load_option(dp_path):
    def episode(**kw):
        p = flowedge.DiffusionPolicy(dp_path, steps=10, scheduler="ddim", seed=7, **kw)
        p.reset()
        return np.stack([p.select_action(dp_obs(t)) for t in range(10)])

    exact = episode()
    np.testing.assert_array_equal(episode(quantize="none"), exact)
    ran = 0
    for q, needs in (("int8", "needs the AVX2 or AVX-512 kernel set"), ("w8a8", "needs the AVX2 kernel set, or the AVX-512 set on a CPU with AVX512_VNNI")):
        try:
            a = episode(quantize=q)
        except flowedge.FlowEdgeError as e:  # a CPU (or FLOWEDGE_CPU_ISA) without the INT8 kernels refuses, naming them
            assert needs in str(e)
            continue
        ran += 1
        assert np.isfinite(a).all() and not np.array_equal(a, exact)  # the weights really are INT8
        # Far inside the normalised bounds of docs/numerics.md (8e-2 / 1.5e-1 of the half-range): a sanity check of
        # the option's plumbing; the bounds themselves are tested in test/diffusion/test_parity_lerobot.cpp.
        assert np.abs(a - exact).max() <= 0.15 * np.abs(exact).max()
    with pytest.raises(ValueError, match=r"unknown quantize 'int4' \(expected None, none, int8 or w8a8\)"):
        flowedge.DiffusionPolicy(dp_path, quantize="int4")
    if ran:  # load_policy passes the option through to DiffusionPolicy
        assert flowedge.load_policy(dp_path, steps=10, quantize="int8").steps == 10


def test_gil_is_released_during_select_action(policy):
    # Two threads on two policies: both finish and each equals its single-threaded episode.
    other = flowedge.DiffusionPolicy(FIXTURES / "dp_small", steps=10, scheduler="ddim", seed=7)
    results = {}

    def run(name, p):
        p.reset()
        results[name] = np.stack([p.select_action(dp_obs(t)) for t in range(16)])

    threads = [threading.Thread(target=run, args=(n, p)) for n, p in (("a", policy), ("b", other))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.testing.assert_array_equal(results["a"], results["b"])


# ---------------------------------------------------------------- image policies vs LeRobot's own select_action

@pytest.fixture(scope="module", params=["dp_image_gn", "dp_image_bn"])
def image_fixture(request, tmp_path_factory):
    src = FIXTURES / request.param
    ref = FIXTURES / (request.param + "_ref")
    if not (src / "manifest.json").is_file() or not (ref / "actions.npy").is_file():
        pytest.skip(f"fixture {src} not present")
    return rebuild(src, tmp_path_factory.mktemp(request.param)), ref


def load_ref(ref):
    return {p.stem: np.load(p) for p in ref.glob("*.npy")}


def run_episode(p, ref, images_as="u8"):
    r = load_ref(ref)
    T = r["actions"].shape[0]
    p.reset()
    out = []
    for t in range(T):
        obs = {p.state_key: r[p.state_key][t]}
        if p.env_key:
            obs[p.env_key] = r[p.env_key][t]
        for cam in p.cameras:
            frame = r[cam][t]  # uint8 [H, W, 3]
            if images_as == "f32":
                frame = np.ascontiguousarray(frame.transpose(2, 0, 1)).astype(np.float32) / np.float32(255)
            elif images_as == "batched":
                frame = frame[None]
            obs[cam] = frame
        # the k-th chunk's noise; calls that generate no chunk ignore it
        out.append(p.select_action(obs, noise=r["noise"][min(p.chunks_generated, len(r["noise"]) - 1)]))
    return np.stack(out), r["actions"]


def test_image_policy_matches_lerobot_episode(image_fixture):
    folder, ref = image_fixture
    p = flowedge.DiffusionPolicy(folder)
    assert p.cameras and all(s[0] == 3 for s in p.camera_shapes.values())
    got, want = run_episode(p, ref)
    assert p.chunks_generated == 3
    # Issue 19's bound, 6e-4 in normalised units: LeRobot's MIN_MAX maps [min, max] to [-1, 1].
    stats = read_safetensors(folder / "policy_postprocessor_step_0_unnormalizer_processor.safetensors")
    half_range = (stats["action.max"] - stats["action.min"]) / 2
    diff = float((np.abs(got - want) / half_range).max())
    assert diff <= 6e-4, diff


def test_image_layouts_and_batch_of_one_agree(image_fixture):
    folder, ref = image_fixture
    p = flowedge.DiffusionPolicy(folder)
    u8, _ = run_episode(p, ref, "u8")
    f32, _ = run_episode(p, ref, "f32")
    batched, _ = run_episode(p, ref, "batched")
    np.testing.assert_array_equal(u8, batched)
    np.testing.assert_allclose(u8, f32, rtol=0, atol=1e-5)


def test_bad_frames_raise_value_errors_naming_the_camera(image_fixture):
    folder, ref = image_fixture
    p = flowedge.DiffusionPolicy(folder)
    r = load_ref(ref)
    obs = {p.state_key: r[p.state_key][0], **{c: r[c][0] for c in p.cameras}}
    if p.env_key:
        obs[p.env_key] = r[p.env_key][0]
    p.reset()
    cam = p.cameras[-1]
    c, h, w = p.camera_shapes[cam]
    with pytest.raises(ValueError, match=rf"lacks '{cam}' \(expected \[{h}, {w}, 3\] uint8 or \[3, {h}, {w}\] float32"):
        p.select_action({k: v for k, v in obs.items() if k != cam})
    with pytest.raises(ValueError, match=rf"'{cam}' has the wrong shape .* got uint8 \({h + 1}, {w}, 3\)"):
        p.select_action({**obs, cam: np.zeros((h + 1, w, 3), np.uint8)})
    with pytest.raises(ValueError, match=rf"'{cam}' has the wrong shape .* got uint8 \({h}, {w}, 4\)"):
        p.select_action({**obs, cam: np.zeros((h, w, 4), np.uint8)})
    with pytest.raises(ValueError, match=rf"'{cam}' has dtype int32"):
        p.select_action({**obs, cam: np.zeros((h, w, 3), np.int32)})
    bad = np.full((3, h, w), 0.5, np.float32)
    bad[1, 2, 3] = np.inf
    with pytest.raises(flowedge.FlowEdgeError, match=rf"'{cam}': pixel value .* is not finite"):
        p.select_action({**obs, cam: bad})
    assert p.chunks_generated == 0
    p.select_action(obs)
    assert p.chunks_generated == 1
