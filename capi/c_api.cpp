// The C API (include/flowedge/c_api.h) over the C++ models: argument checks, kind detection, residency and the
// exception-to-status boundary. Nothing thrown inside ever leaves an extern "C" function.
#include "flowedge/c_api.h"

#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "boundary.hpp"
#include "error_map.hpp"
#include "flowedge/error.hpp"
#include "flowedge/models/diffusion/head.hpp"
#include "flowedge/models/mamba_flow/policy.hpp"
#include "flowedge/residency.hpp"

#ifndef FLOWEDGE_VERSION_STRING
#define FLOWEDGE_VERSION_STRING "0.0.0"
#endif

using namespace flowedge;
using namespace flowedge::capi;

namespace {

Solver solver_arg(const char* s) { return s == nullptr ? Solver::Euler : parse_solver(s); }
Scheduler scheduler_arg(const char* s) { return s == nullptr ? Scheduler::Ddim : parse_scheduler(s); }

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

/// Shapes cached at load so introspection needs neither the lock nor a visit.
struct EngineInfo {
    int action_dim = 0, horizon = 0, condition_dim = 0, d_model = 0, vocab = 0;
    int n_obs_steps = 0, n_action_steps = 0, num_train_timesteps = 0;
    int max_batch = 1, max_tokens = 0;
    bool has_backbone = false, has_head = false;
    std::size_t state_bytes = 0;
};

struct fe_engine {
    fe_kind kind = FE_KIND_NONE;
    EngineInfo info;
    std::optional<Resident<DiffusionHead>> diffusion;
    std::optional<Resident<MambaFlowPolicy>> policy;
    std::mutex mutex;

    const char* backend() const { return diffusion ? diffusion->backend() : policy ? policy->backend() : "cpu"; }
    bool cuda_resident() const { return diffusion ? diffusion->cuda_resident() : policy && policy->cuda_resident(); }
    const std::string& fallback_reason() const {
        static const std::string none;
        return diffusion ? diffusion->fallback_reason() : policy ? policy->fallback_reason() : none;
    }
};

namespace {

const char* kind_name(fe_kind k) { return k == FE_KIND_DIFFUSION ? "diffusion" : k == FE_KIND_MAMBA_FLOW ? "mamba-flow" : "none"; }

/// The engine, checked non-NULL and of kind `want`; `fn` names the entry point in messages.
fe_engine& engine_of(fe_engine* e, fe_kind want, const char* fn) {
    need_ptr(e, "engine");
    if (e->kind != want)
        raise(FE_ERR_UNSUPPORTED, std::string(fn) + " needs a " + kind_name(want) + " engine" +
                                      expected_got(kind_name(want), kind_name(e->kind)));
    return *e;
}

void need_backbone(const fe_engine& e, const char* fn) {
    if (!e.info.has_backbone)
        raise(FE_ERR_UNSUPPORTED, std::string(fn) + " needs a Mamba backbone but this checkpoint is head-only "
                                                    "(expected tensor 'backbone.embeddings.weight')");
}

void need_head(const fe_engine& e, const char* fn) {
    if (!e.info.has_head)
        raise(FE_ERR_UNSUPPORTED, std::string(fn) + " needs a flow head but this checkpoint is backbone-only "
                                                    "(expected tensor 'flow.in_proj.weight')");
}

void check_batch(const fe_engine& e, std::int64_t batch) {
    if (batch < 1 || batch > e.info.max_batch)
        raise(FE_ERR_INVALID_ARGUMENT, "batch out of range" + expected_got("1.." + std::to_string(e.info.max_batch) +
                                                                               " (max_batch at load)",
                                                                           std::to_string(batch)));
}

void check_steps(std::int32_t steps) {
    if (steps < 1) raise(FE_ERR_INVALID_ARGUMENT, "steps out of range" + expected_got(">= 1", steps));
}

void check_tokens(const fe_engine& e, const std::int32_t* tokens, std::size_t n) {
    need_ptr(tokens, "tokens");
    if (n < 1 || n > std::size_t(e.info.max_tokens))
        raise(FE_ERR_INVALID_ARGUMENT, "n_tokens out of range" +
                                           expected_got("1.." + std::to_string(e.info.max_tokens) + " (max_tokens at load)",
                                                        std::to_string(n)));
}

/// Which model `path` holds.
fe_kind detect_kind(const std::filesystem::path& path, std::shared_ptr<const io::SafeTensors>& opened) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::exists(path, ec)) raise(FE_ERR_IO, path.string() + ": no such file or folder");
    if (fs::is_directory(path, ec)) return FE_KIND_DIFFUSION;  // LeRobot pretrained_model folder
    if (ends_with(path.filename().string(), ".flowedge.safetensors")) return FE_KIND_DIFFUSION;
    opened = io::SafeTensors::open(path);
    const io::SafeTensors& f = *opened;
    if (f.find("dp.meta") || f.find("diffusion.unet.final_conv.1.weight")) return FE_KIND_DIFFUSION;
    if (Mamba<Cpu>::find_prefix(f) || FlowHead<Cpu>::present(f)) return FE_KIND_MAMBA_FLOW;
    raise(FE_ERR_FORMAT, path.string() +
                             ": not a flowedge checkpoint (expected a LeRobot folder, dp.meta / diffusion.unet.* tensors, "
                             "or backbone.* / flow.* tensors)");
}

}  // namespace

extern "C" {

const char* fe_version(void) { return FLOWEDGE_VERSION_STRING; }

int fe_built_with_cuda(void) { return backend_available_v<Cuda> ? 1 : 0; }

const char* fe_last_error(void) { return t_last_error.c_str(); }

const char* fe_status_name(fe_status s) {
    switch (s) {
        case FE_OK: return "FE_OK";
        case FE_ERR_INVALID_ARGUMENT: return "FE_ERR_INVALID_ARGUMENT";
        case FE_ERR_IO: return "FE_ERR_IO";
        case FE_ERR_FORMAT: return "FE_ERR_FORMAT";
        case FE_ERR_SHAPE: return "FE_ERR_SHAPE";
        case FE_ERR_UNSUPPORTED: return "FE_ERR_UNSUPPORTED";
        case FE_ERR_NON_FINITE: return "FE_ERR_NON_FINITE";
        case FE_ERR_DEVICE: return "FE_ERR_DEVICE";
        case FE_ERR_STATE: return "FE_ERR_STATE";
        case FE_ERR_INTERNAL: return "FE_ERR_INTERNAL";
        case FE_ERR_OUT_OF_MEMORY: return "FE_ERR_OUT_OF_MEMORY";
    }
    return "FE_UNKNOWN";
}

fe_status fe_engine_load_ex(const char* path, const char* device, int32_t max_batch, int32_t max_tokens, fe_engine** out) {
    if (out != nullptr) *out = nullptr;
    return guarded(capi::Phase::Load, [&] {
        need_ptr(out, "out");
        need_ptr(path, "path");
        if (max_batch < 1) raise(FE_ERR_INVALID_ARGUMENT, "max_batch must be positive" + expected_got(">= 1", max_batch));
        if (max_tokens < 1) raise(FE_ERR_INVALID_ARGUMENT, "max_tokens must be positive" + expected_got(">= 1", max_tokens));
        const DeviceRequest req = device_arg(device);
        const Device want = req.want;
        const ResidencyFlags flags = ResidencyFlags::from_env();
        // Without the CUDA backend an explicit "cuda" cannot succeed: say so before reading the weights.
        if (want == Device::Cuda && !req.fallback_allowed && !backend_available_v<Cuda> && !flags.cuda_required)
            raise(FE_ERR_DEVICE, "device \"cuda\" requested but this build has no CUDA backend (configure with "
                                 "-DFLOWEDGE_BACKEND=cuda)" + std::string(kUseAuto));
        std::shared_ptr<const io::SafeTensors> file;
        const std::filesystem::path p(path);
        auto engine = std::make_unique<fe_engine>();
        engine->kind = detect_kind(p, file);
        EngineInfo& info = engine->info;
        info.max_batch = max_batch;
        if (engine->kind == FE_KIND_DIFFUSION) {
            engine->diffusion.emplace(Resident<DiffusionHead>::load(want, flags, [&](auto tag) {
                return DiffusionHead<decltype(tag)>::load(p, {}, max_batch);
            }));
            engine->diffusion->visit([&](auto& h) {
                const DiffusionConfig& c = h.config();
                info.action_dim = c.action_dim;
                info.horizon = c.horizon;
                info.condition_dim = c.global_cond_dim;
                info.n_obs_steps = c.n_obs_steps;
                info.n_action_steps = c.n_action_steps;
                info.num_train_timesteps = c.num_train_timesteps;
            });
        } else {
            engine->policy.emplace(Resident<MambaFlowPolicy>::load(want, flags, [&](auto tag) {
                return MambaFlowPolicy<decltype(tag)>::load(file, {}, max_tokens, max_batch);
            }));
            engine->policy->visit([&](auto& pol) {
                info.has_backbone = pol.has_backbone();
                info.has_head = pol.has_head();
                if (info.has_backbone) {
                    auto& m = pol.backbone();
                    info.d_model = m.config().d_model;
                    info.vocab = m.config().vocab;
                    info.max_tokens = m.max_tokens();
                    info.state_bytes = m.state_bytes();
                }
                if (info.has_head) {
                    info.action_dim = pol.head().config().action_dim;
                    info.condition_dim = pol.head().config().cond_dim;
                }
            });
        }
        if (want == Device::Cuda && !req.fallback_allowed && !engine->cuda_resident())
            raise(FE_ERR_DEVICE, "device \"cuda\" requested but the model is not resident on the GPU (" +
                                     engine->fallback_reason() + ")" + kUseAuto);
        *out = engine.release();
    });
}

fe_status fe_engine_load(const char* path, const char* device, fe_engine** out) {
    return fe_engine_load_ex(path, device, 1, 512, out);
}

void fe_engine_free(fe_engine* engine) {
    try {
        delete engine;
    } catch (...) {
    }
}

// ---- introspection ----

#define FLOWEDGE_C_INFO(fn, field)                                                   \
    int32_t fn(const fe_engine* e) {                                                 \
        if (e == nullptr) {                                                          \
            t_last_error = "flowedge: capi: " #fn ": argument 'engine' is NULL";     \
            return -1;                                                               \
        }                                                                            \
        return int32_t(e->info.field);                                               \
    }
FLOWEDGE_C_INFO(fe_engine_action_dim, action_dim)
FLOWEDGE_C_INFO(fe_engine_horizon, horizon)
FLOWEDGE_C_INFO(fe_engine_condition_dim, condition_dim)
FLOWEDGE_C_INFO(fe_engine_d_model, d_model)
FLOWEDGE_C_INFO(fe_engine_vocab_size, vocab)
FLOWEDGE_C_INFO(fe_engine_n_obs_steps, n_obs_steps)
FLOWEDGE_C_INFO(fe_engine_n_action_steps, n_action_steps)
FLOWEDGE_C_INFO(fe_engine_num_train_timesteps, num_train_timesteps)
FLOWEDGE_C_INFO(fe_engine_max_batch, max_batch)
FLOWEDGE_C_INFO(fe_engine_max_tokens, max_tokens)
#undef FLOWEDGE_C_INFO

fe_kind fe_engine_kind(const fe_engine* e) {
    if (e == nullptr) {
        t_last_error = "flowedge: capi: fe_engine_kind: argument 'engine' is NULL";
        return FE_KIND_NONE;
    }
    return e->kind;
}

const char* fe_engine_backend(const fe_engine* e) { return e == nullptr ? "" : e->backend(); }

int fe_engine_cuda_resident(const fe_engine* e) { return e != nullptr && e->cuda_resident() ? 1 : 0; }

const char* fe_engine_fallback_reason(const fe_engine* e) { return e == nullptr ? "" : e->fallback_reason().c_str(); }

// ---- mamba-flow ----

fe_status fe_engine_sample(fe_engine* engine, const int32_t* tokens, size_t n_tokens, const float* noise, size_t noise_len,
                           const char* solver, int32_t steps, float* out, size_t out_len) {
    return guarded(capi::Phase::Call, [&] {
        fe_engine& e = engine_of(engine, FE_KIND_MAMBA_FLOW, "fe_engine_sample");
        need_backbone(e, "fe_engine_sample");
        need_head(e, "fe_engine_sample");
        check_tokens(e, tokens, n_tokens);
        need_ptr(noise, "noise");
        const std::size_t A = std::size_t(e.info.action_dim);
        if (noise_len < A)
            raise(FE_ERR_INVALID_ARGUMENT, "argument 'noise' is too small: needs at least " + std::to_string(A) +
                                               " floats ([batch, action_dim])" + expected_got(A, noise_len));
        if (noise_len % A != 0)
            raise(FE_ERR_SHAPE, "argument 'noise' must be [batch, action_dim]" +
                                    expected_got("a multiple of " + std::to_string(A), noise_len));
        check_batch(e, std::int64_t(noise_len / A));
        check_output(out, out_len, noise_len, "out");
        check_steps(steps);
        const Solver s = solver_arg(solver);
        std::lock_guard lock(e.mutex);
        e.policy->visit([&](auto& p) {
            p.act(std::span<const std::int32_t>(tokens, n_tokens), std::span<const float>(noise, noise_len),
                  std::span<float>(out, noise_len), s, steps);
        });
    });
}

fe_status fe_engine_sample_condition(fe_engine* engine, const float* cond, size_t cond_len, const float* noise,
                                     size_t noise_len, int32_t batch, const char* solver, int32_t steps, float* out,
                                     size_t out_len) {
    return guarded(capi::Phase::Call, [&] {
        fe_engine& e = engine_of(engine, FE_KIND_MAMBA_FLOW, "fe_engine_sample_condition");
        need_head(e, "fe_engine_sample_condition");
        check_batch(e, batch);
        const std::size_t b = std::size_t(batch);
        check_input(cond, cond_len, b * std::size_t(e.info.condition_dim), "cond");
        check_input(noise, noise_len, b * std::size_t(e.info.action_dim), "noise");
        check_output(out, out_len, noise_len, "out");
        check_steps(steps);
        const Solver s = solver_arg(solver);
        std::lock_guard lock(e.mutex);
        e.policy->visit([&](auto& p) {
            p.head().sample(std::span<const float>(cond, cond_len), std::span<const float>(noise, noise_len),
                            std::span<float>(out, noise_len), s, steps, batch);
        });
    });
}

fe_status fe_engine_prefill(fe_engine* engine, const int32_t* tokens, size_t n_tokens, float* hidden, size_t hidden_len) {
    return guarded(capi::Phase::Call, [&] {
        fe_engine& e = engine_of(engine, FE_KIND_MAMBA_FLOW, "fe_engine_prefill");
        need_backbone(e, "fe_engine_prefill");
        check_tokens(e, tokens, n_tokens);
        const std::size_t n = n_tokens * std::size_t(e.info.d_model);
        check_output(hidden, hidden_len, n, "hidden");
        std::lock_guard lock(e.mutex);
        e.policy->visit([&](auto& p) {
            p.backbone().prefill(std::span<const std::int32_t>(tokens, n_tokens), std::span<float>(hidden, n));
        });
    });
}

fe_status fe_engine_step(fe_engine* engine, int32_t token, float* hidden, size_t hidden_len) {
    return guarded(capi::Phase::Call, [&] {
        fe_engine& e = engine_of(engine, FE_KIND_MAMBA_FLOW, "fe_engine_step");
        need_backbone(e, "fe_engine_step");
        const std::size_t dm = std::size_t(e.info.d_model);
        check_output(hidden, hidden_len, dm, "hidden");
        if (token < 0 || token >= e.info.vocab)
            raise(FE_ERR_INVALID_ARGUMENT, "token id out of range" +
                                               expected_got("0 <= id < " + std::to_string(e.info.vocab), token));
        std::lock_guard lock(e.mutex);
        e.policy->visit([&](auto& p) { p.backbone().step(token, std::span<float>(hidden, dm)); });
    });
}

fe_status fe_engine_reset(fe_engine* engine) {
    return guarded(capi::Phase::Call, [&] {
        fe_engine& e = engine_of(engine, FE_KIND_MAMBA_FLOW, "fe_engine_reset");
        need_backbone(e, "fe_engine_reset");
        std::lock_guard lock(e.mutex);
        e.policy->visit([&](auto& p) { p.backbone().reset(); });
    });
}

fe_status fe_engine_state_size(const fe_engine* engine, size_t* out_bytes) {
    return guarded(capi::Phase::Call, [&] {
        const fe_engine& e = engine_of(const_cast<fe_engine*>(engine), FE_KIND_MAMBA_FLOW, "fe_engine_state_size");
        need_backbone(e, "fe_engine_state_size");
        need_ptr(out_bytes, "out_bytes");
        *out_bytes = e.info.state_bytes;
    });
}

fe_status fe_engine_export_state(fe_engine* engine, void* buf, size_t buf_bytes, size_t* written) {
    return guarded(capi::Phase::Call, [&] {
        fe_engine& e = engine_of(engine, FE_KIND_MAMBA_FLOW, "fe_engine_export_state");
        need_backbone(e, "fe_engine_export_state");
        check_output(buf, buf_bytes, e.info.state_bytes, "buf", "bytes");
        std::lock_guard lock(e.mutex);
        std::size_t n = 0;
        e.policy->visit([&](auto& p) {
            n = p.backbone().export_state(std::span<std::byte>(static_cast<std::byte*>(buf), e.info.state_bytes));
        });
        if (written != nullptr) *written = n;
    });
}

fe_status fe_engine_import_state(fe_engine* engine, const void* buf, size_t buf_bytes) {
    return guarded(capi::Phase::Call, [&] {
        fe_engine& e = engine_of(engine, FE_KIND_MAMBA_FLOW, "fe_engine_import_state");
        need_backbone(e, "fe_engine_import_state");
        need_ptr(buf, "buf");
        if (buf_bytes < e.info.state_bytes)
            raise(FE_ERR_INVALID_ARGUMENT, "argument 'buf' is too small: needs " + std::to_string(e.info.state_bytes) +
                                               " bytes" + expected_got(e.info.state_bytes, buf_bytes));
        std::lock_guard lock(e.mutex);
        e.policy->visit([&](auto& p) {
            p.backbone().import_state(std::span<const std::byte>(static_cast<const std::byte*>(buf), buf_bytes));
        });
    });
}

// ---- diffusion ----

fe_status fe_engine_sample_diffusion(fe_engine* engine, const float* cond, size_t cond_len, const float* noise,
                                     size_t noise_len, int32_t batch, int32_t steps, const char* scheduler, uint64_t seed,
                                     float* out, size_t out_len) {
    return guarded(capi::Phase::Call, [&] {
        fe_engine& e = engine_of(engine, FE_KIND_DIFFUSION, "fe_engine_sample_diffusion");
        check_batch(e, batch);
        const std::size_t b = std::size_t(batch), per = std::size_t(e.info.horizon) * std::size_t(e.info.action_dim);
        check_input(cond, cond_len, b * std::size_t(e.info.condition_dim), "cond");
        check_input(noise, noise_len, b * per, "noise");
        check_output(out, out_len, b * per, "out");
        if (steps < 1 || steps > e.info.num_train_timesteps)
            raise(FE_ERR_INVALID_ARGUMENT, "steps out of range" +
                                               expected_got("1.." + std::to_string(e.info.num_train_timesteps), steps));
        const SampleOptions opts{.steps = steps, .scheduler = scheduler_arg(scheduler), .seed = seed};
        std::lock_guard lock(e.mutex);
        e.diffusion->visit([&](auto& h) {
            h.sample(std::span<const float>(cond, cond_len), std::span<const float>(noise, noise_len),
                     std::span<float>(out, b * per), opts, batch);
        });
    });
}

fe_status fe_engine_set_math(fe_engine* engine, const char* math) {
    return guarded(capi::Phase::Call, [&] {
        need_ptr(engine, "engine");
        fe_engine& e = engine_of(engine, engine->kind == FE_KIND_MAMBA_FLOW ? FE_KIND_MAMBA_FLOW : FE_KIND_DIFFUSION,
                                 "fe_engine_set_math");
        if (math == nullptr) raise(FE_ERR_INVALID_ARGUMENT, "fe_engine_set_math: math is NULL (expected \"f32\", \"tf32\" or \"bf16\")");
        const MathMode m = parse_math_mode(math);
        std::lock_guard lock(e.mutex);
        if (e.kind == FE_KIND_MAMBA_FLOW) e.policy->visit([&](auto& p) { p.set_math(m); });  // no solve is left active between calls
        else e.diffusion->visit([&](auto& h) { h.set_math(m); });
    });
}

fe_status fe_engine_diffusion_denoise(fe_engine* engine, const float* cond, size_t cond_len, const float* sample,
                                      size_t sample_len, int32_t batch, int32_t timestep, float* eps, size_t eps_len) {
    return guarded(capi::Phase::Call, [&] {
        fe_engine& e = engine_of(engine, FE_KIND_DIFFUSION, "fe_engine_diffusion_denoise");
        check_batch(e, batch);
        const std::size_t b = std::size_t(batch), per = std::size_t(e.info.horizon) * std::size_t(e.info.action_dim);
        check_input(cond, cond_len, b * std::size_t(e.info.condition_dim), "cond");
        check_input(sample, sample_len, b * per, "sample");
        check_output(eps, eps_len, b * per, "eps");
        if (timestep < 0 || timestep >= e.info.num_train_timesteps)
            raise(FE_ERR_INVALID_ARGUMENT, "timestep out of range" +
                                               expected_got("0.." + std::to_string(e.info.num_train_timesteps - 1), timestep));
        std::lock_guard lock(e.mutex);
        e.diffusion->visit([&](auto& h) {
            h.denoise(std::span<const float>(cond, cond_len), std::span<const float>(sample, sample_len), timestep,
                      std::span<float>(eps, b * per), batch);
        });
    });
}

}  // extern "C"
