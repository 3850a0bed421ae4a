"""The whole-policy backend of flowedge-lerobot-rollout / -replay (``--backend flowedge-policy``): a LeRobot Diffusion
Policy or ACT folder run by :class:`flowedge.DiffusionPolicy` / :class:`flowedge.ActPolicy` (encoders, normalisation,
queues, sampler or transformer) with numpy observations as a robot delivers them. Imports neither torch nor lerobot.

Observation dicts are keyed by LeRobot feature names: ``observation.state`` [d] float32,
``observation.environment_state`` [d] float32 when the policy has one, and one uint8 [H, W, 3] frame per camera key.
"""
from __future__ import annotations

import os
import resource
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np

from . import ActPolicy, DiffusionPolicy, FlowEdgeError, _stats, policy_type

WholePolicy = Union[DiffusionPolicy, ActPolicy]


def load_whole_policy(folder: str, *, device: str, dtype: Optional[str], steps: Optional[int], scheduler: Optional[str],
                      seed: int, tool: str, quantize: Optional[str] = None) -> WholePolicy:
    """The tools' policy, the class chosen by config.json's ``type``. steps / scheduler / quantize are Diffusion Policy
    flags (None: not given): an ACT folder with any is an error naming them, and the seed only drives a Diffusion
    Policy's noise. An ACT folder that cannot run on the device asked for ends the tool with the reason."""
    if policy_type(folder) != "act":
        return DiffusionPolicy(folder, device=device, dtype=dtype, steps=steps, scheduler=scheduler, seed=seed,
                               quantize=quantize)
    given = [flag for flag, v in (("--diffusion-steps", steps), ("--scheduler", scheduler), ("--quantize", quantize))
             if v is not None and not (flag == "--quantize" and v == "none")]
    if given:
        raise SystemExit(f"flowedge: {tool}: {' and '.join(given)} {'is a' if len(given) == 1 else 'are'} Diffusion Policy "
                         f"option{'s' if len(given) > 1 else ''} and {folder} holds an ACT policy (expected "
                         f"{'it' if len(given) == 1 else 'them'} unset)")
    try:
        return ActPolicy(folder, device=device, dtype=dtype)
    except FlowEdgeError as e:
        if device != "cuda":
            raise
        raise SystemExit(str(e)) from None


def sampler_fields(policy: WholePolicy) -> Dict[str, Any]:
    """The policy type and the Diffusion Policy's sampler (None for ACT) for the tools' JSON."""
    act = isinstance(policy, ActPolicy)
    return {"policy_type": "act" if act else "diffusion", "scheduler": None if act else policy.scheduler,
            "diffusion_steps": None if act else policy.steps}


def percentiles_ms(seconds: List[float]) -> Dict[str, Optional[float]]:
    """p50/p99/p99.9/p99.99/mean/max of durations in seconds, in milliseconds (the tail is what a controller feels)."""
    return _stats.percentiles_ms(seconds, (50, 99, 99.9, 99.99))


class DeadlineMissError(RuntimeError):
    """``--on-miss raise``: a tick's inference overran the period."""


class DeadlineLoop:
    """The control loop every rollout backend shares (docs/contracts.md#deadline-loop). ``timed(fn)`` runs one tick's
    inference and returns (result, seconds), adding the page faults and context switches of the call (getrusage,
    whole process) to ``counters``; ``episode`` runs the ticks of one episode: a tick slower than ``args.period_ms``
    is a miss handled by ``args.on_miss`` ("hold": re-send the last on-time action, zeros before the first; "drop":
    send nothing, the environment is not stepped; "raise": raise DeadlineMissError), the action goes to
    ``env.step``, and unless ``args.no_pace`` the rest of the period is slept out."""

    COUNTERS = (("minor_page_faults", "ru_minflt"), ("major_page_faults", "ru_majflt"),
                ("voluntary_context_switches", "ru_nvcsw"), ("involuntary_context_switches", "ru_nivcsw"))

    def __init__(self, args, action_dim: int, progress):
        self.args = args
        self.action_dim = action_dim
        self.progress = progress
        self.period_s = args.period_ms / 1e3 if args.period_ms and args.period_ms > 0 else None
        self.misses = 0
        self.counters = {name: 0 for name, _ in self.COUNTERS}

    def timed(self, fn: Callable[[], Any]):
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        for name, field in self.COUNTERS:
            self.counters[name] += getattr(r1, field) - getattr(r0, field)
        return out, dt

    def episode(self, env, obs, tick: Callable[[Any, int], Any], ep: int) -> Dict[str, Any]:
        """``tick(obs, k)`` -> (action [action_dim] numpy, inference seconds). Returns computed / sent actions, the
        missed tick indices, success and the best coverage the environment reported."""
        args = self.args
        last_on_time = np.zeros(self.action_dim, np.float32)
        computed, sent, missed = [], [], []
        max_cov, success, terminated = 0.0, False, False
        for k in range(args.steps):
            t0 = time.perf_counter()
            a, dt = tick(obs, k)
            computed.append(a)
            if self.period_s is not None and dt > self.period_s:
                self.misses += 1
                missed.append(k)
                if args.on_miss == "raise":
                    raise DeadlineMissError(f"flowedge: rollout: deadline missed at episode {ep} step {k} (expected "
                                            f"inference <= {args.period_ms} ms, got {dt * 1e3:.3f} ms)")
                to_send = last_on_time if args.on_miss == "hold" else None
            else:
                to_send = last_on_time = a
            if to_send is not None:
                sent.append(np.asarray(to_send, np.float32))
                obs, terminated, info = env.step(to_send)
                if "coverage" in info:
                    max_cov = max(max_cov, float(info["coverage"]))
                success = success or bool(info.get("is_success", False))
            else:
                sent.append(np.full(self.action_dim, np.nan, np.float32))
            self.progress.update()
            if self.period_s is not None and not args.no_pace:
                rest = self.period_s - (time.perf_counter() - t0)
                if rest > 0:
                    time.sleep(rest)
            if terminated:
                self.progress.update(args.steps - 1 - k)
                break
        return {"computed": computed, "sent": sent, "missed": missed, "success": success, "max_coverage": round(max_cov, 4)}


def realtime_options(args) -> Dict[str, Any]:
    """The real-time flags of the rollout tool as DiffusionPolicy.set_realtime keyword arguments ({} when none)."""
    opts = {"lock_memory": args.lock_memory, "prefault": args.prefault, "cpus": args.cpus or None,
            "rt_priority": args.rt_priority or 0, "high_priority_stream": args.high_priority_stream,
            "pinned_staging": args.pinned_staging, "isolate_cpus": args.isolate_cpus}
    return opts if any(v for v in opts.values()) else {}


def rss_mib() -> float:
    """Current resident set size of this process (not the peak), from /proc/self/statm."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 2)
    except (OSError, ValueError, IndexError):
        return float("nan")


def gpu_process_mib() -> Optional[float]:
    """GPU memory this process holds according to nvidia-smi (None without one or when it reports nothing)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(os.getpid()):
            try:
                return float(parts[1])
            except ValueError:
                return None
    return None


def memory_snapshot(policy: WholePolicy) -> Dict[str, Any]:
    return {"rss_mib": rss_mib(), "policy_device_bytes": int(policy.device_bytes),
            "gpu_process_mib": gpu_process_mib() if policy.cuda_resident else None}


def read_safetensors_floats(path: str) -> Dict[str, np.ndarray]:
    """float32 tensors of a safetensors file (the processors' statistics), without the safetensors package."""
    import json
    import struct

    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for key, info in header.items():
        if key != "__metadata__" and info.get("dtype") == "F32":
            lo, hi = info["data_offsets"]
            out[key] = np.frombuffer(raw[8 + n + lo:8 + n + hi], np.float32).reshape(info["shape"]).copy()
    return out


def state_range(folder: str, key: str, dim: int) -> tuple:
    """(lo, hi) of a state feature from the preprocessor's MIN_MAX statistics, else (0, 1) per element."""
    try:
        names = [f for f in os.listdir(folder) if f.startswith("policy_preprocessor") and f.endswith(".safetensors")]
    except OSError:
        names = []
    for name in names:
        st = read_safetensors_floats(os.path.join(folder, name))
        if f"{key}.min" in st and f"{key}.max" in st:
            return st[f"{key}.min"].reshape(-1), st[f"{key}.max"].reshape(-1)
    return np.zeros(dim, np.float32), np.ones(dim, np.float32)


class NumpySyntheticEnv:
    """:class:`flowedge.rollout.SyntheticEnv` with numpy observations as a robot has them: the state moves 30% of the
    way toward the commanded action (when the widths match) plus small seeded noise, the environment state follows a
    seeded random walk, and each camera shows seeded noise with a bright square at the state's first two coordinates,
    as uint8 [H, W, 3]."""

    def __init__(self, policy: WholePolicy, folder: str):
        self.p = policy
        self.lo, self.hi = state_range(folder, policy.state_key, policy.state_dim)
        self.rng = np.random.default_rng(0)
        self.state = np.zeros(policy.state_dim, np.float32)
        self.env_state = np.zeros(policy.env_dim, np.float32)

    def _obs(self) -> Dict[str, np.ndarray]:
        out = {self.p.state_key: self.state.astype(np.float32)}
        if self.p.env_key:
            out[self.p.env_key] = self.env_state.astype(np.float32)
        for key, (_c, h, w) in self.p.camera_shapes.items():
            img = self.rng.integers(0, 50, size=(h, w, 3), dtype=np.uint8)
            u = (self.state[:2] - self.lo[:2]) / np.maximum(self.hi[:2] - self.lo[:2], 1e-6)
            y, x = int(np.clip(u[-1], 0, 1) * (h - 1)), int(np.clip(u[0], 0, 1) * (w - 1))
            img[max(0, y - 3):y + 4, max(0, x - 3):x + 4] = 255
            out[key] = img
        return out

    def reset(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.state = (self.lo + self.rng.random(self.lo.shape) * (self.hi - self.lo)).astype(np.float32)
        self.env_state = self.rng.standard_normal(self.p.env_dim).astype(np.float32)
        return self._obs(), {}

    def step(self, action: np.ndarray):
        a = np.asarray(action, np.float32).reshape(-1)
        if a.shape == self.state.shape:
            self.state = self.state + 0.3 * (a - self.state)
        self.state = (self.state + self.rng.standard_normal(self.state.shape) * 0.01 * (self.hi - self.lo)).astype(np.float32)
        self.env_state = (self.env_state + 0.05 * self.rng.standard_normal(self.env_state.shape)).astype(np.float32)
        return self._obs(), False, {}

    def close(self):
        pass


class NumpyPushTEnv:
    """gym-pusht ``PushT-v0`` (pixels_agent_pos) as numpy: ``pixels`` -> observation.image (uint8 [96, 96, 3]),
    ``agent_pos`` -> observation.state, without LeRobot's torch conversion."""

    def __init__(self, max_steps: int):
        import gym_pusht  # noqa: F401  (registers gym_pusht/PushT-v0)
        import gymnasium as gym

        self.env = gym.make("gym_pusht/PushT-v0", obs_type="pixels_agent_pos", render_mode="rgb_array",
                            max_episode_steps=max_steps)

    @staticmethod
    def _convert(obs) -> Dict[str, np.ndarray]:
        return {"observation.image": np.ascontiguousarray(obs["pixels"], dtype=np.uint8),
                "observation.state": np.asarray(obs["agent_pos"], np.float32)}

    def reset(self, seed: int):
        obs, info = self.env.reset(seed=seed)
        return self._convert(obs), info

    def step(self, action: np.ndarray):
        obs, _reward, terminated, _truncated, info = self.env.step(np.asarray(action, np.float64).reshape(-1))
        return self._convert(obs), bool(terminated), info

    def close(self):
        self.env.close()


def fits_pusht(policy: WholePolicy) -> bool:
    """PushT's inputs and action, judged by feature shapes (any policy type)."""
    return (policy.camera_shapes == {"observation.image": (3, 96, 96)} and policy.state_dim == 2 and policy.env_dim == 0
            and policy.action_dim == 2)


def run_episodes(policy: WholePolicy, make_env: Callable[[], Any], args, progress) -> Dict[str, Any]:
    """Seeded closed-loop episodes; each tick times ``select_action`` alone (the observation is already numpy).

    args: episodes, steps, seed, period_ms, on_miss ("hold" | "drop" | "raise"), no_pace, warmup.
    """
    loop = DeadlineLoop(args, policy.action_dim, progress)
    tick_s: List[float] = []
    chunk_s: List[float] = []
    missed_ticks: List[List[int]] = []
    episodes: List[Dict[str, Any]] = []
    warmup_s: List[float] = []
    error = None
    env = make_env()
    memory = {"start": memory_snapshot(policy)}
    try:
        if args.warmup > 0:  # one-off costs (CUDA graph capture, page faults) before the loop, as a robot would
            obs, _ = env.reset(args.seed)
            for _ in range(args.warmup):
                policy.reset()
                t0 = time.perf_counter()
                policy.select_action(obs)
                warmup_s.append(time.perf_counter() - t0)
            memory["after_warmup"] = memory_snapshot(policy)
        for ep in range(args.episodes):
            seed = args.seed + ep
            policy.reset(seed)
            obs, _ = env.reset(seed)
            states: List[np.ndarray] = []

            def tick(obs, _k):
                chunks_before = policy.chunks_generated
                a, dt = loop.timed(lambda: policy.select_action(obs))
                tick_s.append(dt)
                if policy.chunks_generated > chunks_before:
                    chunk_s.append(dt)
                states.append(np.array(obs[policy.state_key], np.float32).reshape(-1))
                return a, dt

            r = loop.episode(env, obs, tick, ep)
            row = {"seed": seed, "steps": len(r["computed"]), "misses": len(r["missed"]), "chunks": policy.chunks_generated,
                   "computed_actions": np.stack(r["computed"]), "sent_actions": np.stack(r["sent"]), "states": np.stack(states)}
            if isinstance(env, NumpyPushTEnv):
                row["success"] = r["success"]
                row["max_coverage"] = r["max_coverage"]
            episodes.append(row)
            missed_ticks.append(r["missed"])
    except DeadlineMissError as e:
        error = str(e)
    finally:
        env.close()
    memory["end"] = memory_snapshot(policy)
    return {"tick_s": tick_s, "infer_s": chunk_s, "misses": loop.misses, "episodes": episodes, "error": error,
            "missed_ticks": missed_ticks, "warmup_s": warmup_s, "memory": memory, "tick_counters": loop.counters}


def summarise(run: Dict[str, Any]) -> Dict[str, Any]:
    t = percentiles_ms(run["tick_s"])
    out = {"backend": "flowedge-policy", "steps": t["n"], "p50_ms": t["p50"], "p99_ms": t["p99"], "p99_9_ms": t["p99_9"],
           "p99_99_ms": t["p99_99"], "max_ms": t["max"], "mean_ms": t["mean"], "tick_ms": t,
           "tick_counters": run["tick_counters"],  # getrusage deltas summed over the timed select_action calls
           "inference_ms": percentiles_ms(run["infer_s"]),  # ticks that generated a chunk
           "missed_deadlines": run["misses"], "warmup_ms": [round(s * 1e3, 3) for s in run["warmup_s"]],
           "memory": run["memory"],
           "episodes": [{k: v for k, v in e.items() if not isinstance(v, np.ndarray)} for e in run["episodes"]]}
    if run["error"]:
        out["error"] = run["error"]
    return out


def replay(policy: WholePolicy, obs: Dict[str, np.ndarray], noise: Optional[np.ndarray], warmup: int
           ) -> Dict[str, Any]:
    """reset() then select_action for every step of ``obs`` ([T, ...] per feature key) with the k-th chunk's noise
    ``noise[k]`` ([K, horizon, action_dim]; None: the policy's seeded noise; a Diffusion Policy only). Returns actions
    [T, action_dim] and per-call timings."""
    if noise is not None and isinstance(policy, ActPolicy):
        raise ValueError("flowedge: replay: the observations hold 'noise' but an ACT policy draws no noise "
                         "(expected no 'noise' array for an ACT folder)")
    keys = [policy.state_key] + ([policy.env_key] if policy.env_key else []) + list(policy.cameras)
    missing = [k for k in keys if k not in obs]
    if missing:
        raise ValueError(f"flowedge: replay: observations lack {missing} (expected keys {keys}, got {sorted(obs)})")
    T = min(obs[k].shape[0] for k in keys)

    def episode(record: List[float]) -> np.ndarray:
        policy.reset()
        out = []
        for t in range(T):
            k = policy.chunks_generated
            nz = None if noise is None else noise[min(k, noise.shape[0] - 1)]
            if noise is not None and k >= noise.shape[0] and t % policy.n_action_steps == 0:
                raise ValueError(f"flowedge: replay: noise has {noise.shape[0]} chunks but step {t} needs chunk {k} "
                                 f"(expected [K >= {-(-T // policy.n_action_steps)}, {policy.horizon}, {policy.action_dim}])")
            step = {key: obs[key][t] for key in keys}
            t0 = time.perf_counter()
            out.append(policy.select_action(step) if nz is None else policy.select_action(step, noise=nz))
            record.append(time.perf_counter() - t0)
        return np.stack(out)

    for _ in range(warmup):
        episode([])
    times: List[float] = []
    actions = episode(times)
    chunk_ticks = [times[i] for i in range(0, T, policy.n_action_steps)]
    return {"actions": actions, "select_action_ms": percentiles_ms(times), "chunk_ms": percentiles_ms(chunk_ticks),
            "chunks": policy.chunks_generated}
