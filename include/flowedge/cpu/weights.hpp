// The CPU's weight preparation, in one place: which stored tensors the process's kernel set wants re-laid out at
// load (Ops<Cpu>::prepare_weight), and the packed copies that result.
//   AVX2 and AVX-512 sets: Conv1d, ConvTranspose1d and streamed Linear weights -> packed conv blocks
//                (kernels/packed_conv.hpp, the AVX2 set's layout and kernels, which the AVX-512 set calls: on Zen 4 they
//                beat its row-major 512-bit kernels), replacing the stored tensor (INT8 blocks with per-output scales
//                under LoadOptions::quantize = Int8; under W8A8 Conv1d weights become W8A8 blocks,
//                kernels/packed_conv_w8a8.hpp); small-row Linear weights -> k-major packed copy
//                (kernels/packed_linear.hpp) beside it; many-row Linear weights -> the same, or under exact math the
//                GEMM's group layout (kernels/packed_gemm.hpp) beside it.
//   AVX2 and AVX-512 sets: Conv2d weights -> output blocks of one vector (kernels/conv2d_packed.hpp), replacing the
//                stored tensor; on the SIMD sets 3x3 F32 weights also Winograd's transformed copy beside them
//                (kernels/conv2d_winograd.hpp).
//   scalar and Eigen sets: nothing is prepared (Eigen's products read the stored row-major tensors through Maps).
#pragma once
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "flowedge/cpu/kernels.hpp"
#include "flowedge/cpu/memory.hpp"
#include "flowedge/tensor.hpp"
#include "flowedge/weights.hpp"

/// Runs `call` in the SIMD kernel set `isa` (Avx2 or Avx512); an Error for any other set.
#if defined(FLOWEDGE_CPU_X86)
#define FLOWEDGE_CPU_SIMD_KERNEL(isa, call)                                                  \
    do {                                                                                     \
        if ((isa) == ::flowedge::cpu::Isa::Avx512) ::flowedge::cpu::avx512::call;            \
        else if ((isa) == ::flowedge::cpu::Isa::Avx2) ::flowedge::cpu::avx2::call;           \
        else ::flowedge::fail(::flowedge::ErrorKind::Unsupported, "cpu", "packed weights need the AVX2 or AVX-512 kernel set");  \
    } while (0)
#else
#define FLOWEDGE_CPU_SIMD_KERNEL(isa, call) ::flowedge::fail(::flowedge::ErrorKind::Unsupported, "cpu", "packed weights need an x86-64 SIMD kernel set")
#endif

namespace flowedge::cpu {

/// A weight prepared by the CPU backend for one kernel set.
class PackedWeight final : public PreparedWeight {
public:
    enum class Kind : std::uint8_t {
        ConvBlocks,  ///< packed conv blocks (AVX2 layout, AVX2 and AVX-512 sets) of a Conv1d [out, in*K], ConvTranspose1d [out*K, in] or Linear
        SmallRows,   ///< k-major copy of a Linear [out, in] for few or many rows (AVX2/AVX-512 sets), beside the stored tensor
        Conv2dBlocks,  ///< output blocks of one vector of a Conv2d [out, in, kh, kw] (AVX2/AVX-512 sets), replacing it
    };

    /// Conv blocks of a stored [out, R] matrix w (transposed: a ConvTranspose1d weight [in, out, K], packed as the
    /// [out*K, in] kernel-1 Conv1d it is per input column), in w's dtype or quantised (LoadOptions::quantize): Int8,
    /// INT8 blocks with per-output scales; W8A8 (a Conv1d weight), the W8A8 blocks of kernels/packed_conv_w8a8.hpp. isa: the kernel set that runs them (AVX2 or AVX-512; the layout of the others is
    /// the AVX2 set's in both). `what` names the tensor in errors.
    static std::unique_ptr<PackedWeight> conv_blocks(const WeightRef& w, const Shape& shape, bool transposed, WeightQuant q,
                                                     Isa isa, std::string_view what) {
#if defined(FLOWEDGE_CPU_X86)
        auto pw = std::unique_ptr<PackedWeight>(new PackedWeight(Kind::ConvBlocks, isa, w.dtype));
        const bool w8a8 = q == WeightQuant::W8A8;
        pw->m_int8 = q != WeightQuant::None;
        const int out = transposed ? int(shape.dims[1] * shape.dims[2]) : int(shape.dims[0]);
        const std::size_t R = std::size_t(shape.numel()) / std::size_t(out);
        if (w8a8 && R > avx2::w8a8::kMaxSteps) [[unlikely]]
            fail(ErrorKind::Unsupported, "cpu", std::string(what) + ": LoadOptions::quantize = W8A8 takes Conv1d rows of at most " +
                                                    std::to_string(avx2::w8a8::kMaxSteps) + " in_channels * kernel" +
                                                    expected_got("<= " + std::to_string(avx2::w8a8::kMaxSteps), R));
        const std::size_t bytes = w8a8 ? avx2::w8a8::bytes(out, R)
                                  : pw->m_int8 ? avx2::packed_conv_elements<std::int8_t>(out, R)
                                               : avx2::packed_conv_elements(w.dtype, out, R) * dtype_size(w.dtype);
        Memory<Cpu>::check_fits(bytes, std::string(what));
        pw->m_buf = Buffer<std::byte, Cpu>(bytes);
        pw->m_int8_blocks = {reinterpret_cast<const std::int8_t*>(pw->m_buf.data()), w8a8};
        avx2::with_weights(w, [&](auto src) {
            auto pack = [&](auto* dst) {
                if (transposed) avx2::pack_conv_transpose_weights(src, int(shape.dims[0]), int(shape.dims[1]), int(shape.dims[2]), dst);
                else avx2::pack_conv_weights(src, out, R, dst);
            };
            if (w8a8) avx2::w8a8::pack(src, out, R, reinterpret_cast<std::int8_t*>(pw->m_buf.data()));
            else if (pw->m_int8) pack(reinterpret_cast<std::int8_t*>(pw->m_buf.data()));
            else pack(reinterpret_cast<std::remove_cvref_t<decltype(*src)>*>(pw->m_buf.data()));
        });
        return pw;
#else
        (void)w, (void)shape, (void)transposed, (void)q, (void)isa, (void)what;
        return nullptr;
#endif
    }

    /// Output blocks of the stored Conv2d weight w of `shape` [out, in, kh, kw] for kernel set `isa` (AVX2 or
    /// AVX-512), in w's dtype. `what` names the tensor in errors.
    static std::unique_ptr<PackedWeight> conv2d_blocks(const WeightRef& w, const Shape& shape, Isa isa, std::string_view what) {
        auto pw = std::unique_ptr<PackedWeight>(new PackedWeight(Kind::Conv2dBlocks, isa, w.dtype));
        pw->m_out = int(shape.dims[0]);
        pw->m_in = int(shape.numel() / shape.dims[0]);
        [[maybe_unused]] const std::size_t R = std::size_t(pw->m_in);  // unused where no x86 set is built
        std::size_t elements = 0;
#if defined(FLOWEDGE_CPU_X86)
        elements = isa == Isa::Avx512 ? avx512::packed_conv2d_elements(pw->m_out, R) : avx2::packed_conv2d_elements(pw->m_out, R);
#endif
        const std::size_t bytes = elements * dtype_size(w.dtype);
        Memory<Cpu>::check_fits(bytes, std::string(what));
        pw->m_buf = Buffer<std::byte, Cpu>(bytes);
        FLOWEDGE_CPU_SIMD_KERNEL(isa, pack_conv2d_weights(w, pw->m_out, R, pw->m_buf.data()));
#if defined(FLOWEDGE_CPU_X86)
        // 3x3 F32 weights on the SIMD sets also get Winograd's transformed copy (16/9 of the weight's floats; the
        // stride is the run's, so both stay: kernels/conv2d_winograd.hpp takes the stride-1 maps where it wins).
        const int kh = int(shape.dims[2]), kw = int(shape.dims[3]), in = int(shape.dims[1]);
        if (isa == Isa::Avx512 ? avx512::conv2d_winograd_weight(kh, kw, w.dtype) : avx2::conv2d_winograd_weight(kh, kw, w.dtype)) {
            const std::size_t wbytes = (isa == Isa::Avx512 ? avx512::conv2d_winograd_elements(pw->m_out, in)
                                                           : avx2::conv2d_winograd_elements(pw->m_out, in)) * sizeof(float);
            Memory<Cpu>::check_fits(wbytes, std::string(what) + " (Winograd copy)");
            pw->m_wino = Buffer<std::byte, Cpu>(wbytes);
            FLOWEDGE_CPU_SIMD_KERNEL(isa, pack_conv2d_winograd(static_cast<const float*>(w.data), pw->m_out, in,
                                                               reinterpret_cast<float*>(pw->m_wino.data())));
        }
#endif
        return pw;
    }

    /// A small-row copy of the stored [out, in] matrix w for kernel set `isa`, laid out for arithmetic m. The stored
    /// data must outlive this object (set_math repacks from it). Allocates the buffer for the larger layout this
    /// weight dtype can need, once. many_rows (Storage::ManyRowsMatrix): exact math takes the GEMM's F32Groups layout
    /// where it fits (gemm_groups_fit; the same bits as the F32 layout), unless FLOWEDGE_CPU_GEMM_GROUPS=0 (the F32
    /// layout: the old path of an A/B run).
    static std::unique_ptr<PackedWeight> small_rows(const WeightRef& w, int in, int out, Isa isa, MathMode m, bool many_rows = false) {
        if (!(in > 0 && out > 0 && w.data)) [[unlikely]]
            fail("cpu packed linear", "bad weights" + expected_got("in > 0, out > 0, data", std::to_string(in) + " x " + std::to_string(out)));
        auto pw = std::unique_ptr<PackedWeight>(new PackedWeight(Kind::SmallRows, isa, w.dtype));
        pw->m_src = w;
        pw->m_in = in;
        pw->m_out = out;
        pw->m_groups = many_rows && w.dtype != DType::BF16 && !env_is("FLOWEDGE_CPU_GEMM_GROUPS", "0") && gemm_groups_fit(isa, out);
        std::size_t bytes = pw->layout_bytes(w.dtype == DType::BF16 ? PackedLayout::Pairs : PackedLayout::F32);
        if (pw->m_groups) bytes = std::max(bytes, pw->layout_bytes(PackedLayout::F32Groups));
        // AMX's tile order pads the pairs to whole tiles: room for it too where BF16 math may ask for it.
        if (isa == Isa::Avx512 && bf16_math_available() && (in + 31) / 32 * 16 <= kPackBhPairs)
            bytes = std::max(bytes, pw->layout_bytes(PackedLayout::PairTiles));
        Memory<Cpu>::check_fits(bytes, "packed linear copy");
        pw->m_buf = Buffer<std::byte, Cpu>(bytes);
        pw->set_math(m);
        return pw;
    }

    Kind kind() const { return m_kind; }
    Isa isa() const { return m_isa; }
    DType dtype() const { return m_dtype; }
    /// ConvBlocks: whether the blocks hold int8 weights and scales (LoadOptions::quantize = Int8 or W8A8), not m_dtype
    /// values.
    bool int8() const { return m_int8; }
    /// What the kernels take: the blocks, or for int8() the avx2::Int8Blocks naming them and their kind.
    const void* data() const {
#if defined(FLOWEDGE_CPU_X86)
        if (m_int8) return &m_int8_blocks;
#endif
        return m_buf.data();
    }
    int in() const { return m_in; }
    int out() const { return m_out; }
    /// Conv2dBlocks: Winograd's transformed copy (kernels/conv2d_winograd.hpp), or null where none was made.
    const float* winograd() const { return m_wino.bytes() ? reinterpret_cast<const float*>(m_wino.data()) : nullptr; }
    PackedLayout layout() const { return m_layout; }

    std::size_t bytes() const override { return m_buf.bytes() + m_wino.bytes(); }
    bool replaces_source() const override { return m_kind != Kind::SmallRows; }

    /// SmallRows: repacks in place (no allocation) when arithmetic m needs another layout than the one held. Under
    /// MathMode::BF16 (where the CPU has it), F32/F16 weights take BF16-rounded pairs; otherwise the F32 layout.
    /// ConvBlocks and Conv2dBlocks serve every mode exactly: nothing to do.
    void set_math(MathMode m) override {
        if (m_kind != Kind::SmallRows) return;
        const PackedLayout want = wanted(m);
        const bool round = (want == PackedLayout::Pairs || want == PackedLayout::PairTiles) && m_src.dtype != DType::BF16;
        if (want == m_layout && round == m_rounded) return;
        if (want == PackedLayout::F32Groups) FLOWEDGE_CPU_SIMD_KERNEL(m_isa, gemm_groups_pack(m_src, m_in, m_out, m_buf.data()));
        else FLOWEDGE_CPU_SIMD_KERNEL(m_isa, packed_linear_pack(want, round, m_src, m_in, m_out, m_buf.data()));
        m_layout = want;
        m_rounded = round;
    }

    /// SmallRows: whether the layout held now computes p.math = m (else the row-major kernels must).
    bool serves(MathMode m) const {
        // F32/F16 weights hold rounded pairs exactly when wanted(m) is Pairs or PairTiles, so the layout alone decides.
        return m_layout != PackedLayout::None && m_layout == wanted(m) && (!bf16_math(m) || bh_fits());
    }
    /// SmallRows: whether p.math = m runs the vdpbf16ps loop for this shape (the row-major kernels' in > 8 rule).
    bool bf16_math(MathMode m) const { return m == MathMode::BF16 && m_in > 8 && bf16_math_available(); }

private:
    PackedWeight(Kind k, Isa isa, DType dt) : m_kind(k), m_isa(isa), m_dtype(dt) {}

    bool bh_fits() const { return (m_in + 31) / 32 * 16 <= kPackBhPairs; }
    PackedLayout wanted(MathMode m) const {
        const bool bh = bf16_math(m) && bh_fits();
        if (bh && m_isa == Isa::Avx512 && amx_bf16_available()) return PackedLayout::PairTiles;
        if (m_src.dtype == DType::BF16) return PackedLayout::Pairs;
        return bh ? PackedLayout::Pairs : m_groups ? PackedLayout::F32Groups : PackedLayout::F32;
    }
    static bool gemm_groups_fit([[maybe_unused]] Isa isa, [[maybe_unused]] int out) {
#if defined(FLOWEDGE_CPU_X86)
        if (isa == Isa::Avx512) return avx512::gemm_groups_fit(out);
        if (isa == Isa::Avx2) return avx2::gemm_groups_fit(out);
#endif
        return false;
    }
    std::size_t layout_bytes(PackedLayout l) const {
#if defined(FLOWEDGE_CPU_X86)
        if (l == PackedLayout::F32Groups)
            return m_isa == Isa::Avx512 ? avx512::gemm_groups_bytes(m_in, m_out) : avx2::gemm_groups_bytes(m_in, m_out);
        if (m_isa == Isa::Avx512) return avx512::packed_linear_bytes(l, m_in, m_out);
        if (m_isa == Isa::Avx2) return avx2::packed_linear_bytes(l, m_in, m_out);
#endif
        (void)l;
        fail(ErrorKind::Unsupported, "cpu packed linear", "packed weights need the AVX2 or AVX-512 kernel set");
    }

    Kind m_kind;
    Isa m_isa;
    DType m_dtype;
    Buffer<std::byte, Cpu> m_buf;
    Buffer<std::byte, Cpu> m_wino;  ///< Conv2dBlocks: Winograd's transformed copy (3x3 F32 weights, AVX-512 set), else empty
    bool m_int8 = false;
#if defined(FLOWEDGE_CPU_X86)
    avx2::Int8Blocks m_int8_blocks{};
#endif
    int m_in = 0, m_out = 0;  ///< SmallRows: in, out; Conv2dBlocks: reduction length in * kh * kw, out
    // SmallRows only
    WeightRef m_src{};
    PackedLayout m_layout = PackedLayout::None;
    bool m_rounded = false;
    bool m_groups = false;  ///< exact math on the F32Groups layout (a many-row weight)
};

/// The CPU's prepared form of a weight (see the file comment), or null when the process's kernel set reads the stored
/// tensor as it is. w: the bound tensor of `shape`; `what` names it in errors; q: LoadOptions::quantize for the
/// storage kinds it applies to (quantizable()). INT8 blocks exist in the AVX2 and AVX-512 sets only: the scalar and
/// Eigen sets fail rather than ignore the request.
inline std::unique_ptr<PreparedWeight> prepare_weight(Storage storage, const WeightRef& w, const Shape& shape, std::string_view what,
                                                      WeightQuant q = WeightQuant::None) {
    const Isa isa = active_isa();
    const bool int8 = q != WeightQuant::None;
    if (int8 && !quantizable(storage)) [[unlikely]]
        fail(ErrorKind::Internal, "cpu", std::string(what) + ": INT8 requested for a weight kind the packed conv kernels do not stream");
    const bool simd = isa == Isa::Avx2 || isa == Isa::Avx512;
    if (q == WeightQuant::W8A8 && !w8a8_available()) [[unlikely]]
        fail(ErrorKind::Unsupported, "cpu",
             std::string(what) + ": LoadOptions::quantize = W8A8 needs the AVX2 kernel set, or the AVX-512 set on a CPU with AVX512_VNNI" +
                 expected_got("an x86-64 CPU with AVX2 and FLOWEDGE_CPU_ISA unset, avx2 or (AVX512_VNNI CPUs) avx512, or quantize = Int8 / None",
                              "kernel set " + kernel_set_name()));
    if (int8 && !simd) [[unlikely]]
        fail(ErrorKind::Unsupported, "cpu",
             std::string(what) + ": LoadOptions::quantize = Int8 needs the AVX2 or AVX-512 kernel set (the only ones with INT8 kernels)" +
                 expected_got("an x86-64 CPU with AVX2 and FLOWEDGE_CPU_ISA unset, avx2 or avx512, or quantize = None",
                              "kernel set " + std::string(isa_name(isa))));
    // W8A8 applies to Conv1d weights; ConvTranspose1d and streamed Linear weights run weight-only (Int8).
    const WeightQuant weight_only = int8 ? WeightQuant::Int8 : WeightQuant::None;
    switch (storage) {
        case Storage::ConvWeight:
            if (simd) return PackedWeight::conv_blocks(w, shape, false, q, isa, what);
            return nullptr;
        case Storage::StreamedMatrix:
            if (simd) return PackedWeight::conv_blocks(w, shape, false, weight_only, isa, what);
            return nullptr;
        case Storage::ConvTransposeWeight:
            if (simd) return PackedWeight::conv_blocks(w, shape, true, weight_only, isa, what);
            return nullptr;
        case Storage::Conv2dWeight: {
            // FLOWEDGE_CPU_CONV2D_NO_PACK=1 keeps the stored layout (the im2col paths): the old path of an A/B run in
            // one process image, as FLOWEDGE_CUDA_CONV2D_NO_KSTREAM does on the GPU.
            if (simd && !env_is("FLOWEDGE_CPU_CONV2D_NO_PACK", "1"))
                return PackedWeight::conv2d_blocks(w, shape, isa, what);
            return nullptr;
        }
        case Storage::SmallRowsMatrix:
        case Storage::ManyRowsMatrix:
            if (simd)
                return PackedWeight::small_rows(w, int(shape.dims[1]), int(shape.dims[0]), isa, MathMode::F32,
                                                storage == Storage::ManyRowsMatrix);
            return nullptr;
        case Storage::Matrix:
        case Storage::Vector: return nullptr;
    }
    return nullptr;
}

/// The CPU's view of a WeightRef's prepared form (null when none); an Error when it was made for another kernel set.
inline const PackedWeight* packed_weight(const WeightRef& w) {
    if (!w.prepared) return nullptr;
    const auto* pw = static_cast<const PackedWeight*>(w.prepared);
    if (pw->isa() != active_isa()) [[unlikely]]
        fail(ErrorKind::Internal, "cpu", "weights packed for kernel set " + std::string(isa_name(pw->isa())) + " used by set " +
                        std::string(isa_name(active_isa())));
    return pw;
}

}  // namespace flowedge::cpu
