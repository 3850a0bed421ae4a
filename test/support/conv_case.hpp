// One Conv1d / ConvTranspose1d shape for the op tests that run it through several kernels and references
// (test/ops: conv1d, conv_transpose1d, int8_weights, math_mode), and the params struct that describes it, so each
// test states only what differs.
#pragma once
#include "flowedge/op_params.hpp"

namespace fe_test {

/// x: [batch, cin, lin]; Conv1d weight [cout, cin, kernel] (ConvTranspose1d: [cin, cout, kernel]).
struct ConvCase {
    int batch, cin, cout, lin, kernel, stride, pad;
    bool bias = true;  ///< for tests that run the op with and without a bias (the params take the pointer)
    /// Conv1d output length (PyTorch's formula, dilation 1).
    int conv_out() const { return (lin + 2 * pad - kernel) / stride + 1; }
    /// ConvTranspose1d output length (no output padding).
    int transpose_out() const { return (lin - 1) * stride - 2 * pad + kernel; }
};

/// The Conv1dParams of k on x, w and bias (y to be set by the caller; math F32).
inline flowedge::Conv1dParams conv1d_params(const ConvCase& k, const float* x, const flowedge::WeightRef& w, const float* bias) {
    flowedge::Conv1dParams p;
    p.x = x;
    p.w = w;
    p.bias = bias;
    p.batch = k.batch;
    p.in_channels = k.cin;
    p.out_channels = k.cout;
    p.in_length = k.lin;
    p.out_length = k.conv_out();
    p.kernel = k.kernel;
    p.stride = k.stride;
    p.pad = k.pad;
    return p;
}

/// The ConvTranspose1dParams of k on x, w and bias (y to be set by the caller).
inline flowedge::ConvTranspose1dParams conv_transpose1d_params(const ConvCase& k, const float* x, const flowedge::WeightRef& w,
                                                               const float* bias) {
    flowedge::ConvTranspose1dParams p;
    p.x = x;
    p.w = w;
    p.bias = bias;
    p.batch = k.batch;
    p.in_channels = k.cin;
    p.out_channels = k.cout;
    p.in_length = k.lin;
    p.out_length = k.transpose_out();
    p.kernel = k.kernel;
    p.stride = k.stride;
    p.pad = k.pad;
    return p;
}

}  // namespace fe_test
