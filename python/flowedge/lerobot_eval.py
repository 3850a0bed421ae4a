"""flowedge-lerobot-eval: LeRobot's ``lerobot-eval`` with the whole policy in flowedge (no torch, no lerobot imported).

Same flags for the common case (``--policy.path``, ``--env.type``, ``--eval.batch_size``, ``--eval.n_episodes``,
``--seed``, ``--output_dir``, ``--policy.device``) and the same loop as LeRobot 0.4.4's ``lerobot_eval.rollout`` /
``eval_policy``: episodes run in batches of ``batch_size`` environments of one gymnasium ``SyncVectorEnv``
(autoreset SAME_STEP, as LeRobot's env factory makes it); batch b resets its environments with seeds
``seed + b*batch_size + e``, steps all of them in lockstep until every one is done or ``max_episode_steps`` is
reached, and an environment that finished keeps being stepped (its results are masked off). Per episode: the reward
sum and max over the steps up to one past the first ``done`` (LeRobot's mask), success when ``final_info`` reported
``is_success`` inside that mask, and the seed. ``eval_info.json`` in ``--output_dir`` has LeRobot's layout
(``per_task`` / ``per_group`` / ``overall``) and field names; flowedge adds a ``flowedge`` block (device, threads,
policy path, versions).

The policy is one *batched policy* object: ``reset(seed)`` at each batch start and ``select_action_batch(obs)`` with
numpy arrays ``[N, ...]`` per LeRobot feature key (uint8 HWC frames, float32 states) returning float32
``[N, action_dim]``. A Diffusion Policy's environment e draws its noise from seed ``seed + (e << 32)`` (docs/models.md
#seeded-noise: chunk k of that environment is SplitMix stream ``seed + (e << 32) + 2k``); tools/compare_lerobot_eval.py
gives LeRobot the same noise.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

SEED_MASK = (1 << 64) - 1

# LeRobot 0.4.4's EnvConfig subclasses (lerobot/envs/configs.py) for the gym environments its factory makes with
# gym.make("<package>/<task>", **gym_kwargs): package, default task, episode_length (-> max_episode_steps), fps and
# the remaining gym keyword arguments.
ENV_TYPES: Dict[str, Dict[str, Any]] = {
    "pusht": {"package": "gym_pusht", "task": "PushT-v0", "episode_length": 300, "fps": 10,
              "kwargs": {"obs_type": "pixels_agent_pos", "render_mode": "rgb_array", "visualization_width": 384,
                         "visualization_height": 384}},
    "aloha": {"package": "gym_aloha", "task": "AlohaInsertion-v0", "episode_length": 400, "fps": 50,
              "kwargs": {"obs_type": "pixels_agent_pos", "render_mode": "rgb_array"}},
}


# ----------------------------------------------------------------------------------------------------------------
# Environments
# ----------------------------------------------------------------------------------------------------------------

def make_vector_env(env_type: str, n_envs: int, task: Optional[str] = None, episode_length: Optional[int] = None):
    """gymnasium SyncVectorEnv of ``n_envs`` copies of the env type, as ``lerobot.envs.factory.make_env`` builds it."""
    spec = ENV_TYPES[env_type]
    try:
        import gymnasium as gym

        importlib.import_module(spec["package"])  # registers "<package>/<task>"
    except ImportError as e:
        raise SystemExit(f"flowedge: lerobot-eval: --env.type={env_type} needs gymnasium and {spec['package']} "
                         f"(pip install {spec['package'].replace('_', '-')}): {e}") from None
    gym_id = f"{spec['package']}/{task or spec['task']}"
    kwargs = dict(spec["kwargs"], max_episode_steps=episode_length or spec["episode_length"])

    def make_one():
        return gym.make(gym_id, disable_env_checker=True, **kwargs)

    return gym.vector.SyncVectorEnv([make_one for _ in range(n_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def policy_observation(obs: Mapping[str, Any]) -> Dict[str, np.ndarray]:
    """A vector env's observation as policy inputs keyed by LeRobot feature name (the numpy twin of
    ``lerobot.envs.utils.preprocess_observation``, frames kept uint8 [N, H, W, 3]): ``pixels`` -> observation.image,
    ``pixels[name]`` -> observation.images.<name>, ``environment_state`` -> observation.environment_state,
    ``agent_pos`` -> observation.state."""
    out: Dict[str, np.ndarray] = {}
    pixels = obs.get("pixels")
    if isinstance(pixels, Mapping):
        for name, img in pixels.items():
            out[f"observation.images.{name}"] = np.ascontiguousarray(img, dtype=np.uint8)
    elif pixels is not None:
        out["observation.image"] = np.ascontiguousarray(pixels, dtype=np.uint8)
    if "environment_state" in obs:
        out["observation.environment_state"] = np.ascontiguousarray(obs["environment_state"], dtype=np.float32)
    if "agent_pos" in obs:
        out["observation.state"] = np.ascontiguousarray(obs["agent_pos"], dtype=np.float32)
    return out


# ----------------------------------------------------------------------------------------------------------------
# Batched policy
# ----------------------------------------------------------------------------------------------------------------

class PerEnvPolicies:
    """The batched-policy interface over N batch-1 flowedge policies, one per environment, each with its own
    observation and action queues. ``reset(seed)`` gives environment e the noise seed ``seed + (e << 32)``, the
    native batched DiffusionPolicy's rule; ActPolicy, which draws no noise, ignores it."""

    def __init__(self, policies: Sequence[Any]):
        self.policies = list(policies)
        self.batch = len(self.policies)
        first = self.policies[0]
        self.action_dim = first.action_dim

    def __getattr__(self, name: str):  # feature properties (camera_shapes, state_dim, backend, ...) of the first
        return getattr(self.policies[0], name)

    def reset(self, seed: Optional[int] = None, env: Optional[int] = None) -> None:
        targets = range(self.batch) if env is None else [env]
        for e in targets:
            self.policies[e].reset(None if seed is None else (seed + (e << 32)) & SEED_MASK)

    def select_action_batch(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        out = np.empty((self.batch, self.action_dim), np.float32)
        for e, p in enumerate(self.policies):
            out[e] = p.select_action({k: v[e] for k, v in obs.items()})
        return out


def load_batched_policy(folder: str, batch: int, *, device: str, steps: Optional[int], scheduler: Optional[str],
                        dtype: Optional[str] = None, quantize: Optional[str] = None):
    """The batched policy for ``batch`` environments: the native batched DiffusionPolicy when this flowedge has one
    (``DiffusionPolicy.load(..., batch=N)`` with ``select_action_batch``), else :class:`PerEnvPolicies` (always for
    ACT, which has no batched form)."""
    import flowedge
    from .policy_loop import load_whole_policy

    native = flowedge.policy_type(folder) != "act" and hasattr(flowedge.DiffusionPolicy, "select_action_batch")
    if native:
        return flowedge.DiffusionPolicy.load(folder, device=device, batch=batch, steps=steps, scheduler=scheduler,
                                             dtype=dtype, quantize=quantize)
    return PerEnvPolicies([load_whole_policy(folder, device=device, dtype=dtype, steps=steps, scheduler=scheduler,
                                             seed=0, tool="lerobot-eval", quantize=quantize) for _ in range(batch)])


# ----------------------------------------------------------------------------------------------------------------
# Rollout and evaluation (LeRobot's rollout / eval_policy, numpy)
# ----------------------------------------------------------------------------------------------------------------

def rollout(env, policy, seeds: List[int], render: Optional[Callable[[Any], None]] = None) -> Dict[str, np.ndarray]:
    """One batch: reset every environment with ``seeds``, step them together until all are done or the step limit.
    Returns reward / success / done [N, T] (done cumulative; the last step counts as done) and action [N, T, A]."""
    policy.reset(seeds[0])
    obs, _ = env.reset(seed=seeds)
    if render is not None:
        render(env)
    n = env.num_envs
    max_steps = env.call("_max_episode_steps")[0]
    done = np.zeros(n, bool)
    actions, rewards, successes, dones = [], [], [], []
    step = 0
    while not done.all() and step < max_steps:
        action = policy.select_action_batch(policy_observation(obs))
        obs, reward, terminated, truncated, info = env.step(action)
        if render is not None:
            render(env)
        final = info.get("final_info")
        success = np.asarray(final["is_success"], bool) if final is not None else np.zeros(n, bool)
        done = terminated | truncated | done
        if step + 1 == max_steps:
            done = np.ones(n, bool)
        actions.append(action)
        rewards.append(np.asarray(reward, np.float64))
        successes.append(success)
        dones.append(done.copy())
        step += 1
    return {"action": np.stack(actions, 1), "reward": np.stack(rewards, 1), "success": np.stack(successes, 1),
            "done": np.stack(dones, 1)}


def episode_results(r: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Per-episode sum/max reward and success over steps 0..first done + 1 (LeRobot's mask, which keeps one step
    past the end), and the index of that first done."""
    n_steps = r["done"].shape[1]
    done_ix = np.argmax(r["done"].astype(int), axis=1)
    mask = np.arange(n_steps)[None, :] <= (done_ix + 1)[:, None]
    masked = r["reward"] * mask
    return {"sum_reward": masked.sum(1), "max_reward": masked.max(1), "success": (r["success"] & mask).any(1),
            "done_index": done_ix}


class VideoWriter:
    """Frames of the first ``max_videos`` episodes, written as eval_episode_<i>.mp4 by imageio in threads (LeRobot's
    names and fps); ``skipped`` holds the reason when nothing can be written."""

    def __init__(self, max_videos: int, videos_dir: Path, fps: int):
        self.max_videos, self.videos_dir, self.fps = max_videos, videos_dir, fps
        self.paths: List[str] = []
        self.threads: List[threading.Thread] = []
        self.frames: List[np.ndarray] = []
        self.skipped: Optional[str] = None
        if max_videos > 0:
            try:
                import imageio  # noqa: F401
            except ImportError as e:
                self.skipped = f"imageio not installed ({e}); pip install imageio imageio-ffmpeg"

    @property
    def active(self) -> bool:
        return self.max_videos > len(self.paths) and self.skipped is None

    def render(self, env) -> None:
        n = min(self.max_videos - len(self.paths), env.num_envs)
        self.frames.append(np.stack([env.envs[i].render() for i in range(n)]))

    def finish_batch(self, done_index: np.ndarray) -> None:
        import imageio

        if not self.frames:
            return
        stacked = np.stack(self.frames, axis=1)  # [n, T + 1, H, W, 3]
        self.frames = []
        self.videos_dir.mkdir(parents=True, exist_ok=True)
        for frames, last in zip(stacked, done_index.tolist()):
            if len(self.paths) >= self.max_videos:
                break
            path = self.videos_dir / f"eval_episode_{len(self.paths)}.mp4"
            self.paths.append(str(path))
            t = threading.Thread(target=imageio.mimsave, args=(str(path), frames[:last + 1]), kwargs={"fps": self.fps})
            t.start()
            self.threads.append(t)

    def join(self) -> None:
        for t in self.threads:
            t.join()


def eval_policy(env, policy, n_episodes: int, start_seed: int, videos: Optional[VideoWriter] = None,
                progress=None, on_batch: Optional[Callable[[Dict[str, np.ndarray], Dict[str, np.ndarray]], None]] = None
                ) -> Dict[str, Any]:
    """LeRobot's eval_policy on a batched policy: ceil(n_episodes / N) batches, per-episode rows and the aggregate.
    ``on_batch(rollout, episode_results)`` sees each batch's arrays (the comparison tool keeps the actions)."""
    start = time.time()
    n = env.num_envs
    n_batches = -(-n_episodes // n)
    sums: List[float] = []
    maxes: List[float] = []
    succ: List[bool] = []
    seeds: List[int] = []
    steps: List[int] = []
    for b in range(n_batches):
        batch_seeds = list(range(start_seed + b * n, start_seed + (b + 1) * n))
        render = videos.render if videos is not None and videos.active else None
        r = rollout(env, policy, batch_seeds, render=render)
        ep = episode_results(r)
        if on_batch is not None:
            on_batch(r, ep)
        sums += ep["sum_reward"].tolist()
        maxes += ep["max_reward"].tolist()
        succ += ep["success"].tolist()
        seeds += batch_seeds
        steps += (ep["done_index"] + 1).tolist()
        if render is not None:
            videos.finish_batch(ep["done_index"])
        if progress is not None:
            progress.update(1, f"success {100.0 * np.mean(succ[:n_episodes]):.1f}%")
    if videos is not None:
        videos.join()
    eval_s = time.time() - start
    per_episode = [{"episode_ix": i, "sum_reward": s, "max_reward": m, "success": bool(x), "seed": sd}
                   for i, (s, m, x, sd) in enumerate(zip(sums, maxes, succ, seeds))][:n_episodes]
    return {"per_episode": per_episode, "episode_steps": steps[:n_episodes],
            "aggregated": {"avg_sum_reward": float(np.nanmean(sums[:n_episodes])),
                           "avg_max_reward": float(np.nanmean(maxes[:n_episodes])),
                           "pc_success": float(np.nanmean(succ[:n_episodes]) * 100),
                           "eval_s": eval_s, "eval_ep_s": eval_s / n_episodes},
            "video_paths": list(videos.paths) if videos is not None else []}


def eval_info(env_type: str, info: Dict[str, Any]) -> Dict[str, Any]:
    """LeRobot 0.4.4's eval_info.json layout for one single-task suite (eval_policy_all)."""
    agg = info["aggregated"]
    n = len(info["per_episode"])
    metrics = {"sum_rewards": [e["sum_reward"] for e in info["per_episode"]],
               "max_rewards": [e["max_reward"] for e in info["per_episode"]],
               "successes": [e["success"] for e in info["per_episode"]], "video_paths": info["video_paths"]}
    group = {"avg_sum_reward": agg["avg_sum_reward"], "avg_max_reward": agg["avg_max_reward"],
             "pc_success": agg["pc_success"], "n_episodes": n, "video_paths": info["video_paths"]}
    return {"per_task": [{"task_group": env_type, "task_id": 0, "metrics": metrics}],
            "per_group": {env_type: group},
            "overall": {**{k: v for k, v in group.items() if k != "video_paths"}, "eval_s": agg["eval_s"],
                        "eval_ep_s": agg["eval_ep_s"], "video_paths": info["video_paths"]},
            "per_episode": info["per_episode"]}


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------

class BatchProgress:
    """tqdm over batches when installed, else one plain line per batch on stderr; silent when disabled."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.n, self.enabled, self.bar = total, 0, enabled, None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc="Stepping through eval batches", file=sys.stderr)
            except ImportError:
                pass

    def update(self, k: int, note: str) -> None:
        self.n += k
        if self.bar is not None:
            self.bar.set_postfix_str(note)
            self.bar.update(k)
        elif self.enabled:
            print(f"eval batch {self.n}/{self.total}: {note}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="flowedge-lerobot-eval",
        description="lerobot-eval with the whole policy in flowedge: vectorised gym episodes, eval_info.json. "
                    "Flags take --name=value or --name value.")
    ap.add_argument("--policy.path", dest="policy_path", required=True, help="LeRobot pretrained_model folder")
    ap.add_argument("--policy.device", dest="device", choices=("cpu", "cuda", "auto"), default="auto",
                    help="auto (default): the GPU when flowedge can use one, else the CPU (fallback_reason in the JSON)")
    ap.add_argument("--policy.noise_scheduler_type", dest="scheduler", choices=("DDIM", "DDPM", "ddim", "ddpm"),
                    default=None, help="Diffusion Policy sampler (default: the checkpoint's)")
    ap.add_argument("--policy.num_inference_steps", dest="steps", type=int, default=None,
                    help="Diffusion Policy sampler steps (default: the checkpoint's)")
    ap.add_argument("--policy.dtype", dest="dtype", choices=("f32", "bf16", "f16"), default=None,
                    help="flowedge: weight storage (default f32)")
    ap.add_argument("--policy.quantize", dest="quantize", choices=("none", "int8", "w8a8"), default=None,
                    help="flowedge, Diffusion Policy on the CPU: opt-in INT8 U-Net weights (int8) or INT8 weights and "
                         "activations (w8a8: AVX2, or AVX-512 with VNNI); error bounds in docs/numerics.md")
    ap.add_argument("--env.type", dest="env_type", choices=sorted(ENV_TYPES), default="pusht")
    ap.add_argument("--env.task", dest="env_task", default=None, help="gym task (default: LeRobot's for the type)")
    ap.add_argument("--env.episode_length", dest="episode_length", type=int, default=None,
                    help="max_episode_steps (default: LeRobot's for the type: pusht 300, aloha 400)")
    ap.add_argument("--eval.batch_size", dest="batch_size", type=int, default=50, help="environments per batch (50)")
    ap.add_argument("--eval.n_episodes", dest="n_episodes", type=int, default=50, help="episodes (50)")
    ap.add_argument("--seed", type=int, default=1000, help="batch b resets env e with seed + b*batch_size + e (1000)")
    ap.add_argument("--output_dir", default=None, help="default outputs/eval/<date>/<time>_<env>_<policy type>")
    ap.add_argument("--threads", type=int, default=None, help="flowedge's OpenMP threads (default: OpenMP's)")
    ap.add_argument("--max-render-videos", dest="max_videos", type=int, default=10,
                    help="episodes rendered to <output_dir>/videos (LeRobot: 10; needs imageio; 0 = none)")
    ap.add_argument("--json", action="store_true", help="print eval_info.json's content on stdout")
    ap.add_argument("--save-actions", default=None, metavar="FILE.npz",
                    help="each episode's actions up to its first done as ep_<i> [steps, action_dim] (for "
                         "tools/compare_lerobot_eval.py)")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def parse_args(argv: Optional[List[str]], ap: Optional[argparse.ArgumentParser] = None) -> argparse.Namespace:
    """The flags, checked; ``ap``: build_parser() with more flags added (tools/compare_lerobot_eval.py)."""
    ap = ap or build_parser()
    args, unknown = ap.parse_known_args(argv)
    if unknown:
        ap.error(f"unknown flag(s) {' '.join(unknown)} (expected flowedge-lerobot-eval's flags: the common "
                 "lerobot-eval ones --policy.path, --policy.device, --env.type, --eval.batch_size, --eval.n_episodes, "
                 "--seed, --output_dir, and the others in --help)")
    if args.batch_size < 1 or args.n_episodes < 1:
        ap.error(f"--eval.batch_size and --eval.n_episodes must be >= 1 (got {args.batch_size}, {args.n_episodes})")
    if args.batch_size > args.n_episodes:  # LeRobot's EvalConfig rule
        ap.error(f"--eval.batch_size must not exceed --eval.n_episodes (got {args.batch_size} > {args.n_episodes})")
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads must be >= 1 (got {args.threads})")
    if args.episode_length is not None and args.episode_length < 1:
        ap.error(f"--env.episode_length must be >= 1 (got {args.episode_length})")
    args.scheduler = args.scheduler.lower() if args.scheduler else None
    return args


def set_omp_threads(n: Optional[int]) -> None:
    if n is None:
        return
    import ctypes

    try:
        ctypes.CDLL("libgomp.so.1").omp_set_num_threads(ctypes.c_int(n))
    except OSError as e:
        raise SystemExit(f"flowedge: lerobot-eval: --threads needs the OpenMP runtime libgomp.so.1 ({e})")


def default_output_dir(env_type: str, policy_kind: str) -> Path:
    now = dt.datetime.now()
    return Path("outputs/eval") / f"{now:%Y-%m-%d}" / f"{now:%H-%M-%S}_{env_type}_{policy_kind}"


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    import flowedge

    from .replay import cpu_name, versions

    set_omp_threads(args.threads)
    kind = flowedge.policy_type(args.policy_path)
    out_dir = Path(args.output_dir) if args.output_dir else default_output_dir(args.env_type, kind)
    env = make_vector_env(args.env_type, args.batch_size, args.env_task, args.episode_length)
    t0 = time.perf_counter()
    try:
        policy = load_batched_policy(args.policy_path, args.batch_size, device=args.device, steps=args.steps,
                                     scheduler=args.scheduler, dtype=args.dtype, quantize=args.quantize)
    except flowedge.FlowEdgeError as e:  # --policy.device cuda without a usable GPU, a folder that does not load
        env.close()
        raise SystemExit(str(e)) from None
    load_s = time.perf_counter() - t0
    fps = ENV_TYPES[args.env_type]["fps"]
    videos = VideoWriter(args.max_videos, out_dir / "videos", fps)
    progress = BatchProgress(-(-args.n_episodes // args.batch_size), not args.no_progress)
    actions: List[np.ndarray] = []

    def keep_actions(r, ep):
        actions.extend(r["action"][e, :last + 1] for e, last in enumerate(ep["done_index"].tolist()))

    try:
        info = eval_policy(env, policy, args.n_episodes, args.seed, videos=videos, progress=progress,
                           on_batch=keep_actions if args.save_actions else None)
    finally:
        progress.close()
        env.close()
    if args.save_actions:
        np.savez(args.save_actions, **{f"ep_{i}": a for i, a in enumerate(actions[:args.n_episodes])})
    result = eval_info(args.env_type, info)
    result["flowedge"] = {
        "policy_path": args.policy_path, "policy_type": kind, "env_type": args.env_type,
        "batch_size": args.batch_size, "seed": args.seed, "episode_steps": info["episode_steps"],
        "device": args.device, "dtype": args.dtype or "f32", "quantize": args.quantize or "none",
        "backend": policy.backend, "fallback_reason": policy.fallback_reason,
        "batched_policy": type(policy).__name__, "threads": args.threads,
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"), "cpu": cpu_name(), "load_s": round(load_s, 3),
        "videos_skipped": videos.skipped, "torch_imported": "torch" in sys.modules,
        "lerobot_imported": "lerobot" in sys.modules, "versions": versions(),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2)
    (out_dir / "eval_info.json").write_text(text + "\n")
    if args.json:
        print(text)
    o = result["overall"]
    print(f"flowedge-lerobot-eval: {o['n_episodes']} episodes, pc_success {o['pc_success']:.1f}%, avg_sum_reward "
          f"{o['avg_sum_reward']:.3f}, avg_max_reward {o['avg_max_reward']:.3f}, eval_s {o['eval_s']:.1f}, "
          f"eval_ep_s {o['eval_ep_s']:.2f}" + (f"; videos skipped: {videos.skipped}" if videos.skipped else "")
          + f"; {out_dir / 'eval_info.json'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
