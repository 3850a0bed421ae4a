// flowedge.DiffusionPolicy: the whole LeRobot Diffusion Policy (DiffusionPolicy<B>) from Python. select_action takes
// the observation dict a LeRobot environment gives (policy_features.hpp) and runs the C++ call with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "binding_support.hpp"
#include "flowedge/models/diffusion/policy.hpp"
#include "policy_features.hpp"

namespace flowedge::python {
namespace {

/// The policy, its lock and its features.
struct PyWholePolicy : Held<DiffusionPolicy>, PolicyFeatures {
    explicit PyWholePolicy(Resident<DiffusionPolicy>&& m) : Held<DiffusionPolicy>(std::move(m)) {
        model.visit([&](auto& p) { read(p, p.config().horizon); });
    }
};

/// A float32 [batch, dim] feature of every environment, C-contiguous (converted once when not).
F32 feature_rows(nb::handle obj, const std::string& key, std::size_t batch, int dim) {
    const F32 a = as_f32(obj, key.c_str());
    if (!(a.ndim() == 2 && a.shape(0) == batch && a.shape(1) == std::size_t(dim)))
        bad_arg("'" + key + "' has the wrong shape (expected [batch, " + std::to_string(dim) + "] = [" + std::to_string(batch) + ", " +
                std::to_string(dim) + "], got " + shape_str(a) + ")");
    return a;
}

/// The arrays of one select_action_batch call and the per-environment observations viewing them.
struct ParsedBatch {
    F32 state, env, noise;
    std::array<FrameArg, kMaxCameras> frames;
    std::vector<PolicyFrame> views;           ///< [batch, camera]
    std::vector<PolicyObservation> observations;  ///< [batch]

    std::span<const float> noise_span() const { return noise.is_valid() ? span_of(noise) : std::span<const float>{}; }
};

/// obs: {state key: [N, state_dim], env key: [N, env_dim] when the policy has one, camera key: [N, H, W, C] uint8 or
/// [N, C, H, W] float32}; noise: None or [N, horizon, action_dim].
void parse_batch(const PolicyFeatures& s, std::size_t batch, nb::handle obs, nb::handle noise_obj, ParsedBatch& in) {
    const auto rows_text = [&](int dim) { return "[" + std::to_string(batch) + ", " + std::to_string(dim) + "] float32"; };
    in.state = feature_rows(lookup(obs, s.state_key, [&] { return rows_text(s.state_dim); }), s.state_name, batch, s.state_dim);
    if (s.env_dim > 0) in.env = feature_rows(lookup(obs, s.env_key, [&] { return rows_text(s.env_dim); }), s.env_name, batch, s.env_dim);
    const std::size_t n_cam = s.cameras.size();
    in.views.resize(batch * n_cam);
    for (std::size_t c = 0; c < n_cam; ++c) {
        frame_arg(lookup(obs, s.camera_keys[c], [&] { return s.camera_shapes_text(c) + " with a leading batch"; }), s, c, in.frames[c], batch);
        const PolicyFrame& first = in.frames[c].frame;
        const io::PolicyCamera& cam = s.cameras[c];
        const std::size_t frame_bytes = std::size_t(cam.channels) * cam.height * cam.width * (first.layout == ImageLayout::U8Hwc ? 1 : sizeof(float));
        for (std::size_t e = 0; e < batch; ++e) {
            in.views[e * n_cam + c] = first;
            in.views[e * n_cam + c].data = static_cast<const std::byte*>(first.data) + e * frame_bytes;
        }
    }
    in.observations.resize(batch);
    const std::size_t S = std::size_t(s.state_dim), E = std::size_t(s.env_dim);
    for (std::size_t e = 0; e < batch; ++e)
        in.observations[e] = PolicyObservation{std::span<const float>(in.state.data() + e * S, S),
                                               E > 0 ? std::span<const float>(in.env.data() + e * E, E) : std::span<const float>{},
                                               std::span<const PolicyFrame>(in.views.data() + e * n_cam, n_cam)};
    if (!noise_obj.is_none()) {
        in.noise = as_f32(noise_obj, "noise");
        const std::size_t H = std::size_t(s.horizon), A = std::size_t(s.action_dim);
        if (!(in.noise.ndim() == 3 && in.noise.shape(0) == batch && in.noise.shape(1) == H && in.noise.shape(2) == A))
            bad_arg("noise has the wrong shape (expected [batch, horizon, action_dim] = [" + std::to_string(batch) + ", " + std::to_string(H) +
                    ", " + std::to_string(A) + "], got " + shape_str(in.noise) + ")");
    }
}

std::optional<int> steps_arg(nb::handle steps) {
    if (steps.is_none()) return std::nullopt;
    int v = 0;
    if (!nb::try_cast(steps, v)) throw nb::type_error("flowedge: python: steps must be None or an int");
    if (v < 1) bad_arg("steps must be >= 1 or None for the checkpoint's (got " + std::to_string(v) + ")");
    return v;
}

}  // namespace

void bind_diffusion_policy(nb::module_& m) {
    nb::class_<PyWholePolicy> cls(
        m, "DiffusionPolicy",
        "The whole LeRobot Diffusion Policy (RGB encoders, normalisation, observation/action queues, U-Net sampler)\n"
        "from a pretrained_model folder, with no PyTorch. reset() at every episode start, then select_action(obs)\n"
        "once per control tick with the environment's observation dict.");
    cls.def(
        "__init__",
        [](PyWholePolicy* self, const std::filesystem::path& folder, const std::string& device, nb::handle dtype,
           nb::handle steps, nb::handle scheduler, const nb::int_& seed, int batch, nb::handle quantize) {
            PolicyOptions opts;
            if (batch < 1) bad_arg("batch must be >= 1 (got " + std::to_string(batch) + ")");
            opts.batch = batch;
            opts.load.weight_dtype = dtype_arg(dtype);
            opts.load.quantize = quantize_arg(quantize);
            opts.steps = steps_arg(steps).value_or(0);
            if (!scheduler.is_none()) {
                if (!nb::isinstance<nb::str>(scheduler)) throw nb::type_error("flowedge: python: scheduler must be None, 'ddim' or 'ddpm'");
                const std::string name = nb::cast<std::string>(scheduler);
                try {
                    opts.scheduler = parse_scheduler(name);
                } catch (const Error& e) {
                    throw ArgumentError(e.what());
                }
            }
            opts.seed = seed_arg(seed);
            new (self) PyWholePolicy(load_resident<DiffusionPolicy>(
                device, [&](auto tag) { return DiffusionPolicy<decltype(tag)>::load(folder, opts); }));
        },
        "folder"_a, "device"_a = "cpu", "dtype"_a = nb::none(), "steps"_a = nb::none(), "scheduler"_a = nb::none(),
        "seed"_a = nb::int_(0), "batch"_a = 1, "quantize"_a = nb::none(),
        nb::sig("def __init__(self, folder: str | os.PathLike, device: typing.Literal['cpu', 'cuda', 'auto'] = 'cpu', "
                "dtype: typing.Literal['float32', 'bfloat16', 'float16'] | numpy.dtype | None = None, steps: int | None = None, "
                "scheduler: typing.Literal['ddim', 'ddpm'] | None = None, seed: int = 0, batch: int = 1, "
                "quantize: typing.Literal['none', 'int8', 'w8a8'] | None = None) -> None"),
        "Loads a LeRobot DiffusionPolicy pretrained_model folder. device: 'cpu'; 'cuda' (raises FlowEdgeError unless\n"
        "the policy is resident on the GPU); 'auto' (the GPU when usable, else the CPU with the reason in\n"
        "fallback_reason). dtype: weight storage (None = float32). steps / scheduler: None = the checkpoint's\n"
        "num_inference_steps / noise_scheduler_type (LeRobot's rule). seed: the generated noise's seed (reset(seed) changes it).\n"
        "batch: environments served by select_action_batch (vectorised evaluation), each with its own queues and\n"
        "noise stream seed + (e << 32); select_action takes one observation only at batch 1. quantize: CPU opt-in\n"
        "'int8' (INT8 weight-only U-Net convolutions, AVX2 / AVX-512) or 'w8a8' (INT8 weights and activations,\n"
        "AVX-512 with VNNI); error bounds in docs/numerics.md; FlowEdgeError where the kernels are missing.");
    common_properties<PyWholePolicy>(cls);
    feature_properties<PyWholePolicy>(cls);
    realtime_method<PyWholePolicy>(cls);
    cls        .def_prop_ro("n_obs_steps", [](PyWholePolicy& s) { return s.get([](auto& p) { return p.config().n_obs_steps; }); })
        .def_prop_ro("n_action_steps", [](PyWholePolicy& s) { return s.get([](auto& p) { return p.config().n_action_steps; }); })
        .def_prop_ro("steps", [](PyWholePolicy& s) { return s.get([](auto& p) { return p.steps(); }); }, "Inference steps per chunk.")
        .def_prop_ro("scheduler", [](PyWholePolicy& s) {
            return std::string(s.get([](auto& p) { return p.scheduler(); }) == Scheduler::Ddpm ? "ddpm" : "ddim");
        })
        .def_prop_ro("chunks_generated", [](PyWholePolicy& s) { return s.get([](auto& p) { return p.chunks_generated(); }); },
                     "Chunks generated since the last reset() (the last select_action generated one when it grew); environment 0's.")
        .def_prop_ro("batch", [](PyWholePolicy& s) { return s.get([](auto& p) { return p.batch(); }); },
                     "Environments served per select_action_batch call (the load option).")
        .def(
            "env_chunks_generated", [](PyWholePolicy& s, int env) { return s.get([&](auto& p) { return p.chunks_generated(env); }); },
            "env"_a, "Chunks environment env generated since its last reset.")
        .def_prop_ro("device_bytes", [](PyWholePolicy& s) { return s.get([](auto& p) { return p.device_bytes(); }); },
                     "Bytes held on the backend (weights, buffers, workspaces).")
        .def_prop_rw(
            "math", [](PyWholePolicy& s) { return std::string(math_mode_name(s.get([](auto& p) { return p.head().math(); }))); },
            [](PyWholePolicy& s, const std::string& v) {
                const MathMode m = math_arg(v);
                s.run([&](auto& p) { p.set_math(m); });
            },
            "Arithmetic of the U-Net convolutions: 'f32' (exact, default), or the opt-in tensor-core modes 'tf32' / 'bf16'\n"
            "(CUDA sm_80+, used where batch*length >= 256); the encoder stays exact. On the CPU 'tf32' is exact and 'bf16'\n"
            "rounds the convolutions' operands to BF16 where the CPU has AVX512_BF16.")
        .def(
            "reset",
            [](PyWholePolicy& s, nb::handle seed, nb::handle env) {
                std::optional<std::uint64_t> v;
                if (!seed.is_none()) {
                    if (!nb::isinstance<nb::int_>(seed)) throw nb::type_error("flowedge: python: seed must be None or an int");
                    v = seed_arg(nb::borrow<nb::int_>(seed));
                }
                if (env.is_none()) return s.run([&](auto& p) { p.reset(v); });
                int e = 0;
                if (!nb::try_cast(env, e)) throw nb::type_error("flowedge: python: env must be None or an int");
                s.run([&](auto& p) { p.reset_env(e, v); });
            },
            "seed"_a = nb::none(), "env"_a = nb::none(),
            "LeRobot's reset(): empties the observation and action queues (call at every episode start). seed replaces\n"
            "the seed of the generated noise when given (environment e draws from seed + (e << 32)). env: None resets\n"
            "every environment, an index that one alone (its episode ended; with a seed it gets seed + (env << 32)).")
        .def(
            "select_action_batch",
            [](PyWholePolicy& s, nb::handle obs, nb::handle noise_obj) {
                const std::size_t batch = std::size_t(s.get([](auto& p) { return p.batch(); }));
                ParsedBatch in;
                parse_batch(s, batch, obs, noise_obj, in);
                OutArray out = new_array({batch, std::size_t(s.action_dim)});
                float* a = out.data();
                s.run([&](auto& p) {
                    p.select_action(std::span<const PolicyObservation>(in.observations), std::span<float>(a, batch * std::size_t(s.action_dim)),
                                    in.noise_span());
                });
                return out;
            },
            "obs"_a, "noise"_a = nb::none(),
            nb::sig("def select_action_batch(self, obs: typing.Mapping[str, numpy.ndarray], noise: numpy.ndarray | None = None) -> numpy.ndarray"),
            "select_action for every environment at once (a policy loaded with batch=N): obs maps each feature to the\n"
            "N environments' values, 'observation.state' [N, state_dim] float32, the environment state [N, env_dim]\n"
            "when the policy has one, each camera [N, H, W, 3] uint8 or [N, 3, H, W] float32 in [0, 1]. noise:\n"
            "[N, horizon, action_dim] standard normal; row e is used only when environment e generates a chunk at\n"
            "this call. Environments whose action queue ran out are sampled together. Returns float32 [N, action_dim].\n"
            "Errors as select_action, naming the environment.")
        .def(
            "select_action",
            [](PyWholePolicy& s, nb::handle obs, nb::handle noise_obj) {
                ParsedObservation in;
                parse_observation(s, obs, noise_obj, in);
                const PolicyObservation o = in.view(s);
                OutArray out = new_array({std::size_t(s.action_dim)});
                float* a = out.data();
                s.run([&](auto& p) { p.select_action(o, std::span<float>(a, std::size_t(s.action_dim)), in.noise_span()); });
                return out;
            },
            "obs"_a, "noise"_a = nb::none(),
            nb::sig("def select_action(self, obs: typing.Mapping[str, numpy.ndarray], noise: numpy.ndarray | None = None) -> numpy.ndarray"),
            "LeRobot's select_action(): obs maps feature names to numpy arrays: 'observation.state' [state_dim],\n"
            "'observation.environment_state' [env_dim] when the policy has one, and one frame per camera key\n"
            "([H, W, 3] uint8 or [3, H, W] float32 in [0, 1]); each may carry a leading batch of 1. float32 state and\n"
            "uint8/float32 C-contiguous frames are read in place. noise: [horizon, action_dim] standard normal, the\n"
            "initial sample when this call generates a chunk (ignored otherwise). Returns the next un-normalised\n"
            "action [action_dim]. Missing keys, wrong shapes/dtypes raise FlowEdgeValueError (a ValueError); NaN/Inf\n"
            "values FlowEdgeError (a RuntimeError), as does select_action before reset().")
        .def(
            "_time_select_action",
            [](PyWholePolicy& s, nb::handle obs, int n) {
                // The C++ call alone, timed inside the module: the baseline the Python call's overhead is measured
                // against (python/tests/time_select_action.py).
                if (n < 1) bad_arg("n must be >= 1 (got " + std::to_string(n) + ")");
                ParsedObservation in;
                parse_observation(s, obs, nb::none(), in);
                const PolicyObservation o = in.view(s);
                std::vector<double> secs(static_cast<std::size_t>(n));
                std::vector<float> a(std::size_t(s.action_dim));
                s.run([&](auto& p) {
                    for (double& t : secs) {
                        const auto t0 = std::chrono::steady_clock::now();
                        p.select_action(o, a);
                        t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                    }
                });
                OutArray out = new_array({secs.size()});
                for (std::size_t i = 0; i < secs.size(); ++i) out.data()[i] = float(secs[i]);
                return out;
            },
            "obs"_a, "n"_a,
            "Times n select_action(obs) calls of the C++ policy in a loop (seconds per call, float32 [n]); for overhead "
            "measurements.");
}

}  // namespace flowedge::python
