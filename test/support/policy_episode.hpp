// The observations of a LeRobot reference episode as the policy fixtures store them (<name>_ref/<key>.npy: states
// [T, state_dim], environment states, per camera uint8 frames [T, H, W, 3]) and observation t of it as a
// PolicyObservation: the preamble the whole-policy parity tests (Diffusion Policy, ACT) share.
#pragma once
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "flowedge/io/npy.hpp"
#include "flowedge/models/policy_observation.hpp"
#include "test_paths.hpp"

namespace flowedge::testsupport {

/// <name>_ref/ of committed fixture `name`.
inline std::filesystem::path fixture_ref_dir(const std::string& name) {
    return fe_test::fixtures_dir() / (name + "_ref");
}

/// One reference episode's observations.
struct PolicyEpisode {
    int T = 0;
    std::vector<float> state, env;
    std::vector<std::vector<std::uint8_t>> frames;  ///< per camera, [T, H, W, 3]
};

/// Reads the episode of fixture `name` under policy p's keys (state_key, env_key, cameras()).
template <class Policy>
PolicyEpisode read_policy_episode(const Policy& p, const std::string& name) {
    const std::filesystem::path ref = fixture_ref_dir(name);
    PolicyEpisode e;
    const auto st = io::read_npy_f32(ref / (p.state_key() + ".npy"));
    e.T = int(st.shape[0]);
    e.state = st.data;
    if (p.env_dim() > 0) e.env = io::read_npy_f32(ref / (p.env_key() + ".npy")).data;
    for (const auto& cam : p.cameras()) e.frames.push_back(io::read_npy_u8(ref / (cam.key + ".npy")).data);
    return e;
}

/// Observation t of an episode; obs's spans point into frames / float_frames and the episode.
struct EpisodeObservation {
    std::vector<PolicyFrame> frames;
    std::vector<std::vector<float>> float_frames;
    PolicyObservation obs;
};

/// Fills o with observation t of e (frames uint8 HWC, or converted to float CHW / 255 with `as_float`).
template <class Policy>
void observation_at(const Policy& p, const PolicyEpisode& e, int t, bool as_float, EpisodeObservation& o) {
    o.frames.clear();
    o.float_frames.resize(p.cameras().size());
    for (std::size_t c = 0; c < p.cameras().size(); ++c) {
        const auto& cam = p.cameras()[c];
        const std::size_t hw = std::size_t(cam.height) * cam.width;
        const std::uint8_t* src = e.frames[c].data() + std::size_t(t) * hw * 3;
        if (as_float) {
            auto& f = o.float_frames[c];
            f.resize(3 * hw);
            for (std::size_t ch = 0; ch < 3; ++ch)
                for (std::size_t i = 0; i < hw; ++i) f[ch * hw + i] = float(src[i * 3 + ch]) / 255.f;
            o.frames.push_back(PolicyFrame{f.data(), ImageLayout::F32Chw, cam.height, cam.width});
        } else {
            o.frames.push_back(PolicyFrame{src, ImageLayout::U8Hwc, cam.height, cam.width});
        }
    }
    const std::size_t S = std::size_t(p.state_dim()), E = std::size_t(p.env_dim());
    o.obs.state = std::span<const float>(e.state.data() + std::size_t(t) * S, S);
    o.obs.env_state = E ? std::span<const float>(e.env.data() + std::size_t(t) * E, E) : std::span<const float>{};
    o.obs.images = o.frames;
}

}  // namespace flowedge::testsupport
