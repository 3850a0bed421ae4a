// With FLOWEDGE_TEST_SHARED_MODELS (the asan preset) the Mamba + flow models on the CPU backend are compiled once for
// the test suite (cpu_models_mamba_flow.cpp in flowedge_test_cpu_models): a test that includes this header links those
// instances instead of compiling its own copy of every member and the CPU kernels behind them (test/CMakeLists.txt).
#pragma once
#include <flowedge/models/mamba_flow/policy.hpp>

#ifdef FLOWEDGE_TEST_SHARED_MODELS
extern template class flowedge::Mamba<flowedge::Cpu>;
extern template class flowedge::FlowHead<flowedge::Cpu>;
extern template class flowedge::MambaFlowPolicy<flowedge::Cpu>;
#endif
