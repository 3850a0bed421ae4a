// mamba_forward: run the Mamba backbone of a checkpoint over the given token ids and summarise the hidden states.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <vector>

#include <CLI/CLI.hpp>

#include <flowedge/models/mamba_flow/mamba.hpp>
#include <flowedge/residency.hpp>

using namespace flowedge;

int main(int argc, char** argv) {
    CLI::App app{"Prefill the Mamba backbone with token ids (e.g. 1 2 3 4).\n"
                 "Prints out[0] = the first element of the LAST token's final hidden state (after norm_f), then\n"
                 "L, d_model and min/max/mean/L2 over the whole hidden state [L, d_model]."};
    app.option_defaults()->always_capture_default();
    std::string model, device_arg = "cpu";
    std::vector<std::int64_t> tokens;
    app.add_option("MODEL", model, "safetensors file with backbone.* tensors")->required();
    app.add_option("TOKENS", tokens, "token ids in [0, vocab)")->required();
    app.add_option("--device", device_arg, "cpu | cuda (cuda fails unless the model is resident on the GPU)")
        ->transform(CLI::IsMember({"cpu", "cuda"}, CLI::ignore_case));
    CLI11_PARSE(app, argc, argv);

    try {
        const Device device = parse_device(device_arg);
        if (device == Device::Cuda && !backend_available_v<Cuda>) {
            std::cerr << "flowedge: mamba_forward: this build has no CUDA backend (configure with -DFLOWEDGE_BACKEND=cuda); "
                         "use --device cpu\n";
            return 2;
        }
        std::vector<std::int32_t> ids;
        for (auto t : tokens) {
            if (t < std::numeric_limits<std::int32_t>::min() || t > std::numeric_limits<std::int32_t>::max())
                fail("mamba_forward", "token id does not fit in int32" + expected_got("int32", std::to_string(t)));
            ids.push_back(std::int32_t(t));
        }
        const int max_tokens = std::max<int>(1, int(ids.size()));
        auto resident = Resident<Mamba>::load(device, ResidencyFlags::from_env(), [&](auto tag) {
            return Mamba<decltype(tag)>::load(model, {}, max_tokens);
        });
        try {
            resident.require(device, "mamba_forward");
        } catch (const Error& e) {
            std::cerr << e.what() << "\n";
            return 2;
        }
        return resident.visit([&](auto& m) {
            const int dm = m.config().d_model;
            std::vector<float> hidden(ids.size() * std::size_t(dm));
            m.prefill(ids, hidden);
            double mn = hidden[0], mx = hidden[0], sum = 0, sq = 0;
            for (float v : hidden) {
                mn = std::min(mn, double(v));
                mx = std::max(mx, double(v));
                sum += v;
                sq += double(v) * v;
            }
            std::cout << "out[0]=" << hidden[(ids.size() - 1) * std::size_t(dm)]
                      << "  (first value of the last token's final hidden state, after norm_f)\n";
            std::cout << "L=" << ids.size() << "  d_model=" << dm << "  min=" << mn << "  max=" << mx
                      << "  mean=" << sum / double(hidden.size()) << "  l2=" << std::sqrt(sq) << "  device=" << resident.backend()
                      << "\n";
            return 0;
        });
    } catch (const std::exception& e) {
        std::cerr << e.what() << "\n";
        return 1;
    }
}
