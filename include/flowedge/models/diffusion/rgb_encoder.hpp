// LeRobot's DiffusionRgbEncoder (camera frame -> keypoint features for the Diffusion Policy condition) over Ops<B>:
// image normalisation, resize and center crop, ResNet18 backbone, SpatialSoftmax keypoints and the output Linear+ReLU.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "flowedge/io/safetensors.hpp"
#include "flowedge/layers/conv2d.hpp"
#include "flowedge/layers/linear.hpp"
#include "flowedge/layers/resnet.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// torchvision CenterCrop's offset of a `crop`-long window in a `size`-long axis: int(round((size - crop) / 2.0)) with
/// Python's round-half-to-even (size 25, crop 20 -> 2; size 27, crop 20 -> 4).
inline int center_crop_offset(int size, int crop) {
    const int d = size - crop, half = d / 2;
    return (d % 2 != 0 && half % 2 != 0) ? half + 1 : half;
}

/// The DiffusionRgbEncoder settings of a LeRobot DiffusionConfig, for frames of image_h x image_w (the policy's
/// input image feature shape [channels, image_h, image_w]). 0 in resize/crop means none.
struct DiffusionRgbEncoderConfig {
    int channels = 3;
    int image_h = 0, image_w = 0;
    int resize_h = 0, resize_w = 0;  ///< resize_shape (torchvision Resize, bilinear, antialias)
    int crop_h = 0, crop_w = 0;      ///< crop_shape (CenterCrop in eval), after the resize when there is one
    bool group_norm = false;         ///< use_group_norm: GroupNorm(C/16, C) instead of BatchNorm in the backbone
    int keypoints = 32;              ///< spatial_softmax_num_keypoints
    std::string vision_backbone = "resnet18";

    /// Rows and columns entering the backbone: the crop, else the resize, else the frame.
    int input_h() const { return crop_h > 0 ? crop_h : resize_h > 0 ? resize_h : image_h; }
    int input_w() const { return crop_w > 0 ? crop_w : resize_w > 0 ? resize_w : image_w; }
    /// Rows and columns the crop window is cut from (the resized image, else the frame).
    int cropped_from_h() const { return resize_h > 0 ? resize_h : image_h; }
    int cropped_from_w() const { return resize_w > 0 ? resize_w : image_w; }

    /// Throws flowedge::Error naming the first invalid LeRobot field.
    void validate(std::string_view component = "rgb_encoder") const {
        auto need = [&](bool ok, ErrorKind kind, const std::string& what, const std::string& expected, const std::string& got) {
            if (!ok) fail(kind, component, what + expected_got(expected, got));
        };
        auto pair = [](int a, int b) { return "(" + std::to_string(a) + ", " + std::to_string(b) + ")"; };
        constexpr int kMaxSide = 1 << 14;
        need(vision_backbone == "resnet18", ErrorKind::Unsupported, "unsupported vision_backbone", "resnet18", vision_backbone);
        need(channels >= 1 && channels <= 64, ErrorKind::BadFile, "invalid image channels", "1..64", std::to_string(channels));
        need(image_h >= 1 && image_w >= 1 && image_h <= kMaxSide && image_w <= kMaxSide, ErrorKind::BadFile,
             "invalid image shape (height, width)", "1.." + std::to_string(kMaxSide), pair(image_h, image_w));
        need((resize_h == 0 && resize_w == 0) || (resize_h >= 1 && resize_w >= 1 && resize_h <= kMaxSide && resize_w <= kMaxSide),
             ErrorKind::BadFile, "resize_shape must be a pair of positive integers", "none or 1.." + std::to_string(kMaxSide), pair(resize_h, resize_w));
        need((crop_h == 0 && crop_w == 0) || (crop_h >= 1 && crop_w >= 1), ErrorKind::BadFile,
             "crop_shape must have positive dimensions", "none or > 0", pair(crop_h, crop_w));
        need(crop_h <= cropped_from_h() && crop_w <= cropped_from_w(), ErrorKind::BadFile,
             std::string("crop_shape should fit within the ") + (resize_h > 0 ? "resize_shape" : "image shape"),
             "<= " + pair(cropped_from_h(), cropped_from_w()), pair(crop_h, crop_w));
        need(keypoints >= 1 && keypoints <= (1 << 16), ErrorKind::BadFile, "invalid spatial_softmax_num_keypoints", "1..65536",
             std::to_string(keypoints));
    }
};

namespace rgb_encoder_detail {
[[noreturn]] inline void config_fail(const std::string& what, ErrorKind kind = ErrorKind::BadFile) { fail(kind, "lerobot", what); }
inline const nlohmann::json* find_field(const nlohmann::json& j, const char* name) {
    auto it = j.find(name);
    return it == j.end() ? nullptr : &*it;
}
inline const nlohmann::json& required_field(const nlohmann::json& j, const char* name) {
    const nlohmann::json* v = find_field(j, name);
    if (!v) config_fail("config.json: missing field '" + std::string(name) + "'");
    return *v;
}
inline int to_int(const nlohmann::json& v, const std::string& name) {
    if (!v.is_number_integer() || v.get<std::int64_t>() < -(1LL << 30) || v.get<std::int64_t>() > (1LL << 30))
        config_fail("config.json: field '" + name + "' must be an integer" + expected_got("integer", v.dump()));
    return int(v.get<std::int64_t>());
}
/// A (height, width) field: null/absent -> (0, 0), else a list of two integers.
inline std::pair<int, int> shape_field(const nlohmann::json& j, const char* name) {
    const nlohmann::json* v = find_field(j, name);
    if (!v || v->is_null()) return {0, 0};
    if (!v->is_array() || v->size() != 2)
        config_fail("config.json: field '" + std::string(name) + "' must be null or [height, width]" + expected_got("2 integers", v->dump()));
    return {to_int((*v)[0], name), to_int((*v)[1], name)};
}
}  // namespace rgb_encoder_detail

/// Reads the DiffusionRgbEncoder fields of a LeRobot config.json (vision_backbone, resize_shape, crop_ratio,
/// crop_shape, use_group_norm, spatial_softmax_num_keypoints) for frames of image_h x image_w, deriving the crop as
/// LeRobot 0.6's DiffusionConfig does: with a resize_shape, crop = int(resize * crop_ratio) when crop_ratio < 1, else
/// none (crop_shape is then ignored); without one (and in 0.4.x configs, which have neither resize_shape nor
/// crop_ratio), crop_shape as given. pretrained_backbone_weights is ignored: the checkpoint holds the weights.
/// Validated; errors name the field.
inline DiffusionRgbEncoderConfig rgb_encoder_config_from_lerobot(const nlohmann::json& config, int image_h, int image_w,
                                                                 int channels = 3) {
    using namespace rgb_encoder_detail;
    if (!config.is_object()) config_fail("config.json: expected an object" + expected_got("object", std::string(config.type_name())));
    DiffusionRgbEncoderConfig c;
    c.channels = channels;
    c.image_h = image_h;
    c.image_w = image_w;
    const nlohmann::json& backbone = required_field(config, "vision_backbone");
    if (!backbone.is_string()) config_fail("config.json: field 'vision_backbone' must be a string" + expected_got("string", backbone.dump()));
    c.vision_backbone = backbone.get<std::string>();
    std::tie(c.resize_h, c.resize_w) = shape_field(config, "resize_shape");
    double crop_ratio = 1.0;
    if (const nlohmann::json* r = find_field(config, "crop_ratio"); r && !r->is_null()) {
        if (!r->is_number()) config_fail("config.json: field 'crop_ratio' must be a number" + expected_got("number", r->dump()));
        crop_ratio = r->get<double>();
    }
    if (!(crop_ratio > 0.0 && crop_ratio <= 1.0))
        config_fail("config.json: crop_ratio must be in (0, 1]" + expected_got("0 < crop_ratio <= 1", std::to_string(crop_ratio)));
    required_field(config, "crop_shape");
    if (c.resize_h > 0 || c.resize_w > 0) {
        if (crop_ratio < 1.0) {
            c.crop_h = int(double(c.resize_h) * crop_ratio);
            c.crop_w = int(double(c.resize_w) * crop_ratio);
        }
    } else {
        std::tie(c.crop_h, c.crop_w) = shape_field(config, "crop_shape");
    }
    const nlohmann::json& gn = required_field(config, "use_group_norm");
    if (!gn.is_boolean()) config_fail("config.json: field 'use_group_norm' must be a boolean" + expected_got("boolean", gn.dump()));
    c.group_norm = gn.get<bool>();
    c.keypoints = to_int(required_field(config, "spatial_softmax_num_keypoints"), "spatial_softmax_num_keypoints");
    c.validate("lerobot");
    return c;
}

/// LeRobot DiffusionRgbEncoder in eval mode on n camera frames:
///   normalise (the processor's per-channel image statistics) -> [Resize(resize_shape)] -> [CenterCrop(crop_shape)]
///   -> ResNet18 backbone [n, 512, fh, fw] -> SpatialSoftmax(num_kp = K): 1x1 conv `pool.nets` [n, K, fh, fw],
///   softmax over the fh*fw positions, expected (x, y) under `pool.pos_grid` [fh*fw, 2] -> flatten [n, 2K]
///   -> ReLU(Linear(2K, 2K) `out`) = features [n, feature_dim()].
/// Parameter names are those under "diffusion.rgb_encoder." (or "diffusion.rgb_encoder.<camera>." with one encoder
/// per camera) in LeRobot's state dict. Weights, normalisation statistics and buffers are allocated at load;
/// forward() takes its scratch from the context's workspace (workspace_bytes) and never allocates.
template <Backend B>
class DiffusionRgbEncoder {
public:
    using Config = DiffusionRgbEncoderConfig;

    explicit DiffusionRgbEncoder(Config cfg) : m_cfg((cfg.validate(), cfg)) {
        m_backbone = ResNet18Backbone<B>({.in_channels = cfg.channels, .height = cfg.input_h(), .width = cfg.input_w(), .group_norm = cfg.group_norm});
        m_keypoint_conv = Conv2d<B>({.in = ResNet18Backbone<B>::kOutChannels, .out = cfg.keypoints, .kernel = 1, .bias = true});
        m_out = Linear<B>({.in = 2 * cfg.keypoints, .out = 2 * cfg.keypoints});
        m_offset = Buffer<float, B>(std::size_t(cfg.channels));
        m_denom = Buffer<float, B>(std::size_t(cfg.channels));
        Memory<B>::fill_zero(m_offset.data(), m_offset.bytes());
        Memory<B>::fill_zero(m_denom.data(), m_denom.bytes());
    }

    const Config& config() const { return m_cfg; }
    /// Width of one frame's features: 2 * keypoints.
    int feature_dim() const { return 2 * m_cfg.keypoints; }
    /// The backbone's feature map size (fh, fw).
    int feature_map_h() const { return m_backbone.out_h(); }
    int feature_map_w() const { return m_backbone.out_w(); }

    /// Lists every tensor with its name under the encoder's prefix: "backbone.0.weight", "backbone.1.running_mean",
    /// "backbone.4.0.conv1.weight", ..., "pool.nets.weight", "pool.nets.bias", "pool.pos_grid", "out.weight",
    /// "out.bias" (BatchNorm's num_batches_tracked is not used). With BatchNorm, the backbone's conv weights hold the
    /// folded values after load().
    template <class F>
    void visit_parameters(F&& f) {
        m_backbone.visit_parameters([&](const std::string& n, Parameter<B>& p, const Shape& s, Storage st) { f("backbone." + n, p, s, st); });
        m_keypoint_conv.visit_parameters([&](const std::string& n, Parameter<B>& p, const Shape& s, Storage st) { f("pool.nets." + n, p, s, st); });
        f("pool.pos_grid", m_pos_grid, pos_grid_shape(), Storage::Vector);
        m_out.visit_parameters([&](const std::string& n, Parameter<B>& p, const Shape& s, Storage st) { f("out." + n, p, s, st); });
    }

    /// Binds every tensor from `file` under `prefix` ("diffusion.rgb_encoder." or "diffusion.rgb_encoder.<N>."),
    /// folding the backbone's BatchNorms. A missing key or a wrong shape (including a pos_grid that does not match the
    /// feature map) is an error naming the key and the expected shape.
    void load(const std::shared_ptr<const io::SafeTensors>& file, const std::string& prefix, const LoadOptions& opts) {
        m_backbone.load(file, prefix + "backbone.", opts);
        m_keypoint_conv.load(file, prefix + "pool.nets.", "", opts, "rgb_encoder");
        const std::string grid_key = prefix + "pool.pos_grid";
        m_pos_grid.load(require_tensor(*file, grid_key, pos_grid_shape(), "rgb_encoder"), pos_grid_shape(), Storage::Vector, opts, file,
                        "rgb_encoder");
        bind_parameters<B>(m_out, file, prefix + "out.", opts, "rgb_encoder");
    }

    /// Per-channel image normalisation applied before everything else (LeRobot's NormalizerProcessorStep on the image
    /// feature; see NormalizeParams for offset/denom): `channels` floats each, host pointers, uploaded to B. Identity
    /// (the default) ignores them.
    void set_normalization(NormKind kind, const float* offset_host, const float* denom_host) {
        check(kind == NormKind::Identity || kind == NormKind::MeanStd || kind == NormKind::MinMax, "rgb_encoder",
              "unknown normalisation kind" + expected_got("Identity, MeanStd or MinMax", int(kind)));
        if (kind != NormKind::Identity) {
            check(offset_host && denom_host, "rgb_encoder", "null normalisation statistics");
            Memory<B>::copy_from_host(m_offset.data(), offset_host, m_offset.bytes());
            Memory<B>::copy_from_host(m_denom.data(), denom_host, m_denom.bytes());
            Memory<B>::synchronize();
        }
        m_norm = kind;
    }

    /// Scratch bytes forward() takes from the context's workspace for up to `max_frames` frames.
    std::size_t workspace_bytes(int max_frames) const {
        check(max_frames >= 1, "rgb_encoder", "max_frames must be positive" + expected_got(">= 1", max_frames));
        WorkspaceMeter<B> meter;
        walk(meter, Pass{.n = max_frames});
        return meter.peak();
    }

    /// features = encoder(frames). frames: n_frames camera frames of image_h x image_w resident on B, laid out as
    /// `layout` (uint8 [n, H, W, C] or float [n, C, H, W] in [0, 1]); features: [n_frames, feature_dim()].
    void forward(Context<B>& ctx, const void* frames, ImageLayout layout, int n_frames, View<float, B> features) const {
        if (!(n_frames >= 1)) [[unlikely]] fail(ErrorKind::BadShape, "rgb_encoder", "frame count must be positive" + expected_got(">= 1", n_frames));
        if (!frames) [[unlikely]] fail(ErrorKind::BadInput, "rgb_encoder", "null frames pointer");
        if (!ctx.workspace) [[unlikely]] fail(ErrorKind::BadInput, "rgb_encoder", "the context has no workspace (size it with workspace_bytes)");
        check_shape(features, Shape{n_frames, feature_dim()}, "rgb_encoder", "features");
        typename Workspace<B>::Mark mark(*ctx.workspace);
        walk(*ctx.workspace, Pass{.ctx = &ctx, .n = n_frames, .frames = frames, .layout = layout, .features = features.data});
    }

    /// Number of parameters as in PyTorch (running statistics and pos_grid are buffers, not counted).
    std::int64_t n_parameters() const {
        return m_backbone.n_parameters() + m_keypoint_conv.n_parameters() + m_out.n_parameters();
    }
    /// Bytes held on B: the loaded parameters (convolutions with BatchNorm folded, pos_grid, out) and the
    /// [channels] normalisation statistics. Encoders sharing one checkpoint's tensors each count them.
    std::size_t device_bytes() {
        std::size_t n = m_offset.bytes() + m_denom.bytes();
        visit_parameters([&](const std::string&, Parameter<B>& p, const Shape&, Storage) { n += p.loaded() ? p.bytes() : 0; });
        return n;
    }
    /// Multiply-adds of one forward() over `n` frames (convolutions and the output Linear; the resize, norms,
    /// pooling and softmax are not counted).
    std::int64_t macs(int n) const {
        return m_backbone.macs(n) + m_keypoint_conv.macs(n, feature_map_h(), feature_map_w()) +
               std::int64_t(n) * feature_dim() * feature_dim();
    }

private:
    struct Pass {
        Context<B>* ctx = nullptr;
        int n = 1;
        const void* frames = nullptr;
        ImageLayout layout = ImageLayout::U8Hwc;
        float* features = nullptr;
    };

    Shape pos_grid_shape() const { return Shape{std::int64_t(m_backbone.out_h()) * m_backbone.out_w(), 2}; }

    /// forward() step by step. With a Workspace<B> it runs every op; with a WorkspaceMeter<B> it takes the same
    /// buffers (null views) and reserves the backbone's scratch, so the meter's peak is forward()'s workspace need.
    template <class Arena>
    void walk(Arena& ws, const Pass& pass) const {
        constexpr bool kRun = std::is_same_v<Arena, Workspace<B>>;
        const Config& c = m_cfg;
        const int n = pass.n, C = c.channels, K = c.keypoints, fh = feature_map_h(), fw = feature_map_w();
        const bool crop = c.crop_h > 0;
        const int top = crop ? center_crop_offset(c.cropped_from_h(), c.crop_h) : 0;
        const int left = crop ? center_crop_offset(c.cropped_from_w(), c.crop_w) : 0;

        // Frames -> normalised float [n, C, input_h, input_w]: with a resize, the whole frame is normalised and then
        // resized with the crop window cut from the result; without, the crop window is cut while normalising.
        View<float, B> image = ws.template take<float>(Shape{n, C, c.input_h(), c.input_w()});
        {
            typename Arena::Mark frame_mark(ws);
            const bool resize = c.resize_h > 0;
            View<float, B> full = resize ? ws.template take<float>(Shape{n, C, c.image_h, c.image_w}) : image;
            if constexpr (kRun) {
                ImageToTensorParams it;
                it.x = pass.frames;
                it.layout = pass.layout;
                it.y = full.data;
                it.offset = m_offset.data();
                it.denom = m_denom.data();
                it.kind = m_norm;
                it.batch = n;
                it.channels = C;
                it.height = c.image_h;
                it.width = c.image_w;
                it.top = resize ? 0 : top;
                it.left = resize ? 0 : left;
                it.out_h = resize ? c.image_h : c.input_h();
                it.out_w = resize ? c.image_w : c.input_w();
                Ops<B>::image_to_tensor(it, pass.ctx->stream);
                if (resize) {
                    ResizeParams rp;
                    rp.x = full.data;
                    rp.y = image.data;
                    rp.planes = n * C;
                    rp.in_h = c.image_h;
                    rp.in_w = c.image_w;
                    rp.resized_h = c.resize_h;
                    rp.resized_w = c.resize_w;
                    rp.top = top;
                    rp.left = left;
                    rp.out_h = c.input_h();
                    rp.out_w = c.input_w();
                    rp.antialias = true;
                    Ops<B>::resize(rp, pass.ctx->stream);
                }
            }
        }

        // Backbone, keypoint logits, spatial softmax, output layer.
        View<float, B> fmap = ws.template take<float>(Shape{n, ResNet18Backbone<B>::kOutChannels, fh, fw});
        if constexpr (kRun) m_backbone.forward(*pass.ctx, image, fmap);
        else ws.reserve(m_backbone.workspace_bytes(n));
        View<float, B> logits = ws.template take<float>(Shape{n, K, fh, fw});
        View<float, B> keypoints = ws.template take<float>(Shape{n, 2 * K});
        if constexpr (kRun) {
            Context<B>& ctx = *pass.ctx;
            m_keypoint_conv.forward(ctx, fmap, logits);
            SpatialSoftmaxParams sp;
            sp.x = logits.data;
            sp.pos_grid = m_pos_grid.f32();
            sp.y = keypoints.data;
            sp.rows = n * K;
            sp.positions = fh * fw;
            Ops<B>::spatial_softmax(sp, ctx.stream);
            m_out.forward(ctx, keypoints.data, pass.features, n, Activation::Relu);
        }
    }

    Config m_cfg;
    ResNet18Backbone<B> m_backbone;
    Conv2d<B> m_keypoint_conv;  ///< pool.nets: Conv2d(512, K, 1)
    Parameter<B> m_pos_grid;    ///< pool.pos_grid [fh*fw, 2]: (x, y) in [-1, 1] of each feature-map position
    Linear<B> m_out;            ///< out: Linear(2K, 2K), followed by ReLU
    NormKind m_norm = NormKind::Identity;
    Buffer<float, B> m_offset, m_denom;  ///< [channels] normalisation statistics on B
};

}  // namespace flowedge
