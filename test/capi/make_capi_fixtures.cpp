// Writes the derived checkpoints the C API test needs: head-only and backbone-only splits of a mamba_flow file,
// the compact export of a diffusion checkpoint, or (without a committed one) a tiny LeRobot folder plus its export.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include <flowedge/models/diffusion/export.hpp>
#include <flowedge/models/diffusion/head.hpp>
#include <flowedge/models/mamba_flow/policy.hpp>
#include "../support/cpu_models_diffusion_head.hpp"
#include "../support/cpu_models_mamba_flow.hpp"

#include "../diffusion/diffusion_reference.hpp"

using namespace flowedge;

namespace {

/// Copies the tensors `names` (full file keys) of `src` into a new file `dst`.
template <class Names>
void copy_tensors(const io::SafeTensors& src, const Names& names, const std::filesystem::path& dst) {
    io::SafeTensorsWriter out;
    for (const std::string& key : names) {
        const io::TensorInfo* t = src.find(key);
        if (!t) fail("make_capi_fixtures", "missing tensor '" + key + "'");
        out.add(key, t->dtype, t->shape, t->data);
    }
    out.write(dst);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3 && argc != 4) {
        std::cerr << "usage: make_capi_fixtures MAMBA_FLOW.safetensors OUT_DIR [write-diffusion | DIFFUSION_CHECKPOINT]\n";
        return 2;
    }
    try {
        const std::filesystem::path mamba_path = argv[1], out = argv[2];
        std::filesystem::create_directories(out);
        auto file = io::SafeTensors::open(mamba_path);
        auto backbone = Mamba<Cpu>::load(file, {}, 4);
        auto head = FlowHead<Cpu>::load(file, {}, 1);
        const std::string prefix = Mamba<Cpu>::find_prefix(*file).value();
        std::vector<std::string> bb, fl;
        backbone.visit_parameters([&](const std::string& n, Parameter<Cpu>&, const Shape&, Storage) { bb.push_back(prefix + n); });
        head.visit_parameters([&](const std::string& n, Parameter<Cpu>&, const Shape&, Storage) { fl.push_back("flow." + n); });
        copy_tensors(*file, bb, out / "backbone_only.safetensors");
        copy_tensors(*file, fl, out / "head_only.safetensors");

        if (argc == 4 && std::string(argv[3]) != "write-diffusion") {
            // Compact export of an existing diffusion checkpoint (folder or file).
            const std::filesystem::path src = argv[3];
            export_diffusion_compact(src, out / (src.filename().string() + ".flowedge.safetensors"));
        } else if (argc == 4) {
            DiffusionConfig c = dref::tiny_config();
            c.horizon = 8;
            c.n_action_steps = 4;
            const dref::Weights w = dref::random_weights(c, 20240611);
            const std::vector<float> mn{-1.5f, 10.f}, mx{2.5f, 30.f};
            const auto folder = out / "diffusion_small";
            dref::write_lerobot_folder(folder, c, w, mn, mx, [](nlohmann::json&) {});
            export_diffusion_compact(folder, out / "diffusion_small.flowedge.safetensors");
        }
        std::cout << "wrote fixtures to " << out.string() << "\n";
        return 0;
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
}
