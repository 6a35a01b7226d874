#!/usr/bin/env bash
# Set up .venv, then run the whole test suite: the engine's tests and the labs graded on the solutions.
# Usage: bash scripts/test.sh [extra pytest args]
#
# The suite runs in mini's default mode, the engine core in a child process (MINI_ENABLE_V1_MULTIPROCESSING
# unset); the files that look inside an engine build theirs in-process anyway (tests/conftest.py). Without
# extra arguments, the files whose engines follow the mode then run again with the core in-process, so both
# modes are tested.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -m pytest -n 2 --dist loadfile tests labs --reference "$@"
if [ "$#" -eq 0 ]; then
    MINI_ENABLE_V1_MULTIPROCESSING=0 python -m pytest -n 2 --dist loadfile \
        tests/test_entry_openai_server.py tests/test_entry_openai_load.py tests/test_entry_openai_contract.py \
        tests/test_entry_openai_api_key.py tests/test_engine_chat.py tests/test_engine_core_client.py \
        tests/test_structured_output_logprobs.py tests/test_structured_output_nesting.py \
        tests/test_cli_engine_args.py tests/test_bench_prefix.py tests/test_engine_boundary.py \
        tests/test_entry_openai_field_bounds.py tests/test_entry_openai_chat_template_trust.py \
        tests/test_entry_openai_loop_stays_free.py tests/test_entry_openai_body_limit.py \
        tests/test_entry_openai_metrics_idle.py tests/test_serve_faults.py
fi
