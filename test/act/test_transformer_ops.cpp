// The transformer ops of op_params_transformer.hpp (layer_norm, attention, gelu, transpose, position_embedding_2d)
// against naive double-precision references at odd sizes, plus their argument checks: one TEST_CASE_TEMPLATE body
// per op over the backends of test/ops (Cpu always, Cuda in a CUDA build; without a device the Cuda instances log
// the skip and return).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "../ops/ops_test_util.hpp"
#include "flowedge/ops.hpp"

using namespace flowedge;
using optest::Dev;
using optest::ready;

namespace {

std::vector<float> randn(std::size_t n, std::uint32_t seed, float scale = 1.f, float shift = 0.f) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.f, 1.f);
    std::vector<float> v(n);
    for (float& x : v) x = shift + scale * d(g);
    return v;
}

double max_rel(const std::vector<float>& got, const std::vector<double>& want) {
    double m = 0;
    for (std::size_t i = 0; i < got.size(); ++i) m = std::max(m, std::fabs(double(got[i]) - want[i]) / (1.0 + std::fabs(want[i])));
    return m;
}

}  // namespace

TEST_CASE_TEMPLATE("layer_norm of x + residual matches a double reference, in place, with and without affine", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    const int rows = 7, dim = 37;
    const auto x = randn(std::size_t(rows) * dim, 1, 3.f, 2.f), r = randn(std::size_t(rows) * dim, 2);
    const auto g = randn(dim, 3, 0.1f, 1.f), b = randn(dim, 4, 0.1f);
    for (const bool affine : {true, false})
        for (const bool residual : {true, false}) {
            std::vector<double> want(x.size());
            for (int i = 0; i < rows; ++i) {
                double mean = 0, var = 0;
                std::vector<double> t(dim);
                for (int d = 0; d < dim; ++d) mean += t[d] = double(float(x[i * dim + d] + (residual ? r[i * dim + d] : 0.f)));
                mean /= dim;
                for (int d = 0; d < dim; ++d) var += (t[d] - mean) * (t[d] - mean);
                var /= dim;
                for (int d = 0; d < dim; ++d)
                    want[i * dim + d] = (t[d] - mean) / std::sqrt(var + 1e-5) * (affine ? g[d] : 1.0) + (affine ? b[d] : 0.0);
            }
            Dev<float, B> y(x), dr(r), dg(g), db(b);  // y aliases x
            LayerNormParams p;
            p.x = y.ptr();
            p.residual = residual ? dr.ptr() : nullptr;
            p.gamma = affine ? dg.ptr() : nullptr;
            p.beta = affine ? db.ptr() : nullptr;
            p.y = y.ptr();
            p.rows = rows;
            p.dim = dim;
            Ops<B>::layer_norm(p);
            CAPTURE(affine);
            CAPTURE(residual);
            CHECK(max_rel(y.host(x.size()), want) < 2e-6);
        }
}

/// out = softmax(scale q k^T) v per head, in double.
std::vector<double> attention_reference(const AttentionParams& p) {
    const int W = p.n_heads * p.head_dim;
    const int lq = p.ld_q ? p.ld_q : W, lk = p.ld_k ? p.ld_k : W, lv = p.ld_v ? p.ld_v : W;
    std::vector<double> out(std::size_t(p.n_q) * W);
    std::vector<double> s(std::size_t(p.n_kv));
    for (int h = 0; h < p.n_heads; ++h)
        for (int i = 0; i < p.n_q; ++i) {
            double mx = -1e300, sum = 0;
            for (int j = 0; j < p.n_kv; ++j) {
                double dot = 0;
                for (int t = 0; t < p.head_dim; ++t)
                    dot += double(p.q[i * lq + h * p.head_dim + t]) * double(p.k[j * lk + h * p.head_dim + t]);
                s[j] = dot * p.scale;
                mx = std::max(mx, s[j]);
            }
            for (int j = 0; j < p.n_kv; ++j) sum += s[j] = std::exp(s[j] - mx);
            for (int t = 0; t < p.head_dim; ++t) {
                double o = 0;
                for (int j = 0; j < p.n_kv; ++j) o += s[j] * double(p.v[j * lv + h * p.head_dim + t]);
                out[std::size_t(i) * W + h * p.head_dim + t] = o / sum;
            }
        }
    return out;
}

TEST_CASE_TEMPLATE("attention matches a double reference: odd head widths, strided inputs, ACT's ~300 tokens x 8 heads x 64, "
                   "keys past the 48 KiB shared-memory default", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    struct Case {
        int n_q, n_kv, heads, dim, ld_extra;
    };
    // 302 x 302 x 8 x 64: ACT's encoder at one 480x640 camera; 100 x 602: the decoder's cross-attention at two;
    // 9 x 2000: a score tile past the 48 KiB shared-memory default.
    for (const Case c : {Case{37, 301, 5, 13, 0}, Case{12, 29, 6, 8, 7}, Case{302, 302, 8, 64, 0}, Case{100, 602, 8, 64, 0},
                         Case{1, 1, 3, 5, 3}, Case{17, 40, 2, 256, 0}, Case{9, 2000, 2, 64, 0}}) {
        const int W = c.heads * c.dim, ld = W + c.ld_extra;
        const auto q = randn(std::size_t(c.n_q) * ld, 10, 1.5f), k = randn(std::size_t(c.n_kv) * ld, 11, 1.5f);
        const auto v = randn(std::size_t(c.n_kv) * ld, 12);
        Dev<float, B> dq(q), dk(k), dv(v), dout(std::vector<float>(std::size_t(c.n_q) * W, -1.f));
        AttentionParams p;
        p.q = dq.ptr();
        p.k = dk.ptr();
        p.v = dv.ptr();
        p.out = dout.ptr();
        p.n_q = c.n_q;
        p.n_kv = c.n_kv;
        p.n_heads = c.heads;
        p.head_dim = c.dim;
        p.ld_q = p.ld_k = p.ld_v = c.ld_extra ? ld : 0;
        p.scale = float(1.0 / std::sqrt(double(c.dim)));
        Ops<B>::attention(p);
        AttentionParams host = p;  // the reference reads the host copies
        host.q = q.data();
        host.k = k.data();
        host.v = v.data();
        INFO("n_q ", c.n_q, " n_kv ", c.n_kv, " heads ", c.heads, " head_dim ", c.dim);
        // F32 rounding of each q.k score grows like sqrt(head_dim) and exp() carries it into the weights; the softmax
        // denominator and the p.v sums over n_kv keys add rounding growing like sqrt(n_kv) (the GPU's reordered sums
        // reached 2.2e-6 at head_dim 256, and 1.83e-6 at 301 keys x head_dim 13 on the H200).
        const double bound = 1e-6 * (1.0 + std::sqrt(double(c.dim)) / 8.0 + std::sqrt(double(c.n_kv)) / 16.0);
        CHECK(max_rel(dout.host(std::size_t(c.n_q) * W), attention_reference(host)) < bound);
    }
}

TEST_CASE_TEMPLATE("attention rejects bad sizes, short strides, an output overlapping its inputs and too many keys", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    Dev<float, B> buf(64 * 64), keys(9000 * 8), out(8);
    AttentionParams p;
    p.q = p.k = p.v = buf.ptr();
    p.out = buf.ptr() + 32 * 64;
    p.n_q = p.n_kv = 4;
    p.n_heads = 2;
    p.head_dim = 4;
    CHECK_NOTHROW(Ops<B>::attention(p));
    AttentionParams bad = p;
    bad.ld_k = 5;
    CHECK_THROWS_WITH(Ops<B>::attention(bad), doctest::Contains("ld_k >= n_heads * head_dim"));
    bad = p;
    bad.out = buf.ptr() + 8;
    CHECK_THROWS_WITH(Ops<B>::attention(bad), doctest::Contains("out overlaps q, k or v"));
    bad = p;
    bad.k = bad.v = keys.ptr();
    bad.out = out.ptr();
    bad.n_kv = 9000;
    bad.n_q = 1;
    CHECK_THROWS_WITH(Ops<B>::attention(bad), doctest::Contains("too many keys"));
    bad = p;
    bad.n_heads = 0;
    CHECK_THROWS_WITH(Ops<B>::attention(bad), doctest::Contains("flowedge: attention: sizes must be positive"));
    if constexpr (!optest::kIsCpu<B>) {  // the CUDA kernel's register accumulators bound the head width
        bad = p;
        bad.k = bad.v = keys.ptr();
        bad.out = buf.ptr() + 2048;
        bad.n_q = bad.n_kv = bad.n_heads = 1;
        bad.head_dim = 300;
        CHECK_THROWS_WITH(Ops<B>::attention(bad),
                          doctest::Contains("head_dim too large for the per-thread accumulators (expected <= 256, got 300)"));
    }
    Memory<B>::synchronize();
}

TEST_CASE_TEMPLATE("gelu is erf GELU to float rounding, in place", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    auto x = randn(1001, 20, 3.f);
    x[0] = 0.f;
    x[1] = -12.f;
    x[2] = 12.f;
    const auto x0 = x;
    Dev<float, B> dx(x);
    GeluParams p;
    p.x = dx.ptr();
    p.y = dx.ptr();
    p.n = std::int64_t(x.size());
    Ops<B>::gelu(p);
    x = dx.host(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double r = 0.5 * double(x0[i]) * (1.0 + std::erf(double(x0[i]) / std::sqrt(2.0)));
        CHECK(std::fabs(x[i] - r) <= 1e-7 * (1.0 + std::fabs(r)));
    }
}

TEST_CASE_TEMPLATE("transpose moves every element; it rejects overlapping buffers", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    // 45 x 71: partial tiles on both edges; 512 x 300: ACT's projected 15 x 20 feature map to token rows.
    for (const auto& [rows, cols] : {std::pair{45, 71}, std::pair{512, 300}}) {
        const auto x = randn(std::size_t(rows) * cols, 30);
        Dev<float, B> dx(x), dy(x.size());
        TransposeParams p;
        p.x = dx.ptr();
        p.y = dy.ptr();
        p.rows = rows;
        p.cols = cols;
        Ops<B>::transpose(p);
        const auto y = dy.host(x.size());
        bool same = true;
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c) same = same && y[std::size_t(c) * rows + r] == x[std::size_t(r) * cols + c];
        INFO(rows, " x ", cols);
        CHECK(same);
        p.y = dx.ptr() + 10;
        CHECK_THROWS_WITH(Ops<B>::transpose(p), doctest::Contains("overlap"));
    }
}

TEST_CASE_TEMPLATE("position_embedding_2d is LeRobot's ACTSinusoidalPositionEmbedding2d (double reference of its formula)", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    for (const auto& [h, w, dim] : {std::tuple{3, 5, 32}, std::tuple{15, 20, 512}, std::tuple{1, 1, 8}}) {
        Dev<float, B> dy(std::size_t(h) * w * dim);
        PositionEmbedding2dParams p;
        p.y = dy.ptr();
        p.h = h;
        p.w = w;
        p.dim = dim;
        Ops<B>::position_embedding_2d(p);
        const auto y = dy.host(std::size_t(h) * w * dim);
        const int half = dim / 2;
        double worst = 0;
        for (int r = 0; r < h; ++r)
            for (int c = 0; c < w; ++c)
                for (int k = 0; k < dim; ++k) {
                    const bool is_y = k < half;
                    const int i = is_y ? k : k - half;
                    const double pos = is_y ? r + 1 : c + 1, n = is_y ? h : w;
                    const double a = pos / (n + 1e-6) * 2 * M_PI / std::pow(10000.0, 2.0 * (i / 2) / half);
                    const double want = i % 2 == 0 ? std::sin(a) : std::cos(a);
                    worst = std::max(worst, std::fabs(double(y[(std::size_t(r) * w + c) * dim + k]) - want));
                }
        INFO(h, "x", w, " dim ", dim);
        CHECK(worst < 4e-6);
    }
    PositionEmbedding2dParams bad;
    Dev<float, B> y(16);
    bad.y = y.ptr();
    bad.h = bad.w = 1;
    bad.dim = 7;
    CHECK_THROWS_WITH(Ops<B>::position_embedding_2d(bad), doctest::Contains("dim even"));
}
