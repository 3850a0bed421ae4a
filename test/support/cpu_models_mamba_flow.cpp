// The one compiled copy of the CPU Mamba + flow models for the test suite (declared in cpu_models_mamba_flow.hpp).
#include "cpu_models_mamba_flow.hpp"

template class flowedge::Mamba<flowedge::Cpu>;
template class flowedge::FlowHead<flowedge::Cpu>;
template class flowedge::MambaFlowPolicy<flowedge::Cpu>;
