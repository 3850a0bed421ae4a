// The observation side shared by the whole-policy classes of the Python module (policy_bindings.cpp: DiffusionPolicy,
// act_bindings.cpp: ActPolicy): the observation dict LeRobot environments give (numpy arrays keyed by feature name),
// viewed in place when dtype and layout fit, checked against the policy's features with messages naming the key;
// the feature properties and the real-time options both classes expose.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "binding_support.hpp"
#include "flowedge/models/diffusion/lerobot_policy_folder.hpp"
#include "flowedge/models/policy_observation.hpp"
#include "flowedge/realtime.hpp"

namespace flowedge::python {

using U8 = nb::ndarray<const std::uint8_t, nb::c_contig, nb::device::cpu>;

/// Most cameras one select_action takes (DiffusionPolicy keeps a per-camera layout table of this size).
constexpr std::size_t kMaxCameras = 32;

/// A whole policy's feature keys as Python strings (made once, so a call does no string building) and its shapes.
struct PolicyFeatures {
    nb::str state_key, env_key;
    std::string state_name, env_name;  ///< the same keys for messages
    std::vector<nb::str> camera_keys;
    std::vector<io::PolicyCamera> cameras;
    int action_dim = 0, state_dim = 0, env_dim = 0, horizon = 0;

    /// From a loaded DiffusionPolicy or ActPolicy; `chunk` is its actions per chunk (horizon, chunk_size).
    template <class M>
    void read(const M& p, int chunk) {
        action_dim = p.action_dim();
        state_dim = p.state_dim();
        env_dim = p.env_dim();
        horizon = chunk;
        cameras = p.cameras();
        state_name = p.state_key();
        env_name = p.env_dim() > 0 ? p.env_key() : std::string();
        state_key = nb::str(state_name.c_str());
        env_key = nb::str(env_name.c_str());
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

inline std::string keys_of(nb::handle obs) {
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
inline F32 feature_vector(nb::handle obj, const std::string& key, int dim) {
    const F32 a = as_f32(obj, key.c_str());
    const bool ok = (a.ndim() == 1 && a.shape(0) == std::size_t(dim)) || (a.ndim() == 2 && a.shape(0) == 1 && a.shape(1) == std::size_t(dim));
    if (!ok) bad_arg("'" + key + "' has the wrong shape (expected [" + std::to_string(dim) + "] or [1, " + std::to_string(dim) + "], got " +
                     shape_str(a) + ")");
    return a;
}

/// One camera frame viewed in place (uint8 HWC or float32 CHW, C-contiguous), or converted once: other integer
/// types are refused, other float types become float32. With `batch` > 0: that many frames, [batch, H, W, C] uint8 or
/// [batch, C, H, W] float32 (one per environment, DiffusionPolicy.select_action_batch); frame.data is the first.
struct FrameArg {
    U8 u8;
    F32 f32;
    PolicyFrame frame;
};

inline void frame_arg(nb::handle obj, const PolicyFeatures& s, std::size_t cam, FrameArg& out, std::size_t batch = 0) {
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
    const std::size_t lead = nd == 4 ? 1 : 0;  // an optional batch of 1, or the environments
    bool ok = batch == 0 ? (nd == 3 || (nd == 4 && dim(0) == 1)) : (nd == 4 && dim(0) == batch);
    std::size_t h = 0, w = 0, ch = 0;
    if (ok) {
        if (is_u8) h = dim(lead), w = dim(lead + 1), ch = dim(lead + 2);
        else ch = dim(lead), h = dim(lead + 1), w = dim(lead + 2);
        ok = ch == std::size_t(c.channels) && h == std::size_t(c.height) && w == std::size_t(c.width);
    }
    if (!ok) {
        std::string got = "(";
        for (std::size_t i = 0; i < nd; ++i) got += (i ? ", " : "") + std::to_string(dim(i));
        const std::string lead_text = batch == 0 ? "optionally with a leading batch of 1" : "with a leading batch of " + std::to_string(batch);
        bad_arg("'" + key + "' has the wrong shape (expected " + s.camera_shapes_text(cam) + ", " + lead_text + "; got " +
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

    PolicyObservation view(const PolicyFeatures& s) const {
        return PolicyObservation{span_of(state), s.env_dim > 0 ? span_of(env) : std::span<const float>{},
                                 std::span<const PolicyFrame>(views.data(), s.cameras.size())};
    }
    std::span<const float> noise_span() const { return noise.is_valid() ? span_of(noise) : std::span<const float>{}; }
};

inline void parse_observation(const PolicyFeatures& s, nb::handle obs, nb::handle noise_obj, ParsedObservation& in) {
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

/// The real-time keyword arguments of set_realtime (docs/realtime.md) as the C++ struct.
inline RealtimeOptions realtime_args(bool lock_memory, bool prefault, nb::handle cpus, int rt_priority, bool high_priority_stream,
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
    return o;
}

/// What set_realtime did, as the dict it returns.
inline nb::dict realtime_report(const RealtimeReport& r, const RealtimeOptions& o) {
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
}

/// set_realtime on a whole-policy class T (run(f) visits the held model on this thread, the one that calls
/// select_action): the same keywords, checks and returned dict for every policy type.
template <class T, class Cls>
void realtime_method(Cls& cls) {
    cls.def(
        "set_realtime",
        [](T& s, bool lock_memory, bool prefault, nb::handle cpus, int rt_priority, bool high_priority_stream, bool pinned_staging,
           bool isolate_cpus) {
            const RealtimeOptions o =
                realtime_args(lock_memory, prefault, cpus, rt_priority, high_priority_stream, pinned_staging, isolate_cpus);
            RealtimeReport r;
            s.run([&](auto& p) { r = p.set_realtime(o); });
            return realtime_report(r, o);
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
        "rt_priority: SCHED_FIFO 1..99 for them (needs RLIMIT_RTPRIO or CAP_SYS_NICE); high_priority_stream /\n"
        "pinned_staging: CUDA only (ignored on the CPU; ACT has no pinned staging yet: reported False). A refusal\n"
        "raises FlowEdgeError naming the limit and the fix; a bad CPU or priority FlowEdgeValueError. Returns what\n"
        "was done.");
}

/// The feature properties of a whole-policy class T (a PolicyFeatures with backend()).
template <class T, class Cls>
void feature_properties(Cls& cls) {
    cls.def_prop_ro("device", [](T& s) { return std::string(s.backend()); }, "\"cpu\" or \"cuda\" (same as backend).")
        .def_prop_ro("cameras", [](T& s) {
            std::vector<std::string> k;
            for (const auto& c : s.cameras) k.push_back(c.key);
            return k;
        }, "Camera feature keys in the policy's order, e.g. ['observation.image'] or ['observation.images.top', ...].")
        .def_prop_ro("camera_shapes", [](T& s) {
            nb::dict d;
            for (const auto& c : s.cameras) d[c.key.c_str()] = nb::make_tuple(c.channels, c.height, c.width);
            return d;
        }, "{camera key: (channels, height, width)} as in config.json input_features.")
        .def_prop_ro("state_key", [](T& s) { return s.state_name; })
        .def_prop_ro("state_dim", [](T& s) { return s.state_dim; })
        .def_prop_ro("env_key", [](T& s) -> nb::object {
            if (s.env_dim == 0) return nb::none();
            return s.env_key;
        }, "'observation.environment_state' when the policy has one, else None.")
        .def_prop_ro("env_dim", [](T& s) { return s.env_dim; })
        .def_prop_ro("action_dim", [](T& s) { return s.action_dim; })
        .def_prop_ro("horizon", [](T& s) { return s.horizon; }, "Actions per chunk (ACT: chunk_size).");
}

}  // namespace flowedge::python
