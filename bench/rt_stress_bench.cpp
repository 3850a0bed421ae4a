// rt_stress_bench: the tail of DiffusionPolicy<B>::select_action over many ticks, with the real-time options off or
// on, for bench/run_rt_stress.sh to run on a quiet host and under stress-ng. Prints and writes (JSON) p50 / p99 /
// p99.9 / p99.99 / max, max/p50 and p99.99/p50, a log-binned histogram, and the page faults and context switches of
// the timed ticks (getrusage); --samples writes every tick's latency for plotting. Observations are synthetic (a
// moving pattern per camera, a drifting state): latency does not depend on their values.
// Slow ticks are attributed: per tick the loop thread's own CPU time and involuntary switches (RUSAGE_THREAD: the
// process-wide counters also count the driver's and OpenMP's threads), and the hypervisor's steal time on the loop's
// CPUs over the run (/proc/stat), so a tail is told apart as preemption on the CPU, a stolen vCPU, or waiting on the
// device.
//
// Usage: rt_stress_bench FOLDER [--rebuild-from SRC] [--device cpu|cuda] [--threads N] [--ticks N | --seconds S]
//          [--warmup N] [--period-ms P] [--lock-memory] [--prefault] [--cpus LIST] [--isolate-cpus] [--rt-priority P]
//          [--high-priority-stream] [--pinned-staging] [--occupants] [--isolate-system] [--label NAME] [--json FILE]
//          [--samples FILE] [--blocking-sync]
//   --blocking-sync: CUDA only: GPU waits sleep instead of spinning (cuda::set_blocking_sync before loading), to tell
//   whether a spinning loop thread's time slices are the tail under CPU load.
//   --occupants: sample which other tasks run on the --cpus over the run (their CPU time there, by name);
//   --isolate-system: move every other process's threads off the --cpus for the run (restored after). Diagnostics
//   for a tail made of preemptions (bench/cpu_occupancy.hpp); the per-state time of the loop CPUs is always reported.
//   --ticks: timed ticks (default 2000); --seconds: as many ticks as fit (ends at the first of the two when both are
//   given). --period-ms: sleep until the next period boundary between ticks (0, the default: back to back).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../test/support/lerobot_fixture_folder.hpp"
#include "cpu_occupancy.hpp"
#include "flowedge/models/diffusion/policy.hpp"
#include "flowedge/realtime.hpp"
#ifdef FLOWEDGE_WITH_CUDA
#include "flowedge/cuda/device.hpp"
#endif

using namespace flowedge;

namespace {

struct Args {
    std::string folder, rebuild, device = "cpu", label, json_path, samples_path, cpus;
    int threads = 0, warmup = 0, rt_priority = 0;
    long ticks = -1;
    double seconds = 0, period_ms = 0;
    bool lock_memory = false, prefault = false, isolate_cpus = false, high_priority_stream = false, pinned_staging = false;
    bool occupants = false, isolate_system = false;  // diagnostics (cpu_occupancy.hpp); need --cpus
    bool blocking_sync = false;                      // CUDA: sleeping GPU waits (an experiment, not an option yet)
};

/// Nearest-rank percentile of sorted `v`.
double percentile(const std::vector<double>& v, double q) {
    if (v.empty()) return 0;
    const std::size_t rank = std::size_t(std::ceil(q / 100.0 * double(v.size())));
    return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

/// The tail of one population of ticks (ms).
struct Tail {
    std::size_t n = 0;
    double p50 = 0, p99 = 0, p999 = 0, p9999 = 0, max = 0;
};
/// Sorts `v` and reads its tail.
Tail tail_of(std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return {v.size(), percentile(v, 50), percentile(v, 99), percentile(v, 99.9), percentile(v, 99.99), v.empty() ? 0.0 : v.back()};
}
nlohmann::json to_json(const Tail& t) {
    return {{"n", t.n}, {"p50_ms", t.p50}, {"p99_ms", t.p99}, {"p99_9_ms", t.p999}, {"p99_99_ms", t.p9999}, {"max_ms", t.max}};
}
void print(const char* what, const Tail& t) {
    std::printf("  %-14s n %7zu  p50 %.3f  p99 %.3f  p99.9 %.3f  p99.99 %.3f  max %.3f ms\n", what, t.n, t.p50, t.p99, t.p999,
                t.p9999, t.max);
}

/// Counts of `sorted` in `bins` log-spaced bins from its minimum to its maximum (edges in ms).
/// The calling thread's CPU time (ms) and involuntary context switches.
struct ThreadUsage {
    double cpu_ms = 0;
    long involuntary = 0;
};
ThreadUsage thread_usage() {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    rusage u{};
    ::getrusage(RUSAGE_THREAD, &u);
    return {1e3 * double(ts.tv_sec) + 1e-6 * double(ts.tv_nsec), u.ru_nivcsw};
}

nlohmann::json histogram(const std::vector<double>& sorted, int bins) {
    if (sorted.empty()) return nlohmann::json::object();
    const double lo = std::max(sorted.front(), 1e-6), hi = std::max(sorted.back(), lo * 1.0001);
    std::vector<double> edges(std::size_t(bins) + 1);
    for (int i = 0; i <= bins; ++i) edges[std::size_t(i)] = lo * std::pow(hi / lo, double(i) / bins);
    std::vector<long> counts(std::size_t(bins), 0);
    for (const double v : sorted) {
        const auto it = std::upper_bound(edges.begin(), edges.end(), v);
        const std::size_t b = std::size_t(std::clamp<std::ptrdiff_t>(it - edges.begin() - 1, 0, bins - 1));
        ++counts[b];
    }
    return {{"edges_ms", edges}, {"counts", counts}};
}

template <Backend B>
int run(const Args& a, const std::string& device_name) {
    auto p = DiffusionPolicy<B>::load(a.folder);
    RealtimeOptions o;
    o.lock_memory = a.lock_memory;
    o.prefault = a.prefault;
    o.cpus = a.cpus.empty() ? std::vector<int>{} : realtime::parse_cpu_list(a.cpus);
    o.isolate_cpus = a.isolate_cpus;
    o.rt_priority = a.rt_priority;
    o.high_priority_stream = a.high_priority_stream;
    o.pinned_staging = a.pinned_staging;
    const RealtimeReport rep = p.set_realtime(o);
    if ((a.occupants || a.isolate_system) && o.cpus.empty())
        throw Error("flowedge: rt_stress_bench: --occupants and --isolate-system need --cpus (the loop's CPUs to watch or clear)");

    std::vector<std::vector<std::uint8_t>> frames;
    for (const auto& cam : p.cameras()) frames.emplace_back(std::size_t(cam.height) * cam.width * 3);
    std::vector<PolicyFrame> pf(p.cameras().size());
    std::vector<float> state(std::size_t(p.state_dim())), env(std::size_t(p.env_dim())), action(std::size_t(p.action_dim()));
    const auto make_observation = [&](long t) {
        for (std::size_t k = 0; k < frames.size(); ++k) {
            const auto& cam = p.cameras()[k];
            for (std::size_t i = 0; i < frames[k].size(); ++i) frames[k][i] = std::uint8_t((i * 7 + std::size_t(t) * 13 + k * 31) & 0xff);
            pf[k] = {frames[k].data(), ImageLayout::U8Hwc, cam.height, cam.width};
        }
        for (std::size_t i = 0; i < state.size(); ++i) state[i] = 100.f + float(t % 50) + float(i);
        for (std::size_t i = 0; i < env.size(); ++i) env[i] = 0.1f * float(t % 7) + float(i);
        return PolicyObservation{state, env, pf};
    };
    const int n_action = p.config().n_action_steps;
    const int warm = std::max(a.warmup, 4 * n_action);
    p.reset(1);
    for (long t = 0; t < warm; ++t) p.select_action(make_observation(t), action);

    // Timed ticks: the latency vector is reserved up front so the loop itself never allocates.
    const long max_ticks = a.ticks > 0 ? a.ticks : (a.seconds > 0 ? long(a.seconds * 20000) + 1000 : 2000);
    std::vector<double> ms;
    ms.reserve(std::size_t(max_ticks));
    std::vector<char> chunk_tick;
    chunk_tick.reserve(std::size_t(max_ticks));
    std::vector<double> cpu_ms;  // the loop thread's CPU time in each tick
    cpu_ms.reserve(std::size_t(max_ticks));
    std::vector<int> preempted;  // the loop thread's involuntary switches in each tick
    preempted.reserve(std::size_t(max_ticks));
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto deadline = a.seconds > 0 ? start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(a.seconds))
                                        : clock::time_point::max();
    const auto period = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double, std::milli>(a.period_ms));
    auto next_tick = start;
    // Diagnostics: other processes moved off the loop CPUs, then a sampler of who still runs there. The sampler
    // thread's own page faults count in the process-wide counters, so it runs only when asked for.
    std::optional<benchsupport::SystemIsolation> isolation;
    if (a.isolate_system) isolation.emplace(o.cpus);
    const int system_moved = isolation ? isolation->moved() : 0, system_failed = isolation ? isolation->failed() : 0;
    std::optional<benchsupport::OccupantSampler> sampler;
    if (a.occupants) sampler.emplace(o.cpus, int(::syscall(SYS_gettid)));
    const realtime::Counters c0 = realtime::counters();
    const benchsupport::CpuTimes times0 = benchsupport::cpu_times(o.cpus);
    realtime::Counters in_ticks{};
    for (long t = 0; t < max_ticks && clock::now() < deadline; ++t) {
        const PolicyObservation obs = make_observation(warm + t);
        const int before = p.chunks_generated();
        const realtime::Counters r0 = realtime::counters();
        const ThreadUsage u0 = thread_usage();
        const auto t0 = clock::now();
        p.select_action(obs, action);
        const auto t1 = clock::now();
        const ThreadUsage u1 = thread_usage();
        const realtime::Counters d = realtime::counters() - r0;
        cpu_ms.push_back(u1.cpu_ms - u0.cpu_ms);
        preempted.push_back(int(u1.involuntary - u0.involuntary));
        in_ticks = {in_ticks.minor_faults + d.minor_faults, in_ticks.major_faults + d.major_faults,
                    in_ticks.voluntary_switches + d.voluntary_switches, in_ticks.involuntary_switches + d.involuntary_switches};
        ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        chunk_tick.push_back(p.chunks_generated() != before);
        if (a.period_ms > 0) {
            next_tick += period;
            std::this_thread::sleep_until(next_tick);
        }
    }
    const double wall_s = std::chrono::duration<double>(clock::now() - start).count();
    const realtime::Counters whole = realtime::counters() - c0;
    const benchsupport::CpuTimes loop_cpu = benchsupport::cpu_times(o.cpus) - times0;
    const double steal_run_ms = loop_cpu.valid ? loop_cpu.steal : -1;
    if (sampler) sampler->stop();
    if (isolation) isolation->restore();
    const auto occupants = sampler ? sampler->top(12) : std::vector<std::pair<std::string, double>>{};

    if (!a.samples_path.empty()) {
        std::ofstream f(a.samples_path);
        f << "# latency_ms chunk_tick loop_thread_cpu_ms loop_thread_involuntary_switches\n";
        for (std::size_t i = 0; i < ms.size(); ++i)
            f << ms[i] << ' ' << int(chunk_tick[i]) << ' ' << cpu_ms[i] << ' ' << preempted[i] << '\n';
    }
    std::vector<double> sorted = ms;
    const Tail all = tail_of(sorted);
    // Chunk ticks (encode + the whole sampler) and the others (encode only) are two populations: each one's own tail.
    std::vector<double> chunk_ms, other_ms;
    for (std::size_t i = 0; i < ms.size(); ++i) (chunk_tick[i] ? chunk_ms : other_ms).push_back(ms[i]);
    const Tail chunk_tail = tail_of(chunk_ms), other_tail = tail_of(other_ms);
    // A slow tick: more than 1 ms over its population's p50. Preempted: the loop thread was switched out
    // involuntarily in it; "off CPU" = wall time minus the loop thread's CPU time.
    long slow = 0, slow_preempted = 0, loop_involuntary = 0;
    double slow_off_cpu_ms = 0;
    for (std::size_t i = 0; i < ms.size(); ++i) {
        loop_involuntary += preempted[i];
        if (ms[i] <= (chunk_tick[i] ? chunk_tail.p50 : other_tail.p50) + 1.0) continue;
        ++slow;
        slow_preempted += preempted[i] > 0;
        slow_off_cpu_ms += ms[i] - cpu_ms[i];
    }
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
#else
    const int threads = 1;
#endif
    std::printf("%s on %s, %d thread(s), %zu ticks in %.1f s%s\n", a.label.empty() ? "rt_stress" : a.label.c_str(), device_name.c_str(),
                threads, ms.size(), wall_s, ms.size() < 10000 ? " (fewer than 10k ticks: p99.99 is the max of a handful)" : "");
    const double max_over_p50 = all.p50 > 0 ? all.max / all.p50 : 0, p9999_over_p50 = all.p50 > 0 ? all.p9999 / all.p50 : 0;
    print("all ticks", all);
    print("chunk ticks", chunk_tail);
    print("other ticks", other_tail);
    std::printf("  max/p50 %.2f  p99.99/p50 %.2f\n", max_over_p50, p9999_over_p50);
    std::printf("  in the ticks: minor faults %ld, major %ld, voluntary switches %ld, involuntary %ld\n", in_ticks.minor_faults,
                in_ticks.major_faults, in_ticks.voluntary_switches, in_ticks.involuntary_switches);
    std::printf("  loop thread: involuntary switches %ld; slow ticks (> p50 + 1 ms) %ld, %ld of them preempted, mean off-CPU "
                "%.3f ms; steal on the loop CPUs %.1f ms\n", loop_involuntary, slow, slow_preempted,
                slow ? slow_off_cpu_ms / double(slow) : 0.0, steal_run_ms);
    std::printf("  the loop CPUs%s over the run: user %.1f  system %.1f  irq %.1f  softirq %.1f  steal %.1f ms\n",
                o.cpus.empty() ? " (all CPUs)" : "", loop_cpu.user + loop_cpu.nice, loop_cpu.system, loop_cpu.irq, loop_cpu.softirq, loop_cpu.steal);
    if (a.isolate_system) std::printf("  other processes' threads moved off the loop CPUs: %d (%d could not be)\n", system_moved, system_failed);
    if (sampler) {
        std::printf("  other tasks' CPU time on the loop CPUs (%d samples):", sampler->samples());
        for (const auto& [name, t] : occupants) std::printf("  %s %.1f ms", name.c_str(), t);
        std::printf("%s\n", occupants.empty() ? "  none" : "");
    }
    std::printf("  options: lock %d prefault %d cpus [%s] other threads moved %d rt_priority %d high_priority_stream %d "
                "pinned_staging %d\n", rep.memory_locked, rep.prefaulted, a.cpus.c_str(), rep.threads_moved, a.rt_priority, rep.high_priority_stream, rep.pinned_staging);
    if (!a.json_path.empty()) {
        double load[3] = {0, 0, 0};
        if (::getloadavg(load, 3) < 0) load[0] = -1;
        const auto counters_json = [](const realtime::Counters& c) {
            return nlohmann::json{{"minor_page_faults", c.minor_faults}, {"major_page_faults", c.major_faults},
                                  {"voluntary_context_switches", c.voluntary_switches},
                                  {"involuntary_context_switches", c.involuntary_switches}};
        };
        nlohmann::json j = {
            {"bench", "rt_stress"}, {"label", a.label}, {"folder", a.folder}, {"device", device_name}, {"threads", threads},
            {"ticks", ms.size()}, {"wall_s", wall_s}, {"period_ms", a.period_ms}, {"warmup_ticks", warm},
            {"options", {{"lock_memory", a.lock_memory}, {"prefault", a.prefault}, {"cpus", o.cpus}, {"isolate_cpus", a.isolate_cpus}, {"rt_priority", a.rt_priority},
                         {"high_priority_stream", a.high_priority_stream}, {"pinned_staging", a.pinned_staging},
                         {"blocking_sync", a.blocking_sync}}},
            {"applied", {{"memory_locked", rep.memory_locked}, {"prefaulted", rep.prefaulted}, {"prefaulted_bytes", rep.prefaulted_bytes},
                         {"threads_placed", rep.threads_placed}, {"threads_moved", rep.threads_moved}, {"high_priority_stream", rep.high_priority_stream},
                         {"pinned_staging", rep.pinned_staging}}},
            {"p50_ms", all.p50}, {"p99_ms", all.p99}, {"p99_9_ms", all.p999}, {"p99_99_ms", all.p9999}, {"max_ms", all.max},
            {"max_over_p50", max_over_p50}, {"p99_99_over_p50", p9999_over_p50},
            {"chunk_ticks", to_json(chunk_tail)}, {"other_ticks", to_json(other_tail)},
            {"tick_counters", counters_json(in_ticks)}, {"run_counters", counters_json(whole)},
            {"loop_thread", {{"involuntary_context_switches", loop_involuntary}, {"slow_ticks", slow},
                             {"slow_ticks_preempted", slow_preempted},
                             {"slow_ticks_mean_off_cpu_ms", slow ? slow_off_cpu_ms / double(slow) : 0.0},
                             {"steal_ms_on_loop_cpus", steal_run_ms},
                             {"steal_cpus", o.cpus.empty() ? nlohmann::json("all") : nlohmann::json(o.cpus)}}},
            {"loop_cpu_ms", {{"user", loop_cpu.user + loop_cpu.nice}, {"system", loop_cpu.system}, {"irq", loop_cpu.irq},
                             {"softirq", loop_cpu.softirq}, {"steal", loop_cpu.steal}}},
            {"isolate_system", {{"requested", a.isolate_system}, {"threads_moved", system_moved}, {"threads_not_moved", system_failed}}},
            {"occupants_ms", [&] {
                 nlohmann::json j = nlohmann::json::array();
                 for (const auto& [name, t] : occupants) j.push_back({{"task", name}, {"ms", t}});
                 return j;
             }()},
            {"histogram", histogram(sorted, 60)}, {"load_average_1m", load[0]}};
        std::ofstream(a.json_path) << j.dump(1) << "\n";
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string s = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) throw std::runtime_error("rt_stress_bench: missing value after " + s);
            return argv[++i];
        };
        try {
            if (s == "--rebuild-from") a.rebuild = next();
            else if (s == "--device") a.device = next();
            else if (s == "--threads") a.threads = std::stoi(next());
            else if (s == "--ticks") a.ticks = std::stol(next());
            else if (s == "--seconds") a.seconds = std::stod(next());
            else if (s == "--warmup") a.warmup = std::stoi(next());
            else if (s == "--period-ms") a.period_ms = std::stod(next());
            else if (s == "--lock-memory") a.lock_memory = true;
            else if (s == "--prefault") a.prefault = true;
            else if (s == "--cpus") a.cpus = next();
            else if (s == "--isolate-cpus") a.isolate_cpus = true;
            else if (s == "--rt-priority") a.rt_priority = std::stoi(next());
            else if (s == "--high-priority-stream") a.high_priority_stream = true;
            else if (s == "--pinned-staging") a.pinned_staging = true;
            else if (s == "--occupants") a.occupants = true;
            else if (s == "--isolate-system") a.isolate_system = true;
            else if (s == "--blocking-sync") a.blocking_sync = true;
            else if (s == "--label") a.label = next();
            else if (s == "--json") a.json_path = next();
            else if (s == "--samples") a.samples_path = next();
            else if (!s.empty() && s[0] != '-' && a.folder.empty()) a.folder = s;
            else throw std::runtime_error("rt_stress_bench: unknown argument '" + s + "'");
        } catch (const std::exception& e) {
            std::fprintf(stderr,
                         "%s\nusage: rt_stress_bench FOLDER [--rebuild-from SRC] [--device cpu|cuda] [--threads N] [--ticks N | --seconds S]\n"
                         "         [--warmup N] [--period-ms P] [--lock-memory] [--prefault] [--cpus LIST] [--isolate-cpus] [--rt-priority P]\n"
                         "         [--high-priority-stream] [--pinned-staging] [--occupants] [--isolate-system] [--label NAME]\n"
                         "         [--json FILE] [--samples FILE] [--blocking-sync]\n",
                         e.what());
            return 2;
        }
    }
    if (a.folder.empty()) {
        std::fprintf(stderr, "rt_stress_bench: FOLDER is required\n");
        return 2;
    }
    try {
#ifdef _OPENMP
        if (a.threads > 0) omp_set_num_threads(a.threads);
#endif
        if (!a.rebuild.empty()) testsupport::rebuild_lerobot_fixture(a.rebuild, a.folder);
        if (a.device == "cuda") {
#ifdef FLOWEDGE_WITH_CUDA
            if (a.blocking_sync) cuda::set_blocking_sync();
            return run<Cuda>(a, cuda::device_description());
#else
            std::fprintf(stderr, "rt_stress_bench: this build has no CUDA backend\n");
            return 2;
#endif
        }
        if (a.device != "cpu") throw Error("flowedge: rt_stress_bench: unknown --device '" + a.device + "' (expected cpu or cuda)");
        if (a.blocking_sync) throw Error("flowedge: rt_stress_bench: --blocking-sync needs --device cuda");
        return run<Cpu>(a, std::string("cpu, ") + cpu::kernel_set_name() + " kernels");
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}
