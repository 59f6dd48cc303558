#!/usr/bin/env bash
# One-command check of the GPU and compiled path (scripts/gpu_check.py: correctness grid on the
# device in fp32 + bf16, bf16 training with MFU, eager vs compiled train and decode speed, the
# SDPA kernel used, FSDP); writes outputs/gpu_check/<time>/gpu_check.{json,md}.
#   bash scripts/gpu_check.sh            # on a GPU machine (<= 8 minutes)
#   bash scripts/gpu_check.sh --dry      # tiny sizes on CPU: what CI runs
# Uses $PYTHON, else the project's .venv (scripts/setup.sh installs a CPU torch: on a GPU
# machine point PYTHON at an environment whose torch has CUDA, with blocklab installed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
exec "$PY" scripts/gpu_check.py "$@"
