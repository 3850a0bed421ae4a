#!/usr/bin/env python3
"""Seeded DDPM noise of docs/models.md#seeded-noise (SplitMix64 + Box-Muller), random-access form, used to build cross-checked references.

Batch element b uses the stream seeded with s = seed + b. Raw output n (0-based) is
mix(s + (n+1)*0x9e3779b97f4a7c15 mod 2^64), the standard SplitMix64 step. uniform(u) = ((u >> 40) + 1) / 16777217.0
in (0, 1]. Normal draw j uses raw outputs 2*(j//2) (u1) and 2*(j//2)+1 (u2): r = sqrt(-2 ln u1), th = 2*pi*u2,
r*cos(th) for even j, r*sin(th) for odd j; computed in double, cast to float32. Denoising step k (0-based among the
steps that add noise) consumes normals [k*H*A, (k+1)*H*A) in [horizon][action] order.

Run as a script to write test/fixtures/splitmix_normals.json (first normals for seeds 0 and 42).
"""
import json
import math
import os
import sys

import numpy as np

GOLDEN = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    z &= MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def raw(stream_seed: int, n: int) -> int:
    """Raw 64-bit output n (0-based) of the SplitMix64 stream seeded with stream_seed."""
    return _mix(stream_seed + (n + 1) * GOLDEN)


def uniform(u: int) -> float:
    """Map a raw 64-bit output to a double in (0, 1] using its top 24 bits."""
    return ((u >> 40) + 1) / 16777217.0


def normal(stream_seed: int, j: int) -> float:
    """Normal draw j (0-based) of one stream, in double precision."""
    p = j // 2
    u1 = uniform(raw(stream_seed, 2 * p))
    u2 = uniform(raw(stream_seed, 2 * p + 1))
    r = math.sqrt(-2.0 * math.log(u1))
    th = 2.0 * math.pi * u2
    return r * math.cos(th) if j % 2 == 0 else r * math.sin(th)


def stream_normals(stream_seed: int, count: int) -> np.ndarray:
    """float32 [count]: normal draws 0..count-1 of one stream, vectorised (the same numbers as normal(), which is
    per element and too slow for the millions of generated fixture weights of tools/make_reference_dp_image.py)."""
    pairs = (count + 1) // 2
    n = np.arange(2 * pairs, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(stream_seed & MASK) + (n + np.uint64(1)) * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = ((z >> np.uint64(40)).astype(np.float64) + 1.0) / 16777217.0
    r = np.sqrt(-2.0 * np.log(u[0::2]))
    th = 2.0 * math.pi * u[1::2]
    out = np.empty(2 * pairs, dtype=np.float64)
    out[0::2] = r * np.cos(th)
    out[1::2] = r * np.sin(th)
    return out[:count].astype(np.float32)


def normals(seed: int, batch: int, start: int, count: int) -> np.ndarray:
    """float32 [batch, count]: normal draws [start, start+count) of the streams seed+0 .. seed+batch-1."""
    out = np.empty((batch, count), dtype=np.float32)
    for b in range(batch):
        s = (seed + b) & MASK
        for i in range(count):
            out[b, i] = np.float32(normal(s, start + i))
    return out


def step_noise(seed: int, batch: int, step: int, horizon: int, action_dim: int) -> np.ndarray:
    """float32 [batch, horizon, action_dim]: the noise added by noise-adding denoising step `step` (0-based)."""
    n = horizon * action_dim
    return normals(seed, batch, step * n, n).reshape(batch, horizon, action_dim)


def _self_check() -> None:
    # Known SplitMix64 outputs for seed 0 (Vigna's reference generator): 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4.
    assert raw(0, 0) == 0xE220A8397B1DCDAF, hex(raw(0, 0))
    assert raw(0, 1) == 0x6E789E6AA1B965F4, hex(raw(0, 1))


def main() -> int:
    _self_check()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(repo, "test", "fixtures", "splitmix_normals.json")
    doc = {
        "about": "docs/models.md#seeded-noise SplitMix64 + Box-Muller normals, made by tools/splitmix_noise.py",
        "uniform": "((u >> 40) + 1) / 16777217.0",
        "raw_seed0_first2_hex": [hex(raw(0, 0)), hex(raw(0, 1))],
        "streams": [],
    }
    for seed in (0, 42):
        doc["streams"].append({
            "seed": seed,
            "raw_hex_first4": [hex(raw(seed, n)) for n in range(4)],
            "normals_first6_f64": [normal(seed, j) for j in range(6)],
            "normals_first6_f32": [float(v) for v in normals(seed, 1, 0, 6)[0]],
        })
    # A random-access sample deep in the stream (step 3 of a 16x2 horizon, batch element 1 of seed 7).
    doc["seed7_b1_step3_first4_f32"] = [float(v) for v in step_noise(7, 2, 3, 16, 2)[1].reshape(-1)[:4]]
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    for s in doc["streams"]:
        print("seed", s["seed"], " ".join(f"{v:.9g}" for v in s["normals_first6_f32"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
