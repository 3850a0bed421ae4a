// The CPU ops (Ops<Cpu> and the kernels behind them) compiled once, with the fuzz targets' flags, for every target
// that runs a model; those targets see FLOWEDGE_CPU_OPS_EXTERN (cpu/ops.hpp) and call this copy.
#include "flowedge/ops.hpp"

template struct flowedge::Ops<flowedge::Cpu>;
