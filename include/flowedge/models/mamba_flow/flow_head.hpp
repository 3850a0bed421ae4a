// Flow-matching action head (condition + noise -> action) with Euler/Heun/RK4 solvers over any backend;
// a whole solve is one replayable Graph<B> sequence and can be advanced a few steps at a time.
#pragma once
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>
#include <algorithm>

#include "flowedge/workspace.hpp"  // before linear.hpp, which uses Context<B>
#include "flowedge/io/safetensors.hpp"
#include "flowedge/layers/linear.hpp"
#include "flowedge/models/model_execution.hpp"
#include "flowedge/ops.hpp"
#include "flowedge/parameter.hpp"

namespace flowedge {

/// ODE solver for the flow from t = 0 (noise) to t = 1 (action).
enum class Solver : std::uint8_t {
    Euler = 0,  ///< x += dt*v(x, t); 1 velocity evaluation per step
    Heun = 1,   ///< explicit trapezoid; 2 evaluations per step
    Rk4 = 2,    ///< classic Runge-Kutta 4; 4 evaluations per step
};

/// Velocity evaluations per step (1, 2, 4).
constexpr int solver_evals(Solver s) { return s == Solver::Euler ? 1 : s == Solver::Heun ? 2 : 4; }
/// Lower-case name ("euler", "heun", "rk4").
constexpr std::string_view solver_name(Solver s) { return s == Solver::Euler ? "euler" : s == Solver::Heun ? "heun" : "rk4"; }
/// Parses "euler" | "heun" | "rk4"; anything else is an Error.
inline Solver parse_solver(std::string_view s) {
    if (s == "euler") return Solver::Euler;
    if (s == "heun") return Solver::Heun;
    if (s == "rk4") return Solver::Rk4;
    fail("flow_head", "unknown solver" + expected_got("euler|heun|rk4", std::string(s)));
}

/// Flow-matching velocity MLP and ODE sampler, docs/models.md#flow-matching-head (PyTorch reference: tools/make_reference_mamba_flow.py):
///   c = cond_proj @ cond (once per solve);
///   h = silu(in_proj @ x + time_proj @ [sin(t f) | cos(t f)] + c), f_j = 10000^(-j/(Tm/2));
///   h = silu(W_l @ h) for each hidden layer; v = out_proj @ h.
/// Tensors (no biases): flow.in_proj.weight [H, A], flow.time_proj.weight [H, Tm], flow.cond_proj.weight [H, Cd],
/// flow.layers.{l}.weight [H, H] (0..8), flow.out_proj.weight [A, H].
template <Backend B>
class FlowHead {
public:
    struct Config {
        int action_dim = 0;  ///< A
        int hidden = 0;      ///< H
        int time_dim = 0;    ///< Tm (even)
        int cond_dim = 0;    ///< Cd
        int n_layers = 0;    ///< hidden H x H layers, 0..kMaxLayers
    };
    static constexpr int kMaxLayers = 8;
    static constexpr int kMaxSteps = 65535;
    static constexpr int kMaxBatch = 16383;
    /// Solves of up to this many steps reuse a table of time_proj @ temb(t) for t = j/(2N), computed once per N.
    static constexpr int kTimeCacheSteps = 64;

    FlowHead(FlowHead&&) noexcept = default;
    FlowHead& operator=(FlowHead&&) noexcept = default;

    /// Whether `file` holds a flow head (flow.in_proj.weight).
    static bool present(const io::SafeTensors& file) { return file.find("flow.in_proj.weight") != nullptr; }

    /// Reads and cross-checks the configuration from the flow.* tensor shapes.
    static Config read_config(const io::SafeTensors& file) {
        auto need = [&](const std::string& key) -> const io::TensorInfo& {
            const io::TensorInfo* t = file.find(key);
            if (!t) fail(ErrorKind::BadFile, "flow_head", file.path().string() + ": missing tensor '" + key + "'");
            if (t->shape.rank != 2) fail(ErrorKind::BadFile, "flow_head", "tensor '" + key + "' must be a matrix" + expected_got(2, t->shape.rank));
            return *t;
        };
        Config c;
        const auto& in = need("flow.in_proj.weight");
        c.hidden = int(in.shape[0]);
        c.action_dim = int(in.shape[1]);
        c.time_dim = int(need("flow.time_proj.weight").shape[1]);
        c.cond_dim = int(need("flow.cond_proj.weight").shape[1]);
        while (file.find("flow.layers." + std::to_string(c.n_layers) + ".weight")) ++c.n_layers;
        if (c.n_layers > kMaxLayers) fail(ErrorKind::Unsupported, "flow_head", "too many hidden layers" + expected_got("<= 8", c.n_layers));
        if (file.find("flow.layers." + std::to_string(c.n_layers + 1) + ".weight"))
            fail(ErrorKind::BadFile, "flow_head", "hidden layers are not numbered contiguously (missing 'flow.layers." + std::to_string(c.n_layers) + ".weight')");
        if (c.time_dim <= 0 || c.time_dim % 2 != 0)
            fail(ErrorKind::BadFile, "flow_head", "time embedding width must be even and positive" + expected_got("even", c.time_dim));
        if (c.hidden <= 0 || c.action_dim <= 0 || c.cond_dim <= 0) fail(ErrorKind::BadFile, "flow_head", "degenerate flow.* shapes");
        return c;
    }

    /// Loads flow.* from a safetensors file; `max_batch` bounds the batch of every solve (scratch sized for it).
    static FlowHead load(const std::filesystem::path& path, const LoadOptions& opts = {}, int max_batch = 1) {
        return load(io::SafeTensors::open(path), opts, max_batch);
    }
    static FlowHead load(std::shared_ptr<const io::SafeTensors> file, const LoadOptions& opts = {}, int max_batch = 1) {
        if (!present(*file)) fail(ErrorKind::BadFile, "flow_head", file->path().string() + ": no flow head (expected tensor 'flow.in_proj.weight')");
        return FlowHead(file, opts, max_batch);
    }

    const Config& config() const { return m_cfg; }
    int max_batch() const { return m_max_batch; }
    void set_stream(Stream s) { m_exec.set_stream(s); }
    Stream stream() const { return m_exec.stream(); }

    /// Arithmetic of the head's projections (in_proj, time_proj, cond_proj, hidden layers, out_proj), default
    /// MathMode::F32 = exact. BF16 is an opt-in: backends with a BF16 linear path (Ops<Cpu>::linear with vdpbf16ps;
    /// others where implemented) round each product's activation row to BF16 (RNE, u = 2^-8) and multiply in BF16
    /// (F32 weights rounded too) with float accumulation, so each projection output is within about
    /// (2u + u^2) * sum_i |w_i| |x_i| of the exact one; a backend or shape without such a path computes exactly.
    /// TF32 is accepted (the GPU's tensor-core mode where a backend has it) and is exact on the CPU. Changing it
    /// during an active solve is an Error (a solve runs in one mode; call result() or cancel() first); otherwise it
    /// drops the recorded graphs and the time_proj table (rebuilt in the new mode by the next begin(); no
    /// allocation). Results stay deterministic, and begin/advance splits stay bit-identical to one sample() in
    /// every mode. Bound on a velocity: test/mamba_flow/test_math.cpp.
    void set_math(MathMode m) {
        check_math_mode(m, "flow_head");
        if (m == m_exec.math()) return;
        if (m_active) [[unlikely]]
            fail("flow_head", "set_math() during an active solve" + expected_got("no active solve (result() or cancel() first)",
                                                                                 std::to_string(m_done) + " of " + std::to_string(m_steps) + " steps done"));
        m_exec.switch_math(m);
        for_each_linear([m](Linear<B>& l) { l.set_math(m); });  // prepared weights: in place, no allocation
        m_tcache_steps = 0;
    }
    MathMode math() const { return m_exec.math(); }

    /// Opt-in: lets a batch-1 solve at F32 math run as the backend's fused op (CUDA: one thread-block cluster for all
    /// the steps of an advance(), kernels/cuda/flow_solve.cu) instead of ~6 ops per velocity evaluation; it is built
    /// to give the per-op solve's bits (test/cuda/test_cuda_models.cpp checks that). Off by default until a GPU run
    /// has confirmed it; an Error during an active solve; drops the recorded graphs. The per-op path stays for
    /// batches, BF16 math, a solve of more steps than the time table holds and backends without the op.
    void set_fused_solve(bool on) {
        if (on == m_fused) return;
        if (m_active) [[unlikely]]
            fail("flow_head", "set_fused_solve() during an active solve" + expected_got("no active solve (result() or cancel() first)",
                                                                                        std::to_string(m_done) + " of " + std::to_string(m_steps) + " steps done"));
        m_fused = on;
        m_exec.drop_graphs();
    }
    bool fused_solve() const { return m_fused; }

    /// The head part of a fused Mamba-flow action (MambaFlowActParams: p.flow, p.cond_proj, p.noise; the op
    /// computes c = cond_proj @ the backbone's last row and x = noise itself): starts a batch-1 solve from `noise`
    /// whose steps the op runs. False, with no solve started, where the op cannot run it (math other than F32, more
    /// steps than the time table holds, see fill_fused). After the op ran, end_fused_act() ends the solve.
    bool begin_fused_act(std::span<const float> noise, Solver solver, int steps, MambaFlowActParams& p) {
        check_live("begin");
        check_solve(solver, steps, 1);
        check_input(noise, std::size_t(m_cfg.action_dim), "noise");
        if (math() != MathMode::F32 || steps > kTimeCacheSteps || m_cfg.action_dim > kMambaActMaxAction) return false;
        start(solver, steps, 1);
        const WeightRef wc = m_cond_proj.weight().ref();
        if (!fill_fused(p.flow, 0, steps) || wc.dtype != DType::F32 || !wc.data) {
            cancel();
            return false;
        }
        p.cond_proj = static_cast<const float*>(wc.data);
        if (linear_f32_vector_path(wc.data, m_cond, m_cfg.cond_dim)) p.vec_mask |= 1u << 16;
        std::copy(noise.begin(), noise.end(), p.noise);
        return true;
    }
    /// Ends a solve begun by begin_fused_act() once the op has run (and its stream was synchronized): the action into
    /// `out` [A]. False for a non-finite action: the caller re-runs the per-op path, whose result() names the step.
    bool end_fused_act(std::span<float> out) {
        check_live("result");
        if (!(out.size() == std::size_t(m_cfg.action_dim))) [[unlikely]]
            fail(ErrorKind::BadShape, "flow_head", "output has the wrong size" + expected_got(m_cfg.action_dim, out.size()));
        Memory<B>::copy_to_host(out.data(), m_x, out.size_bytes(), m_exec.stream());  // returns with the data on the host
        m_active = false;
        m_done = 0;
        return std::all_of(out.begin(), out.end(), [](float v) { return std::isfinite(v); });
    }

    /// Bytes of the projections' prepared weights (the backend's small-row copies made at load; 0 when none).
    std::size_t prepared_bytes() const {
        std::size_t n = m_in_proj.prepared_bytes() + m_time_proj.prepared_bytes() + m_cond_proj.prepared_bytes() + m_out_proj.prepared_bytes();
        for (const Linear<B>& l : m_layers) n += l.prepared_bytes();
        return n;
    }

    /// Scratch bytes for solves of up to `max_batch` rows (allocated once at load).
    std::size_t workspace_bytes(int max_batch) const {
        const std::size_t b = std::size_t(max_batch);
        const std::size_t A = std::size_t(m_cfg.action_dim), H = std::size_t(m_cfg.hidden);
        return Workspace<B>::template bytes_for<float>(b * m_cfg.cond_dim) +        // cond
               7 * Workspace<B>::template bytes_for<float>(b * A) +                 // noise, x, xt, k1..k4
               3 * Workspace<B>::template bytes_for<float>(b * H) +                 // c, h0, h1
               Workspace<B>::template bytes_for<float>(H) +                         // time + condition row (batch 1)
               Workspace<B>::template bytes_for<float>(b * m_cfg.time_dim) +        // time features
               Workspace<B>::template bytes_for<float>(std::size_t(2 * kTimeCacheSteps + 1) * H);  // time table
    }

    /// Whole solve: out = x(1) from x(0) = noise under condition cond.
    /// cond: [batch, Cd], noise: [batch, A], out: [batch, A] (host). NFE = steps * solver_evals(solver).
    void sample(std::span<const float> cond, std::span<const float> noise, std::span<float> out, Solver solver, int steps,
                int batch = 1) {
        begin(cond, noise, solver, steps, batch);
        advance(steps);
        result(out);
    }

    /// Starts a resumable solve (see advance/result/cancel); the inputs are copied, so the spans may go away.
    void begin(std::span<const float> cond, std::span<const float> noise, Solver solver, int steps, int batch = 1) {
        check_live("begin");
        check_solve(solver, steps, batch);
        check_input(cond, std::size_t(batch) * m_cfg.cond_dim, "condition");
        check_input(noise, std::size_t(batch) * m_cfg.action_dim, "noise");
        Memory<B>::copy_from_host(m_cond, cond.data(), cond.size_bytes(), m_exec.stream());
        Memory<B>::copy_from_host(m_noise, noise.data(), noise.size_bytes(), m_exec.stream());
        start(solver, steps, batch);
    }

    /// begin() with the condition already in backend memory (e.g. the backbone's last hidden row);
    /// cond_device: [batch, Cd] with row stride cond_stride (-1 = Cd; 0 = every row uses the same condition).
    /// The condition is not checked for finiteness (it never left the backend).
    void begin_device(const float* cond_device, std::span<const float> noise, Solver solver, int steps, int batch = 1,
                      int cond_stride = -1) {
        check_live("begin_device");
        check_solve(solver, steps, batch);
        check_input(noise, std::size_t(batch) * m_cfg.action_dim, "noise");
        const std::size_t row = std::size_t(m_cfg.cond_dim) * sizeof(float);
        const std::size_t ld = cond_stride < 0 ? std::size_t(m_cfg.cond_dim) : std::size_t(cond_stride);
        for (int b = 0; b < batch; ++b)
            Memory<B>::copy(m_cond + std::size_t(b) * m_cfg.cond_dim, cond_device + std::size_t(b) * ld, row, m_exec.stream());
        Memory<B>::copy_from_host(m_noise, noise.data(), noise.size_bytes(), m_exec.stream());
        start(solver, steps, batch);
    }

    /// Runs up to `n_steps` more whole steps of the active solve; returns true when all steps are done.
    /// Any split into advance() calls gives bit-identical results to one sample() call.
    bool advance(int n_steps) {
        check_live("advance");
        if (!m_active) fail("flow_head", "advance() without an active solve (call begin() first)");
        if (!(n_steps >= 1)) [[unlikely]]
            fail("flow_head", "advance needs at least one step" + expected_got(">= 1", n_steps));
        const int first = m_done;
        const int count = std::min(n_steps, m_steps - m_done);
        if (count > 0) {
            const bool whole = first == 0 && count == m_steps;
            const std::uint64_t key = std::uint64_t(m_solver) | std::uint64_t(m_batch) << 2 | std::uint64_t(m_steps) << 16 |
                                      std::uint64_t(first) << 32 | std::uint64_t(count) << 48;
            m_exec.run(whole ? kFullSolveGraph : kPartSolveGraph, key, [this, first, count] { enqueue(first, count); });
            m_done += count;
        }
        return m_done == m_steps;
    }

    /// Copies the finished action to `out` [batch, A] (host) and ends the solve. A non-finite action is an
    /// Error naming the first step whose state went non-finite.
    void result(std::span<float> out) {
        check_live("result");
        if (!m_active) fail("flow_head", "result() without an active solve");
        if (m_done != m_steps)
            fail("flow_head", "result() before the solve finished" + expected_got(std::to_string(m_steps) + " steps",
                                                                                 std::to_string(m_done) + " steps"));
        const std::size_t n = std::size_t(m_batch) * m_cfg.action_dim;
        if (!(out.size() == n)) [[unlikely]]
            fail(ErrorKind::BadShape, "flow_head", "output has the wrong size" + expected_got(n, out.size()));
        Memory<B>::copy_to_host(out.data(), m_x, n * sizeof(float), m_exec.stream());
        Memory<B>::synchronize(m_exec.stream());
        m_active = false;
        for (std::size_t i = 0; i < n; ++i)
            if (!std::isfinite(out[i])) [[unlikely]] diagnose_non_finite(out);
    }

    /// Abandons the active solve (no-op when none); the next solve starts with begin().
    void cancel() { m_active = false; m_done = 0; }

    bool active() const { return m_active; }
    int steps_done() const { return m_done; }
    int steps_total() const { return m_steps; }

    /// One velocity evaluation v(x, t) (for tests and diagnostics): cond [batch, Cd], x [batch, A], v [batch, A].
    /// Ends any active solve.
    void velocity(std::span<const float> cond, std::span<const float> x, float t, std::span<float> v, int batch = 1) {
        check_live("velocity");
        check_solve(Solver::Euler, 1, batch);
        check_input(cond, std::size_t(batch) * m_cfg.cond_dim, "condition");
        check_input(x, std::size_t(batch) * m_cfg.action_dim, "x");
        if (!(v.size() == x.size())) [[unlikely]]
            fail(ErrorKind::BadShape, "flow_head", "velocity output has the wrong size" + expected_got(x.size(), v.size()));
        m_active = false;
        m_batch = batch;
        Memory<B>::copy_from_host(m_cond, cond.data(), cond.size_bytes(), m_exec.stream());
        Memory<B>::copy_from_host(m_x, x.data(), x.size_bytes(), m_exec.stream());
        Context<B> ctx = m_exec.context_without_scratch();
        m_cond_proj.forward(ctx, m_cond, m_c, batch);
        eval(ctx, m_x, t, nullptr, m_k[0]);
        Memory<B>::copy_to_host(v.data(), m_k[0], v.size_bytes(), m_exec.stream());
        Memory<B>::synchronize(m_exec.stream());
    }

    /// Lists flow.* parameters relative to the "flow." prefix.
    template <class F>
    void visit_parameters(F&& f) {
        auto sub = [&f](std::string prefix) {
            return [&f, prefix](const std::string& n, Parameter<B>& p, const Shape& s, Storage st) { f(prefix + n, p, s, st); };
        };
        m_in_proj.visit_parameters(sub("in_proj."));
        m_time_proj.visit_parameters(sub("time_proj."));
        m_cond_proj.visit_parameters(sub("cond_proj."));
        for (int l = 0; l < m_cfg.n_layers; ++l) m_layers[std::size_t(l)].visit_parameters(sub("layers." + std::to_string(l) + "."));
        m_out_proj.visit_parameters(sub("out_proj."));
    }

private:
    FlowHead(const std::shared_ptr<const io::SafeTensors>& file, const LoadOptions& opts, int max_batch)
        : m_cfg(read_config(*file)), m_max_batch(max_batch) {
        if (max_batch < 1 || max_batch > kMaxBatch)
            fail("flow_head", "max_batch out of range" + expected_got("1.." + std::to_string(kMaxBatch), max_batch));
        const int A = m_cfg.action_dim, H = m_cfg.hidden;
        m_in_proj = Linear<B>({.in = A, .out = H, .bias = false, .small_rows = true});
        m_time_proj = Linear<B>({.in = m_cfg.time_dim, .out = H, .bias = false, .small_rows = true});
        m_cond_proj = Linear<B>({.in = m_cfg.cond_dim, .out = H, .bias = false, .small_rows = true});
        m_out_proj = Linear<B>({.in = H, .out = A, .bias = false, .small_rows = true});
        for (int l = 0; l < m_cfg.n_layers; ++l) m_layers.push_back(Linear<B>({.in = H, .out = H, .bias = false, .small_rows = true}));
        // Every projection multiplies batch rows (1 in the reference use): small-row weights.
        bind_parameters<B>(*this, file, "flow.", opts, "flow_head");

        m_exec = Execution("flow_head", workspace_bytes(max_batch));
        Workspace<B>& ws = m_exec.workspace();  // carved once into the persistent buffers below
        const int mb = max_batch;
        m_cond = ws.template take<float>(Shape{mb, m_cfg.cond_dim}).data;
        m_noise = ws.template take<float>(Shape{mb, A}).data;
        m_x = ws.template take<float>(Shape{mb, A}).data;
        m_xt = ws.template take<float>(Shape{mb, A}).data;
        for (auto& k : m_k) k = ws.template take<float>(Shape{mb, A}).data;
        m_c = ws.template take<float>(Shape{mb, H}).data;
        m_h[0] = ws.template take<float>(Shape{mb, H}).data;
        m_h[1] = ws.template take<float>(Shape{mb, H}).data;
        m_tc = ws.template take<float>(Shape{H}).data;
        m_temb = ws.template take<float>(Shape{mb, m_cfg.time_dim}).data;
        m_tcache = ws.template take<float>(Shape{2 * kTimeCacheSteps + 1, H}).data;
    }

    template <class F>
    void for_each_linear(F&& f) {
        for (Linear<B>* l : {&m_in_proj, &m_time_proj, &m_cond_proj, &m_out_proj}) f(*l);
        for (Linear<B>& l : m_layers) f(l);
    }

    /// A moved-from head still holds raw pointers into the workspace it gave away: refuse to use them.
    void check_live(const char* what) const { m_exec.check_live(what, "FlowHead"); }

    void check_solve(Solver solver, int steps, int batch) const {
        if (!(std::uint8_t(solver) <= 2)) [[unlikely]]
            fail("flow_head", "unknown solver" + expected_got("0..2", int(solver)));
        if (steps < 1 || steps > kMaxSteps)
            fail("flow_head", "steps out of range" + expected_got("1.." + std::to_string(kMaxSteps), steps));
        if (batch < 1 || batch > m_max_batch)
            fail("flow_head", "batch out of range" + expected_got("1.." + std::to_string(m_max_batch) + " (max_batch at load)", batch));
    }

    static void check_input(std::span<const float> v, std::size_t n, const char* what) {
        if (v.size() != n) fail(ErrorKind::BadShape, "flow_head", std::string(what) + " has the wrong size" + expected_got(n, v.size()));
        for (std::size_t i = 0; i < n; ++i)
            if (!std::isfinite(v[i])) [[unlikely]]
                fail(ErrorKind::NonFinite, "flow_head", std::string(what) + " is not finite at index " + std::to_string(i) +
                                      expected_got("a finite value", std::to_string(v[i])));
    }

    void start(Solver solver, int steps, int batch) {
        prepare_time_cache(steps);
        m_solver = solver;
        m_steps = steps;
        m_batch = batch;
        m_done = 0;
        m_active = true;
    }

    /// Time of half-step j: t = j/(2N), computed in double and rounded once (as the Python reference does);
    /// equals float(k/N) for j = 2k.
    float time_of(int j) const { return float(double(j) / (2.0 * double(m_steps))); }

    /// Fills the table time_proj @ [sin(t f) | cos(t f)] for t = j/(2N), j = 0..2N (once per N; weights never change).
    void prepare_time_cache(int steps) {
        if (steps > kTimeCacheSteps || m_tcache_steps == steps) return;
        Context<B> ctx = m_exec.context_without_scratch();
        for (int j = 0; j <= 2 * steps; ++j) {
            time_features(ctx, float(double(j) / (2.0 * double(steps))), 1);
            m_time_proj.forward(ctx, m_temb, m_tcache + std::size_t(j) * m_cfg.hidden, 1);
        }
        m_tcache_steps = steps;
    }

    void time_features(Context<B>& ctx, float t, int rows) const {
        SinusoidParams sp;
        sp.t = t;
        sp.out = m_temb;
        sp.rows = rows;
        sp.half = m_cfg.time_dim / 2;
        sp.denom = float(m_cfg.time_dim / 2);
        Ops<B>::sinusoid(sp, ctx.stream);
    }

    /// Velocity at half-step j of the active solve (table lookup when the table covers it).
    void eval_at(Context<B>& ctx, const float* x, int j, float* v) const {
        const bool cached = m_tcache_steps == m_steps;
        eval(ctx, x, time_of(j), cached ? m_tcache + std::size_t(j) * m_cfg.hidden : nullptr, v);
    }

    /// v = velocity(x, t) for m_batch rows, using c already in m_c; `tproj` is time_proj @ temb(t) ([H], backend
    /// memory) when precomputed, else null.
    void eval(Context<B>& ctx, const float* x, float t, const float* tproj, float* v) const {
        const int n = m_batch, H = m_cfg.hidden;
        if (n == 1 && tproj) {
            // One row: time and condition terms summed first and applied as in_proj's bias, SiLU in its epilogue
            // (one pass over h instead of two adds and an activation after the product).
            axpby(ctx, tproj, m_c, m_tc, H, 1.f, 1.f);
            LinearParams p = m_in_proj.params(x, m_h[0], 1, Activation::Silu);
            p.bias = m_tc;
            p.math = ctx.math;
            Ops<B>::linear(p, ctx.stream);
            hidden_layers_and_out(ctx, v);
            return;
        }
        m_in_proj.forward(ctx, x, m_h[0], n);
        if (tproj) {
            for (int b = 0; b < n; ++b) axpby(ctx, m_h[0] + std::size_t(b) * H, tproj, m_h[0] + std::size_t(b) * H, H, 1.f, 1.f);
        } else {
            time_features(ctx, t, n);
            m_time_proj.forward(ctx, m_temb, m_h[0], n, Activation::None, /*accumulate=*/true);
        }
        axpby(ctx, m_h[0], m_c, m_h[0], std::int64_t(n) * H, 1.f, 1.f);
        ActivationParams ap;
        ap.x = m_h[0];
        ap.y = m_h[0];
        ap.n = std::int64_t(n) * H;
        ap.act = Activation::Silu;
        Ops<B>::activation(ap, ctx.stream);
        hidden_layers_and_out(ctx, v);
    }

    /// v = out_proj @ silu(W_L ... silu(W_1 @ h0)) for m_batch rows, h0 in m_h[0].
    void hidden_layers_and_out(Context<B>& ctx, float* v) const {
        const int n = m_batch;
        int cur = 0;
        for (const auto& layer : m_layers) {
            layer.forward(ctx, m_h[cur], m_h[cur ^ 1], n, Activation::Silu);
            cur ^= 1;
        }
        m_out_proj.forward(ctx, m_h[cur], v, n);
    }

    static void axpby(Context<B>& ctx, const float* x, const float* y, float* out, std::int64_t n, float a, float b) {
        AxpbyParams p;
        p.x = x;
        p.y = y;
        p.out = out;
        p.n = n;
        p.a = a;
        p.b = b;
        Ops<B>::axpby(p, ctx.stream);
    }

    /// Enqueues steps [first, first + count); step 0 is preceded by x = noise and c = cond_proj @ cond.
    void enqueue(int first, int count) const {
        Context<B> ctx = m_exec.context_without_scratch();
        const std::int64_t n = std::int64_t(m_batch) * m_cfg.action_dim;
        if (first == 0) {
            Memory<B>::copy(m_x, m_noise, std::size_t(n) * sizeof(float), m_exec.stream());
            m_cond_proj.forward(ctx, m_cond, m_c, m_batch);
        }
        if (enqueue_fused(ctx, first, count)) return;
        for (int k = first; k < first + count; ++k) step(ctx, k, n);
    }

    /// Steps [first, first + count) as the backend's fused op (Ops<B>::flow_solve) where it has one and it applies:
    /// opted in, batch 1, F32 math and weights, the time table built for this N. Returns false (nothing enqueued) otherwise.
    bool enqueue_fused(Context<B>& ctx, int first, int count) const {
        if constexpr (requires(const FlowSolveParams& q) { Ops<B>::flow_solve(q, ctx.stream); }) {
            FlowSolveParams p;
            if (!m_fused || ctx.math != MathMode::F32 || !fill_fused(p, first, count)) return false;
            p.c = m_c;
            return Ops<B>::flow_solve(p, ctx.stream);
        } else {
            (void)ctx, (void)first, (void)count;
            return false;
        }
    }

    /// The fused solve's parameters for steps [first, first + count) of the active solve (p.c left to the caller).
    /// False where the fused op cannot reproduce the per-op solve: batch > 1, the time table not built for this N,
    /// weights not stored as F32, too many layers, or a product whose linear op would take different summation paths
    /// on different calls.
    bool fill_fused(FlowSolveParams& p, int first, int count) const {
        if (m_batch != 1 || m_tcache_steps != m_steps || m_cfg.n_layers > kFlowSolveMaxLayers) return false;
        // Each product's order is the single linear op's, which depends on its pointers (linear_f32_vector_path):
        // the fused op applies only where every call of a product would take the same path.
        bool consistent = true;
        auto weight_of = [&](const Linear<B>& l, int bit, int in, std::initializer_list<const float*> xs) -> const float* {
            const WeightRef w = l.weight().ref();
            if (w.dtype != DType::F32 || !w.data) consistent = false;
            bool vec0 = false;
            for (std::size_t i = 0; const float* x : xs) {
                const bool vec = linear_f32_vector_path(w.data, x, in);
                if (i++ == 0) vec0 = vec;
                else if (vec != vec0) consistent = false;
            }
            if (vec0) p.vec_mask |= 1u << bit;
            return static_cast<const float*>(w.data);
        };
        const int L = m_cfg.n_layers, H = m_cfg.hidden;
        p.in_proj = weight_of(m_in_proj, 0, m_cfg.action_dim, {m_x, m_xt});
        for (int l = 0; l < L; ++l) p.layers[l] = weight_of(m_layers[std::size_t(l)], 1 + l, H, {m_h[l % 2]});
        p.out_proj = weight_of(m_out_proj, 1 + L, H, {m_h[L % 2]});
        if (!consistent) return false;
        p.x = m_x;
        p.tproj = m_tcache;
        p.action_dim = m_cfg.action_dim;
        p.hidden = H;
        p.n_layers = L;
        p.solver = int(m_solver);
        p.steps = m_steps;
        p.first = first;
        p.count = count;
        p.dt = float(1.0 / double(m_steps));
        p.half_dt = float(0.5 / double(m_steps));
        p.sixth_dt = float(1.0 / (6.0 * double(m_steps)));
        return true;
    }

    /// One solver step k (x(t_k) -> x(t_{k+1})) on m_x.
    void step(Context<B>& ctx, int k, std::int64_t n) const {
        const float dt = float(1.0 / double(m_steps));
        switch (m_solver) {
            case Solver::Euler:
                eval_at(ctx, m_x, 2 * k, m_k[0]);
                axpby(ctx, m_x, m_k[0], m_x, n, 1.f, dt);  // x + dt*k1
                break;
            case Solver::Heun: {
                eval_at(ctx, m_x, 2 * k, m_k[0]);
                axpby(ctx, m_x, m_k[0], m_xt, n, 1.f, dt);
                eval_at(ctx, m_xt, 2 * k + 2, m_k[1]);
                axpby(ctx, m_k[0], m_k[1], m_k[0], n, 1.f, 1.f);          // k1 + k2
                axpby(ctx, m_x, m_k[0], m_x, n, 1.f, float(0.5 / double(m_steps)));  // x + dt/2*(k1+k2)
                break;
            }
            case Solver::Rk4: {
                const float half = float(0.5 / double(m_steps));
                eval_at(ctx, m_x, 2 * k, m_k[0]);
                axpby(ctx, m_x, m_k[0], m_xt, n, 1.f, half);
                eval_at(ctx, m_xt, 2 * k + 1, m_k[1]);
                axpby(ctx, m_x, m_k[1], m_xt, n, 1.f, half);
                eval_at(ctx, m_xt, 2 * k + 1, m_k[2]);
                axpby(ctx, m_x, m_k[2], m_xt, n, 1.f, dt);
                eval_at(ctx, m_xt, 2 * k + 2, m_k[3]);
                axpby(ctx, m_k[0], m_k[1], m_k[0], n, 1.f, 2.f);  // k1 + 2 k2
                axpby(ctx, m_k[0], m_k[2], m_k[0], n, 1.f, 2.f);  // + 2 k3
                axpby(ctx, m_k[0], m_k[3], m_k[0], n, 1.f, 1.f);  // + k4
                axpby(ctx, m_x, m_k[0], m_x, n, 1.f, float(1.0 / (6.0 * double(m_steps))));
                break;
            }
        }
    }

    /// Replays the solve step by step (outside any graph) to name the first step whose state is non-finite.
    [[noreturn]] void diagnose_non_finite(std::span<float> host) {
        Context<B> ctx = m_exec.context_without_scratch();
        const std::int64_t n = std::int64_t(m_batch) * m_cfg.action_dim;
        Memory<B>::copy(m_x, m_noise, std::size_t(n) * sizeof(float), m_exec.stream());
        m_cond_proj.forward(ctx, m_cond, m_c, m_batch);
        for (int k = 0; k < m_steps; ++k) {
            step(ctx, k, n);
            Memory<B>::copy_to_host(host.data(), m_x, std::size_t(n) * sizeof(float), m_exec.stream());
            Memory<B>::synchronize(m_exec.stream());
            for (std::int64_t i = 0; i < n; ++i)
                if (!std::isfinite(host[std::size_t(i)]))
                    fail(ErrorKind::NonFinite, "flow_head", "non-finite action at step " + std::to_string(k + 1) + " of " + std::to_string(m_steps) +
                                          " (solver " + std::string(solver_name(m_solver)) + ", batch row " +
                                          std::to_string(i / m_cfg.action_dim) + ", dim " + std::to_string(i % m_cfg.action_dim) + ")");
        }
        fail(ErrorKind::NonFinite, "flow_head", "non-finite action (not reproduced on replay; steps " + std::to_string(m_steps) + ")");
    }

    /// The graphs this head replays: whole solves, and the pieces of begin/advance splits.
    enum GraphKind : std::size_t { kFullSolveGraph, kPartSolveGraph, kGraphKinds };
    using Execution = ModelExecution<B, kGraphKinds>;

    Config m_cfg{};
    int m_max_batch = 1;
    Linear<B> m_in_proj, m_time_proj, m_cond_proj, m_out_proj;
    std::vector<Linear<B>> m_layers;
    Execution m_exec;
    float* m_cond = nullptr;
    float* m_noise = nullptr;
    float* m_x = nullptr;
    float* m_xt = nullptr;
    float* m_k[4] = {nullptr, nullptr, nullptr, nullptr};
    float* m_c = nullptr;
    float* m_h[2] = {nullptr, nullptr};
    float* m_tc = nullptr;  ///< time_proj row + c, in_proj's bias at batch 1
    float* m_temb = nullptr;
    float* m_tcache = nullptr;
    int m_tcache_steps = 0;  ///< N the time table holds (0 = none)
    Solver m_solver = Solver::Euler;
    int m_steps = 0, m_batch = 1, m_done = 0;
    bool m_active = false;
    bool m_fused = false;  ///< set_fused_solve
};

}  // namespace flowedge
