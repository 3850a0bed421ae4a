// The one compiled copy of the CPU ACT policy and its transformer layers for the test suite (declared in
// cpu_models_act.hpp).
#include "cpu_models_act.hpp"

template class flowedge::ActEncoderLayer<flowedge::Cpu>;
template class flowedge::ActDecoderLayer<flowedge::Cpu>;
template class flowedge::ActPolicy<flowedge::Cpu>;
