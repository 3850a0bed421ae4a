// Regression tests for what fuzzing and the reliability review found, plus the in-memory loader entry
// points the fuzzers use (they must agree with the file loaders).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "flowedge/models/diffusion/lerobot_checkpoint.hpp"
#include "flowedge/models/diffusion/export.hpp"
#include "flowedge/models/diffusion/head.hpp"
#include "flowedge/models/mamba_flow/mamba.hpp"
#include "../support/cpu_models_diffusion_head.hpp"
#include "../support/cpu_models_mamba_flow.hpp"
#include "reliability_util.hpp"

using namespace flowedge;
using reliability::expect_error;

namespace {
std::string read_text(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
nlohmann::json dp_config() { return io::parse_lerobot_json(read_text(reliability::dp_small() / "config.json"), "config.json"); }
std::shared_ptr<const io::SafeTensors> dp_model() { return io::SafeTensors::open(reliability::dp_small() / "model.safetensors"); }
std::vector<std::shared_ptr<const io::SafeTensors>> dp_states() {
    return {io::SafeTensors::open(reliability::dp_small() / "policy_postprocessor_step_0_unnormalizer_processor.safetensors")};
}
}  // namespace

TEST_CASE("in-memory LeRobot entry points agree with the folder loader") {
    const io::DiffusionCheckpoint folder = io::open_diffusion_checkpoint(reliability::dp_small());
    const io::DiffusionCheckpoint parts = io::lerobot_diffusion_from_parts(dp_config(), dp_model(), dp_states(), reliability::dp_small());
    CHECK(parts.config.down_dims == folder.config.down_dims);
    CHECK(parts.config.global_cond_dim == folder.config.global_cond_dim);
    CHECK(parts.config.action_dim == folder.config.action_dim);
    CHECK(parts.config.horizon == folder.config.horizon);
    CHECK(parts.action_min == folder.action_min);
    CHECK(parts.action_max == folder.action_max);
    const auto names = io::lerobot_processor_state_files(
        io::parse_lerobot_json(read_text(reliability::dp_small() / "policy_postprocessor.json"), "policy_postprocessor.json"));
    REQUIRE(names.size() == 1);
    CHECK(names[0] == "policy_postprocessor_step_0_unnormalizer_processor.safetensors");
    CHECK(io::lerobot_processor_state_files(nlohmann::json::parse(R"({"steps": [1, "x", {"state_file": 3}, null]})")).empty());
    // A head loaded from the in-memory checkpoint samples exactly like one loaded from the folder.
    auto a = DiffusionHead<Cpu>::load(parts);
    auto b = DiffusionHead<Cpu>::load(reliability::dp_small());
    const auto& c = a.config();
    std::vector<float> cond(std::size_t(c.global_cond_dim), 0.3f), noise(std::size_t(c.horizon) * c.action_dim, -0.2f), ya(noise.size()),
        yb(noise.size());
    a.sample(cond, noise, ya);
    b.sample(cond, noise, yb);
    CHECK(ya == yb);
    // Compact from memory == compact from disk.
    reliability::TempDir tmp("compact");
    export_diffusion_compact(reliability::dp_small(), tmp.path / "dp.flowedge.safetensors");
    const std::string bytes = read_text(tmp.path / "dp.flowedge.safetensors");
    const auto* p = reinterpret_cast<const std::byte*>(bytes.data());
    const io::DiffusionCheckpoint mem = io::open_diffusion_compact(io::SafeTensors::from_bytes({p, p + bytes.size()}, "mem"));
    CHECK(mem.config.down_dims == folder.config.down_dims);
    CHECK(mem.action_max == folder.action_max);
}

TEST_CASE("LeRobot config: wrong JSON types and out-of-range integers are Errors, not escaped json exceptions or wraparound") {
    auto bad = [&](const std::function<void(nlohmann::json&)>& edit, std::string_view needle, const char* what) {
        nlohmann::json j = dp_config();
        edit(j);
        expect_error([&] { (void)io::lerobot_diffusion_from_parts(j, dp_model(), dp_states(), reliability::dp_small()); }, needle, what);
    };
    // Feature "type" that is not a string used to throw nlohmann::type_error out of the loader.
    bad([](auto& j) { j["input_features"]["observation.state"]["type"] = 5; }, "global_cond_dim", "numeric feature type");
    {
        // A non-string ACTION type is simply not an ACTION feature: the width then comes from the tensors alone.
        nlohmann::json j = dp_config();
        j["output_features"]["action"]["type"] = nlohmann::json::array();
        CHECK(io::lerobot_diffusion_from_parts(j, dp_model(), dp_states(), reliability::dp_small()).config.action_dim == 2);
    }
    // Integers beyond int used to be truncated silently (2^32 + 16 read as 16).
    bad([](auto& j) { j["horizon"] = (std::uint64_t(1) << 32) + 16; }, "field 'horizon' is out of range", "horizon 2^32+16");
    bad([](auto& j) { j["down_dims"] = {16, (std::int64_t(1) << 33) + 32, 64}; }, "field 'down_dims' is out of range", "down_dims 2^33+32");
    bad([](auto& j) { j["input_features"]["observation.state"]["shape"] = {(std::uint64_t(1) << 32) + 2}; }, "out of range",
        "feature dim 2^32+2");
    bad([](auto& j) { j["n_obs_steps"] = std::numeric_limits<int>::max(); }, "condition width implied by input_features is too large",
        "n_obs_steps INT_MAX (per_frame * n_obs overflowed before)");
    bad([](auto& j) {
        j["n_obs_steps"] = std::numeric_limits<int>::max();
        j.erase("input_features");
    }, "invalid n_obs_steps", "n_obs_steps INT_MAX without features");
    bad([](auto& j) { j["n_action_steps"] = std::numeric_limits<int>::max(); }, "invalid n_action_steps", "n_action_steps INT_MAX (overflowed before)");
    bad([](auto& j) {
        j["input_features"]["observation.image"] = {{"type", "VISUAL"}, {"shape", {3, 96, 96}}};
        j["spatial_softmax_num_keypoints"] = std::numeric_limits<int>::max();
    }, "spatial_softmax_num_keypoints' out of range", "keypoints INT_MAX (2*kp overflowed before)");
    bad([](auto& j) { j["diffusion_step_embed_dim"] = 1 << 30; }, "disagrees with diffusion_step_embed_dim", "Td 2^30");
    bad([](auto& j) { j["down_dims"] = {8, 16, 32, 64, 128, 256, 512, 1024, 2048}; }, "too many stages", "9 stages");
    expect_error([] { (void)io::parse_lerobot_json("{\"type\": \"diffusion\"} trailing", "cfg"); }, "not valid JSON", "trailing garbage");
    expect_error([] { (void)io::lerobot_diffusion_from_parts(nlohmann::json::array(), dp_model(), {}, "x"); }, "not a JSON object",
                 "config is an array");
}

TEST_CASE("DiffusionConfig::validate bounds every size that feeds int arithmetic") {
    DiffusionConfig c;  // PushT defaults are valid
    c.validate();
    auto bad = [&](const std::function<void(DiffusionConfig&)>& edit, std::string_view needle, const char* what) {
        DiffusionConfig d;
        edit(d);
        expect_error([&] { d.validate(); }, needle, what);
    };
    bad([](auto& d) { d.step_embed_dim = 1 << 30; }, "invalid diffusion_step_embed_dim", "Td 2^30 (4*Td overflowed)");
    bad([](auto& d) { d.down_dims = {8, 1 << 30}; }, "invalid down_dims[1]", "dims 2^30");
    bad([](auto& d) { d.global_cond_dim = std::numeric_limits<int>::max(); }, "invalid global_cond_dim", "gcd INT_MAX");
    bad([](auto& d) { d.horizon = 1 << 20; }, "invalid horizon", "horizon 2^20");
    bad([](auto& d) { d.kernel_size = (1 << 20) + 1; }, "invalid kernel_size", "kernel 2^20+1");
    bad([](auto& d) { d.num_train_timesteps = std::numeric_limits<int>::max(); }, "invalid num_train_timesteps", "T INT_MAX");
    bad([](auto& d) { d.n_action_steps = std::numeric_limits<int>::max(); }, "invalid n_action_steps", "n_action_steps INT_MAX");
}

TEST_CASE("LeRobot tensors with huge dims and zero elements are rejected before any int conversion") {
    // A zero-size tensor may carry any dims; the cond-encoder width 2^32 + 40 used to truncate to 40 in int.
    io::SafeTensorsWriter w;
    auto st = dp_model();
    for (const auto& t : st->tensors()) {
        if (t.name == "diffusion.unet.down_modules.0.0.cond_encoder.1.weight") {
            w.add_raw(t.name, "F32", {0, (std::int64_t(1) << 32) + 40}, {});
            continue;
        }
        w.add_raw(t.name, t.dtype_name, t.dims, {t.raw, t.bytes});
    }
    const auto bytes = w.bytes();
    nlohmann::json j = dp_config();
    j.erase("input_features");  // nothing to cross-check the width against
    expect_error([&] { (void)io::lerobot_diffusion_from_parts(j, io::SafeTensors::from_bytes(bytes, "m"), dp_states(), "x"); },
                 "has a bad width for diffusion_step_embed_dim", "cond encoder width 2^32+40");
}

TEST_CASE("Mamba import_state rejects a header whose size field or reserved bytes are wrong") {
    auto m = Mamba<Cpu>::load(reliability::backbone_only_file(), {}, 8);
    std::vector<float> h(std::size_t(m.config().d_model));
    m.step(7, h);
    const std::vector<std::byte> good = m.export_state();
    m.import_state(good);  // round trip accepted
    // Found by the mamba_state fuzz target: these were accepted (the header_bytes field and padding were never read).
    std::vector<std::byte> s = good;
    s[12] = std::byte{0x40};  // header_bytes = 64
    expect_error([&] { m.import_state(s); }, "bad header size field (expected 80, got 64)", "header_bytes 64");
    s = good;
    s[70] = std::byte{1};
    expect_error([&] { m.import_state(s); }, "reserved header byte 70 is not zero", "non-zero reserved byte");
    CHECK(m.export_state() == good);  // rejected states leave the state untouched
    s = good;
    s.push_back(std::byte{0});
    expect_error([&] { m.import_state(s); }, "wrong state size", "one extra byte");
    s = good;
    s[0] = std::byte{'X'};
    expect_error([&] { m.import_state(s); }, "bad magic", "bad magic");
    s = good;
    s[8] = std::byte{2};
    expect_error([&] { m.import_state(s); }, "unsupported state version", "version 2");
    s = good;
    s[100] ^= std::byte{0x10};
    expect_error([&] { m.import_state(s); }, "checksum mismatch", "flipped payload bit");
}
