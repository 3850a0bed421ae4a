// diffusion_sample: samples one action horizon from a Diffusion Policy checkpoint (LeRobot folder or compact file)
// and prints it un-normalised with the latency, on the CPU or (in a CUDA build) the GPU.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <flowedge/models/diffusion/head.hpp>
#include <flowedge/runtime.hpp>

using namespace flowedge;

namespace {
/// Reads a little-endian float32 C-order .npy file (any shape) into a flat vector.
std::vector<float> read_npy_f32(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("diffusion_sample", "cannot open '" + path + "'");
    char magic[8];
    f.read(magic, 8);
    if (!f || std::memcmp(magic, "\x93NUMPY", 6) != 0) fail("diffusion_sample", path + ": not a .npy file");
    std::size_t hl = 0;
    if (magic[6] == 1) {
        unsigned char b[2];
        f.read(reinterpret_cast<char*>(b), 2);
        hl = b[0] | (std::size_t(b[1]) << 8);
    } else {
        unsigned char b[4];
        f.read(reinterpret_cast<char*>(b), 4);
        hl = b[0] | (std::size_t(b[1]) << 8) | (std::size_t(b[2]) << 16) | (std::size_t(b[3]) << 24);
    }
    std::string header(hl, '\0');
    f.read(header.data(), std::streamsize(hl));
    if (header.find("'<f4'") == std::string::npos)
        fail("diffusion_sample", path + ": .npy dtype must be float32 little-endian" + expected_got("<f4", header.substr(0, 40)));
    if (header.find("'fortran_order': True") != std::string::npos) fail("diffusion_sample", path + ": Fortran-order .npy not supported");
    const auto lp = header.find('('), rp = header.find(')');
    std::size_t n = 1;
    std::string dims = header.substr(lp + 1, rp - lp - 1);
    for (std::size_t at = 0; at < dims.size();) {
        const std::size_t comma = dims.find(',', at);
        const std::string tok = dims.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        if (tok.find_first_of("0123456789") != std::string::npos) n *= std::stoull(tok);
        if (comma == std::string::npos) break;
        at = comma + 1;
    }
    std::vector<float> v(n);
    f.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * 4));
    if (!f) fail("diffusion_sample", path + ": truncated data" + expected_got(n * 4, "fewer bytes"));
    return v;
}

/// Writes a float32 .npy file of the given shape.
void write_npy_f32(const std::string& path, const std::vector<float>& v, const std::vector<int>& shape) {
    std::string dims;
    for (int d : shape) dims += std::to_string(d) + ",";
    if (shape.size() > 1) dims.pop_back();
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
    while ((10 + header.size() + 1) % 64) header.push_back(' ');
    header.push_back('\n');
    std::ofstream f(path, std::ios::binary);
    if (!f) fail("diffusion_sample", "cannot open '" + path + "' for writing");
    f.write("\x93NUMPY\x01\x00", 8);
    const unsigned char hl[2] = {static_cast<unsigned char>(header.size() & 0xff), static_cast<unsigned char>(header.size() >> 8)};
    f.write(reinterpret_cast<const char*>(hl), 2);
    f.write(header.data(), std::streamsize(header.size()));
    f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
}
}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Sample an action horizon from a Diffusion Policy checkpoint (LeRobot pretrained_model folder or compact\n"
                 "*.flowedge.safetensors). Defaults: zero condition, noise[i] = sin(0.37*(i+1)), DDIM, 10 steps.\n"
                 "Prints the un-normalised horizon (one row per step: action[0] action[1] ...) and the latency."};
    std::string model, scheduler_arg = "ddim", device_arg = "cpu", dtype_arg = "f32", math_arg = "f32", cond_path, noise_path, out_path;
    int steps = 10, batch = 1, repeats = 3;
    std::uint64_t seed = 0;
    app.add_option("MODEL", model, "LeRobot pretrained_model folder or *.flowedge.safetensors")->required();
    app.add_option("STEPS", steps, "inference steps (1..num_train_timesteps)");
    app.add_option("--scheduler", scheduler_arg, "ddim | ddpm");
    app.add_option("--seed", seed, "DDPM noise seed (batch element b uses seed + b)");
    app.add_option("--cond", cond_path, ".npy float32 condition [batch, global_cond_dim] (default zeros)");
    app.add_option("--noise", noise_path, ".npy float32 initial noise [batch, horizon, action_dim]");
    app.add_option("--out", out_path, "write the un-normalised horizon [batch, horizon, action_dim] as .npy");
    app.add_option("--batch", batch, "samples per call")->check(CLI::Range(1, 4096));
    app.add_option("--device", device_arg, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
    app.add_option("--dtype", dtype_arg, "weight storage: f32 | bf16 | f16")->check(CLI::IsMember({"f32", "bf16", "f16"}));
    app.add_option("--math", math_arg, "convolution arithmetic: f32 (exact) | tf32 | bf16 (opt-in tensor-core math for "
                                       "batched calls on CUDA, see DiffusionHead::set_math)")
        ->check(CLI::IsMember({"f32", "tf32", "bf16"}));
    app.add_option("--repeats", repeats, "timed repetitions after one warm-up (median printed)")->check(CLI::Range(1, 100000));
    CLI11_PARSE(app, argc, argv);

    try {
        const Device device = parse_device(device_arg);
        if (device == Device::Cuda && !backend_available_v<Cuda>) {
            std::cerr << "flowedge: diffusion_sample: this build has no CUDA backend (configure with -DFLOWEDGE_BACKEND=cuda)\n";
            return 2;
        }
        const Scheduler scheduler = parse_scheduler(scheduler_arg);
        LoadOptions opts;
        if (dtype_arg == "bf16") opts.weight_dtype = DType::BF16;
        if (dtype_arg == "f16") opts.weight_dtype = DType::F16;
        auto resident = Resident<DiffusionHead>::load(device, ResidencyFlags::from_env(), [&](auto tag) {
            return DiffusionHead<decltype(tag)>::load(model, opts, batch);
        });
        try {
            resident.require(device, "diffusion_sample");
        } catch (const Error& e) {
            std::cerr << e.what() << "\n";
            return 2;
        }
        return resident.visit([&](auto& head) {
            head.set_math(parse_math_mode(math_arg));
            const DiffusionConfig& c = head.config();
            const std::size_t per = std::size_t(c.horizon) * c.action_dim;
            std::vector<float> cond(std::size_t(batch) * c.global_cond_dim, 0.f), noise(std::size_t(batch) * per), actions(noise.size());
            for (std::size_t i = 0; i < noise.size(); ++i) noise[i] = std::sin(0.37f * float(i + 1));
            if (!cond_path.empty()) cond = read_npy_f32(cond_path);
            if (!noise_path.empty()) noise = read_npy_f32(noise_path);
            const SampleOptions so{.steps = steps, .scheduler = scheduler, .seed = seed};
            head.sample(cond, noise, actions, so, batch);  // warm-up (and, on CUDA, graph capture)
            std::vector<double> ms;
            for (int r = 0; r < repeats; ++r) {
                const auto t0 = std::chrono::steady_clock::now();
                head.sample(cond, noise, actions, so, batch);
                ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
            }
            std::sort(ms.begin(), ms.end());
            for (int b = 0; b < batch; ++b) {
                std::cout << "horizon" << (batch > 1 ? " (sample " + std::to_string(b) + ")" : std::string()) << ", un-normalised, rows "
                          << c.n_obs_steps - 1 << ".." << c.n_obs_steps - 2 + c.n_action_steps << " executed:\n";
                for (int h = 0; h < c.horizon; ++h) {
                    std::cout << "  " << h << ":";
                    for (int a = 0; a < c.action_dim; ++a) std::cout << " " << actions[(std::size_t(b) * c.horizon + h) * c.action_dim + a];
                    std::cout << "\n";
                }
            }
            if (!out_path.empty()) write_npy_f32(out_path, actions, {batch, c.horizon, c.action_dim});
            std::printf("latency (%s, %s %d steps, batch %d, weights %s): p50=%.1f ms  min=%.1f ms  (%d runs)\n", resident.backend(),
                        scheduler_name(scheduler), steps, batch, dtype_arg.c_str(), ms[ms.size() / 2], ms.front(), repeats);
            return 0;
        });
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
}
