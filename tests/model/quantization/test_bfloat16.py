"""bfloat16 on the CPU (issue 41, item 1): mini's greedy tokens against transformers' greedy `generate()` run at
the same precision, on the same tiny random weights (tests/conftest.py).

Why not token-exact by construction: both round every intermediate to bfloat16, but not at the same places
(mini computes rotary embeddings and the attention softmax in its own order, and its matmuls may block
differently from transformers'), so a near-tie between two logits can go either way. The test asks for every
first token and 7 of the 8 full sequences of 12 tokens (it passed when written; the exact count is not recorded).
"""

from __future__ import annotations

import torch

from mini import LLM, SamplingParams

NUM_PROMPTS, MAX_TOKENS = 8, 12


def _prompts(vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(1, vocab_size, (int(length),), generator=generator).tolist()
            for length in torch.randint(3, 20, (NUM_PROMPTS,), generator=generator)]


def test_bfloat16_greedy_agrees_with_transformers_at_bfloat16(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    prompts = _prompts(vocab_size=211)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.bfloat16).eval()
    expected = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                                 min_new_tokens=MAX_TOKENS, pad_token_id=0)
            expected.append(out[0, len(prompt):].tolist())
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, dtype="bfloat16")
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True), use_tqdm=False)
    got = [list(out.outputs[0].token_ids) for out in outputs]
    assert all(g[0] == e[0] for g, e in zip(got, expected, strict=True)), (got, expected)
    assert sum(g == e for g, e in zip(got, expected, strict=True)) >= NUM_PROMPTS - 1, (got, expected)
