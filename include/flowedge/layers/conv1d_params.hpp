// The parameter block Conv1d and ConvTranspose1d hand to Ops<B>: the fields their Conv1dParams /
// ConvTranspose1dParams share, from a layer's Config.
#pragma once

namespace flowedge::detail {

/// P (Conv1dParams or ConvTranspose1dParams) with the geometry of config `c` over `batch` x `in_length` columns
/// producing `out_length`; pointers, weight and math are the caller's.
template <class P, class Config>
P conv1d_geometry(const Config& c, int batch, int in_length, int out_length) {
    P p;
    p.batch = batch;
    p.in_channels = c.in;
    p.out_channels = c.out;
    p.in_length = in_length;
    p.out_length = out_length;
    p.kernel = c.kernel;
    p.stride = c.stride;
    p.pad = c.pad;
    return p;
}

}  // namespace flowedge::detail
