#!/usr/bin/env python3
"""Builds the reference Mamba-1 + flow-matching checkpoint (transformers MambaModel + the docs/models.md#flow-matching-head head) and its outputs.

Writes test/fixtures/mamba_flow/: mamba_flow.safetensors (backbone.* + flow.*, names of docs/formats.md#mamba-flow-checkpoint), head-only and
backbone-only variants, float32 .npy references and refs.json. CPU, float32, transformers' pure-PyTorch Mamba path.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

import transformers
from transformers import MambaConfig, MambaModel

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

D_MODEL, VOCAB, D_STATE, EXPAND, D_CONV, N_LAYERS = 128, 256, 16, 2, 4, 2
TM, HID, N_HID_LAYERS, ACT = 64, 256, 2, 8


class FlowHead(nn.Module):
    """Velocity field of docs/models.md#flow-velocity-field v(x, t | cond), written directly from those formulas (no biases)."""

    def __init__(self, action_dim: int, hidden: int, time_dim: int, cond_dim: int, n_layers: int):
        super().__init__()
        assert time_dim % 2 == 0
        self.time_dim = time_dim
        self.in_proj = nn.Linear(action_dim, hidden, bias=False)
        self.time_proj = nn.Linear(time_dim, hidden, bias=False)
        self.cond_proj = nn.Linear(cond_dim, hidden, bias=False)
        self.layers = nn.ModuleList([nn.Linear(hidden, hidden, bias=False) for _ in range(n_layers)])
        self.out_proj = nn.Linear(hidden, action_dim, bias=False)
        # Seeded by the caller's torch.manual_seed. Wider than nn.Linear's default so that v(x, t) is O(1) and
        # clearly non-linear in x and t: solver, time-embedding and layer-order bugs then move the samples visibly.
        with torch.no_grad():
            for lin, gain in [(self.in_proj, 1.0), (self.time_proj, 1.5), (self.cond_proj, 1.0),
                              *[(layer, 1.5) for layer in self.layers], (self.out_proj, 1.5)]:
                lin.weight.normal_(0.0, gain / math.sqrt(lin.in_features))
        half = time_dim // 2
        freqs = torch.tensor([10000.0 ** (-j / half) for j in range(half)], dtype=torch.float64)
        self.register_buffer("freqs", freqs.to(torch.float32), persistent=False)

    def cond_term(self, cond: torch.Tensor) -> torch.Tensor:
        """c = cond_proj @ cond, computed once per solve. cond [B, Cd] -> [B, H]."""
        return self.cond_proj(cond)

    def velocity(self, x: torch.Tensor, t: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """x [B, A], t [B] (float32), c [B, H] -> v [B, A]."""
        tf = t[:, None] * self.freqs[None, :]
        temb = torch.cat([torch.sin(tf), torch.cos(tf)], dim=-1)
        h = nn.functional.silu(self.in_proj(x) + self.time_proj(temb) + c)
        for layer in self.layers:
            h = nn.functional.silu(layer(h))
        return self.out_proj(h)

    def sample(self, noise: torch.Tensor, cond: torch.Tensor, solver: str, n_steps: int) -> torch.Tensor:
        """Integrate from t = 0 (noise [B, A]) to t = 1 with N fixed steps; t_k = k*dt."""
        c = self.cond_term(cond)
        x = noise.clone()
        dt = 1.0 / n_steps
        b = x.shape[0]
        for k in range(n_steps):
            t = torch.full((b,), k * dt, dtype=torch.float32)
            if solver == "euler":
                x = x + dt * self.velocity(x, t, c)
            elif solver == "heun":
                k1 = self.velocity(x, t, c)
                k2 = self.velocity(x + dt * k1, t + dt, c)
                x = x + dt / 2 * (k1 + k2)
            elif solver == "rk4":
                k1 = self.velocity(x, t, c)
                k2 = self.velocity(x + dt / 2 * k1, t + dt / 2, c)
                k3 = self.velocity(x + dt / 2 * k2, t + dt / 2, c)
                k4 = self.velocity(x + dt * k3, t + dt, c)
                x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
            else:
                raise ValueError(solver)
        return x


def mamba_init_fixups(model: MambaModel, gen: torch.Generator) -> dict:
    """Mamba's own init for A_log / dt bias if transformers left them trivial, then seeded perturbations of the
    all-ones / structured parameters (norm gains, D, A_log) so that every tensor influences the output."""
    notes = {}
    cfg = model.config
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            m = layer.mixer
            a_s4d = torch.log(torch.arange(1, cfg.state_size + 1, dtype=torch.float32)).expand(m.intermediate_size, -1)
            if i == 0:
                notes["A_log_was_s4d_real"] = bool(torch.allclose(m.A_log, a_s4d))
                notes["dt_bias_was_zero"] = bool(torch.all(m.dt_proj.bias == 0))
            m.A_log.copy_(a_s4d + 0.05 * torch.randn(m.A_log.shape, generator=gen))
            # Mamba dt init: dt ~ exp(U[log 1e-3, log 1e-1]) clamped at 1e-4; bias = softplus^{-1}(dt).
            dt = torch.exp(torch.rand(m.intermediate_size, generator=gen) * (math.log(0.1) - math.log(1e-3))
                           + math.log(1e-3)).clamp(min=1e-4)
            m.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            m.D.copy_(1.0 + 0.2 * torch.randn(m.D.shape, generator=gen))
            m.conv1d.bias.add_(0.05 * torch.randn(m.conv1d.bias.shape, generator=gen))
            layer.norm.weight.copy_(1.0 + 0.2 * torch.randn(layer.norm.weight.shape, generator=gen))
        model.norm_f.weight.copy_(1.0 + 0.2 * torch.randn(model.norm_f.weight.shape, generator=gen))
    return notes


def spec_mamba_prefill(sd: dict, tokens: list[int], n_layers: int) -> np.ndarray:
    """docs/models.md#mamba-1-backbone re-derived in float64 numpy from the saved tensors (independent of transformers' code)."""
    w = {k: v.double().numpy() for k, v in sd.items()}

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g

    def silu(x):
        return x / (1 + np.exp(-x))

    h = w["backbone.embeddings.weight"][tokens]
    L = len(tokens)
    for i in range(n_layers):
        p = f"backbone.layers.{i}."
        m = p + "mixer."
        n = rms(h, w[p + "norm.weight"])
        xz = n @ w[m + "in_proj.weight"].T
        di = xz.shape[1] // 2
        x, z = xz[:, :di], xz[:, di:]
        cw, cb = w[m + "conv1d.weight"], w[m + "conv1d.bias"]
        K = cw.shape[2]
        xp = np.concatenate([np.zeros((K - 1, di)), x])
        u = silu(cb + sum(cw[:, 0, k] * xp[k:k + L] for k in range(K)))
        dbl = u @ w[m + "x_proj.weight"].T
        r = w[m + "dt_proj.weight"].shape[1]
        ds = w[m + "A_log"].shape[1]
        dtl, Bm, Cm = dbl[:, :r], dbl[:, r:r + ds], dbl[:, r + ds:]
        dt = np.logaddexp(0.0, dtl @ w[m + "dt_proj.weight"].T + w[m + "dt_proj.bias"])
        A = -np.exp(w[m + "A_log"])
        st = np.zeros((di, ds))
        y = np.zeros((L, di))
        for t in range(L):
            st = np.exp(dt[t][:, None] * A) * st + (dt[t] * u[t])[:, None] * Bm[t][None, :]
            y[t] = st @ Cm[t] + w[m + "D"] * u[t]
        h = h + (y * silu(z)) @ w[m + "out_proj.weight"].T
    return rms(h, w["backbone.norm_f.weight"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(REPO, "test", "fixtures", "mamba_flow"))
    ap.add_argument("--seed", type=int, default=2024)
    args = ap.parse_args()
    out = args.out
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False

    torch.manual_seed(args.seed)
    cfg = MambaConfig(vocab_size=VOCAB, hidden_size=D_MODEL, state_size=D_STATE, num_hidden_layers=N_LAYERS,
                      expand=EXPAND, conv_kernel=D_CONV, time_step_rank="auto", use_bias=False, use_conv_bias=True,
                      layer_norm_epsilon=1e-5, use_mambapy=False)
    model = MambaModel(cfg).float().eval()
    gen = torch.Generator().manual_seed(args.seed + 1)
    notes = mamba_init_fixups(model, gen)
    head = FlowHead(ACT, HID, TM, D_MODEL, N_HID_LAYERS).float().eval()

    # docs/formats.md#mamba-flow-checkpoint names: backbone.* straight from MambaModel's state dict, flow.* from the head.
    back_sd = {"backbone." + k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    flow_sd = {"flow." + k: v.detach().contiguous().clone() for k, v in head.state_dict().items()}
    # One metadata key only: safetensors writes a multi-key map in hash order, which would make the file non-reproducible.
    meta = {"made_by": "tools/make_reference_mamba_flow.py (flowedge mamba_flow reference)"}
    save_file({**back_sd, **flow_sd}, os.path.join(out, "mamba_flow.safetensors"), metadata=meta)
    save_file(flow_sd, os.path.join(out, "mamba_flow_head_only.safetensors"), metadata=meta)
    save_file(back_sd, os.path.join(out, "mamba_flow_backbone_only.safetensors"), metadata=meta)

    files = {}

    def save(name, t, what):
        a = t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
        a = np.ascontiguousarray(a, dtype=np.int32 if a.dtype.kind in "iu" else np.float32)
        np.save(os.path.join(out, name + ".npy"), a)
        files[name + ".npy"] = {"shape": list(a.shape), "dtype": str(a.dtype), "what": what}

    tok4 = torch.tensor([[1, 2, 3, 4]], dtype=torch.long)
    tok37 = torch.randint(0, VOCAB, (1, 37), generator=gen, dtype=torch.long)
    with torch.no_grad():
        h4 = model(input_ids=tok4).last_hidden_state[0]
        h37 = model(input_ids=tok37).last_hidden_state[0]
        # Token-by-token decode through transformers' MambaCache, starting from the zero state. Its single-token
        # path rolls the conv window left and writes slot clamp(cache_position, 0, K-1), so a decode that starts
        # from an empty cache must pass cache_position >= K-1 (position i < K-1 would write the wrong slot).
        from transformers.models.mamba.modeling_mamba import MambaCache
        cache = MambaCache(cfg, max_batch_size=1, dtype=torch.float32, device="cpu")
        rows = []
        for i in range(tok37.shape[1]):
            o = model(input_ids=tok37[:, i:i + 1], cache_params=cache, use_cache=True,
                      cache_position=torch.tensor([max(i, D_CONV - 1)], dtype=torch.long))
            rows.append(o.last_hidden_state[0, 0])
            cache = o.cache_params
        d37 = torch.stack(rows)
        err = (d37 - h37).abs().max().item()
        rel = err / h37.abs().max().item()
        print(f"decode vs prefill (37 tokens): max abs {err:.3e}, rel {rel:.3e}")
        assert rel < 1e-5, rel

        spec_rel = {}
        for name, tok, ref in (("prefill4", tok4, h4), ("prefill37", tok37, h37)):
            mine = spec_mamba_prefill(back_sd, tok[0].tolist(), N_LAYERS)
            spec_rel[name] = float(np.abs(mine - ref.double().numpy()).max() / np.abs(mine).max())
            print(f"{name}: transformers vs docs/models.md float64 numpy, max rel {spec_rel[name]:.3e}")
            assert spec_rel[name] < 1e-5, spec_rel

        save("tokens4", tok4[0], "token ids [4]")
        save("tokens37", tok37[0], "token ids [37] (seeded random)")
        save("prefill4_hidden", h4, "MambaModel(tokens4).last_hidden_state [4, 128] (after norm_f)")
        save("prefill37_hidden", h37, "MambaModel(tokens37).last_hidden_state [37, 128]")
        save("decode37_hidden", d37, "token-by-token decode through MambaCache [37, 128] (= prefill rows)")

        cond1 = h4[-1:].clone()
        noise1 = torch.tensor([[math.sin(0.3 * i) for i in range(ACT)]], dtype=torch.float32)
        cond3 = torch.randn(3, D_MODEL, generator=gen)
        noise3 = torch.randn(3, ACT, generator=gen)
        save("flow_cond1", cond1, "condition = last row of prefill4_hidden [1, 128]")
        save("flow_noise1", noise1, "noise[i] = sin(0.3*i) [1, 8]")
        save("flow_cond3", cond3, "random conditions [3, 128]")
        save("flow_noise3", noise3, "random noises [3, 8]")
        for solver in ("euler", "heun", "rk4"):
            for n in (10, 3):
                save(f"flow1_{solver}_n{n}", head.sample(noise1, cond1, solver, n), f"{solver} N={n} from flow_noise1")
                save(f"flow3_{solver}_n{n}", head.sample(noise3, cond3, solver, n), f"{solver} N={n} from flow_noise3")

        # Velocity probes: rows of (x, t) with the same condition each.
        ts = torch.tensor([0.0, 0.25, 0.5, 0.9, 1.0], dtype=torch.float32)
        xs = torch.cat([noise1, torch.randn(4, ACT, generator=gen)])
        c = head.cond_term(cond1.expand(5, -1))
        save("vel_x", xs, "velocity probe inputs x [5, 8]")
        save("vel_t", ts, "velocity probe times t [5]")
        save("vel_v", head.velocity(xs, ts, c), "v(x_i, t_i | flow_cond1) [5, 8]")

    doc = {
        "about": "Mamba-1 (transformers MambaModel, slow path, CPU float32) + docs/models.md#flow-matching-head flow head references",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__, "numpy": np.__version__},
        "seeds": {"torch_manual_seed": args.seed, "generator": args.seed + 1},
        "config": {"vocab": VOCAB, "d_model": D_MODEL, "d_state": D_STATE, "expand": EXPAND, "d_conv": D_CONV,
                   "n_layers": N_LAYERS, "dt_rank": model.layers[0].mixer.time_step_rank, "rms_eps": 1e-5,
                   "flow": {"Tm": TM, "H": HID, "n_layers": N_HID_LAYERS, "A": ACT, "Cd": D_MODEL}},
        "init_notes": {**notes, "perturbed": "A_log += 0.05 N; D = 1 + 0.2 N; conv bias += 0.05 N; "
                                             "norm gains = 1 + 0.2 N; dt bias = Mamba dt init"},
        "checkpoints": {
            "mamba_flow.safetensors": sorted(list(back_sd) + list(flow_sd)),
            "mamba_flow_head_only.safetensors": "flow.* only",
            "mamba_flow_backbone_only.safetensors": "backbone.* only"},
        "shapes": {k: list(v.shape) for k, v in {**back_sd, **flow_sd}.items()},
        "flow_time_grid": "dt = 1/N (float32), t_k = k*dt; time embedding [sin(t*f) | cos(t*f)], "
                          "f_j = 10000^(-j/(Tm/2)) computed in double, cast to float32",
        "spec_float64_check_max_rel": spec_rel,
        "decode_vs_prefill_max_rel": rel,
        "files": files,
    }
    with open(os.path.join(out, "refs.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote", out, f"({len(files)} arrays)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
