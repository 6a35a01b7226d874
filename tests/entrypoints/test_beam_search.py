"""`LLM.beam_search` as vLLM v1's (vllm/entrypoints/generate/beam_search/), against transformers.

Where mini (= vLLM) and transformers' `generate(num_beams=W)` agree, and where they do not:

- Live beams: both keep the best W non-EOS continuations by cumulative logprob. vLLM takes each beam's top
  2W tokens, transformers the top 2W over all beams; the best W non-EOS ones are the same. (vLLM ranks live
  beams by the length-penalised score, but they all have the same length, so the order is the same.)
- Score: both divide the cumulative logprob by `num_generated ** length_penalty`, a final EOS counted (vLLM
  v0.33.0's `get_beam_search_score`; older vLLM releases counted the prompt too and dropped the EOS).
- EOS: vLLM completes every candidate ending in EOS from each beam's 2W, and always runs `max_tokens`
  steps; transformers completes an EOS candidate only if it is among the global top W, and stops early by
  its `early_stopping` heuristics. So the results can differ once EOS is reachable.

Hence: with no EOS (the tiny model has none) both return the same W sequences in the same order, for any
`length_penalty` and `early_stopping`, with transformers' scores.
With EOS, mini is checked against a direct implementation of vLLM's algorithm on transformers' logits.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from mini import LLM, SamplingParams
from mini.beam_search import BeamSearchSequence, get_beam_search_score
from mini.sampling_params import BeamSearchParams

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

PROMPTS = [[11, 52, 7, 190, 33, 4, 98], [150, 2, 61, 17, 88, 120, 5, 9, 43, 77]]
MAX_TOKENS = 6
BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def hf_model(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, block_size=BLOCK_SIZE,
               enable_prefix_caching=True, num_gpu_blocks_override=64)


def transformers_beam_search(model, prompt, beam_width, length_penalty, early_stopping):
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            num_beams=beam_width, num_return_sequences=beam_width, do_sample=False, max_new_tokens=MAX_TOKENS,
            length_penalty=length_penalty, early_stopping=early_stopping, eos_token_id=None, pad_token_id=0,
            output_scores=True, return_dict_in_generate=True,
        )
    return [row.tolist() for row in out.sequences], out.sequences_scores.tolist()


@pytest.mark.parametrize(("beam_width", "length_penalty", "early_stopping"),
                         [(2, 1.0, True), (3, 0.0, "never"), (4, 2.0, False)])
def test_same_beams_and_scores_as_transformers_without_eos(llm, hf_model, beam_width, length_penalty, early_stopping):
    params = BeamSearchParams(beam_width=beam_width, max_tokens=MAX_TOKENS, length_penalty=length_penalty)
    outputs = llm.beam_search([{"prompt_token_ids": p} for p in PROMPTS], params)
    assert len(outputs) == len(PROMPTS)
    for prompt, output in zip(PROMPTS, outputs, strict=False):
        hf_sequences, hf_scores = transformers_beam_search(hf_model, prompt, beam_width, length_penalty,
                                                           early_stopping)
        assert [seq.tokens for seq in output.sequences] == hf_sequences
        for seq, hf_score in zip(output.sequences, hf_scores, strict=False):
            assert seq.finish_reason == "length" and seq.text is None and len(seq.logprobs) == MAX_TOKENS
            assert seq.cum_logprob == pytest.approx(hf_score * MAX_TOKENS**length_penalty, abs=1e-4)
            assert get_beam_search_score(len(seq.logprobs), seq.cum_logprob, length_penalty) == pytest.approx(
                hf_score, abs=1e-4)             # v0.33.0's score is transformers' score


def vllm_beam_search_reference(model, prompt, beam_width, max_tokens, eos, length_penalty):
    """vLLM's algorithm written out directly on transformers' logits (no cache, one beam at a time)."""

    def score(item):
        tokens, cum = item
        return cum / (max(len(tokens) - len(prompt), 1) ** length_penalty)   # generated tokens, EOS included

    beams, completed = [(list(prompt), 0.0)], []
    for _ in range(max_tokens):
        candidates = []
        for tokens, cum in beams:
            with torch.inference_mode():
                logprobs = torch.log_softmax(model(torch.tensor([tokens])).logits[0, -1].float(), dim=-1)
            top = torch.topk(logprobs, 2 * beam_width)
            for logprob, token in zip(top.values.tolist(), top.indices.tolist(), strict=False):
                (completed if token == eos else candidates).append((tokens + [token], cum + logprob))
        beams = sorted(candidates, key=score, reverse=True)[:beam_width]
    return sorted(completed + beams, key=score, reverse=True)[:beam_width]


def test_eos_beams_complete_as_vllm(tiny_llama_dir, hf_model, tmp_path):
    prompt = PROMPTS[0]
    with torch.inference_mode():
        ranked = torch.argsort(hf_model(torch.tensor([prompt])).logits[0, -1], descending=True).tolist()
    eos = ranked[1]                                    # the second most likely first token ends a beam at once
    model_dir = shutil.copytree(tiny_llama_dir, tmp_path / "with-eos")
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    eos_llm = LLM(model=str(model_dir), skip_tokenizer_init=True, block_size=BLOCK_SIZE, enable_prefix_caching=True)

    for length_penalty in (1.0, 0.5, 0.0):
        params = BeamSearchParams(beam_width=3, max_tokens=MAX_TOKENS, length_penalty=length_penalty)
        [output] = eos_llm.beam_search([{"prompt_token_ids": prompt}], params)
        expected = vllm_beam_search_reference(hf_model, prompt, 3, MAX_TOKENS, eos, length_penalty)
        assert [seq.tokens for seq in output.sequences] == [tokens for tokens, _ in expected]
        assert [seq.cum_logprob for seq in output.sequences] == pytest.approx([c for _, c in expected], abs=1e-4)
        stopped = [seq for seq in output.sequences if seq.finish_reason == "stop"]
        assert all(seq.tokens[-1] == eos for seq in stopped)
        if length_penalty == 0.0:                      # ranked by cum_logprob: the one-token EOS beam is among them
            assert stopped
        assert all(seq.tokens[-1] != eos for seq in output.sequences if seq.finish_reason == "length")

    [ignored] = eos_llm.beam_search([{"prompt_token_ids": prompt}],
                                    BeamSearchParams(beam_width=3, max_tokens=MAX_TOKENS, ignore_eos=True))
    assert all(seq.finish_reason == "length" and len(seq.tokens) == len(prompt) + MAX_TOKENS
               for seq in ignored.sequences)


def test_beams_share_prefix_blocks_through_the_cache_and_free_everything(tiny_llama_dir, llm):
    manager = llm.llm_engine.scheduler.kv_cache_manager
    before = llm.llm_engine.get_scheduler_stats().prefix_cache_stats
    width, prompt = 3, PROMPTS[1]                       # 10 tokens: 2 full blocks of 4
    params = BeamSearchParams(beam_width=width, max_tokens=MAX_TOKENS)
    [cached] = llm.beam_search({"prompt_token_ids": prompt}, params)
    after = llm.llm_engine.get_scheduler_stats().prefix_cache_stats
    # After the first step every live beam's request finds at least the prompt's full blocks cached.
    prompt_hit_tokens = (len(prompt) // BLOCK_SIZE) * BLOCK_SIZE
    assert after.hits - before.hits >= (MAX_TOKENS - 1) * width * prompt_hit_tokens
    assert manager.block_pool.get_num_free_blocks() == manager.block_pool.num_gpu_blocks - 1
    assert not llm.llm_engine.has_unfinished_requests()

    uncached_llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, block_size=BLOCK_SIZE)
    [uncached] = uncached_llm.beam_search({"prompt_token_ids": prompt}, params)
    assert [s.tokens for s in uncached.sequences] == [s.tokens for s in cached.sequences]
    assert [s.cum_logprob for s in uncached.sequences] == pytest.approx([s.cum_logprob for s in cached.sequences])


def test_cache_salt_travels_with_every_step(llm):
    prompt = [7, 7, 8, 8, 9, 9, 10, 10, 11]
    params = BeamSearchParams(beam_width=2, max_tokens=3)
    stats = llm.llm_engine.get_scheduler_stats
    [plain] = llm.beam_search({"prompt_token_ids": prompt}, params)
    hits_before = stats().prefix_cache_stats.hits
    first_step = llm.generate({"prompt_token_ids": prompt, "cache_salt": "other"},
                              SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert first_step.num_cached_tokens == 0 and stats().prefix_cache_stats.hits == hits_before
    [salted] = llm.beam_search({"prompt_token_ids": prompt, "cache_salt": "tenant"}, params)
    assert [s.tokens for s in salted.sequences] == [s.tokens for s in plain.sequences]
    assert all(s.orig_prompt["cache_salt"] == "tenant" and s.get_prompt()["cache_salt"] == "tenant"
               for s in salted.sequences)


def test_score_as_vllm():
    assert get_beam_search_score(4, -2.0) == -0.5                    # 4 generated tokens (a final EOS counts)
    assert get_beam_search_score(0, -2.0) == -2.0                    # an aborted beam: no division by zero
    assert get_beam_search_score(4, -2.0, length_penalty=0.0) == -2.0
    assert get_beam_search_score(4, -2.0, length_penalty=2.0) == -2.0 / 16


def test_text_with_a_tokenizer_and_the_eos_text():
    shipped = LLM(block_size=4, enable_prefix_caching=True)
    tokenizer = shipped.get_tokenizer()
    [output] = shipped.beam_search(["def add(a, b):"], BeamSearchParams(beam_width=2, max_tokens=4))
    for seq in output.sequences:
        assert seq.text == tokenizer.decode(seq.tokens) and seq.text.startswith("def add(a, b):")
    eos = tokenizer.eos_token_id
    stopped = BeamSearchSequence(orig_prompt={}, tokens=tokenizer.encode("Hi") + [eos], finish_reason="stop")
    assert shipped._beam_text(stopped, include_stop_str_in_output=False) == tokenizer.decode(stopped.tokens[:-1])
    assert shipped._beam_text(stopped, include_stop_str_in_output=True) == tokenizer.decode(stopped.tokens)


@pytest.mark.parametrize(("field", "value"), [
    ("beam_width", 0), ("beam_width", 2.0), ("max_tokens", 0), ("max_tokens", None), ("temperature", -0.5),
    ("length_penalty", float("nan")), ("length_penalty", "long"), ("ignore_eos", 1),
    ("include_stop_str_in_output", "yes"),
])
def test_bad_params_raise_value_error_naming_the_field(field, value):
    kwargs = {"beam_width": 2, "max_tokens": 4, field: value}
    with pytest.raises(ValueError, match=field):
        BeamSearchParams(**kwargs)


def test_bad_requests_raise_before_anything_runs(llm):
    engine = llm.llm_engine
    before = engine.get_scheduler_stats().prefix_cache_stats.queries
    good = {"prompt_token_ids": PROMPTS[0]}
    with pytest.raises(ValueError, match="beam_width must be at most 10"):
        llm.beam_search([good], BeamSearchParams(beam_width=11, max_tokens=2))
    with pytest.raises(ValueError, match="prompt 1: max_tokens must be at most"):
        llm.beam_search([good, {"prompt_token_ids": [1] * 250}], BeamSearchParams(beam_width=2, max_tokens=10))
    with pytest.raises(ValueError, match="prompt 1: prompt token id 999"):
        llm.beam_search([good, {"prompt_token_ids": [999]}], BeamSearchParams(beam_width=2, max_tokens=2))
    with pytest.raises(TypeError, match="BeamSearchParams"):
        llm.beam_search([good], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="concurrency_limit"):
        llm.beam_search([good], BeamSearchParams(beam_width=2, max_tokens=2), concurrency_limit=0)
    assert engine.get_scheduler_stats().prefix_cache_stats.queries == before
    assert not engine.has_unfinished_requests()
    assert math.isfinite(llm.beam_search([good],
                                         BeamSearchParams(beam_width=2, max_tokens=2))[0].sequences[0].cum_logprob)


def test_concurrency_limit_gives_the_same_result(llm):
    params = BeamSearchParams(beam_width=2, max_tokens=3)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    together = llm.beam_search(prompts, params)
    one_at_a_time = llm.beam_search(prompts, params, concurrency_limit=1)
    def tokens(outputs):
        return [[s.tokens for s in o.sequences] for o in outputs]

    assert tokens(together) == tokens(one_at_a_time)
