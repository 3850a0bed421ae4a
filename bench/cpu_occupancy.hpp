// Who else runs on the control loop's CPUs: rt_stress_bench's diagnostics for a tail made of preemptions.
// - cpu_times(cpus): the CPUs' user / system / irq / softirq / steal time from /proc/stat (interrupt load and a stolen
//   vCPU show up here, not as another task);
// - OccupantSampler: a thread kept off the loop's CPUs that reads every task's last CPU and CPU time
//   (/proc/<pid>/task/<tid>/stat fields 14, 15, 39) every few ms and charges the CPU time a task gained while last
//   seen on a loop CPU to that task: the processes that take the loop's CPU under load, by name;
// - isolate_system(cpus): moves every thread of every other process that may run on `cpus` off them (allowed when
//   the threads belong to the same user or with CAP_SYS_NICE), and restore() puts their affinity back. This is what
//   isolcpus= / a cpuset does for a deployment; the bench uses it to test whether the remaining tail is other tasks.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <map>
#include <sched.h>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

namespace benchsupport {

/// Time (ms) the given CPUs spent in each state over the run (subtract two readings).
struct CpuTimes {
    double user = 0, nice = 0, system = 0, irq = 0, softirq = 0, steal = 0;
    bool valid = false;
    CpuTimes operator-(const CpuTimes& o) const {
        return {user - o.user, nice - o.nice, system - o.system, irq - o.irq, softirq - o.softirq, steal - o.steal, valid && o.valid};
    }
};

/// Sum over `cpus` (every CPU when empty) of /proc/stat's per-CPU times; valid false when unreadable.
inline CpuTimes cpu_times(const std::vector<int>& cpus) {
    CpuTimes t;
    std::ifstream f("/proc/stat");
    if (!f) return t;
    const double ms_per_tick = 1e3 / double(::sysconf(_SC_CLK_TCK));
    std::string name;
    while (f >> name) {
        long long v[8] = {};
        for (long long& x : v) f >> x;  // user nice system idle iowait irq softirq steal
        f.ignore(1 << 12, '\n');
        if (name.rfind("cpu", 0) != 0 || name == "cpu") continue;
        const int id = std::atoi(name.c_str() + 3);
        if (!cpus.empty() && std::find(cpus.begin(), cpus.end(), id) == cpus.end()) continue;
        t.user += double(v[0]) * ms_per_tick;
        t.nice += double(v[1]) * ms_per_tick;
        t.system += double(v[2]) * ms_per_tick;
        t.irq += double(v[5]) * ms_per_tick;
        t.softirq += double(v[6]) * ms_per_tick;
        t.steal += double(v[7]) * ms_per_tick;
    }
    t.valid = true;
    return t;
}

/// Numeric entries of a /proc directory.
inline std::vector<int> proc_ids(const std::string& dir) {
    std::vector<int> ids;
    if (DIR* d = ::opendir(dir.c_str())) {
        while (const dirent* e = ::readdir(d))
            if (e->d_name[0] >= '0' && e->d_name[0] <= '9') ids.push_back(std::atoi(e->d_name));
        ::closedir(d);
    }
    return ids;
}

/// One task's stat line: command name, CPU time (utime + stime, clock ticks) and the CPU it last ran on.
struct TaskStat {
    std::string comm;
    long long cpu_ticks = 0;
    int processor = -1;
};
inline bool read_task_stat(int pid, int tid, TaskStat& out) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/stat");
    std::string line;
    if (!f || !std::getline(f, line)) return false;
    const std::size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) return false;
    out.comm = line.substr(open + 1, close - open - 1);
    std::istringstream rest(line.substr(close + 2));  // field 3 (state) onwards
    std::string field;
    long long utime = 0, stime = 0;
    for (int i = 3; rest >> field; ++i) {
        if (i == 14) utime = std::atoll(field.c_str());
        else if (i == 15) stime = std::atoll(field.c_str());
        else if (i == 39) {
            out.processor = std::atoi(field.c_str());
            break;
        }
    }
    out.cpu_ticks = utime + stime;
    return out.processor >= 0;
}

/// CPUs this process may use that are not in `loop`.
inline cpu_set_t cpus_outside(const std::vector<int>& loop) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) != 0) CPU_ZERO(&set);
    for (const int c : loop) CPU_CLR(c, &set);
    return set;
}

/// Samples which tasks run on the loop CPUs (see the file comment); start before the timed ticks, stop after.
class OccupantSampler {
public:
    OccupantSampler(std::vector<int> loop_cpus, int loop_tid, int period_ms = 5)
        : m_cpus(std::move(loop_cpus)), m_loop_tid(loop_tid), m_period_ms(period_ms) {
        const cpu_set_t away = cpus_outside(m_cpus);
        m_thread = std::thread([this, away] {
            ::sched_setaffinity(0, sizeof away, &away);  // never on the loop's CPUs (threads inherit the starter's)
            while (!m_stop.load(std::memory_order_relaxed)) {
                sample();
                std::this_thread::sleep_for(std::chrono::milliseconds(m_period_ms));
            }
            sample();
        });
    }
    OccupantSampler(const OccupantSampler&) = delete;
    OccupantSampler& operator=(const OccupantSampler&) = delete;
    ~OccupantSampler() { stop(); }

    void stop() {
        m_stop = true;
        if (m_thread.joinable()) m_thread.join();
    }
    /// Tasks by CPU time (ms) gained on the loop CPUs, largest first: "comm [pid]".
    std::vector<std::pair<std::string, double>> top(std::size_t n) const {
        std::vector<std::pair<std::string, double>> v(m_ms.begin(), m_ms.end());
        std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
        if (v.size() > n) v.resize(n);
        return v;
    }
    int samples() const { return m_samples; }

private:
    void sample() {
        const double ms_per_tick = 1e3 / double(::sysconf(_SC_CLK_TCK));
        for (const int pid : proc_ids("/proc"))
            for (const int tid : proc_ids("/proc/" + std::to_string(pid) + "/task")) {
                if (tid == m_loop_tid) continue;
                TaskStat s;
                if (!read_task_stat(pid, tid, s)) continue;
                auto [it, fresh] = m_last.try_emplace(tid, s);
                const long long gained = s.cpu_ticks - it->second.cpu_ticks;
                const bool on_loop = std::find(m_cpus.begin(), m_cpus.end(), s.processor) != m_cpus.end();
                if (!fresh && gained > 0 && on_loop)
                    m_ms[s.comm + " [" + std::to_string(pid) + (pid == m_self ? ", this process" : "") + "]"] += double(gained) * ms_per_tick;
                it->second = s;
            }
        ++m_samples;
    }

    std::vector<int> m_cpus;
    int m_loop_tid;
    int m_period_ms;
    int m_self = int(::getpid());
    std::atomic<bool> m_stop{false};
    std::map<int, TaskStat> m_last;
    std::map<std::string, double> m_ms;
    int m_samples = 0;
    std::thread m_thread;
};

/// Every thread of every other process moved off `loop` (isolate_system), with what is needed to put them back.
class SystemIsolation {
public:
    explicit SystemIsolation(const std::vector<int>& loop) {
        const pid_t self = ::getpid();
        for (const int pid : proc_ids("/proc")) {
            if (pid == self) continue;
            for (const int tid : proc_ids("/proc/" + std::to_string(pid) + "/task")) {
                cpu_set_t old;
                if (::sched_getaffinity(tid, sizeof old, &old) != 0) continue;
                cpu_set_t moved = old;
                bool touches = false;
                for (const int c : loop) {
                    touches = touches || CPU_ISSET(c, &moved);
                    CPU_CLR(c, &moved);
                }
                if (!touches) continue;
                if (CPU_COUNT(&moved) == 0 || ::sched_setaffinity(tid, sizeof moved, &moved) != 0) {
                    ++m_failed;  // a kernel thread bound to that CPU, another user's process, or one pinned there
                    continue;
                }
                m_saved.emplace_back(tid, old);
            }
        }
    }
    SystemIsolation(const SystemIsolation&) = delete;
    SystemIsolation& operator=(const SystemIsolation&) = delete;
    ~SystemIsolation() { restore(); }

    void restore() {
        for (auto& [tid, mask] : m_saved) ::sched_setaffinity(tid, sizeof mask, &mask);
        m_saved.clear();
    }
    int moved() const { return int(m_saved.size()); }
    int failed() const { return m_failed; }

private:
    std::vector<std::pair<int, cpu_set_t>> m_saved;
    int m_failed = 0;
};

}  // namespace benchsupport
