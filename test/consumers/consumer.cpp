// A downstream program using flowedge header-only on the CPU: one Linear through Ops<Cpu>, checked by hand.
#include <cmath>
#include <cstdio>

#include <flowedge/ops.hpp>

int main() {
    // y = x @ W^T + b with W = [[1, 2], [3, 4], [5, 6]], x = [1, -1], b = [0.5, 0, -0.5]  ->  [-0.5, -1, -1.5]
    const float w[6] = {1, 2, 3, 4, 5, 6};
    const float x[2] = {1, -1};
    const float b[3] = {0.5f, 0.f, -0.5f};
    float y[3] = {0, 0, 0};
    flowedge::LinearParams p;
    p.x = x;
    p.w = {w, flowedge::DType::F32};
    p.bias = b;
    p.y = y;
    p.rows = 1;
    p.in = 2;
    p.out = 3;
    flowedge::Ops<flowedge::Cpu>::linear(p);
    const float want[3] = {-0.5f, -1.f, -1.5f};
    for (int i = 0; i < 3; ++i) {
        if (std::fabs(y[i] - want[i]) > 1e-6f) {
            std::printf("consumer: y[%d] = %g, expected %g\n", i, y[i], want[i]);
            return 1;
        }
    }
    std::printf("consumer ok: flowedge %s\n", FLOWEDGE_CONSUMER_KIND);
    return 0;
}
