#!/usr/bin/env bash
# aarch64 under emulation (CI stage): cross-compiles the CPU library's reduced test set and the Mamba-flow / Diffusion
# Policy demo programs for 64-bit ARM Linux (preset aarch64: g++-aarch64-linux-gnu, -O2, no CUDA, Python or
# sanitizers), runs the tests under qemu-aarch64 (ctest, through the toolchain's CMAKE_CROSSCOMPILING_EMULATOR), then
# runs the aarch64 programs on demo checkpoints written by the x86 build and compares their outputs with the x86
# programs' within the parity bounds of docs/numerics.md#parity-tolerances (tools/compare_outputs.py).
# Which tests and why: docs/platforms.md#aarch64-under-emulation.
# Usage: tools/test_aarch64.sh
# Env: FLOWEDGE_X86_BUILD: x86 build tree holding the programs (default build-asan, the tree tools/test.sh built; the
#      five programs are built there when missing, after configuring it with the asan preset if it has no cache).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in aarch64-linux-gnu-g++ qemu-aarch64; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "flowedge aarch64: $tool not found (tools/install_deps.sh installs g++-aarch64-linux-gnu and qemu-user)" >&2
    exit 1
  fi
done
t0=$(date +%s)
# progress WHAT: "flowedge aarch64: WHAT at N s (C s CPU)", the wall time and the CPU of this script's finished child
# processes so far, for the CI log (the 2-core budget). `times` runs in this shell: a subshell has no children's time.
progress() {
  times >"$arm/.times"
  local cpu
  cpu=$(awk 'NR == 2 { split($1, u, "m"); split($2, s, "m"); printf "%.0f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' \
        "$arm/.times")
  echo "flowedge aarch64: $1 at $(( $(date +%s) - t0 )) s ($cpu s CPU)"
}
arm=build-aarch64
x86="${FLOWEDGE_X86_BUILD:-build-asan}"
emulate=(qemu-aarch64 -L /usr/aarch64-linux-gnu)

# Executables: the op tests (every CPU op against naive double loops: what changes with the ISA and the compiler), the
# file-format tests (byte order, alignment) and the parity tests that carry committed PyTorch/LeRobot fixtures.
targets=(ops_linear ops_conv1d ops_conv_transpose1d ops_norm ops_elementwise ops_mamba ops_diffusion_step ops_math_mode
         ops_conv2d ops_image ops_dtype ops_packed_linear ops_no_alloc io_safetensors io_npy io_npz
         mamba_flow_parity_pytorch diffusion_parity_lerobot diffusion_policy act_policy)
# ctest entries: each executable whole, except five that run reduced under emulation (the emulated_* entries of
# test/CMakeLists.txt: one image-policy episode each, conv1d without its two largest shape sets, conv2d and the
# LeRobot parity file without the cases of x86-only kernels).
tests=(ops_linear emulated_ops_conv1d ops_conv_transpose1d ops_norm ops_elementwise ops_mamba ops_diffusion_step
       ops_math_mode emulated_ops_conv2d ops_image ops_dtype ops_packed_linear ops_no_alloc io_safetensors io_npy io_npz
       mamba_flow_parity_pytorch emulated_diffusion_parity_lerobot emulated_diffusion_policy emulated_act_policy)
programs=(flow_sample mamba_forward diffusion_sample)

# One build goal over the tests and programs (flowedge_compile_check), so make keeps both cores busy.
cmake --preset aarch64 -DFLOWEDGE_COMPILE_CHECK_TARGETS="$(IFS=';'; echo "${targets[*]};${programs[*]}")" >/dev/null
cmake --build "$arm" --target flowedge_compile_check -j2
progress "cross build done"

ctest --test-dir "$arm" -R "^($(IFS='|'; echo "${tests[*]}"))\$" -j2 --output-on-failure --no-tests=error --timeout 1500
progress "${#tests[@]} tests passed under qemu-aarch64"

# Demo checkpoints from the x86 programs; the same program runs on both machines with the same arguments.
makers=(flowedge-make-demo-mamba-flow flowedge-make-demo-diffusion)
if [ ! -f "$x86/CMakeCache.txt" ]; then
  cmake --preset asan -B "$x86" >/dev/null
fi
for p in "${makers[@]}" "${programs[@]}"; do
  [ -x "$x86/$p" ] || cmake --build "$x86" --target "$p" -j2
done
work="$arm/demo"
mkdir -p "$work"
"$x86/flowedge-make-demo-mamba-flow" "$work/mamba_flow.safetensors" >/dev/null
# The Diffusion Policy demo at a quarter of PushT's widths (128/256/512: 69 MB instead of 1 GB, the same layers and
# kernels; a CI run on a near-full disk failed writing the full-size one).
"$x86/flowedge-make-demo-diffusion" "$work/diffusion_small.flowedge.safetensors" --down-dims 128,256,512 >/dev/null

# run_both NAME PROGRAM ARGS...: the x86 and the emulated aarch64 program, stdout to NAME.x86.txt / NAME.arm.txt in
# $work; an argument SIDE.npy becomes NAME.x86.npy / NAME.arm.npy.
run_both() {
  local name="$1" prog="$2" side
  shift 2
  for side in x86 arm; do
    local args=("${@/#SIDE.npy/$work/$name.$side.npy}")
    if [ "$side" = x86 ]; then
      "$x86/$prog" "${args[@]}" >"$work/$name.$side.txt"
    else
      "${emulate[@]}" "$arm/$prog" "${args[@]}" >"$work/$name.$side.txt"
    fi
  done
}
status=0
compare() { python3 tools/compare_outputs.py "$@" || status=1; }

# Flow sample: 2e-3 relative to the largest value (the flow-matching bound); the Mamba hidden states: 2e-3, the bound
# where a fast exp approximation is used (the x86 sets' selective scan uses a vector exp, the scalar set std::exp).
for solver in euler heun rk4; do
  run_both "flow_$solver" flow_sample "$work/mamba_flow.safetensors" "$solver" 10 --repeats 1
  compare text "$work/flow_$solver.x86.txt" "$work/flow_$solver.arm.txt" --rel 2e-3
done
run_both mamba_forward mamba_forward "$work/mamba_flow.safetensors" 1 2 3 4 5 6 7 8 9 10 11 12
compare text "$work/mamba_forward.x86.txt" "$work/mamba_forward.arm.txt" --rel 2e-3

# The PushT-layout Diffusion Policy head (17.3 M parameters at these widths), DDIM from the program's fixed noise: the
# 10-step DDIM bound 6e-4 (normalised units). Two steps keep the emulated run short; each step is one full U-Net
# evaluation.
run_both diffusion_ddim diffusion_sample "$work/diffusion_small.flowedge.safetensors" 2 --repeats 1 --out SIDE.npy
compare actions "$work/diffusion_ddim.x86.npy" "$work/diffusion_ddim.arm.npy" \
  --checkpoint "$work/diffusion_small.flowedge.safetensors" --max-abs 6e-4

progress "programs compared (status $status)"
exit "$status"
