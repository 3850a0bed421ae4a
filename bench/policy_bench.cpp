// policy_bench: latency of LeRobot's whole Diffusion Policy in flowedge (DiffusionPolicy<B>) on the CPU or the GPU.
// Reports select_action p50/p99/max over all ticks, over chunk ticks (encode the new frame + sample + un-normalise)
// and over the other ticks (encode only), the encoder alone on one frame, and the U-Net sample alone (the head's
// host API), so what a chunk tick costs beyond the U-Net sample can be read off one run. Frames and states are
// synthetic (latency does not depend on their values).
//
// Usage: policy_bench FOLDER [--rebuild-from SRC] [--device cpu|cuda] [--dtype f32|bf16|f16] [--ticks N] [--json FILE]
//                     [--encoder-only N] [--batch N]
//   --batch N: a policy serving N environments in lockstep (PolicyOptions::batch; every chunk tick samples all N in
//   one U-Net call, every encoding tick encodes N frames per camera); the U-Net alone is timed at batch N too.
//   Times are per call (all N environments); process CPU time (all threads) is reported next to wall time.
//   --warm N / --sample-runs N: untimed warm-up ticks (default 2 * n_action_steps) / timed U-Net-alone runs.
//   --encoder-only N: only N runs of the first camera's encoder (no U-Net): its kernel table under ncu.
//   --rebuild-from SRC: first write FOLDER from a fixture committed without its weights (manifest.json +
//   constants.safetensors, tools/make_reference_dp_image.py), e.g. the PushT-size policy on a machine without LeRobot.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdint>
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
/// CPU time of the whole process (every thread, the OpenMP workers included), in ms.
double process_cpu_ms() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}
double min_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end()); }

/// `iters` timed runs (after `warm` untimed) of the first camera's encoder on `frame` (uint8 HWC), as the policy runs it:
/// one recorded graph on CUDA, host wall clock around launch + synchronize.
template <Backend B>
std::vector<double> encoder_ms(const io::LeRobotDiffusionPolicy& meta, const LoadOptions& lo, const std::vector<std::uint8_t>& frame,
                               int iters, int warm = 10, std::vector<float>* features = nullptr) {
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
    if (features) {
        features->resize(std::size_t(enc.feature_dim()));
        Memory<B>::copy_to_host(features->data(), dfeat.data(), features->size() * sizeof(float));
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
    std::vector<float> feat;
    const Stats s = stats(encoder_ms<B>(meta, lo, frame, iters, 1, &feat));
    // FNV-1a over the features' float bits: equal hashes = two builds or kernel paths computed the same features.
    std::uint64_t bits = 1469598103934665603ull;
    for (const float f : feat) {
        std::uint32_t u;
        std::memcpy(&u, &f, sizeof u);
        for (int b = 0; b < 4; ++b) bits = (bits ^ ((u >> (8 * b)) & 0xffu)) * 1099511628211ull;
    }
    std::printf("encoder of %s on %s: %zu features, bits hash %016llx\n", meta.cameras[0].key.c_str(), device_name.c_str(),
                feat.size(), static_cast<unsigned long long>(bits));
    print("encoder alone, one frame", s);
    return 0;
}

template <Backend B>
int run(const std::string& folder, const LoadOptions& lo, int ticks, int batch, int warm, int sample_runs, const std::string& json_path,
        const std::string& device_name) {
    auto p = DiffusionPolicy<B>::load(folder, PolicyOptions{.load = lo, .batch = batch});
    const DiffusionConfig& c = p.config();
    const std::size_t N = std::size_t(batch), n_cam = p.cameras().size();
    std::printf("policy %s: %zu camera(s), state %d, env %d, action %d, horizon %d, n_action_steps %d, %s %d steps, batch %d\n",
                folder.c_str(), n_cam, p.state_dim(), p.env_dim(), p.action_dim(), c.horizon, c.n_action_steps,
                scheduler_name(p.scheduler()), p.steps(), batch);
    // Synthetic observation stream per environment: a moving pattern per camera, a drifting state.
    std::vector<std::vector<std::uint8_t>> frames;
    for (std::size_t e = 0; e < N; ++e)
        for (const auto& cam : p.cameras()) frames.emplace_back(std::size_t(cam.height) * cam.width * 3);
    std::vector<PolicyFrame> pf(N * n_cam);
    const std::size_t S = std::size_t(p.state_dim()), E = std::size_t(p.env_dim());
    std::vector<float> state(N * S), env(N * E), actions(N * std::size_t(p.action_dim()));
    std::vector<PolicyObservation> obs(N);
    std::vector<double> all, chunk, other, chunk_cpu;
    p.reset(1);
    if (warm < 0) warm = 2 * c.n_action_steps;
    for (int t = 0; t < warm + ticks; ++t) {
        for (std::size_t e = 0; e < N; ++e) {
            for (std::size_t k = 0; k < n_cam; ++k) {
                const auto& cam = p.cameras()[k];
                auto& f = frames[e * n_cam + k];
                for (std::size_t i = 0; i < f.size(); ++i) f[i] = std::uint8_t((i * 7 + std::size_t(t) * 13 + k * 31 + e * 5) & 0xff);
                pf[e * n_cam + k] = {f.data(), ImageLayout::U8Hwc, cam.height, cam.width};
            }
            for (std::size_t i = 0; i < S; ++i) state[e * S + i] = 100.f + float(t) + float(i) + float(e);
            for (std::size_t i = 0; i < E; ++i) env[e * E + i] = 0.1f * float(t % 7) + float(i) + float(e);
            obs[e] = PolicyObservation{std::span<const float>(state.data() + e * S, S), std::span<const float>(env.data() + e * E, E),
                                       std::span<const PolicyFrame>(pf.data() + e * n_cam, n_cam)};
        }
        const int before = p.chunks_generated();
        const double cpu0 = process_cpu_ms();
        const auto t0 = std::chrono::steady_clock::now();
        p.select_action(std::span<const PolicyObservation>(obs), actions);
        const double ms = ms_since(t0), cpu = process_cpu_ms() - cpu0;
        if (t < warm) continue;
        all.push_back(ms);
        const bool sampled = p.chunks_generated() != before;
        (sampled ? chunk : other).push_back(ms);
        if (sampled) chunk_cpu.push_back(cpu);
    }
    // The U-Net sample alone through the head's host API (H2D condition + noise, one graph, D2H), at the same batch.
    std::vector<double> sample_ms, sample_cpu;
    {
        std::vector<float> cond(N * std::size_t(c.global_cond_dim), 0.1f), noise(N * std::size_t(c.horizon) * c.action_dim), out(noise.size());
        for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = std::sin(0.37f * float(i + 1));
        const SampleOptions so{.steps = p.steps(), .scheduler = p.scheduler(), .seed = 0};
        if (sample_runs < 0) sample_runs = std::max(10, ticks / 4);
        for (int r = 0; r < sample_runs + 1; ++r) {
            const double cpu0 = process_cpu_ms();
            const auto t0 = std::chrono::steady_clock::now();
            p.head().sample(cond, noise, out, so, batch);
            if (r >= 1) {
                sample_ms.push_back(ms_since(t0));
                sample_cpu.push_back(process_cpu_ms() - cpu0);
            }
        }
    }
    // The encoder alone on one frame of the first camera, as the policy runs it (recorded graph on CUDA).
    const std::vector<double> enc_ms =
        p.cameras().empty() ? std::vector<double>{} : encoder_ms<B>(io::open_lerobot_diffusion_policy(folder), lo, frames[0], 200);
    const Stats s_all = stats(all), s_chunk = stats(chunk), s_other = stats(other), s_sample = stats(sample_ms), s_enc = stats(enc_ms);
    std::printf("select_action on %s, batch %d (%d ticks after %d warm-up; times per call, all environments):\n", device_name.c_str(),
                batch, ticks, warm);
    print("all ticks", s_all);
    print("chunk ticks (encode + sample)", s_chunk);
    print("other ticks (encode only)", s_other);
    print("U-Net sample alone (head API)", s_sample);
    print("encoder alone, one frame", s_enc);
    std::printf("  chunk tick p50 - U-Net sample p50 = %.3f ms\n", s_chunk.p50 - s_sample.p50);
    const Stats s_chunk_cpu = stats(chunk_cpu), s_sample_cpu = stats(sample_cpu);
    std::printf("  chunk tick: min %.3f ms, process CPU p50 %.3f ms; per environment p50 %.3f ms\n", min_of(chunk), s_chunk_cpu.p50,
                s_chunk.p50 / double(batch));
    std::printf("  U-Net sample: min %.3f ms, process CPU p50 %.3f ms; per environment p50 %.3f ms\n", min_of(sample_ms),
                s_sample_cpu.p50, s_sample.p50 / double(batch));
    if (!json_path.empty()) {
        nlohmann::json j = {{"bench", "policy"}, {"folder", folder}, {"device", device_name}, {"ticks", ticks},
                            {"weights", lo.weight_dtype ? std::string(dtype_name(*lo.weight_dtype)) : std::string("file")},
                            {"cameras", p.cameras().size()}, {"steps", p.steps()}, {"scheduler", scheduler_name(p.scheduler())},
                            {"all", to_json(s_all)}, {"chunk", to_json(s_chunk)}, {"other", to_json(s_other)},
                            {"unet_sample", to_json(s_sample)}, {"encoder_one_frame", to_json(s_enc)},
                            {"device_bytes", p.device_bytes()}, {"batch", batch},
                            {"chunk_min_ms", min_of(chunk)}, {"chunk_cpu", to_json(s_chunk_cpu)},
                            {"unet_sample_min_ms", min_of(sample_ms)}, {"unet_sample_cpu", to_json(s_sample_cpu)},
                            {"chunk_runs_ms", chunk}, {"unet_sample_runs_ms", sample_ms}};
        std::ofstream(json_path) << j.dump(2) << "\n";
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::string folder, rebuild, device = "cpu", dtype = "file", json_path;
    int ticks = 64, encoder_only = 0, batch = 1, warm = -1, sample_runs = -1;
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
        else if (a == "--batch") batch = std::atoi(next().c_str());
        else if (a == "--warm") warm = std::max(0, std::atoi(next().c_str()));
        else if (a == "--sample-runs") sample_runs = std::max(1, std::atoi(next().c_str()));
        else if (!a.empty() && a[0] != '-' && folder.empty()) folder = a;
        else {
            std::fprintf(stderr, "usage: policy_bench FOLDER [--rebuild-from SRC] [--device cpu|cuda] [--dtype f32|bf16|f16] [--ticks N] [--json FILE] [--encoder-only N] [--batch N] [--warm N] [--sample-runs N]\n");
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
        if (dtype != "file") {
            lo.weight_dtype = weight_dtype_from_name(dtype);
            if (!lo.weight_dtype) throw Error("flowedge: policy_bench: unknown --dtype '" + dtype + "' (expected " + kWeightDTypeNames + ")");
        }
        if (device == "cuda") {
#ifdef FLOWEDGE_WITH_CUDA
            return encoder_only ? run_encoder_only<Cuda>(folder, lo, encoder_only, cuda::device_description())
                                : run<Cuda>(folder, lo, ticks, batch, warm, sample_runs, json_path, cuda::device_description());
#else
            std::fprintf(stderr, "policy_bench: this build has no CUDA backend\n");
            return 2;
#endif
        }
        if (device != "cpu") throw Error("flowedge: policy_bench: unknown --device '" + device + "' (expected cpu or cuda)");
        const std::string cpu_name = std::string("cpu, ") + cpu::kernel_set_name() + " kernels";
        return encoder_only ? run_encoder_only<Cpu>(folder, lo, encoder_only, cpu_name) : run<Cpu>(folder, lo, ticks, batch, warm, sample_runs, json_path, cpu_name);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
