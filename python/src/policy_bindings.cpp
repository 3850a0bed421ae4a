// flowedge.DiffusionPolicy: the whole LeRobot Diffusion Policy (DiffusionPolicy<B>) from Python. select_action takes
// the observation dict a LeRobot environment gives (numpy arrays keyed by feature name), views the arrays in place
// when their dtype and layout fit, and runs the C++ call with the GIL released.
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
#include "flowedge/realtime.hpp"

namespace flowedge::python {
namespace {

using U8 = nb::ndarray<const std::uint8_t, nb::c_contig, nb::device::cpu>;

/// Most cameras one select_action takes (DiffusionPolicy keeps a per-camera layout table of this size).
constexpr std::size_t kMaxCameras = 32;

/// The policy, its lock and the feature keys as Python strings (made once, so a call does no string building).
struct PyWholePolicy : Held<DiffusionPolicy> {
    nb::str state_key, env_key;
    std::string state_name, env_name;  ///< the same keys for messages
    std::vector<nb::str> camera_keys;
    std::vector<io::PolicyCamera> cameras;
    int action_dim = 0, state_dim = 0, env_dim = 0, horizon = 0;

    explicit PyWholePolicy(Resident<DiffusionPolicy>&& m) : Held<DiffusionPolicy>(std::move(m)) {
        model.visit([&](auto& p) {
            action_dim = p.action_dim();
            state_dim = p.state_dim();
            env_dim = p.env_dim();
            horizon = p.config().horizon;
            cameras = p.cameras();
            state_name = p.state_key();
            env_name = p.env_dim() > 0 ? p.env_key() : std::string();
            state_key = nb::str(state_name.c_str());
            env_key = nb::str(env_name.c_str());
        });
        if (cameras.size() > kMaxCameras)
            bad_arg("the policy has " + std::to_string(cameras.size()) + " cameras (at most " + std::to_string(kMaxCameras) + ")");
        for (const auto& c : cameras) camera_keys.emplace_back(c.key.c_str());
    }

    std::string camera_shapes_text(std::size_t cam) const {
        const io::PolicyCamera& c = cameras[cam];
        const std::string h = std::to_string(c.height), w = std::to_string(c.width), ch = std::to_string(c.channels);
        return "[" + h + ", " + w + ", " + ch + "] uint8 or [" + ch + ", " + h + ", " + w + "] float32 in [0, 1]";
    }
};

std::string keys_of(nb::handle obs) {
    std::string s = "[";
    bool first = true;
    for (nb::handle k : nb::iter(obs)) {
        s += (first ? "'" : ", '") + nb::cast<std::string>(nb::str(k)) + "'";
        first = false;
    }
    return s + "]";
}

/// obs[key], or a FlowEdgeValueError naming the key, what it should hold (expected(): built only on failure) and
/// the keys there are.
template <class Expected>
nb::object lookup(nb::handle obs, const nb::str& key, Expected&& expected) {
    nb::object v;
    if (PyDict_Check(obs.ptr())) {
        PyObject* p = PyDict_GetItemWithError(obs.ptr(), key.ptr());
        if (p == nullptr && PyErr_Occurred()) throw nb::python_error();
        v = nb::borrow(p);
    } else {
        PyObject* p = PyObject_GetItem(obs.ptr(), key.ptr());
        if (p == nullptr) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError)) throw nb::python_error();
            PyErr_Clear();
        }
        v = nb::steal(p);
    }
    if (!v.is_valid())
        bad_arg("observation lacks '" + nb::cast<std::string>(key) + "' (expected " + expected() + "; got keys " + keys_of(obs) + ")");
    return v;
}

/// A float feature vector of `dim` values: [dim] or [1, dim] (LeRobot env observations carry a batch of 1).
F32 feature_vector(nb::handle obj, const std::string& key, int dim) {
    const F32 a = as_f32(obj, key.c_str());
    const bool ok = (a.ndim() == 1 && a.shape(0) == std::size_t(dim)) || (a.ndim() == 2 && a.shape(0) == 1 && a.shape(1) == std::size_t(dim));
    if (!ok) bad_arg("'" + key + "' has the wrong shape (expected [" + std::to_string(dim) + "] or [1, " + std::to_string(dim) + "], got " +
                     shape_str(a) + ")");
    return a;
}

/// One camera frame viewed in place (uint8 HWC or float32 CHW, C-contiguous), or converted once: other integer
/// types are refused, other float types become float32.
struct FrameArg {
    U8 u8;
    F32 f32;
    PolicyFrame frame;
};

void frame_arg(nb::handle obj, const PyWholePolicy& s, std::size_t cam, FrameArg& out) {
    const io::PolicyCamera& c = s.cameras[cam];
    const std::string& key = c.key;
    if (!nb::try_cast<U8>(obj, out.u8, false) && !nb::try_cast<F32>(obj, out.f32, false)) {
        nb::module_ np = nb::module_::import_("numpy");
        nb::object arr;
        try {
            arr = np.attr("asarray")(obj);
        } catch (nb::python_error&) {
            bad_arg("'" + key + "' must be an image array (expected " + s.camera_shapes_text(cam) + ")");
        }
        const std::string kind = nb::cast<std::string>(arr.attr("dtype").attr("kind"));
        const std::string dt = nb::cast<std::string>(arr.attr("dtype").attr("name"));
        if (dt == "uint8") out.u8 = nb::cast<U8>(np.attr("ascontiguousarray")(arr));
        else if (kind == "f") out.f32 = nb::cast<F32>(np.attr("ascontiguousarray")(arr, "dtype"_a = np.attr("float32")));
        else bad_arg("'" + key + "' has dtype " + dt + " (expected " + s.camera_shapes_text(cam) + ")");
    }
    const bool is_u8 = out.u8.is_valid();
    const std::size_t nd = is_u8 ? out.u8.ndim() : out.f32.ndim();
    auto dim = [&](std::size_t i) { return is_u8 ? out.u8.shape(i) : out.f32.shape(i); };
    const std::size_t lead = nd == 4 ? 1 : 0;  // an optional batch of 1
    bool ok = (nd == 3 || (nd == 4 && dim(0) == 1));
    std::size_t h = 0, w = 0, ch = 0;
    if (ok) {
        if (is_u8) h = dim(lead), w = dim(lead + 1), ch = dim(lead + 2);
        else ch = dim(lead), h = dim(lead + 1), w = dim(lead + 2);
        ok = ch == std::size_t(c.channels) && h == std::size_t(c.height) && w == std::size_t(c.width);
    }
    if (!ok) {
        std::string got = "(";
        for (std::size_t i = 0; i < nd; ++i) got += (i ? ", " : "") + std::to_string(dim(i));
        bad_arg("'" + key + "' has the wrong shape (expected " + s.camera_shapes_text(cam) + ", optionally with a leading batch of 1; got " +
                (is_u8 ? "uint8 " : "float32 ") + got + (nd == 1 ? ",)" : ")") + ")");
    }
    out.frame = PolicyFrame{is_u8 ? static_cast<const void*>(out.u8.data()) : static_cast<const void*>(out.f32.data()),
                            is_u8 ? ImageLayout::U8Hwc : ImageLayout::F32Chw, int(h), int(w)};
}

/// The arrays of one select_action call, viewed (or converted once) and checked against the policy's features.
struct ParsedObservation {
    F32 state, env, noise;
    std::array<FrameArg, kMaxCameras> frames;
    std::array<PolicyFrame, kMaxCameras> views;

    PolicyObservation view(const PyWholePolicy& s) const {
        return PolicyObservation{span_of(state), s.env_dim > 0 ? span_of(env) : std::span<const float>{},
                                 std::span<const PolicyFrame>(views.data(), s.cameras.size())};
    }
    std::span<const float> noise_span() const { return noise.is_valid() ? span_of(noise) : std::span<const float>{}; }
};

void parse_observation(const PyWholePolicy& s, nb::handle obs, nb::handle noise_obj, ParsedObservation& in) {
    in.state = feature_vector(lookup(obs, s.state_key, [&] { return "[" + std::to_string(s.state_dim) + "] float32"; }),
                              s.state_name, s.state_dim);
    if (s.env_dim > 0)
        in.env = feature_vector(lookup(obs, s.env_key, [&] { return "[" + std::to_string(s.env_dim) + "] float32"; }), s.env_name,
                                s.env_dim);
    for (std::size_t c = 0; c < s.cameras.size(); ++c) {
        frame_arg(lookup(obs, s.camera_keys[c], [&] { return s.camera_shapes_text(c); }), s, c, in.frames[c]);
        in.views[c] = in.frames[c].frame;
    }
    if (!noise_obj.is_none()) {
        in.noise = as_f32(noise_obj, "noise");
        const F32& noise = in.noise;
        const std::size_t H = std::size_t(s.horizon), A = std::size_t(s.action_dim);
        const bool ok = (noise.ndim() == 2 && noise.shape(0) == H && noise.shape(1) == A) ||
                        (noise.ndim() == 3 && noise.shape(0) == 1 && noise.shape(1) == H && noise.shape(2) == A);
        if (!ok)
            bad_arg("noise has the wrong shape (expected [horizon, action_dim] = [" + std::to_string(H) + ", " + std::to_string(A) +
                    "], got " + shape_str(noise) + ")");
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
           nb::handle steps, nb::handle scheduler, const nb::int_& seed) {
            PolicyOptions opts;
            opts.load.weight_dtype = dtype_arg(dtype);
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
        "seed"_a = nb::int_(0),
        nb::sig("def __init__(self, folder: str | os.PathLike, device: typing.Literal['cpu', 'cuda', 'auto'] = 'cpu', "
                "dtype: typing.Literal['float32', 'bfloat16', 'float16'] | numpy.dtype | None = None, steps: int | None = None, "
                "scheduler: typing.Literal['ddim', 'ddpm'] | None = None, seed: int = 0) -> None"),
        "Loads a LeRobot DiffusionPolicy pretrained_model folder. device: 'cpu'; 'cuda' (raises FlowEdgeError unless\n"
        "the policy is resident on the GPU); 'auto' (the GPU when usable, else the CPU with the reason in\n"
        "fallback_reason). dtype: weight storage (None = float32). steps / scheduler: None = the checkpoint's\n"
        "num_inference_steps / noise_scheduler_type (LeRobot's rule). seed: the generated noise's seed (reset(seed) changes it).");
    common_properties<PyWholePolicy>(cls);
    cls.def_prop_ro("device", [](PyWholePolicy& s) { return std::string(s.backend()); }, "\"cpu\" or \"cuda\" (same as backend).")
        .def_prop_ro("cameras", [](PyWholePolicy& s) {
            std::vector<std::string> k;
            for (const auto& c : s.cameras) k.push_back(c.key);
            return k;
        }, "Camera feature keys in the policy's order, e.g. ['observation.image'] or ['observation.images.top', ...].")
        .def_prop_ro("camera_shapes", [](PyWholePolicy& s) {
            nb::dict d;
            for (const auto& c : s.cameras) d[c.key.c_str()] = nb::make_tuple(c.channels, c.height, c.width);
            return d;
        }, "{camera key: (channels, height, width)} as in config.json input_features.")
        .def_prop_ro("state_key", [](PyWholePolicy& s) { return s.state_name; })
        .def_prop_ro("state_dim", [](PyWholePolicy& s) { return s.state_dim; })
        .def_prop_ro("env_key", [](PyWholePolicy& s) -> nb::object {
            if (s.env_dim == 0) return nb::none();
            return s.env_key;
        }, "'observation.environment_state' when the policy has one, else None.")
        .def_prop_ro("env_dim", [](PyWholePolicy& s) { return s.env_dim; })
        .def_prop_ro("action_dim", [](PyWholePolicy& s) { return s.action_dim; })
        .def_prop_ro("horizon", [](PyWholePolicy& s) { return s.horizon; })
        .def_prop_ro("n_obs_steps", [](PyWholePolicy& s) { return s.get([](auto& p) { return p.config().n_obs_steps; }); })
        .def_prop_ro("n_action_steps", [](PyWholePolicy& s) { return s.get([](auto& p) { return p.config().n_action_steps; }); })
        .def_prop_ro("steps", [](PyWholePolicy& s) { return s.get([](auto& p) { return p.steps(); }); }, "Inference steps per chunk.")
        .def_prop_ro("scheduler", [](PyWholePolicy& s) {
            return std::string(s.get([](auto& p) { return p.scheduler(); }) == Scheduler::Ddpm ? "ddpm" : "ddim");
        })
        .def_prop_ro("chunks_generated", [](PyWholePolicy& s) { return s.get([](auto& p) { return p.chunks_generated(); }); },
                     "Chunks generated since the last reset() (the last select_action generated one when it grew).")
        .def_prop_ro("device_bytes", [](PyWholePolicy& s) { return s.get([](auto& p) { return p.device_bytes(); }); },
                     "Bytes held on the backend (weights, buffers, workspaces).")
        .def(
            "reset",
            [](PyWholePolicy& s, nb::handle seed) {
                std::optional<std::uint64_t> v;
                if (!seed.is_none()) {
                    if (!nb::isinstance<nb::int_>(seed)) throw nb::type_error("flowedge: python: seed must be None or an int");
                    v = seed_arg(nb::borrow<nb::int_>(seed));
                }
                s.run([&](auto& p) { p.reset(v); });
            },
            "seed"_a = nb::none(),
            "LeRobot's reset(): empties the observation and action queues (call at every episode start). seed replaces\n"
            "the seed of the generated noise when given.")
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
            "set_realtime",
            [](PyWholePolicy& s, bool lock_memory, bool prefault, nb::handle cpus, int rt_priority, bool high_priority_stream,
               bool pinned_staging, bool isolate_cpus) {
                RealtimeOptions o;
                o.lock_memory = lock_memory;
                o.prefault = prefault;
                o.rt_priority = rt_priority;
                o.high_priority_stream = high_priority_stream;
                o.pinned_staging = pinned_staging;
                o.isolate_cpus = isolate_cpus;
                if (nb::isinstance<nb::str>(cpus)) {
                    o.cpus = realtime::parse_cpu_list(nb::cast<std::string>(cpus));
                } else if (!cpus.is_none()) {
                    try {
                        o.cpus = nb::cast<std::vector<int>>(cpus);
                    } catch (const nb::cast_error&) {
                        throw nb::type_error("flowedge: python: cpus must be None, a list of ints or a string like '2,3'");
                    }
                }
                RealtimeReport r;
                s.run([&](auto& p) { r = p.set_realtime(o); });  // this thread: the one that calls select_action
                nb::dict d;
                d["memory_locked"] = r.memory_locked;
                d["prefaulted"] = r.prefaulted;
                d["prefaulted_bytes"] = r.prefaulted_bytes;
                d["threads_placed"] = r.threads_placed;
                d["threads_moved"] = r.threads_moved;
                d["cpus"] = o.cpus;
                d["rt_priority"] = o.rt_priority;
                d["high_priority_stream"] = r.high_priority_stream;
                d["pinned_staging"] = r.pinned_staging;
                return d;
            },
            nb::kw_only(), "lock_memory"_a = false, "prefault"_a = false, "cpus"_a = nb::none(), "rt_priority"_a = 0,
            "high_priority_stream"_a = false, "pinned_staging"_a = false, "isolate_cpus"_a = false,
            nb::sig("def set_realtime(self, *, lock_memory: bool = False, prefault: bool = False, "
                    "cpus: typing.Sequence[int] | str | None = None, rt_priority: int = 0, high_priority_stream: bool = False, "
                    "pinned_staging: bool = False, isolate_cpus: bool = False) -> dict"),
            "Real-time options (docs/realtime.md); call from the thread that runs the control loop, after loading and\n"
            "before the warm-up ticks. lock_memory: mlockall + pre-fault (needs RLIMIT_MEMLOCK >= the mapped size or\n"
            "CAP_IPC_LOCK); prefault: touch every mapped page without locking; cpus: pin this thread and the OpenMP\n"
            "workers (worker i on cpus[i % len]); isolate_cpus: move the process's other threads off those CPUs;\n"
            "rt_priority: SCHED_FIFO 1..99 for them (needs RLIMIT_RTPRIO or\n"
            "CAP_SYS_NICE); high_priority_stream / pinned_staging: CUDA only (ignored on the CPU). A refusal raises\n"
            "FlowEdgeError naming the limit and the fix; a bad CPU or priority FlowEdgeValueError. Returns what was done.")
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
