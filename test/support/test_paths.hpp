// Where a test finds its committed fixtures (test/fixtures) and where it may write files (a directory in the build
// tree), from the FLOWEDGE_FIXTURES_DIR / FLOWEDGE_BINARY_DIR definitions flowedge_add_test gives every test.
#pragma once
#include <filesystem>

namespace fe_test {

/// test/fixtures in the source tree.
inline std::filesystem::path fixtures_dir() { return std::filesystem::path(FLOWEDGE_FIXTURES_DIR); }

/// <build dir>/<rel>, created if missing. Files written there stay after the run (for inspection); a test that
/// needs a fresh file removes or overwrites it itself.
inline std::filesystem::path scratch_dir(const std::filesystem::path& rel) {
    const std::filesystem::path d = std::filesystem::path(FLOWEDGE_BINARY_DIR) / rel;
    std::filesystem::create_directories(d);
    return d;
}

}  // namespace fe_test
