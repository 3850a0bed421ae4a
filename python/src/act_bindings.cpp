// flowedge.ActPolicy: LeRobot's whole ACT policy (ActPolicy<B>, resident on the GPU when asked for and possible) from
// Python, with the observation dict of policy_features.hpp, and flowedge.policy_type(folder), the rule
// flowedge.load_policy chooses the class by.
#include <nanobind/nanobind.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/string.h>

#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "binding_support.hpp"
#include "flowedge/models/act/policy.hpp"
#include "flowedge/models/lerobot_policy_type.hpp"
#include "policy_features.hpp"

namespace flowedge::python {
namespace {

/// The policy, its lock and its features.
struct PyActPolicy : Held<ActPolicy>, PolicyFeatures {
    explicit PyActPolicy(Resident<ActPolicy>&& m) : Held<ActPolicy>(std::move(m)) {
        model.visit([&](auto& p) { read(p, p.config().chunk_size); });
    }
};

/// The selection override of the constructor: none unless one of the two arguments is given; n_action_steps
/// defaults to 1, which ensembling requires.
std::optional<ActSelection> selection_arg(nb::handle coeff, nb::handle n_action_steps) {
    if (coeff.is_none() && n_action_steps.is_none()) return std::nullopt;
    ActSelection s;
    if (!coeff.is_none()) {
        double c = 0;
        if (!nb::try_cast(coeff, c)) throw nb::type_error("flowedge: python: temporal_ensemble_coeff must be None or a number");
        s.temporal_ensemble_coeff = c;
    }
    if (!n_action_steps.is_none()) {
        if (!nb::try_cast(n_action_steps, s.n_action_steps))
            throw nb::type_error("flowedge: python: n_action_steps must be None or an int");
    }
    return s;
}

}  // namespace

void bind_act_policy(nb::module_& m) {
    m.def(
        "policy_type", [](const std::filesystem::path& folder) { return std::string(policy_type_name(lerobot_policy_type(folder))); },
        "folder"_a,
        "'act' when the folder's config.json has type 'act', else 'diffusion' (also for a compact *.flowedge.safetensors\n"
        "file): the class flowedge.load_policy loads.");

    nb::class_<PyActPolicy> cls(
        m, "ActPolicy",
        "LeRobot's whole ACT policy (Action Chunking with Transformers: ResNet18 backbones, transformer encoder and\n"
        "decoder, normalisation, the n_action_steps queue or temporal ensembling) from a pretrained_model folder, with\n"
        "no PyTorch. reset() at every episode start, then select_action(obs) once per control tick.");
    cls.def(
        "__init__",
        [](PyActPolicy* self, const std::filesystem::path& folder, const std::string& device, nb::handle dtype,
           nb::handle temporal_ensemble_coeff, nb::handle n_action_steps) {
            ActPolicyOptions opts;
            opts.load.weight_dtype = dtype_arg(dtype);
            opts.selection = selection_arg(temporal_ensemble_coeff, n_action_steps);
            try {
                new (self) PyActPolicy(load_resident<ActPolicy>(
                    device, [&](auto tag) { return ActPolicy<decltype(tag)>::load(folder, opts); }));
            } catch (const Error& e) {
                // A selection LeRobot's rules reject is the caller's value, not a bad file.
                if (opts.selection && std::string_view(e.what()).find("ActPolicyOptions::selection") != std::string_view::npos)
                    throw ArgumentError(e.what());
                throw;
            }
        },
        "folder"_a, "device"_a = "cpu", "dtype"_a = nb::none(), "temporal_ensemble_coeff"_a = nb::none(), "n_action_steps"_a = nb::none(),
        nb::sig("def __init__(self, folder: str | os.PathLike, device: typing.Literal['cpu', 'cuda', 'auto'] = 'cpu', "
                "dtype: typing.Literal['float32', 'bfloat16', 'float16'] | numpy.dtype | None = None, "
                "temporal_ensemble_coeff: float | None = None, n_action_steps: int | None = None) -> None"),
        "Loads a LeRobot ACTPolicy pretrained_model folder. device: 'cpu'; 'cuda' (raises FlowEdgeError unless the\n"
        "policy is resident on the GPU); 'auto' (the GPU when usable, else the CPU with the reason in fallback_reason).\n"
        "dtype: weight storage (None = float32). temporal_ensemble_coeff / n_action_steps: both None keeps the checkpoint's selection; otherwise they\n"
        "replace it as LeRobot's eval-time --policy.* options do (a coefficient ensembles every step and needs\n"
        "n_action_steps 1, its default here; n_action_steps alone is the queue without ensembling).");
    common_properties<PyActPolicy>(cls);
    feature_properties<PyActPolicy>(cls);
    realtime_method<PyActPolicy>(cls);
    cls.def_prop_ro("policy_type", [](PyActPolicy&) { return std::string("act"); })
        .def_prop_ro("chunk_size", [](PyActPolicy& s) { return s.horizon; })
        .def_prop_ro("n_obs_steps", [](PyActPolicy&) { return 1; })
        .def_prop_ro("n_action_steps", [](PyActPolicy& s) { return s.get([](auto& p) { return p.config().n_action_steps; }); },
                     "Actions taken from each chunk (1 with temporal ensembling).")
        .def_prop_ro("temporal_ensemble_coeff", [](PyActPolicy& s) -> nb::object {
            const std::optional<double> c = s.get([](auto& p) { return p.config().temporal_ensemble_coeff; });
            if (!c) return nb::none();
            return nb::float_(*c);
        }, "The ensembling coefficient, or None for the n_action_steps queue.")
        .def_prop_ro("chunks_generated", [](PyActPolicy& s) { return s.get([](auto& p) { return p.chunks_generated(); }); },
                     "Chunks predicted since the last reset() (the last select_action predicted one when it grew).")
        .def_prop_ro("device_bytes", [](PyActPolicy& s) { return s.get([](auto& p) { return p.buffer_bytes(); }); },
                     "Bytes of buffers and workspace (weights not counted).")
        .def_prop_rw(
            "math", [](PyActPolicy& s) { return std::string(math_mode_name(s.get([](auto& p) { return p.math(); }))); },
            [](PyActPolicy& s, const std::string& v) {
                const MathMode m = math_arg(v);
                s.run([&](auto& p) { p.set_math(m); });
            },
            "Arithmetic of the products (ActPolicy::set_math): 'f32' (exact, default), or the opt-in tensor-core modes\n"
            "'tf32' / 'bf16': on CUDA sm_80+ the linears of >= 32 rows and the backbone's convolutions run TF32 GEMMs\n"
            "(F32 weights: 'bf16' computes as 'tf32'); attention, LayerNorm and normalisation stay exact. On the CPU\n"
            "'bf16' rounds linear operands to BF16 where the CPU has AVX512_BF16, 'tf32' computes exactly.")
        .def(
            "reset", [](PyActPolicy& s, nb::handle) { s.run([](auto& p) { p.reset(); }); }, "seed"_a = nb::none(),
            "LeRobot's reset(): empties the action queue or the temporal ensemble (call at every episode start). seed is\n"
            "accepted for the DiffusionPolicy signature and ignored: ACT draws no noise.")
        .def(
            "select_action",
            [](PyActPolicy& s, nb::handle obs) {
                ParsedObservation in;
                parse_observation(s, obs, nb::none(), in);
                const PolicyObservation o = in.view(s);
                OutArray out = new_array({std::size_t(s.action_dim)});
                float* a = out.data();
                s.run([&](auto& p) { p.select_action(o, std::span<float>(a, std::size_t(s.action_dim))); });
                return out;
            },
            "obs"_a, nb::sig("def select_action(self, obs: typing.Mapping[str, numpy.ndarray]) -> numpy.ndarray"),
            "LeRobot's select_action(): obs maps feature names to numpy arrays ('observation.state' [state_dim],\n"
            "'observation.environment_state' [env_dim] when the policy has one, one frame per camera key: [H, W, 3]\n"
            "uint8 or [3, H, W] float32 in [0, 1]; each may carry a leading batch of 1). Returns the next un-normalised\n"
            "action [action_dim]. Errors as DiffusionPolicy.select_action.")
        .def(
            "predict_action_chunk",
            [](PyActPolicy& s, nb::handle obs) {
                ParsedObservation in;
                parse_observation(s, obs, nb::none(), in);
                const PolicyObservation o = in.view(s);
                const std::size_t C = std::size_t(s.horizon), A = std::size_t(s.action_dim);
                OutArray out = new_array({C, A});
                float* c = out.data();
                s.run([&](auto& p) { p.predict_action_chunk(o, std::span<float>(c, C * A)); });
                return out;
            },
            "obs"_a, nb::sig("def predict_action_chunk(self, obs: typing.Mapping[str, numpy.ndarray]) -> numpy.ndarray"),
            "LeRobot's predict_action_chunk(): the chunk [chunk_size, action_dim] for one observation, in normalised\n"
            "units (before the postprocessor); the queue and the ensemble are left alone.");
}

}  // namespace flowedge::python
