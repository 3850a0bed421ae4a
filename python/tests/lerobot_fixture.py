"""Rebuilds a committed LeRobot image-policy fixture folder (test/fixtures/dp_image_gn, dp_image_bn) in numpy.

Their model.safetensors is not committed: every generated tensor is ``float32(a + b * n)`` (rule "lin") or
``float32(a + b * n * n)`` (rule "sq") of the SplitMix64 normals of its seed (tools/make_reference_dp_image.py,
manifest.json), the rest (pos_grid, BatchNorm counters) is in constants.safetensors. No torch needed.
"""
from __future__ import annotations

import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from splitmix_noise import stream_normals  # noqa: E402  (the generator make_reference_dp_image.py used)

_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_,
           "F16": np.float16}
_NAMES = {np.dtype(v).str: k for k, v in _DTYPES.items()}


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
        n = stream_normals(int(g["seed"]), int(np.prod(g["shape"]))).astype(np.float64)
        v = g["a"] + g["b"] * (n * n if g["rule"] == "sq" else n)
        v = v.astype(np.float32).reshape(g["shape"])
        assert abs(float(v.astype(np.float64).sum()) - g["sum"]) <= 1e-6 * max(1.0, abs(g["sum"])), g["key"]
        tensors[g["key"]] = v
    write_safetensors(out / "model.safetensors", tensors)
    return out
