// What a robot hands any whole policy (DiffusionPolicy, ActPolicy) at each control tick: camera frames and state
// vectors in host memory. One definition so the C API and the tools serve every policy type with the same structs.
#pragma once
#include <span>

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

}  // namespace flowedge
