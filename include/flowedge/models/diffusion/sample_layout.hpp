// Moves diffusion samples between the API's layout [batch, horizon, action_dim] and the U-Net's
// [batch, action_dim, horizon], exactly, with the backend's batched linear op.
#pragma once
#include <cstddef>
#include <vector>

#include "flowedge/ops.hpp"
#include "flowedge/tensor.hpp"
#include "flowedge/workspace.hpp"

namespace flowedge {

/// Per-sample transposes [H, A] <-> [A, H] done as linears against identity matrices: y_b = I @ x_b^T. Exact (one
/// non-zero product per output), kMaxLinearBatch samples per op (one launch on the GPU), always in F32 math.
template <Backend B>
class SampleLayout {
public:
    SampleLayout() = default;
    /// Uploads the identity matrices I_A [A, A] and I_H [H, H].
    SampleLayout(int action_dim, int horizon) : m_action_dim(action_dim), m_horizon(horizon) {
        m_eye_a = identity(action_dim);
        m_eye_h = identity(horizon);
    }

    /// x: [batch, horizon, action_dim] -> y: [batch, action_dim, horizon].
    void to_unet(Context<B>& ctx, const float* x, float* y, int batch) const {
        transpose(ctx, m_eye_a.data(), x, y, batch, m_action_dim, m_horizon);
    }
    /// x: [batch, action_dim, horizon] -> y: [batch, horizon, action_dim].
    void to_sample(Context<B>& ctx, const float* x, float* y, int batch) const {
        transpose(ctx, m_eye_h.data(), x, y, batch, m_horizon, m_action_dim);
    }

    std::size_t device_bytes() const { return m_eye_a.bytes() + m_eye_h.bytes(); }

private:
    static Buffer<float, B> identity(int n) {
        std::vector<float> eye(std::size_t(n) * std::size_t(n), 0.f);
        for (int i = 0; i < n; ++i) eye[std::size_t(i) * std::size_t(n) + std::size_t(i)] = 1.f;
        Buffer<float, B> buf(eye.size());
        Memory<B>::copy_from_host(buf.data(), eye.data(), eye.size() * sizeof(float));
        Memory<B>::synchronize();
        return buf;
    }

    /// For each sample b: y_b [rows, cols] = eye [rows, rows] @ x_b^T with x_b [cols, rows], i.e. the transpose of x_b,
    /// as linears (weights = the sample) batched kMaxLinearBatch per op.
    static void transpose(Context<B>& ctx, const float* eye, const float* x, float* y, int batch, int rows, int cols) {
        LinearBatchParams lb;
        for (int b = 0; b < batch; ++b) {
            LinearParams& p = lb.items[lb.n_items++];
            p = LinearParams{};
            p.x = eye;
            p.w = {x + std::size_t(b) * rows * cols, DType::F32};
            p.y = y + std::size_t(b) * rows * cols;
            p.rows = rows;
            p.in = rows;
            p.out = cols;
            if (lb.n_items == kMaxLinearBatch || b + 1 == batch) {
                Ops<B>::linear_batch(lb, ctx.stream);
                lb.n_items = 0;
            }
        }
    }

    int m_action_dim = 0, m_horizon = 0;
    Buffer<float, B> m_eye_a, m_eye_h;
};

}  // namespace flowedge
