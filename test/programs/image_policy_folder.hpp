// A two-camera image policy folder built from test/fixtures/dp_small for the program tests: dp_small's config and
// processors plus two VISUAL features (observation.images.top / .wrist, [3, 48, 64], one shared GroupNorm ResNet18
// encoder with 32 keypoints, random Kaiming-scale weights), and dp_small's U-Net with its FiLM condition weights
// widened to the new global_cond_dim (the extra columns small and deterministic). Not a LeRobot parity fixture:
// the program is checked against DiffusionPolicy<Cpu> in process on it.
#pragma once
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "flowedge/io/safetensors.hpp"

namespace programs_test {

inline constexpr int kImageH = 48, kImageW = 64, kKeypoints = 32;
inline const char* const kCameras[2] = {"observation.images.top", "observation.images.wrist"};

/// Writes the folder into `dir` (replacing it) and returns it.
inline std::filesystem::path make_image_policy_folder(const std::filesystem::path& dp_small, const std::filesystem::path& dir) {
    namespace fs = std::filesystem;
    using flowedge::Shape;
    fs::remove_all(dir);
    fs::create_directories(dir);
    auto read_json = [](const fs::path& p) {
        std::ifstream in(p);
        return nlohmann::json::parse(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
    };
    auto write_json = [](const fs::path& p, const nlohmann::json& j) { std::ofstream(p) << j.dump(2); };
    const nlohmann::json visual = {{"type", "VISUAL"}, {"shape", {3, kImageH, kImageW}}};

    nlohmann::json cfg = read_json(dp_small / "config.json");
    for (const char* cam : kCameras) cfg["input_features"][cam] = visual;
    cfg["spatial_softmax_num_keypoints"] = kKeypoints;
    write_json(dir / "config.json", cfg);

    nlohmann::json pre = read_json(dp_small / "policy_preprocessor.json");
    for (auto& step : pre["steps"])
        if (step["registry_name"] == "normalizer_processor")
            for (const char* cam : kCameras) step["config"]["features"][cam] = visual;
    write_json(dir / "policy_preprocessor.json", pre);
    for (const char* f : {"policy_postprocessor.json", "policy_postprocessor_step_0_unnormalizer_processor.safetensors"})
        fs::copy_file(dp_small / f, dir / f);

    const std::string state_name = "policy_preprocessor_step_3_normalizer_processor.safetensors";
    const auto stats = flowedge::io::SafeTensors::open(dp_small / state_name);
    flowedge::io::SafeTensorsWriter sw;
    for (const auto& t : stats->tensors()) sw.add_f32(t.name, t.shape, stats->read_f32(t.name));
    const std::vector<float> mean = {0.485f, 0.456f, 0.406f}, stdev = {0.229f, 0.224f, 0.225f};  // ImageNet's
    for (const char* cam : kCameras) {
        sw.add_f32(std::string(cam) + ".mean", Shape{3, 1, 1}, mean);
        sw.add_f32(std::string(cam) + ".std", Shape{3, 1, 1}, stdev);
    }
    sw.write(dir / state_name);

    // U-Net: dp_small's, FiLM condition encoders widened from [C, 32 + 12] to [C, 32 + n_obs * (2 + 2 * 2K + 4)].
    const int old_cond = 2 * (2 + 4), new_cond = 2 * (2 + 2 * 2 * kKeypoints + 4), step_embed = 32;
    const auto model = flowedge::io::SafeTensors::open(dp_small / "model.safetensors");
    flowedge::io::SafeTensorsWriter mw;
    std::mt19937 rng(2026);
    for (const auto& t : model->tensors()) {
        std::vector<float> v = model->read_f32(t.name);
        if (t.name.find("cond_encoder.1.weight") == std::string::npos) {
            mw.add_f32(t.name, t.shape, v);
            continue;
        }
        const std::int64_t rows = t.shape[0], in_old = step_embed + old_cond, in_new = step_embed + new_cond;
        std::uniform_real_distribution<float> small(-0.02f, 0.02f);
        std::vector<float> w(std::size_t(rows * in_new));
        for (std::int64_t r = 0; r < rows; ++r)
            for (std::int64_t c = 0; c < in_new; ++c)
                w[std::size_t(r * in_new + c)] = c < in_old ? v[std::size_t(r * in_old + c)] : small(rng);
        mw.add_f32(t.name, Shape{rows, in_new}, w);
    }
    // Encoder (torchvision resnet18 minus avgpool/fc with GroupNorm(C // 16, C), SpatialSoftmax, Linear), shared.
    const std::string p = "diffusion.rgb_encoder.";
    auto uniform = [&](const std::string& key, Shape shape, float a, float b) {
        std::uniform_real_distribution<float> d(a, b);
        std::vector<float> v(std::size_t(shape.numel()));
        for (float& x : v) x = d(rng);
        mw.add_f32(p + key, shape, v);
    };
    auto conv = [&](const std::string& key, int out, int in, int k) {
        const float a = std::sqrt(6.f / float(in * k * k));
        uniform(key, Shape{out, in, k, k}, -a, a);
    };
    auto norm = [&](const std::string& key, int ch) {
        uniform(key + "weight", Shape{ch}, 0.6f, 1.4f);
        uniform(key + "bias", Shape{ch}, -0.2f, 0.2f);
    };
    conv("backbone.0.weight", 64, 3, 7);
    norm("backbone.1.", 64);
    const int widths[4] = {64, 128, 256, 512};
    int in = 64;
    for (int l = 0; l < 4; ++l) {
        for (int j = 0; j < 2; ++j) {
            const std::string b = "backbone." + std::to_string(4 + l) + "." + std::to_string(j) + ".";
            const int cin = j == 0 ? in : widths[l];
            conv(b + "conv1.weight", widths[l], cin, 3);
            norm(b + "bn1.", widths[l]);
            conv(b + "conv2.weight", widths[l], widths[l], 3);
            norm(b + "bn2.", widths[l]);
            if (j == 0 && l > 0) {
                conv(b + "downsample.0.weight", widths[l], cin, 1);
                norm(b + "downsample.1.", widths[l]);
            }
        }
        in = widths[l];
    }
    // 48x64 frames leave a 2x2 feature map (strides 2, 2 (max pool), 1, 2, 2, 2); pos_grid is LeRobot's (x, y) grid.
    const int fh = 2, fw = 2;
    uniform("pool.nets.weight", Shape{kKeypoints, 512, 1, 1}, -0.15f, 0.15f);
    uniform("pool.nets.bias", Shape{kKeypoints}, -0.5f, 0.5f);
    std::vector<float> grid;
    for (int r = 0; r < fh; ++r)
        for (int q = 0; q < fw; ++q) {
            grid.push_back(-1.f + 2.f * float(q) / float(fw - 1));
            grid.push_back(-1.f + 2.f * float(r) / float(fh - 1));
        }
    mw.add_f32(p + "pool.pos_grid", Shape{fh * fw, 2}, grid);
    const float a = 1.f / std::sqrt(2.f * kKeypoints);
    uniform("out.weight", Shape{2 * kKeypoints, 2 * kKeypoints}, -a, a);
    uniform("out.bias", Shape{2 * kKeypoints}, -0.1f, 0.3f);
    mw.write(dir / "model.safetensors");
    return dir;
}

}  // namespace programs_test
