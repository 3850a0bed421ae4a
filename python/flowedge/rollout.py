"""flowedge-lerobot-rollout: closed-loop LeRobot Diffusion Policy episodes under a deadline (docs/contracts.md#deadline-loop).

Each control tick: observation -> LeRobot preprocessor -> ``select_action`` (queues; a new chunk is sampled
every ``n_action_steps`` ticks, by flowedge or by LeRobot) -> postprocessor -> environment. The tick's
inference time is measured from the observation hand-off to the action; if it exceeds ``--period-ms`` the tick
is a *miss* and ``--on-miss`` decides what reaches the environment:

- ``hold``: the last on-time action is re-sent (zeros if there was none yet);
- ``drop``: nothing is sent: the environment is not stepped on that tick and the next tick sees the same
  observation again (a simulator has no wall clock to keep running);
- ``raise``: the run stops with an error (exit code 3) and the JSON records where.

Unless ``--no-pace``, the loop sleeps out the rest of each period, as a real controller would.
Environments: ``pusht`` (gym-pusht, ``obs_type="pixels_agent_pos"``, needs a policy with observation.image
[3, 96, 96] + observation.state [2]) or ``synthetic`` (deterministic closed-loop observations of the policy's
input shapes: the state moves toward the commanded action, images show the state as a bright spot).
``--backend both`` runs the same seeded episodes with LeRobot and flowedge and reports the trajectory difference.
``--backend flowedge-policy`` runs the whole policy in ``flowedge.DiffusionPolicy`` or, for an ACT folder,
``flowedge.ActPolicy`` (flowedge.policy_loop): numpy
observations (uint8 HWC camera frames), no torch and no lerobot imported; the JSON adds latency p99.9, resident and
device memory at start and end, and the environments are numpy versions of the two above.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from ._deps import require_lerobot
from .policy_loop import DeadlineLoop, DeadlineMissError, realtime_options
from .replay import Backends, check_device, cpu_name, peak_rss_mib, percentiles_ms, set_threads, versions

ON_MISS = ("hold", "drop", "raise")


def default_policy_dir() -> Optional[str]:
    """The built-in demo policy: ``$FLOWEDGE_DEMO_POLICY`` or the repository's test/fixtures/dp_small."""
    env = os.environ.get("FLOWEDGE_DEMO_POLICY")
    if env:
        return env
    here = Path(__file__).resolve()
    for root in (here.parents[2], Path.cwd()):
        cand = root / "test" / "fixtures" / "dp_small"
        if (cand / "config.json").is_file():
            return str(cand)
    return None


def gym_pusht_available() -> Optional[str]:
    """None when gym-pusht imports, else the reason it does not."""
    try:
        import gym_pusht  # noqa: F401
        import gymnasium  # noqa: F401
    except Exception as e:  # ImportError, or a broken pygame/pymunk install
        return f"{type(e).__name__}: {e}"
    return None


def fits_pusht(config) -> bool:
    feats = {k: tuple(v.shape) for k, v in config.input_features.items()}
    return feats == {"observation.image": (3, 96, 96), "observation.state": (2,)} and \
        tuple(config.action_feature.shape) == (2,)


# ----------------------------------------------------------------------------------------------------------------
# Environments: reset(seed) -> obs, step(action) -> (obs, terminated, info); obs in LeRobot's batch-of-1 layout
# ----------------------------------------------------------------------------------------------------------------

class SyntheticEnv:
    """Deterministic closed-loop observation source shaped like the policy's inputs.

    State ``s`` (the robot state feature) starts at a seeded point and moves 30% of the way toward the
    commanded action each step when action and state have the same width (PushT-like position control),
    plus small seeded noise; env-state features follow a seeded random walk; images are seeded noise with a
    bright spot at the state's first two coordinates (scaled to the image). All values are float32 tensors
    ``[1, *shape]`` keyed by feature name, like ``lerobot.envs.utils.preprocess_observation`` output.
    """

    def __init__(self, config, stats: Dict[str, Dict[str, np.ndarray]]):
        self.cfg = config
        self.state_key = "observation.state"
        st = stats.get(self.state_key, {})
        dim = config.robot_state_feature.shape[0]
        self.lo = st.get("min", np.zeros(dim, np.float32)).reshape(-1)
        self.hi = st.get("max", np.full(dim, 512.0, np.float32)).reshape(-1)
        self.rng = np.random.default_rng(0)
        self.state = np.zeros(dim, np.float32)
        self.env_states: Dict[str, np.ndarray] = {}

    def _obs(self) -> Dict[str, Any]:
        import torch

        out = {self.state_key: torch.from_numpy(self.state.astype(np.float32)).unsqueeze(0)}
        for key, feat in self.cfg.input_features.items():
            kind = getattr(feat.type, "name", str(feat.type))
            if kind == "VISUAL":
                c, h, w = feat.shape
                img = self.rng.random((c, h, w), dtype=np.float32) * 0.2
                u = (self.state[:2] - self.lo[:2]) / np.maximum(self.hi[:2] - self.lo[:2], 1e-6)
                y, x = int(np.clip(u[-1], 0, 1) * (h - 1)), int(np.clip(u[0], 0, 1) * (w - 1))
                img[:, max(0, y - 3):y + 4, max(0, x - 3):x + 4] = 1.0
                out[key] = torch.from_numpy(img).unsqueeze(0)
            elif key != self.state_key:
                out[key] = torch.from_numpy(self.env_states[key].astype(np.float32)).unsqueeze(0)
        return out

    def reset(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.state = (self.lo + self.rng.random(self.lo.shape) * (self.hi - self.lo)).astype(np.float32)
        self.env_states = {k: self.rng.standard_normal(tuple(f.shape)).astype(np.float32)
                           for k, f in self.cfg.input_features.items()
                           if k != self.state_key and getattr(f.type, "name", "") != "VISUAL"}
        return self._obs(), {}

    def step(self, action: np.ndarray):
        a = np.asarray(action, np.float32).reshape(-1)
        if a.shape == self.state.shape:
            self.state = self.state + 0.3 * (a - self.state)
        self.state = (self.state + self.rng.standard_normal(self.state.shape) * 0.01 * (self.hi - self.lo)
                      ).astype(np.float32)
        for k in self.env_states:
            self.env_states[k] = self.env_states[k] + 0.05 * self.rng.standard_normal(self.env_states[k].shape
                                                                                      ).astype(np.float32)
        return self._obs(), False, {}

    def close(self):
        pass


class PushTEnv:
    """gym-pusht ``PushT-v0`` with pixel + agent-position observations, converted by LeRobot's own helper."""

    def __init__(self, max_steps: int):
        import gym_pusht  # noqa: F401  (registers gym_pusht/PushT-v0)
        import gymnasium as gym

        self.env = gym.make("gym_pusht/PushT-v0", obs_type="pixels_agent_pos", render_mode="rgb_array",
                            max_episode_steps=max_steps)

    @staticmethod
    def _convert(obs):
        from lerobot.envs.utils import preprocess_observation

        return preprocess_observation(obs)

    def reset(self, seed: int):
        obs, info = self.env.reset(seed=seed)
        return self._convert(obs), info

    def step(self, action: np.ndarray):
        obs, _reward, terminated, _truncated, info = self.env.step(np.asarray(action, np.float64).reshape(-1))
        return self._convert(obs), bool(terminated), info

    def close(self):
        self.env.close()


class Progress:
    """tqdm when installed, else a plain counter on stderr; silent when disabled."""

    def __init__(self, total: int, desc: str, enabled: bool):
        self.total, self.desc, self.n, self.enabled = total, desc, 0, enabled
        self.bar = None
        self._last = -1
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=desc, unit="step", file=sys.stderr, leave=False)
            except ImportError:
                self.bar = None

    def update(self, k: int = 1):
        self.n += k
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(k)
            return
        pct = int(100 * self.n / max(1, self.total))
        if pct // 5 != self._last // 5 or self.n == self.total:
            self._last = pct
            print(f"\r{self.desc}: {self.n}/{self.total} ({pct}%)", end="", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            print(file=sys.stderr)


def run_episodes(bk: Backends, backend: str, make_env, args, progress: Progress) -> Dict[str, Any]:
    """Runs ``args.episodes`` seeded episodes with ``backend``; returns per-tick timings and trajectories."""
    import torch

    bk.use(backend)
    policy, pre, post = bk.policy, bk.pre, bk.post
    A = bk.config.action_feature.shape[0]
    loop = DeadlineLoop(args, A, progress)
    tick_s: List[float] = []
    infer_s: List[float] = []
    missed_ticks: List[List[int]] = []
    episodes: List[Dict[str, Any]] = []
    error = None
    env = make_env()
    warmup_s: List[float] = []

    def infer(obs) -> Any:
        """One timed tick's work: pre + select_action + post, synchronised so the wall time includes the GPU."""
        with torch.no_grad():
            act = post(policy.select_action(pre(obs)))
        if bk.torch_device.type == "cuda":
            torch.cuda.synchronize(bk.torch_device)
        return act

    try:
        # Untimed warm-up: the first inference of a fresh process pays one-off costs (cuDNN/cuBLAS handles and
        # autotuning in PyTorch, CUDA graph capture in flowedge) that a robot pays before it starts the loop, not
        # at tick 0. Full select_action calls on the first episode's reset observation, then the queues are reset.
        if args.warmup > 0:
            obs, _ = env.reset(args.seed)
            for _ in range(args.warmup):
                policy.reset()
                t0 = time.perf_counter()
                infer(obs)
                warmup_s.append(time.perf_counter() - t0)
            bk.sampler_timer.times.clear()
            bk.encoder_timer.times.clear()
        for ep in range(args.episodes):
            seed = args.seed + ep
            torch.manual_seed(seed)  # LeRobot draws x_T from the global torch RNG inside select_action
            policy.reset()
            obs, _ = env.reset(seed)
            states: List[np.ndarray] = []

            def tick(obs, _k):
                n_before = len(bk.sampler_timer.times)
                act, dt = loop.timed(lambda: infer(obs))
                tick_s.append(dt)
                if len(bk.sampler_timer.times) > n_before:
                    infer_s.append(dt)
                states.append(obs["observation.state"][0].detach().cpu().numpy().copy())  # what tick k saw
                return act.detach().float().cpu().numpy().reshape(-1), dt

            r = loop.episode(env, obs, tick, ep)
            row = {"seed": seed, "steps": len(r["computed"]), "misses": len(r["missed"]),
                   "computed_actions": np.stack(r["computed"]), "sent_actions": np.stack(r["sent"]),
                   "states": np.stack(states) if states else np.zeros((0, A), np.float32)}
            if isinstance(env, PushTEnv):
                row["success"] = r["success"]
                row["max_coverage"] = r["max_coverage"]
            episodes.append(row)
            missed_ticks.append(r["missed"])
    except DeadlineMissError as e:
        error = str(e)
    finally:
        env.close()
    return {"tick_s": tick_s, "infer_s": infer_s, "misses": loop.misses, "episodes": episodes, "error": error,
            "missed_ticks": missed_ticks, "warmup_s": warmup_s, "tick_counters": loop.counters}


def summarise(run: Dict[str, Any], bk: Backends, backend: str, args) -> Dict[str, Any]:
    ticks = percentiles_ms(run["tick_s"])
    out = {
        "backend": backend,
        "steps": len(run["tick_s"]),
        "p50_ms": ticks["p50"], "p99_ms": ticks["p99"], "max_ms": ticks["max"], "mean_ms": ticks["mean"],
        "tick_counters": run["tick_counters"],  # getrusage deltas summed over the timed ticks
        "inference_ms": percentiles_ms(run["infer_s"]),  # ticks that sampled a new chunk
        "sampler_ms": percentiles_ms(bk.sampler_timer.times),
        "encoder_ms": percentiles_ms(bk.encoder_timer.times),
        "missed_deadlines": run["misses"],
        "warmup_ms": [round(t * 1e3, 3) for t in run["warmup_s"]],
        "episodes": [{k: v for k, v in e.items() if not isinstance(v, np.ndarray)} for e in run["episodes"]],
    }
    if run["error"]:
        out["error"] = run["error"]
    return out


def write_histogram(path: str, runs: Dict[str, Dict[str, Any]], period_ms: Optional[float]) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no histogram written"
    fig, ax = plt.subplots(figsize=(7, 4))
    all_ms = np.concatenate([np.asarray(r["tick_s"], np.float64) * 1e3 for r in runs.values()] + [np.zeros(0)])
    all_ms = all_ms[all_ms > 0]
    if all_ms.size:
        lo, hi = all_ms.min(), max(all_ms.max(), period_ms or 0.0)
        bins = np.geomspace(lo * 0.9, hi * 1.1, 60)  # ticks span queue pops (~ms) to chunk inference (~10-1000 ms)
        for name, run in runs.items():
            ms = np.asarray(run["tick_s"]) * 1e3
            if ms.size:
                ax.hist(ms, bins=bins, alpha=0.6, label=f"{name} (n={ms.size})")
    if period_ms:
        ax.axvline(period_ms, color="k", linestyle="--", label=f"period {period_ms} ms")
    ax.set_xscale("log")
    ax.set_xlabel("select_action + pre/post-processing per tick [ms]")
    ax.set_ylabel("ticks")
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def compare(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    """Trajectory differences between two runs of the same seeded episodes.

    Over the common length of each episode, and over the *matched prefix*: the ticks before the two runs' miss
    patterns first differ (after that, hold/drop send different commands and the trajectories legitimately part).
    """
    da = ds = pa = ps = 0.0
    n_prefix = 0
    for ea, eb, ma, mb in zip(a["episodes"], b["episodes"], a["missed_ticks"], b["missed_ticks"]):
        n = min(len(ea["computed_actions"]), len(eb["computed_actions"]))
        first = next((k for k in range(n) if (k in ma) != (k in mb)), n)
        if n:
            d = np.abs(ea["computed_actions"][:n] - eb["computed_actions"][:n]).max(axis=1)
            da = max(da, float(d.max()))
            # the action computed at the first divergent tick still saw identical inputs
            pa = max(pa, float(d[:min(first + 1, n)].max()))
        m = min(len(ea["states"]), len(eb["states"]))
        if m:
            d = np.abs(ea["states"][:m] - eb["states"][:m]).max(axis=1)
            ds = max(ds, float(d.max()))
            ps = max(ps, float(d[:min(first + 1, m)].max()))
        n_prefix += first
    return {"max_abs_action_diff": da, "max_abs_state_diff": ds, "same_missed_ticks": a["missed_ticks"] == b["missed_ticks"],
            "matched_prefix_ticks": n_prefix, "max_abs_action_diff_matched_prefix": pa,
            "max_abs_state_diff_matched_prefix": ps,
            "note": "robot units (post-processed actions, raw state); the matched prefix ends where the backends' "
                    "missed deadlines first differ"}


def main(argv: Optional[List[str]] = None) -> int:
    t_start = time.perf_counter()
    ap = argparse.ArgumentParser(prog="flowedge-lerobot-rollout",
                                 description="Closed-loop LeRobot Diffusion Policy rollout with a deadline per tick.")
    ap.add_argument("--env", choices=("auto", "pusht", "synthetic"), default="auto",
                    help="auto: pusht when gym-pusht imports and the policy has PushT inputs, else synthetic")
    ap.add_argument("--policy", help="LeRobot pretrained_model folder (default: the built-in demo test/fixtures/dp_small)")
    ap.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                    help="auto (flowedge-policy only): the GPU when usable, else the CPU (fallback_reason in the JSON)")
    ap.add_argument("--steps", type=int, default=300, help="control ticks per episode (default 300, PushT's limit)")
    ap.add_argument("--episodes", type=int, default=1)
    ap.add_argument("--diffusion-steps", type=int, default=None, help="Diffusion Policy sampler steps (default 10)")
    ap.add_argument("--scheduler", choices=("ddim", "ddpm"), default=None, help="Diffusion Policy sampler (default ddim)")
    ap.add_argument("--ddpm-seed", type=int, default=None,
                    help="fixed SplitMix64 seed for flowedge's DDPM step noise (default: drawn from the torch RNG)")
    ap.add_argument("--seed", type=int, default=0, help="episode e uses seed + e (env reset and torch RNG)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--period-ms", type=float, default=100.0, help="deadline per tick; 0 disables (default 100)")
    ap.add_argument("--on-miss", choices=ON_MISS, default="hold")
    ap.add_argument("--no-pace", action="store_true", help="do not sleep out the rest of each period")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed select_action calls per backend before the episodes (default 1; 0 = none)")
    ap.add_argument("--backend", choices=("flowedge", "lerobot", "both", "flowedge-policy"), default="flowedge",
                    help="flowedge: LeRobot's policy with the U-Net sampled by flowedge; lerobot: LeRobot alone; both: "
                         "the two on the same episodes; flowedge-policy: the whole policy (encoders, normalisation, "
                         "queues, sampler) in flowedge.DiffusionPolicy, or flowedge.ActPolicy for an ACT folder, with numpy "
                         "observations: no torch, no lerobot")
    ap.add_argument("--output", help="JSON result path (default: stdout)")
    ap.add_argument("--histogram", help="PNG histogram of tick latencies (needs matplotlib)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--dtype", choices=("f32", "bf16", "f16"), default=None,
                    help="flowedge-policy: weight storage (default f32)")
    ap.add_argument("--quantize", choices=("none", "int8", "w8a8"), default=None,
                    help="flowedge-policy, Diffusion Policy on the CPU: opt-in INT8 U-Net weights (int8: AVX2 / AVX-512) or INT8 "
                         "weights and activations (w8a8: AVX2, or AVX-512 with VNNI); error bounds in docs/numerics.md")
    rt = ap.add_argument_group("real time (--backend flowedge-policy; docs/realtime.md)")
    rt.add_argument("--lock-memory", action="store_true",
                    help="mlockall + pre-fault after load (needs ulimit -l / CAP_IPC_LOCK)")
    rt.add_argument("--prefault", action="store_true", help="pre-fault every mapped page without locking")
    rt.add_argument("--cpus", help="pin the loop thread and the OpenMP workers to these CPUs, e.g. 2,3 or 2-5")
    rt.add_argument("--isolate-cpus", action="store_true",
                    help="move this process's other threads (CUDA driver, loggers) off the --cpus CPUs")
    rt.add_argument("--rt-priority", type=int, default=0,
                    help="SCHED_FIFO priority 1..99 for them (needs ulimit -r / CAP_SYS_NICE); 0 = leave")
    rt.add_argument("--high-priority-stream", action="store_true", help="CUDA: a stream of the device's highest priority")
    rt.add_argument("--pinned-staging", action="store_true", help="CUDA: page-locked host staging buffers")
    args = ap.parse_args(argv)
    if args.backend == "flowedge-policy":
        return main_policy(args, ap, t_start)
    args.diffusion_steps = 10 if args.diffusion_steps is None else args.diffusion_steps
    args.scheduler = args.scheduler or "ddim"
    if args.policy:
        from . import policy_type

        if policy_type(args.policy) == "act":
            ap.error("an ACT folder runs with --backend flowedge-policy (the other backends are LeRobot's Diffusion Policy)")
    if realtime_options(args):
        ap.error("--lock-memory / --prefault / --cpus / --isolate-cpus / --rt-priority / --high-priority-stream / --pinned-staging are "
                 "options of --backend flowedge-policy")
    if args.device == "auto":
        ap.error("--device auto is for --backend flowedge-policy (the LeRobot backends need a torch device)")
    require_lerobot("lerobot-rollout")
    if args.steps < 1 or args.episodes < 1:
        ap.error("--steps and --episodes must be >= 1")
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")

    t_import = time.perf_counter()
    import torch

    from . import lerobot as _fl  # noqa: F401  (LeRobot's import time is part of startup; reported apart)

    import_ms = (time.perf_counter() - t_import) * 1e3
    check_device(args.device, "rollout")
    threads = set_threads(args.threads)
    policy_dir = args.policy or default_policy_dir()
    if policy_dir is None:
        ap.error("no --policy given and the demo policy test/fixtures/dp_small was not found "
                 "(set FLOWEDGE_DEMO_POLICY)")
    backends = ["lerobot", "flowedge"] if args.backend == "both" else [args.backend]
    bk = Backends(policy_dir, args.device, args.scheduler, args.diffusion_steps, ddpm_seed=args.ddpm_seed,
                  need_flowedge="flowedge" in backends)
    cfg = bk.config

    pusht_missing = gym_pusht_available()
    env_name, env_reason = args.env, None
    if env_name == "auto":
        if pusht_missing is None and fits_pusht(cfg):
            env_name = "pusht"
        else:
            env_name = "synthetic"
            env_reason = (f"gym-pusht unavailable ({pusht_missing})" if pusht_missing
                          else "policy inputs are not PushT's (observation.image 3x96x96 + observation.state 2)")
    if env_name == "pusht":
        if pusht_missing:
            raise SystemExit(f"flowedge: rollout: --env pusht needs gym-pusht (pip install gym-pusht): {pusht_missing}")
        if not fits_pusht(cfg):
            raise SystemExit("flowedge: rollout: --env pusht needs a policy with observation.image [3, 96, 96] and "
                             "observation.state [2] inputs and a 2-D action (got "
                             f"{ {k: list(v.shape) for k, v in cfg.input_features.items()} })")
        make_env = lambda: PushTEnv(args.steps)  # noqa: E731
    else:
        from .replay import normalizer_stats

        stats = normalizer_stats(bk.pre)
        make_env = lambda: SyntheticEnv(cfg, stats)  # noqa: E731
    startup_ms = (time.perf_counter() - t_start) * 1e3

    runs: Dict[str, Dict[str, Any]] = {}
    summaries: Dict[str, Dict[str, Any]] = {}
    for name in backends:
        prog = Progress(args.episodes * args.steps, f"{name} rollout", not args.no_progress)
        try:
            runs[name] = run_episodes(bk, name, make_env, args, prog)
        finally:
            prog.close()
        summaries[name] = summarise(runs[name], bk, name, args)

    main_name = backends[-1]
    head = bk.sampler.head if bk.sampler is not None else None
    result: Dict[str, Any] = {
        "tool": "flowedge-lerobot-rollout",
        "env": env_name,
        "policy": policy_dir,
        "device": args.device,
        "flowedge_backend": head.backend if head is not None else None,
        "cuda_resident": bool(head.cuda_resident) if head is not None else None,
        "cpu": cpu_name(),
        "threads": threads,
        "scheduler": args.scheduler,
        "diffusion_steps": args.diffusion_steps,
        "period_ms": args.period_ms,
        "on_miss": args.on_miss,
        "paced": not args.no_pace,
        "episodes_requested": args.episodes,
        "steps_per_episode": args.steps,
        "seed": args.seed,
        "startup_ms": round(startup_ms, 1),  # main() entry -> ready to run: imports, policy + head load, env
        "import_ms": round(import_ms, 1),
        "load_ms": {"lerobot": round(bk.lerobot_load_s * 1e3, 1), "flowedge_head": round(bk.flowedge_load_s * 1e3, 1)},
        **{k: v for k, v in summaries[main_name].items() if k != "backend"},
        "backend": main_name,
    }
    if env_reason:
        result["env_reason"] = env_reason
    if len(backends) > 1:
        result["backends"] = summaries
        result["comparison"] = compare(runs["lerobot"], runs["flowedge"])
    if args.histogram:
        warn = write_histogram(args.histogram, runs, args.period_ms)
        result["histogram"] = warn or args.histogram
    result["peak_rss_mib"] = peak_rss_mib()
    result["load_average_1m"] = round(os.getloadavg()[0], 2)  # shared machines: context for the numbers
    result["versions"] = versions()
    text = json.dumps(result, indent=1)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text + "\n")
    else:
        print(text)
    err = next((s.get("error") for s in summaries.values() if s.get("error")), None)
    s = summaries[main_name]
    print(f"rollout ({main_name}, {env_name}): {s['steps']} ticks, p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms, "
          f"max {s['max_ms']} ms, missed {s['missed_deadlines']}" + (f"; stopped: {err}" if err else ""),
          file=sys.stderr)
    return 3 if err else 0


def main_policy(args, ap, t_start: float) -> int:
    """--backend flowedge-policy: flowedge.DiffusionPolicy or ActPolicy in the loop, numpy observations, no torch or
    lerobot."""
    from . import policy_loop as pl
    from .replay import cpu_name as _cpu_name

    if args.steps < 1 or args.episodes < 1:
        ap.error("--steps and --episodes must be >= 1")
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads must be >= 1 (got {args.threads})")
    policy_dir = args.policy or default_policy_dir()
    if policy_dir is None:
        ap.error("no --policy given and the demo policy test/fixtures/dp_small was not found (set FLOWEDGE_DEMO_POLICY)")
    import flowedge

    if flowedge.policy_type(policy_dir) != "act":  # the Diffusion Policy's sampler defaults of this tool
        args.diffusion_steps = 10 if args.diffusion_steps is None else args.diffusion_steps
        args.scheduler = args.scheduler or "ddim"
    if args.threads is not None:  # flowedge's OpenMP team for this (the calling) thread; torch is not loaded here
        import ctypes

        try:
            ctypes.CDLL("libgomp.so.1").omp_set_num_threads(ctypes.c_int(args.threads))
        except OSError as e:
            raise SystemExit(f"flowedge: rollout: --threads needs the OpenMP runtime libgomp.so.1 ({e})")

    t0 = time.perf_counter()
    policy = pl.load_whole_policy(policy_dir, device=args.device, dtype=args.dtype, steps=args.diffusion_steps,
                                  scheduler=args.scheduler, seed=args.seed, tool="rollout",
                                  quantize=args.quantize)
    load_ms = (time.perf_counter() - t0) * 1e3
    rt_opts = realtime_options(args)
    realtime = None
    if rt_opts:  # after load, before the warm-up, on this (the loop's) thread
        try:
            realtime = policy.set_realtime(**rt_opts)
        except flowedge.FlowEdgeError as e:
            print(e, file=sys.stderr)
            return 2
    pusht_missing = gym_pusht_available()
    env_name, env_reason = args.env, None
    if env_name == "auto":
        if pusht_missing is None and pl.fits_pusht(policy):
            env_name = "pusht"
        else:
            env_name = "synthetic"
            env_reason = (f"gym-pusht unavailable ({pusht_missing})" if pusht_missing
                          else "policy inputs are not PushT's (observation.image 3x96x96 + observation.state 2)")
    if env_name == "pusht":
        if pusht_missing:
            raise SystemExit(f"flowedge: rollout: --env pusht needs gym-pusht (pip install gym-pusht): {pusht_missing}")
        if not pl.fits_pusht(policy):
            raise SystemExit("flowedge: rollout: --env pusht needs a policy with observation.image [3, 96, 96] and "
                             f"observation.state [2] inputs and a 2-D action (got cameras {policy.camera_shapes}, "
                             f"state [{policy.state_dim}], env [{policy.env_dim}], action [{policy.action_dim}])")
        make_env = lambda: pl.NumpyPushTEnv(args.steps)  # noqa: E731
    else:
        make_env = lambda: pl.NumpySyntheticEnv(policy, policy_dir)  # noqa: E731
    startup_ms = (time.perf_counter() - t_start) * 1e3
    prog = Progress(args.episodes * args.steps, "flowedge-policy rollout", not args.no_progress)
    try:
        run = pl.run_episodes(policy, make_env, args, prog)
    finally:
        prog.close()
    summary = pl.summarise(run)
    result: Dict[str, Any] = {
        "tool": "flowedge-lerobot-rollout", "env": env_name, "policy": policy_dir, "device": args.device,
        "flowedge_backend": policy.backend, "cuda_resident": bool(policy.cuda_resident),
        "fallback_reason": policy.fallback_reason, "cameras": policy.camera_shapes, "cpu": _cpu_name(),
        "threads": args.threads, "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"), **pl.sampler_fields(policy),
        "period_ms": args.period_ms, "on_miss": args.on_miss, "paced": not args.no_pace,
        "episodes_requested": args.episodes, "steps_per_episode": args.steps, "seed": args.seed,
        "startup_ms": round(startup_ms, 1), "load_ms": {"flowedge_policy": round(load_ms, 1)},
        "torch_imported": "torch" in sys.modules, "lerobot_imported": "lerobot" in sys.modules,
        "realtime": realtime, **summary,
    }
    if env_reason:
        result["env_reason"] = env_reason
    if args.histogram:
        warn = write_histogram(args.histogram, {"flowedge-policy": run}, args.period_ms)
        result["histogram"] = warn or args.histogram
    result["peak_rss_mib"] = peak_rss_mib()
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    result["versions"] = {"flowedge_module": flowedge.__version__, "numpy": np.__version__}
    text = json.dumps(result, indent=1)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text + "\n")
    else:
        print(text)
    mem = run["memory"]
    print(f"rollout (flowedge-policy on {policy.backend}, {env_name}): {summary['steps']} ticks, p50 {summary['p50_ms']} "
          f"ms, p99 {summary['p99_ms']} ms, p99.9 {summary['p99_9_ms']} ms, p99.99 {summary['p99_99_ms']} ms, max "
          f"{summary['max_ms']} ms, missed {summary['missed_deadlines']}, page faults "
          f"{summary['tick_counters']['minor_page_faults']}+{summary['tick_counters']['major_page_faults']}; RSS {mem['start']['rss_mib']} -> {mem['end']['rss_mib']} MiB"
          + (f"; stopped: {run['error']}" if run["error"] else ""), file=sys.stderr)
    return 3 if run["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
