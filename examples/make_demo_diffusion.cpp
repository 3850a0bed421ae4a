// flowedge-make-demo-diffusion: writes a deterministic PushT-shaped compact Diffusion Policy checkpoint
// (251.5 M parameters, LeRobot-like init scales) so the CPU/CUDA programs and benchmarks have a model to load;
// --down-dims gives a smaller U-Net of the same layout (the aarch64 emulation check uses one).
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <system_error>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <flowedge/models/diffusion/lerobot_checkpoint.hpp>
#include <flowedge/models/diffusion/head.hpp>

using namespace flowedge;

namespace {
/// SplitMix64 uniform generator (fast, deterministic across platforms).
struct SplitMix {
    std::uint64_t s;
    std::uint64_t next() {
        s += 0x9e3779b97f4a7c15ull;
        std::uint64_t z = s;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    /// Uniform in [-1, 1) with 24 random bits.
    float symmetric() { return float(std::int64_t(next() >> 40) - (1ll << 23)) * (1.f / float(1 << 23)); }
};

struct Entry {
    std::string name;
    Shape shape;
    enum Kind { Uniform, NormWeight, NormBias, Fixed } kind;
    float bound = 0.f;
    std::vector<float> fixed;
};
}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Write a deterministic PushT-shaped Diffusion Policy checkpoint in the compact *.flowedge.safetensors form:\n"
                 "down_dims 512/1024/2048 (--down-dims), kernel 5, 8 groups, Td 128, global cond 132, action_dim 2, horizon 16,\n"
                 "n_obs_steps 2, n_action_steps 8, T 100, clip 1.0; PyTorch default init bounds 1/sqrt(fan_in)."};
    app.option_defaults()->always_capture_default();
    std::string out = "models/diffusion_pusht.flowedge.safetensors";
    std::uint64_t seed = 20240607;
    app.add_option("OUT", out, "output path (default models/diffusion_pusht.flowedge.safetensors)");
    app.add_option("--seed", seed, "SplitMix64 seed of the initialisation");
    DiffusionConfig cfg;  // PushT defaults
    app.add_option("--down-dims", cfg.down_dims,
                   "U-Net stage widths (a smaller model of the same layout, e.g. 128,256,512 for a 69 MB file)")
        ->delimiter(',');
    CLI11_PARSE(app, argc, argv);
    try {
        const auto t0 = std::chrono::steady_clock::now();
        cfg.scheduler = Scheduler::Ddim;
        cfg.validate();
        std::vector<Entry> entries;
        {
            ConditionalUnet1d<Cpu> skeleton(cfg);
            float last_bound = 0.f;
            skeleton.visit_parameters([&](const std::string& name, Parameter<Cpu>&, const Shape& s, Storage) {
                Entry e{io::diffusion_compact_name(name), s, Entry::Uniform, 0.f, {}};
                const bool norm = name.find("block.1.") != std::string::npos;
                const bool weight = name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0;
                if (norm) {
                    e.kind = weight ? Entry::NormWeight : Entry::NormBias;
                } else if (weight) {
                    // Conv1d [out, in, k] and ConvTranspose1d [in, out, k] both take fan_in = size(1) * k
                    // (torch's _calculate_fan_in_and_fan_out); Linear [out, in] takes in.
                    const double fan = s.rank == 2 ? double(s[1]) : double(s[1]) * double(s[2]);
                    e.bound = last_bound = float(1.0 / std::sqrt(fan));
                } else {
                    e.bound = last_bound;  // bias: same bound as its weight
                }
                entries.push_back(std::move(e));
            });
        }
        const auto meta = io::diffusion_meta(cfg);
        entries.push_back({"dp.action_min", Shape{2}, Entry::Fixed, 0.f, {12.2f, 25.6f}});
        entries.push_back({"dp.action_max", Shape{2}, Entry::Fixed, 0.f, {511.0f, 497.8f}});
        entries.push_back({"dp.dims", Shape{std::int64_t(cfg.down_dims.size())}, Entry::Fixed, 0.f,
                           std::vector<float>(cfg.down_dims.begin(), cfg.down_dims.end())});
        entries.push_back({"dp.meta", Shape{16}, Entry::Fixed, 0.f, std::vector<float>(meta.begin(), meta.end())});

        nlohmann::json header = nlohmann::json::object();
        std::size_t offset = 0, n_params = 0;
        for (const Entry& e : entries) {
            const std::size_t bytes = std::size_t(e.shape.numel()) * 4;
            std::vector<std::int64_t> dims(e.shape.dims.begin(), e.shape.dims.begin() + e.shape.rank);
            header[e.name] = {{"dtype", "F32"}, {"shape", dims}, {"data_offsets", {offset, offset + bytes}}};
            offset += bytes;
            if (e.kind != Entry::Fixed) n_params += std::size_t(e.shape.numel());
        }
        header["__metadata__"] = {{"format", "flowedge-diffusion"}, {"generator", "flowedge-make-demo-diffusion"},
                                  {"seed", std::to_string(seed)}};
        std::string h = header.dump();
        while ((8 + h.size()) % 8) h.push_back(' ');
        const std::filesystem::path path(out);
        if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
        std::ofstream f(path, std::ios::binary | std::ios::trunc);
        if (!f) fail("make-demo-diffusion", "cannot open '" + out + "' for writing");
        errno = 0;
        const std::uint64_t hl = h.size();
        unsigned char len[8];
        for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(hl >> (8 * i));
        f.write(reinterpret_cast<const char*>(len), 8);
        f.write(h.data(), std::streamsize(h.size()));
        SplitMix rng{seed};
        std::vector<float> chunk(1 << 20);
        for (const Entry& e : entries) {
            if (e.kind == Entry::Fixed) {
                f.write(reinterpret_cast<const char*>(e.fixed.data()), std::streamsize(e.fixed.size() * 4));
                continue;
            }
            std::size_t left = std::size_t(e.shape.numel());
            while (left) {
                const std::size_t n = std::min(left, chunk.size());
                for (std::size_t i = 0; i < n; ++i) {
                    const float r = rng.symmetric();
                    chunk[i] = e.kind == Entry::Uniform ? e.bound * r : e.kind == Entry::NormWeight ? 1.f + 0.05f * r : 0.05f * r;
                }
                f.write(reinterpret_cast<const char*>(chunk.data()), std::streamsize(n * 4));
                left -= n;
            }
        }
        f.close();
        if (!f) {
            // Name the cause: a full disk (the 1 GB checkpoint) is the usual one and needs the numbers to act on.
            const int err = errno;
            std::error_code ec;
            const auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
            const auto space = std::filesystem::space(dir, ec);
            const std::string free_text = ec ? "free space unknown" : std::to_string(space.available >> 20) + " MiB free there";
            fail(ErrorKind::Io, "make-demo-diffusion",
                 "cannot write '" + out + "': " + (err ? std::generic_category().message(err) : "write failed") + " (" +
                     std::to_string((8 + h.size() + offset) >> 20) + " MiB needed, " + free_text + ")");
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::cout << "wrote " << out << ": " << n_params << " U-Net parameters, " << (8 + h.size() + offset) << " bytes in "
                  << s << " s\n";
        return 0;
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
}
