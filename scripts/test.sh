#!/usr/bin/env bash
# Set up .venv, then run the whole test suite: the engine's tests and the labs graded on the solutions.
# Usage: bash scripts/test.sh [extra pytest args]
#
# The suite runs in mini's default mode, the engine core in a child process (MINI_ENABLE_V1_MULTIPROCESSING
# unset); the files that look inside an engine build theirs in-process anyway (tests/conftest.py). Without
# extra arguments, the files marked `engine_modes` (their engines follow the mode) then run again with the
# core in-process, so both modes are tested.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
ruff check .   # the lint rules and line length of pyproject.toml's [tool.ruff]
python -m pytest -n 2 --dist loadfile tests labs --reference "$@"
if [ "$#" -eq 0 ]; then
    MINI_ENABLE_V1_MULTIPROCESSING=0 python -m pytest -n 2 --dist loadfile -m engine_modes tests
fi
