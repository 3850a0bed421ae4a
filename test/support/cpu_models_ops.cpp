// The one compiled copy of every CPU op (Ops<Cpu>, and the kernels of every set behind them) for the test suite and
// the fuzz targets that run a model: their other TUs see FLOWEDGE_CPU_OPS_EXTERN (flowedge_test_cpu_models' public
// definition; fuzz/CMakeLists.txt) and call these.
#include "flowedge/ops.hpp"

template struct flowedge::Ops<flowedge::Cpu>;
