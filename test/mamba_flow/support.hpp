// Test support for the Mamba + flow suite: random tiny checkpoints, a self-contained safetensors writer,
// a .npy reader, and naive double-precision references for Mamba-1 and the flow head written from docs/models.md (#mamba-1-backbone, #flow-matching-head).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

namespace fe_test {

/// A tensor to write: F32 values, stored as F32/BF16/F16 on disk.
struct HostTensor {
    std::vector<std::int64_t> shape;
    std::vector<float> values;
};
using TensorMap = std::map<std::string, HostTensor>;

/// Minimal safetensors writer (F32 only), independent of the library's writer.
inline void write_safetensors(const std::filesystem::path& path, const TensorMap& tensors) {
    nlohmann::json header = nlohmann::json::object();
    std::size_t offset = 0;
    for (const auto& [name, t] : tensors) {
        const std::size_t bytes = t.values.size() * 4;
        header[name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
        offset += bytes;
    }
    header["__metadata__"] = {{"format", "pt"}};
    std::string h = header.dump();
    while ((h.size() + 8) % 8 != 0) h.push_back(' ');
    std::ofstream f(path, std::ios::binary);
    const std::uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(h.data(), std::streamsize(h.size()));
    for (const auto& [name, t] : tensors) f.write(reinterpret_cast<const char*>(t.values.data()), std::streamsize(t.values.size() * 4));
    if (!f) throw std::runtime_error("cannot write " + path.string());
}

/// Reads a little-endian float32 (or float64, converted) C-order .npy file.
inline std::vector<float> read_npy(const std::filesystem::path& path, std::vector<std::int64_t>* shape = nullptr) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open " + path.string());
    char magic[6];
    f.read(magic, 6);
    if (std::memcmp(magic, "\x93NUMPY", 6) != 0) throw std::runtime_error("not a .npy file: " + path.string());
    unsigned char ver[2];
    f.read(reinterpret_cast<char*>(ver), 2);
    std::uint32_t hlen = 0;
    if (ver[0] == 1) {
        std::uint16_t h16;
        f.read(reinterpret_cast<char*>(&h16), 2);
        hlen = h16;
    } else {
        f.read(reinterpret_cast<char*>(&hlen), 4);
    }
    std::string header(hlen, ' ');
    f.read(header.data(), hlen);
    const bool f64 = header.find("'<f8'") != std::string::npos;
    if (!f64 && header.find("'<f4'") == std::string::npos) throw std::runtime_error("npy dtype must be <f4 or <f8: " + header);
    if (header.find("'fortran_order': True") != std::string::npos) throw std::runtime_error("fortran order npy");
    std::vector<std::int64_t> dims;
    const auto open = header.find('(', header.find("'shape'"));
    const auto close = header.find(')', open);
    std::string inner = header.substr(open + 1, close - open - 1);
    std::size_t pos = 0;
    while (pos < inner.size()) {
        while (pos < inner.size() && (inner[pos] == ' ' || inner[pos] == ',')) ++pos;
        if (pos >= inner.size()) break;
        std::size_t end = pos;
        while (end < inner.size() && std::isdigit(static_cast<unsigned char>(inner[end]))) ++end;
        dims.push_back(std::stoll(inner.substr(pos, end - pos)));
        pos = end;
    }
    std::int64_t n = 1;
    for (auto d : dims) n *= d;
    std::vector<float> out(static_cast<std::size_t>(n));
    if (f64) {
        std::vector<double> tmp(out.size());
        f.read(reinterpret_cast<char*>(tmp.data()), std::streamsize(tmp.size() * 8));
        for (std::size_t i = 0; i < out.size(); ++i) out[i] = float(tmp[i]);
    } else {
        f.read(reinterpret_cast<char*>(out.data()), std::streamsize(out.size() * 4));
    }
    if (!f) throw std::runtime_error("truncated npy " + path.string());
    if (shape) *shape = dims;
    return out;
}

struct TinyShape {
    int n_layers = 2, d_model = 5, d_inner = 10, d_state = 3, d_conv = 3, dt_rank = 2, vocab = 11;
    int action_dim = 3, hidden = 7, time_dim = 6, flow_layers = 2;
};

/// Random checkpoint with realistic-ish Mamba init (A_log = log(1..S) + jitter, dt bias = softplus^-1 of a
/// log-uniform dt, D around 1, norm weights around 1) and a flow head. Either part can be left out.
inline TensorMap make_tiny(const TinyShape& s, std::uint32_t seed, bool backbone = true, bool flow = true,
                           float flow_scale = 1.f) {
    std::mt19937 rng(seed);
    auto uni = [&](float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); };
    TensorMap m;
    auto mat = [&](const std::string& name, std::vector<std::int64_t> shape, float bound) {
        HostTensor t{shape, {}};
        std::int64_t n = 1;
        for (auto d : shape) n *= d;
        for (std::int64_t i = 0; i < n; ++i) t.values.push_back(uni(-bound, bound));
        m[name] = std::move(t);
    };
    if (backbone) {
        const std::string p = "backbone.";
        mat(p + "embeddings.weight", {s.vocab, s.d_model}, 1.f);
        for (int l = 0; l < s.n_layers; ++l) {
            const std::string L = p + "layers." + std::to_string(l) + ".";
            HostTensor nw{{s.d_model}, {}};
            for (int i = 0; i < s.d_model; ++i) nw.values.push_back(uni(0.8f, 1.2f));
            m[L + "norm.weight"] = nw;
            const std::string M = L + "mixer.";
            mat(M + "in_proj.weight", {2 * s.d_inner, s.d_model}, 1.f / std::sqrt(float(s.d_model)));
            mat(M + "conv1d.weight", {s.d_inner, 1, s.d_conv}, 1.f / std::sqrt(float(s.d_conv)));
            mat(M + "conv1d.bias", {s.d_inner}, 0.3f);
            mat(M + "x_proj.weight", {s.dt_rank + 2 * s.d_state, s.d_inner}, 1.f / std::sqrt(float(s.d_inner)));
            mat(M + "dt_proj.weight", {s.d_inner, s.dt_rank}, 1.f / std::sqrt(float(s.dt_rank)));
            HostTensor dtb{{s.d_inner}, {}};
            for (int i = 0; i < s.d_inner; ++i) {
                const float dt = std::exp(uni(std::log(1e-3f), std::log(0.1f)));
                dtb.values.push_back(dt + std::log(-std::expm1(-dt)));
            }
            m[M + "dt_proj.bias"] = dtb;
            HostTensor alog{{s.d_inner, s.d_state}, {}};
            for (int c = 0; c < s.d_inner; ++c)
                for (int n = 0; n < s.d_state; ++n) alog.values.push_back(std::log(float(n + 1)) + uni(-0.1f, 0.1f));
            m[M + "A_log"] = alog;
            HostTensor d{{s.d_inner}, {}};
            for (int i = 0; i < s.d_inner; ++i) d.values.push_back(uni(0.5f, 1.5f));
            m[M + "D"] = d;
            mat(M + "out_proj.weight", {s.d_model, s.d_inner}, 1.f / std::sqrt(float(s.d_inner)));
        }
        HostTensor nf{{s.d_model}, {}};
        for (int i = 0; i < s.d_model; ++i) nf.values.push_back(uni(0.8f, 1.2f));
        m[p + "norm_f.weight"] = nf;
    }
    if (flow) {
        const float H = float(s.hidden);
        mat("flow.in_proj.weight", {s.hidden, s.action_dim}, flow_scale / std::sqrt(float(s.action_dim)));
        mat("flow.time_proj.weight", {s.hidden, s.time_dim}, flow_scale / std::sqrt(float(s.time_dim)));
        mat("flow.cond_proj.weight", {s.hidden, s.d_model}, flow_scale / std::sqrt(float(s.d_model)));
        for (int l = 0; l < s.flow_layers; ++l) mat("flow.layers." + std::to_string(l) + ".weight", {s.hidden, s.hidden}, flow_scale / std::sqrt(H));
        mat("flow.out_proj.weight", {s.action_dim, s.hidden}, flow_scale / std::sqrt(H));
    }
    return m;
}

// ---- naive double references -------------------------------------------------------------------------

inline double silu(double x) { return x / (1.0 + std::exp(-x)); }
inline double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

/// y[r, o] = sum_i W[o, i] x[r, i]
inline std::vector<double> matmul_t(const std::vector<double>& x, int rows, int in, const std::vector<float>& w, int out) {
    std::vector<double> y(std::size_t(rows) * out, 0.0);
    for (int r = 0; r < rows; ++r)
        for (int o = 0; o < out; ++o) {
            double acc = 0;
            for (int i = 0; i < in; ++i) acc += double(w[std::size_t(o) * in + i]) * x[std::size_t(r) * in + i];
            y[std::size_t(r) * out + o] = acc;
        }
    return y;
}

/// Mamba-1 (docs/models.md#mamba-1-backbone) in double, with streaming state.
struct RefMamba {
    TinyShape s;
    const TensorMap* m = nullptr;
    std::string p = "backbone.";
    std::vector<std::vector<double>> conv, ssm;  // per layer: [K-1, di] x history, [di, S]

    RefMamba(const TinyShape& shape, const TensorMap& tensors) : s(shape), m(&tensors) { reset(); }
    void reset() {
        conv.assign(std::size_t(s.n_layers), std::vector<double>(std::size_t(s.d_conv - 1) * s.d_inner, 0.0));
        ssm.assign(std::size_t(s.n_layers), std::vector<double>(std::size_t(s.d_inner) * s.d_state, 0.0));
    }
    const std::vector<float>& w(const std::string& k) const { return m->at(p + k).values; }

    std::vector<double> rmsnorm(const std::vector<double>& x, int rows, const std::vector<float>& weight) const {
        std::vector<double> y(x.size());
        const int d = s.d_model;
        for (int r = 0; r < rows; ++r) {
            double ss = 0;
            for (int i = 0; i < d; ++i) ss += x[std::size_t(r) * d + i] * x[std::size_t(r) * d + i];
            const double inv = 1.0 / std::sqrt(ss / d + 1e-5);
            for (int i = 0; i < d; ++i) y[std::size_t(r) * d + i] = x[std::size_t(r) * d + i] * inv * weight[std::size_t(i)];
        }
        return y;
    }

    /// Runs L tokens continuing from the current state; returns hidden [L, d_model].
    std::vector<double> run(const std::vector<int>& tokens) {
        const int L = int(tokens.size()), dm = s.d_model, di = s.d_inner, S = s.d_state, K = s.d_conv, R = s.dt_rank;
        std::vector<double> h(std::size_t(L) * dm);
        const auto& emb = w("embeddings.weight");
        for (int t = 0; t < L; ++t)
            for (int i = 0; i < dm; ++i) h[std::size_t(t) * dm + i] = emb[std::size_t(tokens[std::size_t(t)]) * dm + i];
        for (int l = 0; l < s.n_layers; ++l) {
            const std::string M = "layers." + std::to_string(l) + ".mixer.";
            auto n = rmsnorm(h, L, w("layers." + std::to_string(l) + ".norm.weight"));
            auto xz = matmul_t(n, L, dm, w(M + "in_proj.weight"), 2 * di);
            // history rows: K-1 from state then L new
            std::vector<double> xx(std::size_t(K - 1 + L) * di);
            for (int r = 0; r < K - 1; ++r)
                for (int c = 0; c < di; ++c) xx[std::size_t(r) * di + c] = conv[std::size_t(l)][std::size_t(r) * di + c];
            for (int t = 0; t < L; ++t)
                for (int c = 0; c < di; ++c) xx[std::size_t(K - 1 + t) * di + c] = xz[std::size_t(t) * 2 * di + c];
            const auto& cw = w(M + "conv1d.weight");
            const auto& cb = w(M + "conv1d.bias");
            std::vector<double> u(std::size_t(L) * di);
            for (int t = 0; t < L; ++t)
                for (int c = 0; c < di; ++c) {
                    double acc = cb[std::size_t(c)];
                    for (int k = 0; k < K; ++k) acc += double(cw[std::size_t(c) * K + k]) * xx[std::size_t(t + k) * di + c];
                    u[std::size_t(t) * di + c] = silu(acc);
                }
            for (int r = 0; r < K - 1; ++r)
                for (int c = 0; c < di; ++c) conv[std::size_t(l)][std::size_t(r) * di + c] = xx[std::size_t(L + r) * di + c];
            auto dbl = matmul_t(u, L, di, w(M + "x_proj.weight"), R + 2 * S);
            std::vector<double> low(std::size_t(L) * R);
            for (int t = 0; t < L; ++t)
                for (int r = 0; r < R; ++r) low[std::size_t(t) * R + r] = dbl[std::size_t(t) * (R + 2 * S) + r];
            auto dt = matmul_t(low, L, R, w(M + "dt_proj.weight"), di);
            const auto& dtb = w(M + "dt_proj.bias");
            for (int t = 0; t < L; ++t)
                for (int c = 0; c < di; ++c) dt[std::size_t(t) * di + c] = softplus(dt[std::size_t(t) * di + c] + dtb[std::size_t(c)]);
            const auto& alog = w(M + "A_log");
            const auto& D = w(M + "D");
            std::vector<double> y(std::size_t(L) * di);
            auto& st = ssm[std::size_t(l)];
            for (int t = 0; t < L; ++t)
                for (int c = 0; c < di; ++c) {
                    double acc = 0;
                    const double d = dt[std::size_t(t) * di + c], uu = u[std::size_t(t) * di + c];
                    for (int k = 0; k < S; ++k) {
                        const double A = -std::exp(double(alog[std::size_t(c) * S + k]));
                        const double Bv = dbl[std::size_t(t) * (R + 2 * S) + R + k];
                        const double Cv = dbl[std::size_t(t) * (R + 2 * S) + R + S + k];
                        double& sv = st[std::size_t(c) * S + k];
                        sv = std::exp(d * A) * sv + d * Bv * uu;
                        acc += sv * Cv;
                    }
                    acc += double(D[std::size_t(c)]) * uu;
                    y[std::size_t(t) * di + c] = acc * silu(xz[std::size_t(t) * 2 * di + di + c]);
                }
            auto o = matmul_t(y, L, di, w(M + "out_proj.weight"), dm);
            for (std::size_t i = 0; i < h.size(); ++i) h[i] += o[i];
        }
        return rmsnorm(h, L, w("norm_f.weight"));
    }
};

/// Flow head (docs/models.md#flow-matching-head) in double.
struct RefFlow {
    TinyShape s;
    const TensorMap* m = nullptr;
    int cond_dim = 0;
    RefFlow(const TinyShape& shape, const TensorMap& tensors, int cd) : s(shape), m(&tensors), cond_dim(cd) {}
    const std::vector<float>& w(const std::string& k) const { return m->at("flow." + k).values; }

    std::vector<double> cproj(const std::vector<double>& cond) const { return matmul_t(cond, 1, cond_dim, w("cond_proj.weight"), s.hidden); }

    std::vector<double> velocity(const std::vector<double>& c, const std::vector<double>& x, double t) const {
        const int H = s.hidden, half = s.time_dim / 2;
        std::vector<double> temb(static_cast<std::size_t>(s.time_dim));
        for (int j = 0; j < half; ++j) {
            const double f = std::pow(10000.0, -double(j) / half);
            temb[std::size_t(j)] = std::sin(t * f);
            temb[std::size_t(half + j)] = std::cos(t * f);
        }
        auto a = matmul_t(x, 1, s.action_dim, w("in_proj.weight"), H);
        auto b = matmul_t(temb, 1, s.time_dim, w("time_proj.weight"), H);
        std::vector<double> h(static_cast<std::size_t>(H));
        for (int i = 0; i < H; ++i) h[std::size_t(i)] = silu(a[std::size_t(i)] + b[std::size_t(i)] + c[std::size_t(i)]);
        for (int l = 0; l < s.flow_layers; ++l) {
            h = matmul_t(h, 1, H, w("layers." + std::to_string(l) + ".weight"), H);
            for (auto& v : h) v = silu(v);
        }
        return matmul_t(h, 1, H, w("out_proj.weight"), s.action_dim);
    }

    /// solver: 0 euler, 1 heun, 2 rk4.
    std::vector<double> sample(const std::vector<double>& cond, std::vector<double> x, int solver, int N) const {
        const auto c = cproj(cond);
        const double dt = 1.0 / N;
        auto add = [](const std::vector<double>& a, const std::vector<double>& b, double s2) {
            std::vector<double> r(a.size());
            for (std::size_t i = 0; i < a.size(); ++i) r[i] = a[i] + s2 * b[i];
            return r;
        };
        for (int k = 0; k < N; ++k) {
            const double t = k * dt;
            if (solver == 0) {
                x = add(x, velocity(c, x, t), dt);
            } else if (solver == 1) {
                auto k1 = velocity(c, x, t);
                auto k2 = velocity(c, add(x, k1, dt), t + dt);
                for (std::size_t i = 0; i < x.size(); ++i) x[i] += dt / 2 * (k1[i] + k2[i]);
            } else {
                auto k1 = velocity(c, x, t);
                auto k2 = velocity(c, add(x, k1, dt / 2), t + dt / 2);
                auto k3 = velocity(c, add(x, k2, dt / 2), t + dt / 2);
                auto k4 = velocity(c, add(x, k3, dt), t + dt);
                for (std::size_t i = 0; i < x.size(); ++i) x[i] += dt / 6 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]);
            }
        }
        return x;
    }
};

/// max |a - b| / max(max |b|, floor): relative error against the reference scale.
template <class A, class Bv>
double rel_err(const A& a, const Bv& b, double floor = 1e-6) {
    double num = 0, den = floor;
    for (std::size_t i = 0; i < b.size(); ++i) {
        num = std::max(num, std::abs(double(a[i]) - double(b[i])));
        den = std::max(den, std::abs(double(b[i])));
    }
    return num / den;
}

inline std::filesystem::path temp_path(const std::string& name) {
    auto dir = std::filesystem::temp_directory_path() / ("flowedge_mamba_flow_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    return dir / name;
}

}  // namespace fe_test
