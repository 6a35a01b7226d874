"""The scheduler timeline: the recorded data model matches the engine's scheduler at every step, for
continuous and static batching on the phase-05 workload, and the views render."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest

from labs.views import (
    plot_batching_comparison,
    plot_scheduler_timeline,
    record_timeline,
    render_timeline_html,
    scheduler_timeline_widget,
)
from mini import LLM, SamplingParams
from mini.core.request import RequestStatus

# The phase-05 worked example: (prompt length, max_tokens) of six requests.
WORKLOAD = [(14, 4), (3, 12), (20, 3), (5, 8), (9, 3), (4, 6)]
ENGINE_ARGS = {
    "skip_tokenizer_init": True,
    "block_size": 4,
    "num_gpu_blocks_override": 12,
    "max_num_seqs": 3,
    "max_num_batched_tokens": 16,
    "long_prefill_token_threshold": 8,
    "max_model_len": 64,
}


def _prompts():
    return [
        {"prompt_token_ids": [1 + (7 * i + j) % 40 for j in range(n)]} for i, (n, _) in enumerate(WORKLOAD)
    ]


def _params():
    return [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for _, m in WORKLOAD]


class EngineMirror:
    """Replays the recorded steps and compares them with the live scheduler after every step."""

    def __init__(self) -> None:
        self.computed: dict[str, int] = {}
        self.num_steps = 0

    def __call__(self, engine, step) -> None:
        scheduler = engine.scheduler
        self.num_steps += 1
        assert step.step >= self.num_steps
        assert step.tokens_used <= scheduler.max_num_scheduled_tokens
        assert len(step.num_scheduled_tokens) <= scheduler.max_num_running_reqs
        assert step.running == [r.request_id for r in scheduler.running]
        assert step.waiting == [r.request_id for r in scheduler.waiting]
        assert step.num_free_blocks == scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        for req_id in step.preempted:
            self.computed[req_id] = 0
            assert req_id not in step.num_scheduled_tokens
            assert req_id in step.waiting or req_id in step.finished
        for req_id, num_tokens in step.num_scheduled_tokens.items():
            assert step.num_computed_before[req_id] == self.computed.get(req_id, 0)
            self.computed[req_id] = self.computed.get(req_id, 0) + num_tokens
            kind = step.kinds[req_id]
            assert kind in ("prefill", "chunk", "decode")
            prompt_len = WORKLOAD[int(req_id[1:])][0]
            if kind == "decode":
                assert num_tokens == 1 and self.computed[req_id] > prompt_len
            if num_tokens > 1 or self.computed[req_id] <= prompt_len:
                assert kind != "decode"
        for req_id, computed in self.computed.items():
            request = scheduler.requests.get(req_id)
            if req_id in step.finished:
                assert request is None  # freed at once
            elif request is not None:
                assert request.num_computed_tokens == computed
                assert request.status in (
                    RequestStatus.RUNNING,
                    RequestStatus.PREEMPTED,
                    RequestStatus.WAITING,
                )


@pytest.fixture(scope="module")
def timelines():
    llm = LLM(**ENGINE_ARGS)
    mirrors = {"continuous": EngineMirror(), "static": EngineMirror()}
    continuous = record_timeline(llm, _prompts(), _params(), on_step=mirrors["continuous"])
    static = record_timeline(llm, _prompts(), _params(), static_batch_size=3, on_step=mirrors["static"])
    return continuous, static, mirrors


def test_recording_matches_the_engine_at_every_step(timelines):
    continuous, static, mirrors = timelines
    assert mirrors["continuous"].num_steps == len(continuous.steps) > 0
    assert mirrors["static"].num_steps == len(static.steps) > 0


def test_every_request_gets_its_tokens_and_finishes_once(timelines):
    for timeline in timelines[:2]:
        finish = timeline.finish_step()
        assert sorted(finish) == sorted(timeline.request_ids)
        for req_id, (prompt_len, max_tokens) in zip(timeline.request_ids, WORKLOAD, strict=False):
            decodes = sum(1 for s in timeline.steps if s.kinds.get(req_id) == "decode")
            preempted = any(req_id in s.preempted for s in timeline.steps)
            # max_tokens outputs: the first comes from the (last) prefill step, the rest from decodes
            assert decodes == max_tokens - 1 or preempted
            assert timeline.steps[-1].running == [] and timeline.steps[-1].waiting == []
            del prompt_len


def test_worked_example_chunks_and_preemption(timelines):
    continuous = timelines[0]
    first = continuous.steps[0]
    # step 1: r0 (14 tokens) capped at 8 by the threshold, r1 (3) whole, r2 the 5 left of the budget of 16
    assert first.num_scheduled_tokens == {"r0": 8, "r1": 3, "r2": 5}
    assert first.kinds == {"r0": "chunk", "r1": "prefill", "r2": "chunk"}
    assert any(s.preempted for s in continuous.steps), "the small pool forces a preemption"
    grid = continuous.grid()
    assert len(grid) == 6 and all(len(row) == len(continuous.steps) for row in grid)


def test_static_batching_wastes_slots(timelines):
    continuous, static, _ = timelines
    # static batching: r3..r5 are only submitted once r0..r2 are all done
    first_r3 = next(s.step for s in static.steps if "r3" in s.num_scheduled_tokens)
    assert first_r3 > max(static.finish_step()[r] for r in ("r0", "r1", "r2"))
    assert all(s.not_submitted == ["r3", "r4", "r5"] for s in static.steps if s.step < first_r3)
    assert static.cell("r3", 0) == "held" and continuous.cell("r3", 0) == "waiting"
    assert sum(static.wasted_slots()) > sum(continuous.wasted_slots())
    assert len(static.steps) >= len(continuous.steps)
    assert all(0 <= w <= static.max_num_seqs for w in static.wasted_slots())


def test_views_render(timelines):
    continuous, static, _ = timelines
    text = render_timeline_html(continuous, step=0)
    assert "r5" in text and "step 1" in text
    assert plot_scheduler_timeline(continuous) is not None
    assert len(plot_batching_comparison(continuous, static)) == 3
    widget = scheduler_timeline_widget(continuous)
    assert widget.timeline is continuous
    assert widget.text().startswith("Text view of the scheduler-timeline widget") and "r5" in widget.text()
    assert widget._repr_mimebundle_()["text/plain"] == widget.text()
