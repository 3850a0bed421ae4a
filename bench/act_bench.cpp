// act_bench: latency of one ACT chunk (ActPolicy<B>::predict_action_chunk: upload, backbone, encoder, decoder, action
// head, copy back) on the CPU or the GPU, and, given LeRobot's reference run of the same folder, the chunk error.
// The folder is e.g. tools/make_reference_act.py --bench DIR (one 480x640 camera at LeRobot's default sizes), which
// also writes DIR_ref/ (the observations, LeRobot's chunks and its own chunk timing in info.json).
//
// Usage: act_bench FOLDER [--ref DIR] [--rebuild-from SRC] [--device cpu|cuda] [--dtype f32|bf16|f16] [--chunks N]
//                  [--json FILE]
//   --ref DIR: compare every step's chunk with DIR/chunks.npy (observations DIR/<key>.npy), max abs in normalised units.
//   --rebuild-from SRC: first write FOLDER from a fixture committed without its weights (manifest.json +
//   constants.safetensors).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../test/support/lerobot_fixture_folder.hpp"
#include "flowedge/io/npy.hpp"
#include "flowedge/models/act/policy.hpp"
#ifdef FLOWEDGE_WITH_CUDA
#include "flowedge/cuda/device.hpp"
#endif

using namespace flowedge;
namespace fs = std::filesystem;

namespace {

/// Max |flowedge - LeRobot| over every step's chunk of the reference episode in `ref` (frames uint8 HWC).
template <Backend B>
double reference_error(ActPolicy<B>& p, const fs::path& ref) {
    const auto state = io::read_npy_f32(ref / (p.state_key() + ".npy"));
    const auto chunks = io::read_npy_f32(ref / "chunks.npy");
    std::vector<float> env;
    if (p.env_dim() > 0) env = io::read_npy_f32(ref / (p.env_key() + ".npy")).data;
    std::vector<io::NpyArray<std::uint8_t>> frames;
    for (const auto& cam : p.cameras()) frames.push_back(io::read_npy_u8(ref / (cam.key + ".npy")));
    const std::size_t T = std::size_t(state.shape.at(0)), S = std::size_t(p.state_dim()), E = std::size_t(p.env_dim());
    const std::size_t CA = std::size_t(p.config().chunk_size) * std::size_t(p.action_dim());
    std::vector<float> chunk(CA);
    double worst = 0;
    for (std::size_t t = 0; t < T; ++t) {
        std::vector<PolicyFrame> f;
        for (std::size_t c = 0; c < frames.size(); ++c) {
            const auto& cam = p.cameras()[c];
            const std::size_t bytes = std::size_t(cam.height) * cam.width * 3;
            f.push_back(PolicyFrame{frames[c].data.data() + t * bytes, ImageLayout::U8Hwc, cam.height, cam.width});
        }
        const PolicyObservation obs{std::span<const float>(state.data.data() + t * S, S),
                                    E ? std::span<const float>(env.data() + t * E, E) : std::span<const float>{}, f};
        p.predict_action_chunk(obs, chunk);
        for (std::size_t i = 0; i < CA; ++i) worst = std::max(worst, std::fabs(double(chunk[i]) - double(chunks.data[t * CA + i])));
    }
    return worst;
}

template <Backend B>
int run(const std::string& folder, const LoadOptions& lo, const std::string& ref, int n_chunks, const std::string& json_path,
        const std::string& device) {
    auto t_load = std::chrono::steady_clock::now();
    ActPolicy<B> p = ActPolicy<B>::load(folder, {.load = lo});
    const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();
    std::printf("act_bench %s on %s: %d encoder tokens, chunk %d x %d, load + warm-up %.1f ms\n", folder.c_str(), device.c_str(),
                p.n_tokens(), p.config().chunk_size, p.action_dim(), load_ms);
    nlohmann::json out = {{"folder", folder}, {"device", device}, {"tokens", p.n_tokens()}, {"chunk_size", p.config().chunk_size}};
    if (!ref.empty()) {
        const double err = reference_error(p, ref);
        std::printf("  chunks vs LeRobot (%s): max abs %.3g normalised\n", ref.c_str(), err);
        out["max_abs_vs_lerobot"] = err;
    }
    // Synthetic observation: latency does not depend on the values.
    std::vector<float> state(std::size_t(p.state_dim()), 0.1f), env(std::size_t(p.env_dim()), 0.1f);
    std::vector<std::vector<std::uint8_t>> pixels;
    std::vector<PolicyFrame> frames;
    for (const auto& cam : p.cameras()) {
        pixels.emplace_back(std::size_t(cam.height) * cam.width * 3);
        for (std::size_t i = 0; i < pixels.back().size(); ++i) pixels.back()[i] = std::uint8_t(i * 37 % 251);
        frames.push_back(PolicyFrame{pixels.back().data(), ImageLayout::U8Hwc, cam.height, cam.width});
    }
    const PolicyObservation obs{state, env, frames};
    std::vector<float> chunk(std::size_t(p.config().chunk_size) * std::size_t(p.action_dim()));
    for (int i = 0; i < 5; ++i) p.predict_action_chunk(obs, chunk);
    std::vector<double> ms;
    for (int i = 0; i < n_chunks; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        p.predict_action_chunk(obs, chunk);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double p50 = ms[ms.size() / 2], p99 = ms[std::min(ms.size() - 1, std::size_t(std::ceil(0.99 * double(ms.size()))) - 1)];
    std::printf("  predict_action_chunk: n %zu  min %.3f ms  p50 %.3f ms  p99 %.3f ms  max %.3f ms\n", ms.size(), ms.front(), p50,
                p99, ms.back());
    out["chunk_ms"] = {{"n", ms.size()}, {"min", ms.front()}, {"p50", p50}, {"p99", p99}, {"max", ms.back()}};
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::string folder, rebuild, ref, device = "cpu", dtype = "file", json_path;
    int n_chunks = 200;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
            return argv[++i];
        };
        if (a == "--rebuild-from") rebuild = next();
        else if (a == "--ref") ref = next();
        else if (a == "--device") device = next();
        else if (a == "--dtype") dtype = next();
        else if (a == "--chunks") n_chunks = std::max(8, std::atoi(next().c_str()));
        else if (a == "--json") json_path = next();
        else if (!a.empty() && a[0] != '-' && folder.empty()) folder = a;
        else {
            std::fprintf(stderr, "usage: act_bench FOLDER [--ref DIR] [--rebuild-from SRC] [--device cpu|cuda] [--dtype f32|bf16|f16] "
                                 "[--chunks N] [--json FILE]\n");
            return 2;
        }
    }
    if (folder.empty()) {
        std::fprintf(stderr, "act_bench: FOLDER is required\n");
        return 2;
    }
    try {
        if (!rebuild.empty()) testsupport::rebuild_lerobot_fixture(rebuild, folder);
        LoadOptions lo;
        if (dtype == "f32") lo.weight_dtype = DType::F32;
        else if (dtype == "bf16") lo.weight_dtype = DType::BF16;
        else if (dtype == "f16") lo.weight_dtype = DType::F16;
        else if (dtype != "file") throw Error("flowedge: act_bench: unknown --dtype '" + dtype + "' (expected f32, bf16 or f16)");
        if (device == "cuda") {
#ifdef FLOWEDGE_WITH_CUDA
            return run<Cuda>(folder, lo, ref, n_chunks, json_path, cuda::device_description());
#else
            std::fprintf(stderr, "act_bench: this build has no CUDA backend\n");
            return 2;
#endif
        }
        if (device != "cpu") throw Error("flowedge: act_bench: unknown --device '" + device + "' (expected cpu or cuda)");
        return run<Cpu>(folder, lo, ref, n_chunks, json_path, std::string("cpu, ") + cpu::kernel_set_name() + " kernels");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
