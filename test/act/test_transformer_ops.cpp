// The transformer ops of op_params_transformer.hpp (layer_norm, attention, gelu, transpose, position_embedding_2d) on
// the CPU against naive double-precision references at odd sizes, plus their argument checks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "flowedge/ops.hpp"

using namespace flowedge;

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

TEST_CASE("layer_norm of x + residual matches a double reference, in place, with and without affine") {
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
            std::vector<float> y = x;  // y aliases x
            LayerNormParams p;
            p.x = y.data();
            p.residual = residual ? r.data() : nullptr;
            p.gamma = affine ? g.data() : nullptr;
            p.beta = affine ? b.data() : nullptr;
            p.y = y.data();
            p.rows = rows;
            p.dim = dim;
            Ops<Cpu>::layer_norm(p);
            CHECK(max_rel(y, want) < 2e-6);
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

TEST_CASE("attention matches a double reference: odd head widths, strided inputs, ~300 tokens on the threaded path") {
    struct Case {
        int n_q, n_kv, heads, dim, ld_extra;
    };
    for (const Case c : {Case{37, 301, 5, 13, 0}, Case{12, 29, 6, 8, 7}, Case{302, 302, 8, 64, 0}, Case{1, 1, 3, 5, 3}}) {
        const int W = c.heads * c.dim, ld = W + c.ld_extra;
        const auto q = randn(std::size_t(c.n_q) * ld, 10, 1.5f), k = randn(std::size_t(c.n_kv) * ld, 11, 1.5f);
        const auto v = randn(std::size_t(c.n_kv) * ld, 12);
        std::vector<float> out(std::size_t(c.n_q) * W, -1.f);
        AttentionParams p;
        p.q = q.data();
        p.k = k.data();
        p.v = v.data();
        p.out = out.data();
        p.n_q = c.n_q;
        p.n_kv = c.n_kv;
        p.n_heads = c.heads;
        p.head_dim = c.dim;
        p.ld_q = p.ld_k = p.ld_v = c.ld_extra ? ld : 0;
        p.scale = float(1.0 / std::sqrt(double(c.dim)));
        Ops<Cpu>::attention(p);
        INFO("n_q ", c.n_q, " n_kv ", c.n_kv, " heads ", c.heads, " head_dim ", c.dim);
        CHECK(max_rel(out, attention_reference(p)) < 2e-6);
    }
}

TEST_CASE("attention rejects bad sizes, short strides and an output overlapping its inputs") {
    std::vector<float> buf(64 * 64);
    AttentionParams p;
    p.q = p.k = p.v = buf.data();
    p.out = buf.data() + 32 * 64;
    p.n_q = p.n_kv = 4;
    p.n_heads = 2;
    p.head_dim = 4;
    CHECK_NOTHROW(Ops<Cpu>::attention(p));
    AttentionParams bad = p;
    bad.ld_k = 5;
    CHECK_THROWS_WITH(Ops<Cpu>::attention(bad), doctest::Contains("ld_k >= n_heads * head_dim"));
    bad = p;
    bad.out = buf.data() + 8;
    CHECK_THROWS_WITH(Ops<Cpu>::attention(bad), doctest::Contains("out overlaps q, k or v"));
    std::vector<float> keys(9000 * 8), out(8);
    bad = p;
    bad.k = bad.v = keys.data();
    bad.out = out.data();
    bad.n_kv = 9000;
    bad.n_q = 1;
    CHECK_THROWS_WITH(Ops<Cpu>::attention(bad), doctest::Contains("too many keys"));
    bad = p;
    bad.n_heads = 0;
    CHECK_THROWS_WITH(Ops<Cpu>::attention(bad), doctest::Contains("flowedge: attention: sizes must be positive"));
}

TEST_CASE("gelu is erf GELU to float rounding, in place") {
    auto x = randn(1001, 20, 3.f);
    x[0] = 0.f;
    x[1] = -12.f;
    x[2] = 12.f;
    const auto x0 = x;
    GeluParams p;
    p.x = x.data();
    p.y = x.data();
    p.n = std::int64_t(x.size());
    Ops<Cpu>::gelu(p);
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double r = 0.5 * double(x0[i]) * (1.0 + std::erf(double(x0[i]) / std::sqrt(2.0)));
        CHECK(std::fabs(x[i] - r) <= 1e-7 * (1.0 + std::fabs(r)));
    }
}

TEST_CASE("transpose moves every element; it rejects overlapping buffers") {
    const int rows = 45, cols = 71;
    const auto x = randn(std::size_t(rows) * cols, 30);
    std::vector<float> y(x.size());
    TransposeParams p;
    p.x = x.data();
    p.y = y.data();
    p.rows = rows;
    p.cols = cols;
    Ops<Cpu>::transpose(p);
    bool same = true;
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) same = same && y[std::size_t(c) * rows + r] == x[std::size_t(r) * cols + c];
    CHECK(same);
    p.y = const_cast<float*>(x.data()) + 10;
    CHECK_THROWS_WITH(Ops<Cpu>::transpose(p), doctest::Contains("overlap"));
}

TEST_CASE("position_embedding_2d is LeRobot's ACTSinusoidalPositionEmbedding2d (double reference of its formula)") {
    for (const auto& [h, w, dim] : {std::tuple{3, 5, 32}, std::tuple{15, 20, 512}, std::tuple{1, 1, 8}}) {
        std::vector<float> y(std::size_t(h) * w * dim);
        PositionEmbedding2dParams p;
        p.y = y.data();
        p.h = h;
        p.w = w;
        p.dim = dim;
        Ops<Cpu>::position_embedding_2d(p);
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
    std::vector<float> y(16);
    bad.y = y.data();
    bad.h = bad.w = 1;
    bad.dim = 7;
    CHECK_THROWS_WITH(Ops<Cpu>::position_embedding_2d(bad), doctest::Contains("dim even"));
}
