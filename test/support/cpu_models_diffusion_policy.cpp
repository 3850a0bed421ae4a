// The one compiled copy of the CPU Diffusion Policy and its RGB encoder for the test suite (declared in
// cpu_models_diffusion_policy.hpp; the head's copy is cpu_models_diffusion_head.cpp).
#include "cpu_models_diffusion_policy.hpp"

template class flowedge::DiffusionRgbEncoder<flowedge::Cpu>;
template class flowedge::DiffusionPolicy<flowedge::Cpu>;
