// The image-side ops of the RGB encoder on every backend vs naive double loops written from the PyTorch / torchvision /
// LeRobot definitions (a non-CPU backend also vs Ops<Cpu>): image_to_tensor (uint8 HWC and float CHW, crop window,
// every NormKind), resize (bilinear, align_corners False, antialias on and off, down- and up-scaling, then the crop
// window), normalize, spatial_softmax and max_pool2d (padding, NaN); and the shared argument checks.
#include "ops_test_util.hpp"

#include <cfloat>

using namespace optest;

namespace {

double ref_norm(NormKind kind, double x, double offset, double denom) {
    switch (kind) {
        case NormKind::MeanStd: return (x - offset) / denom;
        case NormKind::MinMax: return 2 * (x - offset) / denom - 1;
        case NormKind::Identity: break;
    }
    return x;
}

constexpr NormKind kKinds[] = {NormKind::Identity, NormKind::MeanStd, NormKind::MinMax};

/// The CPU result of the same op on host copies, for a non-CPU backend's comparison.
template <class B>
void check_vs_cpu(const std::vector<float>& got, const std::vector<float>& cpu, double rel, double abs, const char* what) {
    if constexpr (!kIsCpu<B>) check_elementwise(got, cpu, rel, abs, std::string(what) + " vs cpu");
}

/// PyTorch's taps of output index i: antialias (triangle filter over support max(scale, 1), normalised) or the two
/// bilinear taps with the source index clamped at 0 and the upper tap at the last pixel. PyTorch computes the scale,
/// the filter center and the bilinear source index in float32 (an error of up to in * 2^-24 pixels, which moves a
/// bilinear output by a few 1e-6), so those three are float here too; the weights and sums are double.
std::vector<std::pair<int, double>> ref_taps(int in, int out, bool antialias, int i) {
    std::vector<std::pair<int, double>> t;
    if (in == out) return {{i, 1.0}};
    const float scale = float(in) / float(out);
    if (antialias) {
        const double support = scale >= 1 ? scale : 1.0, inv = scale >= 1 ? 1 / double(scale) : 1.0;
        const double center = float(double(scale) * (i + 0.5));
        const int xmin = std::max(int(center - support + 0.5), 0), xmax = std::min(int(center + support + 0.5), in);
        double total = 0;
        for (int j = xmin; j < xmax; ++j) {
            const double d = std::fabs((j - center + 0.5) * inv);
            const double w = d < 1 ? 1 - d : 0;
            t.push_back({j, w});
            total += w;
        }
        for (auto& e : t) e.second /= total;
        return t;
    }
    const double real = std::max(scale * (float(i) + 0.5f) - 0.5f, 0.f);
    const int i0 = std::min(int(real), in - 1), i1 = std::min(i0 + 1, in - 1);
    const double l1 = std::min(std::max(real - i0, 0.0), 1.0);
    return {{i0, 1 - l1}, {i1, l1}};
}

}  // namespace

TEST_CASE_TEMPLATE("image_to_tensor: uint8 HWC / 255 and float CHW, crop window, every NormKind per channel", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    struct Case { int batch, channels, height, width, top, left, out_h, out_w; };
    const Case cases[] = {{1, 3, 96, 96, 6, 6, 84, 84}, {2, 3, 7, 9, 1, 2, 5, 6}, {1, 1, 1, 1, 0, 0, 1, 1}, {3, 4, 5, 13, 0, 12, 5, 1}};
    std::uint32_t seed = 7000;
    for (const auto& k : cases)
        for (ImageLayout layout : {ImageLayout::U8Hwc, ImageLayout::F32Chw})
            for (NormKind kind : kKinds) {
                CAPTURE(k.batch); CAPTURE(k.channels); CAPTURE(k.height); CAPTURE(k.width); CAPTURE(k.top); CAPTURE(k.left);
                CAPTURE(int(layout)); CAPTURE(int(kind));
                const std::size_t n = std::size_t(k.batch) * k.channels * k.height * k.width;
                std::mt19937 rng(seed += 10);
                std::vector<std::uint8_t> u8(n);
                for (auto& v : u8) v = std::uint8_t(rng() & 255);
                u8[0] = 0;
                u8[n - 1] = 255;
                const auto f32 = random_vec(n, seed + 1, 0.f, 1.f);
                const auto offset = random_vec(std::size_t(k.channels), seed + 2, -0.2f, 0.6f);
                const auto denom = random_vec(std::size_t(k.channels), seed + 3, 0.1f, 1.5f);
                const std::size_t ny = std::size_t(k.batch) * k.channels * k.out_h * k.out_w;
                std::vector<float> ref(ny);
                for (int b = 0; b < k.batch; ++b)
                    for (int c = 0; c < k.channels; ++c)
                        for (int r = 0; r < k.out_h; ++r)
                            for (int q = 0; q < k.out_w; ++q) {
                                const int h = k.top + r, w = k.left + q;
                                const double v = layout == ImageLayout::U8Hwc
                                                     ? u8[((std::size_t(b) * k.height + h) * k.width + w) * k.channels + c] / 255.0
                                                     : f32[((std::size_t(b) * k.channels + c) * k.height + h) * k.width + w];
                                ref[((std::size_t(b) * k.channels + c) * k.out_h + r) * k.out_w + q] =
                                    float(ref_norm(kind, v, offset[std::size_t(c)], denom[std::size_t(c)]));
                            }
                Dev<std::uint8_t, B> du(u8);
                Dev<float, B> df(f32), doff(offset), dden(denom), dy(ny);
                ImageToTensorParams p;
                p.x = layout == ImageLayout::U8Hwc ? static_cast<const void*>(du.ptr()) : static_cast<const void*>(df.ptr());
                p.layout = layout; p.y = dy.ptr(); p.kind = kind;
                p.offset = kind == NormKind::Identity ? nullptr : doff.ptr();
                p.denom = kind == NormKind::Identity ? nullptr : dden.ptr();
                p.batch = k.batch; p.channels = k.channels; p.height = k.height; p.width = k.width;
                p.top = k.top; p.left = k.left; p.out_h = k.out_h; p.out_w = k.out_w;
                Ops<B>::image_to_tensor(p);
                const auto got = dy.host(ny);
                check_elementwise(got, ref, 1e-6, 1e-6, "image_to_tensor");
                if constexpr (!kIsCpu<B>) {
                    std::vector<float> cpu(ny);
                    p.x = layout == ImageLayout::U8Hwc ? static_cast<const void*>(u8.data()) : static_cast<const void*>(f32.data());
                    p.offset = kind == NormKind::Identity ? nullptr : offset.data();
                    p.denom = kind == NormKind::Identity ? nullptr : denom.data();
                    p.y = cpu.data();
                    Ops<Cpu>::image_to_tensor(p);
                    check_vs_cpu<B>(got, cpu, 1e-6, 1e-6, "image_to_tensor");
                }
            }
}

TEST_CASE_TEMPLATE("resize: bilinear (align_corners False) with and without antialias, down- and up-scaling, crop window", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    struct Case { int planes, in_h, in_w, rh, rw, top, left, out_h, out_w; };
    const Case cases[] = {
        {3, 96, 96, 84, 84, 0, 0, 84, 84},        // LeRobot-style shrink, whole image
        {2, 37, 53, 20, 29, 3, 5, 15, 20},        // odd shrink + crop
        {2, 9, 7, 20, 15, 2, 1, 16, 12},          // upscale + crop
        {1, 12, 40, 30, 10, 0, 0, 30, 10},        // up in height, down (x4) in width
        {2, 16, 16, 16, 9, 4, 0, 8, 9},           // height unchanged (that pass skipped), width shrunk
        {1, 240, 320, 96, 128, 6, 22, 84, 84},    // camera frame -> resize -> center crop
        {1, 5, 5, 1, 1, 0, 0, 1, 1},              // everything into one pixel
        {1, 1, 1, 3, 4, 0, 0, 3, 4},              // one pixel spread out
    };
    std::uint32_t seed = 7500;
    for (const auto& k : cases)
        for (bool aa : {true, false}) {
            CAPTURE(k.planes); CAPTURE(k.in_h); CAPTURE(k.in_w); CAPTURE(k.rh); CAPTURE(k.rw); CAPTURE(k.top);
            CAPTURE(k.left); CAPTURE(k.out_h); CAPTURE(k.out_w); CAPTURE(aa);
            const std::size_t n = std::size_t(k.planes) * k.in_h * k.in_w, ny = std::size_t(k.planes) * k.out_h * k.out_w;
            const auto x = random_vec(n, seed += 10, 0.f, 1.f);
            std::vector<float> ref(ny);
            for (int pl = 0; pl < k.planes; ++pl)
                for (int r = 0; r < k.out_h; ++r) {
                    const auto ty = ref_taps(k.in_h, k.rh, aa, k.top + r);
                    for (int q = 0; q < k.out_w; ++q) {
                        const auto tx = ref_taps(k.in_w, k.rw, aa, k.left + q);
                        double s = 0;
                        for (const auto& [h, wh] : ty)
                            for (const auto& [w, ww] : tx) s += wh * ww * x[(std::size_t(pl) * k.in_h + h) * k.in_w + w];
                        ref[(std::size_t(pl) * k.out_h + r) * k.out_w + q] = float(s);
                    }
                }
            Dev<float, B> dx(x), dy(ny);
            ResizeParams p;
            p.x = dx.ptr(); p.y = dy.ptr(); p.planes = k.planes; p.in_h = k.in_h; p.in_w = k.in_w;
            p.resized_h = k.rh; p.resized_w = k.rw; p.top = k.top; p.left = k.left; p.out_h = k.out_h; p.out_w = k.out_w;
            p.antialias = aa;
            Ops<B>::resize(p);
            const auto got = dy.host(ny);
            // Convex weights on [0, 1] pixels: float rounding of the weights and sums stays far below 1e-5.
            check_elementwise(got, ref, 0, 2e-6, "resize");
            if constexpr (!kIsCpu<B>) {
                std::vector<float> cpu(ny);
                p.x = x.data(); p.y = cpu.data();
                Ops<Cpu>::resize(p);
                check_vs_cpu<B>(got, cpu, 0, 2e-6, "resize");
            }
        }
}

TEST_CASE_TEMPLATE("normalize: MeanStd, MinMax and Identity per column, out of place and in place", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    std::uint32_t seed = 7800;
    for (auto [rows, dim] : {std::pair{1, 1}, std::pair{3, 2}, std::pair{2, 37}, std::pair{5, 10}})
        for (NormKind kind : kKinds) {
            CAPTURE(rows); CAPTURE(dim); CAPTURE(int(kind));
            const std::size_t n = std::size_t(rows) * dim;
            const auto x = random_vec(n, seed += 10, -5.f, 5.f);
            const auto offset = random_vec(std::size_t(dim), seed + 1, -1.f, 1.f);
            const auto denom = random_vec(std::size_t(dim), seed + 2, 0.2f, 3.f);
            std::vector<float> ref(n);
            for (int r = 0; r < rows; ++r)
                for (int d = 0; d < dim; ++d) {
                    const std::size_t i = std::size_t(r) * dim + d;
                    ref[i] = float(ref_norm(kind, x[i], offset[std::size_t(d)], denom[std::size_t(d)]));
                }
            Dev<float, B> dx(x), doff(offset), dden(denom), dy(n);
            NormalizeParams p;
            p.x = dx.ptr(); p.y = dy.ptr(); p.rows = rows; p.dim = dim; p.kind = kind;
            p.offset = kind == NormKind::Identity ? nullptr : doff.ptr();
            p.denom = kind == NormKind::Identity ? nullptr : dden.ptr();
            Ops<B>::normalize(p);
            check_elementwise(dy.host(n), ref, 1e-6, 1e-6, "normalize");
            p.y = dx.ptr();  // in place
            Ops<B>::normalize(p);
            check_elementwise(dx.host(n), ref, 1e-6, 1e-6, "normalize in place");
        }
}

TEST_CASE_TEMPLATE("spatial_softmax: softmax over the positions, expected pos_grid coordinates; NaN rows stay NaN", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    std::uint32_t seed = 8000;
    for (auto [rows, positions] : {std::pair{32, 9}, std::pair{5, 77}, std::pair{1, 1}, std::pair{3, 441}}) {
        CAPTURE(rows); CAPTURE(positions);
        auto x = random_vec(std::size_t(rows) * positions, seed += 10, -8.f, 8.f);
        x[0] += 60.f;  // a large logit: the max subtraction must keep exp finite
        const auto grid = random_vec(std::size_t(positions) * 2, seed + 1, -1.f, 1.f);
        std::vector<float> ref(std::size_t(rows) * 2);
        for (int r = 0; r < rows; ++r) {
            const float* xr = x.data() + std::size_t(r) * positions;
            double m = -INFINITY;
            for (int i = 0; i < positions; ++i) m = std::max(m, double(xr[i]));
            double sum = 0, sx = 0, sy = 0;
            for (int i = 0; i < positions; ++i) {
                const double e = std::exp(xr[i] - m);
                sum += e;
                sx += e * grid[2 * std::size_t(i)];
                sy += e * grid[2 * std::size_t(i) + 1];
            }
            ref[2 * std::size_t(r)] = float(sx / sum);
            ref[2 * std::size_t(r) + 1] = float(sy / sum);
        }
        Dev<float, B> dx(x), dg(grid), dy(std::size_t(rows) * 2);
        SpatialSoftmaxParams p;
        p.x = dx.ptr(); p.pos_grid = dg.ptr(); p.y = dy.ptr(); p.rows = rows; p.positions = positions;
        Ops<B>::spatial_softmax(p);
        check_elementwise(dy.host(std::size_t(rows) * 2), ref, 1e-5, 2e-6, "spatial_softmax");
    }
    // A NaN logit makes its row's softmax, and so both coordinates, NaN (torch.softmax); other rows are untouched.
    std::vector<float> x = random_vec(2 * 9, 8100u);
    x[4] = NAN;
    const auto grid = random_vec(18, 8101u);
    Dev<float, B> dx(x), dg(grid), dy(std::size_t(4));
    Ops<B>::spatial_softmax({dx.ptr(), dg.ptr(), dy.ptr(), 2, 9});
    const auto y = dy.host(4);
    CHECK(std::isnan(y[0]));
    CHECK(std::isnan(y[1]));
    CHECK(std::isfinite(y[2]));
    CHECK(std::isfinite(y[3]));
}

TEST_CASE_TEMPLATE("max_pool2d: windows clipped by padding, strides, NaN propagating as in PyTorch", B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    struct Case { int batch, channels, in_h, in_w, kernel, stride, pad; };
    const Case cases[] = {
        {1, 64, 42, 42, 3, 2, 1},  // the ResNet18 stem: 42x42 -> 21x21
        {2, 3, 5, 7, 2, 2, 0},
        {1, 2, 9, 4, 3, 1, 1},
        {2, 1, 11, 13, 4, 3, 2},
        {1, 1, 1, 1, 1, 1, 0},
        {1, 3, 6, 6, 5, 1, 2},
    };
    std::uint32_t seed = 8200;
    for (const auto& k : cases) {
        CAPTURE(k.batch); CAPTURE(k.channels); CAPTURE(k.in_h); CAPTURE(k.in_w); CAPTURE(k.kernel); CAPTURE(k.stride); CAPTURE(k.pad);
        const int oh = (k.in_h + 2 * k.pad - k.kernel) / k.stride + 1, ow = (k.in_w + 2 * k.pad - k.kernel) / k.stride + 1;
        const std::size_t n = std::size_t(k.batch) * k.channels * k.in_h * k.in_w, ny = std::size_t(k.batch) * k.channels * oh * ow;
        auto x = random_vec(n, seed += 10, -3.f, -1.f);  // all negative: a zero from the padding would win if counted
        for (std::size_t i = 5; i < n; i += 97) x[i] = NAN;
        if (n > 2) x[n - 2] = -INFINITY;
        std::vector<float> ref(ny);
        for (std::size_t pl = 0; pl < std::size_t(k.batch) * k.channels; ++pl)
            for (int r = 0; r < oh; ++r)
                for (int q = 0; q < ow; ++q) {
                    double m = -INFINITY;
                    bool nan = false;
                    for (int u = 0; u < k.kernel; ++u)
                        for (int v = 0; v < k.kernel; ++v) {
                            const int h = r * k.stride - k.pad + u, w = q * k.stride - k.pad + v;
                            if (h < 0 || h >= k.in_h || w < 0 || w >= k.in_w) continue;
                            const float e = x[(pl * k.in_h + h) * k.in_w + w];
                            nan |= std::isnan(e);
                            m = std::max(m, double(e));
                        }
                    ref[(pl * oh + r) * ow + q] = nan ? NAN : float(m);
                }
        Dev<float, B> dx(x), dy(ny);
        MaxPool2dParams p;
        p.x = dx.ptr(); p.y = dy.ptr(); p.batch = k.batch; p.channels = k.channels; p.in_h = k.in_h; p.in_w = k.in_w;
        p.out_h = oh; p.out_w = ow; p.kernel = k.kernel; p.stride = k.stride; p.pad = k.pad;
        Ops<B>::max_pool2d(p);
        const auto got = dy.host(ny);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < ny; ++i)
            bad += std::isnan(ref[i]) ? !std::isnan(got[i]) : !(got[i] == ref[i]);
        CHECK(bad == 0);
    }
}

TEST_CASE_TEMPLATE("image ops reject bad sizes, windows and null pointers with the shared message" * doctest::test_suite("op_checks"),
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    Dev<float, B> d(std::size_t(256)), e(std::size_t(256));
    MaxPool2dParams mp;
    mp.x = d.ptr(); mp.y = e.ptr(); mp.channels = 1; mp.in_h = 4; mp.in_w = 4; mp.out_h = 2; mp.out_w = 2; mp.kernel = 3; mp.stride = 2;
    mp.pad = 2;
    CHECK_THROWS_WITH_AS(Ops<B>::max_pool2d(mp), doctest::Contains("flowedge: max_pool2d: padding wider than half the kernel"), Error);
    ResizeParams rp;
    rp.x = d.ptr(); rp.y = e.ptr(); rp.planes = 1; rp.in_h = 4; rp.in_w = 4; rp.resized_h = 3; rp.resized_w = 3;
    rp.top = 1; rp.left = 0; rp.out_h = 3; rp.out_w = 3;
    CHECK_THROWS_WITH_AS(Ops<B>::resize(rp), doctest::Contains("flowedge: resize: window outside the resized image"), Error);
    ImageToTensorParams ip;
    ip.x = d.ptr(); ip.y = e.ptr(); ip.kind = NormKind::MeanStd; ip.height = 4; ip.width = 4; ip.out_h = 4; ip.out_w = 4;
    CHECK_THROWS_WITH_AS(Ops<B>::image_to_tensor(ip), doctest::Contains("flowedge: image_to_tensor: null x, y, offset or denom pointer"), Error);
    NormalizeParams np;
    np.x = d.ptr(); np.y = e.ptr(); np.rows = 1; np.dim = 0;
    CHECK_THROWS_WITH_AS(Ops<B>::normalize(np), doctest::Contains("flowedge: normalize: sizes must be positive"), Error);
    SpatialSoftmaxParams sp;
    sp.x = d.ptr(); sp.y = e.ptr(); sp.rows = 1; sp.positions = 4;
    CHECK_THROWS_WITH_AS(Ops<B>::spatial_softmax(sp), doctest::Contains("flowedge: spatial_softmax: null x, pos_grid or y pointer"), Error);
}
