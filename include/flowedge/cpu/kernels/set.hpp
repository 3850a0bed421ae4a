// One kernel set: every op body, in dependency order. Included once per instruction set by cpu/kernels.hpp (inside
// that set's namespace and target region), never on its own.
#include "flowedge/cpu/kernels/common.hpp"
#include "flowedge/cpu/kernels/gemm.hpp"
#include "flowedge/cpu/kernels/packed_conv.hpp"
#include "flowedge/cpu/kernels/packed_linear.hpp"
#include "flowedge/cpu/kernels/conv1d.hpp"
#include "flowedge/cpu/kernels/conv_transpose1d.hpp"
#include "flowedge/cpu/kernels/linear.hpp"
#include "flowedge/cpu/kernels/norm.hpp"
#include "flowedge/cpu/kernels/mamba.hpp"
#include "flowedge/cpu/kernels/elementwise.hpp"
