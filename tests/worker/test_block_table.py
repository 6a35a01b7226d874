"""The persistent block table (mini/worker/block_table.py) against phase 02's pure `prepare_inputs`.

Every step of a busy engine (random prompts, chunked prefill, preemption, finishing and arriving
requests, condensed rows) builds its inputs from the persistent table; the test rebuilds the same step
with the pure function from the same per-request state and requires identical tensors. It also checks
that a request staying in its row only ever gets its new block ids written."""

from __future__ import annotations

import random

import pytest
import torch

from mini import LLM, SamplingParams, roles
from mini.worker.block_table import BlockTable
from mini.worker.model_runner import ModelRunner
from mini.worker.prepare_inputs import make_block_table

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine


def test_rows_append_only_new_blocks_and_rewrite_when_the_owner_changes():
    table = BlockTable(max_num_reqs=3)
    a, b, c, d = (object() for _ in range(4))   # request states: rows are owned by identity
    table.sync_row(0, a, [4, 5])
    table.sync_row(1, b, [7])
    assert torch.equal(table.get(2), make_block_table([[4, 5], [7]]))
    written = []
    original = table.add_row
    table.add_row = lambda *args: (written.append(args), original(*args))  # count full rewrites
    table.sync_row(0, a, [4, 5, 9])          # same owner: one block appended, no rewrite
    assert written == [] and table.num_blocks_per_row[0] == 3
    table.sync_row(1, c, [2, 3])             # another request moved into row 1: rewritten
    assert written == [(1, c, [2, 3])]
    assert torch.equal(table.get(2), make_block_table([[4, 5, 9], [2, 3]]))
    table.sync_row(2, d, list(range(1, 40)))  # wider than the initial 16 columns: the table grows
    assert torch.equal(table.get(3), make_block_table([[4, 5, 9], [2, 3], list(range(1, 40))]))
    written.clear()
    table.sync_row(0, object(), [4, 5, 9, 11])   # same request id coming back as a new state: rewritten
    assert len(written) == 1


def test_a_reused_request_id_gets_its_own_blocks(tiny_llama_dir):
    """The same request ids run twice on one engine (as the phase-06 check does): same greedy tokens."""
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, block_size=2, max_model_len=64,
              num_gpu_blocks_override=32, max_num_seqs=3)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    runs = []
    for _ in range(2):
        engine.add_request("r0", {"prompt_token_ids": [5, 6, 7, 8, 9]}, params)
        engine.add_request("r1", {"prompt_token_ids": [3, 4]}, params)
        tokens: dict[str, list[int]] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens[out.request_id] = list(out.outputs[0].token_ids)
        runs.append(tokens)
        engine.add_request("other", {"prompt_token_ids": [1, 2, 3]}, params)  # shuffles the rows
        while engine.has_unfinished_requests():
            engine.step()
    assert runs[0] == runs[1]


def test_engine_steps_match_the_pure_prepare_inputs(tiny_llama_dir):
    pure_prepare_inputs = roles.reference("prepare_inputs")
    reference_run_model = roles.reference("run_model")
    compared = []

    def run_model_and_compare(model, kv_caches, inputs, metadata):
        states = runner.input_batch.occupied_requests()
        scheduled = (inputs.query_start_loc[1:] - inputs.query_start_loc[:-1]).tolist()
        pure = pure_prepare_inputs([s.all_token_ids for s in states], [s.num_computed_tokens for s in states],
                                   scheduled, [s.block_ids for s in states], runner.block_size)
        for name in pure:
            assert torch.equal(inputs[name], pure[name]), (len(compared), name, inputs[name], pure[name])
        compared.append(len(states))
        return reference_run_model(model, kv_caches, inputs, metadata)

    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, block_size=2, max_model_len=64,
              num_gpu_blocks_override=14, max_num_batched_tokens=12, max_num_seqs=4)
    engine = llm.llm_engine
    runner = engine.model_runner
    assert type(runner) is ModelRunner   # the fast input path (a plugged part would build the reference runner)
    runner.run_model = run_model_and_compare   # this instance only: a spy after the fast path built its inputs
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for step in range(200):
        if step % 2 == 0 and step < 36:
            prompt = [rng.randrange(1, 200) for _ in range(rng.randint(1, 14))]
            engine.add_request(f"r{step}", {"prompt_token_ids": prompt}, params)
        if not engine.has_unfinished_requests():
            break
        engine.step()
    assert len(compared) > 30 and max(compared) > 1
    assert engine.scheduler.num_preemptions_total > 0, "the pool is small enough to preempt"
