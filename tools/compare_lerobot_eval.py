#!/usr/bin/env python3
"""flowedge-lerobot-eval against LeRobot's own lerobot-eval code path, on the same seeds and the same initial noise.

Runs flowedge-lerobot-eval (the whole policy in flowedge, numpy observations) in a process of its own, then LeRobot
0.4.4's ``lerobot.scripts.lerobot_eval.eval_policy`` with LeRobot's policy, processors and env factory as ``eval_main``
sets them up, here, with the same --threads. Only LeRobot's noise source is patched: its
``DiffusionModel.conditional_sample`` gets ``noise=`` for batch element e, chunk k equal to flowedge's seeded draw
(SplitMix64 stream ``batch_seed + (e << 32) + 2k``, tools/splitmix_noise.py; batch_seed = seed + b * batch_size, the
seed flowedge's batched policy is reset with). Without that patch the two could only agree statistically.

Reports per episode: both sum/max rewards and success, the episode lengths, the max abs action difference, the
first step where the actions differ by more than --tol and the difference in the first chunk (numerics alone,
before the environment feeds differences back); episodes per second of each side (eval_s as eval_policy measures
it). Needs LeRobot + torch + the env package (the reference venv) and flowedge importable.

    tools/compare_lerobot_eval.py --policy.path=/tmp/dp_pusht_image --env.type=pusht --eval.batch_size=5 \
        --eval.n_episodes=10 --env.episode_length=100 --policy.device=cpu --threads 2 \
        --report bench/results/lerobot_eval_cpu
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from splitmix_noise import stream_normals  # noqa: E402

from flowedge import lerobot_eval as fe  # noqa: E402


def parse():
    ap = fe.build_parser()
    ap.prog = "tools/compare_lerobot_eval.py"
    ap.add_argument("--tol", type=float, default=1e-3,
                    help="action difference in normalised units (robot units / action_scale) that counts as diverged "
                         "(default 1e-3; 10-step DDIM parity of one chunk is 6e-4, docs/numerics.md)")
    ap.add_argument("--report", default=None, help="write <report>.json and <report>.md")
    args = fe.parse_args(sys.argv[1:], ap)
    if args.device == "auto":
        args.device = "cpu"  # both sides must run on one named device
    return args


def run_flowedge(args, work: Path) -> Dict[str, Any]:
    """flowedge-lerobot-eval in its own process, as users run it: no torch imported (importing torch into the
    process made flowedge's CPU chunk 5x slower on the 2-core machine, bench/results/lerobot_eval_cpu.md)."""
    cmd = [sys.executable, "-m", "flowedge.lerobot_eval", f"--policy.path={args.policy_path}",
           f"--policy.device={args.device}", f"--env.type={args.env_type}", f"--eval.batch_size={args.batch_size}",
           f"--eval.n_episodes={args.n_episodes}", f"--seed={args.seed}", f"--output_dir={work}",
           "--max-render-videos=0", "--no-progress", f"--save-actions={work / 'actions.npz'}"]
    for flag, v in (("--env.task", args.env_task), ("--env.episode_length", args.episode_length),
                    ("--policy.noise_scheduler_type", args.scheduler), ("--policy.num_inference_steps", args.steps),
                    ("--threads", args.threads)):
        if v is not None:
            cmd.append(f"{flag}={v}")
    t0, r0 = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True)
    wall, r1 = time.time() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    info = json.loads((work / "eval_info.json").read_text())
    with np.load(work / "actions.npz") as z:
        actions = [z[f"ep_{i}"] for i in range(args.n_episodes)]
    return {"info": info, "actions": actions, "command": " ".join(cmd), "wall_s": wall,
            "cpu_s": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)}


def run_lerobot(args) -> Dict[str, Any]:
    """lerobot_eval.eval_main's set-up and eval_policy call, with the noise patch and an action recorder."""
    import torch
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.envs.configs import EnvConfig
    from lerobot.envs.factory import make_env, make_env_pre_post_processors
    from lerobot.policies.factory import make_policy, make_pre_post_processors
    from lerobot.scripts.lerobot_eval import eval_policy
    from lerobot.utils.random_utils import set_seed

    if args.device == "cuda":  # flowedge's parity rule (docs/numerics.md): float32 with TF32 off
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    set_seed(args.seed)
    env_kwargs = {k: v for k, v in (("task", args.env_task), ("episode_length", args.episode_length)) if v}
    env_cfg = EnvConfig.get_choice_class(args.env_type)(**env_kwargs)
    vec = make_env(env_cfg, n_envs=args.batch_size)[args.env_type][0]
    cfg = PreTrainedConfig.from_pretrained(args.policy_path)
    cfg.pretrained_path = args.policy_path
    cfg.device = args.device
    if args.scheduler:
        cfg.noise_scheduler_type = args.scheduler.upper()
    if args.steps:
        cfg.num_inference_steps = args.steps
    policy = make_policy(cfg=cfg, env_cfg=env_cfg)
    policy.eval()
    pre, post = make_pre_post_processors(policy_cfg=cfg, pretrained_path=args.policy_path,
                                         preprocessor_overrides={"device_processor": {"device": args.device}})
    env_pre, env_post = make_env_pre_post_processors(env_cfg=env_cfg, policy_cfg=cfg)

    state = {"batch": -1, "chunk": 0}
    horizon, action_dim = cfg.horizon, cfg.action_feature.shape[0]
    model = policy.diffusion
    original_sample, original_reset = model.conditional_sample, policy.reset

    def reset():  # eval_policy's rollout resets the policy once per batch, before env.reset(seed=seeds)
        state["batch"] += 1
        state["chunk"] = 0
        original_reset()

    def conditional_sample(batch_size, global_cond=None, generator=None, noise=None):
        base = args.seed + state["batch"] * args.batch_size
        k = state["chunk"]
        state["chunk"] += 1
        z = np.stack([stream_normals((base + (e << 32) + 2 * k) & fe.SEED_MASK, horizon * action_dim)
                      .reshape(horizon, action_dim) for e in range(batch_size)])
        p = next(model.parameters())
        return original_sample(batch_size, global_cond=global_cond, generator=generator,
                               noise=torch.from_numpy(z).to(device=p.device, dtype=p.dtype))

    policy.reset = reset
    model.conditional_sample = conditional_sample

    steps: List[np.ndarray] = []
    original_step = vec.step

    def step(action):
        steps.append(np.array(action, np.float32, copy=True))
        return original_step(action)

    vec.step = step
    with torch.no_grad():
        info = eval_policy(env=vec, policy=policy, env_preprocessor=env_pre, env_postprocessor=env_post,
                           preprocessor=pre, postprocessor=post, n_episodes=args.n_episodes, max_episodes_rendered=0,
                           videos_dir=None, start_seed=args.seed)
    vec.close()
    return {"info": info, "steps": steps}


def action_scale(folder: str) -> np.ndarray:
    """Robot units per normalised unit of each action element: (max - min) / 2 for MIN_MAX, std for MEAN_STD, from the
    postprocessor's statistics (ones when it has none)."""
    from flowedge.policy_loop import read_safetensors_floats

    for name in sorted(os.listdir(folder)):
        if name.startswith("policy_postprocessor") and name.endswith(".safetensors"):
            st = read_safetensors_floats(os.path.join(folder, name))
            if "action.min" in st and "action.max" in st:
                return ((st["action.max"] - st["action.min"]) / 2).reshape(-1)
            if "action.std" in st:
                return st["action.std"].reshape(-1)
    return np.ones(1, np.float32)


def split_lerobot_actions(steps: List[np.ndarray], batch: int, batch_steps: List[int]) -> List[np.ndarray]:
    """LeRobot's recorded [N, A] step actions cut into batches of ``batch_steps`` steps, then per episode."""
    out, i = [], 0
    for t in batch_steps:
        block = np.stack(steps[i:i + t], 1)  # [N, T_b, A]
        i += t
        out += [block[e] for e in range(batch)]
    return out


def main() -> int:
    args = parse()
    import tempfile

    from flowedge.replay import cpu_name, versions

    with tempfile.TemporaryDirectory(prefix="flowedge-eval-") as tmp:
        f = run_flowedge(args, Path(tmp))
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    t0, c0 = time.time(), time.process_time()
    lr = run_lerobot(args)
    l_wall, l_cpu = time.time() - t0, time.process_time() - c0

    fi = {"per_episode": f["info"]["per_episode"], "aggregated": f["info"]["overall"],
          "episode_steps": f["info"]["flowedge"]["episode_steps"]}
    li = lr["info"]
    n = args.n_episodes
    n_batches = -(-n // args.batch_size)
    # Batch b ran max(steps of its episodes) lockstep steps on both sides when their episode lengths agree; LeRobot's
    # recorder saw every step, so cut it by the flowedge batch lengths and check the total.
    f_lengths = fi["episode_steps"] + [0] * (n_batches * args.batch_size - n)
    batch_steps = [max(f_lengths[b * args.batch_size:(b + 1) * args.batch_size]) for b in range(n_batches)]
    rows = []
    l_eps = (split_lerobot_actions(lr["steps"], args.batch_size, batch_steps) if sum(batch_steps) == len(lr["steps"])
             else None)
    horizon_exec = None
    try:
        cfg = json.loads((Path(args.policy_path) / "config.json").read_text())
        horizon_exec = int(cfg.get("n_action_steps", 0)) or None
    except (OSError, ValueError):
        pass
    scale = action_scale(args.policy_path)
    agree = 0
    for i in range(n):
        pf, pl = fi["per_episode"][i], li["per_episode"][i]
        row = {"episode_ix": i, "seed": pf["seed"], "lerobot_seed": pl["seed"],
               "flowedge": {k: pf[k] for k in ("sum_reward", "max_reward", "success")},
               "lerobot": {k: pl[k] for k in ("sum_reward", "max_reward", "success")}}
        if l_eps is not None:
            a_f = f["actions"][i]
            a_l = l_eps[i][:len(a_f)]
            d = (np.abs(a_f - a_l) / scale).max(axis=1)
            over = np.nonzero(d > args.tol)[0]
            row.update({"steps": len(a_f), "max_abs_action_diff_normalised": float(d.max()),
                        "max_abs_action_diff_robot_units": float(np.abs(a_f - a_l).max()),
                        "first_chunk_max_abs_diff_normalised": float(d[:horizon_exec].max()) if horizon_exec else None,
                        "first_step_over_tol": int(over[0]) if over.size else None})
            same = over.size == 0 and pf["success"] == pl["success"]
            agree += int(same)
            row["agree_step_for_step"] = same
        rows.append(row)
    lo, fo = li["aggregated"], fi["aggregated"]
    result = {
        "tool": "tools/compare_lerobot_eval.py", "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=Path(__file__).resolve().parent).stdout.strip(),
        "cpu": cpu_name(), "nproc": os.cpu_count(), "threads": args.threads, "device": args.device,
        "load_average_1m": round(os.getloadavg()[0], 2), "policy_path": args.policy_path, "env_type": args.env_type,
        "episode_length": args.episode_length, "batch_size": args.batch_size, "n_episodes": n, "seed": args.seed,
        "scheduler": args.scheduler, "num_inference_steps": args.steps, "tol_normalised": args.tol,
        "action_scale": scale.tolist(),
        "flowedge_batched_policy": f["info"]["flowedge"]["batched_policy"],
        "flowedge_backend": f["info"]["flowedge"]["backend"], "flowedge_command": f["command"],
        "lerobot_steps_recorded": len(lr["steps"]), "flowedge_batch_steps": batch_steps,
        "episodes_agree_step_for_step": agree if l_eps is not None else None,
        "flowedge": {k: fo[k] for k in ("pc_success", "avg_sum_reward", "avg_max_reward", "eval_s", "eval_ep_s")}
        | {"episodes_per_s": n / fo["eval_s"], "wall_s_with_load": f["wall_s"], "cpu_s_with_load": f["cpu_s"]},
        "lerobot": {k: lo[k] for k in ("pc_success", "avg_sum_reward", "avg_max_reward", "eval_s", "eval_ep_s")}
        | {"episodes_per_s": n / lo["eval_s"], "wall_s_with_load": l_wall, "cpu_s_with_load": l_cpu},
        "per_episode": rows, "versions": versions(),
    }
    text = json.dumps(result, indent=1)
    if args.report:
        Path(args.report + ".json").parent.mkdir(parents=True, exist_ok=True)
        Path(args.report + ".json").write_text(text + "\n")
        Path(args.report + ".md").write_text(markdown(result, " ".join(sys.argv)) + "\n")
    print(text)
    return 0


def markdown(r: Dict[str, Any], command: str) -> str:
    fl, lr = r["flowedge"], r["lerobot"]
    lines = [f"# flowedge-lerobot-eval vs lerobot-eval ({r['env_type']}, {r['device']})", "",
             f"{r['date_utc']} UTC, commit {r['commit']}, {r['cpu']} ({r['nproc']} cores), threads {r['threads']}, "
             f"load average {r['load_average_1m']}; policy {r['policy_path']}; {r['n_episodes']} episodes, batch "
             f"{r['batch_size']}, seed {r['seed']}, episode_length {r['episode_length']}.", "",
             f"    {command}", "", "flowedge side, run by it:", "", f"    {r['flowedge_command']}", "",
             "| | flowedge-lerobot-eval | LeRobot eval_policy |", "|---|---|---|"]
    for k in ("pc_success", "avg_sum_reward", "avg_max_reward", "eval_s", "eval_ep_s", "episodes_per_s",
              "wall_s_with_load", "cpu_s_with_load"):
        lines.append(f"| {k} | {fl[k]:.4g} | {lr[k]:.4g} |")
    lines += ["", f"Episodes that agree step for step (every action within {r['tol_normalised']} normalised units, i.e. "
              f"robot units / {r['action_scale']}, and the same success): "
              f"{r['episodes_agree_step_for_step']} of {r['n_episodes']}.", "",
              "| ep | seed | steps | sum reward flowedge / LeRobot | success | max abs action diff (normalised) | "
              "first chunk diff (normalised) | first step over tol |", "|---|---|---|---|---|---|---|---|"]
    for row in r["per_episode"]:
        f, lo = row["flowedge"], row["lerobot"]
        lines.append(f"| {row['episode_ix']} | {row['seed']} | {row.get('steps')} | {f['sum_reward']:.4f} / "
                     f"{lo['sum_reward']:.4f} | {f['success']} / {lo['success']} | {row.get('max_abs_action_diff_normalised', 0):.3g} | "
                     f"{row.get('first_chunk_max_abs_diff_normalised') or 0:.3g} | {row.get('first_step_over_tol')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
