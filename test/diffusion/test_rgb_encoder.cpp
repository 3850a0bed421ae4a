// DiffusionRgbEncoder tests: the whole encoder (normalise, resize, center crop, ResNet18 with BatchNorm or GroupNorm,
// SpatialSoftmax, Linear+ReLU) against an independent double-precision reference written from the PyTorch/torchvision
// definitions, with random weights in an in-memory safetensors file under LeRobot's key names; F32 and BF16 weights;
// the config reader; load errors; the measured workspace; no allocation in forward().
#include <doctest/doctest.h>

#include "../support/counting_new.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "../ops/ops_test_util.hpp"
#include "flowedge/models/diffusion/rgb_encoder.hpp"
#include "../support/cpu_models_diffusion_policy.hpp"

using namespace flowedge;

namespace {

using Vec = std::vector<double>;

// ---------------------------------------------------------------------------------------------------------------
// Checkpoint: every tensor LeRobot's DiffusionRgbEncoder state dict holds, enumerated from torchvision's resnet18.

struct Tensor {
    std::vector<std::int64_t> shape;
    std::vector<float> value;  // exactly what the file stores (BF16 files: the rounded values)
};
using Checkpoint = std::map<std::string, Tensor>;

/// Round-to-nearest-even to BF16, written independently of dtype.hpp.
float round_bf16(float v) {
    std::uint32_t u;
    std::memcpy(&u, &v, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    float r;
    std::memcpy(&r, &u, 4);
    return r;
}

/// numpy.linspace(-1, 1, n) as float64.
Vec linspace(int n) {
    Vec v(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) v[std::size_t(i)] = n == 1 ? -1.0 : -1.0 + 2.0 * i / (n - 1);
    if (n > 1) v.back() = 1.0;
    return v;
}

/// Feature-map rows for `in` input rows through resnet18 (conv 7/2/3, maxpool 3/2/1, three stride-2 stages).
int feature_size(int in) {
    int s = (in + 6 - 7) / 2 + 1;
    s = (s + 2 - 3) / 2 + 1;
    for (int i = 0; i < 3; ++i) s = (s + 2 - 3) / 2 + 1;
    return s;
}

/// Random weights for every key of the encoder (conv weights Kaiming-uniform so activations stay O(1)).
Checkpoint random_checkpoint(const DiffusionRgbEncoderConfig& c, std::uint32_t seed) {
    std::mt19937 rng(seed);
    Checkpoint ck;
    auto uniform = [&](const std::string& key, std::vector<std::int64_t> shape, double lo, double hi) {
        std::int64_t n = 1;
        for (auto d : shape) n *= d;
        std::uniform_real_distribution<double> d(lo, hi);
        Tensor t{shape, std::vector<float>(std::size_t(n))};
        for (float& x : t.value) x = float(d(rng));
        ck[key] = std::move(t);
    };
    auto conv = [&](const std::string& key, int out, int in, int k) {
        const double a = std::sqrt(6.0 / (in * k * k));
        uniform(key, {out, in, k, k}, -a, a);
    };
    auto norm = [&](const std::string& p, int ch) {
        uniform(p + "weight", {ch}, 0.6, 1.4);
        uniform(p + "bias", {ch}, -0.2, 0.2);
        if (!c.group_norm) {
            uniform(p + "running_mean", {ch}, -0.3, 0.3);
            uniform(p + "running_var", {ch}, 0.5, 2.0);
        }
    };
    const std::string b = "backbone.";
    conv(b + "0.weight", 64, c.channels, 7);
    norm(b + "1.", 64);
    int in = 64;
    const int widths[4] = {64, 128, 256, 512};
    for (int l = 0; l < 4; ++l) {
        for (int j = 0; j < 2; ++j) {
            const std::string p = b + std::to_string(4 + l) + "." + std::to_string(j) + ".";
            const int cin = j == 0 ? in : widths[l];
            conv(p + "conv1.weight", widths[l], cin, 3);
            norm(p + "bn1.", widths[l]);
            conv(p + "conv2.weight", widths[l], widths[l], 3);
            norm(p + "bn2.", widths[l]);
            if (j == 0 && l > 0) {
                conv(p + "downsample.0.weight", widths[l], cin, 1);
                norm(p + "downsample.1.", widths[l]);
            }
        }
        in = widths[l];
    }
    const int K = c.keypoints, fh = feature_size(c.input_h()), fw = feature_size(c.input_w());
    uniform("pool.nets.weight", {K, 512, 1, 1}, -0.15, 0.15);
    uniform("pool.nets.bias", {K}, -0.5, 0.5);
    Tensor grid{{std::int64_t(fh) * fw, 2}, {}};
    const Vec xs = linspace(fw), ys = linspace(fh);
    for (int r = 0; r < fh; ++r)
        for (int q = 0; q < fw; ++q) {
            grid.value.push_back(float(xs[std::size_t(q)]));
            grid.value.push_back(float(ys[std::size_t(r)]));
        }
    ck["pool.pos_grid"] = std::move(grid);
    const double a = 1.0 / std::sqrt(2.0 * K);
    uniform("out.weight", {2 * K, 2 * K}, -a, a);
    uniform("out.bias", {2 * K}, -0.1, 0.3);
    return ck;
}

/// Rounds every tensor to BF16 (what a BF16 file stores).
void round_all_bf16(Checkpoint& ck) {
    for (auto& [k, t] : ck)
        for (float& v : t.value) v = round_bf16(v);
}

/// The checkpoint as a safetensors file in memory under `prefix`, F32 or BF16, with BatchNorm's
/// num_batches_tracked (I64 scalar) as a real state dict has it. `skip` leaves a key out.
std::shared_ptr<const io::SafeTensors> to_file(const Checkpoint& ck, const std::string& prefix, DType dtype,
                                               const std::string& skip = "") {
    io::SafeTensorsWriter w;
    std::set<std::string> bn_prefixes;
    for (const auto& [k, t] : ck) {
        if (k == skip) continue;
        Shape s;
        for (auto d : t.shape) s.dims[std::size_t(s.rank++)] = d;
        if (dtype == DType::F32) {
            w.add_f32(prefix + k, s, t.value);
        } else {
            std::vector<std::uint16_t> bits(t.value.size());
            for (std::size_t i = 0; i < bits.size(); ++i) {
                std::uint32_t u;
                std::memcpy(&u, &t.value[i], 4);
                bits[i] = std::uint16_t(u >> 16);  // values are already BF16-exact
            }
            w.add(prefix + k, DType::BF16, s, bits.data());
        }
        const auto at = k.rfind("running_mean");
        if (at != std::string::npos) bn_prefixes.insert(k.substr(0, at));
    }
    for (const std::string& p : bn_prefixes) {
        const std::int64_t tracked = 1234;
        w.add_raw(prefix + p + "num_batches_tracked", "I64", {}, std::as_bytes(std::span<const std::int64_t>(&tracked, 1)));
    }
    return io::SafeTensors::from_bytes(w.bytes(), "encoder.safetensors");
}

// ---------------------------------------------------------------------------------------------------------------
// Double-precision reference from the PyTorch definitions: images are [c][h][w] planes per frame.

struct Image {
    int c = 0, h = 0, w = 0;
    Vec v;  // [c, h, w]
    double& at(int ch, int r, int q) { return v[(std::size_t(ch) * h + r) * w + q]; }
    double at(int ch, int r, int q) const { return v[(std::size_t(ch) * h + r) * w + q]; }
};
Image zeros(int c, int h, int w) { return Image{c, h, w, Vec(std::size_t(c) * h * w, 0.0)}; }

const Tensor& get(const Checkpoint& ck, const std::string& k) {
    auto it = ck.find(k);
    REQUIRE_MESSAGE(it != ck.end(), k);
    return it->second;
}

/// torch.nn.Conv2d, square kernel, zero padding.
Image conv2d(const Image& x, const std::vector<double>& w, const std::vector<double>& bias, int out, int k, int stride, int pad) {
    const int oh = (x.h + 2 * pad - k) / stride + 1, ow = (x.w + 2 * pad - k) / stride + 1;
    Image y = zeros(out, oh, ow);
    for (int o = 0; o < out; ++o)
        for (int r = 0; r < oh; ++r)
            for (int q = 0; q < ow; ++q) {
                double s = bias.empty() ? 0.0 : bias[std::size_t(o)];
                for (int i = 0; i < x.c; ++i)
                    for (int kh = 0; kh < k; ++kh) {
                        const int ir = r * stride + kh - pad;
                        if (ir < 0 || ir >= x.h) continue;
                        for (int kw = 0; kw < k; ++kw) {
                            const int iq = q * stride + kw - pad;
                            if (iq < 0 || iq >= x.w) continue;
                            s += w[((std::size_t(o) * x.c + i) * k + kh) * k + kw] * x.at(i, ir, iq);
                        }
                    }
                y.at(o, r, q) = s;
            }
    return y;
}

Vec widen(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

void relu(Image& x) {
    for (double& v : x.v) v = std::max(v, 0.0);
}

/// A conv + norm of the backbone. BatchNorm (eval): (y - mean) / sqrt(var + eps) * gamma + beta; with
/// `folded_bf16` the conv runs on the BatchNorm-folded weight rounded to BF16, as LoadOptions::weight_dtype = BF16
/// stores it. GroupNorm(C/16, C): per group, biased variance.
Image conv_norm(const Checkpoint& ck, const DiffusionRgbEncoderConfig& c, bool folded_bf16, const Image& x,
                const std::string& conv_key, const std::string& norm, int out, int k, int stride, int pad) {
    const Tensor& wt = get(ck, conv_key);
    const Vec gamma = widen(get(ck, norm + "weight").value), beta = widen(get(ck, norm + "bias").value);
    if (!c.group_norm) {
        const Vec mean = widen(get(ck, norm + "running_mean").value), var = widen(get(ck, norm + "running_var").value);
        if (folded_bf16) {
            const std::size_t per = wt.value.size() / std::size_t(out);
            Vec w(wt.value.size()), b(static_cast<std::size_t>(out));
            for (std::size_t o = 0; o < std::size_t(out); ++o) {
                const double scale = gamma[o] / std::sqrt(var[o] + 1e-5);
                for (std::size_t i = 0; i < per; ++i) w[o * per + i] = round_bf16(float(double(wt.value[o * per + i]) * scale));
                b[o] = float(beta[o] - mean[o] * scale);
            }
            return conv2d(x, w, b, out, k, stride, pad);
        }
        Image y = conv2d(x, widen(wt.value), {}, out, k, stride, pad);
        for (int o = 0; o < out; ++o)
            for (int p = 0; p < y.h * y.w; ++p) {
                double& v = y.v[std::size_t(o) * y.h * y.w + std::size_t(p)];
                v = (v - mean[std::size_t(o)]) / std::sqrt(var[std::size_t(o)] + 1e-5) * gamma[std::size_t(o)] + beta[std::size_t(o)];
            }
        return y;
    }
    Vec w = widen(wt.value);
    if (folded_bf16)
        for (double& v : w) v = round_bf16(float(v));
    Image y = conv2d(x, w, {}, out, k, stride, pad);
    const int groups = out / 16, per = 16;
    const std::size_t hw = std::size_t(y.h) * y.w;
    for (int g = 0; g < groups; ++g) {
        double sum = 0, sq = 0;
        for (std::size_t i = 0; i < per * hw; ++i) sum += y.v[std::size_t(g) * per * hw + i];
        const double mean = sum / double(per * hw);
        for (std::size_t i = 0; i < per * hw; ++i) sq += (y.v[std::size_t(g) * per * hw + i] - mean) * (y.v[std::size_t(g) * per * hw + i] - mean);
        const double inv = 1.0 / std::sqrt(sq / double(per * hw) + 1e-5);
        for (int ch = g * per; ch < (g + 1) * per; ++ch)
            for (std::size_t p = 0; p < hw; ++p) {
                double& v = y.v[std::size_t(ch) * hw + p];
                v = (v - mean) * inv * gamma[std::size_t(ch)] + beta[std::size_t(ch)];
            }
    }
    return y;
}

/// torch.nn.MaxPool2d(3, 2, 1).
Image maxpool(const Image& x) {
    const int oh = (x.h + 2 - 3) / 2 + 1, ow = (x.w + 2 - 3) / 2 + 1;
    Image y = zeros(x.c, oh, ow);
    for (int ch = 0; ch < x.c; ++ch)
        for (int r = 0; r < oh; ++r)
            for (int q = 0; q < ow; ++q) {
                double m = -INFINITY;
                for (int a = r * 2 - 1; a <= r * 2 + 1; ++a)
                    for (int b = q * 2 - 1; b <= q * 2 + 1; ++b)
                        if (a >= 0 && a < x.h && b >= 0 && b < x.w) m = std::max(m, x.at(ch, a, b));
                y.at(ch, r, q) = m;
            }
    return y;
}

/// torchvision BasicBlock in eval mode.
Image basic_block(const Checkpoint& ck, const DiffusionRgbEncoderConfig& c, bool bf16, const Image& x, const std::string& p,
                  int out, int stride) {
    Image identity = x;
    if (stride != 1 || x.c != out) identity = conv_norm(ck, c, bf16, x, p + "downsample.0.weight", p + "downsample.1.", out, 1, stride, 0);
    Image y = conv_norm(ck, c, bf16, x, p + "conv1.weight", p + "bn1.", out, 3, stride, 1);
    relu(y);
    y = conv_norm(ck, c, bf16, y, p + "conv2.weight", p + "bn2.", out, 3, 1, 1);
    for (std::size_t i = 0; i < y.v.size(); ++i) y.v[i] += identity.v[i];
    relu(y);
    return y;
}

/// One axis of PyTorch's antialiased bilinear resize (_upsample_bilinear2d_aa, align_corners False): for each output
/// index, the input range and normalised triangle-filter weights.
struct AxisWeights {
    std::vector<int> first;
    std::vector<Vec> w;
};
AxisWeights aa_weights(int in, int out) {
    const double scale = double(in) / out, support = scale >= 1.0 ? scale : 1.0, inv = scale >= 1.0 ? 1.0 / scale : 1.0;
    AxisWeights a;
    for (int i = 0; i < out; ++i) {
        const double center = scale * (i + 0.5);
        const int lo = std::max(int(std::int64_t(center - support + 0.5)), 0);
        const int hi = std::min(int(std::int64_t(center + support + 0.5)), in);
        Vec w;
        double total = 0;
        for (int j = lo; j < hi; ++j) {
            const double t = std::fabs((j - center + 0.5) * inv);
            w.push_back(t < 1.0 ? 1.0 - t : 0.0);
            total += w.back();
        }
        for (double& v : w) v = total != 0 ? v / total : 0.0;
        a.first.push_back(lo);
        a.w.push_back(std::move(w));
    }
    return a;
}
Image resize(const Image& x, int oh, int ow) {
    const AxisWeights ah = aa_weights(x.h, oh), aw = aa_weights(x.w, ow);
    Image y = zeros(x.c, oh, ow);
    for (int ch = 0; ch < x.c; ++ch)
        for (int r = 0; r < oh; ++r)
            for (int q = 0; q < ow; ++q) {
                double s = 0;
                for (std::size_t i = 0; i < ah.w[std::size_t(r)].size(); ++i)
                    for (std::size_t j = 0; j < aw.w[std::size_t(q)].size(); ++j)
                        s += ah.w[std::size_t(r)][i] * aw.w[std::size_t(q)][j] *
                             x.at(ch, ah.first[std::size_t(r)] + int(i), aw.first[std::size_t(q)] + int(j));
                y.at(ch, r, q) = s;
            }
    return y;
}

/// torchvision CenterCrop: offset int(round((size - crop) / 2.0)), Python rounding (half to even), written with
/// std::nearbyint (round-half-even in the default rounding mode).
Image center_crop(const Image& x, int th, int tw) {
    const int top = int(std::nearbyint((x.h - th) / 2.0)), left = int(std::nearbyint((x.w - tw) / 2.0));
    Image y = zeros(x.c, th, tw);
    for (int ch = 0; ch < x.c; ++ch)
        for (int r = 0; r < th; ++r)
            for (int q = 0; q < tw; ++q) y.at(ch, r, q) = x.at(ch, top + r, left + q);
    return y;
}

struct Normalization {
    NormKind kind = NormKind::Identity;
    std::vector<float> offset, denom;
};

/// The whole encoder on one frame already in [0, 1] (CHW): features [2K].
Vec reference_features(const Checkpoint& ck, const DiffusionRgbEncoderConfig& c, bool bf16, Image x, const Normalization& norm) {
    for (int ch = 0; ch < x.c; ++ch)
        for (int p = 0; p < x.h * x.w; ++p) {
            double& v = x.v[std::size_t(ch) * x.h * x.w + std::size_t(p)];
            if (norm.kind == NormKind::MeanStd) v = (v - norm.offset[std::size_t(ch)]) / norm.denom[std::size_t(ch)];
            else if (norm.kind == NormKind::MinMax) v = 2.0 * (v - norm.offset[std::size_t(ch)]) / norm.denom[std::size_t(ch)] - 1.0;
        }
    if (c.resize_h > 0) x = resize(x, c.resize_h, c.resize_w);
    if (c.crop_h > 0) x = center_crop(x, c.crop_h, c.crop_w);
    const std::string b = "backbone.";
    Image y = conv_norm(ck, c, bf16, x, b + "0.weight", b + "1.", 64, 7, 2, 3);
    relu(y);
    y = maxpool(y);
    const int widths[4] = {64, 128, 256, 512};
    for (int l = 0; l < 4; ++l)
        for (int j = 0; j < 2; ++j)
            y = basic_block(ck, c, bf16, y, b + std::to_string(4 + l) + "." + std::to_string(j) + ".", widths[l], j == 0 && l > 0 ? 2 : 1);
    // SpatialSoftmax: 1x1 conv, softmax over positions, expected (x, y) under pos_grid; then ReLU(Linear).
    const int K = c.keypoints, P = y.h * y.w;
    Vec nets_w = widen(get(ck, "pool.nets.weight").value), out_w = widen(get(ck, "out.weight").value);
    if (bf16) {
        for (double& v : nets_w) v = round_bf16(float(v));
        for (double& v : out_w) v = round_bf16(float(v));
    }
    const Image logits = conv2d(y, nets_w, widen(get(ck, "pool.nets.bias").value), K, 1, 1, 0);
    const std::vector<float>& grid = get(ck, "pool.pos_grid").value;
    Vec kp(std::size_t(2 * K));
    for (int k = 0; k < K; ++k) {
        double m = -INFINITY, total = 0, ex = 0, ey = 0;
        for (int p = 0; p < P; ++p) m = std::max(m, logits.v[std::size_t(k) * P + std::size_t(p)]);
        for (int p = 0; p < P; ++p) {
            const double e = std::exp(logits.v[std::size_t(k) * P + std::size_t(p)] - m);
            total += e;
            ex += e * grid[2 * std::size_t(p)];
            ey += e * grid[2 * std::size_t(p) + 1];
        }
        kp[2 * std::size_t(k)] = ex / total;
        kp[2 * std::size_t(k) + 1] = ey / total;
    }
    const Vec out_b = widen(get(ck, "out.bias").value);
    Vec f(std::size_t(2 * K));
    for (int o = 0; o < 2 * K; ++o) {
        double s = out_b[std::size_t(o)];
        for (int i = 0; i < 2 * K; ++i) s += out_w[std::size_t(o) * 2 * K + std::size_t(i)] * kp[std::size_t(i)];
        f[std::size_t(o)] = std::max(s, 0.0);
    }
    return f;
}

// ---------------------------------------------------------------------------------------------------------------
// Frames and the run on a backend.

struct Frames {
    ImageLayout layout = ImageLayout::U8Hwc;
    int n = 0, c = 0, h = 0, w = 0;
    std::vector<std::uint8_t> u8;  // [n, h, w, c]
    std::vector<float> f32;        // [n, c, h, w]
    /// Frame i as the [c, h, w] image in [0, 1] the encoder sees.
    Image image(int i) const {
        Image x = zeros(c, h, w);
        for (int ch = 0; ch < c; ++ch)
            for (int r = 0; r < h; ++r)
                for (int q = 0; q < w; ++q)
                    x.at(ch, r, q) = layout == ImageLayout::U8Hwc
                                         ? u8[((std::size_t(i) * h + r) * w + q) * c + std::size_t(ch)] / 255.0
                                         : f32[((std::size_t(i) * c + ch) * h + r) * w + std::size_t(q)];
        return x;
    }
};

Frames random_frames(ImageLayout layout, int n, int c, int h, int w, std::uint32_t seed) {
    Frames f{layout, n, c, h, w, {}, {}};
    std::mt19937 rng(seed);
    const std::size_t count = std::size_t(n) * c * h * w;
    // Smooth structure plus noise, so the crop window and the resize matter.
    if (layout == ImageLayout::U8Hwc) {
        f.u8.resize(count);
        for (int i = 0; i < n; ++i)
            for (int r = 0; r < h; ++r)
                for (int q = 0; q < w; ++q)
                    for (int ch = 0; ch < c; ++ch) {
                        const double base = 127.5 + 100.0 * std::sin(0.3 * r + 0.2 * q * (ch + 1) + i);
                        f.u8[((std::size_t(i) * h + r) * w + q) * c + std::size_t(ch)] =
                            std::uint8_t(std::clamp(base + double(rng() % 41) - 20.0, 0.0, 255.0));
                    }
    } else {
        f.f32.resize(count);
        std::uniform_real_distribution<double> noise(-0.1, 0.1);
        for (int i = 0; i < n; ++i)
            for (int ch = 0; ch < c; ++ch)
                for (int r = 0; r < h; ++r)
                    for (int q = 0; q < w; ++q)
                        f.f32[((std::size_t(i) * c + ch) * h + r) * w + std::size_t(q)] =
                            float(std::clamp(0.5 + 0.4 * std::cos(0.25 * r * (ch + 1) - 0.15 * q + i) + noise(rng), 0.0, 1.0));
    }
    return f;
}

/// Loads the encoder from `file` under `prefix` and encodes the frames on B: features [n, 2K].
template <class B>
std::vector<float> run_encoder(const DiffusionRgbEncoderConfig& c, const std::shared_ptr<const io::SafeTensors>& file,
                               const std::string& prefix, const LoadOptions& opts, const Frames& frames, const Normalization& norm) {
    DiffusionRgbEncoder<B> enc(c);
    enc.load(file, prefix, opts);
    if (norm.kind != NormKind::Identity) enc.set_normalization(norm.kind, norm.offset.data(), norm.denom.data());
    Workspace<B> ws(enc.workspace_bytes(frames.n));
    Context<B> ctx;
    ctx.workspace = &ws;
    optest::Dev<std::uint8_t, B> u8(frames.u8);
    optest::Dev<float, B> f32(frames.f32);
    optest::Dev<float, B> out(std::size_t(frames.n) * enc.feature_dim());
    const void* x = frames.layout == ImageLayout::U8Hwc ? static_cast<const void*>(u8.ptr()) : static_cast<const void*>(f32.ptr());
    enc.forward(ctx, x, frames.layout, frames.n, View<float, B>{out.ptr(), Shape{frames.n, enc.feature_dim()}});
    return out.host(std::size_t(frames.n) * enc.feature_dim());
}

/// Features of every frame vs the reference: max |got - want| / max |want| per frame.
void check_features(const std::vector<float>& got, const Checkpoint& ck, const DiffusionRgbEncoderConfig& c, bool bf16,
                    const Frames& frames, const Normalization& norm, double tol) {
    const std::size_t D = std::size_t(2 * c.keypoints);
    REQUIRE(got.size() == std::size_t(frames.n) * D);
    for (int i = 0; i < frames.n; ++i) {
        const Vec want = reference_features(ck, c, bf16, frames.image(i), norm);
        double err = 0, scale = 0;
        int positive = 0;
        for (std::size_t d = 0; d < D; ++d) {
            err = std::max(err, std::fabs(double(got[std::size_t(i) * D + d]) - want[d]));
            scale = std::max(scale, std::fabs(want[d]));
            positive += want[d] > 0;
        }
        CAPTURE(i);
        CAPTURE(err);
        CAPTURE(scale);
        CHECK(positive >= int(D) / 4);  // the ReLU leaves enough of the output alive for the comparison to mean something
        CHECK(err <= tol * scale);
    }
}

Normalization imagenet_mean_std() {
    return {NormKind::MeanStd, {0.485f, 0.456f, 0.406f}, {0.229f + 1e-8f, 0.224f + 1e-8f, 0.225f + 1e-8f}};
}

/// Float32 through ~20 layers vs float64: relative max-norm error of the features.
constexpr double kTolF32 = 2e-5;

}  // namespace

TEST_CASE("center crop offsets follow torchvision (Python round half to even)") {
    CHECK(center_crop_offset(96, 84) == 6);
    CHECK(center_crop_offset(25, 20) == 2);  // 2.5 -> 2
    CHECK(center_crop_offset(27, 20) == 4);  // 3.5 -> 4
    CHECK(center_crop_offset(44, 39) == 2);
    CHECK(center_crop_offset(52, 45) == 4);
    CHECK(center_crop_offset(20, 20) == 0);
    CHECK(center_crop_offset(21, 20) == 0);  // 0.5 -> 0
    CHECK(center_crop_offset(23, 20) == 2);  // 1.5 -> 2
}

TEST_CASE_TEMPLATE("BatchNorm encoder on uint8 frames with mean/std normalisation and an odd center crop matches the reference", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!optest::ready<B>()) return;
    const DiffusionRgbEncoderConfig c{.channels = 3, .image_h = 44, .image_w = 52, .crop_h = 39, .crop_w = 45, .group_norm = false, .keypoints = 16};
    const Checkpoint ck = random_checkpoint(c, 1);
    const Frames frames = random_frames(ImageLayout::U8Hwc, 2, 3, 44, 52, 11);
    const Normalization norm = imagenet_mean_std();
    const auto got = run_encoder<B>(c, to_file(ck, "diffusion.rgb_encoder.", DType::F32), "diffusion.rgb_encoder.", {}, frames, norm);
    check_features(got, ck, c, false, frames, norm, kTolF32);
}

TEST_CASE_TEMPLATE("GroupNorm encoder from a BF16 file on float frames with min/max normalisation matches the reference", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!optest::ready<B>()) return;
    const DiffusionRgbEncoderConfig c{.channels = 3, .image_h = 44, .image_w = 52, .crop_h = 40, .crop_w = 48, .group_norm = true, .keypoints = 8};
    Checkpoint ck = random_checkpoint(c, 2);
    round_all_bf16(ck);
    const Frames frames = random_frames(ImageLayout::F32Chw, 3, 3, 44, 52, 12);
    const Normalization norm{NormKind::MinMax, {0.05f, 0.1f, 0.0f}, {0.9f, 0.8f, 1.0f}};
    const auto got = run_encoder<B>(c, to_file(ck, "diffusion.rgb_encoder.1.", DType::BF16), "diffusion.rgb_encoder.1.", {}, frames, norm);
    check_features(got, ck, c, false, frames, norm, kTolF32);
}

TEST_CASE_TEMPLATE("BatchNorm folded then stored as BF16 (LoadOptions::weight_dtype), full frame without crop, matches the reference",
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!optest::ready<B>()) return;
    const DiffusionRgbEncoderConfig c{.channels = 3, .image_h = 36, .image_w = 42, .group_norm = false, .keypoints = 8};
    const Checkpoint ck = random_checkpoint(c, 3);
    const Frames frames = random_frames(ImageLayout::U8Hwc, 1, 3, 36, 42, 13);
    const auto got = run_encoder<B>(c, to_file(ck, "", DType::F32), "", {.weight_dtype = DType::BF16}, frames, {});
    check_features(got, ck, c, true, frames, {}, kTolF32);
}

TEST_CASE_TEMPLATE("GroupNorm encoder with BF16 storage of F32 weights matches the reference on the rounded weights", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!optest::ready<B>()) return;
    const DiffusionRgbEncoderConfig c{.channels = 3, .image_h = 40, .image_w = 40, .crop_h = 34, .crop_w = 36, .group_norm = true, .keypoints = 8};
    const Checkpoint ck = random_checkpoint(c, 4);
    const Frames frames = random_frames(ImageLayout::U8Hwc, 1, 3, 40, 40, 14);
    const Normalization norm = imagenet_mean_std();
    const auto got = run_encoder<B>(c, to_file(ck, "p.", DType::F32), "p.", {.weight_dtype = DType::BF16}, frames, norm);
    check_features(got, ck, c, true, frames, norm, kTolF32);
}

TEST_CASE_TEMPLATE("resize_shape with crop_ratio (LeRobot 0.6 config) resizes with antialiasing, center-crops and matches the reference",
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!optest::ready<B>()) return;
    const nlohmann::json j = {{"vision_backbone", "resnet18"},          {"resize_shape", {44, 52}},
                              {"crop_ratio", 0.9},                      {"crop_shape", nullptr},
                              {"use_group_norm", false},                {"spatial_softmax_num_keypoints", 8},
                              {"pretrained_backbone_weights", nullptr}};
    const DiffusionRgbEncoderConfig c = rgb_encoder_config_from_lerobot(j, 61, 75);
    CHECK(c.resize_h == 44);
    CHECK(c.resize_w == 52);
    CHECK(c.crop_h == 39);  // int(44 * 0.9) = int(39.6)
    CHECK(c.crop_w == 46);  // int(52 * 0.9) = int(46.8)
    const Checkpoint ck = random_checkpoint(c, 5);
    const Frames frames = random_frames(ImageLayout::U8Hwc, 2, 3, 61, 75, 15);
    const Normalization norm = imagenet_mean_std();
    const auto got = run_encoder<B>(c, to_file(ck, "diffusion.rgb_encoder.", DType::F32), "diffusion.rgb_encoder.", {}, frames, norm);
    check_features(got, ck, c, false, frames, norm, kTolF32);
}

TEST_CASE_TEMPLATE("upsampling resize_shape without crop matches the reference", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!optest::ready<B>()) return;
    const DiffusionRgbEncoderConfig c{.channels = 3, .image_h = 30, .image_w = 25, .resize_h = 40, .resize_w = 45, .group_norm = true, .keypoints = 8};
    const Checkpoint ck = random_checkpoint(c, 6);
    const Frames frames = random_frames(ImageLayout::F32Chw, 1, 3, 30, 25, 16);
    const auto got = run_encoder<B>(c, to_file(ck, "", DType::F32), "", {}, frames, {});
    check_features(got, ck, c, false, frames, {}, kTolF32);
}

TEST_CASE("visit_parameters names every tensor of the LeRobot state dict with its shape (num_batches_tracked aside)") {
    for (bool gn : {false, true}) {
        CAPTURE(gn);
        const DiffusionRgbEncoderConfig c{.channels = 3, .image_h = 84, .image_w = 84, .group_norm = gn, .keypoints = 32};
        const Checkpoint ck = random_checkpoint(c, 7);
        DiffusionRgbEncoder<Cpu> enc(c);
        std::set<std::string> visited;
        enc.visit_parameters([&](const std::string& name, Parameter<Cpu>&, const Shape& shape, Storage) {
            CAPTURE(name);
            REQUIRE(ck.count(name) == 1);
            const auto& want = ck.at(name).shape;
            CHECK(shape.rank == int(want.size()));
            for (int d = 0; d < shape.rank; ++d) CHECK(shape[d] == want[std::size_t(d)]);
            CHECK(visited.insert(name).second);
        });
        CHECK(visited.size() == ck.size());
        CHECK(enc.feature_dim() == 64);
        CHECK(enc.feature_map_h() == 3);
        CHECK(enc.feature_map_w() == 3);
        // torchvision resnet18 has 11,689,512 parameters; its fc (512*1000 + 1000) is dropped. Then pool.nets and out.
        CHECK(enc.n_parameters() == 11689512 - 513000 + (512 * 32 + 32) + (64 * 64 + 64));
    }
}

TEST_CASE("rgb_encoder_config_from_lerobot reads 0.4.x and 0.6 configs and names bad fields") {
    const nlohmann::json v044 = {{"vision_backbone", "resnet18"}, {"crop_shape", {84, 84}}, {"crop_is_random", true},
                                 {"pretrained_backbone_weights", nullptr}, {"use_group_norm", true},
                                 {"spatial_softmax_num_keypoints", 32}};
    DiffusionRgbEncoderConfig c = rgb_encoder_config_from_lerobot(v044, 96, 96);
    CHECK(c.resize_h == 0);
    CHECK(c.crop_h == 84);
    CHECK(c.crop_w == 84);
    CHECK(c.group_norm);
    CHECK(c.keypoints == 32);
    CHECK(c.input_h() == 84);

    nlohmann::json v06 = v044;
    v06["resize_shape"] = {96, 96};
    v06["crop_ratio"] = 1.0;  // ratio 1 with a resize: no crop, crop_shape ignored
    c = rgb_encoder_config_from_lerobot(v06, 120, 160);
    CHECK(c.resize_h == 96);
    CHECK(c.crop_h == 0);
    CHECK(c.input_w() == 96);
    v06["crop_ratio"] = 0.875;
    c = rgb_encoder_config_from_lerobot(v06, 120, 160);
    CHECK(c.crop_h == 84);
    v06["resize_shape"] = nullptr;  // no resize: crop_shape as given
    c = rgb_encoder_config_from_lerobot(v06, 96, 96);
    CHECK(c.crop_h == 84);

    auto error_of = [](auto&& f) -> std::string {
        try {
            f();
        } catch (const Error& e) {
            return e.what();
        }
        return {};
    };
    nlohmann::json bad = v044;
    bad["vision_backbone"] = "resnet34";
    CHECK(error_of([&] { rgb_encoder_config_from_lerobot(bad, 96, 96); }) ==
          "flowedge: lerobot: unsupported vision_backbone (expected resnet18, got resnet34)");
    bad = v044;
    bad["crop_shape"] = {100, 84};
    CHECK(error_of([&] { rgb_encoder_config_from_lerobot(bad, 96, 96); }) ==
          "flowedge: lerobot: crop_shape should fit within the image shape (expected <= (96, 96), got (100, 84))");
    bad = v044;
    bad["resize_shape"] = {96, 0};
    CHECK(error_of([&] { rgb_encoder_config_from_lerobot(bad, 96, 96); }).find("resize_shape must be a pair of positive integers") !=
          std::string::npos);
    bad = v044;
    bad["crop_ratio"] = 1.5;
    CHECK(error_of([&] { rgb_encoder_config_from_lerobot(bad, 96, 96); }).find("crop_ratio must be in (0, 1]") != std::string::npos);
    bad = v044;
    bad["spatial_softmax_num_keypoints"] = 0;
    CHECK(error_of([&] { rgb_encoder_config_from_lerobot(bad, 96, 96); }) ==
          "flowedge: lerobot: invalid spatial_softmax_num_keypoints (expected 1..65536, got 0)");
    bad = v044;
    bad.erase("use_group_norm");
    CHECK(error_of([&] { rgb_encoder_config_from_lerobot(bad, 96, 96); }) == "flowedge: lerobot: config.json: missing field 'use_group_norm'");
    const DiffusionRgbEncoderConfig direct{.image_h = 96, .image_w = 96, .vision_backbone = "resnet50"};
    CHECK(error_of([&] { DiffusionRgbEncoder<Cpu> e(direct); }) ==
          "flowedge: rgb_encoder: unsupported vision_backbone (expected resnet18, got resnet50)");
}

TEST_CASE("loading names a missing tensor, and a wrong shape with the expected shape") {
    const DiffusionRgbEncoderConfig c{.channels = 3, .image_h = 40, .image_w = 40, .group_norm = false, .keypoints = 8};
    Checkpoint ck = random_checkpoint(c, 8);
    auto error_of = [](auto&& f) -> std::string {
        try {
            f();
        } catch (const Error& e) {
            return e.what();
        }
        return {};
    };
    auto load = [&](const Checkpoint& k, const std::string& skip = "") {
        DiffusionRgbEncoder<Cpu> enc(c);
        enc.load(to_file(k, "diffusion.rgb_encoder.", DType::F32, skip), "diffusion.rgb_encoder.", {});
    };
    CHECK(error_of([&] { load(ck); }).empty());
    for (const std::string key : {"backbone.6.1.bn2.running_var", "backbone.5.0.downsample.0.weight", "pool.pos_grid", "out.bias"}) {
        CAPTURE(key);
        CHECK(error_of([&] { load(ck, key); }).find("missing tensor 'diffusion.rgb_encoder." + key + "'") != std::string::npos);
    }
    Checkpoint wrong = ck;
    wrong["out.weight"] = Tensor{{16, 17}, std::vector<float>(16 * 17, 0.f)};
    CHECK(error_of([&] { load(wrong); }) ==
          "flowedge: rgb_encoder: tensor 'diffusion.rgb_encoder.out.weight' has the wrong shape (expected [16, 16], got [16, 17])");
    wrong = ck;
    wrong["pool.pos_grid"] = Tensor{{9, 2}, std::vector<float>(18, 0.f)};  // a 3x3 map's grid; 40x40 gives 2x2
    CHECK(error_of([&] { load(wrong); }) ==
          "flowedge: rgb_encoder: tensor 'diffusion.rgb_encoder.pool.pos_grid' has the wrong shape (expected [4, 2], got [9, 2])");
    wrong = ck;
    wrong["backbone.4.0.conv1.weight"] = Tensor{{64, 64, 1, 1}, std::vector<float>(64 * 64, 0.f)};
    CHECK(error_of([&] { load(wrong); }) ==
          "flowedge: resnet18: tensor 'diffusion.rgb_encoder.backbone.4.0.conv1.weight' has the wrong shape (expected [64, 64, 3, 3], "
          "got [64, 64, 1, 1])");
    wrong = ck;
    wrong["backbone.1.running_mean"] = Tensor{{32}, std::vector<float>(32, 0.f)};
    CHECK(error_of([&] { load(wrong); }) ==
          "flowedge: resnet18: tensor 'diffusion.rgb_encoder.backbone.1.running_mean' has the wrong shape (expected [64], got [32])");
}

TEST_CASE("forward checks its inputs and runs in exactly workspace_bytes(n) of scratch, without allocating") {
    const DiffusionRgbEncoderConfig c{.channels = 3, .image_h = 48, .image_w = 48, .crop_h = 42, .crop_w = 42, .group_norm = true, .keypoints = 8};
    const Checkpoint ck = random_checkpoint(c, 9);
    DiffusionRgbEncoder<Cpu> enc(c);
    enc.load(to_file(ck, "", DType::F32), "", {});
    const Frames frames = random_frames(ImageLayout::U8Hwc, 3, 3, 48, 48, 19);
    Workspace<Cpu> ws(enc.workspace_bytes(2));
    Context<Cpu> ctx;
    ctx.workspace = &ws;
    std::vector<float> out(3 * 16);
    const std::size_t news0 = fe_test::g_operator_new_calls.load(), mem0 = Memory<Cpu>::allocation_count().load();
    for (int n = 1; n <= 2; ++n) {
        enc.forward(ctx, frames.u8.data(), ImageLayout::U8Hwc, n, View<float, Cpu>{out.data(), Shape{n, 16}});
        CHECK(ws.used() == 0);
    }
    CHECK(fe_test::g_operator_new_calls.load() - news0 == 0);
    CHECK(Memory<Cpu>::allocation_count().load() - mem0 == 0);
    CHECK_THROWS_WITH_AS(enc.forward(ctx, frames.u8.data(), ImageLayout::U8Hwc, 3, View<float, Cpu>{out.data(), Shape{3, 16}}),
                         doctest::Contains("scratch exhausted"), Error);
    CHECK_THROWS_WITH_AS(enc.forward(ctx, frames.u8.data(), ImageLayout::U8Hwc, 2, View<float, Cpu>{out.data(), Shape{2, 15}}),
                         "flowedge: rgb_encoder: features: wrong shape (expected [2, 16], got [2, 15])", Error);
    CHECK_THROWS_WITH_AS(enc.forward(ctx, nullptr, ImageLayout::U8Hwc, 1, View<float, Cpu>{out.data(), Shape{1, 16}}),
                         "flowedge: rgb_encoder: null frames pointer", Error);
    // A BatchNorm conv bound through visit_parameters alone (no fold) refuses to run instead of computing without its norm.
    const DiffusionRgbEncoderConfig cb{.channels = 3, .image_h = 40, .image_w = 40, .group_norm = false, .keypoints = 8};
    DiffusionRgbEncoder<Cpu> unfolded(cb);
    const auto file = to_file(random_checkpoint(cb, 10), "", DType::F32);
    bind_parameters<Cpu>(unfolded, file, "", {}, "test");
    Workspace<Cpu> ws2(unfolded.workspace_bytes(1));
    ctx.workspace = &ws2;
    std::vector<std::uint8_t> frame(40 * 40 * 3, 7);
    CHECK_THROWS_WITH_AS(unfolded.forward(ctx, frame.data(), ImageLayout::U8Hwc, 1, View<float, Cpu>{out.data(), Shape{1, 16}}),
                         doctest::Contains("only load() folds the BatchNorm in"), Error);
}
