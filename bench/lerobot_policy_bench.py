#!/usr/bin/env python3
"""LeRobot's own DiffusionPolicy select_action latency, tick by tick, as lerobot-eval runs it.

Loads a LeRobot pretrained_model folder with LeRobot itself (DiffusionPolicy.from_pretrained and the folder's
policy_preprocessor.json / policy_postprocessor.json through PolicyProcessorPipeline.from_pretrained, which is what
lerobot.policies.factory.make_pre_post_processors does for a pretrained path; the factory is not imported because it
pulls in gymnasium), then runs episodes of reset() + one step per tick:
    uint8 HWC frames -> float32 CHW / 255 with a batch dim (lerobot.envs.utils.preprocess_observation, re-done here
    because lerobot.envs imports gymnasium), float32 states -> preprocessor -> select_action (inference_mode)
    -> postprocessor -> numpy,
timing the whole step and select_action alone (torch.cuda.synchronize before each clock read on CUDA). Chunk ticks
are those where the action queue was empty (a U-Net denoising run); the others pop a queued action. Also times the
vision encoder alone (policy.diffusion.rgb_encoder on one normalised frame, crop included).

TF32 is off (flowedge computes in float32); cudnn.benchmark is on as in lerobot-eval (--no-cudnn-benchmark turns it
off). The device of the preprocessor's device_processor step is overridden with --device, as lerobot-eval does.
Untimed warm-up ticks come first (the first CUDA call pays for kernel loading and cuDNN's algorithm search); the first
warm-up tick's time is reported as cold_first_tick_ms.

Usage: lerobot_policy_bench.py FOLDER [--device cuda|cpu] [--episodes 3] [--ticks 64] [--warmup-ticks 16]
                               [--encoder-iters 100] [--threads N] [--seed 0] [--json PATH]
Needs lerobot 0.4.4 importable (on a machine without internet: the wheels of tools/fetch_lerobot_wheels.sh on
PYTHONPATH). When
PyAV is missing, an import-only stand-in is put in sys.modules (LeRobot's video utilities import av at module level;
nothing here decodes video) and any use of it raises AttributeError.
"""
import argparse
import importlib.machinery
import json
import os
import platform
import sys
import time
import types

import numpy as np
import torch


def install_av_stand_in() -> bool:
    """Puts a stand-in `av` module in sys.modules when PyAV cannot be imported; returns whether it did."""
    try:
        import av  # noqa: F401
        return False
    except ImportError:
        pass
    # torchvision.io handles a missing PyAV itself (try: import av / except ImportError) but would take the stand-in
    # for a real one and probe av.video at import: let it see the missing module first.
    import torchvision.io  # noqa: F401
    mod = types.ModuleType("av")
    mod.__doc__ = "Import-only stand-in for PyAV (not installed here); any attribute use beyond logging raises."
    mod.__file__ = __file__
    mod.__spec__ = importlib.machinery.ModuleSpec("av", None)  # importlib.util.find_spec("av") reads it
    mod.logging = types.SimpleNamespace(WARNING=30, ERROR=40, INFO=20, DEBUG=10, set_level=lambda *a, **k: None,
                                        restore_default_callback=lambda *a, **k: None)

    def missing(name):
        # AttributeError, so that hasattr() probes (inspect.getmodule walks sys.modules) see a plain missing name.
        raise AttributeError(f"av.{name}: PyAV is not installed on this machine (import-only stand-in)")

    mod.__getattr__ = missing
    sys.modules["av"] = mod
    return True


def percentiles(ms: list) -> dict:
    if not ms:
        return {"n": 0}
    a = np.asarray(ms, dtype=np.float64)
    return {"n": int(a.size), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a.max()), "mean": float(a.mean()), "min": float(a.min())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="LeRobot pretrained_model folder (config.json, model.safetensors, processor files)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--episodes", type=int, default=3, help="timed episodes (reset + --ticks select_action each)")
    ap.add_argument("--ticks", type=int, default=64, help="select_action calls per episode")
    ap.add_argument("--warmup-ticks", type=int, default=16, help="untimed ticks of a first episode")
    ap.add_argument("--encoder-iters", type=int, default=100, help="timed rgb_encoder calls (after 5 untimed)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the synthetic observations and torch's noise")
    ap.add_argument("--no-cudnn-benchmark", action="store_true")
    ap.add_argument("--json", default=None, metavar="PATH")
    args = ap.parse_args()
    if args.episodes < 1 or args.ticks < 1 or args.warmup_ticks < 0 or args.encoder_iters < 1:
        ap.error("--episodes, --ticks and --encoder-iters must be >= 1, --warmup-ticks >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("flowedge: lerobot_policy_bench: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    torch.manual_seed(args.seed)

    av_stand_in = install_av_stand_in()
    import lerobot
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.configs.types import FeatureType
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import (batch_to_transition, policy_action_to_transition,
                                              transition_to_batch, transition_to_policy_action)

    folder = args.folder
    for name in ("config.json", "model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json"):
        if not os.path.isfile(os.path.join(folder, name)):
            print(f"flowedge: lerobot_policy_bench: {folder} lacks {name} (expected a LeRobot pretrained_model folder)",
                  file=sys.stderr)
            return 2
    cfg = PreTrainedConfig.from_pretrained(folder)
    if cfg.type != "diffusion":
        print(f"flowedge: lerobot_policy_bench: policy type (expected diffusion, got {cfg.type})", file=sys.stderr)
        return 2
    cfg.device = args.device
    t0 = time.perf_counter()
    policy = DiffusionPolicy.from_pretrained(folder, config=cfg, strict=True)
    policy.eval()
    pre = PolicyProcessorPipeline.from_pretrained(
        pretrained_model_name_or_path=folder, config_filename="policy_preprocessor.json",
        overrides={"device_processor": {"device": args.device}},
        to_transition=batch_to_transition, to_output=transition_to_batch)
    post = PolicyProcessorPipeline.from_pretrained(
        pretrained_model_name_or_path=folder, config_filename="policy_postprocessor.json",
        to_transition=policy_action_to_transition, to_output=transition_to_policy_action)
    load_s = time.perf_counter() - t0

    cams = [k for k, f in cfg.input_features.items() if f.type == FeatureType.VISUAL]
    vectors = [k for k, f in cfg.input_features.items() if f.type in (FeatureType.STATE, FeatureType.ENV)]
    rng = np.random.default_rng(args.seed)

    def observation() -> dict:
        """One env step's raw observation as a 1-env vector env gives it: uint8 [1, H, W, 3], float [1, d]."""
        obs = {}
        for k in cams:
            _, h, w = cfg.input_features[k].shape
            obs[k] = rng.integers(0, 256, size=(1, h, w, 3), dtype=np.uint8)
        for k in vectors:
            obs[k] = rng.uniform(-2.0, 12.0, size=(1, cfg.input_features[k].shape[0]))
        return obs

    def to_lerobot(obs: dict) -> dict:
        """lerobot.envs.utils.preprocess_observation: frames -> float32 [1, 3, H, W] / 255, vectors -> float32."""
        out = {}
        for k in cams:
            img = torch.from_numpy(obs[k]).permute(0, 3, 1, 2).contiguous().type(torch.float32)
            img /= 255
            out[k] = img
        for k in vectors:
            out[k] = torch.from_numpy(obs[k]).float()
        return out

    cuda = args.device == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def tick(obs: dict) -> tuple:
        """One lerobot-eval rollout step; returns (whole step s, select_action s, chunk tick?, action)."""
        sync()
        t_start = time.perf_counter()
        batch = pre(to_lerobot(obs))
        chunk = len(policy._queues["action"]) == 0
        sync()
        t_sel = time.perf_counter()
        with torch.inference_mode():
            action = policy.select_action(batch)
        sync()
        t_sel_end = time.perf_counter()
        action = post(action).to("cpu").numpy()
        t_end = time.perf_counter()
        return t_end - t_start, t_sel_end - t_sel, chunk, action

    cold_ms = None
    if args.warmup_ticks:
        policy.reset()
        for i in range(args.warmup_ticks):
            dt, _, _, _ = tick(observation())
            if i == 0:
                cold_ms = 1e3 * dt

    step_ms, select_ms, chunk_flags = [], [], []
    action_dim = None
    for _ in range(args.episodes):
        policy.reset()
        for _ in range(args.ticks):
            dt, ds, chunk, action = tick(observation())
            step_ms.append(1e3 * dt)
            select_ms.append(1e3 * ds)
            chunk_flags.append(chunk)
            action_dim = action.shape
            if not np.all(np.isfinite(action)):
                print(f"flowedge: lerobot_policy_bench: non-finite action {action}", file=sys.stderr)
                return 1

    # Encoder alone: one normalised frame of the first camera, the shared (or first per-camera) rgb_encoder.
    frame = pre(to_lerobot(observation()))[cams[0]] if cams else None
    enc_ms = []
    if frame is not None:
        enc = policy.diffusion.rgb_encoder
        enc = enc[0] if isinstance(enc, torch.nn.ModuleList) else enc
        with torch.inference_mode():
            for i in range(5 + args.encoder_iters):
                sync()
                t = time.perf_counter()
                feat = enc(frame)
                sync()
                if i >= 5:
                    enc_ms.append(1e3 * (time.perf_counter() - t))
        feat_shape = list(feat.shape)

    chunk_flags = np.asarray(chunk_flags)
    step_ms, select_ms = np.asarray(step_ms), np.asarray(select_ms)
    res = {
        "what": "LeRobot DiffusionPolicy select_action per tick (lerobot-eval step: preprocess_observation, "
                "preprocessor, select_action, postprocessor, numpy)",
        "folder": os.path.abspath(folder), "device": args.device,
        "device_name": torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine(),
        "lerobot": getattr(lerobot, "__version__", "?"), "torch": torch.__version__, "python": platform.python_version(),
        "threads": torch.get_num_threads(), "tf32": False, "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "av_stand_in": av_stand_in, "load_s": load_s,
        "policy": {"cameras": cams, "image_shapes": [list(cfg.input_features[k].shape) for k in cams],
                   "crop_shape": list(cfg.crop_shape) if cfg.crop_shape else None, "use_group_norm": cfg.use_group_norm,
                   "down_dims": list(cfg.down_dims), "scheduler": cfg.noise_scheduler_type,
                   "num_inference_steps": cfg.num_inference_steps, "horizon": cfg.horizon,
                   "n_obs_steps": cfg.n_obs_steps, "n_action_steps": cfg.n_action_steps,
                   "parameters": sum(p.numel() for p in policy.parameters()), "action_shape": list(action_dim)},
        "episodes": args.episodes, "ticks": args.ticks, "warmup_ticks": args.warmup_ticks, "seed": args.seed,
        "cold_first_tick_ms": cold_ms,
        "step_ms": {"all": percentiles(step_ms.tolist()), "chunk": percentiles(step_ms[chunk_flags].tolist()),
                    "non_chunk": percentiles(step_ms[~chunk_flags].tolist())},
        "select_action_ms": {"all": percentiles(select_ms.tolist()),
                             "chunk": percentiles(select_ms[chunk_flags].tolist()),
                             "non_chunk": percentiles(select_ms[~chunk_flags].tolist())},
        "encoder_ms": dict(percentiles(enc_ms), input_shape=list(frame.shape) if frame is not None else None,
                           feature_shape=feat_shape if frame is not None else None),
        "per_tick_step_ms": [round(float(x), 4) for x in step_ms],
        "per_tick_chunk": [bool(x) for x in chunk_flags],
    }

    print(f"LeRobot {res['lerobot']} DiffusionPolicy on {args.device} ({res['device_name']}), torch {torch.__version__}, "
          f"{res['threads']} threads, {args.episodes} episodes x {args.ticks} ticks, "
          f"{cfg.noise_scheduler_type} {cfg.num_inference_steps} steps, n_action_steps {cfg.n_action_steps}")
    print(f"{'ms':<24}{'n':>5}{'p50':>10}{'p99':>10}{'max':>10}{'mean':>10}")
    for label, table in (("step", res["step_ms"]), ("select_action", res["select_action_ms"])):
        for part in ("all", "chunk", "non_chunk"):
            s = table[part]
            if s["n"]:
                print(f"{label + ' ' + part:<24}{s['n']:>5}{s['p50']:>10.3f}{s['p99']:>10.3f}{s['max']:>10.3f}"
                      f"{s['mean']:>10.3f}")
    e = res["encoder_ms"]
    if e["n"]:
        print(f"{'rgb_encoder':<24}{e['n']:>5}{e['p50']:>10.3f}{e['p99']:>10.3f}{e['max']:>10.3f}{e['mean']:>10.3f}"
              f"   {e['input_shape']} -> {e['feature_shape']}")
    if cold_ms is not None:
        print(f"cold first tick (untimed warm-up): {cold_ms:.1f} ms; load {load_s:.2f} s")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
        print("wrote", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
