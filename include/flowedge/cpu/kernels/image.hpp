// The image-side ops of the LeRobot RGB encoder on the CPU: camera frames to normalised float CHW (image_to_tensor),
// torchvision Resize + crop window (resize), feature normalisation (normalize) and SpatialSoftmax keypoints
// (spatial_softmax). Kernel-set body: included once per instruction set by cpu/kernels.hpp; checks in Ops<Cpu>.

/// One value through NormalizeParams' formula (float32, in LeRobot's order).
inline float normalize_value(NormKind kind, float x, float offset, float denom) {
    switch (kind) {
        case NormKind::MeanStd: return (x - offset) / denom;
        case NormKind::MinMax: return 2.f * (x - offset) / denom - 1.f;
        case NormKind::Identity: break;
    }
    return x;
}

/// y[r, d] = norm(x[r, d]; offset[d], denom[d]) (x may equal y).
inline void normalize(const NormalizeParams& p) {
    for (int r = 0; r < p.rows; ++r) {
        const float* x = p.x + std::size_t(r) * p.dim;
        float* y = p.y + std::size_t(r) * p.dim;
        if (p.kind == NormKind::Identity) {
            if (x != y) std::memcpy(y, x, std::size_t(p.dim) * sizeof(float));
            continue;
        }
        for (int d = 0; d < p.dim; ++d) y[d] = normalize_value(p.kind, x[d], p.offset[d], p.denom[d]);
    }
}

/// Camera frames ([b, h, w, c] uint8 -> v / 255, or [b, c, h, w] float) to normalised [b, c, out_h, out_w], the
/// window at (top, left).
inline void image_to_tensor(const ImageToTensorParams& p) {
    const std::size_t out_plane = std::size_t(p.out_h) * p.out_w;
    for (int b = 0; b < p.batch; ++b)
        for (int c = 0; c < p.channels; ++c) {
            const float off = p.kind == NormKind::Identity ? 0.f : p.offset[c];
            const float den = p.kind == NormKind::Identity ? 1.f : p.denom[c];
            float* y = p.y + (std::size_t(b) * p.channels + c) * out_plane;
            for (int r = 0; r < p.out_h; ++r) {
                float* yr = y + std::size_t(r) * p.out_w;
                const std::size_t row = std::size_t(p.top + r);
                if (p.layout == ImageLayout::U8Hwc) {
                    const std::uint8_t* x = static_cast<const std::uint8_t*>(p.x) +
                                            ((std::size_t(b) * p.height + row) * p.width + std::size_t(p.left)) * p.channels + c;
                    for (int q = 0; q < p.out_w; ++q)
                        yr[q] = normalize_value(p.kind, float(x[std::size_t(q) * p.channels]) / 255.f, off, den);
                } else {
                    const float* x = static_cast<const float*>(p.x) +
                                     ((std::size_t(b) * p.channels + c) * p.height + row) * p.width + std::size_t(p.left);
                    for (int q = 0; q < p.out_w; ++q) yr[q] = normalize_value(p.kind, x[q], off, den);
                }
            }
        }
}

/// Taps of one output index along one resized axis: inputs start + j * step, j < count, with weights w[0, count)
/// (step 0 where PyTorch's bilinear upper tap is clamped onto the last pixel).
struct ResizeTaps {
    int start = 0, count = 0, step = 1;
};

/// Longest output window side resize takes (its per-index taps live on the stack).
inline constexpr int kResizeMaxOut = 1024;

/// The largest tap count resize_taps produces for in -> out (antialias widens the filter by in / out when shrinking).
inline int resize_max_taps(int in, int out, bool antialias) {
    if (!antialias) return 2;
    const float scale = float(in) / float(out);
    const float support = scale >= 1.f ? scale : 1.f;
    return int(std::ceil(support)) * 2 + 1;
}

/// PyTorch's taps for output index i of an axis in -> out, align_corners False (aten/src/ATen/native/cpu/
/// UpSampleKernel.cpp, float weights): with antialias, HelperInterpBase::_compute_indices_min_size_weights_aa
/// (triangle filter, support = scale when shrinking else 1, weights normalised to sum 1); without it, the two
/// bilinear taps of compute_indices_weights_linear (source index max(scale (i + 0.5) - 0.5, 0), the upper tap
/// clamped to the last pixel).
inline ResizeTaps resize_taps(int in, int out, bool antialias, int i, float* w) {
    const float scale = float(in) / float(out);
    ResizeTaps t;
    if (antialias) {
        const float support = scale >= 1.f ? scale : 1.f;
        const float center = float(double(scale) * (i + 0.5));
        const float invscale = scale >= 1.f ? 1.f / scale : 1.f;
        const int xmin = std::max(int(std::int64_t(double(center) - support + 0.5)), 0);
        const int xmax = std::min(int(std::int64_t(double(center) + support + 0.5)), in);
        const int max_taps = resize_max_taps(in, out, true);
        t.start = xmin;
        t.count = std::clamp(xmax - xmin, 0, max_taps);
        float total = 0.f;
        for (int j = 0; j < t.count; ++j) {
            const float x = std::fabs(float((j + xmin - double(center) + 0.5) * invscale));
            w[j] = x < 1.f ? 1.f - x : 0.f;
            total += w[j];
        }
        if (total != 0.f)
            for (int j = 0; j < t.count; ++j) w[j] /= total;
        return t;
    }
    const float real = std::max(scale * (float(i) + 0.5f) - 0.5f, 0.f);
    const int i0 = std::min(int(real), in - 1);
    const float l1 = std::min(std::max(real - float(i0), 0.f), 1.f);
    t.start = i0;
    t.count = 2;
    t.step = i0 < in - 1 ? 1 : 0;  // both taps on the last pixel: PyTorch adds it twice
    w[0] = 1.f - l1;
    w[1] = l1;
    return t;
}

/// torchvision Resize (bilinear, align_corners False) + crop window. With antialias, PyTorch's separable CPU path:
/// the width pass first (skipped when the width is unchanged), each output sum(x * w) in tap order in float, then the
/// height pass over those rows. Without it, per output (h0 h1 the height taps, w0 w1 the width taps):
/// (x[h0, w0] w0 + x[h0, w1] w1) h0 + (x[h1, w0] w0 + x[h1, w1] w1) h1, as PyTorch's generic 2-d kernel. Only the
/// window's rows and columns are computed. Scratch: the taps of both axes and one width-pass row on the stack.
inline void resize(const ResizeParams& p) {
    alignas(64) float scratch[kScratchFloats];
    const int kw = resize_max_taps(p.in_w, p.resized_w, p.antialias), kh = resize_max_taps(p.in_h, p.resized_h, p.antialias);
    float* wx = scratch;                                   // [out_w][kw]
    float* wy = wx + std::size_t(p.out_w) * kw;            // [out_h][kh]
    float* tmp = wy + std::size_t(p.out_h) * kh;           // [kh][out_w] width-pass rows of one output row
    ResizeTaps tx[kResizeMaxOut], ty[kResizeMaxOut];
    const bool same_w = p.in_w == p.resized_w, same_h = p.in_h == p.resized_h;
    for (int q = 0; q < p.out_w; ++q) {
        if (same_w) {
            tx[q] = {p.left + q, 1, 1};
            wx[std::size_t(q) * kw] = 1.f;
        } else {
            tx[q] = resize_taps(p.in_w, p.resized_w, p.antialias, p.left + q, wx + std::size_t(q) * kw);
        }
    }
    for (int r = 0; r < p.out_h; ++r) {
        if (same_h) {
            ty[r] = {p.top + r, 1, 1};
            wy[std::size_t(r) * kh] = 1.f;
        } else {
            ty[r] = resize_taps(p.in_h, p.resized_h, p.antialias, p.top + r, wy + std::size_t(r) * kh);
        }
    }
    const std::size_t in_plane = std::size_t(p.in_h) * p.in_w, out_plane = std::size_t(p.out_h) * p.out_w;
    for (int pl = 0; pl < p.planes; ++pl) {
        const float* x = p.x + std::size_t(pl) * in_plane;
        float* y = p.y + std::size_t(pl) * out_plane;
        for (int r = 0; r < p.out_h; ++r) {
            const ResizeTaps& a = ty[r];
            const float* wyr = wy + std::size_t(r) * kh;
            // The width pass of each input row this output row reads (the same float sums for every output row).
            for (int k = 0; k < a.count; ++k) {
                const float* xr = x + std::size_t(a.start + k * a.step) * p.in_w;
                float* tr = tmp + std::size_t(k) * p.out_w;
                for (int q = 0; q < p.out_w; ++q) {
                    const ResizeTaps& b = tx[q];
                    const float* wxq = wx + std::size_t(q) * kw;
                    float s = xr[b.start] * wxq[0];
                    for (int j = 1; j < b.count; ++j) s += xr[b.start + j * b.step] * wxq[j];
                    tr[q] = s;
                }
            }
            float* yr = y + std::size_t(r) * p.out_w;
            for (int q = 0; q < p.out_w; ++q) {
                float s = tmp[q] * wyr[0];
                for (int k = 1; k < a.count; ++k) s += tmp[std::size_t(k) * p.out_w + q] * wyr[k];
                yr[q] = s;
            }
        }
    }
}

/// LeRobot SpatialSoftmax: per row, softmax over the positions (float, max-subtracted), then the expected
/// pos_grid coordinates y[r, 0..1] = sum_p softmax[p] * pos_grid[p, 0..1] (sums in double, rounded once).
inline void spatial_softmax(const SpatialSoftmaxParams& p) {
    for (int r = 0; r < p.rows; ++r) {
        const float* x = p.x + std::size_t(r) * p.positions;
        float m = -INFINITY;
        bool nan = false;
        for (int i = 0; i < p.positions; ++i) {
            nan |= std::isnan(x[i]);
            m = std::max(m, x[i]);
        }
        double sum = 0, sx = 0, sy = 0;
        for (int i = 0; i < p.positions; ++i) {
            const float e = std::exp(x[i] - m);
            sum += e;
            sx += double(e) * p.pos_grid[2 * std::size_t(i)];
            sy += double(e) * p.pos_grid[2 * std::size_t(i) + 1];
        }
        p.y[2 * std::size_t(r)] = nan ? NAN : float(sx / sum);
        p.y[2 * std::size_t(r) + 1] = nan ? NAN : float(sy / sum);
    }
}
