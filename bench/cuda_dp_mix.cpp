// flowedge_cuda_dp_mix: where the time of a Diffusion Policy sample goes on the GPU. Times every distinct kernel
// shape of one U-Net call in isolation, counts the launches of one captured 10-step DDIM sample, and measures
// native DDIM/DDPM sample latency per batch and weight dtype, and the opt-in tensor-core math modes (MathMode
// TF32/BF16) at batch 8 and 64 with their action difference from the F32 path.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <flowedge/cuda/device.hpp>
#include <flowedge/models/diffusion/head.hpp>

using namespace flowedge;

namespace {

#define MIX_CHECK(expr)                                                                                         \
    do {                                                                                                        \
        const cudaError_t e_ = (expr);                                                                          \
        if (e_ != cudaSuccess) fail("cuda_dp_mix", std::string(#expr) + " failed: " + cudaGetErrorString(e_)); \
    } while (0)

double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const std::size_t i = std::min(v.size() - 1, std::size_t(q * double(v.size() - 1) + 0.5));
    return v[i];
}

std::string json_str(const std::string& s) {
    std::string o = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        if (static_cast<unsigned char>(c) < 0x20) o += ' ';
        else o += c;
    }
    return o + "\"";
}

/// A device buffer of `n` floats filled with a deterministic pattern in [-scale, scale].
Buffer<float, Cuda> device_pattern(std::size_t n, float scale, std::uint32_t salt) {
    std::vector<float> h(n);
    std::uint32_t s = 2463534242u ^ salt;
    for (auto& v : h) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        v = scale * (float(s % 20001u) / 10000.f - 1.f);
    }
    Buffer<float, Cuda> b(n);
    Memory<Cuda>::copy_from_host(b.data(), h.data(), n * sizeof(float));
    Memory<Cuda>::synchronize();
    return b;
}

/// Weights of `n` elements stored as `dt` (raw bytes on the device).
Buffer<std::byte, Cuda> device_weights(std::size_t n, DType dt, std::uint32_t salt) {
    std::vector<float> f(n);
    std::uint32_t s = 88675123u ^ salt;
    for (auto& v : f) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        v = 0.02f * (float(s % 20001u) / 10000.f - 1.f);
    }
    std::vector<std::byte> raw(n * dtype_size(dt));
    Parameter<Cpu>::convert(f.data(), DType::F32, raw.data(), dt, n);
    Buffer<std::byte, Cuda> b(raw.size());
    Memory<Cuda>::copy_from_host(b.data(), raw.data(), raw.size());
    Memory<Cuda>::synchronize();
    return b;
}

/// One distinct kernel shape of a U-Net call.
struct KernelShape {
    std::string kind;   // conv1d | conv_transpose1d | group_norm | linear | linear_batch
    std::string label;  // where it occurs, e.g. "down0 res0 conv1"
    std::string key;    // the shape, deduplication key
    int calls = 0;      // per U-Net call, or per sample when once_per_sample
    bool once_per_sample = false;  // the conditioning (ConditionalUnet1d::condition): once per run of <= 16 steps
    bool has_weights = false;
    // conv / convT / group_norm / linear fields (unused ones stay 0)
    int batch = 1, in = 0, out = 0, in_len = 0, out_len = 0, kernel = 0, stride = 1, pad = 0;
    int channels = 0, length = 0, groups = 0;
    bool film = false, residual = false;
    int rows = 0;
    Activation act = Activation::None;
    std::vector<int> batch_outs;  // linear_batch: out of every item (rows[i] x in -> out, x rows shared)
    std::vector<int> batch_rows;  // linear_batch: rows of every item
};

/// Walks the U-Net of `c` exactly as ConditionalUnet1d::condition and forward do and lists its op shapes (batch `b`;
/// the conditioning for a run of `steps` timesteps, once per sample).
std::vector<KernelShape> unet_shapes(const DiffusionConfig& c, int b, int steps) {
    std::vector<KernelShape> v;
    auto add = [&](KernelShape k, const std::string& label) {
        for (auto& e : v)
            if (e.key == k.key) {
                ++e.calls;
                return;
            }
        k.label = label;
        k.calls = 1;
        v.push_back(k);
    };
    auto conv = [&](int in, int out, int L, int k, int s, int p, const std::string& label) {
        KernelShape e;
        e.kind = "conv1d";
        e.has_weights = true;
        e.batch = b, e.in = in, e.out = out, e.in_len = L, e.kernel = k, e.stride = s, e.pad = p;
        e.out_len = (L + 2 * p - k) / s + 1;
        e.key = "conv1d b=" + std::to_string(b) + " " + std::to_string(in) + "->" + std::to_string(out) + " L=" + std::to_string(L) +
                " k=" + std::to_string(k) + " s=" + std::to_string(s);
        add(e, label);
    };
    auto convt = [&](int ch, int L, const std::string& label) {
        KernelShape e;
        e.kind = "conv_transpose1d";
        e.has_weights = true;
        e.batch = b, e.in = ch, e.out = ch, e.in_len = L, e.kernel = 4, e.stride = 2, e.pad = 1, e.out_len = 2 * L;
        e.key = "conv_transpose1d b=" + std::to_string(b) + " " + std::to_string(ch) + "->" + std::to_string(ch) + " L=" +
                std::to_string(L) + "->" + std::to_string(2 * L);
        add(e, label);
    };
    auto gn = [&](int ch, int L, bool film, bool residual, const std::string& label) {
        KernelShape e;
        e.kind = "group_norm";
        e.batch = b, e.channels = ch, e.length = L, e.groups = c.n_groups, e.film = film, e.residual = residual;
        e.act = Activation::Mish;
        e.key = "group_norm b=" + std::to_string(b) + " C=" + std::to_string(ch) + " L=" + std::to_string(L) + " G=" +
                std::to_string(c.n_groups) + (film ? " +film" : "") + (residual ? " +residual" : "");
        add(e, label);
    };
    auto lin = [&](int rows, int in, int out, Activation act, const std::string& label, bool once = false) {
        KernelShape e;
        e.kind = "linear";
        e.has_weights = true;
        e.once_per_sample = once;
        e.rows = rows, e.in = in, e.out = out, e.act = act;
        e.key = "linear rows=" + std::to_string(rows) + " " + std::to_string(in) + "->" + std::to_string(out);
        add(e, label);
    };
    std::vector<int> film_outs;  // every residual block's FiLM linear, computed up front by linear_batch ops
    auto res = [&](int in, int out, int L, const std::string& label) {
        film_outs.push_back(2 * out);
        conv(in, out, L, c.kernel_size, 1, c.kernel_size / 2, label + " conv1");
        gn(out, L, true, false, label + " conv1 norm");
        if (in != out) conv(in, out, L, 1, 1, 0, label + " residual_conv");
        conv(out, out, L, c.kernel_size, 1, c.kernel_size / 2, label + " conv2");
        gn(out, L, false, true, label + " conv2 norm");
    };
    const int H = c.horizon, A = c.action_dim, td = c.step_embed_dim, S = c.stages();
    lin(steps, td, 4 * td, Activation::Mish, "step encoder 1", true);
    lin(steps, 4 * td, td, Activation::None, "step encoder 3", true);
    const std::size_t film_at = v.size();
    for (int i = 0; i < b; ++i) lin(A, A, H, Activation::None, "layout [H,A]->[A,H]");
    for (int s = 0; s < S; ++s) {
        const int in = s == 0 ? A : c.down_dims[std::size_t(s - 1)], out = c.down_dims[std::size_t(s)], L = H >> s;
        res(in, out, L, "down" + std::to_string(s) + " res0");
        res(out, out, L, "down" + std::to_string(s) + " res1");
        if (s < S - 1) conv(out, out, L, 3, 2, 1, "down" + std::to_string(s) + " downsample");
    }
    const int wide = c.down_dims.back();
    res(wide, wide, H >> (S - 1), "mid0");
    res(wide, wide, H >> (S - 1), "mid1");
    for (int s = S - 1; s >= 1; --s) {
        const int hi = c.down_dims[std::size_t(s)], lo = c.down_dims[std::size_t(s - 1)], L = H >> s;
        res(2 * hi, lo, L, "up" + std::to_string(S - 1 - s) + " res0");
        res(lo, lo, L, "up" + std::to_string(S - 1 - s) + " res1");
        convt(lo, L, "up" + std::to_string(S - 1 - s) + " upsample");
    }
    conv(c.down_dims[0], c.down_dims[0], H, c.kernel_size, 1, c.kernel_size / 2, "final block conv");
    gn(c.down_dims[0], H, false, false, "final block norm");
    conv(c.down_dims[0], A, H, 1, 1, 0, "final conv");
    for (int i = 0; i < b; ++i) lin(H, H, A, Activation::None, "layout [A,H]->[H,A]");
    // The FiLM linears as ConditionalUnet1d::condition runs them: each block's on the `steps` timestep rows, then on
    // the `b` condition rows, in chunks of up to kMaxLinearBatch items.
    std::vector<int> outs, rows;
    for (int o : film_outs) {
        outs.insert(outs.end(), {o, o});
        rows.insert(rows.end(), {steps, b});
    }
    std::vector<KernelShape> batches;
    for (std::size_t i0 = 0; i0 < outs.size(); i0 += std::size_t(kMaxLinearBatch)) {
        const std::size_t i1 = std::min(outs.size(), i0 + std::size_t(kMaxLinearBatch));
        KernelShape e;
        e.kind = "linear_batch";
        e.has_weights = true;
        e.once_per_sample = true;
        e.rows = std::max(steps, b), e.in = c.cond_dim(), e.act = Activation::None;
        e.batch_outs.assign(outs.begin() + std::ptrdiff_t(i0), outs.begin() + std::ptrdiff_t(i1));
        e.batch_rows.assign(rows.begin() + std::ptrdiff_t(i0), rows.begin() + std::ptrdiff_t(i1));
        e.key = "linear_batch FiLM x" + std::to_string(e.batch_outs.size()) + " rows=" + std::to_string(steps) + "|" +
                std::to_string(b) + " " + std::to_string(e.in) + "->2*out #" + std::to_string(i0 / std::size_t(kMaxLinearBatch));
        e.label = "res cond_encoders";
        e.calls = 1;
        batches.push_back(e);
    }
    v.insert(v.begin() + std::ptrdiff_t(film_at), batches.begin(), batches.end());
    return v;
}

struct KernelTiming {
    const KernelShape* shape;
    DType dtype;
    double p50_us = 0, bytes = 0;
};

/// Times one shape: `iters` launches each bracketed by CUDA events on `st`, after a warm-up; returns p50 in us.
KernelTiming time_shape(const KernelShape& k, DType dt, int iters, cudaStream_t st) {
    KernelTiming t{&k, dt};
    const Stream s{st};
    const std::size_t wsz = dtype_size(dt);
    std::function<void()> launch;
    Buffer<float, Cuda> x, y, bias, film, resid, gamma, beta;
    Buffer<std::byte, Cuda> w;
    if (k.kind == "conv1d" || k.kind == "conv_transpose1d") {
        const std::size_t nw = std::size_t(k.in) * k.out * k.kernel;
        x = device_pattern(std::size_t(k.batch) * k.in * k.in_len, 1.f, 1);
        y = Buffer<float, Cuda>(std::size_t(k.batch) * k.out * k.out_len);
        bias = device_pattern(std::size_t(k.out), 0.1f, 2);
        w = device_weights(nw, dt, 3);
        t.bytes = double(nw * wsz) + 4.0 * (k.out + double(k.batch) * k.in * k.in_len + double(k.batch) * k.out * k.out_len);
        if (k.kind == "conv1d") {
            Conv1dParams p;
            p.x = x.data(), p.w = {w.data(), dt}, p.bias = bias.data(), p.y = y.data();
            p.batch = k.batch, p.in_channels = k.in, p.out_channels = k.out, p.in_length = k.in_len, p.out_length = k.out_len;
            p.kernel = k.kernel, p.stride = k.stride, p.pad = k.pad;
            launch = [p, s] { Ops<Cuda>::conv1d(p, s); };
        } else {
            ConvTranspose1dParams p;
            p.x = x.data(), p.w = {w.data(), dt}, p.bias = bias.data(), p.y = y.data();
            p.batch = k.batch, p.in_channels = k.in, p.out_channels = k.out, p.in_length = k.in_len, p.out_length = k.out_len;
            p.kernel = k.kernel, p.stride = k.stride, p.pad = k.pad;
            launch = [p, s] { Ops<Cuda>::conv_transpose1d(p, s); };
        }
    } else if (k.kind == "group_norm") {
        const std::size_t n = std::size_t(k.batch) * k.channels * k.length;
        x = device_pattern(n, 1.f, 4);
        y = Buffer<float, Cuda>(n);
        gamma = device_pattern(std::size_t(k.channels), 1.f, 5);
        beta = device_pattern(std::size_t(k.channels), 0.1f, 6);
        GroupNormParams p;
        p.x = x.data(), p.gamma = gamma.data(), p.beta = beta.data(), p.y = y.data();
        p.batch = k.batch, p.channels = k.channels, p.length = k.length, p.groups = k.groups, p.act = k.act;
        t.bytes = 4.0 * (2.0 * double(n) + 2.0 * k.channels);
        if (k.film) {  // the condition's part per batch row plus the timestep's shared row, as the U-Net passes them
            film = device_pattern(std::size_t(k.batch + 1) * 2 * k.channels, 1.f, 7);
            p.film = film.data();
            p.film_shared = film.data() + std::size_t(k.batch) * 2 * k.channels;
            t.bytes += 4.0 * double(k.batch + 1) * 2 * k.channels;
        }
        if (k.residual) {
            resid = device_pattern(n, 1.f, 8);
            p.residual = resid.data();
            t.bytes += 4.0 * double(n);
        }
        launch = [p, s] { Ops<Cuda>::group_norm(p, s); };
    } else if (k.kind == "linear_batch") {
        // One weight/bias/y buffer holding every item back to back (256-byte aligned slices), one shared x.
        auto align = [](std::size_t n) { return (n + 255) / 256 * 256; };
        std::size_t wbytes = 0, nout = 0;
        for (int o : k.batch_outs) {
            wbytes += align(std::size_t(o) * k.in * wsz);
            nout += align(std::size_t(o) * sizeof(float)) / sizeof(float);
        }
        x = device_pattern(std::size_t(k.rows) * k.in, 1.f, 9);
        y = Buffer<float, Cuda>(std::size_t(k.rows) * nout);
        bias = device_pattern(nout, 0.1f, 10);
        w = device_weights(wbytes / wsz, dt, 11);
        LinearBatchParams p;
        p.n_items = int(k.batch_outs.size());
        std::size_t wo = 0, oo = 0;
        t.bytes = 4.0 * double(k.rows) * k.in;
        for (int i = 0; i < p.n_items; ++i) {
            const int o = k.batch_outs[std::size_t(i)], rows = k.batch_rows[std::size_t(i)];
            LinearParams& q = p.items[i];
            q.x = x.data(), q.w = {w.data() + wo, dt}, q.bias = bias.data() + oo, q.y = y.data() + std::size_t(k.rows) * oo;
            q.rows = rows, q.in = k.in, q.out = o, q.act = k.act;
            wo += align(std::size_t(o) * k.in * wsz);
            oo += align(std::size_t(o) * sizeof(float)) / sizeof(float);
            t.bytes += double(std::size_t(o) * k.in * wsz) + 4.0 * (o + double(rows) * o);
        }
        launch = [p, s] { Ops<Cuda>::linear_batch(p, s); };
    } else {
        const std::size_t nw = std::size_t(k.in) * k.out;
        x = device_pattern(std::size_t(k.rows) * k.in, 1.f, 9);
        y = Buffer<float, Cuda>(std::size_t(k.rows) * k.out);
        bias = device_pattern(std::size_t(k.out), 0.1f, 10);
        w = device_weights(nw, dt, 11);
        LinearParams p;
        p.x = x.data(), p.w = {w.data(), dt}, p.bias = bias.data(), p.y = y.data();
        p.rows = k.rows, p.in = k.in, p.out = k.out, p.act = k.act;
        t.bytes = double(nw * wsz) + 4.0 * (k.out + double(k.rows) * (k.in + k.out));
        launch = [p, s] { Ops<Cuda>::linear(p, s); };
    }
    cudaEvent_t e0, e1;
    MIX_CHECK(cudaEventCreate(&e0));
    MIX_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < 5; ++i) launch();
    std::vector<double> us;
    us.reserve(std::size_t(iters));
    for (int i = 0; i < iters; ++i) {
        MIX_CHECK(cudaEventRecord(e0, st));
        launch();
        MIX_CHECK(cudaEventRecord(e1, st));
        MIX_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        MIX_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        us.push_back(1000.0 * ms);
    }
    MIX_CHECK(cudaEventDestroy(e0));
    MIX_CHECK(cudaEventDestroy(e1));
    t.p50_us = percentile(us, 0.5);
    return t;
}

/// "ns::name<T, 4>" -> "name".
std::string base_kernel_name(std::string n) {
    if (auto lt = n.find('<'); lt != std::string::npos) n.erase(lt);
    if (auto c = n.rfind("::"); c != std::string::npos) n.erase(0, c + 2);
    return n;
}

struct SampleTiming {
    std::string dtype, scheduler;
    int batch = 1, steps = 10, reps = 0;
    double p50_ms = 0, p99_ms = 0, min_ms = 0;
};

SampleTiming time_sample(DiffusionHead<Cuda>& h, const std::vector<float>& cond, const std::vector<float>& noise, int batch,
                         Scheduler sch, int steps, int reps, const char* dtype) {
    const DiffusionConfig& c = h.config();
    const std::size_t per = std::size_t(c.horizon) * c.action_dim;
    std::vector<float> out(std::size_t(batch) * per);
    std::span<const float> cs(cond.data(), std::size_t(batch) * c.global_cond_dim), ns(noise.data(), out.size());
    const SampleOptions o{.steps = steps, .scheduler = sch, .seed = 1};
    for (int i = 0; i < 2; ++i) h.sample(cs, ns, out, o, batch);  // capture + one replay
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        h.sample(cs, ns, out, o, batch);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    return {dtype, scheduler_name(sch), batch, steps, reps, percentile(ms, 0.5), percentile(ms, 0.99), percentile(ms, 0.0)};
}

int usage() {
    std::fprintf(stderr,
                 "usage: flowedge_cuda_dp_mix MODEL [--json out.json] [--iters N] [--sample-iters N] [--no-cpu-check] [--math-only | --no-math | --samples-only]\n"
                 "  MODEL: LeRobot Diffusion Policy folder or *.flowedge.safetensors (e.g. models/diffusion_pusht.flowedge.safetensors)\n"
                 "  --iters: timed launches per kernel shape (default 200); --sample-iters: timed samples per config (default 30)\n"
                 "  --math-only: only section 5 (tensor-core MathMode TF32/BF16 at batch 8 and 64 vs the F32 path); --no-math: skip it\n"
                 "  --samples-only: only section 4 at batch 1 and 8 (a short A/B of whole samples, e.g. under an env switch)\n");
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    std::string model, json_path;
    int iters = 200, sample_iters = 30;
    bool cpu_check = true, math_only = false, with_math = true, samples_only = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "flowedge: cuda_dp_mix: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--json") json_path = next();
        else if (a == "--iters") iters = std::max(1, std::atoi(next().c_str()));
        else if (a == "--sample-iters") sample_iters = std::max(1, std::atoi(next().c_str()));
        else if (a == "--no-cpu-check") cpu_check = false;
        else if (a == "--math-only") math_only = true;
        else if (a == "--no-math") with_math = false;
        else if (a == "--samples-only") {
            samples_only = true;
            with_math = false;
        }
        else if (a == "-h" || a == "--help") return usage();
        else if (!a.empty() && a[0] == '-') {
            std::fprintf(stderr, "flowedge: cuda_dp_mix: unknown option '%s'\n", a.c_str());
            return usage();
        } else if (model.empty()) model = a;
        else return usage();
    }
    if (model.empty()) return usage();
    if (!cuda::device_available()) {
        std::fprintf(stderr, "flowedge: cuda_dp_mix: %s\n", cuda::device_description());
        return 77;
    }
    try {
        std::printf("device: %s\nmodel: %s\n", cuda::device_description(), model.c_str());
        std::ostringstream js;
        js << "{\n  \"device\": " << json_str(cuda::device_description()) << ",\n  \"model\": " << json_str(model) << ",\n";

        // ---- 1. load (F32) and device memory --------------------------------------------------------------
        const int kMaxBatch = 64;
        const cuda::MemoryInfo m0 = cuda::device_memory_info();
        const std::size_t a0 = Memory<Cuda>::allocation_count();
        auto t_load = std::chrono::steady_clock::now();
        auto head = std::make_unique<DiffusionHead<Cuda>>(DiffusionHead<Cuda>::load(model, {}, kMaxBatch));
        const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();
        const DiffusionConfig cfg = head->config();
        const std::size_t per = std::size_t(cfg.horizon) * cfg.action_dim;
        std::vector<float> cond(std::size_t(kMaxBatch) * cfg.global_cond_dim), noise(std::size_t(kMaxBatch) * per);
        for (std::size_t i = 0; i < cond.size(); ++i) cond[i] = 0.5f * std::sin(0.11f * float(i + 1));
        for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = std::sin(0.37f * float(i + 1));
        std::printf("U-Net parameters: %lld, horizon %d, action_dim %d, down_dims", (long long)head->n_parameters(), cfg.horizon,
                    cfg.action_dim);
        for (int d : cfg.down_dims) std::printf(" %d", d);
        std::printf(", load %.0f ms, %zu cudaMalloc\n", load_ms, Memory<Cuda>::allocation_count() - a0);

        // ---- 5. (runs last; first and alone with --math-only) tensor-core math: MathMode TF32/BF16 at batch 8 and 64 ----
        // Each row: 10-step DDIM latency (as section 4) and the max abs difference of its normalised actions ([-1, 1]
        // units, same cond/noise) from the exact path (F32 weights, F32 math) of the same batch in this run.
        auto math_section = [&] {
            const char* math_names[] = {"F32", "TF32", "BF16"};
            struct MathRow {
                std::string weights, math;
                int batch = 0;
                SampleTiming t;
                double max_abs_diff = 0;
            };
            std::vector<MathRow> rows;
            std::map<int, std::vector<float>> ref;
            std::printf("\ntensor-core math (MathMode, DiffusionHead::set_math): 10-step DDIM, %d reps; max|d| = max abs difference of the\n"
                        "normalised actions from F32 weights + F32 math at the same batch (this run)\n", sample_iters);
            auto env_or = [](const char* n, const char* dflt) {
                const char* v = std::getenv(n);
                return std::string(v && *v ? v : dflt);
            };
            const std::string env_stages = env_or("FLOWEDGE_CUDA_MMA_STAGES", "4"), env_cluster = env_or("FLOWEDGE_CUDA_MMA_CLUSTER", "0"),
                              env_min_n = env_or("FLOWEDGE_CUDA_MMA_MIN_N", "32");
            std::printf("  conv_mma knobs: FLOWEDGE_CUDA_MMA_STAGES=%s FLOWEDGE_CUDA_MMA_CLUSTER=%s FLOWEDGE_CUDA_MMA_MIN_N=%s\n",
                        env_stages.c_str(), env_cluster.c_str(), env_min_n.c_str());
            std::printf("  %-7s %-5s %6s | %9s %9s %9s | %10s\n", "weights", "math", "batch", "p50 ms", "p99 ms", "min ms", "max|d|");
            for (DType wdt : {DType::F32, DType::BF16}) {
                head.reset();
                Memory<Cuda>::synchronize();
                LoadOptions lo;
                lo.weight_dtype = wdt;
                head = std::make_unique<DiffusionHead<Cuda>>(DiffusionHead<Cuda>::load(model, lo, kMaxBatch));
                const std::string wname(dtype_name(wdt));
                for (int batch : {8, 64}) {
                    const std::span<const float> cs(cond.data(), std::size_t(batch) * cfg.global_cond_dim);
                    const std::span<const float> ns(noise.data(), std::size_t(batch) * per);
                    const SampleOptions o{.steps = 10, .scheduler = Scheduler::Ddim};
                    for (MathMode mm : {MathMode::F32, MathMode::TF32, MathMode::BF16}) {
                        if (wdt == DType::BF16 && mm == MathMode::TF32) continue;
                        head->set_math(mm);
                        std::vector<float> out(std::size_t(batch) * per);
                        head->sample_normalized(cs, ns, out, o, batch);
                        if (wdt == DType::F32 && mm == MathMode::F32) ref[batch] = out;
                        double e = 0;
                        const std::vector<float>& r = ref.at(batch);
                        for (std::size_t i = 0; i < out.size(); ++i) e = std::max(e, std::fabs(double(out[i]) - double(r[i])));
                        MathRow row{wname, math_names[int(mm)], batch,
                                    time_sample(*head, cond, noise, batch, Scheduler::Ddim, 10, sample_iters, wname.c_str()), e};
                        std::printf("  %-7s %-5s %6d | %9.3f %9.3f %9.3f | %10.3g\n", row.weights.c_str(), row.math.c_str(), batch, row.t.p50_ms,
                                    row.t.p99_ms, row.t.min_ms, e);
                        rows.push_back(row);
                    }
                }
                head->set_math(MathMode::F32);
            }
            js << "  \"math_modes_knobs\": {\"FLOWEDGE_CUDA_MMA_STAGES\": " << json_str(env_stages) << ", \"FLOWEDGE_CUDA_MMA_CLUSTER\": "
               << json_str(env_cluster) << ", \"FLOWEDGE_CUDA_MMA_MIN_N\": " << json_str(env_min_n) << "},\n";
            js << "  \"math_modes\": [\n";
            for (std::size_t i = 0; i < rows.size(); ++i) {
                const MathRow& r = rows[i];
                js << "    {\"weights\": " << json_str(r.weights) << ", \"math\": " << json_str(r.math) << ", \"scheduler\": \"ddim\", \"steps\": 10"
                   << ", \"batch\": " << r.batch << ", \"reps\": " << r.t.reps << ", \"p50_ms\": " << r.t.p50_ms << ", \"p99_ms\": " << r.t.p99_ms
                   << ", \"min_ms\": " << r.t.min_ms << ", \"max_abs_diff_vs_f32\": " << r.max_abs_diff << "}" << (i + 1 < rows.size() ? "," : "")
                   << "\n";
            }
            js << "  ]";
        };
        auto write_json = [&] {
            if (json_path.empty()) return;
            std::ofstream f(json_path);
            f << js.str();
            if (!f) fail("cuda_dp_mix", "cannot write '" + json_path + "'");
            std::printf("\nwrote %s\n", json_path.c_str());
        };
        if (math_only) {
            math_section();
            js << "\n}\n";
            write_json();
            return 0;
        }

        // ---- 2. launch census of one captured native 10-step DDIM sample (batch 1) --------------------------
        if (!samples_only) {
            cuda::set_graph_census(true);
            std::vector<float> out(per);
            head->sample(std::span<const float>(cond).first(std::size_t(cfg.global_cond_dim)), std::span<const float>(noise).first(per),
                         out, {.steps = 10, .scheduler = Scheduler::Ddim}, 1);
            cuda::set_graph_census(false);
            const cuda::GraphCensus cen = cuda::last_graph_census();
            std::map<std::string, int> by_base;
            for (const auto& [n, k] : cen.kernels) by_base[base_kernel_name(n)] += k;
            std::printf("\nlaunch census, one captured 10-step DDIM sample (batch 1): %d kernel nodes, %d memcpy, %d memset, %d other\n",
                        cen.kernel_nodes, cen.memcpy_nodes, cen.memset_nodes, cen.other_nodes);
            std::printf("  %-7s %s\n", "launches", "kernel");
            for (const auto& [n, k] : cen.kernels) std::printf("  %7d  %s\n", k, n.c_str());
            js << "  \"census_ddim10_batch1\": {\"kernel_nodes\": " << cen.kernel_nodes << ", \"memcpy_nodes\": " << cen.memcpy_nodes
               << ", \"memset_nodes\": " << cen.memset_nodes << ", \"other_nodes\": " << cen.other_nodes << ",\n    \"kernels\": [";
            for (std::size_t i = 0; i < cen.kernels.size(); ++i)
                js << (i ? ", " : "") << "{\"name\": " << json_str(cen.kernels[i].first) << ", \"launches\": " << cen.kernels[i].second << "}";
            js << "],\n    \"by_kernel\": {";
            bool first = true;
            for (const auto& [n, k] : by_base) {
                js << (first ? "" : ", ") << json_str(n) << ": " << k;
                first = false;
            }
            js << "}},\n";
            // CPU parity of the same sample at full PushT size (docs/numerics.md#whole-head-tolerances: 10-step DDIM 6e-4 max abs, normalized units).
            if (cpu_check) {
                auto cpu = DiffusionHead<Cpu>::load(model, {}, 1);
                std::vector<float> g(per), c(per);
                const auto cs = std::span<const float>(cond).first(std::size_t(cfg.global_cond_dim));
                const auto ns = std::span<const float>(noise).first(per);
                head->sample_normalized(cs, ns, g, {.steps = 10, .scheduler = Scheduler::Ddim}, 1);
                const auto tc = std::chrono::steady_clock::now();
                cpu.sample_normalized(cs, ns, c, {.steps = 10, .scheduler = Scheduler::Ddim}, 1);
                const double cpu_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - tc).count();
                double e = 0;
                for (std::size_t i = 0; i < per; ++i) e = std::max(e, std::fabs(double(g[i]) - double(c[i])));
                const bool ok = e < 6e-4;
                std::printf("\nCUDA vs CPU, 10-step DDIM batch 1, normalized: max abs %.3g (bound 6e-4: %s); CPU sample took %.0f ms\n", e,
                            ok ? "ok" : "EXCEEDED", cpu_ms);
                js << "  \"cpu_parity_ddim10_max_abs\": " << e << ",\n  \"cpu_parity_ok\": " << (ok ? "true" : "false") << ",\n";
            }
        }

        // ---- 3. isolated kernel shapes ---------------------------------------------------------------------
        if (!samples_only) {
            cudaStream_t st = nullptr;
            MIX_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
            const std::vector<KernelShape> shapes = unet_shapes(cfg, 1, 10);
            std::printf("\nkernel shapes of one U-Net call (batch 1), p50 of %d launches (CUDA events); calls/sample = calls x 10 DDIM steps,\n"
                        "except the conditioning's (calls marked /s: once per 10-step sample)\n",
                        iters);
            std::printf("  %-58s %5s %6s | %9s %9s | %9s %9s | %9s %9s\n", "shape (first use)", "calls", "dtype", "F32 us", "GB/s",
                        "BF16 us", "GB/s", "F16 us", "GB/s");
            js << "  \"kernels_batch1\": [\n";
            double unet_us[3] = {0, 0, 0}, cond_us[3] = {0, 0, 0};
            for (std::size_t i = 0; i < shapes.size(); ++i) {
                const KernelShape& k = shapes[i];
                std::vector<KernelTiming> ts;
                for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
                    if (!k.has_weights && dt != DType::F32) break;
                    ts.push_back(time_shape(k, dt, iters, st));
                }
                const std::string calls = std::to_string(k.calls) + (k.once_per_sample ? "/s" : "");
                std::printf("  %-58s %5s %6s", (k.key + " (" + k.label + ")").substr(0, 58).c_str(), calls.c_str(), k.has_weights ? "w" : "-");
                js << "    {\"kind\": " << json_str(k.kind) << ", \"shape\": " << json_str(k.key) << ", \"first_use\": " << json_str(k.label)
                   << ", \"calls_per_unet\": " << (k.once_per_sample ? 0 : k.calls) << ", \"calls_per_ddim10_sample\": "
                   << (k.once_per_sample ? 1 : 10) * k.calls << ", \"timings\": [";
                for (std::size_t j = 0; j < ts.size(); ++j) {
                    const double gbs = ts[j].bytes / (ts[j].p50_us * 1e-6) / 1e9;
                    std::printf(" | %9.2f %9.1f", ts[j].p50_us, gbs);
                    js << (j ? ", " : "") << "{\"weights\": " << json_str(std::string(dtype_name(ts[j].dtype))) << ", \"p50_us\": " << ts[j].p50_us
                       << ", \"bytes\": " << ts[j].bytes << ", \"gb_per_s\": " << gbs << "}";
                }
                for (int j = 0; j < 3; ++j)
                    (k.once_per_sample ? cond_us : unet_us)[j] += k.calls * ts[std::min<std::size_t>(std::size_t(j), ts.size() - 1)].p50_us;
                std::printf("\n");
                js << "]}" << (i + 1 < shapes.size() ? "," : "") << "\n";
            }
            js << "  ],\n";
            std::printf("  sum over one U-Net call of isolated p50s: F32 %.1f us, BF16 %.1f us, F16 %.1f us (x10 for a DDIM-10 sample)\n",
                        unet_us[0], unet_us[1], unet_us[2]);
            std::printf("  conditioning, once per sample: F32 %.1f us, BF16 %.1f us, F16 %.1f us\n", cond_us[0], cond_us[1], cond_us[2]);
            js << "  \"isolated_unet_sum_us\": {\"F32\": " << unet_us[0] << ", \"BF16\": " << unet_us[1] << ", \"F16\": " << unet_us[2] << "},\n";
            js << "  \"isolated_conditioning_per_sample_us\": {\"F32\": " << cond_us[0] << ", \"BF16\": " << cond_us[1] << ", \"F16\": " << cond_us[2] << "},\n";
            MIX_CHECK(cudaStreamDestroy(st));
        }

        // ---- 4. native sample latency per weight dtype and batch; device memory per model -------------------
        std::printf("\nnative sample latency (host wall clock around sample(): H2D inputs, one graph launch, D2H), %d reps\n", sample_iters);
        std::printf("  %-5s %-5s %6s %6s | %9s %9s %9s\n", "dtype", "sched", "steps", "batch", "p50 ms", "p99 ms", "min ms");
        std::vector<SampleTiming> samples;
        js << "  \"models\": [";
        const DType dts[] = {DType::F32, DType::BF16, DType::F16};
        for (int di = 0; di < (samples_only ? 2 : 3); ++di) {
            const DType dt = dts[di];
            const std::string dname(dtype_name(dt));
            if (di > 0) {
                head.reset();
                Memory<Cuda>::synchronize();
                const cuda::MemoryInfo before = cuda::device_memory_info();
                LoadOptions lo;
                lo.weight_dtype = dt;
                head = std::make_unique<DiffusionHead<Cuda>>(DiffusionHead<Cuda>::load(model, lo, kMaxBatch));
                const cuda::MemoryInfo after = cuda::device_memory_info();
                js << ", ";
                js << "{\"weights\": " << json_str(dname) << ", \"device_bytes\": " << head->device_bytes()
                   << ", \"mem_info_delta_bytes\": " << (double(before.free_bytes) - double(after.free_bytes)) << ", \"max_batch\": " << kMaxBatch << "}";
                std::printf("  [%s model: device_bytes %.1f MiB, cudaMemGetInfo delta %.1f MiB]\n", dname.c_str(),
                            double(head->device_bytes()) / 1048576.0, (double(before.free_bytes) - double(after.free_bytes)) / 1048576.0);
            } else {
                const cuda::MemoryInfo after = cuda::device_memory_info();
                js << "{\"weights\": \"F32\", \"device_bytes\": " << head->device_bytes()
                   << ", \"mem_info_delta_bytes\": " << (double(m0.free_bytes) - double(after.free_bytes)) << ", \"max_batch\": " << kMaxBatch << "}";
                std::printf("  [F32 model: device_bytes %.1f MiB, cudaMemGetInfo delta %.1f MiB (includes graphs/modules so far)]\n",
                            double(head->device_bytes()) / 1048576.0, (double(m0.free_bytes) - double(after.free_bytes)) / 1048576.0);
            }
            for (int batch : {1, 8, 64}) {
                if (samples_only && batch > 8) break;
                samples.push_back(time_sample(*head, cond, noise, batch, Scheduler::Ddim, 10, sample_iters, dname.c_str()));
                const SampleTiming& s = samples.back();
                std::printf("  %-5s %-5s %6d %6d | %9.3f %9.3f %9.3f\n", s.dtype.c_str(), s.scheduler.c_str(), s.steps, s.batch, s.p50_ms, s.p99_ms,
                            s.min_ms);
            }
            if (dt == DType::F32) {
                samples.push_back(time_sample(*head, cond, noise, 1, Scheduler::Ddpm, 100, std::max(5, sample_iters / 3), dname.c_str()));
                const SampleTiming& s = samples.back();
                std::printf("  %-5s %-5s %6d %6d | %9.3f %9.3f %9.3f\n", s.dtype.c_str(), s.scheduler.c_str(), s.steps, s.batch, s.p50_ms, s.p99_ms,
                            s.min_ms);
            }
        }
        js << "],\n  \"samples\": [\n";
        for (std::size_t i = 0; i < samples.size(); ++i) {
            const SampleTiming& s = samples[i];
            js << "    {\"weights\": " << json_str(s.dtype) << ", \"scheduler\": " << json_str(s.scheduler) << ", \"steps\": " << s.steps
               << ", \"batch\": " << s.batch << ", \"reps\": " << s.reps << ", \"p50_ms\": " << s.p50_ms << ", \"p99_ms\": " << s.p99_ms
               << ", \"min_ms\": " << s.min_ms << "}" << (i + 1 < samples.size() ? "," : "") << "\n";
        }
        js << "  ]";
        if (with_math) {
            js << ",\n";
            math_section();
        }
        js << "\n}\n";
        write_json();
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
