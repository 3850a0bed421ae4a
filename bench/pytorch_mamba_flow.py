#!/usr/bin/env python3
"""PyTorch eager baseline for bench/mamba_flow_bench: transformers MambaModel + the SPEC 1.2 flow head on the
same checkpoint, same prefix (tokens 1 2 3 4), same noise (sin(0.3*i)), 10 Euler steps, batch 1, same threads.
Prints p50/p99/max per whole action and per decode step and writes the same JSON keys as the C++ bench."""
import argparse
import json
import math
import time

import torch
from safetensors.torch import load_file


def stats(us):
    us = sorted(us)
    n = len(us)
    return {"p50": us[n // 2], "p99": us[min(n - 1, int(n * 0.99))], "max": us[-1], "mean": sum(us) / n, "min": us[0]}


def timed(fn, warmup, iters):
    for i in range(warmup):
        fn(i)
    out = []
    for i in range(iters):
        t0 = time.perf_counter_ns()
        fn(i)
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return stats(out)


class FlowHead(torch.nn.Module):
    """SPEC 1.2: h = silu(in_proj x + time_proj [sin(t f) | cos(t f)] + cond_proj cond); h = silu(W_l h); v = out_proj h."""

    def __init__(self, sd):
        super().__init__()
        w = {k[len("flow."):]: v for k, v in sd.items() if k.startswith("flow.")}
        H, A = w["in_proj.weight"].shape
        self.time_dim = w["time_proj.weight"].shape[1]
        cd = w["cond_proj.weight"].shape[1]
        n_layers = 0
        while f"layers.{n_layers}.weight" in w:
            n_layers += 1
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)
        self.in_proj, self.time_proj, self.cond_proj = lin(A, H), lin(self.time_dim, H), lin(cd, H)
        self.layers = torch.nn.ModuleList([lin(H, H) for _ in range(n_layers)])
        self.out_proj = lin(H, A)
        self.load_state_dict({k: v.float() for k, v in w.items()})
        half = self.time_dim // 2
        self.register_buffer("freqs", 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half))

    def velocity(self, x, t, c):
        tf = t * self.freqs
        h = torch.nn.functional.silu(self.in_proj(x) + self.time_proj(torch.cat([torch.sin(tf), torch.cos(tf)])[None]) + c)
        for layer in self.layers:
            h = torch.nn.functional.silu(layer(h))
        return self.out_proj(h)

    def sample_euler(self, cond, noise, steps):
        c = self.cond_proj(cond)
        x = noise
        dt = 1.0 / steps
        for k in range(steps):
            x = x + dt * self.velocity(x, k * dt, c)
        return x


def load_mamba(sd):
    from transformers import MambaConfig, MambaModel

    b = {k[len("backbone."):]: v.float() for k, v in sd.items() if k.startswith("backbone.")}
    vocab, d_model = b["embeddings.weight"].shape
    n_layers = 0
    while f"layers.{n_layers}.mixer.in_proj.weight" in b:
        n_layers += 1
    d_inner = b["layers.0.mixer.in_proj.weight"].shape[0] // 2
    cfg = MambaConfig(vocab_size=vocab, hidden_size=d_model, state_size=b["layers.0.mixer.A_log"].shape[1],
                      num_hidden_layers=n_layers, expand=d_inner // d_model, conv_kernel=b["layers.0.mixer.conv1d.weight"].shape[2],
                      time_step_rank=b["layers.0.mixer.dt_proj.weight"].shape[1], use_bias=False, use_conv_bias=True,
                      layer_norm_epsilon=1e-5, residual_in_fp32=True, use_mambapy=False)
    model = MambaModel(cfg).eval()
    model.load_state_dict(b)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("model", nargs="?", default="models/mamba_flow.safetensors")
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    sd = load_file(a.model)
    mamba, head = load_mamba(sd), FlowHead(sd).eval()
    tokens = torch.tensor([[1, 2, 3, 4]])
    A = head.out_proj.weight.shape[0]
    noise = torch.sin(0.3 * torch.arange(A, dtype=torch.float32))[None]

    with torch.inference_mode():
        def act(_):
            hidden = mamba(input_ids=tokens).last_hidden_state
            return head.sample_euler(hidden[:, -1], noise, a.steps)

        action = act(0)
        r_act = timed(act, a.warmup, a.iters)
        r_prefill = timed(lambda _: mamba(input_ids=tokens), a.warmup, a.iters)
        cond = mamba(input_ids=tokens).last_hidden_state[:, -1]
        r_solve = timed(lambda _: head.sample_euler(cond, noise, a.steps), a.warmup, a.iters)

        # Streaming decode through transformers' cache (one token per call).
        state = {}

        def restart():
            out = mamba(input_ids=tokens, use_cache=True)
            state["cache"], state["pos"] = out.cache_params, tokens.shape[1]

        def decode(i):
            if i % 256 == 0:
                restart()
            tok = torch.tensor([[i % mamba.config.vocab_size]])
            mamba(input_ids=tok, cache_params=state["cache"], use_cache=True,
                  cache_position=torch.tensor([state["pos"]]))
            state["pos"] += 1

        restart()
        r_decode = timed(decode, a.warmup, a.iters)

    res = {"bench": "mamba_flow", "impl": "pytorch_eager", "device": "cpu", "threads": a.threads,
           "torch": torch.__version__, "steps": a.steps, "iters": a.iters,
           "action_us": r_act, "prefill_us": r_prefill, "flow_solve_us": r_solve, "decode_step_us": r_decode,
           "action_0_2": [float(v) for v in action[0, :3]]}
    print(f"pytorch eager ({a.threads} thread(s), torch {torch.__version__}):")
    for k in ("action_us", "prefill_us", "flow_solve_us", "decode_step_us"):
        s = res[k]
        print(f"  {k:16s} p50 {s['p50']:9.2f} us  p99 {s['p99']:9.2f} us  max {s['max']:9.2f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
