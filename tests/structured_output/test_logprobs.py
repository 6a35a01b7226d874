"""Logprobs of a constrained request are read after the grammar mask, as in vLLM v0.33.0 (the model runner
applies the bitmask before the sampler computes its raw logprobs: `apply_grammar_bitmask` in
vllm/v1/structured_output/utils.py): a token the grammar forbids has logprob -inf, never a finite one."""

from __future__ import annotations

import math

import pytest

from mini import LLM, SamplingParams
from mini.sampling_params import StructuredOutputsParams

# Run again with the engine core in-process by scripts/test.sh (`-m engine_modes`): both modes are tested.
pytestmark = pytest.mark.engine_modes


def test_logprobs_come_after_the_grammar_mask():
    llm = LLM()
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=5,
                            structured_outputs=StructuredOutputsParams(regex="[ab]+"))
    completion = llm.generate(["Once upon a time"], params, use_tqdm=False)[0].outputs[0]
    assert completion.logprobs and set(completion.text) <= {"a", "b"}
    total_allowed_mass = []
    for position in completion.logprobs:
        finite = {token_id: entry.logprob for token_id, entry in position.items() if math.isfinite(entry.logprob)}
        assert finite
        for token_id in finite:
            text = tokenizer.decode([token_id])
            assert token_id == tokenizer.eos_token_id or (text and set(text) <= {"a", "b"}), (token_id, text)
        total_allowed_mass.append(sum(math.exp(lp) for lp in finite.values()))
    assert all(mass <= 1.0 + 1e-4 for mass in total_allowed_mass)
