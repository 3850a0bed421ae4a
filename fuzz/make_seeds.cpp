// Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/): small valid files built from tiny
// configs and the fixtures, plus hand-made malformed ones. Usage: flowedge_fuzz_make_seeds <corpus dir>.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "flowedge/models/diffusion/lerobot_checkpoint.hpp"
#include "flowedge/io/npz.hpp"
#include "flowedge/io/safetensors.hpp"
#include "flowedge/models/diffusion/head.hpp"
#include "flowedge/models/mamba_flow/mamba.hpp"
#include "fuzz_common.hpp"

namespace fs = std::filesystem;
using namespace flowedge;

namespace {
void write(const fs::path& p, const std::string& s) {
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary).write(s.data(), std::streamsize(s.size()));
}
std::string str(const std::vector<std::byte>& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

/// Deterministic values in [-scale, scale].
std::vector<float> values(std::size_t n, std::uint64_t seed, float scale) {
    std::vector<float> v(n);
    std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (auto& x : v) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x = scale * (float((s >> 40) & 0xffffff) / float(0xffffff) * 2.f - 1.f);
    }
    return v;
}

DiffusionConfig tiny_config() {
    DiffusionConfig c;
    c.action_dim = 2;
    c.horizon = 8;
    c.n_action_steps = 4;
    c.n_obs_steps = 2;
    c.global_cond_dim = 6;  // 2 frames x (state 2 + env 1)
    c.down_dims = {8, 16};
    c.kernel_size = 3;
    c.n_groups = 4;
    c.step_embed_dim = 8;
    c.num_train_timesteps = 20;
    c.scheduler = Scheduler::Ddim;
    return c;
}

/// Adds every U-Net tensor of `c` under `name(unet_name)`.
template <class Name>
void add_unet(io::SafeTensorsWriter& w, const DiffusionConfig& c, Name&& name, DType dtype) {
    ConditionalUnet1d<Cpu> skeleton(c);
    std::uint64_t seed = 1;
    skeleton.visit_parameters([&](const std::string& n, Parameter<Cpu>&, const Shape& shape, Storage st) {
        std::vector<float> v = values(std::size_t(shape.numel()), seed++, 0.3f);
        if (n.find("block.1.weight") != std::string::npos)  // group-norm scale near 1
            for (auto& x : v) x = 1.f + x * 0.1f;
        const DType want = st == Storage::Vector ? DType::F32 : dtype;
        std::vector<std::byte> buf(v.size() * dtype_size(want));
        Parameter<Cpu>::convert(v.data(), DType::F32, buf.data(), want, v.size());
        w.add(name(n), want, shape, buf.data());
    });
}

nlohmann::json lerobot_config(const DiffusionConfig& c) {
    nlohmann::json j = {
        {"type", "diffusion"},
        {"n_obs_steps", c.n_obs_steps},
        {"input_features",
         {{"observation.state", {{"type", "STATE"}, {"shape", {2}}}},
          {"observation.environment_state", {{"type", "ENV"}, {"shape", {1}}}}}},
        {"output_features", {{"action", {{"type", "ACTION"}, {"shape", {c.action_dim}}}}}},
        {"horizon", c.horizon},
        {"n_action_steps", c.n_action_steps},
        {"normalization_mapping", {{"VISUAL", "MEAN_STD"}, {"STATE", "MIN_MAX"}, {"ACTION", "MIN_MAX"}}},
        {"spatial_softmax_num_keypoints", 32},
        {"down_dims", c.down_dims},
        {"kernel_size", c.kernel_size},
        {"n_groups", c.n_groups},
        {"diffusion_step_embed_dim", c.step_embed_dim},
        {"use_film_scale_modulation", true},
        {"noise_scheduler_type", "DDIM"},
        {"num_train_timesteps", c.num_train_timesteps},
        {"beta_schedule", "squaredcos_cap_v2"},
        {"prediction_type", "epsilon"},
        {"clip_sample", true},
        {"clip_sample_range", 1.0},
        {"num_inference_steps", nullptr},
    };
    return j;
}

const nlohmann::json kProcessor = {
    {"name", "policy_postprocessor"},
    {"steps",
     {{{"registry_name", "unnormalizer_processor"}, {"state_file", "policy_postprocessor_step_0_unnormalizer_processor.safetensors"}},
      {{"registry_name", "device_processor"}}}}};

std::string joined(const std::vector<std::string>& parts) {
    std::string s;
    for (std::size_t i = 0; i < parts.size(); ++i) {
        if (i) s += fuzz::kPartSeparator;
        s += parts[i];
    }
    return s;
}

std::string header_only(const std::string& json) {
    std::string s(8, '\0');
    const std::uint64_t n = json.size();
    for (int i = 0; i < 8; ++i) s[std::size_t(i)] = char((n >> (8 * i)) & 0xff);
    return s + json;
}
/// Rewrites a stored .npz image (as NpzWriter makes it) with a zip64 end record and locator, the classic end
/// record's counts and offsets saturated.
std::vector<std::byte> with_zip64_end(std::vector<std::byte> b) {
    auto get = [&](std::size_t at, int n) {
        std::uint64_t v = 0;
        for (int k = 0; k < n; ++k) v |= std::uint64_t(std::to_integer<unsigned>(b[at + std::size_t(k)])) << (8 * k);
        return v;
    };
    auto put = [&](std::uint64_t v, int n) {
        for (int k = 0; k < n; ++k) b.push_back(std::byte((v >> (8 * k)) & 0xFFu));
    };
    const std::size_t eocd = b.size() - 22;
    const std::uint64_t n = get(eocd + 10, 2), cd_size = get(eocd + 12, 4), cd_off = get(eocd + 16, 4);
    b.resize(eocd);
    const std::uint64_t rec = b.size();
    for (auto [v, w] : {std::pair<std::uint64_t, int>{0x06064b50u, 4}, {44, 8}, {45, 2}, {45, 2}, {0, 4}, {0, 4}, {n, 8}, {n, 8},
                        {cd_size, 8}, {cd_off, 8}, {0x07064b50u, 4}, {0, 4}, {rec, 8}, {1, 4}, {0x06054b50u, 4}, {0, 4},
                        {0xFFFFu, 2}, {0xFFFFu, 2}, {0xFFFFFFFFu, 4}, {0xFFFFFFFFu, 4}, {0, 2}})
        put(v, w);
    return b;
}

std::string file_text(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
        return 2;
    }
    const fs::path out = argv[1];
    const DiffusionConfig c = tiny_config();

    // --- safetensors ---
    {
        const fs::path d = out / "safetensors";
        io::SafeTensorsWriter w;
        const auto a = values(6, 1, 1.f);
        w.add_f32("a", Shape{2, 3}, a);
        std::vector<std::uint16_t> h = {0x3f80, 0xbf80, 0x7f80, 0x7fc0};
        w.add("b", DType::BF16, Shape{4}, h.data());
        w.add("c", DType::F16, Shape{2, 2}, h.data());
        w.add("empty", DType::F32, Shape{0, 5}, nullptr);
        std::vector<std::int64_t> i64 = {1, -2};
        w.add_raw("ids", "I64", {2}, std::as_bytes(std::span<const std::int64_t>(i64)));
        w.add_raw("rank5", "F32", {1, 1, 1, 1, 1}, std::as_bytes(std::span<const float>(a.data(), 1)));
        w.set_metadata("format", "pt");
        write(d / "valid_mixed", str(w.bytes()));
        io::SafeTensorsWriter w2;
        w2.add_f32("x", Shape{1}, std::span<const float>(a.data(), 1));
        write(d / "valid_one", str(w2.bytes()));
        write(d / "empty_header", header_only("{}      "));
        write(d / "overlap", header_only(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})") + std::string(8, '\0'));
        write(d / "out_of_range", header_only(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})") + std::string(8, '\0'));
        write(d / "dup", header_only(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})") + std::string(4, '\0'));
        write(d / "huge_dims_zero", header_only(R"({"a":{"dtype":"F32","shape":[0,9223372036854775807],"data_offsets":[0,0]},"__metadata__":{"k":"v"}})"));
        write(d / "overflow", header_only(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"));
        write(d / "bad_len", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10));
        write(d / "f4_odd", header_only(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})") + std::string(2, '\0'));
    }

    // --- lerobot_folder: config | processor json | model | postprocessor state ---
    {
        const fs::path d = out / "lerobot_folder";
        io::SafeTensorsWriter model;
        add_unet(model, c, [](const std::string& n) { return "diffusion.unet." + n; }, DType::F32);
        io::SafeTensorsWriter state;
        const std::vector<float> mn = {-1.f, 0.f}, mx = {1.f, 512.f};
        state.add_f32("action.min", Shape{2}, mn);
        state.add_f32("action.max", Shape{2}, mx);
        const std::string cfg = lerobot_config(c).dump(1);
        write(d / "valid_postprocessor", joined({cfg, kProcessor.dump(), str(model.bytes()), str(state.bytes())}));
        // Legacy: min/max buffers inside model.safetensors, no postprocessor.
        io::SafeTensorsWriter legacy;
        add_unet(legacy, c, [](const std::string& n) { return "diffusion.unet." + n; }, DType::BF16);
        legacy.add_f32("unnormalize_outputs.buffer_action.min", Shape{2}, mn);
        legacy.add_f32("unnormalize_outputs.buffer_action.max", Shape{2}, mx);
        write(d / "valid_legacy_bf16", joined({cfg, "{}", str(legacy.bytes())}));
        // Malformed variants.
        auto bad = lerobot_config(c);
        bad["down_dims"] = {8, 12};
        write(d / "bad_down_dims", joined({bad.dump(), kProcessor.dump(), str(model.bytes()), str(state.bytes())}));
        bad = lerobot_config(c);
        bad["horizon"] = 6;
        write(d / "bad_horizon", joined({bad.dump(), kProcessor.dump(), str(model.bytes()), str(state.bytes())}));
        io::SafeTensorsWriter swapped;
        swapped.add_f32("action.min", Shape{2}, mx);
        swapped.add_f32("action.max", Shape{2}, mn);
        write(d / "min_above_max", joined({cfg, kProcessor.dump(), str(model.bytes()), str(swapped.bytes())}));
        write(d / "not_json", joined({"{\"type\": diffusion", "[", "", ""}));
    }

    // --- policy_folder: config | preprocessor json | normalizer state | model (fixtures dp_image_gn / dp_image_bn
    // with a tiny U-Net; the keypoints cut to 4 keep the model small) ---
    {
        const fs::path d = out / "policy_folder";
        const fs::path fx = FLOWEDGE_FIXTURES_DIR;
        // The fixture's config (in file order) with a tiny U-Net, and a model holding that U-Net.
        const auto tiny_policy = [&](const std::string& name) {
            auto cfg = nlohmann::ordered_json::parse(file_text(fx / name / "config.json"));
            cfg["down_dims"] = {8, 16};
            cfg["kernel_size"] = 3;
            cfg["n_groups"] = 4;
            cfg["diffusion_step_embed_dim"] = 8;
            cfg["num_train_timesteps"] = 20;
            cfg["spatial_softmax_num_keypoints"] = 4;
            int per_step = 0;
            for (const auto& [key, f] : cfg["input_features"].items())
                per_step += f["type"] == "VISUAL" ? 2 * 4 : f["shape"][0].get<int>();
            DiffusionConfig dc = tiny_config();
            dc.n_obs_steps = cfg["n_obs_steps"].get<int>();
            dc.horizon = cfg["horizon"].get<int>();
            dc.n_action_steps = cfg["n_action_steps"].get<int>();
            dc.action_dim = cfg["output_features"]["action"]["shape"][0].get<int>();
            dc.global_cond_dim = dc.n_obs_steps * per_step;
            return std::pair{cfg, dc};
        };
        const auto unet = [&](const DiffusionConfig& dc) {
            io::SafeTensorsWriter w;
            add_unet(w, dc, [](const std::string& n) { return "diffusion.unet." + n; }, DType::BF16);
            return w;
        };
        // The fixture's normalizer state with `replace` substituted (key -> shape and values).
        const auto stats = [&](const std::string& name, const std::vector<std::pair<std::string, std::pair<Shape, std::vector<float>>>>& replace) {
            const auto st = io::SafeTensors::open(fx / name / "policy_preprocessor_step_3_normalizer_processor.safetensors");
            io::SafeTensorsWriter w;
            for (const auto& t : st->tensors()) {
                auto r = std::find_if(replace.begin(), replace.end(), [&](const auto& kv) { return kv.first == t.name; });
                if (r == replace.end()) w.add_f32(t.name, t.shape, st->read_f32(t.name));
                else w.add_f32(t.name, r->second.first, r->second.second);
            }
            return str(w.bytes());
        };
        for (const std::string name : {"dp_image_gn", "dp_image_bn"}) {
            const auto [cfg, dc] = tiny_policy(name);
            const std::string pre = file_text(fx / name / "policy_preprocessor.json");
            const std::string model = str(unet(dc).bytes());
            write(d / (name + "_valid"), joined({cfg.dump(1), pre, stats(name, {}), model}));
        }
        const std::string gn = "dp_image_gn";
        const auto [cfg, dc] = tiny_policy(gn);
        const std::string pre = file_text(fx / gn / "policy_preprocessor.json");
        const std::string model = str(unet(dc).bytes());
        const std::string st = stats(gn, {});
        // Legacy form: no preprocessor; normalize_inputs.* and unnormalize_outputs.* buffers in model.safetensors.
        std::string legacy_model;
        {
            io::SafeTensorsWriter legacy = unet(dc);
            const std::vector<float> mean = {0.5f, 0.4f, 0.3f}, sd = {0.2f, 0.25f, 0.3f}, mn = {-1.f, 0.f}, mx = {1.f, 512.f};
            legacy.add_f32("normalize_inputs.buffer_observation_image.mean", Shape{3, 1, 1}, mean);
            legacy.add_f32("normalize_inputs.buffer_observation_image.std", Shape{3, 1, 1}, sd);
            legacy.add_f32("normalize_inputs.buffer_observation_state.min", Shape{2}, mn);
            legacy.add_f32("normalize_inputs.buffer_observation_state.max", Shape{2}, mx);
            legacy.add_f32("unnormalize_outputs.buffer_action.min", Shape{2}, mn);
            legacy.add_f32("unnormalize_outputs.buffer_action.max", Shape{2}, mx);
            legacy_model = str(legacy.bytes());
            write(d / "legacy_buffers", joined({cfg.dump(), "", "", legacy_model}));
        }
        auto bad = cfg;
        bad.erase("input_features");
        write(d / "no_input_features", joined({bad.dump(), pre, st, model}));
        bad = cfg;
        bad["input_features"]["observation.image"]["shape"] = {1, 40, 48};
        write(d / "camera_one_channel", joined({bad.dump(), pre, st, model}));
        bad = cfg;
        bad["crop_shape"] = {64, 40};
        write(d / "crop_too_large", joined({bad.dump(), pre, st, model}));
        auto bad_pre = nlohmann::ordered_json::parse(pre);
        bad_pre["steps"][3]["config"]["norm_map"]["VISUAL"] = "MEAN_STDDEV";
        write(d / "bad_norm_mode", joined({cfg.dump(), bad_pre.dump(), st, model}));
        bad_pre = nlohmann::ordered_json::parse(pre);
        bad_pre["steps"][3]["config"]["norm_map"]["STATE"] = "QUANTILES";  // the state has no q01/q99
        write(d / "quantiles_missing", joined({cfg.dump(), bad_pre.dump(), st, model}));
        // The preprocessor names a state file that is not there (the action range comes from the legacy buffers).
        write(d / "state_file_missing", joined({cfg.dump(), pre, "", legacy_model}));
        write(d / "stats_wrong_size", joined({cfg.dump(), pre, stats(gn, {{"observation.state.min", {Shape{3}, {0.f, 0.f, 0.f}}}}), model}));
        // std 0 divides by eps (accepted); std -eps divides by zero (rejected).
        write(d / "zero_std", joined({cfg.dump(), pre, stats(gn, {{"observation.image.std", {Shape{3, 1, 1}, {0.f, 0.f, 0.f}}}}), model}));
        write(d / "std_minus_eps",
              joined({cfg.dump(), pre, stats(gn, {{"observation.image.std", {Shape{3, 1, 1}, {0.1f, -1e-8f, 0.1f}}}}), model}));
        // eps beyond float's range (a double-to-float conversion that is undefined), and statistics whose max - min
        // overflows to inf.
        bad_pre = nlohmann::ordered_json::parse(pre);
        bad_pre["steps"][3]["config"]["eps"] = 1e300;
        write(d / "eps_out_of_range", joined({cfg.dump(), bad_pre.dump(), st, model}));
        write(d / "range_overflows",
              joined({cfg.dump(), pre, stats(gn, {{"observation.state.min", {Shape{2}, {-3e38f, 0.f}}}, {"observation.state.max", {Shape{2}, {3e38f, 1.f}}}}), model}));
        // Reproducers of deep nesting (a stack overflow in nlohmann's recursive copies): 60000 levels in config.json and
        // in the preprocessor's norm_map. The model holds only the tensors the head reader checks, plus the action range.
        {
            io::SafeTensorsWriter checked;
            const auto zeros = [](std::size_t n) { return std::vector<float>(n, 0.f); };
            checked.add_f32("diffusion.unet.diffusion_step_encoder.1.weight", Shape{32, 8}, zeros(32 * 8));
            checked.add_f32("diffusion.unet.down_modules.0.0.cond_encoder.1.weight", Shape{16, 8 + dc.global_cond_dim},
                            zeros(std::size_t(16 * (8 + dc.global_cond_dim))));
            checked.add_f32("diffusion.unet.final_conv.1.weight", Shape{2, 8, 1}, zeros(16));
            checked.add_f32("unnormalize_outputs.buffer_action.min", Shape{2}, std::vector<float>{-1.f, -1.f});
            checked.add_f32("unnormalize_outputs.buffer_action.max", Shape{2}, std::vector<float>{1.f, 1.f});
            const std::string nest = std::string(60000, '[') + std::string(60000, ']');
            const std::string deep_cfg = "{\"deep\": " + nest + ", " + cfg.dump().substr(1);
            write(d / "deep_nesting_config", joined({deep_cfg, "", "", str(checked.bytes())}));
            bad_pre = nlohmann::ordered_json::parse(pre);
            bad_pre["steps"][3]["config"]["norm_map"]["deep"] = nlohmann::ordered_json::array();
            std::string deep_pre = bad_pre.dump();
            const std::string empty_deep = "\"deep\":[]";
            deep_pre.replace(deep_pre.find(empty_deep), empty_deep.size(), "\"deep\":" + nest);
            write(d / "deep_nesting_norm_map", joined({cfg.dump(), deep_pre, "", str(checked.bytes())}));
        }
        write(d / "min_equals_max", joined({cfg.dump(), pre, stats(gn, {{"observation.state.min", {Shape{2}, {-1.f, 0.f}}}, {"observation.state.max", {Shape{2}, {-1.f, 0.f}}}}), model}));
    }

    // --- compact ---
    {
        const fs::path d = out / "compact";
        auto compact = [&](const DiffusionConfig& cc, DType dtype, std::array<float, io::kDiffusionMetaSize> meta,
                           std::vector<float> mn, std::vector<float> mx) {
            io::SafeTensorsWriter w;
            add_unet(w, cc, [](const std::string& n) { return io::diffusion_compact_name(n); }, dtype);
            std::vector<float> dims(cc.down_dims.begin(), cc.down_dims.end());
            w.add_f32("dp.action_min", Shape{std::int64_t(mn.size())}, mn);
            w.add_f32("dp.action_max", Shape{std::int64_t(mx.size())}, mx);
            w.add_f32("dp.dims", Shape{std::int64_t(dims.size())}, dims);
            w.add_f32("dp.meta", Shape{io::kDiffusionMetaSize}, meta);
            return str(w.bytes());
        };
        const std::vector<float> mn = {-1.f, 0.f}, mx = {1.f, 512.f};
        write(d / "valid_f32", compact(c, DType::F32, io::diffusion_meta(c), mn, mx));
        write(d / "valid_f16", compact(c, DType::F16, io::diffusion_meta(c), mn, mx));
        DiffusionConfig one = c;
        one.down_dims = {8};
        one.horizon = 3;
        one.n_action_steps = 2;
        one.kernel_size = 1;
        write(d / "valid_one_stage", compact(one, DType::BF16, io::diffusion_meta(one), mn, mx));
        auto meta = io::diffusion_meta(c);
        meta[0] = 2.f;
        write(d / "bad_schema", compact(c, DType::F32, meta, mn, mx));
        meta = io::diffusion_meta(c);
        meta[2] = 7.f;
        write(d / "bad_horizon", compact(c, DType::F32, meta, mn, mx));
        meta = io::diffusion_meta(c);
        meta[6] = 3.f;
        write(d / "stages_mismatch", compact(c, DType::F32, meta, mn, mx));
        write(d / "min_above_max", compact(c, DType::F32, io::diffusion_meta(c), mx, mn));
    }

    // --- mamba_state: mode byte, then a whole state (mode 0) or a payload (mode 1) ---
    {
        const fs::path d = out / "mamba_state";
        auto m = Mamba<Cpu>::load(FLOWEDGE_FIXTURES_DIR "/mamba_flow/mamba_flow_backbone_only.safetensors", {}, 8);
        std::vector<float> h(std::size_t(m.config().d_model));
        const std::vector<std::int32_t> toks = {1, 2, 3, 4};
        std::vector<float> hid(toks.size() * h.size());
        m.prefill(toks, hid);
        const std::vector<std::byte> s = m.export_state();
        write(d / "valid_state", std::string(1, '\0') + str(s));
        write(d / "header_only", std::string(1, '\0') + str(std::vector<std::byte>(s.begin(), s.begin() + 80)));
        std::vector<std::byte> corrupt = s;
        corrupt[200] ^= std::byte{1};
        write(d / "bad_checksum", std::string(1, '\0') + str(corrupt));
        write(d / "payload_small", std::string(1, '\1') + str(std::vector<std::byte>(s.begin() + 80, s.begin() + 80 + 512)));
        std::vector<float> big(64, 3.0e38f);
        write(d / "payload_huge_values", std::string(1, '\1') + std::string(reinterpret_cast<const char*>(big.data()), big.size() * 4));
        write(d / "bad_magic", std::string(1, '\0') + "NOTMAMBA" + std::string(72, '\0'));
    }
    // --- npz: archives as np.savez / np.savez_compressed / a write-only stream make them, and damaged ones ---
    {
        const fs::path d = out / "npz";
        io::NpzWriter w;
        const auto a = values(6, 3, 1.f);
        const std::vector<std::uint8_t> img = {0, 1, 2, 3, 250, 251, 252, 253, 254, 255, 128, 64};
        const std::vector<std::int32_t> ids = {-1, 2};
        w.add_f32("observation.state", std::vector<std::int64_t>{2, 3}, a);
        w.add_u8("observation.image", std::vector<std::int64_t>{1, 2, 2, 3}, img);
        w.add_i32("ids", std::vector<std::int64_t>{2}, ids);
        const std::vector<std::byte> good = w.bytes();
        write(d / "valid_three", str(good));
        write(d / "valid_zip64_end", str(with_zip64_end(good)));
        for (const char* f : {"obs_stored", "obs_deflate", "obs_stream"})
            write(d / (std::string("numpy_") + f), file_text(fs::path(FLOWEDGE_FIXTURES_DIR) / "io" / (std::string(f) + ".npz")));
        std::vector<std::byte> bad_crc = good;
        bad_crc[30 + 21 + 130] ^= std::byte{0x10};  // a value of observation.state (after its local header and .npy header)
        write(d / "bad_crc", str(bad_crc));
        write(d / "truncated", str(std::vector<std::byte>(good.begin(), good.begin() + std::ptrdiff_t(good.size() / 2))));
        io::NpzWriter other;
        const std::string f8 = "\x93NUMPY\x01\x00\x3f\x00{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }     \n" +
                               std::string(8, '\0');
        other.add({"f64", std::vector<std::byte>(reinterpret_cast<const std::byte*>(f8.data()),
                                                 reinterpret_cast<const std::byte*>(f8.data()) + f8.size())});
        write(d / "valid_f64_member", str(other.bytes()));
    }
    std::printf("seeds written under %s\n", out.c_str());
    return 0;
}
