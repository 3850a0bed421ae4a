// mamba_flow_bench --parts: one CPU action broken into its ops, each replayed alone through Ops<Cpu> on the loaded
// model's own (packed) weights at the shapes act() runs them, next to this core's floors (FMA peak, L2 read rate).
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <flowedge/models/mamba_flow/policy.hpp>

#include "cpu_floor.hpp"

namespace flowedge::bench {

/// One op of an action: what it is, how often an action runs it, its multiply-adds and weight bytes per call, and the
/// replay timings (min and p50 of batches of calls, per call).
struct Part {
    std::string name;
    int per_action = 1;
    double macs = 0;          ///< multiply-adds per call (matrix products, conv taps, scan updates)
    double exps = 0;          ///< exp evaluations per call (SiLU, softplus, scan decays)
    double weight_bytes = 0;  ///< bytes of weights read per call
    bool bf16_dot = false;    ///< runs on vdpbf16ps (MathMode::BF16, in > 8, AVX512_BF16): its MAC floor is that rate's
    bool amx = false;         ///< runs on AMX tiles instead (cpu::amx_bf16_available()): its floor is its weight bytes
    std::function<void()> call;
    double min_us = 0, p50_us = 0;
};

/// vdpbf16ps throughput of one core in G multiply-adds/s (32 per zmm instruction): 12 independent chains in
/// assembly, best of many short runs, as cpu_floor.hpp's FMA probe; 0 without AVX512_BF16.
inline double bf16_dot_peak_gmacs() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (!__builtin_cpu_supports("avx512bf16")) return 0;
    double best = 0;
    for (int rep = 0; rep < 60; ++rep) {
        constexpr long kIters = 400'000;
        const auto t0 = std::chrono::steady_clock::now();
        for (long i = 0; i < kIters; ++i)
            asm volatile("vdpbf16ps %%zmm14, %%zmm15, %%zmm0\n\tvdpbf16ps %%zmm14, %%zmm15, %%zmm1\n\t"
                         "vdpbf16ps %%zmm14, %%zmm15, %%zmm2\n\tvdpbf16ps %%zmm14, %%zmm15, %%zmm3\n\t"
                         "vdpbf16ps %%zmm14, %%zmm15, %%zmm4\n\tvdpbf16ps %%zmm14, %%zmm15, %%zmm5\n\t"
                         "vdpbf16ps %%zmm14, %%zmm15, %%zmm6\n\tvdpbf16ps %%zmm14, %%zmm15, %%zmm7\n\t"
                         "vdpbf16ps %%zmm14, %%zmm15, %%zmm8\n\tvdpbf16ps %%zmm14, %%zmm15, %%zmm9\n\t"
                         "vdpbf16ps %%zmm14, %%zmm15, %%zmm10\n\tvdpbf16ps %%zmm14, %%zmm15, %%zmm11\n\t" ::
                             : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11");
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, double(kIters) * 12 * 32 / sec / 1e9);
    }
    return best;
#else
    return 0;
#endif
}

/// Min and p50 per call of `f` over `batches` batches of `per_batch` calls (after a warm batch).
inline void time_part(Part& p, int batches = 300, int per_batch = 40) {
    std::vector<double> us;
    for (int i = 0; i < per_batch; ++i) p.call();
    for (int b = 0; b < batches; ++b) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < per_batch; ++i) p.call();
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / per_batch);
    }
    std::sort(us.begin(), us.end());
    p.min_us = us.front();
    p.p50_us = us[us.size() / 2];
}

/// Replays every op of one act() (prefix L tokens, `steps` Euler steps, batch 1) alone and prints the table with the
/// floors; `action_min_us` / `action_p50_us`: the whole act() measured in the same run. Returns the table as JSON.
inline nlohmann::json mamba_flow_parts(MambaFlowPolicy<Cpu>& policy, int L, int steps, double action_min_us,
                                       double action_p50_us) {
    Mamba<Cpu>& mamba = policy.backbone();
    FlowHead<Cpu>& head = policy.head();
    const auto& mc = mamba.config();
    const auto& hc = head.config();
    std::map<std::string, const Parameter<Cpu>*> params;
    mamba.visit_parameters([&](const std::string& n, Parameter<Cpu>& p, const Shape&, Storage) { params["backbone." + n] = &p; });
    head.visit_parameters([&](const std::string& n, Parameter<Cpu>& p, const Shape&, Storage) { params["flow." + n] = &p; });
    auto param = [&](const std::string& n) -> const Parameter<Cpu>& { return *params.at(n); };
    auto wbytes = [&](const std::string& n, std::size_t numel) { return double(numel) * double(dtype_size(param(n).ref().dtype)); };

    const int dm = mc.d_model, di = mc.d_inner, S = mc.d_state, R = mc.dt_rank, K = mc.d_conv, H = hc.hidden, A = hc.action_dim;
    const int ld_dbl = R + 2 * S;
    const MathMode math = policy.math();
    // Scratch at the model's shapes (values: small, finite, deterministic).
    auto filled = [](std::size_t n, float scale) {
        std::vector<float> v(n);
        for (std::size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * float(i) + 0.1f);
        return v;
    };
    std::vector<float> h = filled(std::size_t(L) * dm, 0.5f), n = filled(std::size_t(L) * dm, 0.5f);
    std::vector<float> xz = filled(std::size_t(L) * 2 * di, 0.5f), u = filled(std::size_t(L) * di, 0.5f);
    std::vector<float> dbl = filled(std::size_t(L) * ld_dbl, 0.5f), dt = filled(std::size_t(L) * di, 0.05f);
    std::vector<float> y = filled(std::size_t(L) * di, 0.5f), conv_state(std::size_t(K - 1) * di, 0.f);
    std::vector<float> ssm_state(std::size_t(di) * S, 0.f), A_neg(std::size_t(di) * S);
    std::vector<float> c = filled(std::size_t(H), 0.5f), hb0 = filled(std::size_t(H), 0.5f), hb1 = filled(std::size_t(H), 0.5f);
    std::vector<float> x = filled(std::size_t(A), 0.5f), v = filled(std::size_t(A), 0.5f), tproj = filled(std::size_t(H), 0.5f);
    std::vector<float> tc = filled(std::size_t(H), 0.5f);

    std::vector<Part> parts;
    auto linear = [&](const std::string& name, int per_action, const std::string& w, const std::string& bias, const float* in,
                      float* out, int rows, int n_in, int n_out, Activation act, bool accumulate, int ld_x,
                      const float* bias_row = nullptr) {  // bias_row: a bias that is not a parameter
        LinearParams p;
        p.x = in;
        p.w = param(w).ref();
        p.bias = bias.empty() ? bias_row : param(bias).f32();
        p.y = out;
        p.rows = rows;
        p.in = n_in;
        p.out = n_out;
        p.ld_x = ld_x;
        p.act = act;
        p.accumulate = accumulate;
        p.math = math;
        const double ex = act == Activation::None ? 0 : double(rows) * n_out;
        const bool bh = math == MathMode::BF16 && n_in > 8 && cpu::bf16_math_available(), amx = bh && cpu::amx_bf16_available();
        parts.push_back({name, per_action, double(rows) * n_in * n_out, ex, wbytes(w, std::size_t(n_in) * n_out), bh && !amx, amx,
                         [p] { Ops<Cpu>::linear(p); }});
    };
    for (int l = 0; l < mc.n_layers; ++l) {
        const std::string pre = "backbone.layers." + std::to_string(l) + ".", mix = pre + "mixer.";
        const std::string tag = "L" + std::to_string(l) + " ";
        const bool last = l == mc.n_layers - 1;
        const Parameter<Cpu>& a_log = param(mix + "A_log");
        for (std::size_t i = 0; i < A_neg.size(); ++i) A_neg[i] = -std::exp(a_log.f32()[i]);
        RmsNormParams rp{h.data(), param(pre + "norm.weight").f32(), n.data(), L, dm, mc.eps};
        parts.push_back({tag + "rms_norm", 1, double(L) * dm, 0, 0, false, false, [rp] { Ops<Cpu>::rms_norm(rp); }});
        linear(tag + "in_proj", 1, mix + "in_proj.weight", "", n.data(), xz.data(), L, dm, 2 * di, Activation::None, false, 0);
        CausalConvParams cp;
        cp.x = xz.data();
        cp.ld_x = 2 * di;
        cp.w = param(mix + "conv1d.weight").ref();
        cp.bias = param(mix + "conv1d.bias").f32();
        cp.state = conv_state.data();
        cp.u = u.data();
        cp.length = L;
        cp.channels = di;
        cp.kernel = K;
        parts.push_back({tag + "causal_conv + SiLU", 1, double(L) * di * K, double(L) * di, 0, false, false, [cp] { Ops<Cpu>::causal_conv(cp); }});
        linear(tag + "x_proj", 1, mix + "x_proj.weight", "", u.data(), dbl.data(), L, di, ld_dbl, Activation::None, false, 0);
        // dt_proj without its softplus: the scan applies it (SelectiveScanParams::dt_softplus, as MambaMixer<Cpu>).
        linear(tag + "dt_proj", 1, mix + "dt_proj.weight", mix + "dt_proj.bias", dbl.data(), dt.data(), L, R, di,
               Activation::None, false, ld_dbl);
        SelectiveScanParams sp;
        sp.u = u.data();
        sp.dt = dt.data();
        sp.B = dbl.data() + R;
        sp.C = dbl.data() + R + S;
        sp.ld_bc = ld_dbl;
        sp.D = param(mix + "D").f32();
        sp.z = xz.data() + di;
        sp.ld_z = 2 * di;
        sp.state = ssm_state.data();
        sp.y = y.data();
        sp.length = L;
        sp.channels = di;
        sp.d_state = S;
        sp.dt_softplus = true;
        sp.y_from = last ? L - 1 : 0;  // act() reads the last layer's y for the last token only (MambaMixer's out_from)
        // Per state: decay = exp(dt A), s = decay s + (dt u) B, y += s C (3 multiply-adds, 1 exp); gate SiLU per channel.
        // A: this layer's -exp(A_log), held by the replay (the model keeps its own copy private).
        std::vector<float> A_copy = A_neg;
        parts.push_back({tag + "selective_scan (+ softplus dt)", 1, 3.0 * L * di * S, double(L) * di * (S + 2), 0, false, false,
                         [sp, A_copy]() mutable {
                             sp.A = A_copy.data();
                             Ops<Cpu>::selective_scan(sp);
                         }});
        const int out_rows = last ? 1 : L;
        linear(tag + "out_proj (+residual)", 1, mix + "out_proj.weight", "", y.data(), h.data(), out_rows, di, dm,
               Activation::None, true, 0);
    }
    RmsNormParams fp{h.data(), param("backbone.norm_f.weight").f32(), n.data(), 1, dm, mc.eps};
    parts.push_back({"norm_f (last row)", 1, double(dm), 0, 0, false, false, [fp] { Ops<Cpu>::rms_norm(fp); }});

    linear("flow cond_proj", 1, "flow.cond_proj.weight", "", n.data(), c.data(), 1, dm, H, Activation::None, false, 0);
    // Batch 1 (FlowHead::eval): tc = time_proj row + c, then h0 = silu(in_proj x + tc) with tc as the bias.
    AxpbyParams ap{tproj.data(), c.data(), tc.data(), H, 1.f, 1.f};
    parts.push_back({"flow tc = time_proj row + c (axpby)", steps, 0, 0, 0, false, false, [ap] { Ops<Cpu>::axpby(ap); }});
    linear("flow in_proj + tc + SiLU", steps, "flow.in_proj.weight", "", x.data(), hb0.data(), 1, A, H, Activation::Silu, false, 0,
           tc.data());
    for (int l = 0; l < hc.n_layers; ++l)
        linear("flow layers." + std::to_string(l) + " + SiLU", steps, "flow.layers." + std::to_string(l) + ".weight", "",
               l % 2 ? hb1.data() : hb0.data(), l % 2 ? hb0.data() : hb1.data(), 1, H, H, Activation::Silu, false, 0);
    linear("flow out_proj", steps, "flow.out_proj.weight", "", hb0.data(), v.data(), 1, H, A, Activation::None, false, 0);
    AxpbyParams xp{x.data(), v.data(), x.data(), A, 1.f, 0.f};  // b = 0 keeps x bounded over the replays
    parts.push_back({"flow x += dt v (axpby)", steps, 0, 0, 0, false, false, [xp] { Ops<Cpu>::axpby(xp); }});

    for (Part& p : parts) time_part(p);

    const double peak = fma_peak_gflops_per_core() / 2;  // G multiply-adds/s
    const double bf16_peak = bf16_dot_peak_gmacs();         // 0 without AVX512_BF16 (then no part has bf16_dot)
    const double l2 = read_bandwidth_gbs(256 * 1024), l3 = read_bandwidth_gbs(8 * 1024 * 1024);
    double sum_min = 0, sum_p50 = 0, sum_floor = 0, macs = 0, exps = 0, bytes = 0;
    nlohmann::json rows = nlohmann::json::array();
    std::printf("\n  parts of one action, each op replayed alone (%s weights hot in cache; min / p50 per call of batches of 40)\n",
                std::string(dtype_name(param("flow.layers.0.weight").ref().dtype)).c_str());
    std::printf("  %-40s %5s %10s %8s %9s %9s %10s %8s %10s\n", "part", "calls", "MACs/call", "exps", "weight KB", "us/call",
                "us/action", "G MAC/s", "floor us");
    for (const Part& p : parts) {
        const double per = p.per_action;
        // AMX's multiply-add rate (~1000 BF16 MACs per cycle at 16 rows) is far above any part's bytes: bytes bound it.
        const double mac_floor = p.amx ? 0.0 : p.macs / ((p.bf16_dot ? bf16_peak : peak) * 1e3);
        const double floor_us = std::max(mac_floor, p.weight_bytes / (l2 * 1e3)) * per;
        sum_min += p.min_us * per;
        sum_floor += floor_us;
        sum_p50 += p.p50_us * per;
        macs += p.macs * per;
        exps += p.exps * per;
        bytes += p.weight_bytes * per;
        std::printf("  %-40s %5d %10.0f %8.0f %9.1f %9.3f %10.2f %8.1f %10.2f\n", p.name.c_str(), p.per_action, p.macs, p.exps,
                    p.weight_bytes / 1024, p.min_us, p.min_us * per, p.macs / (p.min_us * 1e3), floor_us);
        rows.push_back({{"part", p.name}, {"calls_per_action", p.per_action}, {"macs_per_call", p.macs}, {"exps_per_call", p.exps},
                        {"weight_bytes_per_call", p.weight_bytes}, {"min_us_per_call", p.min_us}, {"p50_us_per_call", p.p50_us},
                        {"floor_us_per_action", floor_us}, {"bf16_dot", p.bf16_dot}, {"amx", p.amx}});
    }
    const double fma_floor = macs / (peak * 1e3), byte_floor = bytes / (l2 * 1e3);
    std::printf("  sum of parts: min %.2f us, p50 %.2f us per action; the whole act() in this run: min %.2f, p50 %.2f us\n",
                sum_min, sum_p50, action_min_us, action_p50_us);
    std::printf("  per action: %.3f M multiply-adds, %.1f k exps, %.2f MB of weights read\n", macs / 1e6, exps / 1e3, bytes / 1e6);
    std::printf("  floors: FMA %.1f us at %.1f G MAC/s (asm probe); weight bytes %.1f us at the L2 read rate %.1f GB/s (L3 %.1f GB/s)\n",
                fma_floor, peak, byte_floor, l2, l3);
    if (bf16_peak > 0) std::printf("  vdpbf16ps peak %.1f G MAC/s (asm probe; the MAC floor of the parts marked bf16_dot)\n", bf16_peak);
    if (math == MathMode::BF16 && cpu::amx_bf16_available())
        std::printf("  BF16 products with in > 8 run on AMX tiles (TDPBF16PS): their floor is their weight bytes at the L2 rate\n");
    std::printf("  sum over parts of max(MAC floor, weight bytes / L2 rate): %.1f us\n", sum_floor);
    std::printf("  act() p50 / FMA floor = %.2f (target <= 1.5)\n", action_p50_us / fma_floor);
    return {{"parts", rows},
            {"sum_min_us", sum_min},
            {"sum_p50_us", sum_p50},
            {"macs_per_action", macs},
            {"exps_per_action", exps},
            {"weight_bytes_per_action", bytes},
            {"fma_peak_gmacs", peak},
            {"bf16_dot_peak_gmacs", bf16_peak},
            {"l2_read_gbs", l2},
            {"l3_read_gbs", l3},
            {"fma_floor_us", fma_floor},
            {"weight_byte_floor_us", byte_floor},
            {"sum_part_floors_us", sum_floor},
            {"action_p50_over_fma_floor", action_p50_us / fma_floor}};
}

}  // namespace flowedge::bench
