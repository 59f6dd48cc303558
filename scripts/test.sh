#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite, slow tests included, then ruff.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
export WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/ruff check src tests scripts
.venv/bin/ruff check --preview --select E30 src tests scripts  # blank lines (preview rules)
.venv/bin/python -m pytest -n 2 --dist worksteal "$@"
