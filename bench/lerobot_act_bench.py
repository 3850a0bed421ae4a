#!/usr/bin/env python3
"""LeRobot's own ACTPolicy chunk latency on the CPU, next to bench/act_bench's.

Loads a LeRobot ACT pretrained_model folder with LeRobot itself (ACTPolicy.from_pretrained and the folder's
policy_preprocessor.json through PolicyProcessorPipeline.from_pretrained, as lerobot_policy_bench.py does for the
Diffusion Policy), takes observation 0 of the reference episode in REF (tools/make_reference_act.py --bench writes
both), and times preprocessor + predict_action_chunk under torch.inference_mode at each thread count: wall time, and
the calling thread's CPU time (time.thread_time; at 1 thread all of torch's work runs there, so on a shared machine
it leaves out the slices other processes took, as act_bench's thread CPU time does). Eager PyTorch defaults (no
deterministic-algorithm mode, which the fixture script sets and which slows its own timing in info.json).

Usage: lerobot_act_bench.py FOLDER REF [--chunks 5] [--threads 1,2] [--json PATH]
"""
import argparse
import json
import sys
import time

import numpy as np
import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("ref")
    ap.add_argument("--chunks", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.configs.types import FeatureType
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import batch_to_transition, transition_to_batch

    cfg = PreTrainedConfig.from_pretrained(args.folder)
    if cfg.type != "act":
        print(f"flowedge: lerobot_act_bench: policy type (expected act, got {cfg.type})", file=sys.stderr)
        return 2
    cfg.device = "cpu"
    policy = ACTPolicy.from_pretrained(args.folder, config=cfg)
    policy.eval()
    pre = PolicyProcessorPipeline.from_pretrained(
        pretrained_model_name_or_path=args.folder, config_filename="policy_preprocessor.json",
        overrides={"device_processor": {"device": "cpu"}}, to_transition=batch_to_transition, to_output=transition_to_batch)
    # Observation 0: uint8 HWC frames -> float32 CHW / 255, states as stored, each with a batch dim.
    batch = {}
    for key, f in cfg.input_features.items():
        v = np.load(f"{args.ref}/{key}.npy")[0]
        batch[key] = (torch.from_numpy(v).permute(2, 0, 1).float().div(255) if f.type == FeatureType.VISUAL
                      else torch.from_numpy(v))[None]

    out = {"folder": args.folder, "torch": torch.__version__, "lerobot": getattr(__import__("lerobot"), "__version__", "?"), "runs": []}
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        wall, cpu = [], []
        for i in range(args.chunks + 1):  # the first is an untimed warm-up
            c0, t0 = time.thread_time(), time.perf_counter()
            with torch.inference_mode():
                policy.predict_action_chunk(pre(dict(batch)))
            if i:
                wall.append(1e3 * (time.perf_counter() - t0))
                cpu.append(1e3 * (time.thread_time() - c0))
        run = {"threads": threads, "n": len(wall), "wall_min_ms": min(wall), "wall_p50_ms": float(np.median(wall)),
               "thread_cpu_min_ms": min(cpu)}
        print(f"LeRobot ACT chunk, {threads} thread(s): wall min {run['wall_min_ms']:.1f} ms  p50 {run['wall_p50_ms']:.1f} ms  "
              f"thread CPU time min {run['thread_cpu_min_ms']:.1f} ms", flush=True)
        out["runs"].append(run)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
