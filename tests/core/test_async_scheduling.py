"""Async scheduling (`EngineCore.step_with_batch_queue` in mini/engine/core.py,
mini/core/sched/async_scheduler.py): the same outputs as
synchronous scheduling, setting by setting, on the shipped model; and the combinations it refuses.

Each test runs the same prompts through two in-process engines built alike but for `async_scheduling` and
compares every output (token ids, finish reasons, logprobs). In-process so the tests can look at the core (and
count the steps a request was in); one test runs the core in its own process, as `LLM()` does by default.
"""

from __future__ import annotations

import threading

import pytest

from mini import LLM, SamplingParams
from mini.config import SHIPPED_MODEL_DIR, EngineConfig
from mini.sampling_params import StructuredOutputsParams

pytestmark = pytest.mark.skipif(not (SHIPPED_MODEL_DIR / "config.json").exists(), reason="no shipped model")
pytestmark = [pytestmark, pytest.mark.inprocess_engine]  # it looks inside the engine: in-process engines

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "Hello, my name is",
           "The quick brown fox", "In the beginning", "def main():", "Rain falls on"]


_ENGINES: list[LLM] = []


@pytest.fixture(autouse=True)
def in_process(monkeypatch):
    """In-process engines, each shut down after its test (no step thread outlives the test that made it)."""
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "0")
    yield
    while _ENGINES:
        _ENGINES.pop().llm_engine.engine_core.shutdown()


def make_llm(**settings) -> LLM:
    llm = LLM(**settings)
    _ENGINES.append(llm)
    return llm


def generate_both(prompts, params, **settings):
    """(sync outputs, async outputs, the async engine core) for the same prompts and engine settings."""
    results = []
    for async_scheduling in (False, True):
        llm = make_llm(async_scheduling=async_scheduling, **settings)
        results.append(llm.generate(prompts, params, use_tqdm=False))
        core = llm.llm_engine.engine_core.engine_core
        if async_scheduling:
            assert core.batch_queue is not None and not core.batch_queue, "a step left in flight"
            assert not core.scheduler.requests
            return results[0], results[1], core
        assert core.batch_queue is None
    raise AssertionError("unreachable")


def summary(outputs, with_logprobs=False):
    rows = []
    for output in outputs:
        for completion in output.outputs:
            row = [output.request_id, completion.index, list(completion.token_ids), completion.finish_reason,
                   completion.stop_reason, completion.text]
            if with_logprobs:
                row.append([{token: round(lp.logprob, 4) for token, lp in entry.items()}
                            for entry in completion.logprobs])
            rows.append(row)
    return rows


def assert_same(sync, asynchronous, with_logprobs=False):
    assert summary(asynchronous, with_logprobs) == summary(sync, with_logprobs)


def test_greedy_with_staggered_admission_is_identical():
    params = [SamplingParams(temperature=0.0, max_tokens=12 + 3 * i) for i in range(len(PROMPTS))]
    sync, asynchronous, _ = generate_both(PROMPTS, params, max_num_seqs=3)
    assert_same(sync, asynchronous)
    assert {c.finish_reason for o in asynchronous for c in o.outputs} == {"length"}


def test_seeded_sampling_and_n_greater_than_one_are_identical():
    params = [SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=100 + i, max_tokens=16, n=1 + i % 3)
              for i in range(len(PROMPTS))]
    sync, asynchronous, _ = generate_both(PROMPTS, params, max_num_seqs=5)
    assert_same(sync, asynchronous)
    assert sum(len(o.outputs) for o in asynchronous) > len(PROMPTS)


def test_penalties_min_tokens_and_logit_bias_are_identical():
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=14, repetition_penalty=1.3, presence_penalty=0.5,
                             frequency_penalty=0.3, min_tokens=4, logit_bias={11: 2.0}) for i in range(4)]
    sync, asynchronous, _ = generate_both(PROMPTS[:4], params)
    assert_same(sync, asynchronous)


def test_logprobs_and_prompt_logprobs_are_identical():
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=3, prompt_logprobs=2)
    sync, asynchronous, _ = generate_both(PROMPTS[:4], params)
    assert_same(sync, asynchronous, with_logprobs=True)
    for a, s in zip(asynchronous, sync, strict=False):
        assert [None if e is None else sorted(e) for e in a.prompt_logprobs] == \
            [None if e is None else sorted(e) for e in s.prompt_logprobs]


def steps_per_request(core):
    """Wrap the core's worker: request id -> number of executed steps that held it."""
    counts: dict[str, int] = {}
    worker = core.model_executor.driver_worker
    run = worker.execute_model

    def counting(scheduler_output, *args, **kwargs):
        for req_id in scheduler_output.num_scheduled_tokens:
            counts[req_id] = counts.get(req_id, 0) + 1
        return run(scheduler_output, *args, **kwargs)

    worker.execute_model = counting
    return counts


def test_a_stop_token_met_while_the_next_step_runs_discards_that_steps_token():
    greedy = make_llm().generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    tokens = list(greedy[0].outputs[0].token_ids)
    stop_id = tokens[4]
    expected = tokens[: tokens.index(stop_id) + 1]
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop_id])
    for async_scheduling in (False, True):
        llm = make_llm(async_scheduling=async_scheduling)
        counts = steps_per_request(llm.llm_engine.engine_core.engine_core)
        out = llm.generate(PROMPTS[:1], params, use_tqdm=False)[0]
        assert list(out.outputs[0].token_ids) == expected
        assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop_id
        (num_steps,) = counts.values()
        # sync: one step per token (the prefill samples the first); async: one more, already scheduled when
        # the stop token came back, whose token was dropped.
        assert num_steps == len(expected) + int(async_scheduling)


def test_max_tokens_schedules_no_extra_step():
    params = SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True)
    llm = make_llm(async_scheduling=True)
    counts = steps_per_request(llm.llm_engine.engine_core.engine_core)
    out = llm.generate(PROMPTS[:1], params, use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 7
    assert list(counts.values()) == [7]   # as vLLM: a request its steps in flight bring to max_tokens waits


def test_stop_strings_and_eos_are_identical():
    greedy = make_llm().generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
    stops = [out.outputs[0].text[4:7] or "zz" for out in greedy]
    params = [SamplingParams(temperature=0.0, max_tokens=16, stop=[stop]) for stop in stops]
    sync, asynchronous, _ = generate_both(PROMPTS, params, max_num_seqs=4)
    assert_same(sync, asynchronous)
    assert sum(c.finish_reason == "stop" for o in asynchronous for c in o.outputs) >= len(PROMPTS) // 2


def test_preemption_is_identical():
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    settings = {"num_gpu_blocks_override": 12, "block_size": 4, "max_num_seqs": 6}
    preemptions, outputs = [], []
    for async_scheduling in (False, True):
        llm = make_llm(async_scheduling=async_scheduling, **settings)
        outputs.append(llm.generate(PROMPTS[:6], params, use_tqdm=False))
        preemptions.append(llm.llm_engine.scheduler.num_preemptions_total)
    assert_same(*outputs)
    assert min(preemptions) > 0, preemptions


def test_preemption_with_logprobs_is_identical():
    """Greedy with logprobs under preemption. (Seeded sampling is not compared under preemption: a preempted
    request's generator restarts from its seed on resume (mini/worker/model_runner.py), so its samples depend on
    where it was preempted, which async scheduling can move by a step.)"""
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, logprobs=1)
    sync, asynchronous, core = generate_both(PROMPTS[:5], params, num_gpu_blocks_override=10, block_size=4)
    assert core.scheduler.num_preemptions_total > 0
    assert_same(sync, asynchronous, with_logprobs=True)


def test_prefix_caching_and_chunked_prefill_are_identical():
    shared = "A long shared preamble about the weather and the sea, " * 3
    prompts = [shared + tail for tail in ("one", "two", "three", "four", "five")]
    params = SamplingParams(temperature=0.0, max_tokens=10)
    settings = {"enable_prefix_caching": True, "block_size": 4, "max_num_seqs": 2, "max_num_batched_tokens": 24,
                "long_prefill_token_threshold": 8}
    sync, asynchronous, _ = generate_both(prompts, params, **settings)
    assert_same(sync, asynchronous)
    assert any(out.num_cached_tokens > 0 for out in asynchronous)
    assert [o.num_cached_tokens for o in asynchronous] == [o.num_cached_tokens for o in sync]


def test_structured_output_is_identical():
    kinds = [{"regex": r"\d{3}-[a-z]{2,4}"}, {"choice": ["yes", "no", "maybe later"]},
             {"json": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}]
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=40,
                             structured_outputs=StructuredOutputsParams(**kind))
              for kind in kinds for seed in range(2)]
    prompts = ["The answer is"] * len(params)
    sync, asynchronous, _ = generate_both(prompts, params, max_num_seqs=4)
    assert_same(sync, asynchronous)
    assert all(c.finish_reason == "stop" for o in asynchronous for c in o.outputs)


def test_step_observers_run_synchronously_and_change_nothing():
    params = SamplingParams(temperature=0.0, max_tokens=10)
    sync, _, _ = generate_both(PROMPTS[:3], params)
    llm = make_llm(async_scheduling=True)
    engine = llm.llm_engine
    traces = []
    for index, prompt in enumerate(PROMPTS[:3]):
        engine.add_request(str(index), prompt, params)
    engine.step()   # a step in flight, then an observer arrives
    remove = engine.add_step_observer(traces.append)
    finished = {}
    while engine.has_unfinished_requests():
        if len(traces) == 3:
            remove()
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = list(output.outputs[0].token_ids)
    assert len(traces) == 3
    assert [finished[str(i)] for i in range(3)] == [list(o.outputs[0].token_ids) for o in sync]


def test_abort_while_a_step_is_in_flight_leaves_nothing_running():
    llm = make_llm(async_scheduling=True)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    for index, prompt in enumerate(PROMPTS[:3]):
        engine.add_request(str(index), prompt, params)
    for _ in range(4):
        engine.step()
    engine.abort_request(["1"])
    results = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                results[output.request_id] = output.outputs[0]
    assert results["1"].finish_reason == "abort"
    assert len(results["0"].token_ids) == len(results["2"].token_ids) == 30
    core = engine.engine_core.engine_core
    assert not core.batch_queue
    pool = core.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


def test_multiprocess_core_gives_the_same_outputs(monkeypatch):
    params = [SamplingParams(temperature=0.0, max_tokens=10 + i) for i in range(4)]
    reference = make_llm().generate(PROMPTS[:4], params, use_tqdm=False)
    monkeypatch.setenv("MINI_ENABLE_V1_MULTIPROCESSING", "1")
    llm = make_llm(async_scheduling=True)
    try:
        assert_same(reference, llm.generate(PROMPTS[:4], params, use_tqdm=False))
    finally:
        llm.llm_engine.engine_core.shutdown()


def test_shutdown_stops_the_step_thread():
    llm = make_llm(async_scheduling=True)
    llm.generate(PROMPTS[:2], SamplingParams(max_tokens=4), use_tqdm=False)
    executor = llm.llm_engine.engine_core.engine_core.model_executor
    thread_names = {t.name for t in threading.enumerate()}
    assert any(name.startswith("mini-step") for name in thread_names)
    llm.llm_engine.engine_core.shutdown()
    assert executor.step_thread is None
    assert not any(t.name.startswith("mini-step") and t.is_alive() for t in threading.enumerate())


@pytest.mark.parametrize("spec", [{"method": "ngram", "num_speculative_tokens": 2},
                                  {"method": "draft_model", "num_speculative_tokens": 2}])
def test_speculative_decoding_is_refused(spec):
    with pytest.raises(ValueError, match="async_scheduling=True cannot be combined with speculative_config"):
        EngineConfig(async_scheduling=True, speculative_config=spec)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_a_non_bool_is_refused(value):
    with pytest.raises(ValueError, match="async_scheduling must be a bool"):
        EngineConfig(async_scheduling=value)


def test_the_command_line_has_the_switch():
    import argparse

    from mini.config import add_engine_arguments, cli_engine_args
    parser = add_engine_arguments(argparse.ArgumentParser(), ["async_scheduling"])
    assert cli_engine_args(parser.parse_args(["--async-scheduling"]), ["async_scheduling"]) == {
        "async_scheduling": True}
    assert parser.parse_args([]).async_scheduling is False


def test_a_learners_scheduler_part_runs_inside_the_async_scheduler():
    from mini import roles
    from mini.core.sched.async_scheduler import AsyncScheduler
    from mini.core.sched.scheduler import num_tokens_to_schedule

    calls = []

    def learner_num_tokens_to_schedule(*args):
        calls.append(args)
        return num_tokens_to_schedule(*args)

    params = SamplingParams(temperature=0.0, max_tokens=10)
    sync, _, _ = generate_both(PROMPTS[:3], params)
    with roles.use(num_tokens_to_schedule=learner_num_tokens_to_schedule):
        llm = make_llm(async_scheduling=True)
    scheduler = llm.llm_engine.scheduler
    assert isinstance(scheduler, AsyncScheduler) and scheduler.num_tokens_to_schedule is learner_num_tokens_to_schedule
    assert_same(sync, llm.generate(PROMPTS[:3], params, use_tqdm=False))
    assert calls
