#!/usr/bin/env bash
# Downloads into .whl/ (git-ignored) the cp312 x86-64 wheels that let LeRobot 0.4.4's DiffusionPolicy and its
# processor pipelines import on the H200 box (Python 3.12, no internet), for bench/lerobot_policy_bench.py.
#
# The list is the import closure of
#   lerobot.policies.diffusion.modeling_diffusion, lerobot.policies.diffusion.processor_diffusion, lerobot.processor
# seen in the reference venv (tools/requirements-ref.txt, Python 3.11; sys.modules mapped to distributions), minus
# what the box's image already holds (KINDS.md package list: torch, torchvision, numpy, safetensors, pyarrow, pandas,
# aiohttp, httpx, fsspec, xxhash, regex, requests, tqdm, pyyaml, pillow, accelerate, protobuf, ...). Carried despite
# being on the box: transformers / tokenizers / huggingface-hub (the box's transformers 5 and hub 1.x break
# `import lerobot.policies`; transformers 4.57.6 accepts tokenizers <= 0.23.0 only) and typing-extensions (pydantic
# 2.14 needs >= 4.16). Not carried: PyAV (40 MB; the bench puts an import-only stand-in in sys.modules when `import av`
# fails, nothing in select_action decodes video) and gymnasium (only lerobot.policies.factory imports it).
#
# --gym: the wheels of gym-pusht, the gymnasium env stack it and LeRobot's env factory import, and termcolor (LeRobot's
# eval script), into DEST/gym instead, for the soak and eval stages of tools/gpu_run.sh. The GPU image has numpy,
# cloudpickle and opencv-python-headless: gym-pusht's `import cv2` finds the headless OpenCV (installed --no-deps).
#
# Usage: tools/fetch_lerobot_wheels.sh [--gym] [DEST]   (DEST defaults to .whl; PIP overrides the pip command)
# Install on the box: python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#                       --target /tmp/site_lerobot .whl/*.whl && export PYTHONPATH=/tmp/site_lerobot
set -euo pipefail
cd "$(dirname "$0")/.."
GYM=0
[ "${1:-}" = --gym ] && { GYM=1; shift; }
DEST=${1:-.whl}
PIP=${PIP:-python3 -m pip}
LIMIT_MIB=60

# Versions: those of the reference venv, each within LeRobot 0.4.4's and its dependants' ranges.
WHEELS=(
    lerobot==0.4.4
    diffusers==0.35.2
    transformers==4.57.6 tokenizers==0.22.2 huggingface-hub==0.35.3
    draccus==0.10.0 mergedeep==1.3.4 pyyaml-include==1.4.1 toml==0.10.2
    datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19
    deepdiff==8.6.2 orderly-set==5.5.0
    pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0 typing-extensions==4.16.0
    pyserial==3.5
)
GYM_WHEELS=(
    gym-pusht==0.1.8 gymnasium==1.4.0 farama-notifications==0.0.6
    pygame==2.6.1 pymunk==6.11.1 shapely==2.1.2 cffi==2.0.0 pycparser==2.23
    termcolor==3.3.0
)
if [ "$GYM" = 1 ]; then
    WHEELS=("${GYM_WHEELS[@]}")
    DEST=$DEST/gym
fi

mkdir -p "$DEST"
for spec in "${WHEELS[@]}"; do
    # A local --find-links default (PIP_FIND_LINKS) is dropped: the wheels come from the index (PyPI).
    env -u PIP_FIND_LINKS $PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$DEST" "$spec"
done

total=0
printf '%-70s %9s\n' wheel KiB
for f in "$DEST"/*.whl; do
    s=$(stat -c %s "$f")
    total=$((total + s))
    printf '%-70s %9d\n' "$(basename "$f")" $((s / 1024))
done
printf 'total %d wheels, %s MiB (carry limit 64 MiB with the working tree)\n' "$(ls "$DEST"/*.whl | wc -l)" \
    "$(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }')"
# Every wheel in DEST must be one of the list: a second version of a distribution makes the --target install fail.
expected=$(for spec in "${WHEELS[@]}"; do echo "${spec%%==*}-${spec##*==}"; done | tr '[:upper:]-' '[:lower:]_' | sort)
present=$(for f in "$DEST"/*.whl; do b=$(basename "$f"); echo "$b" | cut -d- -f1-2; done | tr '[:upper:]-' '[:lower:]_' | sort)
extra=$(comm -13 <(echo "$expected") <(echo "$present"))
if [ -n "$extra" ]; then
    echo "flowedge: fetch_lerobot_wheels: $DEST holds wheels not in the list (remove them): $extra" >&2
    exit 1
fi
if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
    echo "flowedge: fetch_lerobot_wheels: $DEST too big for the 64 MiB carry (expected <= $LIMIT_MIB MiB)" >&2
    exit 1
fi
