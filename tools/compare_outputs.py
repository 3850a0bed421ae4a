#!/usr/bin/env python3
"""Compares the aarch64 (qemu) run of a demo program with the x86 run of the same program on the same checkpoint,
within the parity bounds of docs/numerics.md#parity-tolerances. Standard library only: CI's aarch64 stage needs no
venv.

  compare_outputs.py text X86.txt ARM.txt --rel TOL
      every decimal number on the non-latency lines, |arm - x86| <= TOL * (largest |x86| decimal on that line):
      flow_sample's action values, mamba_forward's hidden-state values and summary. Integers (sizes, step counts,
      indices) are part of the text, which must match exactly once the decimals are masked.
  compare_outputs.py actions X86.npy ARM.npy --checkpoint CKPT --max-abs TOL
      diffusion_sample --out horizons [batch, horizon, action_dim], compared in normalised units: the difference is
      divided by half of each action's range (dp.action_min / dp.action_max read from the compact checkpoint), as
      LeRobot's min-max normaliser maps [min, max] to [-1, 1].
Prints one line per comparison; exit status 0 within the bound, 1 outside, 2 on unreadable input.
"""
import argparse
import json
import re
import struct
import sys

DECIMAL = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|nan|inf)(?![\w.])", re.IGNORECASE)


def read_npy_f32(path):
    """Shape and values of a little-endian float32 .npy (version 1 or 2 header, C order)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY":
        raise ValueError(f"{path}: not a .npy file")
    major = data[6]
    if major == 1:
        (hlen,), start = struct.unpack_from("<H", data, 8), 10
    else:
        (hlen,), start = struct.unpack_from("<I", data, 8), 12
    header = data[start:start + hlen].decode("latin1")
    if "'<f4'" not in header or "'fortran_order': False" not in header:
        raise ValueError(f"{path}: expected a C-order <f4 array, header {header.strip()}")
    shape = tuple(int(d) for d in re.search(r"'shape': \(([^)]*)\)", header).group(1).split(",") if d.strip())
    body = data[start + hlen:]
    count = len(body) // 4
    return shape, struct.unpack(f"<{count}f", body[:count * 4])


def read_safetensors_f32(path, name):
    """One F32 tensor of a safetensors file (8-byte header length, JSON header, data)."""
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
        info = header.get(name)
        if info is None or info["dtype"] != "F32":
            raise ValueError(f"{path}: no F32 tensor '{name}'")
        begin, end = info["data_offsets"]
        f.seek(8 + hlen + begin)
        raw = f.read(end - begin)
    return struct.unpack(f"<{len(raw) // 4}f", raw)


def result_lines(path):
    """(line with its decimals masked, decimals) for each line that carries results (latency is machine-dependent)."""
    out = []
    with open(path) as f:
        for line in f:
            if line.startswith("latency"):
                continue
            out.append((DECIMAL.sub("#", line.rstrip()), [float(x) for x in DECIMAL.findall(line)]))
    return out


def compare_text(args):
    x86, arm = result_lines(args.x86), result_lines(args.arm)
    if [m for m, _ in x86] != [m for m, _ in arm]:
        print(f"flowedge compare: {args.arm}: lines differ from {args.x86} beyond their decimals")
        return 1
    count, worst = 0, 0.0  # worst: max |arm - x86| over the values, relative to the largest |x86| of its line
    for (_, xs), (_, ys) in zip(x86, arm):
        scale = max((abs(v) for v in xs), default=0.0) or 1.0
        for a, b in zip(xs, ys):
            worst = max(worst, abs(a - b) / scale)
            count += 1
    if count == 0:
        print(f"flowedge compare: {args.x86}: no result values")
        return 1
    ok = worst <= args.rel
    print(f"flowedge compare: {args.arm}: {count} values, max |arm - x86| = {worst:.3g} of the line's largest value "
          f"(bound {args.rel:g}): {'ok' if ok else 'OUTSIDE'}")
    return 0 if ok else 1


def compare_actions(args):
    xshape, xs = read_npy_f32(args.x86)
    yshape, ys = read_npy_f32(args.arm)
    if xshape != yshape or len(xshape) != 3:
        print(f"flowedge compare: {args.arm}: shape {yshape}, x86 {xshape} (expected equal [batch, horizon, action_dim])")
        return 1
    lo = read_safetensors_f32(args.checkpoint, "dp.action_min")
    hi = read_safetensors_f32(args.checkpoint, "dp.action_max")
    a = xshape[2]
    if len(lo) != a or len(hi) != a:
        print(f"flowedge compare: {args.checkpoint}: action range of {len(lo)} values, outputs have action_dim {a}")
        return 1
    worst = max(abs(x - y) / (0.5 * (hi[i % a] - lo[i % a])) for i, (x, y) in enumerate(zip(xs, ys)))
    ok = worst <= args.max_abs
    print(f"flowedge compare: {args.arm}: {len(xs)} actions {list(xshape)}, max |arm - x86| = {worst:.3g} normalised "
          f"(bound {args.max_abs:g}): {'ok' if ok else 'OUTSIDE'}")
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="kind", required=True)
    t = sub.add_parser("text")
    t.add_argument("x86")
    t.add_argument("arm")
    t.add_argument("--rel", type=float, required=True)
    n = sub.add_parser("actions")
    n.add_argument("x86")
    n.add_argument("arm")
    n.add_argument("--checkpoint", required=True)
    n.add_argument("--max-abs", type=float, required=True)
    args = p.parse_args()
    try:
        return compare_text(args) if args.kind == "text" else compare_actions(args)
    except (OSError, ValueError, KeyError, struct.error) as e:
        print(f"flowedge compare: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
