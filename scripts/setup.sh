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
python -m pip install --quiet -e ".[course,test,serve,dev]"
python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (mini)" >/dev/null
echo "mini is installed in $(pwd)/.venv ($(python -c 'import torch; print("torch", torch.__version__)'))"
