// Forwarding header: check_linear_batch now lives in op_checks.hpp with the checks of every other op. Delete this
// file once cpu/ops.hpp and kernels/cuda/linear.cu include op_checks.hpp (and call check_args) instead.
#pragma once
#include "flowedge/op_checks.hpp"
