// Helpers for the CUDA tests: device copies of host vectors, random data, weights in every dtype, and
// max-norm comparisons (CUDA vs CPU vs a double reference).
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "flowedge/ops.hpp"
#include "../support/compare.hpp"

namespace flowedge::test {

/// A device copy of a host vector (allocated through Memory<Cuda>, so it is counted).
template <class T>
class DeviceArray {
public:
    DeviceArray() = default;
    explicit DeviceArray(const std::vector<T>& host) : m_buf(host.size()) { upload(host); }
    explicit DeviceArray(std::size_t n) : m_buf(n) { Memory<Cuda>::fill_zero(m_buf.data(), m_buf.bytes()); }
    void upload(const std::vector<T>& host, Stream s = {}) {
        REQUIRE(host.size() == m_buf.size());
        Memory<Cuda>::copy_from_host(m_buf.data(), host.data(), m_buf.bytes(), s);
    }
    std::vector<T> download(Stream s = {}) const {
        std::vector<T> h(m_buf.size());
        Memory<Cuda>::copy_to_host(h.data(), m_buf.data(), m_buf.bytes(), s);
        return h;
    }
    T* get() { return m_buf.data(); }
    const T* get() const { return m_buf.data(); }
    std::size_t size() const { return m_buf.size(); }

private:
    Buffer<T, Cuda> m_buf;
};

inline std::vector<float> random_vec(std::size_t n, std::uint32_t seed, float lo = -1.f, float hi = 1.f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}

/// A weight tensor stored in `dtype` on the host and on the device, plus its exact widened float values.
struct Weights {
    DType dtype = DType::F32;
    std::vector<std::byte> host;
    std::vector<float> widened;
    DeviceArray<std::byte> device;

    Weights(const std::vector<float>& values, DType t) : dtype(t) {
        const std::size_t n = values.size();
        host.resize(n * dtype_size(t));
        widened.resize(n);
        for (std::size_t i = 0; i < n; ++i) {
            if (t == DType::F32) {
                std::memcpy(host.data() + 4 * i, &values[i], 4);
                widened[i] = values[i];
            } else {
                const std::uint16_t h = t == DType::BF16 ? to_bf16(values[i]).bits : to_f16(values[i]).bits;
                std::memcpy(host.data() + 2 * i, &h, 2);
                widened[i] = t == DType::BF16 ? to_float(bf16{h}) : to_float(f16{h});
            }
        }
        device = DeviceArray<std::byte>(host);
    }
    WeightRef cpu() const { return {host.data(), dtype}; }
    WeightRef gpu() const { return {device.get(), dtype}; }
};

inline constexpr DType kAllDtypes[] = {DType::F32, DType::BF16, DType::F16};

inline double max_abs(const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = std::max(m, double(std::fabs(x)));
    return m;
}
inline double max_abs(const std::vector<double>& v) {
    double m = 0;
    for (double x : v) m = std::max(m, std::fabs(x));
    return m;
}

using fe_test::check_elementwise;
using fe_test::max_norm_rel;

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace flowedge::test
