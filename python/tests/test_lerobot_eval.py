# flowedge-lerobot-eval (flowedge.lerobot_eval): LeRobot's episode masking and observation mapping in numpy, the
# per-environment batched-policy adapter against separately seeded policies (dp_small), flag errors, and, when
# gym-pusht is installed, a short PushT evaluation with a PushT-shaped image policy (dp_image_gn with its camera
# declared 3x96x96: the eval-mode center crop to 32x40 keeps the encoder's feature map, so the weights fit).
import json
import subprocess
import sys

import numpy as np
import pytest

import flowedge
from conftest import FIXTURES
from flowedge import lerobot_eval as le
from flowedge.rollout import gym_pusht_available
from lerobot_fixture import rebuild


def run_tool(*flags, timeout=300):
    return subprocess.run([sys.executable, "-m", "flowedge.lerobot_eval", *flags], capture_output=True, text=True,
                          timeout=timeout)


def test_episode_results_use_lerobots_mask():
    # env 0 is done at step 1, so steps 0..2 count (LeRobot keeps one step past the first done); env 1 never
    # finishes before the limit, whose last step counts as done.
    r = {"reward": np.array([[1.0, 2.0, 4.0, 8.0], [0.5, 0.0, 0.25, 0.0]]),
         "success": np.array([[False, True, False, False], [False, False, False, True]]),
         "done": np.array([[False, True, True, True], [False, False, False, True]])}
    ep = le.episode_results(r)
    assert ep["done_index"].tolist() == [1, 3]
    assert ep["sum_reward"].tolist() == [7.0, 0.75]
    assert ep["max_reward"].tolist() == [4.0, 0.5]
    assert ep["success"].tolist() == [True, True]
    r["success"][0] = [False, False, False, True]  # success reported after the mask ends does not count
    assert le.episode_results(r)["success"].tolist() == [False, True]


def test_policy_observation_maps_gym_keys_like_lerobot():
    obs = {"pixels": {"top": np.zeros((2, 4, 5, 3), np.uint8)}, "agent_pos": np.ones((2, 3), np.float64),
           "environment_state": np.zeros((2, 4), np.float64)}
    out = le.policy_observation(obs)
    assert sorted(out) == ["observation.environment_state", "observation.images.top", "observation.state"]
    assert out["observation.state"].dtype == np.float32 and out["observation.images.top"].dtype == np.uint8
    single = le.policy_observation({"pixels": np.zeros((2, 4, 5, 3), np.uint8)})
    assert list(single) == ["observation.image"]


def compare_with_separately_seeded_policies(batched, exact):
    """Ten ticks of ``batched`` (2 environments, dp_small) against two batch-1 policies seeded by the batched rule
    seed + (e << 32). The per-env adapter must agree bit for bit; the native batched policy runs its GEMMs over two
    rows at once, so its sums round differently (LeRobot's own batched eval has the same property): it must agree
    to 1e-3 on actions of size ~500, i.e. ~2e-6 of the normalised range."""
    folder = FIXTURES / "dp_small"
    assert batched.batch == 2 and batched.action_dim == 2
    singles = [flowedge.DiffusionPolicy(folder, steps=10, scheduler="ddim") for _ in range(2)]
    seed = 12
    batched.reset(seed)
    for e, p in enumerate(singles):
        p.reset(seed + (e << 32))
    rng = np.random.default_rng(0)
    for _ in range(10):  # more than n_action_steps ticks: a second chunk is sampled from each env's own queue
        obs = {"observation.state": rng.standard_normal((2, 2)).astype(np.float32),
               "observation.environment_state": rng.standard_normal((2, 4)).astype(np.float32)}
        got = batched.select_action_batch(obs)
        want = np.stack([p.select_action({k: v[e] for k, v in obs.items()}) for e, p in enumerate(singles)])
        assert got.dtype == np.float32 and got.shape == (2, 2)
        if exact:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)
    assert not np.allclose(got[0], got[1])  # the two envs draw different noise


def test_per_env_adapter_matches_separately_seeded_policies():
    folder = FIXTURES / "dp_small"
    adapter = le.PerEnvPolicies([flowedge.DiffusionPolicy(folder, steps=10, scheduler="ddim") for _ in range(2)])
    compare_with_separately_seeded_policies(adapter, exact=True)


def test_native_batched_policy_matches_separately_seeded_policies():
    batched = le.load_batched_policy(str(FIXTURES / "dp_small"), 2, device="cpu", steps=10, scheduler="ddim")
    assert isinstance(batched, flowedge.DiffusionPolicy)  # this build has the native batched path
    compare_with_separately_seeded_policies(batched, exact=False)


def test_batched_policy_passes_dtype_and_quantize_through():
    folder = str(FIXTURES / "dp_small")
    obs = {"observation.state": np.full((2, 2), 300.0, np.float32), "observation.environment_state": np.zeros((2, 4), np.float32)}

    def first_actions(**kw):
        p = le.load_batched_policy(folder, 2, device="cpu", steps=10, scheduler="ddim", **kw)
        p.reset(3)
        return p.select_action_batch(obs)

    exact = first_actions()
    assert not np.array_equal(first_actions(dtype="bf16"), exact)
    try:
        q = first_actions(quantize="int8")
    except flowedge.FlowEdgeError as e:  # a kernel set without INT8 kernels refuses, naming them
        assert "needs the AVX2 or AVX-512 kernel set" in str(e)
    else:
        assert not np.array_equal(q, exact)


def test_unknown_flag_is_an_error():
    r = run_tool("--policy.path=x", "--eval.bogus=3", timeout=60)
    assert r.returncode == 2
    assert "unknown flag(s) --eval.bogus=3" in r.stderr


def test_batch_larger_than_episodes_is_an_error():
    r = run_tool("--policy.path=x", "--eval.batch_size=4", "--eval.n_episodes=2", timeout=60)
    assert r.returncode == 2 and "must not exceed --eval.n_episodes (got 4 > 2)" in r.stderr


@pytest.fixture(scope="module")
def pusht_policy(tmp_path_factory):
    missing = gym_pusht_available()
    if missing:
        pytest.skip(f"gym-pusht not installed ({missing})")
    out = rebuild(FIXTURES / "dp_image_gn", tmp_path_factory.mktemp("dp_pusht_small"))
    cfg = json.loads((out / "config.json").read_text())
    cfg["input_features"]["observation.image"]["shape"] = [3, 96, 96]
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_pusht_eval_writes_lerobots_eval_info(pusht_policy, tmp_path):
    out = tmp_path / "eval"
    r = run_tool(f"--policy.path={pusht_policy}", "--env.type=pusht", "--eval.batch_size=2", "--eval.n_episodes=4",
                 "--env.episode_length=12", "--seed=7", "--policy.device=cpu", "--threads=1", f"--output_dir={out}",
                 "--max-render-videos=0", "--no-progress", f"--save-actions={tmp_path / 'a.npz'}")
    assert r.returncode == 0, r.stderr
    info = json.loads((out / "eval_info.json").read_text())
    assert sorted(info) == ["flowedge", "overall", "per_episode", "per_group", "per_task"]
    metrics = info["per_task"][0]["metrics"]
    assert info["per_task"][0]["task_group"] == "pusht"
    assert sorted(metrics) == ["max_rewards", "successes", "sum_rewards", "video_paths"]
    o = info["overall"]
    assert o["n_episodes"] == 4 and set(o) >= {"avg_sum_reward", "avg_max_reward", "pc_success", "eval_s", "eval_ep_s"}
    assert o["avg_sum_reward"] == pytest.approx(np.mean(metrics["sum_rewards"]))
    assert o["avg_max_reward"] == pytest.approx(np.mean(metrics["max_rewards"]))
    assert o["pc_success"] == pytest.approx(100 * np.mean(metrics["successes"]))
    assert o["eval_ep_s"] == pytest.approx(o["eval_s"] / 4)
    assert info["per_group"]["pusht"]["pc_success"] == o["pc_success"]
    assert [e["seed"] for e in info["per_episode"]] == [7, 8, 9, 10]
    assert [e["sum_reward"] for e in info["per_episode"]] == metrics["sum_rewards"]
    assert all(0 <= e["max_reward"] <= max(e["sum_reward"], 0) + 1e-12 for e in info["per_episode"])
    fl = info["flowedge"]
    assert fl["episode_steps"] == [12, 12, 12, 12]  # a random policy does not finish PushT in 12 steps
    assert fl["torch_imported"] is False and fl["lerobot_imported"] is False
    assert (fl["dtype"], fl["quantize"]) == ("f32", "none")
    with np.load(tmp_path / "a.npz") as z:
        assert sorted(z.files) == ["ep_0", "ep_1", "ep_2", "ep_3"] and z["ep_0"].shape == (12, 2)
        assert not np.array_equal(z["ep_0"], z["ep_2"])  # batches are seeded apart
    # The same seed gives the same episodes.
    again = tmp_path / "again"
    r = run_tool(f"--policy.path={pusht_policy}", "--eval.batch_size=2", "--eval.n_episodes=4", "--env.episode_length=12",
                 "--seed=7", "--policy.device=cpu", "--threads=1", f"--output_dir={again}", "--max-render-videos=0",
                 "--no-progress")
    assert r.returncode == 0, r.stderr
    assert json.loads((again / "eval_info.json").read_text())["per_task"] == info["per_task"]
