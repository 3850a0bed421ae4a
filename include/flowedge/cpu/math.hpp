// Scalar activations with PyTorch's float32 semantics and the scalar widening of stored weights, shared by every
// CPU kernel set (the vector forms live in each set's vocabulary, cpu/arch/*.hpp).
#pragma once
#include <cmath>

#include "flowedge/dtype.hpp"
#include "flowedge/op_params.hpp"

namespace flowedge::cpu {

/// torch.nn.SiLU: x * sigmoid(x), as x / (1 + exp(-x)) (exp overflow gives -0 for very negative x).
inline float silu(float x) { return x / (1.f + std::exp(-x)); }

/// torch.nn.functional.softplus with beta 1, threshold 20: x when x > 20, else log1p(exp(x)).
inline float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

/// torch.nn.Mish: x * tanh(softplus(x)).
inline float mish(float x) { return x * std::tanh(softplus(x)); }

/// torch.nn.ReLU: max(x, 0) with NaN passed through (x < 0 is false for NaN) and -0 kept, as vmaxps(0, x).
inline float relu(float x) { return x < 0.f ? 0.f : x; }

/// Applies `act` to one value.
inline float activate(Activation act, float x) {
    switch (act) {
        case Activation::None: return x;
        case Activation::Silu: return silu(x);
        case Activation::Mish: return mish(x);
        case Activation::Softplus: return softplus(x);
        case Activation::Relu: return relu(x);
    }
    return x;
}

/// Applies `act` in place to n contiguous values one at a time (the portable set, and the SIMD sets' non-vector
/// fallback), the switch hoisted out of the loop.
inline void activate_scalar(Activation act, float* v, long long n) {
    switch (act) {
        case Activation::None: return;
        case Activation::Silu:
            for (long long i = 0; i < n; ++i) v[i] = silu(v[i]);
            return;
        case Activation::Mish:
            for (long long i = 0; i < n; ++i) v[i] = mish(v[i]);
            return;
        case Activation::Softplus:
            for (long long i = 0; i < n; ++i) v[i] = softplus(v[i]);
            return;
        case Activation::Relu:
            for (long long i = 0; i < n; ++i) v[i] = relu(v[i]);
            return;
    }
}

/// Scalar widening of one stored element (tails and small ops).
inline float widen(float v) { return v; }
inline float widen(bf16 v) { return to_float(v); }
inline float widen(f16 v) { return to_float(v); }

}  // namespace flowedge::cpu
