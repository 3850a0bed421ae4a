"""Overhead of flowedge.DiffusionPolicy.select_action from Python over the C++ call (issue 19: within 0.1 ms).

Runs the same observation through n C++ select_action calls timed inside the module (_time_select_action) and n
Python calls timed around policy.select_action(obs_dict), both from reset(), and prints the medians of the queue-pop
ticks and of the chunk ticks and their differences. Not a pytest test (timings are not asserted).

    python python/tests/time_select_action.py [FOLDER | dp_small | dp_image_gn | dp_image_bn] [--n 400] [--device cpu]
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import flowedge

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parents[1] / "test" / "fixtures"
sys.path.insert(0, str(HERE))


def folder_of(name: str, tmp: str) -> Path:
    if Path(name).is_dir():
        return Path(name)
    src = FIXTURES / name
    if (src / "manifest.json").is_file():  # image fixture: model.safetensors rebuilt from the manifest
        from lerobot_fixture import rebuild

        return rebuild(src, Path(tmp) / name)
    return src


def observation(p, layout: str) -> dict:
    rng = np.random.default_rng(0)
    obs = {p.state_key: rng.standard_normal(p.state_dim).astype(np.float32)}
    if p.env_key:
        obs[p.env_key] = rng.standard_normal(p.env_dim).astype(np.float32)
    for key, (c, h, w) in p.camera_shapes.items():
        obs[key] = (rng.integers(0, 256, (h, w, c), dtype=np.uint8) if layout == "u8"
                    else rng.random((c, h, w), dtype=np.float32))
    return obs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("policy", nargs="?", default="dp_image_gn")
    ap.add_argument("--n", type=int, default=400, help="calls per side (a multiple of n_action_steps)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layout", choices=("u8", "f32"), default="u8")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = folder_of(args.policy, tmp)
        p = flowedge.DiffusionPolicy(folder, device=args.device, steps=args.steps, scheduler="ddim")
        obs = observation(p, args.layout)
        chunk = np.arange(args.n) % p.n_action_steps == 0
        p.reset()
        p._time_select_action(obs, 2 * p.n_action_steps)  # warm-up (graph capture on CUDA)
        p.reset()
        cpp = p._time_select_action(obs, args.n).astype(np.float64)
        p.reset()
        py = np.empty(args.n)
        for i in range(args.n):
            t0 = time.perf_counter()
            p.select_action(obs)
            py[i] = time.perf_counter() - t0
    res = {"policy": str(args.policy), "device": p.backend, "cameras": p.camera_shapes, "layout": args.layout, "n": args.n}
    for name, sel in (("pop", ~chunk), ("chunk", chunk)):
        c, y = float(np.median(cpp[sel])) * 1e3, float(np.median(py[sel])) * 1e3
        res[name] = {"cpp_p50_ms": round(c, 4), "python_p50_ms": round(y, 4), "overhead_ms": round(y - c, 4)}
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
