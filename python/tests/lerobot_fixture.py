"""Rebuilds a committed LeRobot image-policy fixture folder (test/fixtures/dp_image_gn, dp_image_bn) in numpy.

Their model.safetensors is not committed: every generated tensor is ``float32(a + b * n)`` (rule "lin") or
``float32(a + b * n * n)`` (rule "sq") of the SplitMix64 normals of its seed (tools/make_reference_dp_image.py,
manifest.json), the rest (pos_grid, BatchNorm counters) is in constants.safetensors. No torch needed.
"""
from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_,
           "F16": np.float16}
_NAMES = {np.dtype(v).str: k for k, v in _DTYPES.items()}


def splitmix_normals(seed: int, count: int) -> np.ndarray:
    """Normals 0..count-1 of the SplitMix64 stream ``seed`` (docs/models.md#box-muller), float32."""
    pairs = (count + 1) // 2
    n = np.arange(2 * pairs, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (n + np.uint64(1)) * _GOLDEN
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


def read_safetensors(path: Path) -> dict:
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        out[key] = np.frombuffer(raw[8 + n + lo:8 + n + hi], dtype=_DTYPES[info["dtype"]]).reshape(info["shape"]).copy()
    return out


def write_safetensors(path: Path, tensors: dict) -> None:
    header, blobs, off = {}, [], 0
    for key in sorted(tensors):
        a = np.ascontiguousarray(tensors[key])
        b = a.tobytes()
        header[key] = {"dtype": _NAMES[a.dtype.str], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def rebuild(fixture: Path, out: Path) -> Path:
    """Copies ``fixture`` to ``out`` and writes its model.safetensors; returns ``out``."""
    out = Path(out)
    shutil.copytree(fixture, out, dirs_exist_ok=True)
    manifest = json.loads((fixture / "manifest.json").read_text())
    tensors = read_safetensors(fixture / "constants.safetensors")
    for g in manifest["generated"]:
        n = splitmix_normals(int(g["seed"]), int(np.prod(g["shape"]))).astype(np.float64)
        v = g["a"] + g["b"] * (n * n if g["rule"] == "sq" else n)
        v = v.astype(np.float32).reshape(g["shape"])
        assert abs(float(v.astype(np.float64).sum()) - g["sum"]) <= 1e-6 * max(1.0, abs(g["sum"])), g["key"]
        tensors[g["key"]] = v
    write_safetensors(out / "model.safetensors", tensors)
    return out
