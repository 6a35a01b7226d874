"""The engine's public contract: the worked example, the step loop, aborts, bad input, no leaks."""

from __future__ import annotations

import pytest

from mini import LLM, SamplingParams
from mini.core.request import RequestStatus
from mini.sampling_params import RequestOutputKind

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

WORKED_EXAMPLE = [[1, 2, 3, 4, 5], [1, 6, 5, 7, 8, 9, 10], [1, 12, 13]]


def free_blocks_are_all_but_null(llm: LLM) -> bool:
    pool = llm.llm_engine.scheduler.kv_cache_manager.block_pool
    return pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


def test_worked_example_through_the_engine(tiny_llama_dir):
    """Three prompts, block_size=4, fresh pool: the tensors every vLLM explainer draws."""
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, block_size=4)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    for index, prompt in enumerate(WORKED_EXAMPLE):
        engine.add_request(f"r{index}", {"prompt_token_ids": prompt}, params)
    traces = []
    engine.add_step_observer(traces.append)

    engine.step()
    kv = engine.scheduler.kv_cache_manager
    assert [kv.get_block_ids(f"r{i}") for i in range(3)] == [[1, 2], [3, 4], [5]]
    inputs = traces[-1].inputs
    assert inputs["query_start_loc"].tolist() == [0, 5, 12, 15]
    assert inputs["seq_lens"].tolist() == [5, 7, 3]
    assert inputs["positions"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2]
    assert inputs["slot_mapping"].tolist() == [4, 5, 6, 7, 8, 12, 13, 14, 15, 16, 17, 18, 20, 21, 22]
    assert inputs["logits_indices"].tolist() == [4, 11, 14]

    engine.step()
    inputs = traces[-1].inputs
    assert inputs["positions"].tolist() == [5, 7, 3]
    assert inputs["slot_mapping"].tolist() == [9, 19, 23]
    assert inputs["seq_lens"].tolist() == [6, 8, 4]
    assert inputs["query_start_loc"].tolist() == [0, 1, 2, 3]

    while engine.has_unfinished_requests():
        engine.step()
    assert free_blocks_are_all_but_null(llm)


def test_step_loop_streams_and_finishes(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True)
    engine = llm.llm_engine
    engine.add_request("a", {"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=4, ignore_eos=True))
    seen = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            seen.append((output.request_id, len(output.outputs[0].token_ids), output.finished))
    assert seen == [("a", 1, False), ("a", 2, False), ("a", 3, False), ("a", 4, True)]
    assert free_blocks_are_all_but_null(llm)


def test_abort_frees_blocks_and_reports_abort(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, block_size=4)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    engine.add_request("keep", {"prompt_token_ids": [3, 4, 5, 6]}, params)
    engine.add_request("drop", {"prompt_token_ids": [7, 8, 9]}, params)
    engine.step()
    engine.abort_request(["drop"])
    assert engine.scheduler.kv_cache_manager.get_block_ids("drop") == []
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
    assert finished["drop"].outputs[0].finish_reason == "abort"
    assert finished["keep"].outputs[0].finish_reason == "length"
    assert len(finished["keep"].outputs[0].token_ids) == 50
    assert free_blocks_are_all_but_null(llm)


def test_bad_request_leaves_others_untouched(tiny_llama_dir):
    """A bad request raises at add time, changes nothing, and the good ones give the same tokens."""
    prompts = [[3, 4, 5, 6], [9, 10], [11, 12, 13, 14, 15]]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    alone = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True).generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)

    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True)
    engine = llm.llm_engine
    for index, prompt in enumerate(prompts):
        engine.add_request(f"good{index}", {"prompt_token_ids": prompt}, params)
    engine.step()
    free_before = engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    bad_inputs = [
        ({"prompt_token_ids": []}, params, "prompt"),
        ({"prompt_token_ids": [1, 10_000]}, params, "vocab"),
        ({"prompt_token_ids": list(range(1, 200)) * 2}, params, "max_model_len"),
        ("text but no tokenizer", params, "tokenizer"),
    ]
    for prompt, bad_params, word in bad_inputs:
        with pytest.raises(ValueError, match=word):
            engine.add_request("bad", prompt, bad_params)
        assert "bad" not in engine.scheduler.requests
    assert engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == free_before
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("good0", {"prompt_token_ids": [1]}, params)

    results = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                results[output.request_id] = output.outputs[0].token_ids
    assert [results[f"good{i}"] for i in range(3)] == [o.outputs[0].token_ids for o in alone]
    assert free_blocks_are_all_but_null(llm)


def test_generate_validates_every_prompt_before_queueing(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="prompt 1"):
        llm.generate([{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": []}], use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError, match="scheduling_policy"):
        LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, scheduling_policy="lifo")
    with pytest.raises(ValueError, match="priority"):
        llm.generate([{"prompt_token_ids": [1, 2]}], priority=[1], use_tqdm=False)


def test_max_model_len_stops_with_length(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, max_model_len=12)
    out = llm.generate({"prompt_token_ids": list(range(1, 9))},
                       SamplingParams(max_tokens=100, ignore_eos=True), use_tqdm=False)[0]
    assert out.outputs[0].finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 12


def test_stop_token_ids_and_min_tokens(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True)
    prompt = {"prompt_token_ids": [4, 5, 6]}
    free = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0].token_ids
    stop_id = free[3]
    first = free.index(stop_id)
    stopped = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[stop_id]),
                           use_tqdm=False)[0].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_id
    assert list(stopped.token_ids) == list(free[: first + 1])


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True)
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=10, ignore_eos=True)
    alone = llm.generate({"prompt_token_ids": [4, 5, 6]}, seeded, use_tqdm=False)[0].outputs[0].token_ids
    others = SamplingParams(temperature=0.8, max_tokens=10, ignore_eos=True)
    batch = llm.generate([{"prompt_token_ids": [9, 9]}, {"prompt_token_ids": [4, 5, 6]}, {"prompt_token_ids": [7]}],
                         [others, seeded, others], use_tqdm=False)
    assert list(batch[1].outputs[0].token_ids) == list(alone)


def test_parallel_sampling_n(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True)
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)
    out = llm.generate({"prompt_token_ids": [4, 5, 6]}, params, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 6 for c in out.outputs)
    again = llm.generate({"prompt_token_ids": [4, 5, 6]}, params, use_tqdm=False)[0]
    assert [c.token_ids for c in out.outputs] == [c.token_ids for c in again.outputs]
    assert params.output_kind == RequestOutputKind.CUMULATIVE   # generate asked for FINAL_ONLY on its own copy
    assert free_blocks_are_all_but_null(llm)


def test_request_status_enum_has_vllm_states():
    names = {status.name for status in RequestStatus}
    assert {"WAITING", "RUNNING", "PREEMPTED", "FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED",
            "FINISHED_ABORTED"} <= names


def test_prompt_larger_than_the_kv_pool_is_refused_cleanly(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, block_size=4, num_gpu_blocks_override=3)
    engine = llm.llm_engine
    with pytest.raises(ValueError, match="prompt_token_ids"):
        engine.add_request("big", {"prompt_token_ids": list(range(1, 11))}, SamplingParams(max_tokens=2))
    assert not engine.has_unfinished_requests()
    assert not engine.output_processor.has_request("big")
    out = llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=3, ignore_eos=True),
                       use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 3


def test_generate_tokenizes_each_prompt_once(monkeypatch):
    """`LLM.generate` processes every prompt before queueing any, and queues the processed requests: one
    tokenization per prompt (the engine's `add_request` takes the processed `EngineCoreRequest`)."""
    llm = LLM(num_gpu_blocks_override=32, max_model_len=128)
    tokenizer = llm.get_tokenizer()
    calls: list[str] = []
    encode = tokenizer.encode
    monkeypatch.setattr(tokenizer, "encode", lambda text, *a, **k: calls.append(text) or encode(text, *a, **k))
    prompts = ["Hello there", "The cat sat on", "Once upon a time"]
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=2, detokenize=False),
                           use_tqdm=False)
    assert calls == prompts
    assert [o.prompt_token_ids for o in outputs] == [encode(p) for p in prompts]
    assert [o.request_id for o in outputs] == ["0", "1", "2"]


def test_generate_refuses_a_batch_before_queueing_any_of_it(tiny_llama_dir):
    """A prompt that cannot fit the KV pool, last in the batch: nothing is queued, no request id is used."""
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, block_size=4, num_gpu_blocks_override=3)
    engine = llm.llm_engine
    fits, too_big = {"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": list(range(1, 11))}
    with pytest.raises(ValueError, match="prompt 2: prompt_token_ids has 10 tokens"):
        llm.generate([fits, fits, too_big], SamplingParams(max_tokens=2), use_tqdm=False)
    assert not engine.has_unfinished_requests() and not engine.output_processor.has_request("0")
    assert llm.generate(fits, SamplingParams(max_tokens=1), use_tqdm=False)[0].request_id == "0"


def test_add_request_takes_a_processed_request(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True)
    engine = llm.llm_engine
    processed = engine.process_request("p", {"prompt_token_ids": [4, 5, 6]}, SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="does not match"):
        engine.add_request("q", processed)
    engine.add_request("p", processed)
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("p", processed)
    finished = []
    while engine.has_unfinished_requests():
        finished += [out for out in engine.step() if out.finished]
    assert [out.request_id for out in finished] == ["p"] and len(finished[0].outputs[0].token_ids) == 2
