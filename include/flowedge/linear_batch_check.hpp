// Argument validation of LinearBatchParams, shared by Ops<Cpu>::linear_batch and the CUDA launcher so both reject
// the same misuse with the same flowedge::Error text naming the offending item.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "flowedge/error.hpp"
#include "flowedge/op_params.hpp"

namespace flowedge {

/// Throws flowedge::Error "flowedge: <component>: item <i>: <what> (expected X, got Y)" unless
/// 1 <= n_items <= kMaxLinearBatch, every item is a valid LinearParams (sizes, strides, non-null pointers when
/// rows > 0, known weight dtype) and no item's output overlaps another item's input or output.
inline void check_linear_batch(const LinearBatchParams& p, std::string_view component) {
    // Messages are built only on failure: the CPU path must not allocate.
    if (!(p.n_items >= 1 && p.n_items <= kMaxLinearBatch)) [[unlikely]]
        fail(component, "item count out of range" + expected_got("1.." + std::to_string(kMaxLinearBatch), p.n_items));
    auto item_fail = [&](int i, const std::string& what) { fail(component, "item " + std::to_string(i) + ": " + what); };
    struct Range {
        std::uintptr_t lo = 0, hi = 0;
    };
    Range xr[kMaxLinearBatch], yr[kMaxLinearBatch];
    for (int i = 0; i < p.n_items; ++i) {
        const LinearParams& q = p.items[i];
        if (!(q.rows >= 0 && q.in > 0 && q.out > 0))
            item_fail(i, "sizes must be positive" + expected_got("rows >= 0, in > 0, out > 0",
                                                                 "rows " + std::to_string(q.rows) + ", in " + std::to_string(q.in) +
                                                                     ", out " + std::to_string(q.out)));
        const int ld_x = q.ld_x ? q.ld_x : q.in, ld_y = q.ld_y ? q.ld_y : q.out;
        if (!(q.ld_x >= 0 && q.ld_y >= 0 && ld_x >= q.in && ld_y >= q.out))
            item_fail(i, "row stride shorter than the row" +
                             expected_got("ld_x >= in and ld_y >= out", std::to_string(q.ld_x) + "/" + std::to_string(q.ld_y)));
        if (!(q.w.dtype == DType::F32 || q.w.dtype == DType::BF16 || q.w.dtype == DType::F16))
            item_fail(i, "unknown weight dtype" + expected_got("F32, BF16 or F16", int(q.w.dtype)));
        if (q.rows == 0) continue;
        if (!q.x || !(q.w.data || q.w.prepared) || !q.y) item_fail(i, "null x, w or y pointer");
        const auto at = [](const float* base, std::int64_t n) {
            return Range{reinterpret_cast<std::uintptr_t>(base), reinterpret_cast<std::uintptr_t>(base + n)};
        };
        xr[i] = at(q.x, std::int64_t(q.rows - 1) * ld_x + q.in);
        yr[i] = at(q.y, std::int64_t(q.rows - 1) * ld_y + q.out);
    }
    const auto overlap = [](Range a, Range b) { return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi; };
    for (int i = 0; i < p.n_items; ++i)
        for (int j = 0; j < p.n_items; ++j) {
            if (i == j) continue;
            if (overlap(yr[i], xr[j]))
                item_fail(i, "output overlaps the input of item " + std::to_string(j) + " (items must be independent)");
            if (j > i && overlap(yr[i], yr[j]))
                item_fail(i, "output overlaps the output of item " + std::to_string(j) + " (items must be independent)");
        }
}

}  // namespace flowedge
