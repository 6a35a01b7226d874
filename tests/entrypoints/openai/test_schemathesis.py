"""Schemathesis (`st run`) fuzzes the live server against its own /openapi.json, with and without an API key.

Every check but `positive_data_acceptance` and `max_response_time` (see CHECKS) must pass: no 5xx, every status code,
Content-Type and body (JSON, and each server-sent event's JSON) as the document declares, schema-invalid bodies rejected
(`negative_data_rejection`), and with a key, a request without it refused (`ignored_auth`).
`positive_data_acceptance` (every schema-valid body must be served) is off: the server answers a declared
400 to bodies that JSON Schema cannot rule out, as vLLM does: a prompt longer than the context once
tokenized, a token id beyond the vocabulary, an invalid regex or chat template, cross-field rules such as
`min_tokens <= max_tokens` or `n == 1` with greedy sampling.

Bounded so the file takes well under 90 s on a busy 2-core machine: a fixed seed, a few examples per
operation, an engine with max_model_len=64 (no generation is longer), and hooks that shrink only the
*schema-valid* cases' cost (`n` and `max_tokens` to small values, `max_tokens` set where absent, at most
two prompts); the schema's own bounds (`n <= 16384` as vLLM's VLLM_MAX_N_SEQUENCES, seeds in int64) stay
as they are.
`MINI_SCHEMATHESIS_SEED=N` runs another seed (the suite uses 1; seeds 2, 3 and 11 at up to 300 examples per
operation also found nothing when this was written).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("schemathesis")
pytest.importorskip("fastapi")
pytest.importorskip("httpx")
pytest.importorskip("prometheus_client")

from mini.engine.async_llm import AsyncLLM
from mini.entrypoints.openai.api_server import build_app, serve_in_thread

MODEL = "tiny-llama"
KEY = "fuzz-key"
SEED = int(os.environ.get("MINI_SCHEMATHESIS_SEED", "1"))

# Loaded by `st run` (SCHEMATHESIS_HOOKS): makes schema-valid cases cheap; never touches negative ones
# (shortening a negative case could make it valid, and then its acceptance would look like a failure).
HOOKS = '''
import schemathesis

LIMITS = {"n": 2, "max_tokens": 2, "max_completion_tokens": 2}


@schemathesis.hook
def map_case(context, case):
    meta = case.meta
    if meta is not None and meta.generation.mode.is_negative:
        return case
    body = case.body
    if isinstance(body, dict):
        if "max_tokens" not in body and "max_completion_tokens" not in body:
            body["max_tokens"] = LIMITS["max_tokens"]   # chat's default fills the context
        for name, limit in LIMITS.items():
            value = body.get(name)
            if type(value) is int and value > limit:
                body[name] = limit
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) > 2 and all(isinstance(p, (str, list)) for p in prompt):
            body["prompt"] = prompt[:2]
    return case
'''


@pytest.fixture
def one_torch_thread():
    """The server's engine on one torch thread: on a shared 2-core machine, several threads spin-wait
    against the fuzzer and each other (measured: the run took minutes instead of seconds)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hooks_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("schemathesis") / "mini_st_hooks.py"
    path.write_text(HOOKS)
    return path


# The checks schemathesis runs, named one by one instead of `--checks all`, which also switches on
# `max_response_time` with a 10 s limit. A response time is latency, and latency belongs in a benchmark
# (`python -m mini bench serve`), not in a test that must pass on a busy machine (a 2-token completion took 32 s
# on a loaded 2-core laptop: CPU starvation, not a server fault). Left out too: `positive_data_acceptance` (see
# the module docstring) and `object_level_authorization`, which needs two users configured (`all` skips it
# without a word; named, it warns).
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_headers_conformance", "response_schema_conformance", "negative_data_rejection",
          "missing_required_header", "unsupported_method", "allow_header_conformance", "use_after_free",
          "ensure_resource_availability", "ignored_auth")


def st_run(url: str, hooks_file, max_examples: int, extra: list[str]) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
               "--checks", ",".join(CHECKS),
               "--phases", "examples,coverage,fuzzing", "--max-examples", str(max_examples),
               "--seed", str(SEED), "--workers", "1", "--request-timeout", "600",
               "--generation-database", "none", "--no-color", *extra]
    env = dict(os.environ, SCHEMATHESIS_HOOKS=str(hooks_file))
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=1800, env=env,
                          cwd=hooks_file.parent)


def test_the_fuzzer_runs_every_check_but_acceptance_and_response_time():
    from schemathesis.checks import CHECKS as REGISTERED
    from schemathesis.specs.openapi import checks  # noqa: F401 - registers the OpenAPI checks

    assert set(CHECKS) == {c.__name__ for c in REGISTERED.get_all()} - {"positive_data_acceptance",
                                                                        "object_level_authorization"}
    assert "max_response_time" not in CHECKS and "all" not in CHECKS


def assert_clean(result: subprocess.CompletedProcess) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "No issues found" in output, output[-8000:]
    assert "5 selected / 5 total" in output, output[-4000:]   # every operation was fuzzed


@pytest.mark.parametrize("api_keys", [None, [KEY]], ids=["open", "keyed"])
def test_schemathesis_finds_no_violation(hooks_file, one_torch_thread, api_keys):
    engine = AsyncLLM.from_engine_args(max_num_seqs=8, max_model_len=64)
    with serve_in_thread(build_app(engine, MODEL, api_keys=api_keys)) as url:
        if api_keys:
            result = st_run(url, hooks_file, 10, ["--header", f"Authorization: Bearer {KEY}"])
        else:
            result = st_run(url, hooks_file, 25, [])
        assert engine.is_running and not engine.errored   # the fuzzing did not kill the engine
    assert not engine.is_running
    assert_clean(result)
