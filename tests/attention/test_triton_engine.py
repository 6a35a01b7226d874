"""End to end: LLM(attention_backend="triton") gives the same greedy tokens as the torch backend.

A tiny random-weight Llama (GQA: 4 query heads over 2 KV heads, head size 16) built by conftest, run
with block_size=4 and a 16-token budget so prompts are prefilled in chunks, mixed with decodes, and
spread over many scattered blocks; the second test adds prefix-cache hits. Without a GPU the Triton
kernels run under TRITON_INTERPRET=1, so the runs are kept short.
"""
from __future__ import annotations

import pytest
import torch

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

triton_utils = pytest.importorskip("mini.attention.triton_utils")
if not triton_utils.is_available():
    pytest.skip(triton_utils.unavailable_reason(), allow_module_level=True)
try:
    from mini import LLM, SamplingParams
except (ImportError, AttributeError) as error:  # the engine is not there yet
    pytest.skip(f"mini.LLM is not importable yet: {error}", allow_module_level=True)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# The KV cache is sized here, not from the device: on a GPU the default (vLLM's gpu_memory_utilization of the
# card, measured on an H100) gives this 2-layer model tens of millions of blocks, minutes of block-pool set-up.
NUM_BLOCKS = 128


def greedy_tokens(model_dir, prompts: list[list[int]], backend: str, **engine_kwargs) -> list[list[int]]:
    llm = LLM(
        model=str(model_dir), skip_tokenizer_init=True, attention_backend=backend, device=DEVICE,
        block_size=4, max_num_batched_tokens=16, num_gpu_blocks_override=NUM_BLOCKS, **engine_kwargs,
    )
    outputs = llm.generate(
        [{"prompt_token_ids": prompt} for prompt in prompts], SamplingParams(temperature=0.0, max_tokens=6)
    )
    return [list(output.outputs[0].token_ids) for output in outputs]


def random_prompts(lengths: list[int], vocab_size: int = 211, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (length,), generator=generator).tolist() for length in lengths]


def test_triton_backend_greedy_equals_torch_backend(tiny_llama_dir):
    prompts = random_prompts([1, 4, 7, 13, 22])  # one token, an exact block, ragged, longer than the budget
    expected = greedy_tokens(tiny_llama_dir, prompts, "torch")
    assert all(len(tokens) == 6 for tokens in expected)
    assert greedy_tokens(tiny_llama_dir, prompts, "triton") == expected


def test_triton_backend_with_prefix_cache_hits(tiny_llama_dir):
    shared = random_prompts([9], seed=1)[0]  # two full blocks + one token shared by every prompt
    prompts = [shared + tail for tail in random_prompts([3, 6], seed=2)]
    expected = greedy_tokens(tiny_llama_dir, prompts + prompts, "torch", enable_prefix_caching=True)
    assert expected[:2] == expected[2:]
    llm = LLM(
        model=str(tiny_llama_dir), skip_tokenizer_init=True, attention_backend="triton", device=DEVICE,
        block_size=4, max_num_batched_tokens=16, enable_prefix_caching=True, num_gpu_blocks_override=NUM_BLOCKS,
    )
    manager = llm.llm_engine.scheduler.kv_cache_manager
    original_get_computed_blocks = manager.get_computed_blocks
    num_hit_tokens = []

    def spy_get_computed_blocks(request):
        blocks, num_computed_tokens = original_get_computed_blocks(request)
        num_hit_tokens.append(num_computed_tokens)
        return blocks, num_computed_tokens

    manager.get_computed_blocks = spy_get_computed_blocks
    params = SamplingParams(temperature=0.0, max_tokens=6)
    first = llm.generate([{"prompt_token_ids": prompt} for prompt in prompts], params)
    second = llm.generate([{"prompt_token_ids": prompt} for prompt in prompts], params)
    assert max(num_hit_tokens) >= 8, f"no prefix-cache hit was exercised: {num_hit_tokens}"
    assert [list(output.outputs[0].token_ids) for output in first + second] == expected
