// pusht_policy: the smallest complete control loop around a LeRobot Diffusion Policy, meant to be copied.
// Load the pretrained_model folder once, reset() at the start of every episode, then on every control tick:
// fill a PolicyObservation from the camera buffers and the robot state, call select_action(), send the action.
// Here the camera is a synthetic moving square and the robot only prints what it is told; replace grab_frame(),
// read_state() and send_action() with your drivers.   Usage: pusht_policy FOLDER [TICKS]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <flowedge/models/diffusion/policy.hpp>

namespace {

/// Your camera driver: writes one uint8 RGB frame, row-major [height, width, 3], into `rgb`.
void grab_frame(int tick, std::vector<std::uint8_t>& rgb, int height, int width) {
    const int cx = int(width * (0.5 + 0.3 * std::sin(0.1 * tick))), cy = height / 2, half = std::max(2, width / 10);
    for (int y = 0; y < height; ++y)
        for (int x = 0; x < width; ++x) {
            const bool block = std::abs(x - cx) < half && std::abs(y - cy) < half;
            std::uint8_t* px = &rgb[(std::size_t(y) * width + x) * 3];
            px[0] = block ? 220 : 240;  // a grey-blue T-block on a light table, roughly PushT's colours
            px[1] = block ? 220 : 240;
            px[2] = block ? 250 : 240;
        }
}

/// Your robot: the current state (PushT: the agent's x, y in pixels) and, if the policy has one, the environment state.
void read_state(int tick, std::vector<float>& state, std::vector<float>& env) {
    for (std::size_t i = 0; i < state.size(); ++i) state[i] = 256.f + 100.f * std::sin(0.05f * float(tick) + float(i));
    for (std::size_t i = 0; i < env.size(); ++i) env[i] = 256.f + 50.f * std::cos(0.03f * float(tick) + float(i));
}

/// Your robot: execute one action (PushT: the target x, y of the agent, un-normalised, in pixels).
void send_action(int tick, const std::vector<float>& action, double ms) {
    std::printf("tick %3d  action", tick);
    for (float a : action) std::printf(" %8.2f", a);
    std::printf("   (%.2f ms)\n", ms);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s FOLDER [TICKS]  (FOLDER: a LeRobot DiffusionPolicy pretrained_model folder)\n", argv[0]);
        return 2;
    }
    const int ticks = argc > 2 ? std::atoi(argv[2]) : 20;
    try {
        // DiffusionPolicy<flowedge::Cuda> in a CUDA build runs the same loop on the GPU.
        auto policy = flowedge::DiffusionPolicy<flowedge::Cpu>::load(argv[1]);

        // Every buffer is sized once from the policy's features; nothing is allocated inside the loop.
        std::vector<std::vector<std::uint8_t>> camera(policy.cameras().size());
        std::vector<flowedge::PolicyFrame> frames;
        for (std::size_t k = 0; k < camera.size(); ++k) {
            const auto& cam = policy.cameras()[k];
            camera[k].resize(std::size_t(cam.height) * cam.width * 3);
            frames.push_back({camera[k].data(), flowedge::ImageLayout::U8Hwc, cam.height, cam.width});
            std::printf("camera '%s': %dx%d\n", cam.key.c_str(), cam.height, cam.width);
        }
        std::vector<float> state(std::size_t(policy.state_dim())), env(std::size_t(policy.env_dim())),
            action(std::size_t(policy.action_dim()));

        policy.reset();  // start of an episode
        for (int tick = 0; tick < ticks; ++tick) {
            for (std::size_t k = 0; k < camera.size(); ++k) grab_frame(tick, camera[k], frames[k].height, frames[k].width);
            read_state(tick, state, env);
            const flowedge::PolicyObservation obs{state, env, frames};
            const auto t0 = std::chrono::steady_clock::now();
            policy.select_action(obs, action);  // a new chunk is generated every n_action_steps ticks
            send_action(tick, action, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        return 0;
    } catch (const flowedge::Error& e) {  // a bad folder or observation: the message names the key and the expected shape
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
