"""AsyncLLM: one background engine loop, per-request async streams, abort on cancel, errors stay local."""

from __future__ import annotations

import asyncio

import pytest
from patience import HANG_GUARD_S

from mini import LLM, SamplingParams
from mini.config import EngineConfig
from mini.engine.async_llm import AsyncLLM, EngineDeadError, EngineStepError, merge_delta_outputs
from mini.engine.output_processor import replace_by_index
from mini.outputs import CompletionOutput, RequestOutput
from mini.sampling_params import RequestOutputKind

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

PROMPTS = ["Once upon a time", "The little dog", "A cat sat on the", "Tom and Sue went"]
TIMEOUT_S = HANG_GUARD_S


def greedy(max_tokens: int, kind: RequestOutputKind = RequestOutputKind.CUMULATIVE, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, output_kind=kind, **kw)


@pytest.fixture(scope="module")
def engine():
    async_llm = AsyncLLM(EngineConfig(max_num_seqs=8))
    yield async_llm
    async_llm.shutdown()


@pytest.fixture(scope="module")
def reference_texts():
    outs = LLM(max_num_seqs=8).generate(PROMPTS, greedy(12), use_tqdm=False)
    return [o.outputs[0].text for o in outs]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT_S))


def all_blocks_free(async_llm: AsyncLLM) -> bool:
    stats = run(async_llm.get_scheduler_stats())
    return (stats.num_running_reqs + stats.num_waiting_reqs == 0
            and stats.kv_cache_usage == 0.0)   # every usable block is free (counters: no pool copy)


async def collect(async_llm, prompt, params, request_id):
    return [out async for out in async_llm.generate(prompt, params, request_id)]


def test_concurrent_streams_match_offline_generate(engine, reference_texts):
    async def main():
        kinds = [RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY,
                 RequestOutputKind.DELTA]
        return await asyncio.gather(*(collect(engine, p, greedy(12, k), f"c{i}")
                                      for i, (p, k) in enumerate(zip(PROMPTS, kinds, strict=False))))

    delta, cumulative, final_only, delta2 = run(main())
    assert "".join(o.outputs[0].text for o in delta) == reference_texts[0]
    assert sum(len(o.outputs[0].token_ids) for o in delta) == 12
    assert cumulative[-1].outputs[0].text == reference_texts[1]
    assert [len(o.outputs[0].token_ids) for o in cumulative] == sorted(len(o.outputs[0].token_ids) for o in cumulative)
    assert len(final_only) == 1 and final_only[0].finished
    assert final_only[0].outputs[0].text == reference_texts[2]
    assert "".join(o.outputs[0].text for o in delta2) == reference_texts[3]
    assert [o.finished for o in delta].count(True) == 1 and delta[-1].finished
    assert all_blocks_free(engine)


def test_cancelled_caller_aborts_and_frees_blocks(engine):
    async def main():
        seen = []

        async def reader():
            async for out in engine.generate("Once upon a time", greedy(400), "cancel-me"):
                seen.append(out)

        task = asyncio.create_task(reader())
        while len(seen) < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The abort is queued at once and runs before the next step; nothing else is running.
        for _ in range(200):
            stats = await engine.get_scheduler_stats()
            if stats.num_running_reqs + stats.num_waiting_reqs == 0:
                return stats, seen
            await asyncio.sleep(0.01)
        raise AssertionError("the cancelled request is still scheduled")

    stats, seen = run(main())
    assert 3 <= len(seen) < 400
    assert stats.kv_cache_usage == 0.0   # every usable block is free again


def test_closing_the_generator_aborts(engine):
    async def main():
        stream = engine.generate("The little dog", greedy(400, RequestOutputKind.DELTA), "close-me")
        first = await stream.__anext__()
        await stream.aclose()
        # The same id is free again only once the abort has reached the engine.
        for _ in range(200):
            stats = await engine.get_scheduler_stats()
            if stats.num_running_reqs + stats.num_waiting_reqs == 0:   # the only request: aborted
                break
            await asyncio.sleep(0.01)
        again = await collect(engine, "The little dog", greedy(3), "close-me")
        return first, again

    first, again = run(main())
    assert not first.finished
    assert again[-1].finished and len(again[-1].outputs[0].token_ids) == 3
    assert all_blocks_free(engine)


def test_explicit_abort_ends_the_stream_with_abort(engine):
    async def main():
        outs = []
        async for out in engine.generate("A cat", greedy(400, RequestOutputKind.DELTA), "abort-me"):
            outs.append(out)
            if len(outs) == 2:
                await engine.abort("abort-me")
        return outs

    outs = run(main())
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
    assert len(outs) < 50
    assert all_blocks_free(engine)


def test_bad_request_raises_for_its_caller_only(engine, reference_texts):
    async def main():
        good = asyncio.create_task(collect(engine, PROMPTS[0], greedy(12), "good"))
        with pytest.raises(ValueError, match="prompt"):
            await collect(engine, {"prompt_token_ids": [10**6]}, greedy(4), "bad")
        with pytest.raises(ValueError, match="already in use"):
            await asyncio.sleep(0)
            await collect(engine, PROMPTS[0], greedy(4), "good")
        return await good

    outs = run(main())
    assert outs[-1].outputs[0].text == reference_texts[0]


def test_step_error_fails_the_batch_and_the_loop_goes_on(engine, monkeypatch, reference_texts):
    runner = engine.engine.model_runner
    original = runner.execute_model
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected failure")
        return original(*args, **kwargs)

    monkeypatch.setattr(runner, "execute_model", flaky)

    async def main():
        with pytest.raises(EngineStepError, match="injected failure"):
            await collect(engine, PROMPTS[1], greedy(20), "victim")
        return await collect(engine, PROMPTS[0], greedy(12), "after")

    outs = run(main())
    assert outs[-1].outputs[0].text == reference_texts[0]
    assert all_blocks_free(engine)


def test_stat_loggers_see_latencies():
    records = []
    async_llm = AsyncLLM(EngineConfig(max_num_seqs=4), stat_loggers=[lambda s, it: records.append((s, it))])
    try:
        run(collect(async_llm, "Once upon a time", greedy(5, RequestOutputKind.DELTA), "s"))
    finally:
        async_llm.shutdown()
    iterations = [it for _, it in records]
    assert sum(it.num_generation_tokens for it in iterations) == 5
    assert len([t for it in iterations for t in it.time_to_first_tokens_s]) == 1
    assert len([t for it in iterations for t in it.inter_token_latencies_s]) == 4
    finished = [f for it in iterations for f in it.finished_requests]
    assert [(f.request_id, f.finish_reason, f.num_generation_tokens) for f in finished] == [("s", "length", 5)]
    assert finished[0].num_prompt_tokens > 0 and finished[0].e2e_latency_s > 0


def test_shutdown_refuses_new_requests():
    async_llm = AsyncLLM(EngineConfig(max_num_seqs=2))
    async_llm.shutdown()
    assert not async_llm.is_running
    with pytest.raises(EngineDeadError):
        run(collect(async_llm, "hi", greedy(2), "late"))


def test_merge_delta_outputs_appends_per_index():
    def out(text, ids, finished=False, reason=None):
        completion = CompletionOutput(0, text, ids, None, None, finish_reason=reason)
        return RequestOutput("r", "p", [1], None, [completion], finished)

    merged = merge_delta_outputs(out("ab", [1, 2]), out("c", [3], True, "length"))
    assert merged.outputs[0].text == "abc" and merged.outputs[0].token_ids == [1, 2, 3]
    assert merged.finished and merged.outputs[0].finish_reason == "length"


def test_collector_folds_keep_vllms_sample_order():
    """vLLM's `RequestOutput.add` keeps the unread output's samples where they are and appends an index heard
    from only now: child 2 reported before child 0, so it stays first (mini sorted by index before)."""
    def out(*indices, text="x"):
        return RequestOutput("r", "p", [1], None, [CompletionOutput(i, text, [i], None, None) for i in indices],
                             False)

    for fold in (merge_delta_outputs, replace_by_index):
        folded = fold(out(2, 1), out(0, 2, text="y"))
        assert [c.index for c in folded.outputs] == [2, 1, 0], fold.__name__
        assert folded.outputs[0].text == ("xy" if fold is merge_delta_outputs else "y")


def test_cumulative_parallel_sampling_shows_one_child_per_output_as_vllm(engine):
    """n > 1 with CUMULATIVE through AsyncLLM: the children that reported since the last read (the collector
    folds what piles up, by sample index); the last output of each index is that sample's final text, the same
    as FINAL_ONLY's."""
    params = {"n": 3, "temperature": 1.0, "seed": 11, "max_tokens": 6, "ignore_eos": True}

    async def main():
        return await asyncio.gather(
            collect(engine, "Once upon a time", SamplingParams(**params, output_kind=RequestOutputKind.CUMULATIVE),
                    "cum-n3"),
            collect(engine, "Once upon a time", SamplingParams(**params, output_kind=RequestOutputKind.FINAL_ONLY),
                    "final-n3"))

    cumulative, final_only = run(main())
    latest: dict[int, CompletionOutput] = {}
    for out in cumulative:
        for completion in out.outputs:
            previous = latest.get(completion.index)
            assert previous is None or len(completion.token_ids) >= len(previous.token_ids)   # cumulative
            latest[completion.index] = completion
    assert [o.finished for o in cumulative].count(True) == 1 and cumulative[-1].finished
    (final,) = final_only
    assert sorted(latest) == [0, 1, 2] == [c.index for c in final.outputs]
    assert [latest[i].token_ids for i in range(3)] == [c.token_ids for c in final.outputs]
    assert len({tuple(c.token_ids) for c in final.outputs}) > 1    # the children sampled differently
    assert all_blocks_free(engine)


def test_engine_step_gives_one_output_per_reporting_child_under_cumulative():
    """vLLM v0.33.0's ParentRequest.get_outputs: with CUMULATIVE (as with DELTA) each child's report becomes its
    own RequestOutput under the parent's id, holding that child alone, its whole text so far (mini used to show
    every child heard from in each one)."""
    engine = LLM(max_num_seqs=8).llm_engine
    engine.add_request("p", "The little dog", SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=4,
                                                            ignore_eos=True))
    steps = []
    while engine.has_unfinished_requests():
        steps.append(engine.step())
    outputs = [o for step in steps for o in step]
    assert all(o.request_id == "p" and len(o.outputs) == 1 for o in outputs)
    assert max(sum(o.outputs[0].index == i for o in step) for step in steps for i in range(3)) == 1
    reports = {0: 0, 1: 0, 2: 0}
    for out in outputs:   # each report holds the child's whole output so far: one token more than its last
        reports[out.outputs[0].index] += 1
        assert len(out.outputs[0].token_ids) == reports[out.outputs[0].index]
    assert reports == {0: 4, 1: 4, 2: 4}
    assert [o.finished for o in outputs] == [False] * 11 + [True]


def test_a_slow_cumulative_reader_keeps_every_childs_newest_output():
    """vLLM's collector: `RequestOutput.add(next, aggregate=False)` replaces by sample index, appends new ones."""
    from mini.engine.output_processor import RequestOutputCollector

    def out(index, text, finished=False):
        return RequestOutput("r", "p", [1], None, [CompletionOutput(index, text, [len(text)], None, None)], finished)

    async def main():
        collector = RequestOutputCollector(RequestOutputKind.CUMULATIVE, asyncio.get_running_loop())
        for piece in (out(1, "a"), out(0, "x"), out(1, "ab"), out(2, "q"), out(0, "xy", True)):
            collector.put(piece)
        return await collector.get()

    merged = run(main())
    assert [(c.index, c.text) for c in merged.outputs] == [(1, "ab"), (0, "xy"), (2, "q")]
    assert merged.finished


def test_serving_dashboard_view_collects_one_sample_per_step():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from labs.views.serving_dashboard import ServingDashboard

    dashboard = ServingDashboard()
    async_llm = AsyncLLM(EngineConfig(max_num_seqs=2), stat_loggers=[dashboard])
    try:
        async def main():
            return await dashboard.watch(asyncio.gather(*(collect(async_llm, p, greedy(6), f"d{i}")
                                                          for i, p in enumerate(PROMPTS[:3]))), period_s=0.05)
        run(main())
    finally:
        async_llm.shutdown()
    samples = dashboard.snapshot()
    assert sum(s.generation_tokens for s in samples) == 18
    assert max(s.running for s in samples) == 2 and max(s.waiting for s in samples) >= 1   # max_num_seqs=2
    assert samples[-1].running == 0 and all(0.0 <= s.kv_cache_usage <= 1.0 for s in samples)
    times, rates = dashboard.tokens_per_s(bucket_s=0.25)
    assert times == sorted(times) and len(times) == len(rates)
    assert sum(rates) * 0.25 == pytest.approx(18)
    assert len(dashboard.figure().axes) == 3
