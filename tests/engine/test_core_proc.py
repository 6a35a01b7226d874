"""The engine core in a child process (mini/engine/core_proc.py, core_client.py): same tokens as in process,
the wire round-trips exactly, bad input fails before anything is sent, a failing step fails its requests only.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from patience import RUN_GUARD_S

from mini import LLM, SamplingParams
from mini.engine import EngineCoreRequest
from mini.engine.exceptions import EngineInternalsError, EngineStepError
from mini.sampling_params import RequestOutputKind, StructuredOutputsParams
from mini.serial_utils import EngineCoreOutputs, decode_outputs, decode_request, encode

PROMPTS = ["Hello world", "The cat sat on", {"prompt_token_ids": [5, 6, 7, 8]}]


def _llm(monkeypatch, multiprocess: bool, **kwargs) -> LLM:
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "1" if multiprocess else "0")
    return LLM(num_gpu_blocks_override=64, max_num_seqs=8, **kwargs)


@pytest.fixture(scope="module")
def engines():
    """One in-process and one multiprocess engine on the shipped model, shut down after the module."""
    with pytest.MonkeyPatch.context() as mp:
        inproc = _llm(mp, False)
        multi = _llm(mp, True)
    yield inproc, multi
    multi.llm_engine.shutdown()
    inproc.llm_engine.shutdown()


def _tokens(outputs):
    return [[list(c.token_ids) for c in o.outputs] for o in outputs]


def test_greedy_tokens_identical_in_both_modes(engines):
    inproc, multi = engines
    params = SamplingParams(temperature=0.0, max_tokens=24)
    want = inproc.generate(PROMPTS, params, use_tqdm=False)
    got = multi.generate(PROMPTS, params, use_tqdm=False)
    assert multi.llm_engine.multiprocess_mode and not inproc.llm_engine.multiprocess_mode
    assert _tokens(got) == _tokens(want)
    assert [o.outputs[0].text for o in got] == [o.outputs[0].text for o in want]
    assert [o.outputs[0].finish_reason for o in got] == [o.outputs[0].finish_reason for o in want]


def test_seeded_n_samples_logprobs_and_stop_strings_identical(engines):
    inproc, multi = engines
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=11, n=3, max_tokens=12, logprobs=2,
                            prompt_logprobs=1, stop=["the"], logit_bias={7: 2.5})
    want = inproc.generate(PROMPTS[:2], params, use_tqdm=False)
    got = multi.generate(PROMPTS[:2], params, use_tqdm=False)
    assert _tokens(got) == _tokens(want) and all(len(o.outputs) == 3 for o in got)
    for g, w in zip(got, want, strict=False):
        _same_logprobs(g.prompt_logprobs, w.prompt_logprobs)
        for gc, wc in zip(g.outputs, w.outputs, strict=False):
            _same_logprobs(gc.logprobs, wc.logprobs)
            assert gc.text == wc.text and gc.stop_reason == wc.stop_reason


def _same_logprobs(got, want):
    """Same tokens, ranks and decoded text; values within 1e-4 (the two processes' kernels may round the
    last float32 bits differently; the wire itself is exact, see test_sampling_params_round_trip_exactly)."""
    assert (got is None) == (want is None)
    if got is None:
        return
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=False):
        assert (g is None) == (w is None)
        if g is None:
            continue
        assert list(g) == list(w)
        for token_id in g:
            assert g[token_id].rank == w[token_id].rank
            assert g[token_id].decoded_token == w[token_id].decoded_token
            assert g[token_id].logprob == pytest.approx(w[token_id].logprob, abs=1e-4)


def test_structured_output_round_trips(engines):
    inproc, multi = engines
    params = SamplingParams(temperature=0.0, max_tokens=20,
                            structured_outputs=StructuredOutputsParams(choice=["yes", "no", "maybe"]))
    want = inproc.generate(["Is it?"], params, use_tqdm=False)[0].outputs[0].text
    got = multi.generate(["Is it?"], params, use_tqdm=False)[0].outputs[0].text
    assert got == want and got in ("yes", "no", "maybe")


def test_sampling_params_round_trip_exactly():
    params = SamplingParams(temperature=0.7, top_k=5, seed=3, stop=["a", "bc"], stop_token_ids=[9],
                            logit_bias={3: -1.5, 4: 100.0}, min_tokens=2, bad_words=["x"], allowed_token_ids=None,
                            output_kind=RequestOutputKind.DELTA, extra_args={"k": [1, 2]},
                            structured_outputs=StructuredOutputsParams(json={"type": "object"}))
    params.update_from_eos(2)
    request = EngineCoreRequest("r1", "hi", [1, 2, 3], params, 2, 12.5, priority=1, cache_salt="s")
    decoded = decode_request(encode(request))
    assert decoded == request
    assert decoded.sampling_params.all_stop_token_ids == {2, 9}
    assert decoded.sampling_params.output_kind is RequestOutputKind.DELTA
    assert decoded.sampling_params.structured_outputs == params.structured_outputs
    assert decode_outputs(encode(EngineCoreOutputs(failed_requests={"r": "x"}))).failed_requests == {"r": "x"}


def test_abort_mid_generation_frees_blocks(engines):
    _, multi = engines
    engine = multi.llm_engine
    client = engine.engine_core
    free_before = client.call_utility("get_num_free_blocks")
    engine.add_request("long", "Once upon a time", SamplingParams(temperature=0.0, max_tokens=200,
                                                                  ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert client.call_utility("get_num_free_blocks") < free_before
    engine.abort_request(["long"])
    final = engine.step()
    assert [o.outputs[0].finish_reason for o in final] == ["abort"]
    assert not engine.has_unfinished_requests()
    assert client.call_utility("get_num_free_blocks") == free_before
    assert engine.get_scheduler_stats().num_running_reqs == 0


def test_bad_input_fails_before_anything_is_sent(engines):
    _, multi = engines
    engine = multi.llm_engine
    with pytest.raises(ValueError, match="prompt_token_ids"):
        engine.add_request("big", {"prompt_token_ids": [1] * 1015}, SamplingParams())
    with pytest.raises(ValueError):
        multi.generate(["fine", {"prompt_token_ids": [10**7]}], SamplingParams(max_tokens=2), use_tqdm=False)
    assert not engine.has_unfinished_requests()
    assert engine.engine_core.call_utility("get_num_unfinished_requests") == 0


def test_internals_name_the_switch(engines):
    _, multi = engines
    for name in ("scheduler", "model_runner", "kv_cache_manager", "startup_report"):
        with pytest.raises(EngineInternalsError, match="MINI_ENABLE_V1_MULTIPROCESSING=0"):
            getattr(multi.llm_engine, name)
    with pytest.raises(EngineInternalsError, match="add_step_observer"):
        multi.llm_engine.add_step_observer(lambda trace: None)
    assert multi.llm_engine.num_gpu_blocks == 64


def test_a_failing_step_fails_its_requests_and_the_core_serves_on(engines):
    _, multi = engines
    engine = multi.llm_engine
    engine.engine_core.call_utility("fail_next_step", "injected failure")
    engine.add_request("doomed", "Hello", SamplingParams(temperature=0.0, max_tokens=8))
    with pytest.raises(EngineStepError, match="injected failure"):
        while engine.has_unfinished_requests():
            engine.step()
    assert not engine.has_unfinished_requests()
    out = multi.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    assert engine.engine_core.call_utility("get_num_unfinished_requests") == 0


def test_reset_prefix_cache_is_a_utility_call(engines):
    _, multi = engines
    assert multi.reset_prefix_cache() is True
    with pytest.raises(RuntimeError, match="unknown utility call"):
        multi.llm_engine.engine_core.call_utility("no_such_call")


FORK_AFTER_KERNELS = """
import torch
from mini import LLM, SamplingParams
a = torch.randn(256, 256)
for _ in range(5):
    a = (a @ a).softmax(-1)           # torch's OpenMP pool is now running in this process
llm = LLM(num_gpu_blocks_override=32)
out = llm.generate(["Hello world"], SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)
print("TOKENS", list(out[0].outputs[0].token_ids), llm.llm_engine.multiprocess_mode)
"""


def test_fork_after_parallel_kernels_does_not_hang(engines):
    """GNU OpenMP is not fork-safe; the core runs on a fresh thread in the child, so a fork after the
    parent's own kernels still works (this hung before that)."""
    inproc, _ = engines
    want = inproc.generate(["Hello world"], SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)
    env = dict(os.environ, MINI_ENABLE_V1_MULTIPROCESSING="1", MINI_WORKER_MULTIPROC_METHOD="fork")
    result = subprocess.run([sys.executable, "-c", FORK_AFTER_KERNELS], check=False, env=env, capture_output=True,
                            text=True,
                            timeout=RUN_GUARD_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"TOKENS {list(want[0].outputs[0].token_ids)} True" in result.stdout
    assert torch.get_num_threads() >= 1


def test_a_start_up_error_in_the_child_is_raised_as_itself(monkeypatch):
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(ValueError, match="KV cache budget") as caught:
        LLM(kv_cache_memory_bytes=1000)
    assert any("raised while starting the engine core" in note for note in caught.value.__notes__)
