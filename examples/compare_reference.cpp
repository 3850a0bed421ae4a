// flowedge-compare-reference: runs a LeRobot Diffusion Policy checkpoint through DiffusionHead and compares it with
// the float32 references tools/make_reference_diffusion.py wrote (docs/numerics.md#whole-head-tolerances); prints a table, optionally JSON.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <flowedge/io/npy.hpp>
#include <flowedge/models/diffusion/head.hpp>

using namespace flowedge;
namespace fs = std::filesystem;

namespace {

/// One comparison: max abs error in normalised units (action rows: |d| / ((max - min) / 2)).
struct Row {
    std::string name;
    std::string what;
    double max_abs_norm = 0;   ///< the number held to the bound
    double max_abs_raw = 0;    ///< plain max |d| in the array's own units
    double bound = 0;
    double ms = 0;             ///< flowedge time for this check (load excluded)
    bool pass() const { return max_abs_norm < bound; }
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

std::vector<float> read_ref(const fs::path& dir, const std::string& name, const std::vector<std::int64_t>& shape) {
    io::NpyArrayF32 a = io::read_npy_f32(dir / (name + ".npy"));
    if (a.shape != shape) {
        std::string want, got;
        for (auto d : shape) want += std::to_string(d) + " ";
        for (auto d : a.shape) got += std::to_string(d) + " ";
        fail("compare_reference", name + ".npy has the wrong shape" + expected_got(want, got));
    }
    return std::move(a.data);
}

/// Fills r.max_abs_raw and r.max_abs_norm; `half` ([A], or empty for normalised arrays) scales action errors.
void measure(Row& r, const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& half) {
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double d = std::fabs(double(got[i]) - double(want[i]));
        r.max_abs_raw = std::max(r.max_abs_raw, d);
        r.max_abs_norm = std::max(r.max_abs_norm, half.empty() ? d : d / half[i % half.size()]);
    }
}

}  // namespace

int main(int argc, char** argv) try {
    CLI::App app{"Compare a LeRobot Diffusion Policy checkpoint, run by flowedge, with LeRobot's float32 references"};
    app.option_defaults()->always_capture_default();
    std::string model, refdir, json_out, dtype = "f32";
    app.add_option("MODEL_DIR", model, "LeRobot pretrained_model folder (or compact *.flowedge.safetensors)")->required();
    app.add_option("REF_DIR", refdir, "reference folder with refs.json and *.npy (tools/make_reference_diffusion.py)")->required();
    app.add_option("--json", json_out, "write the results as JSON here");
    app.add_option("--dtype", dtype, "weight dtype: f32 (parity bounds, docs/numerics.md#whole-head-tolerances) or bf16 (stated bound 3e-2, not a parity bound)")
        ->check(CLI::IsMember({"f32", "bf16"}));
    CLI11_PARSE(app, argc, argv);

    const fs::path ref(refdir);
    std::ifstream jf(ref / "refs.json");
    if (!jf) fail("compare_reference", "cannot open " + (ref / "refs.json").string());
    const nlohmann::json refs = nlohmann::json::parse(jf);
    const int B = refs.at("batch").get<int>(), G = refs.at("global_cond_dim").get<int>();
    const int H = refs.at("config").at("horizon").get<int>(), A = refs.at("config").at("action_dim").get<int>();
    const int N = refs.at("config").at("n_action_steps").get<int>();
    const std::uint64_t seed = refs.at("seeds").at("ddpm_splitmix").get<std::uint64_t>();
    const auto& files = refs.at("files");

    const bool bf16 = dtype == "bf16";
    const double eps_bound = bf16 ? 3e-2 : 3e-4, ddim_bound = bf16 ? 3e-2 : 6e-4, ddpm_bound = bf16 ? 3e-2 : 8e-4;

    auto t0 = Clock::now();
    LoadOptions opts;
    if (bf16) opts.weight_dtype = DType::BF16;
    auto head = DiffusionHead<Cpu>::load(model, opts, B);
    const double load_ms = ms_since(t0);
    const DiffusionConfig& c = head.config();
    if (c.horizon != H || c.action_dim != A || c.global_cond_dim != G || c.n_action_steps != N)
        fail("compare_reference", "checkpoint and references disagree on horizon/action_dim/global_cond_dim/n_action_steps" +
                                      expected_got(std::to_string(H) + "/" + std::to_string(A) + "/" + std::to_string(G) + "/" + std::to_string(N),
                                                   std::to_string(c.horizon) + "/" + std::to_string(c.action_dim) + "/" +
                                                       std::to_string(c.global_cond_dim) + "/" + std::to_string(c.n_action_steps)));
    if (head.n_parameters() != refs.at("unet_parameters").get<std::int64_t>())
        fail("compare_reference", "U-Net parameter count differs from refs.json" +
                                      expected_got(refs.at("unet_parameters").get<std::int64_t>(), head.n_parameters()));
    std::vector<double> half(static_cast<std::size_t>(A));
    const auto amin = refs.at("action_min").get<std::vector<float>>(), amax = refs.at("action_max").get<std::vector<float>>();
    for (int a = 0; a < A; ++a) {
        if (head.action_min()[std::size_t(a)] != amin[std::size_t(a)] || head.action_max()[std::size_t(a)] != amax[std::size_t(a)])
            fail("compare_reference", "action range differs from refs.json for dimension " + std::to_string(a));
        half[std::size_t(a)] = (double(amax[std::size_t(a)]) - double(amin[std::size_t(a)])) / 2.0;
    }

    const std::vector<std::int64_t> bha{B, H, A};
    const std::vector<float> cond = read_ref(ref, "cond", {B, G}), noise = read_ref(ref, "noise", bha);
    std::vector<float> y(std::size_t(B) * H * A);
    std::vector<Row> rows;

    for (int t : {99, 50, 0}) {
        Row r{"eps_t" + std::to_string(t), "U-Net epsilon at t=" + std::to_string(t), 0, 0, eps_bound, 0};
        t0 = Clock::now();
        head.denoise(cond, noise, t, y, B);
        r.ms = ms_since(t0);
        measure(r, y, read_ref(ref, r.name, bha), {});
        rows.push_back(r);
    }
    struct Run { const char* tag; Scheduler s; int steps; double bound; };
    for (const Run& run : {Run{"ddim10", Scheduler::Ddim, 10, ddim_bound}, Run{"ddpm100", Scheduler::Ddpm, 100, ddpm_bound},
                           Run{"ddpm10", Scheduler::Ddpm, 10, ddpm_bound}}) {
        const SampleOptions o{.steps = run.steps, .scheduler = run.s, .seed = seed};
        const std::string label = std::to_string(run.steps) + "-step " + (run.s == Scheduler::Ddim ? "DDIM" : "DDPM seed " + std::to_string(seed));
        Row rn{std::string(run.tag) + "_norm", label + ", normalised", 0, 0, run.bound, 0};
        t0 = Clock::now();
        head.sample_normalized(cond, noise, y, o, B);
        rn.ms = ms_since(t0);
        measure(rn, y, read_ref(ref, rn.name, bha), {});
        rows.push_back(rn);
        Row ra{std::string(run.tag) + "_action", label + ", un-normalised (err / ((max-min)/2))", 0, 0, run.bound, 0};
        t0 = Clock::now();
        head.sample(cond, noise, y, o, B);
        ra.ms = ms_since(t0);
        measure(ra, y, read_ref(ref, ra.name, bha), half);
        rows.push_back(ra);
    }
    if (files.contains("obs_cond.npy")) {
        // LeRobot built obs_cond from raw observations (its preprocessor + encoder); flowedge runs the head from there.
        const std::vector<float> oc = read_ref(ref, "obs_cond", {B, G});
        std::vector<float> exec(std::size_t(B) * N * A);
        for (bool un : {false, true}) {
            Row r{un ? "obs_ddim10_executed_action" : "obs_ddim10_executed_norm",
                  std::string("obs_cond, 10-step DDIM, executed rows") + (un ? ", un-normalised" : ", normalised"), 0, 0, ddim_bound, 0};
            t0 = Clock::now();
            if (un) head.sample(oc, noise, y, {.steps = 10, .scheduler = Scheduler::Ddim}, B);
            else head.sample_normalized(oc, noise, y, {.steps = 10, .scheduler = Scheduler::Ddim}, B);
            head.executed_actions(y, exec, B);
            r.ms = ms_since(t0);
            measure(r, exec, read_ref(ref, r.name, {B, N, A}), un ? half : std::vector<double>{});
            rows.push_back(r);
        }
    }

    bool all = true;
    std::printf("flowedge vs LeRobot %s references: %s (%s weights, batch %d, U-Net %lld parameters, load %.0f ms)\n",
                refs.at("versions").value("lerobot", "?").c_str(), model.c_str(), dtype.c_str(), B,
                static_cast<long long>(head.n_parameters()), load_ms);
    std::printf("| %-28s | %-13s | %-13s | %-8s | %-4s | %10s |\n", "check", "max abs (norm)", "max abs (raw)", "bound", "ok", "ms");
    std::printf("|%s|%s|%s|%s|%s|%s|\n", std::string(30, '-').c_str(), std::string(16, '-').c_str(), std::string(15, '-').c_str(),
                std::string(10, '-').c_str(), std::string(6, '-').c_str(), std::string(12, '-').c_str());
    for (const Row& r : rows) {
        all = all && r.pass();
        std::printf("| %-28s | %14.3e | %13.3e | %8.0e | %-4s | %10.1f |\n", r.name.c_str(), r.max_abs_norm, r.max_abs_raw, r.bound,
                    r.pass() ? "yes" : "NO", r.ms);
    }
    std::printf("%s\n", all ? "all checks within bounds" : "SOME CHECKS EXCEED THEIR BOUND");

    if (!json_out.empty()) {
        nlohmann::json j;
        j["model"] = model;
        j["ref_dir"] = refdir;
        j["weights"] = dtype;
        j["bounds_source"] = bf16 ? "stated BF16 bound (not a parity bound)" : "docs/numerics.md#whole-head-tolerances (max abs, normalised units)";
        j["reference_versions"] = refs.at("versions");
        j["batch"] = B;
        j["unet_parameters"] = head.n_parameters();
        j["load_ms"] = load_ms;
        j["all_pass"] = all;
        for (const Row& r : rows)
            j["checks"].push_back({{"name", r.name}, {"what", r.what}, {"max_abs_norm", r.max_abs_norm}, {"max_abs_raw", r.max_abs_raw},
                                   {"bound", r.bound}, {"pass", r.pass()}, {"ms", r.ms}});
        std::ofstream o(json_out);
        if (!o) fail("compare_reference", "cannot write " + json_out);
        o << j.dump(1) << "\n";
    }
    return all ? 0 : 1;
} catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
}
