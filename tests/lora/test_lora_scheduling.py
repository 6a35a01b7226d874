"""Inside the engine: the scheduler's `max_loras` limit, the adapters' slots and CPU cache, the prefix-cache hash.

vLLM: vllm/v1/core/sched/scheduler.py (`scheduled_loras`), vllm/lora/worker_manager.py (the LRU caches),
vllm/v1/core/kv_cache_utils.py (the LoRA extra hash keys).
"""

from __future__ import annotations

import pytest

from mini import LLM, LoRARequest, SamplingParams
from mini.core import kv_cache_utils

pytestmark = pytest.mark.inprocess_engine


def test_at_most_max_loras_adapters_per_step_and_every_block_returns(tiny_llama_dir, lora_adapters):
    llm = LLM(model=str(tiny_llama_dir), enable_lora=True, max_loras=1, max_cpu_loras=1, max_lora_rank=8,
              skip_tokenizer_init=True, num_gpu_blocks_override=40)
    engine = llm.llm_engine
    loras = [LoRARequest(name, index + 1, str(path)) for index, (name, path) in enumerate(lora_adapters.items())]
    per_step: list[set[int]] = []
    batch = [loras[0], loras[1], None, loras[2], loras[0], None, loras[1]]
    lora_of = {str(index): lora for index, lora in enumerate(batch)}   # LLM's request ids count from 0

    def observe(trace):
        scheduled = [lora_of[req_id] for req_id in trace.scheduler_output.num_scheduled_tokens]
        per_step.append({lora.lora_int_id for lora in scheduled if lora is not None})

    engine.add_step_observer(observe)
    pool = engine.scheduler.kv_cache_manager.block_pool
    free_before = pool.get_num_free_blocks()
    outputs = llm.generate([{"prompt_token_ids": [5, 6, 7, i]} for i in range(len(batch))],
                           SamplingParams(temperature=0.0, max_tokens=3), lora_request=batch, use_tqdm=False)
    assert all(len(output.outputs[0].token_ids) == 3 for output in outputs)
    assert per_step and max(len(ids) for ids in per_step) == 1, f"adapters per step: {per_step}"
    assert {i for ids in per_step for i in ids} == {1, 2, 3}, "every adapter ran"
    assert pool.get_num_free_blocks() == free_before, "a block leaked"
    manager = engine.model_runner.lora_manager
    assert len(manager.cpu_cache) == 1 and len(manager.slots) == 1
    assert manager.num_loads >= 3, "max_cpu_loras=1: each new adapter is read from its folder"


def test_base_requests_are_not_held_back_by_the_limit(tiny_llama_dir, lora_adapters):
    llm = LLM(model=str(tiny_llama_dir), enable_lora=True, max_loras=1, max_lora_rank=8, skip_tokenizer_init=True)
    engine = llm.llm_engine
    a = LoRARequest("a", 1, str(lora_adapters["a"]))
    b = LoRARequest("b", 2, str(lora_adapters["b"]))
    params = SamplingParams(temperature=0.0, max_tokens=4)
    for index, lora in enumerate([a, b, None]):
        engine.add_request(str(index), {"prompt_token_ids": [1, 2, 3]}, params, lora_request=lora)
    engine.step()
    running = {r.request_id for r in engine.scheduler.running}
    assert running == {"0", "2"}, "b waits (a holds the one slot); the base request is not an adapter and runs"
    assert [r.request_id for r in engine.scheduler.waiting] == ["1"]
    while engine.has_unfinished_requests():
        engine.step()


def test_lora_enters_the_first_blocks_hash():
    a, b = LoRARequest("a", 1, "/x/a"), LoRARequest("b", 2, "/x/b")
    tokens = list(range(40))
    plain = kv_cache_utils.hash_request_tokens(16, tokens, kv_cache_utils.lora_cache_salt(None, None))
    with_a = kv_cache_utils.hash_request_tokens(16, tokens, kv_cache_utils.lora_cache_salt(None, a))
    with_b = kv_cache_utils.hash_request_tokens(16, tokens, kv_cache_utils.lora_cache_salt(None, b))
    assert len({plain[1], with_a[1], with_b[1]}) == 3, "the chain carries the adapter to every block"
    assert kv_cache_utils.lora_cache_salt("s", None) == "s"
    assert kv_cache_utils.lora_cache_salt("s", a) != kv_cache_utils.lora_cache_salt(None, a)


def test_lora_request_crosses_the_process_boundary_intact():
    from mini.engine import EngineCoreRequest
    from mini.sampling_params import SamplingParams as Params
    from mini.serial_utils import decode_request, encode

    lora = LoRARequest("a", 3, "/x/a")
    for value in (lora, None):
        request = EngineCoreRequest("r", None, [1, 2], Params(max_tokens=2), None, 0.0, lora_request=value)
        assert decode_request(encode(request)).lora_request == value


def test_the_course_admission_rule_is_the_schedulers(tiny_llama_dir, lora_adapters):
    """labs/checks/p16.py grades phase 16's admission exercise against `admission_reference`: it must say what the
    scheduler does (two slots, three adapters and base requests, queue order kept for the one left waiting)."""
    from labs.checks.p16 import admission_reference

    llm = LLM(model=str(tiny_llama_dir), enable_lora=True, max_loras=2, max_lora_rank=8, skip_tokenizer_init=True)
    engine = llm.llm_engine
    loras = {index + 1: LoRARequest(name, index + 1, str(path))
             for index, (name, path) in enumerate(lora_adapters.items())}
    waiting = [1, 2, 3, 0, 1, 3]
    params = SamplingParams(temperature=0.0, max_tokens=4)
    for index, lora_id in enumerate(waiting):
        engine.add_request(str(index), {"prompt_token_ids": [1, 2, 3]}, params, lora_request=loras.get(lora_id))
    engine.step()
    admitted = sorted(int(r.request_id) for r in engine.scheduler.running)
    assert admitted == admission_reference([], waiting, 2, len(waiting)) == [0, 1, 3, 4]
    assert [r.request_id for r in engine.scheduler.waiting] == ["2", "5"]
    while engine.has_unfinished_requests():
        engine.step()
