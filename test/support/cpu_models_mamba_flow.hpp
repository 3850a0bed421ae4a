// The Mamba + flow models on the CPU backend are compiled once for the whole test suite (cpu_models_mamba_flow.cpp in
// flowedge_test_cpu_models): a test that includes this header links those instances instead of compiling its own
// copy of every member and the CPU kernels behind them (bench/results/ci_build_cost.md has the cost per TU).
#pragma once
#include <flowedge/models/mamba_flow/policy.hpp>

extern template class flowedge::Mamba<flowedge::Cpu>;
extern template class flowedge::FlowHead<flowedge::Cpu>;
extern template class flowedge::MambaFlowPolicy<flowedge::Cpu>;
