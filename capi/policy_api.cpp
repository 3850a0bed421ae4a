// The fe_policy part of the C API (include/flowedge/c_api.h): a LeRobot DiffusionPolicy or ACT folder (chosen by
// config.json's "type") behind reset() / select_action(), with the observation struct checked field by field before
// the C++ class sees it.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "boundary.hpp"
#include "flowedge/c_api.h"
#include "flowedge/models/act/policy.hpp"
#include "flowedge/models/diffusion/policy.hpp"
#include "flowedge/models/lerobot_policy_type.hpp"
#include "flowedge/residency.hpp"

using namespace flowedge;
using namespace flowedge::capi;

/// Shapes and keys cached at load so introspection needs neither the lock nor a visit.
struct PolicyInfo {
    PolicyType type = PolicyType::Diffusion;
    int action_dim = 0, state_dim = 0, env_dim = 0, horizon = 0, n_obs_steps = 0, n_action_steps = 0, steps = 0, batch = 1;
    std::string state_key, env_key;
    std::vector<io::PolicyCamera> cameras;
};

/// Exactly one of `diffusion` and `act` is set.
struct fe_policy {
    PolicyInfo info;
    std::optional<Resident<DiffusionPolicy>> diffusion;
    std::optional<Resident<ActPolicy>> act;
    std::vector<PolicyFrame> frames;  ///< [batch, camera], reused by every select_action (no allocation per call)
    std::vector<PolicyObservation> observations;  ///< [batch], reused by every batched select_action
    std::mutex mutex;

    /// f(model) on whichever policy is held (four model types); every call must return the same type.
    template <class F>
    decltype(auto) visit(F&& f) {
        if (act) return act->visit(f);
        return diffusion->visit(f);
    }
    const char* backend() const { return act ? act->backend() : diffusion->backend(); }
    bool cuda_resident() const { return act ? act->cuda_resident() : diffusion->cuda_resident(); }
    const std::string& fallback_reason() const { return act ? act->fallback_reason() : diffusion->fallback_reason(); }
};

namespace {

std::optional<DType> dtype_arg(const char* s) {
    if (s == nullptr) return std::nullopt;
    if (const std::optional<DType> d = weight_dtype_from_name(s)) return d;
    raise(FE_ERR_INVALID_ARGUMENT, "unknown weight dtype '" + std::string(s) + "' (expected " + kWeightDTypeNames + ")");
}

WeightQuant quantize_arg(const char* s) {
    if (s == nullptr) return WeightQuant::None;
    if (const std::optional<WeightQuant> q = weight_quant_from_name(s)) return *q;
    raise(FE_ERR_INVALID_ARGUMENT, "unknown options->quantize '" + std::string(s) + "' (expected NULL, " + kWeightQuantNames + ")");
}

fe_policy& policy_of(fe_policy* p) {
    need_ptr(p, "policy");
    return *p;
}

/// A feature buffer of the observation: exactly `need` floats, non-NULL when `need` > 0; messages name the key.
void check_feature(const float* p, std::size_t len, std::size_t need, const char* field, const std::string& key) {
    const std::string what = std::string("obs->") + field + " ('" + key + "')";
    if (need == 0) {
        if (len != 0) raise(FE_ERR_SHAPE, what + ": the policy has no such input" + expected_got(0, len));
        return;
    }
    if (p == nullptr) raise(FE_ERR_INVALID_ARGUMENT, what + " is NULL (expected " + std::to_string(need) + " floats)");
    if (len < need)
        raise(FE_ERR_INVALID_ARGUMENT, what + " is too small: needs " + std::to_string(need) + " floats" + expected_got(need, len));
    if (len > need) raise(FE_ERR_SHAPE, what + " has more elements than the policy uses" + expected_got(need, len));
}

/// The observation as the C++ class takes it; frames are copied into row `env` of the policy's own PolicyFrame array.
PolicyObservation observation_of(fe_policy& p, const fe_observation* obs, std::size_t env = 0) {
    need_ptr(obs, "obs");
    const PolicyInfo& info = p.info;
    check_feature(obs->state, obs->state_len, std::size_t(info.state_dim), "state", info.state_key);
    check_feature(obs->env_state, obs->env_state_len, std::size_t(info.env_dim), "env_state",
                  info.env_dim > 0 ? info.env_key : std::string("observation.environment_state"));
    const std::size_t n_cam = info.cameras.size();
    if (obs->n_frames < n_cam)
        raise(FE_ERR_INVALID_ARGUMENT, "obs->frames: no frame for camera " + std::to_string(obs->n_frames) + " ('" +
                                           info.cameras[obs->n_frames].key + "')" + expected_got(n_cam, obs->n_frames));
    if (obs->n_frames > n_cam)
        raise(FE_ERR_SHAPE, "obs->frames: more frames than the policy has cameras" + expected_got(n_cam, obs->n_frames));
    if (n_cam > 0) need_ptr(obs->frames, "obs->frames");
    for (std::size_t c = 0; c < n_cam; ++c) {
        const fe_frame& f = obs->frames[c];
        const io::PolicyCamera& cam = info.cameras[c];
        if (f.data == nullptr)
            raise(FE_ERR_INVALID_ARGUMENT, "obs->frames[" + std::to_string(c) + "].data ('" + cam.key + "') is NULL");
        if (f.layout != FE_IMAGE_U8_HWC && f.layout != FE_IMAGE_F32_CHW)
            raise(FE_ERR_INVALID_ARGUMENT, "obs->frames[" + std::to_string(c) + "].layout ('" + cam.key + "') is unknown" +
                                               expected_got("FE_IMAGE_U8_HWC (0) or FE_IMAGE_F32_CHW (1)", f.layout));
        p.frames[env * n_cam + c] = PolicyFrame{f.data, f.layout == FE_IMAGE_U8_HWC ? ImageLayout::U8Hwc : ImageLayout::F32Chw, f.height,
                                  f.width};  // the size is checked by the policy class, with the key
    }
    return PolicyObservation{std::span<const float>(obs->state, obs->state_len),
                             std::span<const float>(obs->env_state, info.env_dim > 0 ? obs->env_state_len : 0),
                             std::span<const PolicyFrame>(p.frames.data() + env * n_cam, n_cam)};
}

/// Every environment's observation checked and converted into the policy's own tables; messages name the environment.
std::span<const PolicyObservation> observations_of(fe_policy& p, const fe_observation* obs, std::size_t n_obs) {
    const std::size_t n = std::size_t(p.info.batch);
    if (n_obs != n) raise(FE_ERR_SHAPE, "n_obs: one observation per environment" + expected_got(n, n_obs));
    need_ptr(obs, "obs");
    for (std::size_t e = 0; e < n; ++e) {
        try {
            p.observations[e] = observation_of(p, obs + e, e);
        } catch (const CapiError& err) {
            constexpr std::string_view prefix = "flowedge: capi: ";
            const std::string_view what = std::string_view(err.message).substr(err.message.rfind(prefix, 0) == 0 ? prefix.size() : 0);
            raise(err.status, "environment " + std::to_string(e) + ": " + std::string(what));
        }
    }
    return p.observations;
}

fe_status select(fe_policy* policy, const fe_observation* obs, const float* noise, std::size_t noise_len, bool with_noise,
                 float* action, std::size_t action_len) {
    return guarded(Phase::Call, [&] {
        fe_policy& p = policy_of(policy);
        std::lock_guard lock(p.mutex);  // observation_of fills the policy's frame table
        const PolicyObservation o = observation_of(p, obs);
        std::span<const float> ns;
        if (with_noise) {
            if (p.act)
                raise(FE_ERR_UNSUPPORTED, "fe_policy_select_action_noise: an ACT policy draws no noise (expected a Diffusion Policy; "
                                          "use fe_policy_select_action)");
            check_input(noise, noise_len, std::size_t(p.info.horizon) * std::size_t(p.info.action_dim), "noise");
            ns = std::span<const float>(noise, noise_len);
        }
        check_output(action, action_len, std::size_t(p.info.action_dim), "action");
        const std::span<float> a(action, std::size_t(p.info.action_dim));
        if (p.act) p.act->visit([&](auto& m) { m.select_action(o, a); });
        else p.diffusion->visit([&](auto& m) { m.select_action(o, a, ns); });
    });
}

/// The C options as the C++ struct, the CPU list and priority range checked with the C field names.
RealtimeOptions realtime_options_of(const fe_realtime_options* o) {
    need_ptr(o, "options");
    if (o->n_cpus > 0) need_ptr(o->cpus, "options->cpus");
    RealtimeOptions r;
    r.lock_memory = o->lock_memory != 0;
    r.prefault = o->prefault != 0;
    r.cpus.assign(o->cpus, o->cpus + o->n_cpus);
    r.rt_priority = o->rt_priority;
    r.high_priority_stream = o->high_priority_stream != 0;
    r.pinned_staging = o->pinned_staging != 0;
    r.isolate_cpus = o->isolate_cpus != 0;
    return r;
}

/// The fields every policy type shares, from the loaded model.
template <class M>
void fill_common_info(PolicyInfo& i, const M& m) {
    i.action_dim = m.action_dim();
    i.state_dim = m.state_dim();
    i.env_dim = m.env_dim();
    i.state_key = m.state_key();
    i.env_key = m.env_dim() > 0 ? m.env_key() : std::string();
    i.cameras = m.cameras();
}

/// "cuda" (no fallback) in a build without the CUDA backend fails before anything loads.
void check_cuda_build(const DeviceRequest& req, const ResidencyFlags& flags) {
    if (req.want == Device::Cuda && !req.fallback_allowed && !backend_available_v<Cuda> && !flags.cuda_required)
        raise(FE_ERR_DEVICE, "device \"cuda\" requested but this build has no CUDA backend (configure with "
                             "-DFLOWEDGE_BACKEND=cuda)" + std::string(kUseAuto));
}

/// "cuda" (no fallback) fails closed unless the policy is resident on the GPU.
void check_resident(const DeviceRequest& req, const fe_policy& p) {
    if (req.want == Device::Cuda && !req.fallback_allowed && !p.cuda_resident())
        raise(FE_ERR_DEVICE, "device \"cuda\" requested but the policy is not resident on the GPU (" + p.fallback_reason() + ")" +
                                 kUseAuto);
}

std::unique_ptr<fe_policy> load_diffusion(const std::filesystem::path& dir, const DeviceRequest& req, const ResidencyFlags& flags,
                                          const fe_policy_options* options) {
    PolicyOptions opts;
    if (options != nullptr) {
        if (options->act_selection != nullptr)
            raise(FE_ERR_INVALID_ARGUMENT, "options->act_selection applies to ACT policies only (expected NULL for a Diffusion Policy folder)");
        opts.load.weight_dtype = dtype_arg(options->dtype);
        opts.load.quantize = quantize_arg(options->quantize);
        if (options->steps < 0) raise(FE_ERR_INVALID_ARGUMENT, "options->steps must be >= 0 (0 = the checkpoint's)" +
                                                                 expected_got(">= 0", options->steps));
        opts.steps = options->steps;
        if (options->scheduler != nullptr) {
            try {
                opts.scheduler = parse_scheduler(options->scheduler);
            } catch (const Error& e) {
                raise(FE_ERR_INVALID_ARGUMENT, std::string("options->scheduler: ") + e.what());
            }
        }
        opts.seed = options->seed;
        if (options->batch < 0) raise(FE_ERR_INVALID_ARGUMENT, "options->batch must be >= 0 (0 = 1 environment)" +
                                                                 expected_got(">= 0", options->batch));
        opts.batch = std::max(options->batch, 1);
    }
    check_cuda_build(req, flags);
    auto p = std::make_unique<fe_policy>();
    try {
        p->diffusion.emplace(Resident<DiffusionPolicy>::load(req.want, flags, [&](auto tag) {
            return DiffusionPolicy<decltype(tag)>::load(dir, opts);
        }));
    } catch (const Error& e) {
        // A step count the schedule rejects is the caller's value, not a bad file.
        if (opts.steps > 0 && std::string_view(e.what()).find("steps out of range") != std::string_view::npos)
            throw CapiError{FE_ERR_INVALID_ARGUMENT, e.what()};
        throw;
    }
    p->diffusion->visit([&](auto& m) {
        const DiffusionConfig& c = m.config();
        PolicyInfo& i = p->info;
        fill_common_info(i, m);
        i.horizon = c.horizon;
        i.n_obs_steps = c.n_obs_steps;
        i.n_action_steps = c.n_action_steps;
        i.steps = m.steps();
        i.batch = m.batch();
    });
    check_resident(req, *p);
    return p;
}

/// An ACT folder, resident on the GPU when asked for and possible. The sampler options are the Diffusion Policy's: a
/// value other than the zero default is the caller's mistake, named here; the seed is ignored (ACT draws no noise).
std::unique_ptr<fe_policy> load_act(const std::filesystem::path& dir, const DeviceRequest& req, const ResidencyFlags& flags,
                                    const fe_policy_options* options) {
    ActPolicyOptions opts;
    if (options != nullptr) {
        opts.load.weight_dtype = dtype_arg(options->dtype);
        if (quantize_arg(options->quantize) != WeightQuant::None)
            raise(FE_ERR_INVALID_ARGUMENT, "options->quantize is a Diffusion Policy option and this is an ACT policy (expected NULL or "
                                           "\"none\", got '" + std::string(options->quantize) + "')");
        if (options->steps != 0)
            raise(FE_ERR_INVALID_ARGUMENT, "options->steps is a Diffusion Policy option and this is an ACT policy (expected 0, got " +
                                               std::to_string(options->steps) + ")");
        if (options->scheduler != nullptr)
            raise(FE_ERR_INVALID_ARGUMENT, "options->scheduler is a Diffusion Policy option and this is an ACT policy (expected NULL, got '" +
                                               std::string(options->scheduler) + "')");
        if (options->batch > 1)
            raise(FE_ERR_INVALID_ARGUMENT, "options->batch: an ACT policy serves one environment (expected 0 or 1, got " +
                                               std::to_string(options->batch) + ")");
        if (const fe_act_selection* s = options->act_selection) {
            ActSelection sel;
            if (s->temporal_ensemble != 0) sel.temporal_ensemble_coeff = s->temporal_ensemble_coeff;
            sel.n_action_steps = s->n_action_steps;
            opts.selection = sel;
        }
    }
    check_cuda_build(req, flags);
    auto p = std::make_unique<fe_policy>();
    try {
        p->act.emplace(Resident<ActPolicy>::load(req.want, flags, [&](auto tag) { return ActPolicy<decltype(tag)>::load(dir, opts); }));
    } catch (const Error& e) {
        // A selection ActConfig::validate rejects is the caller's value, not a bad file.
        if (opts.selection && std::string_view(e.what()).find("ActPolicyOptions::selection") != std::string_view::npos)
            throw CapiError{FE_ERR_INVALID_ARGUMENT, e.what()};
        throw;
    }
    p->act->visit([&](auto& m) {
        const ActConfig& c = m.config();
        PolicyInfo& i = p->info;
        i.type = PolicyType::Act;
        fill_common_info(i, m);
        i.horizon = c.chunk_size;
        i.n_obs_steps = 1;
        i.n_action_steps = c.n_action_steps;
        i.steps = 0;
    });
    check_resident(req, *p);
    return p;
}

}  // namespace

extern "C" {

fe_status fe_policy_load_ex(const char* folder, const char* device, const fe_policy_options* options, fe_policy** out) {
    if (out != nullptr) *out = nullptr;
    return guarded(Phase::Load, [&] {
        need_ptr(out, "out");
        need_ptr(folder, "folder");
        const DeviceRequest req = device_arg(device);
        const ResidencyFlags flags = ResidencyFlags::from_env();
        const std::filesystem::path dir(folder);
        std::error_code ec;
        if (!std::filesystem::exists(dir, ec)) raise(FE_ERR_IO, dir.string() + ": no such folder");
        auto p = lerobot_policy_type(dir) == PolicyType::Act ? load_act(dir, req, flags, options) : load_diffusion(dir, req, flags, options);
        p->frames.resize(std::size_t(p->info.batch) * p->info.cameras.size());
        p->observations.resize(std::size_t(p->info.batch));
        *out = p.release();
    });
}

fe_status fe_policy_load(const char* folder, const char* device, fe_policy** out) {
    return fe_policy_load_ex(folder, device, nullptr, out);
}

void fe_policy_free(fe_policy* policy) {
    try {
        delete policy;
    } catch (...) {
    }
}

fe_status fe_policy_reset(fe_policy* policy, const uint64_t* seed) {
    return guarded(Phase::Call, [&] {
        fe_policy& p = policy_of(policy);
        std::optional<std::uint64_t> s;
        if (seed != nullptr) s = *seed;
        std::lock_guard lock(p.mutex);
        if (p.act) p.act->visit([](auto& m) { m.reset(); });  // ACT draws no noise: the seed has nothing to drive
        else p.diffusion->visit([&](auto& m) { m.reset(s); });
    });
}

fe_status fe_policy_select_action(fe_policy* policy, const fe_observation* obs, float* action, size_t action_len) {
    return select(policy, obs, nullptr, 0, false, action, action_len);
}

fe_status fe_policy_select_action_noise(fe_policy* policy, const fe_observation* obs, const float* noise, size_t noise_len,
                                        float* action, size_t action_len) {
    return select(policy, obs, noise, noise_len, true, action, action_len);
}

fe_status fe_policy_select_action_batch(fe_policy* policy, const fe_observation* obs, size_t n_obs, const float* noise,
                                        size_t noise_len, float* actions, size_t actions_len) {
    return guarded(Phase::Call, [&] {
        fe_policy& p = policy_of(policy);
        if (p.act)
            raise(FE_ERR_UNSUPPORTED, "fe_policy_select_action_batch: an ACT policy serves one environment (expected a Diffusion "
                                      "Policy; use fe_policy_select_action)");
        std::lock_guard lock(p.mutex);  // observations_of fills the policy's frame and observation tables
        const std::span<const PolicyObservation> o = observations_of(p, obs, n_obs);
        const std::size_t n = std::size_t(p.info.batch), A = std::size_t(p.info.action_dim);
        std::span<const float> ns;
        if (noise != nullptr) {
            check_input(noise, noise_len, n * std::size_t(p.info.horizon) * A, "noise");
            ns = std::span<const float>(noise, n * std::size_t(p.info.horizon) * A);
        }
        check_output(actions, actions_len, n * A, "actions");
        p.diffusion->visit([&](auto& m) { m.select_action(o, std::span<float>(actions, n * A), ns); });
    });
}

fe_status fe_policy_reset_env(fe_policy* policy, int32_t env, const uint64_t* seed) {
    return guarded(Phase::Call, [&] {
        fe_policy& p = policy_of(policy);
        if (env < 0 || env >= p.info.batch)
            raise(FE_ERR_INVALID_ARGUMENT, "environment index out of range" + expected_got("0.." + std::to_string(p.info.batch - 1), env));
        std::optional<std::uint64_t> s;
        if (seed != nullptr) s = *seed;
        std::lock_guard lock(p.mutex);
        if (p.act) p.act->visit([](auto& m) { m.reset(); });
        else p.diffusion->visit([&](auto& m) { m.reset_env(env, s); });
    });
}

fe_status fe_realtime_apply(const fe_realtime_options* options) {
    return guarded(Phase::Call, [&] { realtime::apply(realtime_options_of(options)); });
}

fe_status fe_policy_set_realtime(fe_policy* policy, const fe_realtime_options* options) {
    return guarded(Phase::Call, [&] {
        fe_policy& p = policy_of(policy);
        const RealtimeOptions o = realtime_options_of(options);
        std::lock_guard lock(p.mutex);
        p.visit([&](auto& m) { m.set_realtime(o); });
    });
}

fe_status fe_policy_set_math(fe_policy* policy, const char* math) {
    return guarded(Phase::Call, [&] {
        fe_policy& p = policy_of(policy);
        if (math == nullptr) raise(FE_ERR_INVALID_ARGUMENT, "fe_policy_set_math: math is NULL (expected \"f32\", \"tf32\" or \"bf16\")");
        const MathMode m = parse_math_mode(math);
        std::lock_guard lock(p.mutex);
        p.visit([&](auto& model) { model.set_math(m); });
    });
}

// ---- introspection ----

#define FLOWEDGE_C_POLICY_INFO(fn, field)                                           \
    int32_t fn(const fe_policy* p) {                                                \
        if (p == nullptr) {                                                         \
            t_last_error = "flowedge: capi: " #fn ": argument 'policy' is NULL";    \
            return -1;                                                              \
        }                                                                           \
        return int32_t(p->info.field);                                              \
    }
FLOWEDGE_C_POLICY_INFO(fe_policy_action_dim, action_dim)
FLOWEDGE_C_POLICY_INFO(fe_policy_state_dim, state_dim)
FLOWEDGE_C_POLICY_INFO(fe_policy_env_dim, env_dim)
FLOWEDGE_C_POLICY_INFO(fe_policy_n_cameras, cameras.size())
FLOWEDGE_C_POLICY_INFO(fe_policy_horizon, horizon)
FLOWEDGE_C_POLICY_INFO(fe_policy_n_obs_steps, n_obs_steps)
FLOWEDGE_C_POLICY_INFO(fe_policy_n_action_steps, n_action_steps)
FLOWEDGE_C_POLICY_INFO(fe_policy_steps, steps)
FLOWEDGE_C_POLICY_INFO(fe_policy_batch, batch)
#undef FLOWEDGE_C_POLICY_INFO

int32_t fe_policy_chunks_generated(fe_policy* p) {
    if (p == nullptr) {
        t_last_error = "flowedge: capi: fe_policy_chunks_generated: argument 'policy' is NULL";
        return -1;
    }
    std::lock_guard lock(p->mutex);
    return p->visit([](auto& m) { return int32_t(m.chunks_generated()); });
}

int32_t fe_policy_env_chunks_generated(fe_policy* p, int32_t env) {
    if (p == nullptr || env < 0 || env >= p->info.batch) {
        t_last_error = p == nullptr ? "flowedge: capi: fe_policy_env_chunks_generated: argument 'policy' is NULL"
                                    : "flowedge: capi: fe_policy_env_chunks_generated: environment index out of range";
        return -1;
    }
    std::lock_guard lock(p->mutex);
    if (p->act) return p->act->visit([](auto& m) { return int32_t(m.chunks_generated()); });
    return p->diffusion->visit([&](auto& m) { return int32_t(m.chunks_generated(env)); });
}

const char* fe_policy_state_key(const fe_policy* p) { return p == nullptr ? "" : p->info.state_key.c_str(); }

const char* fe_policy_env_key(const fe_policy* p) { return p == nullptr ? "" : p->info.env_key.c_str(); }

fe_status fe_policy_camera(const fe_policy* policy, int32_t index, const char** key, int32_t* channels, int32_t* height,
                           int32_t* width) {
    return guarded(Phase::Call, [&] {
        need_ptr(policy, "policy");
        const auto& cams = policy->info.cameras;
        if (index < 0 || std::size_t(index) >= cams.size())
            raise(FE_ERR_INVALID_ARGUMENT, "camera index out of range" +
                                               expected_got("0.." + std::to_string(int(cams.size()) - 1), index));
        const io::PolicyCamera& c = cams[std::size_t(index)];
        if (key != nullptr) *key = c.key.c_str();
        if (channels != nullptr) *channels = c.channels;
        if (height != nullptr) *height = c.height;
        if (width != nullptr) *width = c.width;
    });
}

const char* fe_policy_type(const fe_policy* p) { return p == nullptr ? "" : policy_type_name(p->info.type); }

const char* fe_policy_backend(const fe_policy* p) { return p == nullptr ? "" : p->backend(); }

int fe_policy_cuda_resident(const fe_policy* p) { return p != nullptr && p->cuda_resident() ? 1 : 0; }

const char* fe_policy_fallback_reason(const fe_policy* p) { return p == nullptr ? "" : p->fallback_reason().c_str(); }

size_t fe_policy_device_bytes(fe_policy* p) {
    if (p == nullptr) return 0;
    try {
        std::lock_guard lock(p->mutex);
        if (p->act) return p->act->visit([](auto& m) { return m.buffer_bytes(); });
        return p->diffusion->visit([](auto& m) { return m.device_bytes(); });
    } catch (...) {
        return 0;
    }
}

}  // extern "C"
