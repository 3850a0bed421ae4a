# Without PyTorch/LeRobot: the LeRobot tools and flowedge.lerobot end in one friendly line with the install advice
# of python/LEROBOT.md, never a raw ModuleNotFoundError traceback. Runs in a subprocess whose import system hides
# torch and lerobot, so it checks the same path whether or not they are installed here.
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import FIXTURES
from lerobot_fixture import rebuild

HIDE = textwrap.dedent("""
    import importlib.abc, sys
    class _Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "lerobot"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    for m in [m for m in sys.modules if m.split(".")[0] in ("torch", "lerobot")]:
        del sys.modules[m]
    sys.meta_path.insert(0, _Hide())
""")

ADVICE = "pip install '.[lerobot]' in the flowedge source folder"


def run_hidden(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE + textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("module, tool", [("replay", "lerobot-replay"), ("rollout", "lerobot-rollout")])
def test_tools_without_torch_exit_with_install_advice(module, tool):
    args = "['some/pretrained_model']" if module == "replay" else "['--steps', '2']"
    r = run_hidden(f"""
        from flowedge import {module}
        {module}.main({args})
    """)
    assert r.returncode == 1, r.stderr  # SystemExit with a message: status 1, the message on stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert f"flowedge: {tool}: needs LeRobot" in r.stderr and "PyTorch" in r.stderr
    assert ADVICE in r.stderr


@pytest.mark.parametrize("module", ["replay", "rollout"])
def test_tools_help_works_without_torch(module):
    r = run_hidden(f"""
        from flowedge import {module}
        {module}.main(['--help'])
    """)
    assert r.returncode == 0, r.stderr
    assert "usage: flowedge-lerobot-" in r.stdout


def test_flowedge_lerobot_import_names_the_same_advice():
    r = run_hidden("""
        try:
            import flowedge.lerobot
        except ImportError as e:
            print("IMPORT ERROR:", e)
    """)
    assert r.returncode == 0, r.stderr
    assert "IMPORT ERROR: flowedge: lerobot: needs LeRobot" in r.stdout
    assert ADVICE in r.stdout
    # the core package stays importable without them
    r = run_hidden("import flowedge; print(flowedge.__version__)")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr


# ---- --backend flowedge-policy: the whole policy in flowedge, with torch and lerobot unimportable ----

@pytest.fixture(scope="module")
def image_policy(tmp_path_factory):
    src = FIXTURES / "dp_image_bn"  # two cameras, environment state, BatchNorm, separate encoders
    if not (src / "manifest.json").is_file():
        pytest.skip(f"fixture {src} not present")
    return rebuild(src, tmp_path_factory.mktemp("dp_image_bn"))


@pytest.mark.parametrize("which", ["dp_small", "image"])
def test_rollout_flowedge_policy_runs_without_torch(which, image_policy, tmp_path):
    folder = FIXTURES / "dp_small" if which == "dp_small" else image_policy
    out, png = tmp_path / "r.json", tmp_path / "h.png"
    r = run_hidden(f"""
        import sys
        from flowedge import rollout
        rc = rollout.main(['--backend', 'flowedge-policy', '--policy', {str(folder)!r}, '--env', 'synthetic',
                           '--steps', '20', '--episodes', '2', '--period-ms', '1000', '--on-miss', 'hold', '--no-pace',
                           '--histogram', {str(png)!r}, '--output', {str(out)!r}, '--no-progress'])
        assert 'torch' not in sys.modules and 'lerobot' not in sys.modules
        sys.exit(rc)
    """)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["torch_imported"] is False and res["lerobot_imported"] is False
    assert res["steps"] == 40 and res["missed_deadlines"] == 0
    assert res["inference_ms"]["n"] == 2 * 3  # 20 ticks, n_action_steps 8: 3 chunks per episode
    assert 0 < res["p50_ms"] <= res["p99_ms"] <= res["p99_9_ms"] <= res["max_ms"]
    mem = res["memory"]
    assert mem["start"]["rss_mib"] > 0 and mem["end"]["rss_mib"] > 0
    assert mem["start"]["policy_device_bytes"] == mem["end"]["policy_device_bytes"] > 0
    assert all(e["steps"] == 20 and e["chunks"] == 3 for e in res["episodes"])
    if which == "image":
        assert sorted(res["cameras"]) == ["observation.images.top", "observation.images.wrist"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in res["histogram"]
    else:
        assert res["histogram"] == str(png) and png.stat().st_size > 0


def test_rollout_flowedge_policy_counts_misses_and_holds(tmp_path):
    out = tmp_path / "r.json"
    r = run_hidden(f"""
        import sys
        from flowedge import rollout
        sys.exit(rollout.main(['--backend', 'flowedge-policy', '--policy', {str(FIXTURES / "dp_small")!r},
                               '--steps', '16', '--period-ms', '1e-6', '--on-miss', 'hold', '--no-pace', '--warmup', '0',
                               '--output', {str(out)!r}, '--no-progress']))
    """)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["missed_deadlines"] == 16 and res["episodes"][0]["misses"] == 16


def test_replay_flowedge_policy_matches_lerobot_without_torch(image_policy, tmp_path):
    ref = FIXTURES / "dp_image_bn_ref"
    obs = {p.stem: np.load(p) for p in ref.glob("observation*.npy")}
    np.savez(tmp_path / "obs.npz", noise=np.load(ref / "noise.npy"), **obs)
    out, acts = tmp_path / "r.json", tmp_path / "a.npy"
    r = run_hidden(f"""
        import sys
        from flowedge import replay
        rc = replay.main([{str(image_policy)!r}, '--backend', 'flowedge-policy', '--obs', {str(tmp_path / "obs.npz")!r},
                          '--reference-actions', {str(ref / "actions.npy")!r}, '--actions-out', {str(acts)!r},
                          '--output', {str(out)!r}])
        assert 'torch' not in sys.modules and 'lerobot' not in sys.modules
        sys.exit(rc)
    """)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["steps"] == 20 and res["chunks"] == 3 and res["caller_noise"]
    # LeRobot's own actions; this fixture's action half-ranges are >= 0.5, so 3e-4 is within 6e-4 normalised.
    assert res["max_abs_diff_actions"] <= 3e-4, res["max_abs_diff_actions"]
    assert np.load(acts).shape == (20, 4)


# ---- ACT folders through the same tools, torch and lerobot unimportable ----

@pytest.fixture(scope="module")
def act_policy(tmp_path_factory):
    src = FIXTURES / "act_cam2"  # two 96x96 cameras, state, environment state, temporal ensembling
    if not (src / "manifest.json").is_file():
        pytest.skip(f"fixture {src} not present")
    return rebuild(src, tmp_path_factory.mktemp("act_cam2"))


def test_replay_act_folder_matches_lerobot_without_torch(act_policy, tmp_path):
    ref = FIXTURES / "act_cam2_ref"
    np.savez(tmp_path / "obs.npz", **{p.stem: np.load(p) for p in ref.glob("observation*.npy")})
    out = tmp_path / "r.json"
    r = run_hidden(f"""
        import sys
        import flowedge
        from flowedge import replay
        assert isinstance(flowedge.load_policy({str(act_policy)!r}), flowedge.ActPolicy)
        rc = replay.main([{str(act_policy)!r}, '--backend', 'flowedge-policy', '--obs', {str(tmp_path / "obs.npz")!r},
                          '--reference-actions', {str(ref / "actions.npy")!r}, '--output', {str(out)!r}])
        assert 'torch' not in sys.modules and 'lerobot' not in sys.modules
        sys.exit(rc)
    """)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["policy_type"] == "act" and res["scheduler"] is None and res["diffusion_steps"] is None
    assert res["steps"] == 12 and res["chunks"] == 12 and not res["caller_noise"]  # ensembling: a chunk every step
    # LeRobot's own actions; the smallest action std of this fixture is 0.1, so 1e-5 is within 1e-4 normalised.
    assert res["max_abs_diff_actions"] <= 1e-5, res["max_abs_diff_actions"]
    r = run_hidden(f"""
        from flowedge import replay
        replay.main([{str(act_policy)!r}, '--backend', 'flowedge-policy', '--diffusion-steps', '10'])
    """)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "flowedge: replay: --diffusion-steps is a Diffusion Policy option and" in r.stderr
    assert "holds an ACT policy (expected it unset)" in r.stderr


def test_rollout_act_folder_runs_without_torch(act_policy, tmp_path):
    out = tmp_path / "r.json"
    r = run_hidden(f"""
        import sys
        from flowedge import rollout
        rc = rollout.main(['--backend', 'flowedge-policy', '--policy', {str(act_policy)!r}, '--steps', '6',
                           '--period-ms', '0', '--warmup', '0', '--output', {str(out)!r}, '--no-progress'])
        assert 'torch' not in sys.modules and 'lerobot' not in sys.modules
        sys.exit(rc)
    """)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["policy_type"] == "act" and res["env"] == "synthetic"
    assert "not PushT's" in res["env_reason"] or "gym-pusht unavailable" in res["env_reason"]
    assert res["steps"] == 6 and res["episodes"][0]["chunks"] == 6
    r = run_hidden(f"""
        from flowedge import rollout
        rollout.main(['--backend', 'flowedge-policy', '--policy', {str(act_policy)!r}, '--device', 'cuda', '--no-progress'])
    """)
    if r.returncode != 0:  # a CUDA build on a GPU host runs it; elsewhere one line says why not
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert "no CUDA backend" in r.stderr or "not resident on the GPU" in r.stderr, r.stderr


@pytest.mark.parametrize("module, args", [("replay", "[{folder!r}]"), ("rollout", "['--policy', {folder!r}, '--backend', 'both']")])
def test_lerobot_backends_send_act_folders_to_flowedge_policy(act_policy, module, args):
    r = run_hidden(f"""
        from flowedge import {module}
        {module}.main({args.format(folder=str(act_policy))})
    """)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr  # argparse's usage error
    assert "an ACT folder" in r.stderr and "--backend flowedge-policy" in r.stderr
