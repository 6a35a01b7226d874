"""The step observer (mini/metrics/step_trace.py): called once per step that schedules, with that step's
scheduler output, flat inputs, batch update, sampled tokens and outputs, and a pool snapshot taken only on
demand; an engine without observers builds no trace and copies nothing (nor does `AsyncLLM` for its stat
loggers: they get counters)."""

from __future__ import annotations

import asyncio

import pytest
from patience import HANG_GUARD_S

from mini import LLM, SamplingParams
from mini.engine.async_llm import AsyncLLM
from mini.metrics.stats import PoolSnapshot, SchedulerStats
from mini.metrics.step_trace import StepTrace

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

PROMPTS = [[1, 2, 3, 4, 5], [1, 6, 5, 7, 8, 9, 10], [1, 12, 13]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


@pytest.fixture()
def llm(tiny_llama_dir):
    return LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, block_size=4, num_gpu_blocks_override=32)


def add_prompts(engine, prompts=PROMPTS, params=GREEDY):
    for index, prompt in enumerate(prompts):
        engine.add_request(f"r{index}", {"prompt_token_ids": prompt}, params)


def forbid_snapshots(monkeypatch):
    """Make any pool copy fail loudly: the snapshot itself and the pool reads it is made of."""
    def refuse(*args, **kwargs):
        raise AssertionError("the KV pool was copied")

    monkeypatch.setattr(PoolSnapshot, "from_scheduler", classmethod(refuse))


def test_called_once_per_step_with_that_steps_fields(llm):
    engine = llm.llm_engine
    add_prompts(engine)
    seen: list[tuple[StepTrace, PoolSnapshot, list[int]]] = []

    def observe(trace: StepTrace) -> None:
        blocks = engine.scheduler.kv_cache_manager.get_block_ids("r0")
        seen.append((trace, trace.snapshot(), blocks))

    engine.add_step_observer(observe)
    returned = []
    while engine.has_unfinished_requests():
        returned.append(engine.step())
    assert len(seen) == len(returned) == 3                                  # prefill, then two decode steps
    assert [trace.step for trace, _, _ in seen] == [1, 2, 3]
    first, snapshot, blocks = seen[0]
    assert first.scheduler_output.num_scheduled_tokens == {"r0": 5, "r1": 7, "r2": 3}
    assert first.req_ids == ["r0", "r1", "r2"]
    assert first.inputs["query_start_loc"].tolist() == [0, 5, 12, 15]
    assert first.inputs["slot_mapping"].tolist() == [4, 5, 6, 7, 8, 12, 13, 14, 15, 16, 17, 18, 20, 21, 22]
    assert [row for row, *_ in first.batch_update.added] == [0, 1, 2]       # three rows added on step 1
    assert seen[1][0].batch_update is None                                   # nothing moved on step 2
    assert snapshot.block_ids == {"r0": [1, 2], "r1": [3, 4], "r2": [5]} and blocks == [1, 2]
    assert snapshot.running_req_ids == ["r0", "r1", "r2"] and snapshot.num_gpu_blocks == 32
    for (trace, _, _), outputs in zip(seen, returned, strict=False):
        produced = {out.request_id: list(out.outputs[0].token_ids) for out in outputs}
        assert {o.request_id: o.new_token_ids for o in trace.outputs} == {    # what the core's step returned
            r: produced[r][-len(o.new_token_ids):] for o in trace.outputs for r in [o.request_id]}
        assert sorted(o.request_id for o in trace.outputs) == sorted(produced)
        assert {r: produced[r][-1:] for r in trace.req_ids} == dict(zip(trace.req_ids, trace.sampled_token_ids,
                                                                        strict=False))
    assert seen[-1][1].block_ids == {}                                        # all finished: blocks freed
    assert all(trace.grammar_mask_seconds is None for trace, _, _ in seen)  # no structured output here


def test_a_step_that_schedules_nothing_has_no_trace(llm):
    engine = llm.llm_engine
    add_prompts(engine, PROMPTS[:1])
    traces: list[StepTrace] = []
    engine.add_step_observer(traces.append)
    engine.abort_request("r0")
    outputs = engine.step()                                                  # only the abort's final output
    assert [out.finished for out in outputs] == [True] and traces == []


def test_snapshot_only_inside_the_observer(llm):
    engine = llm.llm_engine
    add_prompts(engine, PROMPTS[:1])
    kept: list[StepTrace] = []
    engine.add_step_observer(kept.append)                                     # keeps the trace, takes nothing
    engine.step()
    with pytest.raises(RuntimeError, match="inside the observer"):
        kept[0].snapshot()
    remove = engine.add_step_observer(lambda trace: trace.snapshot())
    engine.step()
    assert kept[1].snapshot().block_ids == {"r0": [1, 2]}                     # taken during the step: kept
    remove()
    engine.remove_step_observer(kept.append)
    engine.step()
    assert len(kept) == 2
    with pytest.raises(TypeError, match="callable"):
        engine.add_step_observer("not a function")


def test_no_observer_no_trace_and_no_copy(llm, monkeypatch):
    engine = llm.llm_engine
    forbid_snapshots(monkeypatch)
    built = []
    monkeypatch.setattr(StepTrace, "__init__", lambda self, *a, **k: built.append(1))
    out = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in out] == [3, 3, 3]
    assert built == [] and engine.model_runner.input_batch.batch_update_listener is None
    stats = engine.get_scheduler_stats()                                     # counters only: no copy either
    assert isinstance(stats, SchedulerStats) and stats.step == 3 and stats.kv_cache_usage == 0.0


def test_an_observer_that_takes_no_snapshot_copies_nothing(llm, monkeypatch):
    forbid_snapshots(monkeypatch)
    traces: list[StepTrace] = []
    llm.llm_engine.add_step_observer(traces.append)
    llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False)
    assert len(traces) == 3


def test_async_llm_stat_loggers_get_counters_without_a_pool_copy(tiny_llama_dir, monkeypatch):
    forbid_snapshots(monkeypatch)
    records: list[SchedulerStats] = []
    engine = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True).llm_engine
    async_llm = AsyncLLM(engine=engine, stat_loggers=[lambda stats, iteration: records.append(stats)])

    async def run() -> list:
        return [out async for out in async_llm.generate({"prompt_token_ids": [4, 5, 6]}, GREEDY, "a")]

    try:
        outputs = asyncio.run(asyncio.wait_for(run(), HANG_GUARD_S))
    finally:
        async_llm.shutdown()
    assert outputs[-1].finished and len(records) >= 3
    assert all(type(stats) is SchedulerStats for stats in records)
    assert records[-1].num_running_reqs == 0 and records[-1].kv_cache_usage == 0.0
