"""Speculative decoding in the engine: lossless, rolled back exactly, and refused where it cannot work.

Greedy output with any drafter must be token-identical to greedy output without one (and to transformers'),
under every scheduler setting of tests/engine/test_exactness.py; the KV blocks of rejected drafts are
never leaked; bad `speculative_config`s raise ValueError naming the key.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from mini import LLM, SamplingParams
from mini.sampling_params import RequestOutputKind, StructuredOutputsParams
from tests.engine.test_exactness import (
    MAX_TOKENS,
    SETTINGS,
    TOP_FEW,
    SchedulerSpy,
    assert_greedy_matches,
    make_prompts,
    transformers_greedy,
)

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

CODE_PROMPTS = [
    "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n",
    "import os\nimport sys\n\n\ndef main():\n    for name in os.listdir('.'):\n        print(name)\n\n\ndef main",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n",
]
SPEC_CONFIGS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1},
    "draft_model": {"method": "draft_model", "num_speculative_tokens": 3},
    "eagle": {"method": "eagle", "num_speculative_tokens": 3},
}
SHIPPED_SETTINGS = {**SETTINGS, "prefix_caching": {"block_size": 4, "enable_prefix_caching": True}}
SHIPPED_MAX_TOKENS = 24


def assert_no_leak(llm: LLM) -> None:
    pool = llm.llm_engine.scheduler.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, "KV blocks leaked after generate()"
    assert all(block.ref_cnt == 0 for block in pool.blocks[1:]), "a block kept a reference after generate()"


@pytest.fixture(scope="module")
def shipped_greedy():
    """The shipped model's greedy outputs without speculation, per scheduler setting."""
    cache: dict[str, list[list[int]]] = {}

    def get(setting: str) -> list[list[int]]:
        if setting not in cache:
            llm = LLM(**SHIPPED_SETTINGS[setting])
            params = SamplingParams(temperature=0.0, max_tokens=SHIPPED_MAX_TOKENS, ignore_eos=True)
            cache[setting] = [list(o.outputs[0].token_ids) for o in llm.generate(CODE_PROMPTS, params, use_tqdm=False)]
        return cache[setting]

    return get


@pytest.mark.parametrize("method", list(SPEC_CONFIGS))
@pytest.mark.parametrize("setting", list(SHIPPED_SETTINGS))
def test_greedy_identical_with_and_without_speculation(shipped_greedy, method, setting):
    llm = LLM(speculative_config=SPEC_CONFIGS[method], **SHIPPED_SETTINGS[setting])
    spy = SchedulerSpy(llm)
    params = SamplingParams(temperature=0.0, max_tokens=SHIPPED_MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate(CODE_PROMPTS, params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outputs] == shipped_greedy(setting)
    stats = llm.llm_engine.get_scheduler_stats().spec_decoding_stats
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0, f"{method} should draft and get drafts accepted"
    assert stats.num_accepted_tokens <= stats.num_draft_tokens
    if setting in ("preemption", "priority"):
        assert spy.num_preemptions > 0, "the KV pool was meant to be too small: preemption should happen"
    assert_no_leak(llm)


@pytest.mark.parametrize("arch", ["llama-tied", "llama-untied", "qwen2", "qwen3"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_ngram_greedy_matches_transformers(tiny_model_factory, arch, setting):
    model_dir = tiny_model_factory(arch)
    # Repetitive prompts, so the n-gram drafter really finds matches in random-weight models' text.
    prompts = [(p + p)[: min(2 * len(p), 40)] for p in make_prompts(vocab_size=211)]
    expected = transformers_greedy(model_dir, prompts)
    llm = LLM(model=str(model_dir), skip_tokenizer_init=True, speculative_config=SPEC_CONFIGS["ngram"],
              **SETTINGS[setting])
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=TOP_FEW)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                           priority=[i % 3 for i in range(len(prompts))] if setting == "priority" else None)
    assert_greedy_matches(expected, outputs)
    assert llm.llm_engine.get_scheduler_stats().spec_decoding_stats.num_drafts > 0
    assert_no_leak(llm)


def test_ngram_acceptance_and_metrics_on_repetitive_code():
    llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    prompt = "x = [1, 2, 3]\n" * 8
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True), use_tqdm=False)[0]
    stats = llm.llm_engine.get_scheduler_stats().spec_decoding_stats
    assert stats.mean_acceptance_length >= 1.5, f"repetitive text should accept drafts: {stats}"
    per_pos = stats.num_accepted_tokens_per_pos
    assert len(per_pos) == 4 and all(a >= b for a, b in itertools.pairwise(per_pos)), per_pos
    assert sum(per_pos) == stats.num_accepted_tokens
    assert len(out.outputs[0].token_ids) == 32
    mine = out.metrics["spec_decoding"]   # the request's own counters: it was the only request
    assert (mine.num_drafts, mine.num_accepted_tokens) == (stats.num_drafts, stats.num_accepted_tokens)


def test_max_tokens_and_stop_string_inside_an_accepted_run():
    prompt = "x = [1, 2, 3]\n" * 8
    base = LLM()
    spec = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    for params in (SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True),
                   SamplingParams(temperature=0.0, max_tokens=40, stop=["2, 3]\nx"], ignore_eos=True),
                   SamplingParams(temperature=0.0, max_tokens=40, stop=["]"], include_stop_str_in_output=True)):
        want = base.generate(prompt, params, use_tqdm=False)[0].outputs[0]
        got = spec.generate(prompt, params, use_tqdm=False)[0].outputs[0]
        assert (got.text, got.finish_reason) == (want.text, want.finish_reason)
        assert len(got.token_ids) <= params.max_tokens
    assert_no_leak(spec)


def test_logprobs_and_streaming_agree_with_no_speculation():
    prompt = "for i in range(10):\n    print(i)\n" * 3
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2)
    want = LLM().generate(prompt, params, use_tqdm=False)[0].outputs[0]
    llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    got = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
    assert got.token_ids == want.token_ids
    for mine, theirs in zip(got.logprobs, want.logprobs, strict=False):
        assert mine.keys() == theirs.keys()
        for token in mine:
            assert abs(mine[token].logprob - theirs[token].logprob) < 1e-4
    # DELTA streaming: the pieces add up to the whole, and some steps carried several tokens.
    engine = llm.llm_engine
    engine.add_request("s", prompt, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True,
                                                   output_kind=RequestOutputKind.DELTA))
    pieces = []
    while engine.has_unfinished_requests():
        pieces += [list(o.outputs[0].token_ids) for o in engine.step() if o.request_id == "s"]
    assert [token for piece in pieces for token in piece] == list(want.token_ids)
    assert max(len(piece) for piece in pieces) > 1, "no step emitted more than one token"


def test_parallel_sampling_and_seeds_are_reproducible():
    prompt = "def add(a, b):\n    return a + b\n" * 3
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12, ignore_eos=True)
    first = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    again = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    a = first.generate(prompt, params, use_tqdm=False)[0]
    # The same seeded request next to other requests gives the same tokens.
    mixed = again.generate([prompt, "import os\n", "class A:\n"],
                           [params, SamplingParams(temperature=1.0, max_tokens=12),
                            SamplingParams(temperature=0.0, max_tokens=5)], use_tqdm=False)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in mixed.outputs]
    assert len(a.outputs) == 3 and all(len(c.token_ids) == 12 for c in a.outputs)
    assert_no_leak(first)
    assert_no_leak(again)


@pytest.mark.parametrize(("spec", "key"), [
    ({"method": "medusa", "num_speculative_tokens": 2}, "method"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2},
     "prompt_lookup_min"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_tokens": 2}, "draft_tokens"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "model": "/no/such/folder"}, "model"),
])
def test_bad_speculative_configs_name_the_key(spec, key):
    with pytest.raises(ValueError, match=key):
        LLM(speculative_config=spec)


def test_a_draft_with_another_vocabulary_is_refused(tiny_llama_dir):
    # The tiny random model has 211 tokens; the shipped model (the target) has 4,096.
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(speculative_config={"method": "draft_model", "num_speculative_tokens": 2, "model": str(tiny_llama_dir)})


def test_structured_output_with_speculation_is_refused_and_changes_nothing():
    llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    engine = llm.llm_engine
    engine.add_request("ok", "x = 1\n", SamplingParams(temperature=0.0, max_tokens=4))
    with pytest.raises(ValueError, match="structured_outputs"):
        engine.add_request("bad", "x", SamplingParams(structured_outputs=StructuredOutputsParams(regex="[ab]+")))
    assert not engine.scheduler.requests.get("bad")
    finished = []
    while engine.has_unfinished_requests():
        finished += [o.request_id for o in engine.step() if o.finished]
    assert finished == ["ok"]
    assert_no_leak(llm)


def test_rollback_keeps_computed_tokens_and_blocks_in_step():
    """After every step, each running request's computed tokens are exactly its tokens minus the newest one,
    and it holds just the blocks those (plus the lookahead slots) need."""
    from mini.utils import cdiv

    llm = LLM(block_size=4, speculative_config={"method": "draft_model", "num_speculative_tokens": 3})
    engine = llm.llm_engine
    for index, prompt in enumerate(CODE_PROMPTS):
        engine.add_request(str(index), prompt, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    scheduler = engine.scheduler
    while engine.has_unfinished_requests():
        engine.step()
        for request in scheduler.running:
            if request.num_output_tokens == 0:
                continue
            assert request.num_computed_tokens == request.num_tokens - 1
            held = len(scheduler.kv_cache_manager.get_block_ids(request.request_id))
            assert cdiv(request.num_tokens - 1, 4) <= held <= cdiv(request.num_tokens + 3 + 3, 4)
    assert_no_leak(llm)


def test_rejection_sample_part_sees_target_probs_that_sum_to_one():
    from mini import roles

    seen = []

    def spy(draft_token_ids, num_draft_tokens, draft_probs, target_probs, bonus_token_ids, is_greedy, generators):
        seen.append((target_probs.sum(dim=-1), is_greedy.clone()))
        return roles.reference("rejection_sample")(draft_token_ids, num_draft_tokens, draft_probs, target_probs,
                                                   bonus_token_ids, is_greedy, generators)

    with roles.use(rejection_sample=spy):   # the engine chooses its parts when it is built
        llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1})
    llm.generate("x = [1, 2]\n" * 5, SamplingParams(temperature=0.5, top_k=20, max_tokens=24, seed=1),
                 use_tqdm=False)
    assert seen
    for sums, is_greedy in seen:
        assert torch.allclose(sums, torch.ones_like(sums), atol=1e-4)
        assert not bool(is_greedy.any())
    seen.clear()
    LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 2}).generate(
        "x = [1, 2]\n" * 5, SamplingParams(temperature=0.5, max_tokens=8, seed=1), use_tqdm=False)
    assert not seen, "an engine built outside the block keeps the reference"


def test_each_step_samples_every_row_once():
    """One pass per row: a step with drafts runs the sampler once over the batch (a row with drafts gets its
    bonus token there) and the rejection sampler over the draft positions; nothing is sampled twice."""
    llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1})
    engine = llm.llm_engine
    sampler = engine.model_runner.sampler
    rows_per_call: list[int] = []
    sampler.register_forward_hook(lambda module, args, out: rows_per_call.append(int(args[0].shape[0])))
    params = [SamplingParams(temperature=0.8, seed=4, max_tokens=16, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)]
    for index, prompt in enumerate(["x = [1, 2, 3]\n" * 6, "for i in range(3):\n    print(i)\n" * 3]):
        engine.add_request(str(index), prompt, params[index])
    steps = 0
    while engine.has_unfinished_requests():
        before = len(rows_per_call)
        engine.step()
        steps += 1
        assert len(rows_per_call) == before + 1, "the sampler ran more than once in a step"
    drafted = engine.get_scheduler_stats().spec_decoding_stats.num_drafts
    assert drafted > 0 and steps == len(rows_per_call)
    assert_no_leak(llm)


def test_prometheus_counts_drafts_and_accepted_tokens():
    pytest.importorskip("prometheus_client")
    from mini.engine.async_llm import IterationStats
    from mini.entrypoints.openai.metrics import PrometheusStatLogger

    llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    logger = PrometheusStatLogger("tiny-llama")
    engine = llm.llm_engine
    engine.add_request("r", "x = [1, 2, 3]\n" * 6, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
        logger.record(engine.get_scheduler_stats(), IterationStats())
    stats = engine.get_scheduler_stats().spec_decoding_stats
    text = logger.render().decode()
    assert f'mini:spec_decode_num_drafts_total{{model_name="tiny-llama"}} {float(stats.num_drafts)}' in text
    assert (f'mini:spec_decode_num_accepted_tokens_total{{model_name="tiny-llama"}} '
            f'{float(stats.num_accepted_tokens)}') in text
    assert stats.num_accepted_tokens > 0
    first = stats.num_accepted_tokens_per_pos[0]
    series = 'mini:spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny-llama",position="0"}'
    assert f"{series} {float(first)}" in text
