// flowedge-policy: runs LeRobot's whole DiffusionPolicy or ACT policy (chosen by config.json's "type") over a
// recorded episode. OBS.npz holds one array per LeRobot feature key ([T, ...] each); the program calls reset() and
// then select_action() T times, exactly as a LeRobot rollout does, and writes the T un-normalised actions
// [T, action_dim] to ACTIONS.npy.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>

#ifdef FLOWEDGE_WITH_CUDA
#include <flowedge/cuda/device.hpp>
#endif
#include <flowedge/io/npy.hpp>
#include <flowedge/io/npz.hpp>
#include <flowedge/models/act/policy.hpp>
#include <flowedge/models/diffusion/policy.hpp>
#include <flowedge/models/lerobot_policy_type.hpp>
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
std::string file_weight_dtype(const std::string& folder, PolicyType type) {
    const std::shared_ptr<const io::SafeTensors> weights =
        type == PolicyType::Act ? io::open_lerobot_act_folder(folder).weights : io::open_diffusion_checkpoint(folder).weights;
    const io::TensorInfo* largest = nullptr;
    for (const io::TensorInfo& t : weights->tensors())
        if (t.supported() && (!largest || t.bytes > largest->bytes)) largest = &t;
    return std::string(largest ? dtype_name(largest->dtype) : "F32");
}

/// The episode's inputs and the words of the summary line.
struct RunInputs {
    const io::Npz& npz;
    const std::string& obs_path;
    const std::string& out_path;
    const std::optional<io::NpyArrayF32>& noise;  ///< Diffusion Policy only
    const std::string& noise_path;
    std::string weights, device_name;
};

template <class P>
constexpr bool kIsAct = std::is_same_v<P, ActPolicy<Cpu>>;

/// reset(), then select_action once per step of OBS.npz; writes ACTIONS.npy and prints the summary. Every input is
/// checked before the first select_action: keys, dtypes, shapes, one T for all, the noise's chunk count.
template <class P>
int run_episode(P& policy, const RunInputs& in) {
    const int chunk = [&] {
        if constexpr (kIsAct<P>) return policy.config().chunk_size;
        else return policy.config().horizon;
    }();
    const int n_action_steps = policy.config().n_action_steps, action_dim = policy.action_dim();
    const EpisodeReader reader(in.npz);
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
    for (const std::string& n : in.npz.names())
        if (std::find(used.begin(), used.end(), n) == used.end())
            std::cerr << "note: " << in.obs_path << ": array '" << n << "' is not an input of this policy (ignored)\n";
    const std::int64_t T = ep.steps;
    if (T < 1) fail(ErrorKind::BadShape, kProgram, in.obs_path + ": the episode has no steps" + expected_got("T >= 1", T));
    // The action queue holds n_action_steps actions: a chunk is generated at steps 0, n, 2n, ... (ACT's temporal
    // ensembling has n_action_steps 1: a chunk every step).
    const std::int64_t chunks = (T + n_action_steps - 1) / n_action_steps;
    const std::size_t per_chunk = std::size_t(chunk) * action_dim;
    const io::NpyArrayF32* noise = in.noise ? &*in.noise : nullptr;
    if (noise) {
        const std::string want = "[K, " + std::to_string(chunk) + ", " + std::to_string(action_dim) + "]";
        if (noise->shape.size() != 3 || noise->shape[1] != chunk || noise->shape[2] != action_dim)
            fail(ErrorKind::BadShape, kProgram, "--noise " + in.noise_path + " has the wrong shape" + expected_got(want, shape_str(noise->shape)));
        if (noise->shape[0] < chunks)
            fail(ErrorKind::BadShape, kProgram,
                 "--noise " + in.noise_path + " holds noise for " + std::to_string(noise->shape[0]) + " chunks but the episode of " +
                     std::to_string(T) + " steps generates " + std::to_string(chunks) + " (one every n_action_steps = " +
                     std::to_string(n_action_steps) + " steps)" + expected_got("K >= " + std::to_string(chunks), noise->shape[0]));
    }

    const std::size_t n_cam = policy.cameras().size(), A = std::size_t(action_dim);
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
        const std::span<float> action = std::span<float>(actions).subspan(std::size_t(t) * A, A);
        const auto t0 = std::chrono::steady_clock::now();
        try {
            if constexpr (kIsAct<P>) {
                policy.select_action(obs, action);
            } else {
                // The action queue runs empty at steps 0, n, 2n, ...: only those calls generate a chunk and take noise.
                std::span<const float> chunk_noise;
                if (noise && t % n_action_steps == 0)
                    chunk_noise = std::span<const float>(noise->data).subspan(std::size_t(t / n_action_steps) * per_chunk, per_chunk);
                policy.select_action(obs, action, chunk_noise);
            }
        } catch (const Error& e) {
            std::cerr << "flowedge: " << kProgram << ": at step " << t << " of " << T << ":\n";
            throw;
        }
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        if (policy.chunks_generated() != t / n_action_steps + 1)
            fail(ErrorKind::Internal, kProgram, "chunk count out of step with the action queue at step " + std::to_string(t) +
                                                    expected_got(t / n_action_steps + 1, policy.chunks_generated()));
    }
    const std::int64_t shape[2] = {T, action_dim};
    io::write_npy_f32(in.out_path, shape, actions);

    std::sort(ms.begin(), ms.end());
    std::string what;
    if constexpr (kIsAct<P>) {
        char selection[64];
        if (const auto coeff = policy.config().temporal_ensemble_coeff)
            std::snprintf(selection, sizeof selection, "temporal ensembling %g", *coeff);
        else
            std::snprintf(selection, sizeof selection, "n_action_steps %d", n_action_steps);
        what = "ACT chunk " + std::to_string(chunk) + ", " + selection;
    } else {
        what = std::string(scheduler_name(policy.scheduler())) + " " + std::to_string(policy.steps()) + " steps";
    }
    std::printf("%s: %s, weights %s, %s, T=%lld observations -> %s [%lld, %d]\n", kProgram, in.device_name.c_str(), in.weights.c_str(),
                what.c_str(), static_cast<long long>(T), in.out_path.c_str(), static_cast<long long>(T), action_dim);
    if constexpr (kIsAct<P>) std::printf("chunks generated: %d\n", policy.chunks_generated());
    else std::printf("chunks generated: %d (%s noise)\n", policy.chunks_generated(), noise ? "--noise" : "seeded");
    std::printf("select_action latency: p50=%.3f ms  max=%.3f ms\n", ms[ms.size() / 2], ms.back());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Run LeRobot's DiffusionPolicy or ACT policy (by config.json's type) over an episode: reset(), then\n"
                 "select_action() once per step of OBS.npz. OBS.npz holds arrays named by the LeRobot feature keys,\n"
                 "T steps each: 'observation.image' or 'observation.images.<cam>' as [T, H, W, 3] uint8 or\n"
                 "[T, 3, H, W] float32 in [0, 1]; 'observation.state' [T, d]; 'observation.environment_state' [T, d]\n"
                 "when the policy uses it (np.savez or np.savez_compressed). Writes the un-normalised actions\n"
                 "[T, action_dim] to ACTIONS.npy."};
    app.option_defaults()->always_capture_default();
    std::string folder, obs_path, out_path, noise_path, device_arg = "cpu", scheduler_arg, dtype_arg = "file";
    int steps = 0, act_n_action_steps = 0;
    double act_coeff = 0;
    std::uint64_t seed = 0;
    app.add_option("FOLDER", folder, "LeRobot DiffusionPolicy or ACT pretrained_model folder")->required();
    app.add_option("--obs", obs_path, ".npz of observation arrays keyed by LeRobot feature names, [T, ...] each")->required();
    app.add_option("--out", out_path, "write the un-normalised actions [T, action_dim] as float32 .npy")->required();
    app.add_option("--noise", noise_path, "Diffusion Policy: .npy float32 [K, horizon, action_dim]: initial noise of the k-th "
                                          "chunk generation (default: seeded noise)");
    app.add_option("--device", device_arg, "cpu | cuda (cuda fails unless the policy is resident on the GPU)")
        ->transform(CLI::IsMember({"cpu", "cuda"}, CLI::ignore_case));
    app.add_option("--steps", steps, "Diffusion Policy: inference steps (0 = the checkpoint's num_inference_steps, else num_train_timesteps)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--scheduler", scheduler_arg, "Diffusion Policy: ddim | ddpm (default: the checkpoint's noise_scheduler_type)")
        ->transform(CLI::IsMember({"ddim", "ddpm"}, CLI::ignore_case));
    app.add_option("--seed", seed, "Diffusion Policy: seed of the generated noise (initial noise without --noise, and DDPM step noise)");
    app.add_option("--temporal-ensemble-coeff", act_coeff, "ACT: ensemble a chunk every step with this coefficient (implies "
                                                           "--n-action-steps 1; default: the checkpoint's selection)");
    app.add_option("--n-action-steps", act_n_action_steps, "ACT: actions taken from each chunk (default: the checkpoint's)")
        ->check(CLI::PositiveNumber);
    app.add_option("--dtype", dtype_arg, "weight storage: file (as stored) | f32 | bf16 | f16")
        ->transform(CLI::IsMember({"file", "f32", "bf16", "f16"}, CLI::ignore_case));
    CLI11_PARSE(app, argc, argv);

    try {
        const Device device = parse_device(device_arg);
        const PolicyType type = lerobot_policy_type(folder);
        if (device == Device::Cuda && !backend_available_v<Cuda>) {
            std::cerr << "flowedge: " << kProgram << ": this build has no CUDA backend (configure with -DFLOWEDGE_BACKEND=cuda); "
                         "use --device cpu\n";
            return 2;
        }
        if (!std::filesystem::exists(folder))  // the folder reader takes a file's parent: name a mistyped folder as such
            fail(ErrorKind::Io, kProgram, folder + ": no such folder (expected a LeRobot pretrained_model folder)");
        // Options of the other policy type are mistakes, named before anything loads.
        const auto given = [&](const std::vector<const char*>& flags) {
            std::string names;
            for (const char* f : flags)
                if (app.count(f) > 0) names += (names.empty() ? "" : ", ") + std::string(f);
            return names;
        };
        if (const std::string g = type == PolicyType::Act ? given({"--noise", "--steps", "--scheduler"})
                                                           : given({"--temporal-ensemble-coeff", "--n-action-steps"});
            !g.empty())
            fail(ErrorKind::BadInput, kProgram, g + ": " + (type == PolicyType::Act ? "Diffusion Policy" : "ACT") + " option(s), but " + folder +
                                                    " holds " + (type == PolicyType::Act ? "an ACT policy" : "a Diffusion Policy") +
                                                    " (expected them unset)");
        LoadOptions load;
        if (dtype_arg == "f32") load.weight_dtype = DType::F32;
        if (dtype_arg == "bf16") load.weight_dtype = DType::BF16;
        if (dtype_arg == "f16") load.weight_dtype = DType::F16;
        const std::string weights = load.weight_dtype ? std::string(dtype_name(*load.weight_dtype)) : file_weight_dtype(folder, type);
        const io::Npz npz = io::read_npz(obs_path);
        std::optional<io::NpyArrayF32> noise;
        if (!noise_path.empty()) noise = io::read_npy_f32(noise_path);
        RunInputs in{npz, obs_path, out_path, noise, noise_path, weights, "cpu"};

        // Either policy type, resident on the GPU when asked for and possible (else the CPU, which --device cuda refuses).
        const auto run_resident = [&](auto&& resident) {
            try {
                resident.require(device, kProgram);
            } catch (const Error& e) {
                std::cerr << e.what() << "\n";
                return 2;
            }
            in.device_name = resident.backend();
#ifdef FLOWEDGE_WITH_CUDA
            if (resident.cuda_resident()) in.device_name += " (" + cuda::device_description() + ")";
#endif
            return resident.visit([&](auto& policy) { return run_episode(policy, in); });
        };
        if (type == PolicyType::Act) {
            if (app.count("--seed") > 0) std::cerr << "note: --seed is ignored (an ACT policy draws no noise)\n";
            ActPolicyOptions opts;
            opts.load = load;
            if (app.count("--temporal-ensemble-coeff") > 0 || app.count("--n-action-steps") > 0) {
                ActSelection sel;
                if (app.count("--temporal-ensemble-coeff") > 0) sel.temporal_ensemble_coeff = act_coeff;
                if (app.count("--n-action-steps") > 0) sel.n_action_steps = act_n_action_steps;
                opts.selection = sel;
            }
            return run_resident(Resident<ActPolicy>::load(device, ResidencyFlags::from_env(),
                                                          [&](auto tag) { return ActPolicy<decltype(tag)>::load(folder, opts); }));
        }
        PolicyOptions opts;
        opts.load = load;
        opts.steps = steps;
        if (!scheduler_arg.empty()) opts.scheduler = parse_scheduler(scheduler_arg);
        opts.seed = seed;
        return run_resident(Resident<DiffusionPolicy>::load(device, ResidencyFlags::from_env(),
                                                            [&](auto tag) { return DiffusionPolicy<decltype(tag)>::load(folder, opts); }));
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
}
