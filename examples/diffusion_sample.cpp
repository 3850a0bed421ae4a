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
#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef FLOWEDGE_WITH_CUDA
#include <flowedge/cuda/device.hpp>
#endif
#include <flowedge/io/npy.hpp>
#include <flowedge/models/diffusion/head.hpp>
#include <flowedge/residency.hpp>

using namespace flowedge;

namespace {
/// Reads a float32 .npy (--cond / --noise) and checks it holds `want` values, naming the flag and the expected shape.
std::vector<float> read_input(const std::string& path, const char* flag, std::size_t want, const std::string& shape) {
    io::NpyArrayF32 a = io::read_npy_f32(path);
    if (a.data.size() != want)
        fail("diffusion_sample", std::string(flag) + " " + path + " has the wrong number of values" +
                                     expected_got(std::to_string(want) + " = " + shape, std::to_string(a.data.size())));
    return std::move(a.data);
}

/// Storage dtype of the U-Net weights in the file (that of its largest tensor: the conv weights dominate), so the
/// latency line names what actually ran when --dtype is not given.
std::string file_weight_dtype(const std::string& model) {
    const io::DiffusionCheckpoint ck = io::open_diffusion_checkpoint(model);
    const io::TensorInfo* largest = nullptr;
    for (const io::TensorInfo& t : ck.weights->tensors())
        if (t.supported() && (!largest || t.bytes > largest->bytes)) largest = &t;
    return std::string(largest ? dtype_name(largest->dtype) : "f32");
}

/// What the latency depends on: the GPU, or the CPU with its threads and the kernel set this build uses.
std::string machine_summary(bool on_gpu) {
#ifdef FLOWEDGE_WITH_CUDA
    if (on_gpu) return cuda::device_description();
#else
    (void)on_gpu;
#endif
    std::string name = "unknown CPU";
    std::ifstream info("/proc/cpuinfo");
    for (std::string line; std::getline(info, line);)
        if (line.rfind("model name", 0) == 0) {
            name = line.substr(line.find(':') + 2);
            break;
        }
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
#else
    const int threads = 1;
#endif
    return name + ", " + std::to_string(threads) + " thread" + (threads == 1 ? "" : "s") + ", " + cpu::kernel_set_name() + " kernels";
}
}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Sample an action horizon from a Diffusion Policy checkpoint (LeRobot pretrained_model folder or compact\n"
                 "*.flowedge.safetensors). Without --cond/--noise: zero condition, noise[i] = sin(0.37*(i+1)).\n"
                 "Prints the un-normalised horizon (one row per step: action[0] action[1] ...), which rows a robot\n"
                 "executes, and the latency with the CPU/GPU it ran on."};
    app.option_defaults()->always_capture_default();
    std::string model, scheduler_arg = "ddim", device_arg = "cpu", dtype_arg = "file", math_arg = "f32", cond_path, noise_path,
                       out_path;
    int steps = 10, batch = 1, repeats = 3;
    std::uint64_t seed = 0;
    app.add_option("MODEL", model, "LeRobot pretrained_model folder or *.flowedge.safetensors")->required();
    app.add_option("STEPS", steps, "inference steps (1..num_train_timesteps)");
    app.add_option("--scheduler", scheduler_arg, "ddim | ddpm")
        ->transform(CLI::IsMember({"ddim", "ddpm"}, CLI::ignore_case));
    app.add_option("--seed", seed, "DDPM step-noise seed (batch element b uses seed + b); DDIM does not use it");
    app.add_option("--cond", cond_path, ".npy float32 condition [batch, global_cond_dim] (default: zeros)");
    app.add_option("--noise", noise_path, ".npy float32 initial noise [batch, horizon, action_dim] (default: sin pattern)");
    app.add_option("--out", out_path, "write the un-normalised horizon [batch, horizon, action_dim] as .npy");
    app.add_option("--batch", batch, "samples per call")->check(CLI::Range(1, 4096));
    app.add_option("--device", device_arg, "cpu | cuda (cuda fails unless the model is resident on the GPU)")
        ->transform(CLI::IsMember({"cpu", "cuda"}, CLI::ignore_case));
    app.add_option("--dtype", dtype_arg, "weight storage: file (as stored) | f32 | bf16 | f16")
        ->transform(CLI::IsMember({"file", "f32", "bf16", "f16"}, CLI::ignore_case));
    app.add_option("--math", math_arg, "convolution arithmetic: f32 (exact) | tf32 | bf16 (opt-in tensor-core math for "
                                       "batched calls on CUDA, see DiffusionHead::set_math)")
        ->transform(CLI::IsMember({"f32", "tf32", "bf16"}, CLI::ignore_case));
    app.add_option("--repeats", repeats, "timed repetitions after one warm-up (median printed)")->check(CLI::Range(1, 100000));
    CLI11_PARSE(app, argc, argv);

    try {
        const Device device = parse_device(device_arg);
        if (device == Device::Cuda && !backend_available_v<Cuda>) {
            std::cerr << "flowedge: diffusion_sample: this build has no CUDA backend (configure with -DFLOWEDGE_BACKEND=cuda); "
                         "use --device cpu\n";
            return 2;
        }
        const Scheduler scheduler = parse_scheduler(scheduler_arg);
        if (scheduler == Scheduler::Ddim && app.count("--seed"))
            std::cerr << "note: --seed is ignored with DDIM (deterministic: no step noise); it seeds --scheduler ddpm\n";
        LoadOptions opts;
        if (dtype_arg == "f32") opts.weight_dtype = DType::F32;
        if (dtype_arg == "bf16") opts.weight_dtype = DType::BF16;
        if (dtype_arg == "f16") opts.weight_dtype = DType::F16;
        const std::string weights = opts.weight_dtype ? std::string(dtype_name(*opts.weight_dtype)) : file_weight_dtype(model);
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
            const std::string b = std::to_string(batch);
            if (!cond_path.empty())
                cond = read_input(cond_path, "--cond", cond.size(), "[" + b + ", " + std::to_string(c.global_cond_dim) + "]");
            if (!noise_path.empty())
                noise = read_input(noise_path, "--noise", noise.size(),
                                   "[" + b + ", " + std::to_string(c.horizon) + ", " + std::to_string(c.action_dim) + "]");
            const SampleOptions so{.steps = steps, .scheduler = scheduler, .seed = seed};
            head.sample(cond, noise, actions, so, batch);  // warm-up (and, on CUDA, graph capture)
            std::vector<double> ms;
            for (int r = 0; r < repeats; ++r) {
                const auto t0 = std::chrono::steady_clock::now();
                head.sample(cond, noise, actions, so, batch);
                ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
            }
            std::sort(ms.begin(), ms.end());
            // LeRobot executes n_action_steps rows starting at the newest observation (row n_obs_steps - 1).
            const int first = c.n_obs_steps - 1, last = c.n_obs_steps - 2 + c.n_action_steps;
            for (int bi = 0; bi < batch; ++bi) {
                std::cout << "horizon" << (batch > 1 ? " (sample " + std::to_string(bi) + ")" : std::string()) << ": "
                          << c.horizon << " rows x " << c.action_dim << " action values, un-normalised; rows " << first << ".."
                          << last << " (marked <) are executed:\n";
                for (int h = 0; h < c.horizon; ++h) {
                    std::cout << "  " << h << ":";
                    for (int a = 0; a < c.action_dim; ++a) std::cout << " " << actions[(std::size_t(bi) * c.horizon + h) * c.action_dim + a];
                    std::cout << (h >= first && h <= last ? "  <" : "") << "\n";
                }
            }
            if (!out_path.empty()) {
                const std::int64_t shape[3] = {batch, c.horizon, c.action_dim};
                io::write_npy_f32(out_path, shape, actions);
            }
            std::printf("latency (%s, %s %d steps, batch %d, weights %s): p50=%.1f ms  min=%.1f ms  (%d runs)\n", resident.backend(),
                        scheduler_name(scheduler), steps, batch, weights.c_str(), ms[ms.size() / 2], ms.front(), repeats);
            std::printf("latency depends on the machine: %s\n", machine_summary(resident.cuda_resident()).c_str());
            return 0;
        });
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
}
