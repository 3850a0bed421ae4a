// MathMode on the CPU: Conv1dParams::math (TF32/BF16) is a request the CPU backend ignores, so every mode returns
// the exact F32 result bit for bit (the tensor-core path and its bounds are tested in test/cuda/test_cuda_conv_mma).
#include <algorithm>

#include "flowedge/workspace.hpp"
#include "ops_test_util.hpp"

using namespace optest;

TEST_CASE("Ops<Cpu>::conv1d ignores MathMode: TF32 and BF16 requests give the F32 result bit for bit") {
    struct Case { int batch, cin, cout, lin, kernel, stride, pad; };
    const Case cases[] = {{1, 8, 12, 16, 5, 1, 2}, {16, 40, 24, 16, 5, 1, 2}, {64, 32, 16, 8, 3, 2, 1}, {3, 7, 5, 9, 1, 1, 0}};
    std::uint32_t seed = 40;
    for (const Case& k : cases)
        for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
            CAPTURE(k.batch); CAPTURE(k.cin); CAPTURE(k.cout); CAPTURE(int(dt));
            const int lout = (k.lin + 2 * k.pad - k.kernel) / k.stride + 1;
            const auto x = random_vec(std::size_t(k.batch) * k.cin * k.lin, seed += 3);
            const auto bias = random_vec(k.cout, seed + 1);
            const HostWeights w = make_weights(std::size_t(k.cout) * k.cin * k.kernel, dt, seed + 2, 0.3f);
            const std::size_t ny = std::size_t(k.batch) * k.cout * lout;
            std::vector<float> y_f32(ny, -7.f), y_mode(ny, 7.f);
            Conv1dParams p;
            p.x = x.data();
            p.w = WeightRef{w.bytes.data(), dt};
            p.bias = bias.data();
            p.batch = k.batch; p.in_channels = k.cin; p.out_channels = k.cout; p.in_length = k.lin; p.out_length = lout;
            p.kernel = k.kernel; p.stride = k.stride; p.pad = k.pad;
            p.y = y_f32.data();
            Ops<Cpu>::conv1d(p);
            for (MathMode m : {MathMode::TF32, MathMode::BF16}) {
                std::fill(y_mode.begin(), y_mode.end(), 7.f);
                p.math = m;
                p.y = y_mode.data();
                Ops<Cpu>::conv1d(p);
                CHECK(std::memcmp(y_f32.data(), y_mode.data(), ny * sizeof(float)) == 0);
            }
        }
}

TEST_CASE("Context carries MathMode::F32 by default") {
    const Context<Cpu> ctx{};
    CHECK(ctx.math == MathMode::F32);
    const Conv1dParams p{};
    CHECK(p.math == MathMode::F32);
}
