// What a robot hands any whole policy (DiffusionPolicy, ActPolicy) at each control tick: camera frames and state
// vectors in host memory. One definition so the C API and the tools serve every policy type with the same structs.
#pragma once
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flowedge/error.hpp"
#include "flowedge/op_params.hpp"

namespace flowedge {

/// One camera frame as the robot has it, in host memory: uint8 [height, width, 3] (HWC) or float32 [3, height,
/// width] (CHW, values in [0, 1]); ImageLayout says which.
struct PolicyFrame {
    const void* data = nullptr;
    ImageLayout layout = ImageLayout::U8Hwc;
    int height = 0, width = 0;
};

/// One observation step: the robot state, the environment state (when the policy has one) and one frame per camera
/// in the policy's cameras() order. Spans point at host memory and are read during the call only.
struct PolicyObservation {
    std::span<const float> state;
    std::span<const float> env_state;
    std::span<const PolicyFrame> images;
};

/// Bytes of one frame of camera `pc` (channels, height, width: io::PolicyCamera) in `layout`.
template <class Camera>
std::size_t policy_frame_bytes(const Camera& pc, ImageLayout layout) {
    return std::size_t(pc.channels) * pc.height * pc.width * (layout == ImageLayout::U8Hwc ? 1 : sizeof(float));
}

/// An all-zero observation of a policy's shapes, with frames of every camera in `layout`: what warm_up() ticks on.
/// Owns its vectors and pixels (allocated at load time, not in a tick).
struct ZeroObservation {
    std::vector<float> state, env;
    std::vector<std::vector<std::byte>> pixels;
    std::vector<PolicyFrame> frames;

    template <class Cameras>
    ZeroObservation(int state_dim, int env_dim, const Cameras& cameras, ImageLayout layout)
        : state(std::size_t(state_dim), 0.0f), env(std::size_t(env_dim), 0.0f) {
        for (const auto& pc : cameras) {
            pixels.emplace_back(policy_frame_bytes(pc, layout), std::byte{0});
            frames.push_back(PolicyFrame{pixels.back().data(), layout, pc.height, pc.width});
        }
    }
    ZeroObservation(const ZeroObservation&) = delete;  // frames point into this object's pixels
    ZeroObservation& operator=(const ZeroObservation&) = delete;
    PolicyObservation view() const { return PolicyObservation{state, env, frames}; }
};

/// Checks `obs` against what a policy takes: the robot state (state_dim floats, none when 0), the environment state
/// (env_dim floats, none when 0), one frame per camera of its height and width in a known layout, every float finite.
/// `cameras` is a range of objects with key, channels, height and width (io::PolicyCamera). Throws
/// flowedge::Error "flowedge: <component>: ..." naming the key and the expected size; messages are built only on
/// failure (select_action must not allocate).
template <class Cameras>
void check_policy_observation(const PolicyObservation& obs, std::string_view component, const std::string& state_key, int state_dim,
                              const std::string& env_key, int env_dim, const Cameras& cameras) {
    const auto need = [&](bool ok, ErrorKind k, auto&& what) {
        if (!ok) [[unlikely]] fail(k, component, what());
    };
    const auto vector_input = [&](std::span<const float> v, int dim, const std::string& key, const char* kind) {
        if (dim == 0) {
            need(v.empty(), ErrorKind::BadShape,
                 [&] { return std::string(kind) + " was given but the policy has none" + expected_got(0, v.size()); });
            return;
        }
        need(v.size() == std::size_t(dim), ErrorKind::BadShape,
             [&] { return "'" + key + "' has the wrong length" + expected_got(dim, v.size()); });
        for (std::size_t i = 0; i < v.size(); ++i)
            need(std::isfinite(v[i]), ErrorKind::NonFinite, [&] {
                return "'" + key + "' element " + std::to_string(i) + " is not finite" + expected_got("finite", std::to_string(v[i]));
            });
    };
    vector_input(obs.state, state_dim, state_key, "a robot state");
    vector_input(obs.env_state, env_dim, env_key, "an environment state");
    need(obs.images.size() == std::size(cameras), ErrorKind::BadShape,
         [&] { return "wrong number of camera frames" + expected_got(std::size(cameras), obs.images.size()); });
    for (std::size_t cam = 0; cam < obs.images.size(); ++cam) {
        const auto& pc = cameras[cam];
        const PolicyFrame& f = obs.images[cam];
        need(f.data != nullptr, ErrorKind::BadInput, [&] { return "'" + pc.key + "': no frame data"; });
        need(f.layout == ImageLayout::U8Hwc || f.layout == ImageLayout::F32Chw, ErrorKind::BadInput,
             [&] { return "'" + pc.key + "': unknown frame layout" + expected_got("uint8 HWC or float32 CHW", int(f.layout)); });
        need(f.height == pc.height && f.width == pc.width, ErrorKind::BadShape, [&] {
            return "'" + pc.key + "': frame has the wrong size" +
                   expected_got(std::to_string(pc.height) + "x" + std::to_string(pc.width), std::to_string(f.height) + "x" + std::to_string(f.width));
        });
        if (f.layout == ImageLayout::F32Chw) {
            const float* v = static_cast<const float*>(f.data);
            const std::size_t n = std::size_t(pc.channels) * pc.height * pc.width;
            for (std::size_t i = 0; i < n; ++i)
                need(std::isfinite(v[i]), ErrorKind::NonFinite, [&] {
                    return "'" + pc.key + "': pixel value " + std::to_string(i) + " is not finite" + expected_got("finite", std::to_string(v[i]));
                });
        }
    }
}

}  // namespace flowedge
