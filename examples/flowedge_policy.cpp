// flowedge-policy: runs LeRobot's whole DiffusionPolicy over a recorded episode. OBS.npz holds one array per
// LeRobot feature key ([T, ...] each); the program calls reset() and then select_action() T times, exactly as a
// LeRobot rollout does, and writes the T un-normalised actions [T, action_dim] to ACTIONS.npy.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#ifdef FLOWEDGE_WITH_CUDA
#include <flowedge/cuda/device.hpp>
#endif
#include <flowedge/io/npy.hpp>
#include <flowedge/io/npz.hpp>
#include <flowedge/models/diffusion/policy.hpp>
#include <flowedge/residency.hpp>

using namespace flowedge;

namespace {

constexpr const char* kProgram = "flowedge-policy";

std::string shape_str(const std::vector<std::int64_t>& s) {
    std::string out = "[";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

/// The arrays of one episode, checked against the policy's features: camera frames (uint8 HWC or float32 CHW),
/// state and environment state, all with the same leading T.
struct Episode {
    std::int64_t steps = -1;
    std::string steps_from;                 ///< the key that set T (for the error when another disagrees)
    std::vector<io::NpyArrayU8> frames_u8;  ///< per camera; empty data when that camera is float
    std::vector<io::NpyArrayF32> frames_f32;
    std::vector<ImageLayout> layouts;
    io::NpyArrayF32 state, env;
};

class EpisodeReader {
public:
    explicit EpisodeReader(const io::Npz& npz) : m_npz(npz) {}

    /// Checks a [T, rest...] array's shape and T (the first array read sets T).
    void check_shape(const std::string& key, const std::vector<std::int64_t>& got, const std::vector<std::int64_t>& rest,
                     const std::string& expected, Episode& ep) const {
        bool ok = got.size() == rest.size() + 1;
        for (std::size_t i = 0; ok && i < rest.size(); ++i) ok = got[i + 1] == rest[i];
        if (!ok) fail(ErrorKind::BadShape, kProgram, m_npz.where() + ": '" + key + "' has the wrong shape" + expected_got(expected, shape_str(got)));
        if (ep.steps < 0) {
            ep.steps = got[0];
            ep.steps_from = key;
        } else if (got[0] != ep.steps) {
            fail(ErrorKind::BadShape, kProgram, m_npz.where() + ": '" + key + "' has " + std::to_string(got[0]) + " steps but '" +
                                                    ep.steps_from + "' has " + std::to_string(ep.steps) +
                                                    expected_got("T = " + std::to_string(ep.steps), std::to_string(got[0])));
        }
    }

    /// A float32 [T, dim] feature (state or environment state).
    io::NpyArrayF32 vector_feature(const std::string& key, int dim, Episode& ep) const {
        const std::string expected = "float32 [T, " + std::to_string(dim) + "]";
        require_key(key, expected);
        const io::NpzArrayInfo& info = m_npz.info(key);
        if (!is_f32(info.descr)) fail(ErrorKind::BadInput, kProgram, wrong_dtype(key, expected, info));
        check_shape(key, info.shape, {dim}, expected, ep);
        return m_npz.f32(key);
    }

    /// A camera: uint8 [T, H, W, 3] or float32 [T, 3, H, W] in [0, 1].
    void camera(const io::PolicyCamera& cam, Episode& ep) const {
        const std::string h = std::to_string(cam.height), w = std::to_string(cam.width), c = std::to_string(cam.channels);
        const std::string expected = "uint8 [T, " + h + ", " + w + ", " + c + "] or float32 [T, " + c + ", " + h + ", " + w + "] in [0, 1]";
        require_key(cam.key, expected);
        const io::NpzArrayInfo& info = m_npz.info(cam.key);
        const bool u8 = info.descr.size() == 3 && info.descr.substr(1) == "u1";
        if (!u8 && !is_f32(info.descr)) fail(ErrorKind::BadInput, kProgram, wrong_dtype(cam.key, expected, info));
        if (u8) {
            check_shape(cam.key, info.shape, {cam.height, cam.width, cam.channels}, expected, ep);
            ep.frames_u8.push_back(m_npz.u8(cam.key));
            ep.frames_f32.emplace_back();
            ep.layouts.push_back(ImageLayout::U8Hwc);
        } else {
            check_shape(cam.key, info.shape, {cam.channels, cam.height, cam.width}, expected, ep);
            ep.frames_u8.emplace_back();
            ep.frames_f32.push_back(m_npz.f32(cam.key));
            ep.layouts.push_back(ImageLayout::F32Chw);
        }
    }

private:
    static bool is_f32(const std::string& d) { return d == "<f4" || d == "=f4"; }

    void require_key(const std::string& key, const std::string& expected) const {
        if (m_npz.contains(key)) return;
        std::string have;
        for (const std::string& n : m_npz.names()) have += (have.empty() ? "'" : ", '") + n + "'";
        fail(ErrorKind::BadInput, kProgram, m_npz.where() + ": missing array '" + key + "' (expected " + expected + "; the file has " +
                                                (have.empty() ? std::string("no arrays") : have) + ")");
    }

    std::string wrong_dtype(const std::string& key, const std::string& expected, const io::NpzArrayInfo& info) const {
        return m_npz.where() + ": '" + key + "' has the wrong dtype" + expected_got(expected, info.type_name() + " " + shape_str(info.shape));
    }

    const io::Npz& m_npz;
};

/// Storage dtype of the weights as the folder holds them (that of the largest tensor), for the summary line.
std::string file_weight_dtype(const std::string& folder) {
    const io::DiffusionCheckpoint ck = io::open_diffusion_checkpoint(folder);
    const io::TensorInfo* largest = nullptr;
    for (const io::TensorInfo& t : ck.weights->tensors())
        if (t.supported() && (!largest || t.bytes > largest->bytes)) largest = &t;
    return std::string(largest ? dtype_name(largest->dtype) : "F32");
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Run LeRobot's DiffusionPolicy over an episode: reset(), then select_action() once per step of OBS.npz.\n"
                 "OBS.npz holds arrays named by the LeRobot feature keys, T steps each: 'observation.image' or\n"
                 "'observation.images.<cam>' as [T, H, W, 3] uint8 or [T, 3, H, W] float32 in [0, 1];\n"
                 "'observation.state' [T, d]; 'observation.environment_state' [T, d] when the policy uses it\n"
                 "(np.savez or np.savez_compressed). Writes the un-normalised actions [T, action_dim] to ACTIONS.npy."};
    app.option_defaults()->always_capture_default();
    std::string folder, obs_path, out_path, noise_path, device_arg = "cpu", scheduler_arg, dtype_arg = "file";
    int steps = 0;
    std::uint64_t seed = 0;
    app.add_option("FOLDER", folder, "LeRobot DiffusionPolicy pretrained_model folder")->required();
    app.add_option("--obs", obs_path, ".npz of observation arrays keyed by LeRobot feature names, [T, ...] each")->required();
    app.add_option("--out", out_path, "write the un-normalised actions [T, action_dim] as float32 .npy")->required();
    app.add_option("--noise", noise_path, ".npy float32 [K, horizon, action_dim]: initial noise of the k-th chunk generation "
                                          "(default: seeded noise)");
    app.add_option("--device", device_arg, "cpu | cuda (cuda fails unless the policy is resident on the GPU)")
        ->transform(CLI::IsMember({"cpu", "cuda"}, CLI::ignore_case));
    app.add_option("--steps", steps, "inference steps (0 = the checkpoint's num_inference_steps, else num_train_timesteps)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--scheduler", scheduler_arg, "ddim | ddpm (default: the checkpoint's noise_scheduler_type)")
        ->transform(CLI::IsMember({"ddim", "ddpm"}, CLI::ignore_case));
    app.add_option("--seed", seed, "seed of the generated noise (initial noise without --noise, and DDPM step noise)");
    app.add_option("--dtype", dtype_arg, "weight storage: file (as stored) | f32 | bf16 | f16")
        ->transform(CLI::IsMember({"file", "f32", "bf16", "f16"}, CLI::ignore_case));
    CLI11_PARSE(app, argc, argv);

    try {
        const Device device = parse_device(device_arg);
        if (device == Device::Cuda && !backend_available_v<Cuda>) {
            std::cerr << "flowedge: " << kProgram << ": this build has no CUDA backend (configure with -DFLOWEDGE_BACKEND=cuda); "
                         "use --device cpu\n";
            return 2;
        }
        if (!std::filesystem::exists(folder))  // the folder reader takes a file's parent: name a mistyped folder as such
            fail(ErrorKind::Io, kProgram, folder + ": no such folder (expected a LeRobot pretrained_model folder)");
        PolicyOptions opts;
        if (dtype_arg == "f32") opts.load.weight_dtype = DType::F32;
        if (dtype_arg == "bf16") opts.load.weight_dtype = DType::BF16;
        if (dtype_arg == "f16") opts.load.weight_dtype = DType::F16;
        opts.steps = steps;
        if (!scheduler_arg.empty()) opts.scheduler = parse_scheduler(scheduler_arg);
        opts.seed = seed;
        const std::string weights = opts.load.weight_dtype ? std::string(dtype_name(*opts.load.weight_dtype)) : file_weight_dtype(folder);
        const io::Npz npz = io::read_npz(obs_path);
        std::optional<io::NpyArrayF32> noise;
        if (!noise_path.empty()) noise = io::read_npy_f32(noise_path);

        auto resident = Resident<DiffusionPolicy>::load(device, ResidencyFlags::from_env(),
                                                        [&](auto tag) { return DiffusionPolicy<decltype(tag)>::load(folder, opts); });
        try {
            resident.require(device, kProgram);
        } catch (const Error& e) {
            std::cerr << e.what() << "\n";
            return 2;
        }
        return resident.visit([&](auto& policy) {
            const DiffusionConfig& c = policy.config();
            // Every input is checked before the first select_action: keys, dtypes, shapes, one T for all.
            const EpisodeReader reader(npz);
            Episode ep;
            std::vector<std::string> used;
            for (const io::PolicyCamera& cam : policy.cameras()) {
                reader.camera(cam, ep);
                used.push_back(cam.key);
            }
            ep.state = reader.vector_feature(policy.state_key(), policy.state_dim(), ep);
            used.push_back(policy.state_key());
            if (policy.env_dim() > 0) {
                ep.env = reader.vector_feature(policy.env_key(), policy.env_dim(), ep);
                used.push_back(policy.env_key());
            }
            for (const std::string& n : npz.names())
                if (std::find(used.begin(), used.end(), n) == used.end())
                    std::cerr << "note: " << obs_path << ": array '" << n << "' is not an input of this policy (ignored)\n";
            const std::int64_t T = ep.steps;
            if (T < 1) fail(ErrorKind::BadShape, kProgram, obs_path + ": the episode has no steps" + expected_got("T >= 1", T));
            // The action queue holds n_action_steps actions: a chunk is generated at steps 0, n, 2n, ...
            const std::int64_t chunks = (T + c.n_action_steps - 1) / c.n_action_steps;
            const std::size_t per_chunk = std::size_t(c.horizon) * c.action_dim;
            if (noise) {
                const std::string want = "[K, " + std::to_string(c.horizon) + ", " + std::to_string(c.action_dim) + "]";
                if (noise->shape.size() != 3 || noise->shape[1] != c.horizon || noise->shape[2] != c.action_dim)
                    fail(ErrorKind::BadShape, kProgram, "--noise " + noise_path + " has the wrong shape" + expected_got(want, shape_str(noise->shape)));
                if (noise->shape[0] < chunks)
                    fail(ErrorKind::BadShape, kProgram,
                         "--noise " + noise_path + " holds noise for " + std::to_string(noise->shape[0]) + " chunks but the episode of " +
                             std::to_string(T) + " steps generates " + std::to_string(chunks) + " (one every n_action_steps = " +
                             std::to_string(c.n_action_steps) + " steps)" + expected_got("K >= " + std::to_string(chunks), noise->shape[0]));
            }

            const std::size_t n_cam = policy.cameras().size(), A = std::size_t(c.action_dim);
            std::vector<float> actions(std::size_t(T) * A);
            std::vector<PolicyFrame> frames(n_cam);
            std::vector<double> ms;
            ms.reserve(std::size_t(T));
            policy.reset();
            for (std::int64_t t = 0; t < T; ++t) {
                for (std::size_t k = 0; k < n_cam; ++k) {
                    const io::PolicyCamera& cam = policy.cameras()[k];
                    const std::size_t pixels = std::size_t(cam.channels) * cam.height * cam.width;
                    frames[k].layout = ep.layouts[k];
                    frames[k].height = cam.height;
                    frames[k].width = cam.width;
                    frames[k].data = ep.layouts[k] == ImageLayout::U8Hwc
                                         ? static_cast<const void*>(ep.frames_u8[k].data.data() + std::size_t(t) * pixels)
                                         : static_cast<const void*>(ep.frames_f32[k].data.data() + std::size_t(t) * pixels);
                }
                PolicyObservation obs;
                obs.state = std::span<const float>(ep.state.data).subspan(std::size_t(t) * policy.state_dim(), policy.state_dim());
                if (policy.env_dim() > 0)
                    obs.env_state = std::span<const float>(ep.env.data).subspan(std::size_t(t) * policy.env_dim(), policy.env_dim());
                obs.images = frames;
                // The action queue runs empty at steps 0, n, 2n, ...: only those calls generate a chunk and take noise.
                std::span<const float> chunk_noise;
                const bool generates = t % c.n_action_steps == 0;
                if (noise && generates)
                    chunk_noise = std::span<const float>(noise->data).subspan(std::size_t(t / c.n_action_steps) * per_chunk, per_chunk);
                const auto t0 = std::chrono::steady_clock::now();
                try {
                    policy.select_action(obs, std::span<float>(actions).subspan(std::size_t(t) * A, A), chunk_noise);
                } catch (const Error& e) {
                    std::cerr << "flowedge: " << kProgram << ": at step " << t << " of " << T << ":\n";
                    throw;
                }
                ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
                if (policy.chunks_generated() != t / c.n_action_steps + 1)
                    fail(ErrorKind::Internal, kProgram, "chunk count out of step with the action queue at step " + std::to_string(t) +
                                                            expected_got(t / c.n_action_steps + 1, policy.chunks_generated()));
            }
            const std::int64_t shape[2] = {T, c.action_dim};
            io::write_npy_f32(out_path, shape, actions);

            std::sort(ms.begin(), ms.end());
            std::string device_name = resident.backend();
#ifdef FLOWEDGE_WITH_CUDA
            if (resident.cuda_resident()) device_name += " (" + cuda::device_description() + ")";
#endif
            std::printf("%s: %s, weights %s, %s %d steps, T=%lld observations -> %s [%lld, %d]\n", kProgram, device_name.c_str(),
                        weights.c_str(), scheduler_name(policy.scheduler()), policy.steps(), static_cast<long long>(T), out_path.c_str(),
                        static_cast<long long>(T), c.action_dim);
            std::printf("chunks generated: %d (%s noise)\n", policy.chunks_generated(), noise ? "--noise" : "seeded");
            std::printf("select_action latency: p50=%.3f ms  max=%.3f ms\n", ms[ms.size() / 2], ms.back());
            return 0;
        });
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
}
