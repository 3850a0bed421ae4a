// Replays every committed seed and reproducer of one fuzz target (fuzz/corpus/<target>) through the target's
// own entry point, so the normal (non-clang) test suite keeps every past finding fixed.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

TEST_CASE("fuzz corpus replay: every seed and reproducer passes the target's checks") {
    namespace fs = std::filesystem;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(FLOWEDGE_FUZZ_CORPUS))
        if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    REQUIRE(files.size() >= 5);
    for (const auto& f : files) {
        CAPTURE(f.string());
        std::ifstream in(f, std::ios::binary);
        const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        // The target traps (aborting the test) on any broken invariant; returning 0 means the input was handled.
        CHECK(LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()) == 0);
    }
    MESSAGE("replayed " << files.size() << " inputs from " << FLOWEDGE_FUZZ_CORPUS);
}
