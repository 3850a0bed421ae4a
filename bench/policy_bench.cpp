// policy_bench: latency of LeRobot's whole Diffusion Policy in flowedge (DiffusionPolicy<B>) on the CPU or the GPU.
// Reports select_action p50/p99/max over all ticks, over chunk ticks (encode the new frame + sample + un-normalise)
// and over the other ticks (encode only), the encoder alone on one frame, and the U-Net sample alone (the head's
// host API), so what a chunk tick costs beyond the U-Net sample can be read off one run. Frames and states are
// synthetic (latency does not depend on their values).
//
// Usage: policy_bench FOLDER [--rebuild-from SRC] [--device cpu|cuda] [--dtype f32|bf16|f16] [--ticks N] [--json FILE]
//                     [--encoder-only N]
//   --encoder-only N: only N runs of the first camera's encoder (no U-Net): its kernel table under ncu.
//   --rebuild-from SRC: first write FOLDER from a fixture committed without its weights (manifest.json +
//   constants.safetensors, tools/make_reference_dp_image.py), e.g. the PushT-size policy on a machine without LeRobot.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../test/support/lerobot_fixture_folder.hpp"
#include "flowedge/models/diffusion/policy.hpp"
#ifdef FLOWEDGE_WITH_CUDA
#include "flowedge/cuda/device.hpp"
#endif

using namespace flowedge;

namespace {

struct Stats {
    double p50 = 0, p99 = 0, max = 0;
    std::size_t n = 0;
};
Stats stats(std::vector<double> v) {
    Stats s;
    s.n = v.size();
    if (v.empty()) return s;
    std::sort(v.begin(), v.end());
    s.p50 = v[v.size() / 2];
    s.p99 = v[std::min(v.size() - 1, std::size_t(std::ceil(0.99 * double(v.size()))) - 1)];
    s.max = v.back();
    return s;
}
nlohmann::json to_json(const Stats& s) { return {{"n", s.n}, {"p50_ms", s.p50}, {"p99_ms", s.p99}, {"max_ms", s.max}}; }
void print(const char* what, const Stats& s) {
    std::printf("  %-34s n %5zu  p50 %8.3f ms  p99 %8.3f ms  max %8.3f ms\n", what, s.n, s.p50, s.p99, s.max);
}
double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// `iters` timed runs (after `warm` untimed) of the first camera's encoder on `frame` (uint8 HWC), as the policy runs it:
/// one recorded graph on CUDA, host wall clock around launch + synchronize.
template <Backend B>
std::vector<double> encoder_ms(const io::LeRobotDiffusionPolicy& meta, const LoadOptions& lo, const std::vector<std::uint8_t>& frame,
                               int iters, int warm = 10) {
    const auto& cam = meta.cameras.at(0);
    DiffusionRgbEncoder<B> enc(rgb_encoder_config_from_lerobot(meta.config, cam.height, cam.width));
    enc.load(meta.head.weights, meta.separate_encoders ? "diffusion.rgb_encoder.0." : "diffusion.rgb_encoder.", lo);
    enc.set_normalization(cam.norm.kind, cam.norm.offset.data(), cam.norm.denom.data());
    Buffer<std::uint8_t, B> dframe(frame.size());
    Buffer<float, B> dfeat(std::size_t(enc.feature_dim()));
    Memory<B>::copy_from_host(dframe.data(), frame.data(), frame.size());
    ModelExecution<B, 1> exec("bench", enc.workspace_bytes(1));
    std::vector<double> ms;
    for (int r = 0; r < iters + warm; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        exec.run(0, 1, [&] {
            Context<B> ctx = exec.context();
            exec.workspace().reset();
            enc.forward(ctx, dframe.data(), ImageLayout::U8Hwc, 1, View<float, B>{dfeat.data(), Shape{1, enc.feature_dim()}});
        });
        Memory<B>::synchronize(exec.stream());
        if (r >= warm) ms.push_back(ms_since(t0));
    }
    return ms;
}

/// --encoder-only: the first camera's encoder alone (no U-Net; one untimed run, then `iters` timed ones), e.g. under
/// ncu, where the second half of the kernels is the timed run(s).
template <Backend B>
int run_encoder_only(const std::string& folder, const LoadOptions& lo, int iters, const std::string& device_name) {
    const io::LeRobotDiffusionPolicy meta = io::open_lerobot_diffusion_policy(folder);
    if (meta.cameras.empty()) throw Error("flowedge: policy_bench: --encoder-only needs a policy with a camera (got none)");
    std::vector<std::uint8_t> frame(std::size_t(meta.cameras[0].height) * meta.cameras[0].width * 3);
    for (std::size_t i = 0; i < frame.size(); ++i) frame[i] = std::uint8_t((i * 7) & 0xff);
    const Stats s = stats(encoder_ms<B>(meta, lo, frame, iters, 1));
    std::printf("encoder of %s on %s:\n", meta.cameras[0].key.c_str(), device_name.c_str());
    print("encoder alone, one frame", s);
    return 0;
}

template <Backend B>
int run(const std::string& folder, const LoadOptions& lo, int ticks, const std::string& json_path, const std::string& device_name) {
    auto p = DiffusionPolicy<B>::load(folder, PolicyOptions{.load = lo});
    const DiffusionConfig& c = p.config();
    std::printf("policy %s: %zu camera(s), state %d, env %d, action %d, horizon %d, n_action_steps %d, %s %d steps\n", folder.c_str(),
                p.cameras().size(), p.state_dim(), p.env_dim(), p.action_dim(), c.horizon, c.n_action_steps,
                scheduler_name(p.scheduler()), p.steps());
    // Synthetic observation stream: a moving pattern per camera, a drifting state.
    std::vector<std::vector<std::uint8_t>> frames;
    for (const auto& cam : p.cameras()) frames.emplace_back(std::size_t(cam.height) * cam.width * 3);
    std::vector<PolicyFrame> pf(p.cameras().size());
    std::vector<float> state(std::size_t(p.state_dim())), env(std::size_t(p.env_dim())), action(std::size_t(p.action_dim()));
    std::vector<double> all, chunk, other;
    p.reset(1);
    const int warm = 2 * c.n_action_steps;
    for (int t = 0; t < warm + ticks; ++t) {
        for (std::size_t k = 0; k < frames.size(); ++k) {
            const auto& cam = p.cameras()[k];
            for (std::size_t i = 0; i < frames[k].size(); ++i) frames[k][i] = std::uint8_t((i * 7 + std::size_t(t) * 13 + k * 31) & 0xff);
            pf[k] = {frames[k].data(), ImageLayout::U8Hwc, cam.height, cam.width};
        }
        for (std::size_t i = 0; i < state.size(); ++i) state[i] = 100.f + float(t) + float(i);
        for (std::size_t i = 0; i < env.size(); ++i) env[i] = 0.1f * float(t % 7) + float(i);
        const int before = p.chunks_generated();
        const auto t0 = std::chrono::steady_clock::now();
        p.select_action(PolicyObservation{state, env, pf}, action);
        const double ms = ms_since(t0);
        if (t < warm) continue;
        all.push_back(ms);
        (p.chunks_generated() != before ? chunk : other).push_back(ms);
    }
    // The U-Net sample alone through the head's host API (H2D condition + noise, one graph, D2H).
    std::vector<double> sample_ms;
    {
        std::vector<float> cond(std::size_t(c.global_cond_dim), 0.1f), noise(std::size_t(c.horizon) * c.action_dim), out(noise.size());
        for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = std::sin(0.37f * float(i + 1));
        const SampleOptions so{.steps = p.steps(), .scheduler = p.scheduler(), .seed = 0};
        for (int r = 0; r < std::max(10, ticks / 4) + 3; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            p.head().sample(cond, noise, out, so, 1);
            if (r >= 3) sample_ms.push_back(ms_since(t0));
        }
    }
    // The encoder alone on one frame of the first camera, as the policy runs it (recorded graph on CUDA).
    const std::vector<double> enc_ms =
        p.cameras().empty() ? std::vector<double>{} : encoder_ms<B>(io::open_lerobot_diffusion_policy(folder), lo, frames[0], 200);
    const Stats s_all = stats(all), s_chunk = stats(chunk), s_other = stats(other), s_sample = stats(sample_ms), s_enc = stats(enc_ms);
    std::printf("select_action on %s (%d ticks after %d warm-up):\n", device_name.c_str(), ticks, warm);
    print("all ticks", s_all);
    print("chunk ticks (encode + sample)", s_chunk);
    print("other ticks (encode only)", s_other);
    print("U-Net sample alone (head API)", s_sample);
    print("encoder alone, one frame", s_enc);
    std::printf("  chunk tick p50 - U-Net sample p50 = %.3f ms\n", s_chunk.p50 - s_sample.p50);
    if (!json_path.empty()) {
        nlohmann::json j = {{"bench", "policy"}, {"folder", folder}, {"device", device_name}, {"ticks", ticks},
                            {"weights", lo.weight_dtype ? std::string(dtype_name(*lo.weight_dtype)) : std::string("file")},
                            {"cameras", p.cameras().size()}, {"steps", p.steps()}, {"scheduler", scheduler_name(p.scheduler())},
                            {"all", to_json(s_all)}, {"chunk", to_json(s_chunk)}, {"other", to_json(s_other)},
                            {"unet_sample", to_json(s_sample)}, {"encoder_one_frame", to_json(s_enc)},
                            {"device_bytes", p.device_bytes()}};
        std::ofstream(json_path) << j.dump(2) << "\n";
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::string folder, rebuild, device = "cpu", dtype = "file", json_path;
    int ticks = 64, encoder_only = 0;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
            return argv[++i];
        };
        if (a == "--rebuild-from") rebuild = next();
        else if (a == "--device") device = next();
        else if (a == "--dtype") dtype = next();
        else if (a == "--ticks") ticks = std::max(8, std::atoi(next().c_str()));
        else if (a == "--json") json_path = next();
        else if (a == "--encoder-only") encoder_only = std::max(1, std::atoi(next().c_str()));
        else if (!a.empty() && a[0] != '-' && folder.empty()) folder = a;
        else {
            std::fprintf(stderr, "usage: policy_bench FOLDER [--rebuild-from SRC] [--device cpu|cuda] [--dtype f32|bf16|f16] [--ticks N] [--json FILE] [--encoder-only N]\n");
            return 2;
        }
    }
    if (folder.empty()) {
        std::fprintf(stderr, "policy_bench: FOLDER is required\n");
        return 2;
    }
    try {
        if (!rebuild.empty()) testsupport::rebuild_lerobot_fixture(rebuild, folder);
        LoadOptions lo;
        if (dtype == "f32") lo.weight_dtype = DType::F32;
        else if (dtype == "bf16") lo.weight_dtype = DType::BF16;
        else if (dtype == "f16") lo.weight_dtype = DType::F16;
        else if (dtype != "file") throw Error("flowedge: policy_bench: unknown --dtype '" + dtype + "' (expected f32, bf16 or f16)");
        if (device == "cuda") {
#ifdef FLOWEDGE_WITH_CUDA
            return encoder_only ? run_encoder_only<Cuda>(folder, lo, encoder_only, cuda::device_description())
                                : run<Cuda>(folder, lo, ticks, json_path, cuda::device_description());
#else
            std::fprintf(stderr, "policy_bench: this build has no CUDA backend\n");
            return 2;
#endif
        }
        if (device != "cpu") throw Error("flowedge: policy_bench: unknown --device '" + device + "' (expected cpu or cuda)");
        const std::string cpu_name = std::string("cpu, ") + cpu::kernel_set_name() + " kernels";
        return encoder_only ? run_encoder_only<Cpu>(folder, lo, encoder_only, cpu_name) : run<Cpu>(folder, lo, ticks, json_path, cpu_name);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
