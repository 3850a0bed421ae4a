// With FLOWEDGE_TEST_SHARED_MODELS (the asan preset) ACT on the CPU backend is compiled once for the test suite
// (cpu_models_act.cpp in flowedge_test_cpu_models): a test that includes this header links that instance instead of
// compiling its own copy of every member and the CPU kernels behind them.
#pragma once
#include <flowedge/models/act/policy.hpp>

#ifdef FLOWEDGE_TEST_SHARED_MODELS
extern template class flowedge::ActEncoderLayer<flowedge::Cpu>;
extern template class flowedge::ActDecoderLayer<flowedge::Cpu>;
extern template class flowedge::ActPolicy<flowedge::Cpu>;
#endif
