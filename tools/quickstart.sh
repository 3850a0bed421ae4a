#!/usr/bin/env bash
# The README's first command: install build deps, build (CPU), write the deterministic demo checkpoints at the
# real PushT and mamba_flow shapes (no download), and run the main jobs on them.
# Usage: tools/quickstart.sh [cpu|cuda]
set -euo pipefail
cd "$(dirname "$0")/.."
backend="${1:-cpu}"
bash tools/install_deps.sh
if [ "$backend" = cuda ]; then
  preset=cuda; bin=build-cuda; device=cuda
else
  preset=default; bin=build; device=cpu
fi
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" --target diffusion_sample flow_sample mamba_forward \
  flowedge-make-demo-diffusion flowedge-make-demo-mamba-flow
mkdir -p models
[ -f models/diffusion_pusht.flowedge.safetensors ] || "./$bin/flowedge-make-demo-diffusion" models/diffusion_pusht.flowedge.safetensors
[ -f models/mamba_flow.safetensors ] || "./$bin/flowedge-make-demo-mamba-flow" models/mamba_flow.safetensors
echo "== PushT Diffusion Policy head, 10-step DDIM ($device)"
"./$bin/diffusion_sample" models/diffusion_pusht.flowedge.safetensors 10 --device "$device"
echo "== Mamba backbone + flow-matching head, 10 Euler steps ($device)"
"./$bin/flow_sample" models/mamba_flow.safetensors euler 10 --device "$device"
"./$bin/mamba_forward" models/mamba_flow.safetensors 1 2 3 4 --device "$device"
