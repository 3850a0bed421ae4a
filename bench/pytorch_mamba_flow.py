#!/usr/bin/env python3
"""PyTorch eager baseline for bench/mamba_flow_bench: transformers MambaModel + the flow head of docs/models.md#flow-matching-head on the
same checkpoint, same prefix (tokens 1 2 3 4), same noise (sin(0.3*i)), 10 Euler steps, batch 1, same threads.
Prints p50/p99/max per whole action and per decode step and writes the same JSON keys as the C++ bench.
--device cuda runs the same eager modules on the GPU and times what a caller gets, like the C++ bench: inputs
copied host -> GPU and the result copied back (which synchronizes) inside every timed call. Without a usable
CUDA device it exits 77, without transformers 3, in both cases saying why (and writing {"skipped": why} to --json)."""
import argparse
import json
import math
import sys
import time

try:
    import torch
    from safetensors.torch import load_file
except ImportError as _e:  # say what is missing instead of a traceback
    print(f"pytorch_mamba_flow.py: needs torch and safetensors ({_e}); pip install torch safetensors", file=sys.stderr)
    sys.exit(3)


def stats(us):
    us = sorted(us)
    n = len(us)
    return {"p50": us[n // 2], "p99": us[min(n - 1, int(n * 0.99))], "max": us[-1], "mean": sum(us) / n, "min": us[0]}


def timed(fn, warmup, iters, before=None):
    """Wall clock of fn(i); before(i), when given, runs untimed ahead of every call."""
    for i in range(warmup):
        if before:
            before(i)
        fn(i)
    out = []
    for i in range(iters):
        if before:
            before(i)
        t0 = time.perf_counter_ns()
        fn(i)
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return stats(out)


class FlowHead(torch.nn.Module):
    """docs/models.md#flow-velocity-field: h = silu(in_proj x + time_proj [sin(t f) | cos(t f)] + cond_proj cond); h = silu(W_l h); v = out_proj h."""

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
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu (default) or cuda: eager modules on the GPU, H2D inputs and D2H result inside each timed call")
    a = ap.parse_args()

    def skip(code, why):
        print(f"pytorch_mamba_flow.py: {why}", file=sys.stderr)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"bench": "mamba_flow", "impl": "pytorch_eager", "device": a.device, "skipped": why}, f, indent=2)
        sys.exit(code)

    if a.device == "cuda" and not torch.cuda.is_available():
        skip(77, f"--device cuda but torch {torch.__version__} sees no usable CUDA device (torch.version.cuda={torch.version.cuda})")
    try:
        import transformers  # noqa: F401  (the Mamba backbone reference)
    except ImportError as e:
        skip(3, f"transformers is not importable ({e}); pip install transformers for the Mamba backbone baseline")
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    on_gpu = dev.type == "cuda"
    sd = load_file(a.model)
    mamba, head = load_mamba(sd).to(dev), FlowHead(sd).eval().to(dev)
    tokens = torch.tensor([[1, 2, 3, 4]])
    A = head.out_proj.weight.shape[0]
    noise = torch.sin(0.3 * torch.arange(A, dtype=torch.float32))[None]
    # Host <-> device as a caller sees it: identity on the CPU, a copy (D2H synchronizes) on the GPU.
    h2d = (lambda t: t.to(dev)) if on_gpu else (lambda t: t)
    d2h = (lambda t: t.cpu()) if on_gpu else (lambda t: t)

    with torch.inference_mode():
        def act(_):
            hidden = mamba(input_ids=h2d(tokens)).last_hidden_state
            return d2h(head.sample_euler(hidden[:, -1], h2d(noise), a.steps))

        action = act(0)
        r_act = timed(act, a.warmup, a.iters)
        r_prefill = timed(lambda _: d2h(mamba(input_ids=h2d(tokens)).last_hidden_state), a.warmup, a.iters)
        cond = d2h(mamba(input_ids=h2d(tokens)).last_hidden_state[:, -1])
        r_solve = timed(lambda _: d2h(head.sample_euler(h2d(cond), h2d(noise), a.steps)), a.warmup, a.iters)

        # Streaming decode through transformers' cache (one token per call; the hidden row comes back to the host).
        state = {}

        def restart(i):
            if i % 256 == 0:
                out = mamba(input_ids=h2d(tokens), use_cache=True)
                state["cache"], state["pos"] = out.cache_params, tokens.shape[1]
                if on_gpu:
                    torch.cuda.synchronize()

        def decode(i):
            tok = h2d(torch.tensor([[i % mamba.config.vocab_size]]))
            out = mamba(input_ids=tok, cache_params=state["cache"], use_cache=True,
                        cache_position=h2d(torch.tensor([state["pos"]])))
            d2h(out.last_hidden_state)
            state["pos"] += 1

        decode_error = None
        try:
            r_decode = timed(decode, a.warmup, a.iters, before=restart)
        except Exception as e:  # a transformers version whose cache API differs: keep the other numbers
            decode_error = f"{type(e).__name__}: {e}"
            r_decode = None

    from transformers.models.mamba import modeling_mamba
    res = {"bench": "mamba_flow", "impl": "pytorch_eager", "device": a.device, "threads": a.threads,
           "torch": torch.__version__, "transformers": transformers.__version__,
           "mamba_fast_path": bool(getattr(modeling_mamba, "is_fast_path_available", False)) if on_gpu else False,
           "steps": a.steps, "iters": a.iters,
           "action_us": r_act, "prefill_us": r_prefill, "flow_solve_us": r_solve, "decode_step_us": r_decode,
           "action_0_2": [float(v) for v in action[0, :3]]}
    if on_gpu:
        res["gpu"] = torch.cuda.get_device_name(0)
        res["timing"] = "host wall clock per call: inputs .to(cuda), eager forward, result .cpu() (synchronizes)"
    if decode_error:
        res["decode_error"] = decode_error
    where = f"cuda on {res['gpu']}" if on_gpu else f"{a.threads} thread(s)"
    print(f"pytorch eager ({where}, torch {torch.__version__}):")
    for k in ("action_us", "prefill_us", "flow_solve_us", "decode_step_us"):
        s = res[k]
        if s is None:
            print(f"  {k:16s} failed: {decode_error}")
            continue
        print(f"  {k:16s} min {s['min']:9.2f} us  p50 {s['p50']:9.2f} us  p99 {s['p99']:9.2f} us  max {s['max']:9.2f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    if decode_error:
        print(f"pytorch_mamba_flow.py: decode step not timed: {decode_error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
