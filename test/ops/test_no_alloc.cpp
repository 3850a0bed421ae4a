// Proves the CPU ops never touch the heap: a replaced global operator new counts every allocation while a
// batch of every op (including the large, parallel and chunked conv paths) runs, on row-major weights and on every
// packed weight form prepared at load.
#include <doctest/doctest.h>

#include "../support/counting_new.hpp"

#include <vector>

#include "flowedge/cpu/memory.hpp"
#include "flowedge/ops.hpp"

using namespace flowedge;

TEST_CASE("a batch of Ops<Cpu> calls performs zero heap allocations") {
    // All buffers are allocated up front (this is the 'load').
    std::vector<float> x(4096 * 16, 0.25f), y(4096 * 16), w(2048 * 2048 * 5 / 4, 0.01f), small(4096, 0.5f);
    std::vector<std::uint16_t> w16(1024 * 1024 * 5, 0x3c00);
    std::vector<std::int32_t> ids{0, 1, 2};
    std::vector<float> state(4096), z(4096, 1.f);
    const std::size_t before_new = fe_test::g_operator_new_calls.load();
    const std::size_t before_mem = Memory<Cpu>::allocation_count().load();

    for (int rep = 0; rep < 2; ++rep) {
        Conv1dParams c;
        c.x = x.data(); c.w = {w.data(), DType::F32}; c.bias = small.data(); c.y = y.data();
        c.in_channels = 1024; c.out_channels = 1024; c.in_length = 4; c.out_length = 4; c.kernel = 5; c.pad = 2;
        Ops<Cpu>::conv1d(c);  // parallel path
        c.in_channels = 4096; c.out_channels = 64;
        Ops<Cpu>::conv1d(c);  // im2col panel split over input channels
        c.w = {w16.data(), DType::BF16}; c.in_channels = 512; c.out_channels = 512; c.in_length = 16; c.out_length = 16;
        Ops<Cpu>::conv1d(c);
        // MathMode::BF16 (vdpbf16ps kernels where built for AVX512_BF16): BF16 panel and BF16 x rows on the stack.
        c.math = MathMode::BF16;
        Ops<Cpu>::conv1d(c);
        c.w = {w.data(), DType::F32}; c.in_channels = 4096; c.out_channels = 64; c.in_length = 16; c.out_length = 16;
        Ops<Cpu>::conv1d(c);  // two BF16 panel passes over the input channels
        c.math = MathMode::F32;
        ConvTranspose1dParams t;
        t.x = x.data(); t.w = {w16.data(), DType::F16}; t.bias = small.data(); t.y = y.data();
        t.in_channels = 1024; t.out_channels = 1024; t.in_length = 4; t.out_length = 8;
        Ops<Cpu>::conv_transpose1d(t);
        LinearParams l;
        l.x = x.data(); l.w = {w.data(), DType::F32}; l.bias = small.data(); l.y = y.data();
        l.rows = 20; l.in = 260; l.out = 2048; l.act = Activation::Mish;
        Ops<Cpu>::linear(l);
        l.math = MathMode::BF16;
        Ops<Cpu>::linear(l);  // BF16 x rows, parallel
        l.rows = 12; l.in = 3000; l.out = 16;
        Ops<Cpu>::linear(l);  // two passes of BF16 x rows
        l.rows = 1; l.in = 256; l.out = 256; l.act = Activation::Silu;
        Ops<Cpu>::linear(l);  // batch-1 GEMV
        l.rows = 20; l.in = 260; l.out = 2048; l.act = Activation::Mish; l.math = MathMode::F32;
        LinearBatchParams lb;  // FiLM-style batch: two items reading x, writing disjoint parts of y
        lb.n_items = 2;
        lb.items[0] = l;
        lb.items[0].rows = 1;
        lb.items[1] = lb.items[0];
        lb.items[1].w = {w16.data(), DType::F16};
        lb.items[1].out = 1024;
        lb.items[1].y = y.data() + 2048;
        Ops<Cpu>::linear_batch(lb);
        GroupNormParams g;
        g.x = x.data(); g.gamma = small.data(); g.beta = small.data(); g.y = y.data();
        g.channels = 512; g.length = 16; g.groups = 8; g.act = Activation::Mish; g.film = small.data(); g.residual = x.data();
        Ops<Cpu>::group_norm(g);
        RmsNormParams r;
        r.x = x.data(); r.weight = small.data(); r.y = y.data(); r.rows = 4; r.dim = 128;
        Ops<Cpu>::rms_norm(r);
        Ops<Cpu>::activation({x.data(), y.data(), 1000, Activation::Silu});
        AxpbyParams a;
        a.x = x.data(); a.y = y.data(); a.out = y.data(); a.n = 1000; a.a = 0.5f; a.b = 0.5f;
        Ops<Cpu>::axpby(a);
        Ops<Cpu>::concat_channels({x.data(), x.data(), y.data(), 1, 8, 8, 4});
        SinusoidParams s;
        s.t = 3.f; s.out = y.data(); s.half = 64; s.denom = 63.f;
        Ops<Cpu>::sinusoid(s);
        EmbeddingParams e;
        e.ids = ids.data(); e.table = {w16.data(), DType::BF16}; e.y = y.data(); e.rows = 3; e.dim = 128;
        Ops<Cpu>::embedding(e);
        CausalConvParams cc;
        cc.x = x.data(); cc.w = {w.data(), DType::F32}; cc.bias = small.data(); cc.state = state.data(); cc.u = y.data();
        cc.length = 4; cc.channels = 256; cc.kernel = 4;
        Ops<Cpu>::causal_conv(cc);
        SelectiveScanParams sc;
        sc.u = x.data(); sc.dt = small.data(); sc.A = small.data(); sc.B = x.data(); sc.C = x.data(); sc.D = small.data();
        sc.z = z.data(); sc.state = state.data(); sc.y = y.data(); sc.length = 4; sc.channels = 256; sc.d_state = 16;
        Ops<Cpu>::selective_scan(sc);
        DiffusionStepParams d;
        d.x = y.data(); d.eps = x.data(); d.per_sample = 32; d.kind = StepKind::Ddpm; d.sqrt_abar = 0.5f;
        d.sqrt_one_minus_abar = 0.8f; d.c_x0 = 0.3f; d.c_other = 0.6f; d.noise_std = 0.1f; d.seed = 5;
        Ops<Cpu>::diffusion_step(d);
        UnnormalizeParams u;
        u.x = x.data(); u.y = y.data(); u.min = small.data(); u.max = z.data(); u.rows = 16; u.dim = 2;
        Ops<Cpu>::unnormalize(u);
        // The image ops: conv2d on its position-split (stem) and channel-split, two-chunk (layer4) paths, 16-bit
        // weights (widened on the stack), pooling, resize with a strong antialiased shrink, the rest.
        Conv2dParams c2;
        c2.x = x.data(); c2.w = {w.data(), DType::F32}; c2.bias = small.data(); c2.y = y.data();
        c2.in_channels = 3; c2.out_channels = 32; c2.in_h = 84; c2.in_w = 84; c2.out_h = 42; c2.out_w = 42;
        c2.kernel_h = 7; c2.kernel_w = 7; c2.stride_h = 2; c2.stride_w = 2; c2.pad_h = 3; c2.pad_w = 3; c2.act = Activation::Relu;
        Ops<Cpu>::conv2d(c2);
        c2.in_channels = 512; c2.out_channels = 512; c2.in_h = 3; c2.in_w = 3; c2.out_h = 3; c2.out_w = 3;
        c2.kernel_h = 3; c2.kernel_w = 3; c2.stride_h = 1; c2.stride_w = 1; c2.pad_h = 1; c2.pad_w = 1; c2.residual = x.data();
        Ops<Cpu>::conv2d(c2);
        c2.w = {w16.data(), DType::BF16};
        Ops<Cpu>::conv2d(c2);
        MaxPool2dParams mp;
        mp.x = x.data(); mp.y = y.data(); mp.channels = 32; mp.in_h = 42; mp.in_w = 42; mp.out_h = 21; mp.out_w = 21;
        Ops<Cpu>::max_pool2d(mp);
        ResizeParams rs;
        rs.x = x.data(); rs.y = y.data(); rs.planes = 3; rs.in_h = 96; rs.in_w = 128; rs.resized_h = 24; rs.resized_w = 32;
        rs.top = 2; rs.left = 4; rs.out_h = 20; rs.out_w = 24;
        Ops<Cpu>::resize(rs);
        ImageToTensorParams it;
        it.x = w16.data(); it.layout = ImageLayout::U8Hwc; it.y = y.data(); it.offset = small.data(); it.denom = z.data();
        it.height = 96; it.width = 96; it.top = 6; it.left = 6; it.out_h = 84; it.out_w = 84;
        Ops<Cpu>::image_to_tensor(it);
        NormalizeParams nm;
        nm.x = x.data(); nm.y = y.data(); nm.offset = small.data(); nm.denom = z.data(); nm.rows = 4; nm.dim = 10;
        Ops<Cpu>::normalize(nm);
        SpatialSoftmaxParams ss;
        ss.x = x.data(); ss.pos_grid = x.data(); ss.y = y.data(); ss.rows = 32; ss.positions = 9;
        Ops<Cpu>::spatial_softmax(ss);
    }
    CHECK(fe_test::g_operator_new_calls.load() == before_new);
    CHECK(Memory<Cpu>::allocation_count().load() == before_mem);
}

TEST_CASE("Ops<Cpu> on weights packed at load performs zero heap allocations on every packed conv path") {
    // The packed kernels (AVX2 and AVX-512 sets) keep their panels, B-tile buffers and sums on the stack: exact F32 /
    // BF16 / INT8 blocks, MathMode::BF16 on BF16 blocks (vdpbf16ps and AMX tdpbf16ps), W8A8 (vpdpbusd and AMX tdpbusd)
    // and INT8 blocks under MathMode::BF16 (AMX, int8 widened per tile). Ops<Cpu>::conv1d runs the process's choice;
    // the AMX and vector kernels are also called directly so one run covers both where the CPU has AMX.
    const cpu::Isa isa = cpu::active_isa();
    if (isa != cpu::Isa::Avx2 && isa != cpu::Isa::Avx512) {
        MESSAGE("kernel set " << cpu::kernel_set_name() << " packs no conv weights");
        return;
    }
    // Load: the weights of a 1024 -> 1024, kernel-5 Conv1d in every packed form, an INT8 ConvTranspose1d and an INT8
    // streamed Linear.
    std::vector<float> x(1024 * 64, 0.25f), y(1024 * 128), w(1024 * 1024 * 5, 0.01f), small(4096, 0.5f);
    std::vector<std::uint16_t> w16(1024 * 1024 * 5, 0x3c00);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 13) - 6) * 0.125f;  // varied columns (W8A8 ranges)
    const Shape conv{1024, 1024, 5};
    auto prepare = [](Storage s, WeightRef r, const Shape& shape, WeightQuant q) {
        return Ops<Cpu>::prepare_weight(s, r, shape, "test weight", q);
    };
    const auto f32 = prepare(Storage::ConvWeight, {w.data(), DType::F32}, conv, WeightQuant::None);
    const auto bf = prepare(Storage::ConvWeight, {w16.data(), DType::BF16}, conv, WeightQuant::None);
    const auto i8 = prepare(Storage::ConvWeight, {w.data(), DType::F32}, conv, WeightQuant::Int8);
    const auto w8 = cpu::w8a8_available() ? prepare(Storage::ConvWeight, {w.data(), DType::F32}, conv, WeightQuant::W8A8) : nullptr;
    const auto t8 = prepare(Storage::ConvTransposeWeight, {w.data(), DType::F32}, Shape{1024, 1024, 4}, WeightQuant::Int8);
    const auto l8 = prepare(Storage::StreamedMatrix, {w.data(), DType::F32}, Shape{2048, 1024}, WeightQuant::Int8);
    const std::size_t before_new = fe_test::g_operator_new_calls.load();
    const std::size_t before_mem = Memory<Cpu>::allocation_count().load();

    int calls = 0;
    for (int rep = 0; rep < 2; ++rep)
        for (int batch : {1, 16}) {  // 4 columns (the PushT L = 4 convs, parallel), 64 columns (two AMX passes of 32)
            Conv1dParams c;
            c.x = x.data(); c.bias = small.data(); c.y = y.data(); c.batch = batch;
            c.in_channels = 1024; c.out_channels = 1024; c.in_length = 4; c.out_length = 4; c.kernel = 5; c.pad = 2;
            for (const auto* pw : {f32.get(), bf.get(), i8.get(), w8.get()}) {
                if (!pw) continue;
                c.w = {nullptr, pw == bf.get() ? DType::BF16 : DType::F32, pw};
                for (MathMode m : {MathMode::F32, MathMode::BF16}) {
                    c.math = m;
                    Ops<Cpu>::conv1d(c);
                    ++calls;
                }
            }
#if defined(FLOWEDGE_CPU_X86)
            if (isa == cpu::Isa::Avx512) {
                namespace dot = cpu::avx512::packed_dot;
                c.math = MathMode::BF16;
                const auto* bh = static_cast<const bf16*>(cpu::packed_weight({nullptr, DType::BF16, bf.get()})->data());
                const auto* q8 = static_cast<const cpu::avx2::Int8Blocks*>(cpu::packed_weight({nullptr, DType::F32, i8.get()})->data());
                if (cpu::bf16_math_available()) dot::conv1d_bh(c, bh), ++calls;
                if (cpu::amx_bf16_available()) {
                    dot::amx::conv1d_bh_amx(c, bh);
                    dot::amx::conv1d_int8_bh_amx(c, q8->data);
                    calls += 2;
                }
                if (w8) {
                    const auto* q = static_cast<const cpu::avx2::Int8Blocks*>(cpu::packed_weight({nullptr, DType::F32, w8.get()})->data());
                    dot::conv1d_w8a8(c, q->data), ++calls;
                    if (cpu::amx_int8_available()) dot::amx::conv1d_w8a8_amx(c, q->data), ++calls;
                }
            }
#endif
            ConvTranspose1dParams t;
            t.x = x.data(); t.w = {nullptr, DType::F32, t8.get()}; t.bias = small.data(); t.y = y.data(); t.batch = batch;
            t.in_channels = 1024; t.out_channels = 1024; t.in_length = 4; t.out_length = 8; t.kernel = 4; t.stride = 2; t.pad = 1;
            Ops<Cpu>::conv_transpose1d(t);
            LinearParams l;
            l.x = x.data(); l.w = {nullptr, DType::F32, l8.get()}; l.bias = small.data(); l.y = y.data();
            l.rows = batch; l.in = 1024; l.out = 2048;
            for (MathMode m : {MathMode::F32, MathMode::BF16}) {
                l.math = m;
                Ops<Cpu>::linear(l);
            }
            calls += 3;
        }
    const std::size_t after_new = fe_test::g_operator_new_calls.load(), after_mem = Memory<Cpu>::allocation_count().load();
    MESSAGE("kernel set " << cpu::kernel_set_name() << ": " << calls << " calls on packed weights");
    CHECK(after_new == before_new);
    CHECK(after_mem == before_mem);
}

TEST_CASE("Ops<Cpu>::conv2d on packed Conv2d weights (direct blocks, band path and Winograd) performs zero heap allocations") {
    const cpu::Isa isa = cpu::active_isa();
    if (isa != cpu::Isa::Avx2 && isa != cpu::Isa::Avx512) {
        MESSAGE("kernel set " << cpu::kernel_set_name() << " packs no Conv2d weights");
        return;
    }
    // Load: a 64 -> 64 3x3 F32 weight (with Winograd's transformed copy) and the activations.
    std::vector<float> w(64 * 64 * 9, 0.01f), x(64 * 40 * 40, 0.25f), y(64 * 40 * 40), res(64 * 40 * 40, 0.5f), bias(64, 0.1f);
    const auto prepared = Ops<Cpu>::prepare_weight(Storage::Conv2dWeight, {w.data(), DType::F32}, Shape{64, 64, 3, 3}, "test weight");
    REQUIRE(prepared);
    const std::size_t before_new = fe_test::g_operator_new_calls.load();
    const std::size_t before_mem = Memory<Cpu>::allocation_count().load();
    for (int rep = 0; rep < 2; ++rep) {
        Conv2dParams p;
        p.x = x.data(); p.w = {nullptr, DType::F32, prepared.get()}; p.bias = bias.data(); p.y = y.data();
        p.in_channels = 64; p.out_channels = 64; p.in_h = 40; p.in_w = 40; p.out_h = 40; p.out_w = 40;
        p.kernel_h = 3; p.kernel_w = 3; p.pad_h = 1; p.pad_w = 1; p.act = Activation::Relu; p.residual = res.data();
        Ops<Cpu>::conv2d(p);  // 40x40 stride 1: Winograd, parallel over tile blocks
        p.in_h = p.in_w = p.out_h = p.out_w = 3;
        Ops<Cpu>::conv2d(p);  // 3x3 map: the direct path
        p.in_h = p.in_w = 40; p.out_h = p.out_w = 20; p.stride_h = p.stride_w = 2; p.residual = nullptr;
        Ops<Cpu>::conv2d(p);  // stride 2: the band path (AVX-512) or im2col panel
    }
    CHECK(fe_test::g_operator_new_calls.load() == before_new);
    CHECK(Memory<Cpu>::allocation_count().load() == before_mem);
}
