// Device selection with the residency contract of docs/contracts.md#device-residency: a model is uploaded to the GPU when it can be,
// otherwise it keeps working on the CPU and says so; the FLOWEDGE_CUDA_* flags tighten or skip that.
#pragma once
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "flowedge/backend.hpp"
#include "flowedge/error.hpp"

namespace flowedge {

/// Where the caller wants inference to run.
enum class Device { Cpu, Cuda };

/// Parses "cpu" / "cuda"; anything else is an error naming the value.
inline Device parse_device(std::string_view s) {
    if (s == "cpu") return Device::Cpu;
    if (s == "cuda") return Device::Cuda;
    fail("residency", "unknown device '" + std::string(s) + "' (expected cpu or cuda)");
}

/// Environment flags of the residency contract. A flag counts only when its value is exactly "1".
struct ResidencyFlags {
    bool cuda_required = false;    ///< FLOWEDGE_CUDA_REQUIRED=1: a failed upload is a load error
    bool cuda_force_host = false;  ///< FLOWEDGE_CUDA_FORCE_HOST=1: never upload, run on the CPU

    static ResidencyFlags from_env() {
        auto on = [](const char* name) {
            const char* v = std::getenv(name);
            return v != nullptr && std::strcmp(v, "1") == 0;
        };
        return {on("FLOWEDGE_CUDA_REQUIRED"), on("FLOWEDGE_CUDA_FORCE_HOST")};
    }
};

/// A model of template `Model<B>` resident on the GPU when possible, else on the CPU.
///
/// `load(want, flags, loader)` calls `loader(Cuda{})` when `want == Device::Cuda` (unless force_host) and falls
/// back to `loader(Cpu{})` when that throws (unless cuda_required, which rethrows with the reason). In a build
/// without the CUDA backend a Cuda request falls back the same way. `visit(f)` runs f on the held model.
///
/// The layout is the same with and without FLOWEDGE_WITH_CUDA (translation units built either way may share a
/// Resident): the CPU model is held by value, the GPU model behind a type-erased owner that only a CUDA build fills.
/// What depends on the macro is confined to load() and visit(), templates instantiated with each caller's lambdas.
template <template <class> class Model>
class Resident {
public:
    template <class Loader>
    static Resident load(Device want, const ResidencyFlags& flags, Loader&& loader) {
        std::string reason;
        if (want == Device::Cuda && flags.cuda_force_host) {
            reason = "FLOWEDGE_CUDA_FORCE_HOST=1 skipped the upload";
        } else if (want == Device::Cuda) {
#ifdef FLOWEDGE_WITH_CUDA
            try {
                Resident r;
                r.m_cuda = GpuModel(new Model<Cuda>(loader(Cuda{})), [](void* p) { delete static_cast<Model<Cuda>*>(p); });
                return r;
            } catch (const std::exception& e) {  // Error, or bad_alloc from a failed staging allocation
                reason = e.what();
            }
#else
            reason = "this build has no CUDA backend (configure with -DFLOWEDGE_BACKEND=cuda)";
#endif
        }
        // The upload did not happen (failed, impossible or skipped by FORCE_HOST): REQUIRED makes that a load error.
        if (want == Device::Cuda && flags.cuda_required)
            fail(ErrorKind::Device, "residency", "FLOWEDGE_CUDA_REQUIRED=1 but the model is not resident on the GPU: " + reason);
        Resident r;
        r.m_cpu.emplace(loader(Cpu{}));
        r.m_reason = std::move(reason);
        return r;
    }

    /// True when the weights and scratch live on the GPU.
    bool cuda_resident() const { return m_cuda != nullptr; }
    /// Why the model is on the CPU although CUDA was asked for (empty otherwise).
    const std::string& fallback_reason() const { return m_reason; }
    const char* backend() const { return cuda_resident() ? "cuda" : "cpu"; }

    /// Throws unless the model runs on `want` (`--device cuda` fails closed unless resident).
    void require(Device want, std::string_view component) const {
        if (want == Device::Cuda && !cuda_resident())
            fail(ErrorKind::Device, component, "--device cuda requested but the model is not resident on the GPU (" +
                                (m_reason.empty() ? std::string("not uploaded") : m_reason) + ")");
    }

    /// Calls f(Model<Cpu>&) or f(Model<Cuda>&), whichever is held; both calls must return the same type.
    template <class F>
    decltype(auto) visit(F&& f) {
#ifdef FLOWEDGE_WITH_CUDA
        if (m_cuda) return std::forward<F>(f)(*static_cast<Model<Cuda>*>(m_cuda.get()));
#endif
        check_held();
        return std::forward<F>(f)(*m_cpu);
    }
    template <class F>
    decltype(auto) visit(F&& f) const {
#ifdef FLOWEDGE_WITH_CUDA
        if (m_cuda) return std::forward<F>(f)(*static_cast<const Model<Cuda>*>(m_cuda.get()));
#endif
        check_held();
        return std::forward<F>(f)(*m_cpu);
    }

private:
    /// Owns a Model<Cuda> through a deleter set where it is created, so this type never names Model<Cuda>.
    using GpuModel = std::unique_ptr<void, void (*)(void*)>;

    Resident() = default;

    void check_held() const {
        if (!m_cpu) [[unlikely]] fail("residency", "visit() on a moved-from Resident (expected a loaded model, got none)");
    }

    std::optional<Model<Cpu>> m_cpu;         ///< set when the model runs on the CPU
    GpuModel m_cuda{nullptr, [](void*) {}};  ///< set when it runs on the GPU (CUDA builds only)
    std::string m_reason;
};

}  // namespace flowedge
