// act_bench: latency of one ACT chunk (ActPolicy<B>::predict_action_chunk: upload, backbone, encoder, decoder, action
// head, copy back) on the CPU or the GPU, and, given LeRobot's reference run of the same folder, the chunk error.
// The folder is e.g. tools/make_reference_act.py --bench DIR (one 480x640 camera at LeRobot's default sizes), which
// also writes DIR_ref/ (the observations, LeRobot's chunks and its own chunk timing in info.json).
//
// It prints the chunk's work per part (multiply-adds and parameters: backbone and token projections, encoder, decoder
// and action head) and, on the CPU, the FLOP floor (2 x multiply-adds over this machine's measured FP32 FMA peak per
// core x threads, as bench/rgb_encoder_bench does) next to each thread count's latency and each part's.
//
// Usage: act_bench FOLDER [--ref DIR] [--rebuild-from SRC] [--device cpu|cuda] [--dtype f32|bf16|f16] [--math f32|tf32|bf16]
//                  [--chunks N] [--threads 1,2] [--json FILE] [--profile]
//   --math: ActPolicy::set_math before the reference comparison and the timing (default f32, exact).
//   --ref DIR: compare every step's chunk with DIR/chunks.npy (observations DIR/<key>.npy), max abs in normalised units.
//   --rebuild-from SRC: first write FOLDER from a fixture committed without its weights (manifest.json +
//   constants.safetensors).
//   --threads LIST: CPU thread counts to time, in order (default: the OpenMP default only).
//   --profile: CUDA only: after the warm-up, one chunk between cudaProfilerStart / Stop and no timing, for
//   `ncu --profile-from-start off --graph-profiling node` (the per-kernel table of one chunk).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <type_traits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../test/support/lerobot_fixture_folder.hpp"
#include "flowedge/io/npy.hpp"
#include "cpu_floor.hpp"
#include "flowedge/models/act/policy.hpp"
#ifdef FLOWEDGE_WITH_CUDA
#include "flowedge/cuda/device.hpp"
#endif

using namespace flowedge;
namespace fs = std::filesystem;

namespace {

/// Max |flowedge - LeRobot| over every step's chunk of the reference episode in `ref` (frames uint8 HWC); `bits`
/// gets an FNV-1a hash of every chunk's float bits (equal hashes: two builds computed the same chunks).
template <Backend B>
double reference_error(ActPolicy<B>& p, const fs::path& ref, std::uint64_t& bits) {
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
    bits = 1469598103934665603ull;
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
        for (std::size_t i = 0; i < CA; ++i) {
            worst = std::max(worst, std::fabs(double(chunk[i]) - double(chunks.data[t * CA + i])));
            std::uint32_t u;
            std::memcpy(&u, &chunk[i], sizeof u);
            bits = (bits ^ u) * 1099511628211ull;
        }
    }
    return worst;
}

struct Stats {
    double min = 0, p50 = 0, p99 = 0, max = 0;
};
Stats stats(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return {v.front(), v[v.size() / 2], v[std::min(v.size() - 1, std::size_t(std::ceil(0.99 * double(v.size()))) - 1)], v.back()};
}

/// The chunk's work per part, printed and as JSON (bytes: parameters x the loaded weights' element size).
nlohmann::json print_cost(const ActChunkCost& k, double weight_bytes) {
    nlohmann::json j = nlohmann::json::object();
    std::printf("  work per chunk (multiply-adds of the matrix products; LayerNorm, softmax, activations not counted):\n");
    auto row = [&](const char* name, const ActChunkCost::Part& p) {
        std::printf("    %-42s %8.3f GFLOP  %7.2f M parameters  %7.1f MB\n", name, 2e-9 * p.macs, 1e-6 * p.parameters,
                    1e-6 * p.parameters * weight_bytes);
        j[name] = {{"gflop", 2e-9 * p.macs}, {"parameters", p.parameters}, {"weight_bytes", p.parameters * weight_bytes}};
    };
    row("tokens (backbone, input projections)", k.tokens);
    row("encoder", k.encoder);
    row("decoder (and action head)", k.decoder);
    row("chunk", {k.macs(), k.parameters()});
    return j;
}

/// A repeatable observation of the policy's shapes: latency does not depend on the values.
struct SyntheticObservation {
    std::vector<float> state, env;
    std::vector<std::vector<std::uint8_t>> pixels;
    std::vector<PolicyFrame> frames;
    template <Backend B>
    explicit SyntheticObservation(const ActPolicy<B>& p) : state(std::size_t(p.state_dim()), 0.1f), env(std::size_t(p.env_dim()), 0.1f) {
        for (const auto& cam : p.cameras()) {
            pixels.emplace_back(std::size_t(cam.height) * cam.width * 3);
            for (std::size_t i = 0; i < pixels.back().size(); ++i) pixels.back()[i] = std::uint8_t(i * 37 % 251);
            frames.push_back(PolicyFrame{pixels.back().data(), ImageLayout::U8Hwc, cam.height, cam.width});
        }
    }
    PolicyObservation view() const { return PolicyObservation{state, env, frames}; }
};

template <Backend B>
int run(const std::string& folder, const LoadOptions& lo, MathMode math, const std::string& ref, int n_chunks,
        const std::vector<int>& threads, const std::string& json_path, const std::string& device, bool profile = false) {
    const bool cpu = std::is_same_v<B, Cpu>;
    auto t_load = std::chrono::steady_clock::now();
    ActPolicy<B> p = ActPolicy<B>::load(folder, {.load = lo});
    const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();
    if (math != MathMode::F32) {
        p.set_math(math);
        p.warm_up();  // set_math dropped the graph load() recorded
    }
    std::printf("act_bench %s on %s, math %s: %d encoder tokens, chunk %d x %d, load + warm-up %.1f ms\n", folder.c_str(),
                device.c_str(), math_mode_name(math), p.n_tokens(), p.config().chunk_size, p.action_dim(), load_ms);
    nlohmann::json out = {{"folder", folder},         {"device", device}, {"math", math_mode_name(math)},
                          {"tokens", p.n_tokens()}, {"chunk_size", p.config().chunk_size}};
    const ActChunkCost cost = p.cost();
    const double weight_bytes = double(lo.weight_dtype ? dtype_size(*lo.weight_dtype) : sizeof(float));
    out["work"] = print_cost(cost, weight_bytes);
    double peak = 0;
    if (cpu) {
        peak = bench::fma_peak_gflops_per_core();
        std::printf("  FP32 FMA peak %.1f GFLOP/s per core; load average %s\n", peak, bench::read_loadavg().c_str());
        out["fma_peak_gflops_per_core"] = peak;
        out["loadavg_before"] = bench::read_loadavg();
    }
    if (!ref.empty()) {
        std::uint64_t bits = 0;
        const double err = reference_error(p, ref, bits);
        std::printf("  chunks vs LeRobot (%s): max abs %.3g normalised; chunk bits hash %016llx\n", ref.c_str(), err,
                    static_cast<unsigned long long>(bits));
        out["max_abs_vs_lerobot"] = err;
        out["chunk_bits_fnv1a"] = bits;
    }
    const SyntheticObservation synthetic(p);
    const PolicyObservation obs = synthetic.view();
    std::vector<float> chunk(std::size_t(p.config().chunk_size) * std::size_t(p.action_dim()));
    out["runs"] = nlohmann::json::array();
    for (const int t : threads) {
        if (t > 0) bench::set_threads(t);
        for (int i = 0; i < 3; ++i) p.predict_action_chunk(obs, chunk);
#ifdef FLOWEDGE_WITH_CUDA
        if constexpr (std::is_same_v<B, Cuda>) {
            if (profile) {
                cuda::profiler_start();
                p.predict_action_chunk(obs, chunk);  // returns once the chunk is on the host
                cuda::profiler_stop();
                std::printf("  one chunk profiled (math %s)\n", math_mode_name(math));
                return 0;
            }
        }
#endif
        // Wall time per chunk, and at 1 thread also the thread's CPU time (see bench::thread_cpu_ms).
        const bool one = cpu && t == 1;
        std::vector<double> ms, cpu_ms;
        for (int i = 0; i < n_chunks; ++i) {
            const double c0 = bench::thread_cpu_ms();
            const auto t0 = std::chrono::steady_clock::now();
            p.predict_action_chunk(obs, chunk);
            ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
            cpu_ms.push_back(bench::thread_cpu_ms() - c0);
        }
        // The parts, timed one by one (each synchronized), as many times as the whole chunk; at 1 thread on the CPU
        // by the thread's CPU time too. A failure here (the parts run outside the recorded graph) is reported and
        // leaves the chunk numbers and the JSON.
        std::vector<double> tok, enc, dec, tok_cpu, enc_cpu, dec_cpu;
        std::string parts_error;
        try {
            for (int i = 0; i < n_chunks; ++i) {
                const ActPartTimes pt = p.time_parts(obs);
                tok.push_back(pt.tokens_ms);
                enc.push_back(pt.encoder_ms);
                dec.push_back(pt.decoder_ms);
                if (!one) continue;
                const ActPartTimes pc = p.time_parts(obs, bench::thread_cpu_ms);
                tok_cpu.push_back(pc.tokens_ms);
                enc_cpu.push_back(pc.encoder_ms);
                dec_cpu.push_back(pc.decoder_ms);
            }
        } catch (const std::exception& e) {
            parts_error = e.what();
        }
        const Stats s = stats(ms);
        nlohmann::json r = {{"threads", t}, {"chunk_ms", {{"n", ms.size()}, {"min", s.min}, {"p50", s.p50}, {"p99", s.p99}, {"max", s.max}}}};
        std::printf("  %s predict_action_chunk: n %zu  min %.3f ms  p50 %.3f ms  p99 %.3f ms  max %.3f ms\n",
                    t > 0 ? (std::to_string(t) + " thread(s)").c_str() : "default threads", ms.size(), s.min, s.p50, s.p99, s.max);
        if (one) {
            const Stats c = stats(cpu_ms);
            std::printf("    thread CPU time: min %.3f ms  p50 %.3f ms\n", c.min, c.p50);
            r["chunk_cpu_ms"] = {{"min", c.min}, {"p50", c.p50}};
        }
        // FLOP floor at t threads: 2 x multiply-adds / (peak per core x t).
        auto floor_ms = [&](double macs) { return cpu && t > 0 ? 2 * macs / (peak * 1e9 * t) * 1e3 : 0.0; };
        if (cpu && t > 0) {
            const double f = floor_ms(cost.macs());
            std::printf("    FLOP floor %.2f ms: wall min %.2fx, p50 %.2fx the floor", f, s.min / f, s.p50 / f);
            if (one) std::printf("; thread CPU time min %.2fx", stats(cpu_ms).min / f);
            std::printf("\n");
            r["floor_ms"] = f;
        }
        r["parts"] = nlohmann::json::object();
        if (!parts_error.empty()) {
            std::printf("    parts not timed: %s\n", parts_error.c_str());
            r["parts_error"] = parts_error;
            out["runs"].push_back(r);
            continue;
        }
        auto part = [&](const char* name, const std::vector<double>& v, const std::vector<double>& v_cpu, const ActChunkCost::Part& k) {
            const Stats ps = stats(v);
            const double f = floor_ms(k.macs);
            std::printf("    %-8s wall min %9.3f ms  p50 %9.3f ms", name, ps.min, ps.p50);
            r["parts"][name] = {{"min", ps.min}, {"p50", ps.p50}, {"floor_ms", f}};
            double best = ps.min;
            if (!v_cpu.empty()) {
                const Stats pc = stats(v_cpu);
                std::printf("  cpu min %9.3f ms", pc.min);
                r["parts"][name]["cpu_min"] = pc.min;
                best = std::min(best, pc.min);
            }
            if (f > 0) std::printf("  floor %8.3f ms  best %.2fx  (%.1f GFLOP/s)", f, best / f, 2e-9 * k.macs / (best * 1e-3));
            std::printf("\n");
        };
        part("tokens", tok, tok_cpu, cost.tokens);
        part("encoder", enc, enc_cpu, cost.encoder);
        part("decoder", dec, dec_cpu, cost.decoder);
        out["runs"].push_back(r);
    }
    if (cpu) out["loadavg_after"] = bench::read_loadavg();
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::string folder, rebuild, ref, device = "cpu", dtype = "file", math = "f32", json_path;
    int n_chunks = 200;
    bool profile = false;
    std::vector<int> threads{0};  // 0: the OpenMP default
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
        else if (a == "--math") math = next();
        else if (a == "--chunks") n_chunks = std::max(8, std::atoi(next().c_str()));
        else if (a == "--json") json_path = next();
        else if (a == "--profile") profile = true;
        else if (a == "--threads") {
            threads.clear();
            std::stringstream list(next());
            for (std::string item; std::getline(list, item, ',');) threads.push_back(std::max(1, std::atoi(item.c_str())));
        }
        else if (!a.empty() && a[0] != '-' && folder.empty()) folder = a;
        else {
            std::fprintf(stderr, "usage: act_bench FOLDER [--ref DIR] [--rebuild-from SRC] [--device cpu|cuda] [--dtype f32|bf16|f16] "
                                 "[--math f32|tf32|bf16] [--chunks N] [--threads 1,2] [--json FILE] [--profile]\n");
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
        if (dtype != "file") {
            lo.weight_dtype = weight_dtype_from_name(dtype);
            if (!lo.weight_dtype) throw Error("flowedge: act_bench: unknown --dtype '" + dtype + "' (expected " + kWeightDTypeNames + ")");
        }
        const MathMode mode = parse_math_mode(math);
        if (device == "cuda") {
#ifdef FLOWEDGE_WITH_CUDA
            return run<Cuda>(folder, lo, mode, ref, n_chunks, std::vector<int>{0}, json_path, cuda::device_description(), profile);
#else
            std::fprintf(stderr, "act_bench: this build has no CUDA backend\n");
            return 2;
#endif
        }
        if (device != "cpu") throw Error("flowedge: act_bench: unknown --device '" + device + "' (expected cpu or cuda)");
        if (profile) throw Error("flowedge: act_bench: --profile needs --device cuda (it brackets one chunk for ncu)");
        return run<Cpu>(folder, lo, mode, ref, n_chunks, threads, json_path, std::string("cpu, ") + cpu::kernel_set_name() + " kernels");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
