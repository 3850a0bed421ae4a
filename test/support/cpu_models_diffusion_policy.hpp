// With FLOWEDGE_TEST_SHARED_MODELS (the asan preset) the whole Diffusion Policy (RGB encoder, queues, processors, head)
// on the CPU backend is compiled once for the test suite (cpu_models_diffusion_policy.cpp and
// cpu_models_diffusion_head.cpp in flowedge_test_cpu_models); see cpu_models_diffusion_head.hpp.
#pragma once
#include <flowedge/models/diffusion/policy.hpp>

#include "cpu_models_diffusion_head.hpp"

#ifdef FLOWEDGE_TEST_SHARED_MODELS
extern template class flowedge::DiffusionRgbEncoder<flowedge::Cpu>;
extern template class flowedge::DiffusionPolicy<flowedge::Cpu>;
#endif
