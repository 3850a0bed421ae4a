// The result comparisons the op tests of every backend share (ops/ops_test_util.hpp, cuda/cuda_test_util.hpp).
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace fe_test {

/// max |a - b| / max |b| (b the reference); NaN anywhere counts as a failure (returns +inf).
template <class R>
double max_norm_rel(const std::vector<float>& a, const std::vector<R>& b) {
    REQUIRE(a.size() == b.size());
    double err = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(a[i]) || std::isnan(double(b[i]))) return INFINITY;
        err = std::max(err, std::fabs(double(a[i]) - double(b[i])));
        scale = std::max(scale, std::fabs(double(b[i])));
    }
    return scale > 0 ? err / scale : err;
}

/// Elementwise: every |a - b| <= abs_tol + rel_tol * |b|.
inline void check_elementwise(const std::vector<float>& a, const std::vector<float>& b, double rel_tol, double abs_tol,
                              const std::string& what) {
    REQUIRE(a.size() == b.size());
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const double d = std::fabs(double(a[i]) - double(b[i]));
        if (!(d <= abs_tol + rel_tol * std::fabs(double(b[i])))) {
            if (!bad) first = i;
            ++bad;
        }
    }
    INFO(what << ": " << bad << " of " << a.size() << " elements out of tolerance; first at " << first << " ("
              << (bad ? a[first] : 0.f) << " vs " << (bad ? b[first] : 0.f) << ")");
    CHECK(bad == 0);
}

}  // namespace fe_test
