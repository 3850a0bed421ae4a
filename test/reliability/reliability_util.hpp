// Shared helpers of the reliability tests: fixture paths, "must throw flowedge::Error" with a counter,
// temp folders, and rewriting a checkpoint with every tensor transformed.
#pragma once
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "flowedge/error.hpp"
#include "flowedge/io/safetensors.hpp"

namespace reliability {

namespace fs = std::filesystem;

inline fs::path fixtures() { return fs::path(FLOWEDGE_FIXTURES_DIR); }
inline fs::path dp_small() { return fixtures() / "dp_small"; }
inline fs::path mamba_flow_file() { return fixtures() / "mamba_flow" / "mamba_flow.safetensors"; }
inline fs::path head_only_file() { return fixtures() / "mamba_flow" / "mamba_flow_head_only.safetensors"; }
inline fs::path backbone_only_file() { return fixtures() / "mamba_flow" / "mamba_flow_backbone_only.safetensors"; }

/// Number of bad inputs tried by expect_error (reported by the tests).
inline std::atomic<int>& bad_inputs() {
    static std::atomic<int> n{0};
    return n;
}

/// Runs f, which must throw flowedge::Error whose message starts with "flowedge: " and contains `needle`.
inline void expect_error(const std::function<void()>& f, std::string_view needle, const char* what_c) {
    ++bad_inputs();
    const std::string what = what_c;
    CAPTURE(what);
    bool threw = false;
    try {
        f();
    } catch (const flowedge::Error& e) {
        threw = true;
        const std::string msg = e.what();
        CAPTURE(msg);
        CHECK(msg.rfind("flowedge: ", 0) == 0);
        CHECK(msg.find(needle) != std::string::npos);
    }
    CHECK_MESSAGE(threw, "expected a flowedge::Error for: " << what);
}

/// A fresh temporary folder removed at scope exit.
struct TempDir {
    fs::path path;
    explicit TempDir(const std::string& tag) {
        path = fs::temp_directory_path() / ("flowedge_rel_" + tag + "_" + std::to_string(::getpid()));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

/// Rewrites safetensors `src` to `dst` as F32, passing every supported tensor's values through `f(name, values)`.
inline void rewrite_f32(const fs::path& src, const fs::path& dst,
                        const std::function<void(const std::string&, std::vector<float>&)>& f) {
    auto st = flowedge::io::SafeTensors::open(src);
    flowedge::io::SafeTensorsWriter w;
    for (const auto& t : st->tensors()) {
        if (!t.supported()) continue;
        std::vector<float> v = st->read_f32(t.name);
        f(t.name, v);
        w.add_f32(t.name, t.shape, v);
    }
    w.write(dst);
}

/// Resident set size of this process in bytes (Linux /proc/self/statm).
inline std::size_t rss_bytes() {
    std::ifstream in("/proc/self/statm");
    std::size_t pages_total = 0, pages_rss = 0;
    in >> pages_total >> pages_rss;
    return pages_rss * std::size_t(::sysconf(_SC_PAGESIZE));
}

}  // namespace reliability
