// flowedge-convert: turns a LeRobot Diffusion Policy pretrained_model folder (or a compact file) into the compact
// *.flowedge.safetensors form, optionally storing the conv/linear weights as BF16 or F16.
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include <flowedge/models/diffusion/export.hpp>
#include <flowedge/models/diffusion/head.hpp>

using namespace flowedge;

int main(int argc, char** argv) {
    CLI::App app{"Convert a LeRobot Diffusion Policy checkpoint (pretrained_model folder with config.json, model.safetensors,\n"
                 "policy_postprocessor*) to the compact *.flowedge.safetensors form (docs/formats.md#compact-form)."};
    app.option_defaults()->always_capture_default();
    std::string src, dst, dtype_arg = "f32";
    app.add_option("SRC", src, "LeRobot pretrained_model folder, its model.safetensors, or a compact file")->required();
    app.add_option("DST", dst, "output *.flowedge.safetensors")->required();
    app.add_option("--dtype", dtype_arg, "weight storage: f32 | bf16 | f16 (biases and norms stay f32)")
        ->transform(CLI::IsMember({"f32", "bf16", "f16"}, CLI::ignore_case));
    CLI11_PARSE(app, argc, argv);
    try {
        const DType dtype = dtype_arg == "bf16" ? DType::BF16 : dtype_arg == "f16" ? DType::F16 : DType::F32;
        export_diffusion_compact(src, dst, dtype);
        const auto ck = io::open_diffusion_checkpoint(dst);  // re-open: validates what was written
        std::cout << "wrote " << dst << " (" << dtype_name(dtype) << " weights; action_dim " << ck.config.action_dim << ", horizon "
                  << ck.config.horizon << ", global_cond_dim " << ck.config.global_cond_dim << ", " << ck.config.stages() << " stages)\n";
        return 0;
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
}
