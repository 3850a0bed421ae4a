// Writes a Diffusion Policy checkpoint (LeRobot folder or compact file) in the compact *.flowedge.safetensors form.
#pragma once
#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "flowedge/dtype.hpp"
#include "flowedge/io/safetensors.hpp"
#include "flowedge/models/diffusion/lerobot_checkpoint.hpp"
#include "flowedge/models/diffusion/unet.hpp"
#include "flowedge/parameter.hpp"

namespace flowedge {

/// Writes checkpoint `src` (LeRobot folder or compact file) as a compact *.flowedge.safetensors file (docs/formats.md#compact-form) at `dst`:
/// conv/linear weights stored as `dtype` (round-to-nearest-even), biases and norm parameters as F32.
inline void export_diffusion_compact(const std::filesystem::path& src, const std::filesystem::path& dst, DType dtype = DType::F32) {
    const io::DiffusionCheckpoint ck = io::open_diffusion_checkpoint(src);
    ConditionalUnet1d<Cpu> skeleton(ck.config);
    io::SafeTensorsWriter out;
    std::vector<std::byte> buf;
    skeleton.visit_parameters([&](const std::string& name, Parameter<Cpu>&, const Shape& shape, Storage st) {
        const io::TensorInfo& t = ck.tensor(name);
        if (!(t.shape == shape))
            fail(ErrorKind::BadFile, "lerobot", ck.source.string() + ": tensor '" + ck.key(name) + "' has the wrong shape" + expected_got(shape.str(), t.shape.str()));
        const DType want = st == Storage::Vector ? DType::F32 : dtype;
        const std::size_t n = std::size_t(shape.numel());
        buf.resize(n * dtype_size(want));
        Parameter<Cpu>::convert(t.data, t.dtype, buf.data(), want, n);
        out.add(io::diffusion_compact_name(name), want, shape, buf.data());
    });
    const auto meta = io::diffusion_meta(ck.config);
    std::vector<float> dims(ck.config.down_dims.begin(), ck.config.down_dims.end());
    out.add("dp.action_min", DType::F32, Shape{ck.config.action_dim}, ck.action_min.data());
    out.add("dp.action_max", DType::F32, Shape{ck.config.action_dim}, ck.action_max.data());
    out.add("dp.dims", DType::F32, Shape{std::int64_t(dims.size())}, dims.data());
    out.add("dp.meta", DType::F32, Shape{io::kDiffusionMetaSize}, meta.data());
    out.write(dst);
}

}  // namespace flowedge
