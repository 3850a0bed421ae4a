// With FLOWEDGE_TEST_SHARED_MODELS (the asan preset) the Diffusion Policy head (U-Net + sampler) on the CPU backend is
// compiled once for the test suite (cpu_models_diffusion_head.cpp in flowedge_test_cpu_models): a test that includes
// this header links that instance instead of compiling its own copy of every member and the CPU kernels behind them.
#pragma once
#include <flowedge/models/diffusion/head.hpp>

#ifdef FLOWEDGE_TEST_SHARED_MODELS
extern template class flowedge::ConditionalUnet1d<flowedge::Cpu>;
extern template class flowedge::DiffusionHead<flowedge::Cpu>;
#endif
