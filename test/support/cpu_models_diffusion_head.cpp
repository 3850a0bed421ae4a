// The one compiled copy of the CPU Diffusion Policy head for the test suite (declared in
// cpu_models_diffusion_head.hpp).
#include "cpu_models_diffusion_head.hpp"

template class flowedge::ConditionalUnet1d<flowedge::Cpu>;
template class flowedge::DiffusionHead<flowedge::Cpu>;
