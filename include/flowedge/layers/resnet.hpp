// torchvision's resnet18 without its avgpool and fc (the feature extractor LeRobot's DiffusionRgbEncoder keeps), over
// Ops<B>, with BatchNorm folded into the convolutions or LeRobot's GroupNorm replacement. Its scratch size is measured
// by running forward()'s own walk with a WorkspaceMeter.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "flowedge/layers/conv2d.hpp"
#include "flowedge/layers/group_norm.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// nn.Sequential(*list(torchvision.models.resnet18().children())[:-2]) in eval mode:
///   0 conv1 7x7/2 pad 3 (no bias), 1 norm, 2 relu, 3 maxpool 3/2 pad 1, 4..7 layer1..layer4 (two BasicBlocks each:
///   conv3x3(stride) -> norm -> relu -> conv3x3 -> norm, + identity or downsample (conv1x1(stride) -> norm), relu).
/// norm is BatchNorm2d (eps 1e-5, running statistics; folded into the conv before it at load) or, with group_norm,
/// nn.GroupNorm(C / 16, C) as LeRobot's use_group_norm substitutes it (same state-dict names, no running stats).
/// x: [batch, in_channels, height, width] -> y: [batch, 512, out_h, out_w]. Parameter names are those of the
/// Sequential ("0.weight", "1.running_mean", "4.0.conv1.weight", "5.0.downsample.1.weight", ...) or, with
/// torchvision_names, of torchvision's module ("conv1.weight", "bn1.running_mean", "layer1.0.conv1.weight", ...).
template <Backend B>
class ResNet18Backbone {
public:
    struct Config {
        int in_channels = 3;
        int height = 0;  ///< input image rows
        int width = 0;   ///< input image columns
        bool group_norm = false;
        /// Name tensors as torchvision's resnet18 module does ("conv1.", "bn1.", "layer1.0.conv1.", ...: ACT's
        /// IntermediateLayerGetter backbone) instead of the Sequential's indices.
        bool torchvision_names = false;
    };
    static constexpr int kOutChannels = 512;

    ResNet18Backbone() = default;
    explicit ResNet18Backbone(Config cfg) : m_cfg(cfg) {
        check(cfg.in_channels > 0 && cfg.height > 0 && cfg.width > 0, "resnet18",
              "input must have positive channels and size" +
                  expected_got("> 0", std::to_string(cfg.in_channels) + " x " + std::to_string(cfg.height) + " x " + std::to_string(cfg.width)));
        const bool tv = cfg.torchvision_names;
        m_stem = unit(tv ? "conv1." : "0.", tv ? "bn1." : "1.", cfg.in_channels, 64, 7, 2, 3);
        const std::array<int, 4> widths{64, 128, 256, 512};
        int in = 64;
        for (int l = 0; l < 4; ++l) {
            const int out = widths[std::size_t(l)], stride = l == 0 ? 1 : 2;
            for (int j = 0; j < 2; ++j) {
                const std::string p = (tv ? "layer" + std::to_string(1 + l) : std::to_string(4 + l)) + "." + std::to_string(j) + ".";
                Block b;
                const int s = j == 0 ? stride : 1, cin = j == 0 ? in : out;
                b.conv1 = unit(p + "conv1.", p + "bn1.", cin, out, 3, s, 1);
                b.conv2 = unit(p + "conv2.", p + "bn2.", out, out, 3, 1, 1);
                if (s != 1 || cin != out) b.downsample = unit(p + "downsample.0.", p + "downsample.1.", cin, out, 1, s, 0);
                m_blocks.push_back(std::move(b));
            }
            in = out;
        }
        // The rotating activation buffers are as large as forward()'s largest activation, found by a measuring pass.
        WorkspaceMeter<B> meter;
        const WalkResult r = walk(meter, Pass{.batch = 1});
        m_slot_floats = r.largest_activation;
        m_out_h = r.out_h;
        m_out_w = r.out_w;
    }

    const Config& config() const { return m_cfg; }
    int out_h() const { return m_out_h; }
    int out_w() const { return m_out_w; }

    /// Lists every tensor with its state-dict name inside the Sequential (BatchNorm: weight, bias, running_mean,
    /// running_var; GroupNorm: weight, bias). After load(), a BatchNorm variant's conv weights hold the folded values.
    template <class F>
    void visit_parameters(F&& f) {
        auto visit_unit = [&](Unit& u) {
            u.conv.visit_parameters([&](const std::string& n, Parameter<B>& p, const Shape& s, Storage st) { f(u.conv_name + n, p, s, st); });
            u.conv.visit_batch_norm([&](const std::string& n, Parameter<B>& p, const Shape& s, Storage st) { f(u.norm_name + n, p, s, st); });
            if (u.gn) u.gn->visit_parameters([&](const std::string& n, Parameter<B>& p, const Shape& s, Storage st) { f(u.norm_name + n, p, s, st); });
        };
        visit_unit(m_stem);
        for (Block& b : m_blocks) {
            visit_unit(b.conv1);
            visit_unit(b.conv2);
            if (b.downsample) visit_unit(*b.downsample);
        }
    }

    /// Binds every tensor from `file` under `prefix` (e.g. "diffusion.rgb_encoder.backbone."), folding BatchNorms.
    void load(const std::shared_ptr<const io::SafeTensors>& file, const std::string& prefix, const LoadOptions& opts) {
        auto load_unit = [&](Unit& u) {
            u.conv.load(file, prefix + u.conv_name, prefix + u.norm_name, opts, "resnet18");
            if (u.gn) bind_parameters<B>(*u.gn, file, prefix + u.norm_name, opts, "resnet18");
        };
        load_unit(m_stem);
        for (Block& b : m_blocks) {
            load_unit(b.conv1);
            load_unit(b.conv2);
            if (b.downsample) load_unit(*b.downsample);
        }
    }

    /// Number of parameters as in PyTorch (11,176,512 for resnet18 without fc, with either norm).
    std::int64_t n_parameters() const {
        std::int64_t n = 0;
        auto count = [&](const Unit& u) { n += u.conv.n_parameters() + (u.gn ? u.gn->n_parameters() : 0); };
        count(m_stem);
        for (const Block& b : m_blocks) {
            count(b.conv1);
            count(b.conv2);
            if (b.downsample) count(*b.downsample);
        }
        return n;
    }

    /// Multiply-adds of the convolutions for `batch` images (norms, pooling and ReLU are not counted).
    std::int64_t macs(int batch) const {
        WorkspaceMeter<B> meter;
        Pass pass{.batch = batch};
        std::int64_t total = 0;
        pass.macs = &total;
        walk(meter, pass);
        return total;
    }

    /// Scratch bytes forward() takes from the context's workspace for `batch` images; with `tensor_core_scratch`,
    /// also what each convolution's non-F32 MathMode path takes on top (Conv2d::scratch_bytes; 0 on the CPU).
    std::size_t workspace_bytes(int batch, bool tensor_core_scratch = false) const {
        WorkspaceMeter<B> meter;
        walk(meter, Pass{.batch = batch, .conv_scratch = tensor_core_scratch});
        return meter.peak();
    }

    /// y = backbone(x). x: [batch, in_channels, height, width]; y: [batch, 512, out_h(), out_w()] (must not alias x).
    /// Scratch comes from ctx.workspace and is returned on exit.
    void forward(Context<B>& ctx, View<const float, B> x, View<float, B> y) const {
        const int batch = int(x.dim(0));
        check_shape(x, Shape{batch, m_cfg.in_channels, m_cfg.height, m_cfg.width}, "resnet18", "input");
        check_shape(y, Shape{batch, kOutChannels, m_out_h, m_out_w}, "resnet18", "output");
        typename Workspace<B>::Mark mark(*ctx.workspace);
        walk(*ctx.workspace, Pass{.ctx = &ctx, .batch = batch, .x = x.data, .y = y.data});
    }

private:
    /// A convolution and the norm after it: BatchNorm folded into `conv`, or a separate GroupNorm.
    struct Unit {
        Conv2d<B> conv;
        std::optional<GroupNorm<B>> gn;
        std::string conv_name, norm_name;
    };
    struct Block {
        Unit conv1, conv2;
        std::optional<Unit> downsample;
    };
    struct Pass {
        Context<B>* ctx = nullptr;
        int batch = 1;
        const float* x = nullptr;
        float* y = nullptr;
        std::int64_t* macs = nullptr;
        bool conv_scratch = false;  ///< metering: count the convolutions' tensor-core scratch
    };

    struct WalkResult {
        std::int64_t largest_activation = 0;  ///< floats per image of the largest activation held in a rotating buffer
        int out_h = 0, out_w = 0;             ///< the feature map's size
    };

    Unit unit(const std::string& conv_name, const std::string& norm_name, int in, int out, int kernel, int stride, int pad) const {
        Unit u;
        u.conv = Conv2d<B>({.in = in, .out = out, .kernel = kernel, .stride = stride, .pad = pad, .bias = false,
                            .batch_norm = !m_cfg.group_norm});
        if (m_cfg.group_norm) u.gn.emplace(typename GroupNorm<B>::Config{.channels = out, .groups = out / 16, .eps = 1e-5f});
        u.conv_name = conv_name;
        u.norm_name = norm_name;
        return u;
    }

    /// The network as forward() runs it. With a Workspace<B> it runs every op; with a WorkspaceMeter<B> it takes the
    /// same buffers (null views), so the meter's peak is forward()'s workspace need.
    template <class Arena>
    WalkResult walk(Arena& ws, const Pass& pass) const {
        constexpr bool kRun = std::is_same_v<Arena, Workspace<B>>;
        const int batch = pass.batch;
        std::int64_t largest = 0;
        std::array<float*, 4> slot{};
        for (float*& s : slot) s = ws.template take<float>(Shape{batch, m_slot_floats}).data;
        auto in_slot = [&](int k, int c, int h, int w) {
            largest = std::max(largest, std::int64_t(c) * h * w);
            if constexpr (kRun)
                if (!(std::int64_t(c) * h * w <= m_slot_floats)) [[unlikely]]
                    fail(ErrorKind::Internal, "resnet18", "activation larger than its buffer" + expected_got(m_slot_floats, std::int64_t(c) * h * w));
            return View<float, B>{slot[std::size_t(k)], Shape{batch, c, h, w}};
        };
        // conv (+ norm) from `in` into `out`; a GroupNorm variant puts the raw conv output in slot `tmp` first.
        // act / residual: the norm's epilogue (ReLU; or + residual, then ReLU).
        auto run_unit = [&](const Unit& u, View<const float, B> in, View<float, B> out, int tmp, Activation act,
                            const float* residual) {
            const int h = int(in.dim(2)), w = int(in.dim(3));
            if (pass.macs) *pass.macs += u.conv.macs(batch, h, w);
            const int oc = u.conv.config().out, oh = u.conv.out_size(h), ow = u.conv.out_size(w);
            View<float, B> raw = u.gn ? in_slot(tmp, oc, oh, ow) : out;
            if constexpr (!kRun)
                if (pass.conv_scratch) ws.reserve(u.conv.scratch_bytes(batch, h, w));
            if constexpr (kRun) {
                Context<B>& ctx = *pass.ctx;
                if (!u.gn) {
                    u.conv.forward(ctx, in, out, act, residual);
                    return;
                }
                GroupNormEpilogue epi;
                if (residual) {
                    epi.residual = residual;
                    epi.post_act = act;
                } else {
                    epi.act = act;
                }
                // CUDA: the conv and its GroupNorm as one launch where the fused kernel applies (F32 math; at batch 1
                // the encoder's time is its launch count). FLOWEDGE_CUDA_CONV_GN=0 runs the two kernels (A/B).
                if constexpr (requires(const Conv2dGroupNormParams& q) { Ops<B>::conv2d_group_norm(q, Stream{}); }) {
                    static const bool fused = [] {
                        const char* v = std::getenv("FLOWEDGE_CUDA_CONV_GN");
                        return !(v && std::string_view(v) == "0");
                    }();
                    if (fused && ctx.math == MathMode::F32 && !ctx.f32_gemm && !u.conv.config().bias) {
                        Conv2dGroupNormParams q;
                        q.conv = u.conv.geometry(batch, h, w);
                        q.conv.x = in.data;
                        q.conv.w = u.conv.weight_ref();
                        q.conv.y = out.data;
                        q.norm = u.gn->params(batch, oh * ow, epi);
                        if (Ops<B>::conv2d_group_norm(q, ctx.stream)) return;
                    }
                }
                u.conv.forward(ctx, in, raw);
                const Shape flat{batch, oc, std::int64_t(oh) * ow};
                u.gn->forward(ctx, View<const float, B>{raw.data, flat}, View<float, B>{out.data, flat}, epi);
            }
        };

        // Stem: conv 7x7/2 + norm + ReLU into slot 1 (GroupNorm: raw conv in slot 0), then maxpool 3/2/1 into slot 0.
        const Conv2d<B>& c1 = m_stem.conv;
        int h = c1.out_size(m_cfg.height), w = c1.out_size(m_cfg.width);
        View<float, B> stem = in_slot(1, 64, h, w);
        run_unit(m_stem, View<const float, B>{pass.x, Shape{batch, m_cfg.in_channels, m_cfg.height, m_cfg.width}}, stem, 0,
                 Activation::Relu, nullptr);
        const int ph = (h + 2 - 3) / 2 + 1, pw = (w + 2 - 3) / 2 + 1;
        View<float, B> pooled = in_slot(0, 64, ph, pw);
        if constexpr (kRun) {
            MaxPool2dParams mp;
            mp.x = stem.data;
            mp.y = pooled.data;
            mp.batch = batch;
            mp.channels = 64;
            mp.in_h = h;
            mp.in_w = w;
            mp.out_h = ph;
            mp.out_w = pw;
            mp.kernel = 3;
            mp.stride = 2;
            mp.pad = 1;
            Ops<B>::max_pool2d(mp, pass.ctx->stream);
        }
        h = ph;
        w = pw;

        // BasicBlocks. With the input in slot c and the others a, b, d (roles below), the output lands in b:
        //   identity: c, or downsample(c) -> d (GroupNorm raw: a);
        //   conv1(c) -> a, ReLU (GroupNorm raw: d, or b with a downsample);
        //   conv2(a) + identity -> b, ReLU (GroupNorm raw: d, or c with a downsample).
        int c = 0, channels = 64;
        for (std::size_t k = 0; k < m_blocks.size(); ++k) {
            const Block& blk = m_blocks[k];
            std::array<int, 3> free{};
            for (int s = 0, n = 0; s < 4; ++s)
                if (s != c) free[std::size_t(n++)] = s;
            const int a = free[0], b = free[1], d = free[2];
            const View<const float, B> in{slot[std::size_t(c)], Shape{batch, channels, h, w}};
            const int out_c = blk.conv1.conv.config().out;
            const int oh = blk.conv1.conv.out_size(h), ow = blk.conv1.conv.out_size(w);
            const float* identity = in.data;
            if (blk.downsample) {
                View<float, B> ds = in_slot(d, out_c, oh, ow);
                run_unit(*blk.downsample, in, ds, a, Activation::None, nullptr);
                identity = ds.data;
            }
            View<float, B> t = in_slot(a, out_c, oh, ow);
            run_unit(blk.conv1, in, t, blk.downsample ? b : d, Activation::Relu, nullptr);
            const bool last = k + 1 == m_blocks.size();
            View<float, B> out = last ? View<float, B>{pass.y, Shape{batch, out_c, oh, ow}} : in_slot(b, out_c, oh, ow);
            run_unit(blk.conv2, t, out, blk.downsample ? c : d, Activation::Relu, identity);
            c = b;
            channels = out_c;
            h = oh;
            w = ow;
        }
        return WalkResult{largest, h, w};
    }

    Config m_cfg{};
    Unit m_stem;
    std::vector<Block> m_blocks;  ///< layer1.0, layer1.1, ..., layer4.1
    std::int64_t m_slot_floats = 0;  ///< per image: the size of each of the four rotating buffers
    int m_out_h = 0, m_out_w = 0;
};

}  // namespace flowedge
