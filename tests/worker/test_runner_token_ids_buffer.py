"""The persistent token buffer and the NumPy fast input path (mini/worker/token_ids_buffer.py, fast_inputs.py)
give exactly phase 02's `prepare_inputs` (the reference path), step after step, as rows grow, move and refill."""

from __future__ import annotations

import random

import torch

from mini.sampling_params import SamplingParams
from mini.worker.block_table import BlockTable
from mini.worker.fast_inputs import gather_inputs
from mini.worker.input_batch import CachedRequestState
from mini.worker.prepare_inputs import prepare_inputs
from mini.worker.token_ids_buffer import TokenIdsBuffer

BLOCK_SIZE = 4


def make_state(req_id: str, rng: random.Random, prompt_len: int) -> CachedRequestState:
    return CachedRequestState(req_id=req_id, prompt_token_ids=[rng.randrange(1, 1000) for _ in range(prompt_len)],
                              output_token_ids=[], sampling_params=SamplingParams(), generator=None, block_ids=[],
                              num_computed_tokens=0)


def assert_same_as_reference(states, scheduled, buffer: TokenIdsBuffer, table: BlockTable) -> None:
    computed = [state.num_computed_tokens for state in states]
    for row, state in enumerate(states):
        table.sync_row(row, state, state.block_ids)
        buffer.sync_row(row, state)
    fast = gather_inputs(buffer, computed, scheduled, table.get(len(states)), BLOCK_SIZE)
    reference = prepare_inputs([state.all_token_ids + state.spec_token_ids for state in states], computed,
                               scheduled, [state.block_ids for state in states], BLOCK_SIZE)
    for name in reference:
        assert fast[name].dtype == reference[name].dtype, name
        assert torch.equal(fast[name], reference[name]), (name, fast[name], reference[name])


def test_random_steps_with_chunks_drafts_moves_and_refills_match_the_reference():
    rng = random.Random(0)
    buffer, table = TokenIdsBuffer(8), BlockTable(8)
    states = [make_state(str(i), rng, rng.randrange(1, 40)) for i in range(5)]
    next_id = 5
    for _step in range(60):
        scheduled = []
        for state in states:
            left = state.num_tokens - state.num_computed_tokens
            count = rng.randrange(1, left + 1) if left > 1 else 1
            if left <= 1 and rng.random() < 0.3:            # a verification step: drafts after the last token
                state.spec_token_ids = [rng.randrange(1, 1000) for _ in range(rng.randrange(1, 4))]
                count = 1 + len(state.spec_token_ids)
            else:
                state.spec_token_ids = []
            needed = -(-(state.num_computed_tokens + count) // BLOCK_SIZE)
            state.block_ids.extend(rng.randrange(1, 500) for _ in range(needed - len(state.block_ids)))
            scheduled.append(count)
        assert_same_as_reference(states, scheduled, buffer, table)
        for state, count in zip(states, scheduled,
                                strict=False):        # the step ran: accept a token where one is sampled
            state.num_computed_tokens += count - len(state.spec_token_ids)
            if state.num_computed_tokens >= state.num_tokens:
                state.append_output_token(rng.randrange(1, 1000))
                state.num_computed_tokens = state.num_tokens - 1
        if len(states) > 1 and rng.random() < 0.25:        # a request leaves; the last row moves into its hole
            hole = rng.randrange(len(states))
            states[hole] = states[-1]
            states.pop()
        if len(states) < 8 and rng.random() < 0.3:         # a new request takes the next row
            states.append(make_state(str(next_id), rng, rng.randrange(1, 30)))
            next_id += 1


def test_the_buffer_grows_past_its_initial_width():
    rng = random.Random(1)
    buffer, table = TokenIdsBuffer(2), BlockTable(2)
    long = make_state("long", rng, buffer.width + 100)
    long.block_ids = list(range(1, -(-long.num_tokens // BLOCK_SIZE) + 1))
    assert_same_as_reference([long], [long.num_tokens], buffer, table)
    assert buffer.width >= long.num_tokens
