// torch.nn.Conv2d on any backend, optionally with the eval-mode BatchNorm2d that follows it folded into its weight
// and bias at load, so a ResNet conv + norm (+ residual + ReLU) is one Ops<B>::conv2d.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flowedge/io/safetensors.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// The tensor `key` of `file`, checked to exist, hold floats and have shape `expected`: the same errors
/// bind_parameters and Parameter::load give ("missing tensor 'key'", "tensor 'key' has the wrong shape (expected
/// [..], got [..])").
inline const io::TensorInfo& require_tensor(const io::SafeTensors& file, const std::string& key, const Shape& expected,
                                            std::string_view component) {
    const io::TensorInfo* t = file.find(key);
    if (!t) fail(ErrorKind::BadFile, component, file.path().string() + ": missing tensor '" + key + "'");
    t->require_float(component, file.path().string());
    if (!(t->shape == expected))
        fail(ErrorKind::BadFile, component, "tensor '" + key + "' has the wrong shape" + expected_got(expected.str(), t->shape.str()));
    return *t;
}

/// The elements of a float tensor (F32/BF16/F16) widened exactly to double.
inline std::vector<double> tensor_values(const io::TensorInfo& t) {
    const std::size_t n = static_cast<std::size_t>(t.shape.numel());
    std::vector<float> f(n);
    Parameter<Cpu>::convert(t.data, t.dtype, f.data(), DType::F32, n);
    return std::vector<double>(f.begin(), f.end());
}

/// torch.nn.Conv2d(in, out, kernel, stride, padding, bias) (groups 1, dilation 1, zero padding), square kernel,
/// stride and padding. x: [batch, in, h, w] -> y: [batch, out, out_h, out_w], out = (in + 2 pad - kernel) / stride + 1;
/// weight: [out, in, kernel, kernel]; bias: [out].
///
/// With `batch_norm`, the torch.nn.BatchNorm2d(out, eps) that follows the conv in eval mode is folded in at load():
///   scale = gamma / sqrt(running_var + eps), weight' = weight * scale[o], bias' = beta + (bias - running_mean) * scale
/// (in double, then stored as F32 or LoadOptions::weight_dtype), so forward() is one conv2d op. The BatchNorm's
/// gamma/beta/mean/var stay listed by visit_batch_norm (F32 on B) so every checkpoint key is accounted for.
template <Backend B>
class Conv2d {
public:
    struct Config {
        int in = 0;
        int out = 0;
        int kernel = 1;
        int stride = 1;
        int pad = 0;
        bool bias = false;
        bool batch_norm = false;
        float bn_eps = 1e-5f;
    };

    Conv2d() = default;
    explicit Conv2d(Config cfg) : m_cfg(cfg) {
        check(cfg.in > 0 && cfg.out > 0 && cfg.kernel > 0 && cfg.stride > 0 && cfg.pad >= 0, "conv2d",
              "invalid config (in " + std::to_string(cfg.in) + ", out " + std::to_string(cfg.out) + ", kernel " +
                  std::to_string(cfg.kernel) + ", stride " + std::to_string(cfg.stride) + ", pad " + std::to_string(cfg.pad) + ")");
    }

    const Config& config() const { return m_cfg; }

    /// Output height (or width) for an input of `in` rows (or columns).
    int out_size(int in) const { return (in + 2 * m_cfg.pad - m_cfg.kernel) / m_cfg.stride + 1; }

    /// Lists the conv's own tensors as in the PyTorch state dict: ("weight", [out, in, k, k]) and, with bias,
    /// ("bias", [out]). With batch_norm, after load() the weight holds the folded values.
    template <class F>
    void visit_parameters(F&& f) {
        f("weight", m_weight, Shape{m_cfg.out, m_cfg.in, m_cfg.kernel, m_cfg.kernel}, Storage::Conv2dWeight);
        if (m_cfg.bias) f("bias", m_bias, Shape{m_cfg.out}, Storage::Vector);
    }

    /// Lists the folded BatchNorm2d's tensors ("weight", "bias", "running_mean", "running_var", each [out]) under the
    /// BatchNorm's own name; nothing without batch_norm. Its num_batches_tracked is not used in eval mode.
    template <class F>
    void visit_batch_norm(F&& f) {
        if (!m_cfg.batch_norm) return;
        f("weight", m_bn[0], Shape{m_cfg.out}, Storage::Vector);
        f("bias", m_bn[1], Shape{m_cfg.out}, Storage::Vector);
        f("running_mean", m_bn[2], Shape{m_cfg.out}, Storage::Vector);
        f("running_var", m_bn[3], Shape{m_cfg.out}, Storage::Vector);
    }

    /// Binds the conv from `conv_prefix` + "weight" (+ "bias") and, with batch_norm, folds in the BatchNorm2d found
    /// at `bn_prefix` + "weight" / "bias" / "running_mean" / "running_var". Missing keys and wrong shapes are errors
    /// naming the key and the expected shape.
    void load(const std::shared_ptr<const io::SafeTensors>& file, const std::string& conv_prefix, const std::string& bn_prefix,
              const LoadOptions& opts, std::string_view component) {
        const Shape wshape{m_cfg.out, m_cfg.in, m_cfg.kernel, m_cfg.kernel};
        const std::string w_key = conv_prefix + "weight";  // named: GCC 13 warns on a reference returned from a temporary
        const io::TensorInfo& w = require_tensor(*file, w_key, wshape, component);
        const io::TensorInfo* b = m_cfg.bias ? &require_tensor(*file, conv_prefix + "bias", Shape{m_cfg.out}, component) : nullptr;
        if (!m_cfg.batch_norm) {
            m_weight.load(w, wshape, Storage::Conv2dWeight, opts, file, component);
            if (b) m_bias.load(*b, Shape{m_cfg.out}, Storage::Vector, opts, file, component);
            return;
        }
        static constexpr const char* kBnNames[4] = {"weight", "bias", "running_mean", "running_var"};
        std::vector<double> bn[4];
        const Shape vshape{m_cfg.out};
        for (int i = 0; i < 4; ++i) {
            const std::string key = bn_prefix + kBnNames[i];
            const io::TensorInfo& t = require_tensor(*file, key, vshape, component);
            bn[i] = tensor_values(t);
            m_bn[i].load(t, Shape{m_cfg.out}, Storage::Vector, opts, file, component);
        }
        const std::vector<double> wv = tensor_values(w);
        const std::vector<double> bv = b ? tensor_values(*b) : std::vector<double>(std::size_t(m_cfg.out), 0.0);
        const std::size_t per_out = std::size_t(m_cfg.in) * m_cfg.kernel * m_cfg.kernel;
        std::vector<float> folded_w(wv.size()), folded_b(std::size_t(m_cfg.out));
        for (std::size_t o = 0; o < std::size_t(m_cfg.out); ++o) {
            const double scale = bn[0][o] / std::sqrt(bn[3][o] + double(m_cfg.bn_eps));
            for (std::size_t i = 0; i < per_out; ++i) folded_w[o * per_out + i] = float(wv[o * per_out + i] * scale);
            folded_b[o] = float(bn[1][o] + (bv[o] - bn[2][o]) * scale);
        }
        m_weight.assign(folded_w, wshape, opts.weight_dtype.value_or(DType::F32), Storage::Conv2dWeight, conv_prefix + "weight", component);
        m_bias.assign(folded_b, Shape{m_cfg.out}, DType::F32, Storage::Vector, bn_prefix + "bias", component);
        m_folded = true;
    }

    /// y = act(conv(x) + bias (+ residual)). x: [batch, in, h, w]; y, residual: [batch, out, out_size(h), out_size(w)]
    /// (y must not alias x; residual may be null).
    void forward(Context<B>& ctx, View<const float, B> x, View<float, B> y, Activation act = Activation::None,
                 const float* residual = nullptr) const {
        if (!(m_weight.loaded() && (m_bias.loaded() || !(m_cfg.bias || m_cfg.batch_norm)) && (m_folded || !m_cfg.batch_norm)))
            [[unlikely]]
            fail(ErrorKind::Internal, "conv2d", "forward before the weights are bound (with batch_norm, only load() folds the BatchNorm in)");
        if (!(x.shape.rank == 4)) [[unlikely]]
            fail(ErrorKind::BadShape, "conv2d", "input must be [batch, channels, height, width]" + expected_got(4, x.shape.rank));
        const int batch = int(x.dim(0)), h = int(x.dim(2)), w = int(x.dim(3));
        check_shape(x, Shape{batch, m_cfg.in, h, w}, "conv2d", "input");
        if (!(out_size(h) > 0 && out_size(w) > 0)) [[unlikely]]
            fail(ErrorKind::BadShape, "conv2d", "input smaller than the kernel" +
                                                    expected_got(">= " + std::to_string(m_cfg.kernel - 2 * m_cfg.pad), x.shape.str()));
        check_shape(y, Shape{batch, m_cfg.out, out_size(h), out_size(w)}, "conv2d", "output");
        Conv2dParams p = geometry(batch, h, w);
        p.x = x.data;
        p.w = m_weight.ref();
        p.bias = (m_cfg.bias || m_cfg.batch_norm) ? m_bias.f32() : nullptr;
        p.residual = residual;
        p.y = y.data;
        p.act = act;
        p.math = ctx.math;
        p.f32_gemm = ctx.f32_gemm;
        if ((ctx.math != MathMode::F32 || ctx.f32_gemm) && ctx.workspace) {
            // The library GEMM path wants backend scratch (CUDA: the im2col panel and the GEMM library's workspace);
            // taken only when the arena was sized for it (scratch_bytes at load), else the exact kernels run.
            const std::size_t need = backend_scratch_bytes(p);
            if (need > 0 && ctx.workspace->available() >= need) {
                typename Workspace<B>::Mark mark(*ctx.workspace);
                p.scratch = ctx.workspace->template take<std::byte>(Shape{std::int64_t(need)}).data;
                p.scratch_bytes = need;
                Ops<B>::conv2d(p, ctx.stream);
                return;
            }
        }
        Ops<B>::conv2d(p, ctx.stream);
    }

    /// Backend scratch a forward() over `batch` x [in, h, w] may take for the library GEMM path (non-F32 MathMode or
    /// Context::f32_gemm; 0 on the CPU, which has none); models add the largest to their workspace at load.
    std::size_t scratch_bytes(int batch, int h, int w) const {
        if (!(out_size(h) > 0 && out_size(w) > 0)) return 0;
        return backend_scratch_bytes(geometry(batch, h, w));
    }

    /// The bound weight as the ops take it (the folded copy with batch_norm).
    WeightRef weight_ref() const { return m_weight.ref(); }

    /// The op's sizes for `batch` x [in, h, w] inputs (pointers left for the caller).
    Conv2dParams geometry(int batch, int h, int w) const {
        Conv2dParams p;
        p.batch = batch;
        p.in_channels = m_cfg.in;
        p.out_channels = m_cfg.out;
        p.in_h = h;
        p.in_w = w;
        p.out_h = out_size(h);
        p.out_w = out_size(w);
        p.kernel_h = p.kernel_w = m_cfg.kernel;
        p.stride_h = p.stride_w = m_cfg.stride;
        p.pad_h = p.pad_w = m_cfg.pad;
        return p;
    }

    /// Parameters of the module pair as in PyTorch (the conv, plus the BatchNorm's affine weight and bias).
    std::int64_t n_parameters() const {
        return std::int64_t(m_cfg.out) * m_cfg.in * m_cfg.kernel * m_cfg.kernel + (m_cfg.bias ? m_cfg.out : 0) +
               (m_cfg.batch_norm ? 2 * m_cfg.out : 0);
    }
    /// Multiply-adds of one forward() over a [batch, in, h, w] input.
    std::int64_t macs(int batch, int h, int w) const {
        return std::int64_t(batch) * m_cfg.out * out_size(h) * out_size(w) * m_cfg.in * m_cfg.kernel * m_cfg.kernel;
    }

private:
    /// Ops<B>::conv2d_scratch_bytes where the backend has a rounded conv2d path (CUDA), else 0.
    static std::size_t backend_scratch_bytes(const Conv2dParams& p) {
        if constexpr (requires { Ops<B>::conv2d_scratch_bytes(p); }) return Ops<B>::conv2d_scratch_bytes(p);
        else return 0;
    }

    Config m_cfg{};
    Parameter<B> m_weight;
    Parameter<B> m_bias;   ///< the conv's bias, or the folded bias with batch_norm
    Parameter<B> m_bn[4];  ///< BatchNorm gamma, beta, running_mean, running_var as loaded (listed, not computed with)
    bool m_folded = false;  ///< load() folded the BatchNorm into m_weight / m_bias
};

}  // namespace flowedge
