"""mini.worker: prepare_inputs (the worked example), the persistent batch rules, and ModelRunner steps."""

from __future__ import annotations

import pytest
import torch

from mini.config import EngineConfig
from mini.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from mini.metrics.step_trace import StepTrace
from mini.model.loader import load_model
from mini.sample.logits_processor.interface import MoveDirectionality
from mini.sampling_params import SamplingParams
from mini.worker.input_batch import CachedRequestState, InputBatch
from mini.worker.model_runner import ModelRunner
from mini.worker.prepare_inputs import (
    compute_positions,
    compute_query_start_loc,
    compute_slot_mapping,
    prepare_inputs,
)

WORKED_PROMPTS = [[1, 2, 3, 4, 5], [1, 6, 5, 7, 8, 9, 10], [1, 12, 13]]
WORKED_BLOCKS = [[1, 2], [3, 4], [5]]


# ---------------------------------------------------------------------- prepare_inputs
def test_worked_example_prefill():
    inputs = prepare_inputs(WORKED_PROMPTS, [0, 0, 0], [5, 7, 3], WORKED_BLOCKS, block_size=4)
    assert inputs.input_ids.tolist() == [t for prompt in WORKED_PROMPTS for t in prompt]
    assert inputs.query_start_loc.tolist() == [0, 5, 12, 15]
    assert inputs.seq_lens.tolist() == [5, 7, 3]
    assert inputs.positions.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2]
    assert inputs.slot_mapping.tolist() == [4, 5, 6, 7, 8, 12, 13, 14, 15, 16, 17, 18, 20, 21, 22]
    assert inputs.logits_indices.tolist() == [4, 11, 14]
    assert inputs.block_table.tolist() == [[1, 2], [3, 4], [5, 0]]
    dtypes = {name: inputs[name].dtype for name in inputs}
    assert dtypes == {"input_ids": torch.int64, "positions": torch.int64, "query_start_loc": torch.int32,
                      "seq_lens": torch.int32, "slot_mapping": torch.int64, "block_table": torch.int32,
                      "logits_indices": torch.int64}


def test_worked_example_decode():
    tokens = [p + [99] for p in WORKED_PROMPTS]  # one sampled token each
    inputs = prepare_inputs(tokens, [5, 7, 3], [1, 1, 1], WORKED_BLOCKS, block_size=4)
    assert inputs.input_ids.tolist() == [99, 99, 99]
    assert inputs.positions.tolist() == [5, 7, 3]
    assert inputs.slot_mapping.tolist() == [9, 19, 23]
    assert inputs.seq_lens.tolist() == [6, 8, 4]
    assert inputs.query_start_loc.tolist() == [0, 1, 2, 3]
    assert inputs.logits_indices.tolist() == [0, 1, 2]


def test_lab_helpers():
    assert compute_query_start_loc([3, 1, 4]).tolist() == [0, 3, 4, 8]
    assert compute_positions([0, 7, 2], [3, 1, 2]).tolist() == [0, 1, 2, 7, 2, 3]
    table = torch.tensor([[9, 4, 0], [2, 0, 0]], dtype=torch.int32)
    slots = compute_slot_mapping(table, torch.tensor([0, 0, 0, 1]), torch.tensor([3, 4, 8, 1]), block_size=4)
    assert slots.tolist() == [39, 16, 0 * 4 + 0, 9]  # position 8 -> third entry: the 0 pad (null block)


@pytest.mark.parametrize("bad, match", [
    ({"num_scheduled_tokens": [5, 7]}, "one entry per request"),
    ({"num_scheduled_tokens": [5, 8, 3]}, "num_scheduled_tokens"),
    ({"block_ids": [[1], [3, 4], [5]]}, "block_ids"),
    ({"block_size": 0}, "block_size must be a positive int"),
])
def test_prepare_inputs_rejects_inconsistent_input(bad, match):
    args = {"token_ids": WORKED_PROMPTS, "num_computed_tokens": [0, 0, 0], "num_scheduled_tokens": [5, 7, 3],
            "block_ids": WORKED_BLOCKS, "block_size": 4}
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        prepare_inputs(**args)


# ---------------------------------------------------------------------- persistent batch
def state(req_id: str) -> CachedRequestState:
    return CachedRequestState(req_id=req_id, prompt_token_ids=[1, 2], output_token_ids=[],
                              sampling_params=SamplingParams(), generator=None, block_ids=[1],
                              num_computed_tokens=0)


def batch_of(*req_ids: str) -> InputBatch:
    batch = InputBatch(max_num_reqs=8)
    for req_id in req_ids:
        batch.add_request(state(req_id))
    batch.condense()
    batch.get_batch_update()
    return batch


def test_fewer_new_than_finished_condenses_from_the_end():
    batch = batch_of("A", "B", "C", "D")
    batch.remove_request("A")
    batch.remove_request("C")
    assert batch.add_request(state("E")) == 0  # lowest hole
    batch.condense()
    assert batch.req_ids == ["E", "B", "D"]
    assert batch.req_id_to_index == {"E": 0, "B": 1, "D": 2}
    update = batch.get_batch_update()
    assert update.batch_size == 3
    assert [added[0] for added in update.added] == [0]
    assert list(update.removed) == [2]
    assert list(update.moved) == [(3, 2, MoveDirectionality.UNIDIRECTIONAL)]
    assert batch.get_batch_update() is None  # nothing changed since


def test_more_new_than_finished_extends_the_batch():
    batch = batch_of("A", "B", "C", "D")
    batch.remove_request("C")
    assert [batch.add_request(state(r)) for r in ("E", "F")] == [2, 4]
    batch.condense()
    assert batch.req_ids == ["A", "B", "E", "D", "F"]
    update = batch.get_batch_update()
    assert (list(update.removed), [a[0] for a in update.added], list(update.moved)) == ([], [2, 4], [])


def test_condense_fills_lowest_holes_with_highest_rows():
    batch = batch_of("A", "B", "C", "D", "E", "F")
    for req_id in ("A", "B", "E"):
        batch.remove_request(req_id)
    batch.condense()
    assert batch.req_ids == ["F", "D", "C"]
    update = batch.get_batch_update()
    assert list(update.moved) == [(5, 0, MoveDirectionality.UNIDIRECTIONAL),
                                  (3, 1, MoveDirectionality.UNIDIRECTIONAL)]
    assert list(update.removed) == [0, 1, 4]


def test_batch_capacity_and_duplicates():
    batch = batch_of("A")
    with pytest.raises(ValueError, match="already in the batch"):
        batch.add_request(state("A"))
    small = InputBatch(max_num_reqs=1)
    small.add_request(state("A"))
    with pytest.raises(ValueError, match="max_num_reqs=1"):
        small.add_request(state("B"))


# ---------------------------------------------------------------------- ModelRunner
@pytest.fixture(scope="module")
def tiny(tiny_model_factory):
    """(model folder, transformers model) for the shared tiny tied Llama (vocab 211)."""
    from transformers import AutoModelForCausalLM

    folder = tiny_model_factory("llama-tied")
    return folder, AutoModelForCausalLM.from_pretrained(folder).eval()


def make_runner(folder, **config) -> ModelRunner:
    engine_config = EngineConfig(model=str(folder), block_size=4, **config)
    model, hf_config = load_model(folder)
    return ModelRunner(engine_config, model, hf_config, num_blocks=40)


def hf_last_logprobs(hf_model, token_ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf_model(torch.tensor([token_ids])).logits[0].float().log_softmax(-1)


def new_req(req_id, prompt, blocks, params=None, computed=0):
    params = params or SamplingParams(temperature=0.0, max_tokens=8)
    return NewRequestData(req_id=req_id, prompt_token_ids=prompt, output_token_ids=[], sampling_params=params,
                          block_ids=blocks, num_computed_tokens=computed)


def step(new=(), cached=None, scheduled=None, finished=()):
    scheduled = scheduled or {}
    return SchedulerOutput(scheduled_new_reqs=list(new), scheduled_cached_reqs=cached or CachedRequestData(),
                           num_scheduled_tokens=scheduled, total_num_scheduled_tokens=sum(scheduled.values()),
                           finished_req_ids=set(finished))


def execute_traced(runner, scheduler_output):
    """One runner step with a step trace attached -> (its ModelRunnerOutput, the flat inputs it built)."""
    trace = StepTrace(step=0, scheduler_output=scheduler_output)
    return runner.execute_model(scheduler_output, trace=trace), trace.inputs


def test_runner_worked_example_matches_transformers(tiny):
    folder, hf_model = tiny
    runner = make_runner(folder)
    ids = ["r0", "r1", "r2"]
    out, inputs = execute_traced(runner, step(
        new=[new_req(r, p, b) for r, p, b in zip(ids, WORKED_PROMPTS, WORKED_BLOCKS, strict=False)],
        scheduled={"r0": 5, "r1": 7, "r2": 3}))
    assert inputs["slot_mapping"].tolist() == [4, 5, 6, 7, 8, 12, 13, 14, 15, 16, 17, 18, 20, 21, 22]
    assert inputs["logits_indices"].tolist() == [4, 11, 14]
    assert out.req_ids == ids and out.req_id_to_index == {"r0": 0, "r1": 1, "r2": 2}
    first = [int(hf_last_logprobs(hf_model, p)[-1].argmax()) for p in WORKED_PROMPTS]
    assert out.sampled_token_ids == [[t] for t in first]
    assert out.logprobs is None

    out, inputs = execute_traced(runner, step(cached=CachedRequestData(ids, [[], [], []], [5, 7, 3]),
                                              scheduled={"r0": 1, "r1": 1, "r2": 1}))
    assert inputs["positions"].tolist() == [5, 7, 3]
    assert inputs["slot_mapping"].tolist() == [9, 19, 23]
    second = [int(hf_last_logprobs(hf_model, p + [t])[-1].argmax())
              for p, t in zip(WORKED_PROMPTS, first, strict=False)]
    assert out.sampled_token_ids == [[t] for t in second]
    assert runner.requests["r1"].output_token_ids == [first[1], second[1]]


def test_runner_chunked_prefill_discards_mid_prompt_samples_and_reports_logprobs(tiny):
    folder, hf_model = tiny
    runner = make_runner(folder)
    prompt = [5, 17, 3, 99, 42, 8, 8, 150, 2, 61]
    params = SamplingParams(temperature=0.0, logprobs=2, prompt_logprobs=1)
    out1 = runner.execute_model(step(new=[new_req("a", prompt, [4, 9], params)], scheduled={"a": 6}))
    assert out1.sampled_token_ids == [[]] and out1.logprobs == [[]]
    out2 = runner.execute_model(step(cached=CachedRequestData(["a"], [[11]], [6]), scheduled={"a": 4}))
    expected = hf_last_logprobs(hf_model, prompt)
    token = int(expected[-1].argmax())
    assert out2.sampled_token_ids == [[token]]
    (entry,) = out2.logprobs[0]
    assert next(iter(entry)) == token  # the sampled token first; greedy: it is also the top-1
    assert set(entry) == set(expected[-1].topk(2).indices.tolist())
    for token_id, value in entry.items():
        assert value == pytest.approx(float(expected[-1, token_id]), abs=1e-4)
    prompt_lps = out1.prompt_logprobs["a"] + out2.prompt_logprobs["a"]
    assert len(prompt_lps) == len(prompt) and prompt_lps[0] is None
    for position in range(1, len(prompt)):
        target = prompt[position]
        assert prompt_lps[position][target] == pytest.approx(float(expected[position - 1, target]), abs=1e-4)
        assert len(prompt_lps[position]) in (1, 2)  # the prompt token plus the top-1


def test_runner_drops_finished_requests_and_condenses(tiny):
    folder, _ = tiny
    runner = make_runner(folder)
    prompts = {"a": [1, 2, 3], "b": [4, 5], "c": [6, 7, 8, 9]}
    blocks = {"a": [1], "b": [2], "c": [3, 4]}
    runner.execute_model(step(new=[new_req(r, p, blocks[r]) for r, p in prompts.items()],
                              scheduled={r: len(p) for r, p in prompts.items()}))
    out, inputs = execute_traced(runner, step(cached=CachedRequestData(["b", "c"], [[], []], [2, 4]),
                                              scheduled={"b": 1, "c": 1}, finished={"a"}))
    assert "a" not in runner.requests
    assert runner.input_batch.req_ids == ["c", "b"]  # c moved from row 2 into a's hole
    assert out.req_ids == ["c", "b"] and out.req_id_to_index == {"c": 0, "b": 1}
    assert inputs["positions"].tolist() == [4, 2]


def test_seeded_request_is_reproducible_whatever_the_batch(tiny):
    folder, _ = tiny
    seeded = SamplingParams(temperature=1.0, seed=1234)
    prompt = [9, 8, 7, 6, 5]

    def sample_alone() -> list[int]:
        runner = make_runner(folder)
        tokens = [runner.execute_model(step(new=[new_req("s", prompt, [1, 2, 3], seeded)],
                                            scheduled={"s": 5})).sampled_token_ids[0][0]]
        for i in range(3):
            out = runner.execute_model(step(cached=CachedRequestData(["s"], [[]], [5 + i]), scheduled={"s": 1}))
            tokens.append(out.sampled_token_ids[0][0])
        return tokens

    def sample_crowded() -> list[int]:
        runner = make_runner(folder)
        others = [new_req(f"o{i}", [i + 1] * 6, [10 + 2 * i, 11 + 2 * i], SamplingParams(temperature=1.0))
                  for i in range(3)]
        # The seeded prompt arrives second and is prefilled in two chunks (3 + 2 tokens).
        out = runner.execute_model(step(new=[others[0], new_req("s", prompt, [1, 2, 3], seeded), others[1]],
                                        scheduled={"o0": 6, "s": 3, "o1": 6}))
        assert out.sampled_token_ids[out.req_id_to_index["s"]] == []
        out = runner.execute_model(step(new=[others[2]], cached=CachedRequestData(["s"], [[]], [3]),
                                        scheduled={"o2": 6, "s": 2}))
        tokens = [out.sampled_token_ids[out.req_id_to_index["s"]][0]]
        for i in range(3):
            out = runner.execute_model(step(cached=CachedRequestData(["s"], [[]], [5 + i]), scheduled={"s": 1}))
            tokens.append(out.sampled_token_ids[0][0])
        return tokens

    alone = sample_alone()
    assert sample_crowded() == alone
    assert sample_alone() == alone
