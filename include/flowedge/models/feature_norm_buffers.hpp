// A LeRobot feature normalisation (MEAN_STD / MIN_MAX / IDENTITY, io::FeatureNorm) uploaded to a backend, and the op
// that applies it to one row: the policies (Diffusion Policy, ACT) normalise their state, environment state and
// frames with it before the network, as LeRobot's NormalizerProcessorStep does.
#pragma once
#include "flowedge/models/diffusion/lerobot_policy_folder.hpp"
#include "flowedge/op_params.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/tensor.hpp"

namespace flowedge {

/// One feature's statistics on B: offset and denominator per element ([dim]; per channel for frames); none for
/// NormKind::Identity.
template <Backend B>
struct FeatureNormBuffers {
    NormKind kind = NormKind::Identity;
    Buffer<float, B> offset, denom;

    /// Copies `n` to B (load time: allocates).
    static FeatureNormBuffers upload(const io::FeatureNorm& n) {
        FeatureNormBuffers b;
        b.kind = n.kind;
        if (n.kind == NormKind::Identity) return b;
        b.offset = Buffer<float, B>(n.offset.size());
        b.denom = Buffer<float, B>(n.denom.size());
        Memory<B>::copy_from_host(b.offset.data(), n.offset.data(), n.offset.size() * sizeof(float));
        Memory<B>::copy_from_host(b.denom.data(), n.denom.data(), n.denom.size() * sizeof(float));
        return b;
    }

    /// y = normalised x for one row of `dim` values on B (x may equal y); Ops<B>::normalize.
    void apply(const float* x, float* y, int dim, Stream stream) const {
        NormalizeParams p;
        p.x = x;
        p.y = y;
        p.offset = offset.data();
        p.denom = denom.data();
        p.rows = 1;
        p.dim = dim;
        p.kind = kind;
        Ops<B>::normalize(p, stream);
    }
};

}  // namespace flowedge
