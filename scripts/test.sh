#!/usr/bin/env bash
# Set up .venv, then run the whole test suite: the engine's tests and the labs graded on the solutions.
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -m pytest -n 2 --dist loadfile tests labs --reference "$@"
