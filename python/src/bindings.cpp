// flowedge._flowedge: nanobind bindings that give Python numpy-in/numpy-out access to the C++ heads, with the
// GIL released during inference and flowedge::Error mapped to flowedge.FlowEdgeError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <tuple>
#include <limits>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "binding_support.hpp"
#include "error_map.hpp"
#include "flowedge/error.hpp"
#include "flowedge/models/diffusion/head.hpp"
#include "flowedge/models/mamba_flow/policy.hpp"
#include "flowedge/residency.hpp"

#ifndef FLOWEDGE_VERSION_STRING
#define FLOWEDGE_VERSION_STRING "0.0.0"
#endif

namespace nb = nanobind;
using namespace nb::literals;
using namespace flowedge;
using namespace flowedge::python;

namespace {

PyObject* g_error = nullptr;        // flowedge.FlowEdgeError(RuntimeError)
PyObject* g_value_error = nullptr;  // flowedge.FlowEdgeValueError(FlowEdgeError, ValueError)

}  // namespace

NB_MODULE(_flowedge, m) {
    m.doc() = "flowedge: robot policy inference (Mamba, flow matching, Diffusion Policy) from Python";
    m.attr("__version__") = FLOWEDGE_VERSION_STRING;
    m.attr("cuda") = nb::bool_(backend_available_v<Cuda>);

    g_error = PyErr_NewExceptionWithDoc("flowedge.FlowEdgeError",
                                        "Raised for every flowedge failure (load, format, device, state, inference).",
                                        PyExc_RuntimeError, nullptr);
    nb::object bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_ValueError));
    g_value_error = PyErr_NewExceptionWithDoc("flowedge.FlowEdgeValueError",
                                              "A bad argument (shape, size, range, unknown name): both a FlowEdgeError "
                                              "and a ValueError.",
                                              bases.ptr(), nullptr);  // base may be a tuple of classes
    if (!g_error || !g_value_error) throw nb::python_error();
    m.attr("FlowEdgeError") = nb::handle(g_error);
    m.attr("FlowEdgeValueError") = nb::handle(g_value_error);
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const ArgumentError& e) {
            PyErr_SetString(g_value_error, e.what());
        } catch (const Error& e) {
            const fe_status s = capi::status_of(e, capi::Phase::Call);
            const bool argument = s == FE_ERR_INVALID_ARGUMENT || s == FE_ERR_SHAPE;
            PyErr_SetString(argument ? g_value_error : g_error, e.what());
        }
    });

    m.def(
        "diffusion_compact_name",
        [](const std::string& unet_name) {
            try {
                return io::diffusion_compact_name(unet_name);
            } catch (const Error& e) {
                throw ArgumentError(e.what());  // a bad name is an argument problem, not a bad file
            }
        },
        "unet_name"_a,
        "Compact *.flowedge.safetensors name (docs/formats.md#compact-names) of a LeRobot DiffusionConditionalUnet1d parameter, given its\n"
        "state_dict key WITHOUT the 'diffusion.unet.' prefix: 'down_modules.0.1.conv1.block.0.weight' -> 'dp.d0.r1.c1.w'.\n"
        "An unknown name raises FlowEdgeValueError.");

    // ---- DiffusionHead ----
    nb::class_<PyDiffusion> dh(m, "DiffusionHead",
                               "LeRobot Diffusion Policy head (conditional 1-D U-Net + DDIM/DDPM + MIN_MAX un-normalisation).\n"
                               "path: LeRobot pretrained_model folder, its model.safetensors, or *.flowedge.safetensors.");
    dh.def(
        "__init__",
        [](PyDiffusion* self, const std::string& path, const std::string& device, int max_batch, nb::handle dtype,
           nb::handle quantize) {
            if (max_batch < 1) bad_arg("max_batch must be >= 1 (got " + std::to_string(max_batch) + ")");
            LoadOptions opts;
            opts.weight_dtype = dtype_arg(dtype);
            opts.quantize = quantize_arg(quantize);
            new (self) PyDiffusion(load_resident<DiffusionHead>(device, [&](auto tag) {
                return DiffusionHead<decltype(tag)>::load(path, opts, max_batch);
            }));
        },
        "path"_a, "device"_a = "cpu", "max_batch"_a = 1, "dtype"_a = nb::none(), "quantize"_a = nb::none(),
        nb::sig("def __init__(self, path: str, device: typing.Literal['cpu', 'cuda', 'auto'] = 'cpu', max_batch: int = 1, "
                "dtype: typing.Literal['float32', 'bfloat16', 'float16'] | numpy.dtype | None = None, "
                "quantize: typing.Literal['none', 'int8', 'w8a8'] | None = None) -> None"),
        "Loads the head. device: 'cpu'; 'cuda' (raises FlowEdgeError unless the model is resident on the GPU);\n"
        "'auto' (the GPU when usable, else the CPU with the reason in fallback_reason). max_batch bounds the batch\n"
        "of every call. dtype: weight storage, None keeps the file's (also 'f32' / 'bf16' / 'f16' or a numpy dtype).\n"
        "quantize: CPU opt-in 'int8' (INT8 weight-only convolutions, AVX2 / AVX-512) or 'w8a8' (INT8 weights and\n"
        "activations, AVX-512 with VNNI); error bounds in docs/numerics.md; FlowEdgeError where the kernels are missing.");
    common_properties<PyDiffusion>(dh);
    dh.def_prop_ro("action_dim", [](PyDiffusion& s) { return s.get([](auto& h) { return h.config().action_dim; }); })
        .def_prop_ro("horizon", [](PyDiffusion& s) { return s.get([](auto& h) { return h.config().horizon; }); })
        .def_prop_ro("global_cond_dim", [](PyDiffusion& s) { return s.get([](auto& h) { return h.config().global_cond_dim; }); })
        .def_prop_ro("n_obs_steps", [](PyDiffusion& s) { return s.get([](auto& h) { return h.config().n_obs_steps; }); })
        .def_prop_ro("n_action_steps", [](PyDiffusion& s) { return s.get([](auto& h) { return h.config().n_action_steps; }); })
        .def_prop_ro("num_train_timesteps",
                     [](PyDiffusion& s) { return s.get([](auto& h) { return h.config().num_train_timesteps; }); })
        .def_prop_ro("down_dims", [](PyDiffusion& s) { return s.get([](auto& h) { return h.config().down_dims; }); },
                     "U-Net stage widths (LeRobot down_dims), e.g. [512, 1024, 2048].")
        .def_prop_ro("kernel_size", [](PyDiffusion& s) { return s.get([](auto& h) { return h.config().kernel_size; }); })
        .def_prop_ro("n_groups", [](PyDiffusion& s) { return s.get([](auto& h) { return h.config().n_groups; }); })
        .def_prop_ro("step_embed_dim", [](PyDiffusion& s) { return s.get([](auto& h) { return h.config().step_embed_dim; }); },
                     "Td (LeRobot diffusion_step_embed_dim).")
        .def_prop_ro("clip_sample", [](PyDiffusion& s) { return s.get([](auto& h) { return h.config().clip_sample; }); })
        .def_prop_ro("clip_sample_range",
                     [](PyDiffusion& s) { return s.get([](auto& h) { return h.config().clip_sample_range; }); })
        .def_prop_ro("max_batch", [](PyDiffusion& s) { return s.get([](auto& h) { return h.max_batch(); }); })
        .def_prop_ro("n_parameters", [](PyDiffusion& s) { return s.get([](auto& h) { return h.n_parameters(); }); })
        .def_prop_ro("action_min", [](PyDiffusion& s) { return s.get([](auto& h) { return h.action_min(); }); })
        .def_prop_ro("action_max", [](PyDiffusion& s) { return s.get([](auto& h) { return h.action_max(); }); })
        .def_prop_rw(
            "math",
            [](PyDiffusion& s) {
                return std::string(math_mode_name(s.get([](auto& h) { return h.math(); })));
            },
            [](PyDiffusion& s, const std::string& v) {
                const MathMode m = math_arg(v);
                s.run([&](auto& h) { h.set_math(m); });
            },
            "Arithmetic of the U-Net convolutions: 'f32' (exact, default), or the opt-in tensor-core modes 'tf32' / 'bf16'\n"
            "(CUDA sm_80+, used where batch*length >= 256; ignored on the CPU, which computes exactly).")
        .def(
            "sample",
            [](PyDiffusion& s, nb::handle cond_obj, nb::handle noise_obj, int steps, const std::string& scheduler,
               const nb::int_& seed_obj, bool normalized) {
                const std::uint64_t seed = seed_arg(seed_obj);
                const F32 cond = as_f32(cond_obj, "cond"), noise = as_f32(noise_obj, "noise");
                const auto [H, A, G, T, max_batch] = s.get([](auto& h) {
                    const auto& c = h.config();
                    return std::tuple{std::size_t(c.horizon), std::size_t(c.action_dim), std::size_t(c.global_cond_dim),
                                      c.num_train_timesteps, h.max_batch()};
                });
                const bool batched = noise.ndim() == 3;
                if (!((noise.ndim() == 2 || batched) && noise.shape(noise.ndim() - 2) == H && noise.shape(noise.ndim() - 1) == A &&
                      (!batched || noise.shape(0) >= 1)))
                    bad_arg("noise must be [horizon, action_dim] or [batch, horizon, action_dim] = [.., " + std::to_string(H) +
                            ", " + std::to_string(A) + "] (got shape " + shape_str(noise) + ")");
                const std::size_t B = batched ? noise.shape(0) : 1;
                const std::size_t cb = batch_of(cond, G, "cond", "global_cond_dim");
                if (!batched && cb > 1) bad_arg("cond has " + std::to_string(cb) + " rows but noise is unbatched [horizon, action_dim]");
                if (batched && cb != 0 && cb != B)
                    bad_arg("cond batch " + std::to_string(cb) + " does not match noise batch " + std::to_string(B));
                if (B > std::size_t(max_batch))
                    bad_arg("batch " + std::to_string(B) + " exceeds max_batch " + std::to_string(max_batch) +
                            " (pass max_batch= when loading)");
                if (steps < 1 || steps > T)
                    bad_arg("steps must be in [1, " + std::to_string(T) + "] (got " + std::to_string(steps) + ")");
                const SampleOptions opts{.steps = steps, .scheduler = parse_scheduler(scheduler), .seed = seed};
                std::vector<float> cond_rep;  // a single condition shared by every batch row
                std::span<const float> cspan = span_of(cond);
                if (batched && cb == 0 && B > 1) {
                    cond_rep.reserve(B * G);
                    for (std::size_t b = 0; b < B; ++b) cond_rep.insert(cond_rep.end(), cond.data(), cond.data() + G);
                    cspan = cond_rep;
                }
                OutArray out = new_array(shape_of(noise));
                float* o = out.data();
                s.run([&](auto& h) {
                    std::span<float> os(o, B * H * A);
                    if (normalized) h.sample_normalized(cspan, span_of(noise), os, opts, int(B));
                    else h.sample(cspan, span_of(noise), os, opts, int(B));
                });
                return out;
            },
            "cond"_a, "noise"_a, "steps"_a = 10, "scheduler"_a = "ddim", "seed"_a = nb::int_(0), "normalized"_a = false,
            "Samples actions. cond: [global_cond_dim] or [B, global_cond_dim]; noise: [horizon, A] or [B, horizon, A]\n"
            "(standard normal). Returns the same shape as noise: un-normalised actions, or normalised ones when\n"
            "normalized=True. scheduler 'ddim' | 'ddpm' (any case, as on the command line); seed (>= 0) drives the\n"
            "DDPM noise (row b uses seed + b); DDIM is deterministic and does not use it.")
        .def(
            "denoise",
            [](PyDiffusion& s, nb::handle cond_obj, nb::handle sample_obj, int timestep) {
                const F32 cond = as_f32(cond_obj, "cond"), x = as_f32(sample_obj, "sample");
                const auto [H, A, G, max_batch] = s.get([](auto& h) {
                    const auto& c = h.config();
                    return std::tuple{std::size_t(c.horizon), std::size_t(c.action_dim), std::size_t(c.global_cond_dim),
                                      h.max_batch()};
                });
                const bool batched = x.ndim() == 3;
                if (!((x.ndim() == 2 || batched) && x.shape(x.ndim() - 2) == H && x.shape(x.ndim() - 1) == A))
                    bad_arg("sample must be [horizon, action_dim] or [batch, horizon, action_dim] (got shape " + shape_str(x) + ")");
                const std::size_t B = batched ? x.shape(0) : 1;
                const std::size_t cb = batch_of(cond, G, "cond", "global_cond_dim");
                if ((batched && cb != B) || (!batched && cb > 1))
                    bad_arg("cond must be [batch, global_cond_dim] matching the sample batch (got shape " + shape_str(cond) + ")");
                if (B > std::size_t(max_batch))
                    bad_arg("batch " + std::to_string(B) + " exceeds max_batch " + std::to_string(max_batch));
                OutArray out = new_array(shape_of(x));
                float* o = out.data();
                s.run([&](auto& h) { h.denoise(span_of(cond), span_of(x), timestep, std::span<float>(o, B * H * A), int(B)); });
                return out;
            },
            "cond"_a, "sample"_a, "timestep"_a,
            "One U-Net call: epsilon = unet(sample, timestep, cond); sample in normalised units, same shape out.");

    // ---- Mamba ----
    nb::class_<PyMamba> mb(m, "Mamba", "Mamba-1 backbone (transformers MambaModel): token ids -> final-norm hidden states.");
    mb.def(
        "__init__",
        [](PyMamba* self, const std::string& path, const std::string& device, int max_tokens) {
            if (max_tokens < 1) bad_arg("max_tokens must be >= 1 (got " + std::to_string(max_tokens) + ")");
            new (self) PyMamba(load_resident<Mamba>(device, [&](auto tag) { return Mamba<decltype(tag)>::load(path, {}, max_tokens); }));
        },
        "path"_a, "device"_a = "cpu", "max_tokens"_a = 512,
        "device: 'cpu'; 'cuda' (raises FlowEdgeError unless resident on the GPU); 'auto' (GPU when usable, else CPU).");
    common_properties<PyMamba>(mb);
    mb.def_prop_ro("d_model", [](PyMamba& s) { return s.get([](auto& x) { return x.config().d_model; }); })
        .def_prop_ro("d_inner", [](PyMamba& s) { return s.get([](auto& x) { return x.config().d_inner; }); })
        .def_prop_ro("d_state", [](PyMamba& s) { return s.get([](auto& x) { return x.config().d_state; }); })
        .def_prop_ro("d_conv", [](PyMamba& s) { return s.get([](auto& x) { return x.config().d_conv; }); })
        .def_prop_ro("n_layers", [](PyMamba& s) { return s.get([](auto& x) { return x.config().n_layers; }); })
        .def_prop_ro("vocab_size", [](PyMamba& s) { return s.get([](auto& x) { return x.config().vocab; }); })
        .def_prop_ro("max_tokens", [](PyMamba& s) { return s.get([](auto& x) { return x.max_tokens(); }); })
        .def_prop_ro("state_size", [](PyMamba& s) { return s.get([](auto& x) { return x.state_bytes(); }); },
                     "Bytes of export_state().")
        .def(
            "prefill",
            [](PyMamba& s, nb::handle tokens_obj) {
                const std::vector<std::int32_t> tokens = as_tokens(tokens_obj);
                const std::size_t dm = s.get([](auto& x) { return std::size_t(x.config().d_model); });
                if (tokens.empty()) bad_arg("tokens must not be empty");
                OutArray out = new_array({tokens.size(), dm});
                float* o = out.data();
                s.run([&](auto& x) { x.prefill(tokens, std::span<float>(o, tokens.size() * dm)); });
                return out;
            },
            "tokens"_a, "Runs the sequence from a fresh state: tokens [L] -> hidden [L, d_model]; the state then holds it.")
        .def(
            "step",
            [](PyMamba& s, std::int64_t token) {
                if (token < std::numeric_limits<std::int32_t>::min() || token > std::numeric_limits<std::int32_t>::max())
                    bad_arg("token id does not fit in int32 (got " + std::to_string(token) + ")");
                const std::size_t dm = s.get([](auto& x) { return std::size_t(x.config().d_model); });
                OutArray out = new_array({dm});
                float* o = out.data();
                s.run([&](auto& x) { x.step(std::int32_t(token), std::span<float>(o, dm)); });
                return out;
            },
            "token"_a, "Decodes one more token: returns its hidden state [d_model].")
        .def("reset", [](PyMamba& s) { s.run([](auto& x) { x.reset(); }); }, "Forgets the sequence.")
        .def(
            "export_state",
            [](PyMamba& s) {
                std::vector<std::byte> buf;
                s.run([&](auto& x) { buf = x.export_state(); });
                return nb::bytes(reinterpret_cast<const char*>(buf.data()), buf.size());
            },
            "The decode state as versioned, checksummed bytes tied to these weights.")
        .def(
            "import_state",
            [](PyMamba& s, nb::bytes state) {
                std::vector<std::byte> buf(state.size());
                std::memcpy(buf.data(), state.c_str(), state.size());
                s.run([&](auto& x) { x.import_state(buf); });
            },
            "state"_a, "Restores a state from export_state() of the same model (FlowEdgeError otherwise; state unchanged).");

    // ---- FlowHead ----
    nb::class_<PyFlow> fh(m, "FlowHead", "Flow-matching action head (flow.* tensors): condition + noise -> action.");
    fh.def(
        "__init__",
        [](PyFlow* self, const std::string& path, const std::string& device, int max_batch) {
            if (max_batch < 1) bad_arg("max_batch must be >= 1 (got " + std::to_string(max_batch) + ")");
            new (self) PyFlow(load_resident<FlowHead>(device, [&](auto tag) { return FlowHead<decltype(tag)>::load(path, {}, max_batch); }));
        },
        "path"_a, "device"_a = "cpu", "max_batch"_a = 1,
        "device: 'cpu'; 'cuda' (raises FlowEdgeError unless resident on the GPU); 'auto' (GPU when usable, else CPU).");
    common_properties<PyFlow>(fh);
    fh.def_prop_ro("action_dim", [](PyFlow& s) { return s.get([](auto& x) { return x.config().action_dim; }); })
        .def_prop_ro("cond_dim", [](PyFlow& s) { return s.get([](auto& x) { return x.config().cond_dim; }); })
        .def_prop_ro("hidden", [](PyFlow& s) { return s.get([](auto& x) { return x.config().hidden; }); })
        .def_prop_ro("time_dim", [](PyFlow& s) { return s.get([](auto& x) { return x.config().time_dim; }); })
        .def_prop_ro("n_layers", [](PyFlow& s) { return s.get([](auto& x) { return x.config().n_layers; }); })
        .def_prop_ro("max_batch", [](PyFlow& s) { return s.get([](auto& x) { return x.max_batch(); }); })
        .def(
            "sample",
            [](PyFlow& s, nb::handle cond_obj, nb::handle noise_obj, const std::string& solver, int steps) {
                const F32 cond = as_f32(cond_obj, "cond"), noise = as_f32(noise_obj, "noise");
                const auto [A, C, max_batch] = s.get([](auto& x) {
                    return std::tuple{std::size_t(x.config().action_dim), std::size_t(x.config().cond_dim), x.max_batch()};
                });
                const std::size_t nb_ = batch_of(noise, A, "noise", "action_dim");
                const std::size_t cb = batch_of(cond, C, "cond", "cond_dim");
                if ((nb_ == 0) != (cb == 0) || nb_ != cb)
                    bad_arg("cond and noise must both be single rows or have the same batch (got " + shape_str(cond) +
                            " and " + shape_str(noise) + ")");
                const std::size_t B = nb_ == 0 ? 1 : nb_;
                if (B > std::size_t(max_batch))
                    bad_arg("batch " + std::to_string(B) + " exceeds max_batch " + std::to_string(max_batch));
                const Solver sv = parse_solver(solver);
                OutArray out = new_array(shape_of(noise));
                float* o = out.data();
                s.run([&](auto& x) { x.sample(span_of(cond), span_of(noise), std::span<float>(o, B * A), sv, steps, int(B)); });
                return out;
            },
            "cond"_a, "noise"_a, "solver"_a = "euler", "steps"_a = 10,
            "cond: [cond_dim] or [B, cond_dim]; noise: [A] or [B, A] (x at t=0). Returns x at t=1, same shape as noise.\n"
            "solver: 'euler' | 'heun' | 'rk4'.");

    // ---- MambaFlowPolicy ----
    nb::class_<PyPolicy> mp(m, "MambaFlowPolicy", "Mamba backbone + flow head from one mamba_flow.safetensors.");
    mp.def(
        "__init__",
        [](PyPolicy* self, const std::string& path, const std::string& device, int max_tokens, int max_batch) {
            if (max_tokens < 1) bad_arg("max_tokens must be >= 1 (got " + std::to_string(max_tokens) + ")");
            if (max_batch < 1) bad_arg("max_batch must be >= 1 (got " + std::to_string(max_batch) + ")");
            new (self) PyPolicy(load_resident<MambaFlowPolicy>(
                device, [&](auto tag) { return MambaFlowPolicy<decltype(tag)>::load(path, {}, max_tokens, max_batch); }));
        },
        "path"_a, "device"_a = "cpu", "max_tokens"_a = 512, "max_batch"_a = 1,
        "device: 'cpu'; 'cuda' (raises FlowEdgeError unless resident on the GPU); 'auto' (GPU when usable, else CPU).");
    common_properties<PyPolicy>(mp);
    mp.def_prop_ro("has_backbone", [](PyPolicy& s) { return s.get([](auto& p) { return p.has_backbone(); }); })
        .def_prop_ro("has_head", [](PyPolicy& s) { return s.get([](auto& p) { return p.has_head(); }); })
        .def_prop_ro("action_dim", [](PyPolicy& s) { return s.get([](auto& p) { return p.has_head() ? p.head().config().action_dim : 0; }); })
        .def_prop_ro("d_model", [](PyPolicy& s) { return s.get([](auto& p) { return p.has_backbone() ? p.backbone().config().d_model : 0; }); })
        .def(
            "act",
            [](PyPolicy& s, nb::handle tokens_obj, nb::handle noise_obj, const std::string& solver, int steps) {
                const std::vector<std::int32_t> tokens = as_tokens(tokens_obj);
                const F32 noise = as_f32(noise_obj, "noise");
                const auto [ok, A, max_batch] = s.get([](auto& p) {
                    return std::tuple{p.has_backbone() && p.has_head(), std::size_t(p.has_head() ? p.head().config().action_dim : 0),
                                      p.has_head() ? p.head().max_batch() : 0};
                });
                if (!ok) s.get([](auto& p) { p.backbone(), p.head(); return 0; });  // throws the precise "no backbone/head" error
                if (tokens.empty()) bad_arg("tokens must not be empty");
                const std::size_t nb_ = batch_of(noise, A, "noise", "action_dim");
                const std::size_t B = nb_ == 0 ? 1 : nb_;
                if (B > std::size_t(max_batch))
                    bad_arg("batch " + std::to_string(B) + " exceeds max_batch " + std::to_string(max_batch));
                const Solver sv = parse_solver(solver);
                OutArray out = new_array(shape_of(noise));
                float* o = out.data();
                s.run([&](auto& p) { p.act(tokens, span_of(noise), std::span<float>(o, B * A), sv, steps); });
                return out;
            },
            "tokens"_a, "noise"_a, "solver"_a = "euler", "steps"_a = 10,
            "tokens [L] -> prefill -> last hidden row as condition -> flow solve from noise [A] or [B, A].");

    bind_diffusion_policy(m);
    bind_act_policy(m);
}
