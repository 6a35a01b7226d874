"""Checks for phase 00 (the autoregressive loop).

    check_kv_bytes_per_block(kv_bytes_per_block)        vs mini's LLMEngine.kv_bytes_per_block
    check_generate_naive(generate_naive)                vs transformers greedy `generate` (no cache)
    check_generate_with_kv_cache(generate_with_kv_cache)  vs the same, one token per step

The two loops are checked on a tiny random Llama (built from a config, never downloaded), both for
their tokens and for what they feed the model at each call: the whole sequence every time without a
cache; the prompt once, then one token per call with a cache.

vLLM counterparts: `kv_bytes_per_block` is `AttentionSpec.page_size_bytes` (vllm/v1/kv_cache_interface.py)
summed over the layers, with the head size and KV heads of vllm/transformers_utils/model_arch_config_convertor.py;
that code passes this check (tests/test_course_vllm_answers_p00.py). The two loops have no vLLM counterpart
(vLLM never runs a loop without its paged cache).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable
from typing import Any

import torch

from labs.checks.common import calling, expect_equal, passed, tiny_llama_config
from labs.manifest import Exercise, Phase
from mini.config import EngineConfig
from mini.engine.llm_engine import LLMEngine

# Real checkpoints' attention shapes (from their config.json files on the Hugging Face hub).
REAL_MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "Llama-2-7B": {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
    },
    "Llama-3.1-8B": {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
    "Llama-3.1-70B": {
        "model_type": "llama",
        "num_hidden_layers": 80,
        "hidden_size": 8192,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
    },
    "Qwen2.5-7B": {
        "model_type": "qwen2",
        "num_hidden_layers": 28,
        "hidden_size": 3584,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
    },
    "Qwen3-8B": {
        "model_type": "qwen3",
        "num_hidden_layers": 36,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
    },
}


def hf_config(model_type: str = "llama", **fields: Any) -> Any:
    """A transformers config object (no weights) of the given family."""
    import transformers

    classes = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config"}
    return getattr(transformers, classes[model_type])(**fields)


def _kv_cases(seeds: Iterable[int]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    cases = [
        ({"block_size": 1, "dtype": "bfloat16"}, REAL_MODEL_CONFIGS[name]) for name in REAL_MODEL_CONFIGS
    ]
    cases.append(({"block_size": 16, "dtype": "float32"}, REAL_MODEL_CONFIGS["Llama-3.1-8B"]))
    for seed in seeds:
        rng = random.Random(seed)
        num_kv_heads = rng.choice([1, 2, 4])
        num_heads = num_kv_heads * rng.choice([1, 2, 4])
        fields = {
            "model_type": rng.choice(["llama", "qwen2", "qwen3"]),
            "num_hidden_layers": rng.randint(1, 6),
            "num_attention_heads": num_heads,
            "num_key_value_heads": num_kv_heads,
            "hidden_size": num_heads * rng.choice([8, 16, 32]),
        }
        if rng.random() < 0.4:
            fields["head_dim"] = rng.choice([8, 64, 128])  # head_dim need not be hidden_size // num_heads
        engine = {
            "block_size": rng.choice([1, 4, 16, 32]),
            "dtype": rng.choice(["float32", "bfloat16", "float16"]),
        }
        cases.append((engine, fields))
    return cases


KV_HINT = ("2 (K and V) x layers x block_size x kv heads x head size x bytes per element; "
           "head size is hf_config.head_dim when set, else hidden_size // num_attention_heads")


def _kv_hint(expected: int, got: Any, model_config: Any, block_size: int) -> str:
    """Name the factor that is off (K and V, KV heads, head size, block size), then the rule."""
    if not isinstance(got, (int, float)) or not got:
        return KV_HINT
    heads = model_config.num_attention_heads
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    head_dim = getattr(model_config, "head_dim", None)
    default_head = model_config.hidden_size // heads
    slips = [
        (expected / 2, "half the bytes: a block stores a key AND a value per token, head and layer (the factor 2)"),
        (expected * heads / kv_heads if kv_heads != heads else None,
         "the cache stores the KV heads (num_key_value_heads), not the query heads: grouped-query attention"),
        (expected * default_head / head_dim if head_dim and head_dim != default_head else None,
         "the head size is hf_config.head_dim when the config sets it (Qwen3 does), not hidden_size // heads"),
        (expected / block_size if block_size != 1 else None,
         "that is one token's bytes: a block holds block_size tokens"),
    ]
    for value, hint in slips:
        if value is not None and got == value:
            return f"{hint}. {KV_HINT}"
    return KV_HINT


def check_kv_bytes_per_block(kv_bytes_per_block: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = _kv_cases(seeds)
    for engine_fields, model_fields in cases:
        config = EngineConfig(**engine_fields)
        model_config = hf_config(**model_fields)
        inputs = {"config": engine_fields, "hf_config": model_fields}
        expected = LLMEngine.kv_bytes_per_block(config, model_config)
        with calling("kv_bytes_per_block", inputs, expected=expected):
            got = kv_bytes_per_block(config, model_config)
        expect_equal("kv_bytes_per_block", inputs, expected, got,
                     _kv_hint(expected, got, model_config, engine_fields["block_size"]))
    passed("check_kv_bytes_per_block", len(cases))


@functools.lru_cache(maxsize=1)
def tiny_llama() -> Any:
    """A 2-layer random Llama (vocab 97) with no EOS, so greedy loops run to max_new_tokens."""
    import transformers

    config = tiny_llama_config(vocab_size=97, hidden_size=32, initializer_range=0.2)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def reference_greedy(model: Any, prompt_token_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy decoding: the new token ids only (memoized for the tiny model)."""
    if model is tiny_llama():
        return list(_tiny_llama_greedy(tuple(prompt_token_ids), max_new_tokens))
    return _greedy(model, prompt_token_ids, max_new_tokens)


@functools.lru_cache(maxsize=256)
def _tiny_llama_greedy(prompt_token_ids: tuple[int, ...], max_new_tokens: int) -> tuple[int, ...]:
    return tuple(_greedy(tiny_llama(), list(prompt_token_ids), max_new_tokens))


def _greedy(model: Any, prompt_token_ids: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        input_ids = torch.tensor([prompt_token_ids])
        output = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            pad_token_id=0,
        )
    return output[0, len(prompt_token_ids) :].tolist()


class _InputLengthSpy:
    """Records, at each forward call, how many token ids the model is given and whether a cache came with them."""

    def __init__(self, model: Any) -> None:
        self.lengths: list[int] = []
        self.with_cache: list[bool] = []
        self._handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: Any, args: tuple, kwargs: dict) -> None:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is not None:
            self.lengths.append(int(input_ids.shape[-1]))
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            self.with_cache.append(cache is not None)

    def remove(self) -> None:
        self._handle.remove()


def _loop_cases(seeds: Iterable[int]) -> list[tuple[list[int], int]]:
    cases = [([5, 17, 42], 6), ([1], 1)]
    for seed in seeds:
        rng = random.Random(seed)
        cases.append(([rng.randrange(97) for _ in range(rng.randint(1, 12))], rng.randint(1, 10)))
    return cases


def _check_loop(
    name: str, loop: Callable, seeds: Iterable[int], expected_lengths: Callable, hint: str,
    expected_cache: Callable | None = None,
) -> int:
    model = tiny_llama()
    cases = _loop_cases(seeds)
    for prompt, max_new_tokens in cases:
        inputs = {"prompt_token_ids": prompt, "max_new_tokens": max_new_tokens}
        expected = reference_greedy(model, prompt, max_new_tokens)
        spy = _InputLengthSpy(model)
        try:
            with calling(name, inputs, expected=expected), torch.no_grad():
                got = loop(model, list(prompt), max_new_tokens)
        finally:
            spy.remove()
        got = got.tolist() if isinstance(got, torch.Tensor) else got
        expect_equal(f"{name}: token ids fed to the model at each call", inputs,
                     expected_lengths(len(prompt), max_new_tokens), spy.lengths, hint)
        if expected_cache is not None:
            expect_equal(f"{name}: a cache passed to each call", inputs, expected_cache(max_new_tokens),
                         spy.with_cache, "every call after the prefill must pass the `cache` the previous call "
                         "returned: without it the model sees only the newest token")
        expect_equal(
            f"{name} tokens",
            inputs,
            expected,
            got,
            "return ONLY the new token ids (a list, not the prompt), each the argmax of the last position's logits",
        )
    return len(cases)


def check_generate_naive(generate_naive: Callable, seeds: Iterable[int] = range(6)) -> None:
    num_cases = _check_loop(
        "generate_naive",
        generate_naive,
        seeds,
        lambda prompt_len, n: [prompt_len + step for step in range(n)],
        "without a cache every step runs the model on the WHOLE sequence so far (prompt + new tokens)",
    )
    passed("check_generate_naive", num_cases)


def check_generate_with_kv_cache(generate_with_kv_cache: Callable, seeds: Iterable[int] = range(6)) -> None:
    num_cases = _check_loop(
        "generate_with_kv_cache",
        generate_with_kv_cache,
        seeds,
        lambda prompt_len, n: [prompt_len] + [1] * (n - 1),
        "prefill the prompt once, then feed ONLY the newest token with the returned `cache` (one call per token)",
        expected_cache=lambda n: [False] + [True] * (n - 1),
    )
    passed("check_generate_with_kv_cache", num_cases)


PHASE = Phase("00_autoregressive_loop", (
    Exercise("kv_bytes_per_block", check_kv_bytes_per_block, points=2, grade_id="test-kv-bytes"),
    Exercise("generate_naive", check_generate_naive, points=3, grade_id="test-generate-naive"),
    Exercise("generate_with_kv_cache", check_generate_with_kv_cache, points=3, grade_id="test-generate-with-kv-cache"),
))
