// conv2d on every backend vs a naive double-accumulating loop written from torch.nn.Conv2d (zero padding, stride,
// every weight dtype, bias and residual on and off, every activation after them), a non-CPU backend also vs Ops<Cpu>;
// the ResNet18 encoder's shapes at an 84x84 crop plus odd sizes that leave partial tiles and row blocks; the CPU's
// packed weights (Storage::Conv2dWeight) on the same shapes and on the edges of their cutting; and the shared
// argument checks.
#include <cstring>
#include <optional>

#include "cpu_packed_util.hpp"
#ifdef FLOWEDGE_WITH_CUDA
#include "flowedge/cuda/device.hpp"
#endif

using namespace optest;

namespace {

struct Conv2dCase {
    int batch, cin, cout, in_h, in_w, kh, kw, sh, sw, ph, pw;
};

/// Tolerance (times sum |terms|) of Ops<B>::conv2d at `math` for a reduction of kg terms: exact kernels 2e-6; the
/// CUDA tensor-core path (conv2d_gemm.cu's bound) TF32 for F32 weights (x rounded nearest 2^-11, weights by the
/// library 2^-10, float accumulation kg 2^-24, epilogue adds 2^-23), BF16 for BF16 weights under BF16 math.
template <class B>
double conv2d_tolerance(MathMode math, DType dt, int kg, bool tensor_cores) {
    if (!tensor_cores || math == MathMode::F32) return 2e-6;
    const double accumulate = double(kg) * 0x1p-24 + 0x1p-23;
    if (dt == DType::F32) return 0x1p-10 + 0x1p-11 + accumulate;
    return 0x1p-8 + accumulate;  // BF16 weights under BF16 math (the only other pair the GEMM takes)
}

/// Per output of a 3x3 stride-1 conv, the magnitude Winograd F(2x2, 3x3)'s rounding scales with (docs/numerics.md):
///   W = act slope * (sum_i sum_{a,b} |A^T[r][a]| |A^T[c][b]| (|G| |g_i| |G|^T)[a][b] (|B^T| |d_i| |B|)[a][b]
///       + |bias| + |residual|),
/// d_i the 4x4 input patch (zero outside the image) of the output's 2x2 tile, (r, c) its place in the tile.
std::vector<double> winograd_scale(const Conv2dCase& k, const std::vector<float>& x, const HostWeights& w, const float* bias,
                                   const float* res, Activation act) {
    static constexpr double At[2][4] = {{1, 1, 1, 0}, {0, 1, 1, 1}};  // |A^T|
    static constexpr double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, 0.5, 0.5}, {0, 0, 1}};  // |G|
    static constexpr double Bt[4][4] = {{1, 0, 1, 0}, {0, 1, 1, 0}, {0, 1, 1, 0}, {0, 1, 0, 1}};  // |B^T|
    // K[r][c][u * 3 + v][p * 4 + q]: the coefficient of |g_uv| |d_pq| in W.
    static const auto K = [] {
        std::vector<double> t(2 * 2 * 9 * 16, 0.0);
        for (int r = 0; r < 2; ++r)
            for (int c = 0; c < 2; ++c)
                for (int a = 0; a < 4; ++a)
                    for (int b = 0; b < 4; ++b)
                        for (int u = 0; u < 3; ++u)
                            for (int v = 0; v < 3; ++v)
                                for (int pp = 0; pp < 4; ++pp)
                                    for (int q = 0; q < 4; ++q)
                                        t[((r * 2 + c) * 9 + u * 3 + v) * 16 + pp * 4 + q] +=
                                            At[r][a] * At[c][b] * G[a][u] * G[b][v] * Bt[a][pp] * Bt[b][q];
        return t;
    }();
    const int oh = k.in_h + 2 * k.ph - 2, ow = k.in_w + 2 * k.pw - 2;
    std::vector<double> W(std::size_t(k.batch) * k.cout * oh * ow);
    double d[16];
    for (int b = 0; b < k.batch; ++b)
        for (int o = 0; o < k.cout; ++o)
            for (int r = 0; r < oh; ++r)
                for (int c = 0; c < ow; ++c) {
                    const std::size_t idx = ((std::size_t(b) * k.cout + o) * oh + r) * ow + c;
                    const double* kk = K.data() + std::size_t((r % 2) * 2 + c % 2) * 9 * 16;
                    double s = (bias ? std::fabs(bias[o]) : 0.0) + (res ? std::fabs(res[idx]) : 0.0);
                    for (int i = 0; i < k.cin; ++i) {
                        for (int pp = 0; pp < 4; ++pp)
                            for (int q = 0; q < 4; ++q) {
                                const int ih = r / 2 * 2 - k.ph + pp, iw = c / 2 * 2 - k.pw + q;
                                d[pp * 4 + q] = ih < 0 || ih >= k.in_h || iw < 0 || iw >= k.in_w
                                                    ? 0.0
                                                    : std::fabs(x[((std::size_t(b) * k.cin + i) * k.in_h + ih) * k.in_w + iw]);
                            }
                        for (int uv = 0; uv < 9; ++uv) {
                            const double g = std::fabs(w.value[(std::size_t(o) * k.cin + i) * 9 + uv]);
                            double t = 0;
                            for (int j = 0; j < 16; ++j) t += kk[uv * 16 + j] * d[j];
                            s += g * t;
                        }
                    }
                    W[idx] = s * act_slope(act);
                }
    return W;
}

#if defined(FLOWEDGE_CPU_X86)
/// Whether the Winograd plan of kernel set isa (AVX-512 or AVX2) takes p (any_size: past the size rule).
bool winograd_plan_ok(cpu::Isa isa, const Conv2dParams& p, bool any_size = false) {
    return isa == cpu::Isa::Avx512 ? cpu::avx512::Conv2dWinogradPlan(p, any_size).ok : cpu::avx2::Conv2dWinogradPlan(p, any_size).ok;
}
/// The Winograd kernel of set isa on the transformed weights u, whatever the size rule says.
void winograd_run(cpu::Isa isa, const Conv2dParams& p, const float* u) {
    if (isa == cpu::Isa::Avx512) cpu::avx512::conv2d_winograd(p, cpu::avx512::Conv2dWinogradPlan(p, true), u);
    else cpu::avx2::conv2d_winograd(p, cpu::avx2::Conv2dWinogradPlan(p, true), u);
}
#endif

/// Winograd's tolerance (times winograd_scale) for cin input channels: one rounding per input channel's FMA, two in
/// the input transform, one for the transformed weight, four in the output transform, bias and residual, with one
/// to spare (first order; docs/numerics.md).
double winograd_tolerance(int cin) { return double(cin + 10) * 0x1p-24; }

/// packed: CPU only, the weights as Ops<Cpu> prepares a Conv2d weight (output blocks on the SIMD sets, the stored
/// tensor then withheld from the op; as stored on the scalar set). math: Conv2dParams::math, with the scratch the
/// library GEMM path needs when `with_scratch` (none on the CPU); `out` gets the output; f32_gemm:
/// Conv2dParams::f32_gemm (F32 math on cuBLASLt's F32 GEMM, held to the exact kernels' bound).
template <class B>
void run_conv2d(const Conv2dCase& k, DType dt, Activation act, bool with_bias, bool with_residual, std::uint32_t seed,
                bool packed = false, MathMode math = MathMode::F32, bool with_scratch = true, std::vector<float>* out = nullptr,
                bool f32_gemm = false) {
    CAPTURE(packed); CAPTURE(int(math)); CAPTURE(with_scratch); CAPTURE(f32_gemm);
    CAPTURE(k.batch); CAPTURE(k.cin); CAPTURE(k.cout); CAPTURE(k.in_h); CAPTURE(k.in_w); CAPTURE(k.kh); CAPTURE(k.kw);
    CAPTURE(k.sh); CAPTURE(k.sw); CAPTURE(k.ph); CAPTURE(k.pw); CAPTURE(dtype_name(dt)); CAPTURE(int(act));
    CAPTURE(with_bias); CAPTURE(with_residual);
    const int oh = (k.in_h + 2 * k.ph - k.kh) / k.sh + 1, ow = (k.in_w + 2 * k.pw - k.kw) / k.sw + 1;
    const std::size_t nx = std::size_t(k.batch) * k.cin * k.in_h * k.in_w;
    const std::size_t ny = std::size_t(k.batch) * k.cout * oh * ow;
    const auto x = random_vec(nx, seed);
    const auto bias = random_vec(std::size_t(k.cout), seed + 1);
    const auto res = random_vec(ny, seed + 2, -2.f, 2.f);
    const HostWeights w = make_weights(std::size_t(k.cout) * k.cin * k.kh * k.kw, dt, seed + 3, 0.3f);
    std::vector<double> ref(ny), scale(ny);
    for (int b = 0; b < k.batch; ++b)
        for (int o = 0; o < k.cout; ++o)
            for (int r = 0; r < oh; ++r)
                for (int c = 0; c < ow; ++c) {
                    double s = with_bias ? bias[std::size_t(o)] : 0.0, mag = std::fabs(s);
                    for (int i = 0; i < k.cin; ++i)
                        for (int u = 0; u < k.kh; ++u) {
                            const int ih = r * k.sh + u - k.ph;
                            if (ih < 0 || ih >= k.in_h) continue;
                            for (int v = 0; v < k.kw; ++v) {
                                const int iw = c * k.sw + v - k.pw;
                                if (iw < 0 || iw >= k.in_w) continue;
                                const double t = w.value[((std::size_t(o) * k.cin + i) * k.kh + u) * k.kw + v] *
                                                 x[((std::size_t(b) * k.cin + i) * k.in_h + ih) * k.in_w + iw];
                                s += t;
                                mag += std::fabs(t);
                            }
                        }
                    const std::size_t idx = ((std::size_t(b) * k.cout + o) * oh + r) * ow + c;
                    if (with_residual) {
                        s += res[idx];
                        mag += std::fabs(res[idx]);
                    }
                    ref[idx] = ref_act(act, s);
                    scale[idx] = mag * act_slope(act);
                }
    Dev<float, B> dx(x), db(bias), dr(res), dy(ny);
    DevWeights<B> dw(w);
    Conv2dParams p;
    p.x = dx.ptr();
    p.w = dw.ref();
    std::unique_ptr<PreparedWeight> prepared;
    if constexpr (kIsCpu<B>) {
        if (packed) {
            prepared = Ops<Cpu>::prepare_weight(Storage::Conv2dWeight, w.ref(), Shape{k.cout, k.cin, k.kh, k.kw}, "test weight");
            if (prepared) p.w = {nullptr, dt, prepared.get()};
        }
    }
    p.bias = with_bias ? db.ptr() : nullptr;
    p.residual = with_residual ? dr.ptr() : nullptr;
    p.y = dy.ptr();
    p.batch = k.batch; p.in_channels = k.cin; p.out_channels = k.cout; p.in_h = k.in_h; p.in_w = k.in_w;
    p.out_h = oh; p.out_w = ow; p.kernel_h = k.kh; p.kernel_w = k.kw; p.stride_h = k.sh; p.stride_w = k.sw;
    p.pad_h = k.ph; p.pad_w = k.pw; p.act = act;
    p.math = math;
    p.f32_gemm = f32_gemm;
    bool tensor_cores = false;
    std::optional<Dev<std::uint8_t, B>> scratch;
    if constexpr (!kIsCpu<B>) {
        const std::size_t need = Ops<B>::conv2d_scratch_bytes(p);
        tensor_cores = math != MathMode::F32 && with_scratch && need > 0 && (act == Activation::None || act == Activation::Relu) &&
                       (dt == DType::F32 || (dt == DType::BF16 && math == MathMode::BF16));
        if (with_scratch && need > 0) {
            scratch.emplace(need);
            p.scratch = scratch->ptr();
            p.scratch_bytes = need;
        }
    }
    Ops<B>::conv2d(p);
    const auto got = dy.host(ny);
    if (out) *out = got;
#if defined(FLOWEDGE_CPU_X86)
    if constexpr (kIsCpu<B>) {
        // Where Ops<Cpu> took Winograd (3x3 stride-1 F32 weights on a SIMD set, maps its size rule admits).
        const auto* pw = prepared ? static_cast<const cpu::PackedWeight*>(prepared.get()) : nullptr;
        if (pw && pw->winograd() && winograd_plan_ok(pw->isa(), p)) {
            const auto W = winograd_scale(k, x, w, p.bias ? bias.data() : nullptr, p.residual ? res.data() : nullptr, act);
            check_all(got, ref, W, winograd_tolerance(k.cin), "conv2d (Winograd)");
            return;
        }
    }
#endif
    check_all(got, ref, scale, conv2d_tolerance<B>(math, dt, k.cin * k.kh * k.kw, tensor_cores), "conv2d");
    if constexpr (!kIsCpu<B>) {
        if (math != MathMode::F32) return;  // the rounded path is checked against the double reference only
        std::vector<float> cpu(ny);
        p.x = x.data(); p.w = w.ref(); p.bias = with_bias ? bias.data() : nullptr;
        p.residual = with_residual ? res.data() : nullptr; p.y = cpu.data();
        Ops<Cpu>::conv2d(p);
        std::vector<double> cpu_d(cpu.begin(), cpu.end());
        check_all(got, cpu_d, scale, 4e-6, "conv2d vs cpu");
    }
}

constexpr Activation kActs[] = {Activation::None, Activation::Relu, Activation::Silu, Activation::Mish, Activation::Softplus};

/// Ops<B>::conv2d_group_norm (CUDA's fused conv + GroupNorm) against double loops of the two modules: torch.nn.Conv2d
/// without bias, then nn.GroupNorm(groups) with gamma/beta, act, residual, post_act (the BasicBlock tail). F32
/// weights. Returns whether the op applied (false: it launched nothing and the caller runs the two ops).
template <class B>
bool run_conv2d_group_norm(const Conv2dCase& k, int groups, Activation act, bool with_residual, Activation post,
                           std::uint32_t seed, DType dt = DType::F32, bool with_bias = false) {
    CAPTURE(k.batch); CAPTURE(k.cin); CAPTURE(k.cout); CAPTURE(k.in_h); CAPTURE(k.in_w); CAPTURE(k.kh); CAPTURE(k.sh);
    CAPTURE(k.ph); CAPTURE(groups); CAPTURE(int(act)); CAPTURE(with_residual); CAPTURE(int(post));
    const int oh = (k.in_h + 2 * k.ph - k.kh) / k.sh + 1, ow = (k.in_w + 2 * k.pw - k.kw) / k.sw + 1, P = oh * ow;
    const std::size_t nx = std::size_t(k.batch) * k.cin * k.in_h * k.in_w, ny = std::size_t(k.batch) * k.cout * P;
    const auto x = random_vec(nx, seed);
    const auto gamma = random_vec(std::size_t(k.cout), seed + 1, 0.5f, 1.5f);
    const auto beta = random_vec(std::size_t(k.cout), seed + 2);
    const auto res = random_vec(ny, seed + 3, -2.f, 2.f);
    const auto bias = random_vec(std::size_t(k.cout), seed + 5);
    const HostWeights w = make_weights(std::size_t(k.cout) * k.cin * k.kh * k.kw, dt, seed + 4, 0.3f);
    std::vector<double> conv(ny), mag(ny), ref(ny), scale(ny);
    for (int b = 0; b < k.batch; ++b)
        for (int o = 0; o < k.cout; ++o)
            for (int r = 0; r < oh; ++r)
                for (int c = 0; c < ow; ++c) {
                    double acc = 0.0, m = 0.0;
                    for (int i = 0; i < k.cin; ++i)
                        for (int u = 0; u < k.kh; ++u)
                            for (int v = 0; v < k.kw; ++v) {
                                const int ih = r * k.sh + u - k.ph, iw = c * k.sw + v - k.pw;
                                if (ih < 0 || ih >= k.in_h || iw < 0 || iw >= k.in_w) continue;
                                const double t = w.value[((std::size_t(o) * k.cin + i) * k.kh + u) * k.kw + v] *
                                                 x[((std::size_t(b) * k.cin + i) * k.in_h + ih) * k.in_w + iw];
                                acc += t;
                                m += std::fabs(t);
                            }
                    const std::size_t idx = (std::size_t(b) * k.cout + o) * P + std::size_t(r) * ow + c;
                    conv[idx] = acc;
                    mag[idx] = m;
                }
    const int cpg = k.cout / groups;
    for (int b = 0; b < k.batch; ++b)
        for (int g = 0; g < groups; ++g) {
            const std::size_t base = (std::size_t(b) * k.cout + std::size_t(g) * cpg) * P, n = std::size_t(cpg) * P;
            double sum = 0, ss = 0, mag_sum = 0;
            for (std::size_t i = 0; i < n; ++i) sum += conv[base + i], mag_sum += mag[base + i];
            const double mean = sum / double(n);
            for (std::size_t i = 0; i < n; ++i) ss += (conv[base + i] - mean) * (conv[base + i] - mean);
            const double rstd = 1 / std::sqrt(ss / double(n) + 1e-5);
            for (std::size_t i = 0; i < n; ++i) {
                const int ch = g * cpg + int(i / std::size_t(P));
                const double nrm = (conv[base + i] - mean) * rstd;
                double a = ref_act(act, nrm * gamma[std::size_t(ch)] + beta[std::size_t(ch)]);
                // The conv's float rounding (|terms| of the output and, through the mean, of its group) carried
                // through rstd and gamma, plus the norm's own terms.
                double sc = (mag[base + i] + mag_sum / double(n)) * rstd * gamma[std::size_t(ch)] +
                            std::fabs(nrm * gamma[std::size_t(ch)]) + std::fabs(beta[std::size_t(ch)]) + std::fabs(a);
                if (with_residual) {
                    a += res[base + i];
                    sc += std::fabs(res[base + i]);
                }
                ref[base + i] = ref_act(post, a);
                scale[base + i] = sc * act_slope(post) + 1.0;
            }
        }
    Dev<float, B> dx(x), dg(gamma), dbt(beta), dr(res), db(bias), dy(ny);
    DevWeights<B> dw(w);
    Conv2dGroupNormParams q;
    q.conv.x = dx.ptr();
    q.conv.w = dw.ref();
    q.conv.bias = with_bias ? db.ptr() : nullptr;
    q.conv.y = dy.ptr();
    q.conv.batch = k.batch; q.conv.in_channels = k.cin; q.conv.out_channels = k.cout; q.conv.in_h = k.in_h; q.conv.in_w = k.in_w;
    q.conv.out_h = oh; q.conv.out_w = ow; q.conv.kernel_h = k.kh; q.conv.kernel_w = k.kw; q.conv.stride_h = k.sh;
    q.conv.stride_w = k.sw; q.conv.pad_h = k.ph; q.conv.pad_w = k.pw;
    q.norm.gamma = dg.ptr();
    q.norm.beta = dbt.ptr();
    q.norm.groups = groups;
    q.norm.act = act;
    q.norm.residual = with_residual ? dr.ptr() : nullptr;
    q.norm.post_act = post;
    if (!Ops<B>::conv2d_group_norm(q)) return false;
    check_all(dy.host(ny), ref, scale, 2e-6, "conv2d_group_norm");
    return true;
}

/// The device's compute capability as 10 * major + minor, from device_description() ("... (sm_90)"); 0 if unknown.
inline int cuda_sm() {
#ifdef FLOWEDGE_WITH_CUDA
    const std::string d = cuda::device_description();
    const std::size_t at = d.find("(sm_");
    return at == std::string::npos ? 0 : std::atoi(d.c_str() + at + 4);
#else
    return 0;
#endif
}

}  // namespace

TEST_CASE_TEMPLATE("conv2d_group_norm: CUDA's fused conv + GroupNorm (the use_group_norm encoder's units) vs the two modules",
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if constexpr (requires(const Conv2dGroupNormParams& q) { Ops<B>::conv2d_group_norm(q, Stream{}); }) {
        if (!ready<B>()) return;
        const bool clusters = cuda_sm() >= 90;  // the fused kernel runs on thread-block clusters
        if (!clusters) MESSAGE("no sm_90 device: the fused op must decline every case");
        using A = Activation;
        struct Unit {
            Conv2dCase k;
            int groups;
            A act;
            bool residual;
            A post;
        };
        // layer1..layer4 of resnet18 at the 84x84 PushT crop (GroupNorm(C/16, C)): conv1 (+ReLU), the 1x1
        // downsample, conv2 (+ identity, ReLU); then odd sizes: input channels not a multiple of 8 (cluster blocks
        // with no channel), batches, rectangular maps, every activation.
        const Unit units[] = {
            {{1, 64, 64, 21, 21, 3, 3, 1, 1, 1, 1}, 4, A::Relu, false, A::None},
            {{1, 64, 64, 21, 21, 3, 3, 1, 1, 1, 1}, 4, A::None, true, A::Relu},
            {{1, 64, 128, 21, 21, 3, 3, 2, 2, 1, 1}, 8, A::Relu, false, A::None},
            {{1, 64, 128, 21, 21, 1, 1, 2, 2, 0, 0}, 8, A::None, false, A::None},
            {{1, 128, 128, 11, 11, 3, 3, 1, 1, 1, 1}, 8, A::None, true, A::Relu},
            {{1, 128, 256, 11, 11, 3, 3, 2, 2, 1, 1}, 16, A::Relu, false, A::None},
            {{1, 256, 256, 6, 6, 3, 3, 1, 1, 1, 1}, 16, A::None, true, A::Relu},
            {{1, 256, 512, 6, 6, 3, 3, 2, 2, 1, 1}, 32, A::Relu, false, A::None},
            {{1, 512, 512, 3, 3, 3, 3, 1, 1, 1, 1}, 32, A::None, true, A::Relu},
            {{2, 20, 48, 7, 5, 3, 3, 2, 2, 1, 1}, 3, A::Relu, false, A::None},
            {{3, 5, 32, 9, 4, 3, 3, 1, 1, 1, 1}, 2, A::None, true, A::Relu},
            {{1, 9, 16, 5, 5, 1, 1, 1, 1, 0, 0}, 1, A::Silu, true, A::Mish},
            {{2, 12, 24, 6, 7, 5, 5, 1, 1, 2, 2}, 6, A::Mish, false, A::Softplus},
            // channels per group not a multiple of the 4-channel register tile; a map with one position.
            {{1, 16, 12, 5, 7, 3, 3, 1, 1, 1, 1}, 4, A::Relu, true, A::Relu},
            {{2, 40, 20, 3, 3, 3, 3, 2, 2, 0, 0}, 2, A::None, false, A::Relu},
        };
        std::uint32_t seed = 900;
        for (const Unit& u : units) CHECK(run_conv2d_group_norm<B>(u.k, u.groups, u.act, u.residual, u.post, seed += 10) == clusters);
        // Where it declines (the caller runs conv2d + group_norm): a conv bias, 16-bit weights, a group over
        // 16384 outputs (the stem's 16 x 42 x 42).
        CHECK_FALSE(run_conv2d_group_norm<B>({1, 8, 16, 6, 6, 3, 3, 1, 1, 1, 1}, 2, A::Relu, false, A::None, 7, DType::F32, true));
        CHECK_FALSE(run_conv2d_group_norm<B>({1, 8, 16, 6, 6, 3, 3, 1, 1, 1, 1}, 2, A::Relu, false, A::None, 8, DType::BF16));
        CHECK_FALSE(run_conv2d_group_norm<B>({1, 3, 64, 84, 84, 7, 7, 2, 2, 3, 3}, 4, A::Relu, false, A::None, 9));
    } else {
        MESSAGE("this backend has no fused conv2d_group_norm: the layers run conv2d + group_norm");
    }
}

TEST_CASE_TEMPLATE("conv2d: the ResNet18 encoder's shapes at an 84x84 crop (fused BatchNorm bias, residual, ReLU)", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    using A = Activation;
    struct Layer { Conv2dCase k; bool residual; A act; };
    const Layer layers[] = {
        {{1, 3, 64, 84, 84, 7, 7, 2, 2, 3, 3}, false, A::Relu},        // conv1 -> 42x42
        {{1, 64, 64, 21, 21, 3, 3, 1, 1, 1, 1}, false, A::Relu},       // layer1 conv a
        {{1, 64, 64, 21, 21, 3, 3, 1, 1, 1, 1}, true, A::Relu},        // layer1 conv b + identity
        {{1, 64, 128, 21, 21, 3, 3, 2, 2, 1, 1}, false, A::Relu},      // layer2.0 conv a -> 11x11
        {{1, 64, 128, 21, 21, 1, 1, 2, 2, 0, 0}, false, A::None},      // layer2.0 downsample
        {{1, 128, 128, 11, 11, 3, 3, 1, 1, 1, 1}, true, A::Relu},      // layer2 conv b + shortcut
        {{1, 128, 256, 11, 11, 3, 3, 2, 2, 1, 1}, false, A::Relu},     // layer3.0 conv a -> 6x6
        {{1, 256, 256, 6, 6, 3, 3, 1, 1, 1, 1}, true, A::Relu},        // layer3 conv b (reduction 2304)
        {{1, 256, 512, 6, 6, 3, 3, 2, 2, 1, 1}, false, A::Relu},       // layer4.0 conv a -> 3x3
        {{1, 512, 512, 3, 3, 3, 3, 1, 1, 1, 1}, true, A::Relu},        // layer4 conv b (reduction 4608: two chunks)
        {{1, 512, 32, 3, 3, 1, 1, 1, 1, 0, 0}, false, A::None},        // SpatialSoftmax keypoint conv, with bias
    };
    std::uint32_t seed = 9100;
    for (const auto& l : layers) run_conv2d<B>(l.k, DType::F32, l.act, true, l.residual, seed += 10);
    // The 16-bit storage dtypes on a few of them.
    for (DType dt : {DType::BF16, DType::F16}) {
        run_conv2d<B>(layers[0].k, dt, A::Relu, true, false, seed += 10);
        run_conv2d<B>(layers[5].k, dt, A::Relu, true, true, seed += 10);
        run_conv2d<B>(layers[9].k, dt, A::Relu, true, true, seed += 10);
        run_conv2d<B>(layers[10].k, dt, A::None, true, false, seed += 10);
    }
}

TEST_CASE_TEMPLATE("conv2d under TF32 / BF16 math: CUDA's tensor-core GEMM within its bound, exact without scratch and on the CPU",
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    using A = Activation;
    struct Layer { Conv2dCase k; bool residual; A act; };
    // ACT's ResNet18 at a 96x128 frame (the 480x640 shapes at 1/5 scale), batches, odd sizes and its 1x1 input
    // projection with bias.
    const Layer layers[] = {
        {{1, 3, 64, 96, 128, 7, 7, 2, 2, 3, 3}, false, A::Relu},       // conv1 -> 48x64
        {{1, 64, 64, 24, 32, 3, 3, 1, 1, 1, 1}, true, A::Relu},        // layer1 conv b + identity
        {{2, 64, 128, 24, 32, 3, 3, 2, 2, 1, 1}, false, A::Relu},      // layer2.0 conv a, batch 2
        {{1, 64, 128, 24, 32, 1, 1, 2, 2, 0, 0}, false, A::None},      // layer2.0 downsample
        {{1, 512, 512, 3, 4, 3, 3, 1, 1, 1, 1}, true, A::Relu},        // layer4 conv b (reduction 4608)
        {{1, 512, 96, 3, 4, 1, 1, 1, 1, 0, 0}, false, A::None},        // ACT's 1x1 input projection, with bias
        {{3, 5, 7, 9, 11, 3, 2, 2, 1, 1, 0}, true, A::Relu},           // odd sizes, non-square kernel, batch 3
    };
    std::uint32_t seed = 9900;
    for (const MathMode math : {MathMode::TF32, MathMode::BF16}) {
        for (const auto& l : layers) run_conv2d<B>(l.k, DType::F32, l.act, true, l.residual, seed += 10, false, math);
        run_conv2d<B>(layers[1].k, DType::BF16, A::Relu, true, true, seed += 10, false, math);
        run_conv2d<B>(layers[4].k, DType::F16, A::Relu, true, true, seed += 10, false, math);  // declined: exact
    }
    // Silu is not an epilogue of the GEMM path: the exact kernels run (2e-6) even with scratch.
    run_conv2d<B>(layers[1].k, DType::F32, A::Silu, true, true, seed += 10, false, MathMode::TF32);
    // Without scratch the exact kernels run (2e-6), whatever the math.
    run_conv2d<B>(layers[0].k, DType::F32, A::Relu, true, false, seed += 10, false, MathMode::TF32, false);
    if constexpr (!kIsCpu<B>) {
        // The tensor-core path ran: TF32 operands change the stem's output bits (147-term sums of random values).
        std::vector<float> exact, tf32;
        run_conv2d<B>(layers[0].k, DType::F32, A::None, true, false, 9990, false, MathMode::F32, true, &exact);
        run_conv2d<B>(layers[0].k, DType::F32, A::None, true, false, 9990, false, MathMode::TF32, true, &tf32);
        CHECK(exact != tf32);
    }
}

TEST_CASE_TEMPLATE("conv2d under F32 math with f32_gemm: CUDA's F32 library GEMM within the exact kernels' bound", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    using A = Activation;
    // ACT's ResNet18 shapes at a 96x128 frame, a batch and odd sizes (as the TF32 case above).
    const Conv2dCase cases[] = {{1, 3, 64, 96, 128, 7, 7, 2, 2, 3, 3}, {1, 64, 64, 24, 32, 3, 3, 1, 1, 1, 1},
                                {2, 64, 128, 24, 32, 3, 3, 2, 2, 1, 1}, {1, 512, 512, 3, 4, 3, 3, 1, 1, 1, 1},
                                {1, 512, 96, 3, 4, 1, 1, 1, 1, 0, 0}, {3, 5, 7, 9, 11, 3, 2, 2, 1, 1, 0}};
    std::uint32_t seed = 9700;
    for (const Conv2dCase& k : cases) {
        run_conv2d<B>(k, DType::F32, A::Relu, true, true, seed += 10, false, MathMode::F32, true, nullptr, true);
        run_conv2d<B>(k, DType::F32, A::None, false, false, seed += 10, false, MathMode::F32, true, nullptr, true);
    }
    // Silu and 16-bit weights decline to the exact kernels.
    run_conv2d<B>(cases[1], DType::F32, A::Silu, true, true, seed += 10, false, MathMode::F32, true, nullptr, true);
    run_conv2d<B>(cases[1], DType::BF16, A::Relu, true, true, seed += 10, false, MathMode::F32, true, nullptr, true);
    if constexpr (!kIsCpu<B>) {
        // The library path ran: its summation order changes some of the stem's 147-term sums in the last bit.
        std::vector<float> exact, gemm;
        run_conv2d<B>(cases[0], DType::F32, A::None, true, false, 9990, false, MathMode::F32, true, &exact);
        run_conv2d<B>(cases[0], DType::F32, A::None, true, false, 9990, false, MathMode::F32, true, &gemm, true);
        CHECK(exact != gemm);
    }
}

TEST_CASE_TEMPLATE("conv2d: odd sizes, strides and padding, every weight dtype and activation, bias and residual on/off", B,
                   FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    const Conv2dCase cases[] = {
        {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
        {3, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
        {2, 5, 7, 9, 11, 3, 2, 2, 1, 1, 0},
        {1, 7, 13, 17, 5, 5, 3, 3, 2, 2, 1},
        {2, 3, 10, 20, 30, 4, 4, 2, 3, 2, 1},
        {1, 4, 9, 10, 10, 3, 3, 1, 1, 1, 1},      // 100 positions: one full tile and a partial one
        {1, 6, 17, 8, 8, 1, 1, 1, 1, 0, 0},       // 64 positions: exactly full tiles
        {2, 9, 70, 13, 7, 3, 3, 1, 1, 1, 1},      // output channels past a multiple of 8 and of 6
        {1, 2, 3, 5, 5, 5, 5, 1, 1, 2, 2},        // kernel as large as the padded input allows
        {1, 3, 4, 6, 6, 3, 3, 4, 4, 0, 0},        // stride past the kernel (pixels skipped)
        {2, 300, 20, 4, 5, 3, 3, 1, 1, 1, 1},     // reduction 2700: more than one chunk
        {1, 600, 21, 4, 4, 3, 3, 1, 1, 1, 1},     // 16 positions (the dot path) and reduction 5400: two chunks
        // 3x3 outputs (the 9-column dot path, whole-channel columns, chunks of 576):
        {2, 20, 13, 3, 3, 3, 3, 1, 1, 1, 1},      // reduction 180: one chunk; 13 rows = 4 blocks of 3 and one row
        {1, 70, 8, 3, 3, 3, 3, 1, 1, 1, 1},       // reduction 630: chunks 576 + 54
        {1, 10, 5, 6, 6, 3, 3, 2, 2, 1, 1},       // stride 2 with padding (layer4's first conv)
        {1, 40, 7, 3, 3, 1, 1, 1, 1, 0, 0},       // 1x1 kernel
        {1, 5, 6, 5, 3, 3, 1, 1, 1, 0, 0},        // a non-square 3x1 kernel: 3x3 output
        {1, 30, 4, 7, 7, 5, 5, 1, 1, 0, 0},       // 5x5 kernel, reduction 750: chunks that split input channels
        // <= 9 output pixels with a reduction >= 2048 divisible by 4 (the K-stream path on CUDA): output channels
        // past a block's 32, batches.
        {3, 256, 40, 6, 6, 3, 3, 2, 2, 1, 1},     // 3x3 outputs, reduction 2304
        {2, 128, 33, 4, 4, 4, 4, 2, 2, 1, 1},     // 2x2 outputs, reduction 2048
    };
    std::uint32_t seed = 9500;
    int n = 0;
    for (const auto& k : cases)
        for (DType dt : kAllDtypes) {
            const Activation act = kActs[std::size_t(n) % std::size(kActs)];
            const bool with_bias = n % 2 == 0, with_residual = n % 3 != 1;
            run_conv2d<B>(k, dt, act, with_bias, with_residual, seed += 10);
            ++n;
        }
}

TEST_CASE("conv2d on packed weights (Storage::Conv2dWeight): encoder shapes, cutting edges, every dtype, 1-3 threads") {
    using A = Activation;
    // Only the SIMD sets pack Conv2d weights (cpu/weights.hpp); elsewhere every call below would repeat the stored-
    // layout path the other cases check, for ~20 s under the sanitizers.
    if (const cpu::Isa isa = cpu::active_isa(); isa != cpu::Isa::Avx2 && isa != cpu::Isa::Avx512) {
        MESSAGE("the " << cpu::isa_name(isa) << " kernel set keeps Conv2d weights as stored: nothing packed to test");
        return;
    }
    const Conv2dCase encoder[] = {
        {1, 3, 64, 84, 84, 7, 7, 2, 2, 3, 3},      // stem -> 42x42: 147 tiles of 12
        {1, 64, 64, 21, 21, 3, 3, 1, 1, 1, 1},     // layer1: 441 positions, a last tile of 9
        {1, 64, 128, 21, 21, 1, 1, 2, 2, 0, 0},    // layer2.0 downsample: 121 positions, tiles of 11
        {1, 128, 256, 11, 11, 3, 3, 2, 2, 1, 1},   // layer3.0 conv a -> 6x6
        {1, 256, 256, 6, 6, 3, 3, 1, 1, 1, 1},     // layer3 conv b: reduction 2304 in two chunks
        {1, 512, 512, 3, 3, 3, 3, 1, 1, 1, 1},     // layer4 conv b: 3 output vectors x 9 positions, 32 vectors
        {1, 512, 32, 3, 3, 1, 1, 1, 1, 0, 0},      // keypoint conv: fewer output vectors than a group
    };
    const Conv2dCase odd[] = {
        {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
        {3, 2, 5, 3, 4, 3, 3, 1, 1, 1, 1},         // out channels below one vector, batch 3
        {2, 5, 17, 9, 11, 3, 2, 2, 1, 1, 0},       // 17 out channels: a vector and one lane
        {1, 7, 40, 17, 5, 5, 3, 3, 2, 2, 1},       // 40 channels (AVX-512: 3 vectors, a group of 2 and 1)
        {2, 9, 70, 13, 7, 3, 3, 1, 1, 1, 1},       // 91 positions over 8 tiles of 12 and a short one
        {1, 160, 24, 8, 8, 3, 3, 1, 1, 1, 1},      // reduction 1440 over 48-position blocks: two chunks
        {1, 600, 21, 4, 4, 3, 3, 1, 1, 1, 1},      // reduction 5400 at 16 positions: two chunks
        {1, 16, 1500, 6, 4, 1, 1, 1, 1, 0, 0},     // 1500 out channels x 2 tiles of 12: the accumulators in two slabs
        {1, 3, 4, 6, 6, 3, 3, 4, 4, 0, 0},         // stride past the kernel
        {1, 2, 3, 5, 5, 5, 5, 1, 1, 2, 2},         // kernel as large as the padded input allows
    };
    // Wide maps: the AVX-512 band path (no im2col panel; kernels/conv2d_packed.hpp), its row blocks, channel chunks,
    // stride phases and dropped row-end positions.
    const Conv2dCase wide[] = {
        {1, 3, 64, 100, 128, 7, 7, 2, 2, 3, 3},    // stem at a wide frame -> 50x64: blocks of 3 rows, a last of 2
        {1, 64, 64, 30, 40, 3, 3, 1, 1, 1, 1},     // layer1-like: 6 blocks of 5 rows
        {1, 300, 16, 20, 40, 3, 3, 1, 1, 1, 1},    // 300 input channels: the band in two channel chunks
        {1, 16, 1500, 4, 40, 1, 1, 1, 1, 0, 0},    // 94 output vectors: one-row blocks, accumulators in two slabs
        {2, 5, 33, 17, 31, 3, 3, 2, 2, 1, 1},      // stride 2, odd input, batch 2, a group of 2 vectors and 1
        {1, 4, 8, 12, 34, 2, 2, 2, 2, 0, 0},       // 2x2 stride 2: four phases, no dropped positions
        {1, 6, 20, 9, 40, 3, 5, 1, 1, 1, 2},       // non-square kernel and padding
        {1, 24, 40, 31, 64, 3, 1, 2, 2, 1, 0},     // 3x1 stride 2: two row phases, one column phase
    };
    std::uint32_t seed = 9900;
    int n = 0;
    for (int threads : {1, 3}) {
        with_threads(threads, [&] {
            for (const auto& k : encoder) run_conv2d<Cpu>(k, DType::F32, A::Relu, true, n++ % 2 == 0, seed += 10, true);
            for (DType dt : {DType::BF16, DType::F16}) {
                run_conv2d<Cpu>(encoder[0], dt, A::Relu, true, false, seed += 10, true);
                run_conv2d<Cpu>(encoder[5], dt, A::Relu, true, true, seed += 10, true);
            }
            for (const auto& k : wide) run_conv2d<Cpu>(k, DType::F32, kActs[std::size_t(n) % std::size(kActs)], n % 2 == 0, n % 3 != 1, seed += 10, true), ++n;
            run_conv2d<Cpu>(wide[1], DType::BF16, A::Relu, true, true, seed += 10, true);
            run_conv2d<Cpu>(wide[4], DType::F16, A::Relu, true, false, seed += 10, true);
            for (const auto& k : odd)
                for (DType dt : kAllDtypes) {
                    const Activation act = kActs[std::size_t(n) % std::size(kActs)];
                    run_conv2d<Cpu>(k, dt, act, n % 2 == 0, n % 3 != 1, seed += 10, true);
                    ++n;
                }
        });
    }
}

#if defined(FLOWEDGE_CPU_X86)
TEST_CASE("conv2d by Winograd F(2x2, 3x3) (AVX-512 and AVX2 sets, 3x3 stride-1 F32 weights): maps 1..40, channels off "
          "the vector width, epilogues, 1-3 threads (same bits), within its bound") {
    const cpu::Isa isa = cpu::active_isa();
    if (isa != cpu::Isa::Avx512 && isa != cpu::Isa::Avx2) {
        MESSAGE("kernel set " << cpu::kernel_set_name() << ": no Winograd path (AVX-512 and AVX2 only)");
        return;
    }
    MESSAGE("kernel set " << cpu::kernel_set_name());
    using A = Activation;
    const Conv2dCase cases[] = {
        {1, 3, 5, 1, 1, 3, 3, 1, 1, 1, 1},        // one output: one tile, three quarters of it dropped
        {1, 7, 17, 2, 3, 3, 3, 1, 1, 1, 1},       // 17 outputs: a vector and one lane
        {2, 5, 33, 5, 7, 3, 3, 1, 1, 1, 1},       // odd map, batch 2, 3 output vectors (a group of 2 and 1)
        {1, 20, 13, 9, 9, 3, 3, 1, 1, 1, 1},
        {1, 33, 40, 11, 16, 3, 3, 1, 1, 1, 1},    // 48 tiles, 3 output vectors: one block of every tile
        {1, 17, 70, 21, 21, 3, 3, 1, 1, 1, 1},    // PushT layer1's map: blocks of 42 tiles crossing tile rows
        {1, 24, 200, 13, 17, 3, 3, 1, 1, 1, 1},   // 13 output vectors: two slabs, blocks of 28 tiles
        {1, 40, 24, 40, 39, 3, 3, 1, 1, 1, 1},    // 400 tiles, odd width
        {1, 300, 20, 12, 14, 3, 3, 1, 1, 1, 1},   // input transform in channel chunks (97, 97, 97, 9)
        {1, 9, 36, 8, 10, 3, 3, 1, 1, 0, 0},      // no padding
        {1, 6, 18, 7, 12, 3, 3, 1, 1, 2, 0},      // padding 2 x 0: tiles reading two zero rows
    };
    std::uint32_t seed = 12000;
    int n = 0;
    double worst = 0;
    for (const auto& k : cases) {
        CAPTURE(k.batch); CAPTURE(k.cin); CAPTURE(k.cout); CAPTURE(k.in_h); CAPTURE(k.in_w); CAPTURE(k.ph); CAPTURE(k.pw);
        const int oh = k.in_h + 2 * k.ph - 2, ow = k.in_w + 2 * k.pw - 2;
        const std::size_t ny = std::size_t(k.batch) * k.cout * oh * ow;
        const auto x = random_vec(std::size_t(k.batch) * k.cin * k.in_h * k.in_w, seed += 10);
        const auto bias = random_vec(std::size_t(k.cout), seed + 1);
        const auto res = random_vec(ny, seed + 2, -2.f, 2.f);
        const HostWeights w = make_weights(std::size_t(k.cout) * k.cin * 9, DType::F32, seed + 3, 0.3f);
        const auto prepared = Ops<Cpu>::prepare_weight(Storage::Conv2dWeight, w.ref(), Shape{k.cout, k.cin, 3, 3}, "test weight");
        const auto* pw = static_cast<const cpu::PackedWeight*>(prepared.get());
        REQUIRE(pw);
        REQUIRE(pw->winograd());
        const Activation act = n % 3 == 0 ? A::Relu : n % 3 == 1 ? A::None : A::Silu;
        const bool with_bias = n % 2 == 0, with_residual = n % 4 < 2;
        ++n;
        Conv2dParams p;
        p.x = x.data(); p.w = {nullptr, DType::F32, prepared.get()};
        p.bias = with_bias ? bias.data() : nullptr; p.residual = with_residual ? res.data() : nullptr;
        p.batch = k.batch; p.in_channels = k.cin; p.out_channels = k.cout; p.in_h = k.in_h; p.in_w = k.in_w;
        p.out_h = oh; p.out_w = ow; p.kernel_h = 3; p.kernel_w = 3; p.pad_h = k.ph; p.pad_w = k.pw; p.act = act;
        // The double reference.
        std::vector<double> ref(ny);
        for (int b = 0; b < k.batch; ++b)
            for (int o = 0; o < k.cout; ++o)
                for (int r = 0; r < oh; ++r)
                    for (int c = 0; c < ow; ++c) {
                        double s = with_bias ? bias[std::size_t(o)] : 0.0;
                        for (int i = 0; i < k.cin; ++i)
                            for (int u = 0; u < 3; ++u)
                                for (int v = 0; v < 3; ++v) {
                                    const int ih = r + u - k.ph, iw = c + v - k.pw;
                                    if (ih < 0 || ih >= k.in_h || iw < 0 || iw >= k.in_w) continue;
                                    s += w.value[((std::size_t(o) * k.cin + i) * 3 + u) * 3 + v] *
                                         x[((std::size_t(b) * k.cin + i) * k.in_h + ih) * k.in_w + iw];
                                }
                        const std::size_t idx = ((std::size_t(b) * k.cout + o) * oh + r) * ow + c;
                        if (with_residual) s += res[idx];
                        ref[idx] = ref_act(act, s);
                    }
        const auto W = winograd_scale(k, x, w, p.bias, p.residual, act);
        const double tol = winograd_tolerance(k.cin);
        std::vector<float> first;
        for (int threads : {1, 2, 3}) {
            CAPTURE(threads);
            std::vector<float> y(ny, -7.f);
            p.y = y.data();
            with_threads(threads, [&] { winograd_run(isa, p, pw->winograd()); });
            check_all(y, ref, W, tol, "conv2d (Winograd kernel)");
            for (std::size_t i = 0; i < ny; ++i) worst = std::max(worst, std::fabs(double(y[i]) - ref[i]) / (tol * std::max(W[i], 1e-30)));
            if (threads == 1) first = y;
            else CHECK(std::memcmp(first.data(), y.data(), ny * sizeof(float)) == 0);
        }
    }
    MESSAGE("largest |error| / bound over the cases: " << worst);
    CHECK(worst < 0.5);  // the first-order bound holds with at least 2x margin
    // The size rule (Ops<Cpu>::conv2d): PushT's layer1..3 maps take Winograd, its 3x3 layer4 and stride 2 do not.
    auto plan_ok = [&](int c, int h) {
        Conv2dParams p;
        p.in_channels = p.out_channels = c; p.in_h = p.in_w = p.out_h = p.out_w = h;
        p.kernel_h = p.kernel_w = 3; p.pad_h = p.pad_w = 1;
        return winograd_plan_ok(isa, p);
    };
    CHECK(plan_ok(64, 21));
    CHECK(plan_ok(128, 11));
    CHECK(plan_ok(256, 6));
    CHECK_FALSE(plan_ok(512, 3));
    CHECK(plan_ok(64, 160));
}
#endif

TEST_CASE_TEMPLATE("conv2d rejects bad sizes, aliasing and null pointers with the shared message" * doctest::test_suite("op_checks"),
                   B, FLOWEDGE_OPS_TEST_BACKENDS) {
    if (!ready<B>()) return;
    Dev<float, B> d(std::size_t(1024));
    Conv2dParams p;
    p.x = d.ptr(); p.w = {d.ptr(), DType::F32}; p.y = d.ptr() + 512;
    p.in_channels = 2; p.out_channels = 3; p.in_h = 5; p.in_w = 5; p.out_h = 3; p.out_w = 3; p.kernel_h = 3; p.kernel_w = 3;
    CHECK_NOTHROW(Ops<B>::conv2d(p));
    Memory<B>::synchronize();
    auto bad = p;
    bad.out_w = 4;
    CHECK_THROWS_WITH_AS(Ops<B>::conv2d(bad), doctest::Contains("flowedge: conv2d: output size inconsistent"), Error);
    bad = p;
    bad.y = d.ptr();  // y == x
    CHECK_THROWS_WITH_AS(Ops<B>::conv2d(bad), doctest::Contains("flowedge: conv2d: y aliases x"), Error);
    bad = p;
    bad.w = {nullptr, DType::F32};
    CHECK_THROWS_WITH_AS(Ops<B>::conv2d(bad), doctest::Contains("flowedge: conv2d: null x, w or y pointer"), Error);
    bad = p;
    bad.kernel_h = 8;
    CHECK_THROWS_WITH_AS(Ops<B>::conv2d(bad), doctest::Contains("flowedge: conv2d: kernel larger than the padded input"), Error);
}
