// Rebuilds a LeRobot pretrained_model folder committed without its model.safetensors (tools/make_reference_dp_image.py):
// the generated tensors come back from manifest.json (value = float32(a + b * n) or float32(a + b * n * n), n the
// SplitMix64 normals of the tensor's seed, noise.hpp) and the rest from constants.safetensors; every other file is
// copied. Each generated tensor is checked against the sum and first values LeRobot's script recorded.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "flowedge/error.hpp"
#include "flowedge/io/safetensors.hpp"
#include "flowedge/noise.hpp"

namespace flowedge::testsupport {

/// Writes the full folder `src` describes into `out` (created; an existing model.safetensors there is replaced) and
/// returns `out`. Throws flowedge::Error when a regenerated tensor disagrees with the manifest's checksums.
inline std::filesystem::path rebuild_lerobot_fixture(const std::filesystem::path& src, const std::filesystem::path& out) {
    namespace fs = std::filesystem;
    fs::create_directories(out);
    for (const auto& e : fs::directory_iterator(src)) {
        const std::string n = e.path().filename().string();
        if (n == "manifest.json" || n == "constants.safetensors" || n == "model.safetensors") continue;
        fs::copy_file(e.path(), out / n, fs::copy_options::overwrite_existing);
    }
    std::ifstream in(src / "manifest.json", std::ios::binary);
    const nlohmann::json manifest = nlohmann::json::parse(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
    io::SafeTensorsWriter w;
    const auto constants = io::SafeTensors::open(src / "constants.safetensors");
    for (const io::TensorInfo& t : constants->tensors())
        w.add_raw(t.name, t.dtype_name, t.dims, std::span<const std::byte>(t.raw, t.bytes));
    std::vector<float> v;
    for (const auto& g : manifest.at("generated")) {
        const std::string key = g.at("key");
        std::vector<std::int64_t> dims = g.at("shape").get<std::vector<std::int64_t>>();
        std::int64_t n = 1;
        for (auto d : dims) n *= d;
        v.resize(std::size_t(n));
        fill_normal(g.at("seed").get<std::uint64_t>(), 0, v.data(), std::uint64_t(n));
        const double a = g.at("a"), b = g.at("b");
        const bool sq = g.at("rule") == "sq";
        double sum = 0;
        for (float& x : v) {
            const double d = double(x);
            x = float(a + b * (sq ? d * d : d));
            sum += x;
        }
        const auto first = g.at("first").get<std::vector<double>>();
        for (std::size_t i = 0; i < first.size(); ++i)
            if (double(v[i]) != first[i])
                fail("fixture", key + ": regenerated value " + std::to_string(i) + " differs from LeRobot's" +
                                    expected_got(std::to_string(first[i]), std::to_string(v[i])));
        const double want = g.at("sum");
        if (std::fabs(sum - want) > 1e-6 * (1.0 + std::fabs(want)) + 1e-9 * double(n))
            fail("fixture", key + ": regenerated sum differs from LeRobot's" + expected_got(std::to_string(want), std::to_string(sum)));
        w.add_raw(key, "F32", dims, std::as_bytes(std::span<const float>(v)));
    }
    w.write(out / "model.safetensors");
    return out;
}

#if defined(FLOWEDGE_FIXTURES_DIR) && defined(FLOWEDGE_BINARY_DIR)
/// test/fixtures/<name> rebuilt into <build dir>/test_fixtures/<name>, once per process (test executables, which
/// flowedge_add_test gives both directories).
inline std::filesystem::path rebuilt_fixture(const std::string& name) {
    namespace fs = std::filesystem;
    const fs::path out = fs::path(FLOWEDGE_BINARY_DIR) / "test_fixtures" / name;
    static std::vector<std::string> built;
    if (std::find(built.begin(), built.end(), name) == built.end()) {
        rebuild_lerobot_fixture(fs::path(FLOWEDGE_FIXTURES_DIR) / name, out);
        built.push_back(name);
    }
    return out;
}
#endif

}  // namespace flowedge::testsupport
