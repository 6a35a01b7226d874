"""Greedy output of mini is token-identical to transformers' greedy `generate()` for the same weights.

Covered: tiny random Llama (tied and untied), Qwen2 (q/k/v bias) and Qwen3 (q/k norm), all with GQA,
>= 8 prompts of different lengths, under each engine setting that changes how tokens are batched:
defaults, block_size=4, forced preemption, chunked prefill with a small budget and a long-prefill cap,
and the priority policy. The only tolerated difference is vLLM's rule in
tests/models/utils.py::check_logprobs_close: at the first diverging position each side's token is in
the other's top few with near-equal logprobs; the comparison of that sequence stops there.
"""

from __future__ import annotations

import pytest
import torch

from mini import LLM, SamplingParams

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

PROMPT_LENGTHS = [1, 3, 4, 5, 8, 13, 16, 17, 29, 40]
MAX_TOKENS = 12
TOP_FEW = 5
LOGPROB_TOLERANCE = 1e-3


def make_prompts(vocab_size: int, seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def transformers_greedy(model_dir, prompts: list[list[int]]) -> list[tuple[list[int], list[torch.Tensor]]]:
    """Each prompt alone (no padding): greedy tokens and the per-step raw logprobs."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    results = []
    with torch.inference_mode():
        for prompt in prompts:
            out = model.generate(
                torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=MAX_TOKENS, do_sample=False,
                output_logits=True, return_dict_in_generate=True, pad_token_id=0,
            )
            tokens = out.sequences[0, len(prompt):].tolist()
            logprobs = [torch.log_softmax(step[0].float(), dim=-1) for step in out.logits]
            results.append((tokens, logprobs))
    return results


def assert_greedy_matches(expected, outputs) -> None:
    """Token-identical, except vLLM's near-tie rule at the first divergence (then stop comparing)."""
    for index, ((hf_tokens, hf_logprobs), output) in enumerate(zip(expected, outputs, strict=False)):
        completion = output.outputs[0]
        mini_tokens = list(completion.token_ids)
        assert len(mini_tokens) == MAX_TOKENS, f"prompt {index}: mini produced {len(mini_tokens)} tokens"
        for position, (hf_token, mini_token) in enumerate(zip(hf_tokens, mini_tokens, strict=False)):
            if hf_token == mini_token:
                continue
            mini_top = completion.logprobs[position]
            hf_top = torch.topk(hf_logprobs[position], TOP_FEW)
            hf_top_ids = hf_top.indices.tolist()
            assert mini_token in hf_top_ids and hf_token in mini_top, (
                f"prompt {index} diverges at output position {position}: transformers {hf_token}, "
                f"mini {mini_token}, and they are not in each other's top {TOP_FEW}\n"
                f"transformers: {hf_tokens}\nmini:         {mini_tokens}"
            )
            gap = abs(hf_logprobs[position][hf_token] - hf_logprobs[position][mini_token]).item()
            assert gap < LOGPROB_TOLERANCE, (
                f"prompt {index} position {position}: not a near tie (logprob gap {gap:.2e})"
            )
            break


class SchedulerSpy:
    """Wraps scheduler.schedule() to record what each step scheduled (for 'it really happened' asserts)."""

    def __init__(self, llm: LLM) -> None:
        self.scheduler = llm.llm_engine.scheduler
        self.steps = []
        original = self.scheduler.schedule

        def schedule():
            output = original()
            self.steps.append(
                (dict(output.num_scheduled_tokens), set(output.preempted_req_ids),
                 {new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs})
            )
            return output

        self.scheduler.schedule = schedule

    @property
    def num_preemptions(self) -> int:
        return sum(len(preempted) for _, preempted, _ in self.steps)

    def prefill_chunks(self, prompt_lens: dict[str, int]) -> int:
        """How many steps scheduled part of a prompt (fewer tokens than the whole remaining prompt)."""
        count = 0
        for scheduled, _, _ in self.steps:
            for req_id, num_tokens in scheduled.items():
                if num_tokens > 1 and num_tokens < prompt_lens.get(req_id, 0):
                    count += 1
        return count


SETTINGS = {
    "defaults": {},
    "block_size_4": {"block_size": 4},
    "preemption": {"block_size": 4, "num_gpu_blocks_override": 16, "max_num_seqs": 8},
    "chunked_prefill": {"block_size": 4, "max_num_batched_tokens": 12, "long_prefill_token_threshold": 7},
    "priority": {"scheduling_policy": "priority", "block_size": 4, "num_gpu_blocks_override": 16},
}


@pytest.fixture(scope="module")
def reference_outputs(tiny_model_factory):
    cache = {}

    def get(arch):
        if arch not in cache:
            model_dir = tiny_model_factory(arch)
            prompts = make_prompts(vocab_size=211)
            cache[arch] = (model_dir, prompts, transformers_greedy(model_dir, prompts))
        return cache[arch]

    return get


@pytest.mark.parametrize("arch", ["llama-tied", "llama-untied", "qwen2", "qwen3"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_greedy_matches_transformers(reference_outputs, arch, setting):
    model_dir, prompts, expected = reference_outputs(arch)
    llm = LLM(model=str(model_dir), skip_tokenizer_init=True, **SETTINGS[setting])
    spy = SchedulerSpy(llm)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=TOP_FEW)
    priorities = [i % 3 for i in range(len(prompts))] if setting == "priority" else None
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                           priority=priorities)
    assert [o.prompt_token_ids for o in outputs] == prompts
    assert_greedy_matches(expected, outputs)

    if setting in ("preemption", "priority"):
        assert spy.num_preemptions > 0, "the KV pool was meant to be too small: preemption should happen"
    if setting == "chunked_prefill":
        prompt_lens = {o.request_id: len(o.prompt_token_ids) for o in outputs}
        assert spy.prefill_chunks(prompt_lens) > 0, "long prompts should have been prefilled in chunks"
        assert all(sum(s.values()) <= 12 for s, _, _ in spy.steps), "token budget exceeded"
    pool = llm.llm_engine.scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, "KV blocks leaked after generate()"


def test_bfloat16_runs_and_mostly_agrees(tiny_llama_dir):
    prompts = make_prompts(vocab_size=211)[:4]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    as_ids = [{"prompt_token_ids": p} for p in prompts]
    full = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True).generate(as_ids, params, use_tqdm=False)
    half = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, dtype="bfloat16").generate(
        as_ids, params, use_tqdm=False)
    first_tokens_equal = sum(f.outputs[0].token_ids[0] == h.outputs[0].token_ids[0] for f, h in zip(full, half,
                                                                                                    strict=False))
    assert first_tokens_equal >= 3, "bfloat16 should agree with float32 on most first tokens"
