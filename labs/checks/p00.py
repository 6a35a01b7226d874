"""Checks for phase 00 (the autoregressive loop).

    check_kv_bytes_per_block(kv_bytes_per_block)        vs mini's LLMEngine.kv_bytes_per_block
    check_generate_naive(generate_naive)                vs transformers greedy `generate` (no cache)
    check_generate_with_kv_cache(generate_with_kv_cache)  vs the same, one token per step

The two loops are checked on a tiny random Llama (built from a config, never downloaded), call by call
(a forward hook records how many token ids each call is fed, whether a cache came with them and how many
positions that cache held: the whole sequence every time without a cache; the prompt once, then one token
per call on a cache of every earlier position with one), then token by token. A failure names the prompt,
the first model call or the first token (step) where the learner's run and the reference part, and a hint
naming the concept (feeding only the new token, the cache's positions, the stopping rule, the last position).
Both loops must hand the caller's prompt list back unchanged; `kv_bytes_per_block` must return an int (a float
or a tensor of the right value fails, naming the type), and a wrong count names the factor that is off.

vLLM counterparts: `kv_bytes_per_block` is `AttentionSpec.page_size_bytes` (vllm/v1/kv_cache_interface.py)
summed over the layers, with the head size and KV heads of vllm/transformers_utils/model_arch_config_convertor.py;
that code passes this check (tests/course/vllm_answers/test_p00.py). The two loops have no vLLM counterpart
(vLLM never runs a loop without its paged cache).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable
from typing import Any

import torch

from labs.checks.common import (
    calling,
    counterexample,
    expect_equal,
    expect_same_steps,
    passed,
    tiny_llama_config,
)
from labs.checks.grading import graded, import_engine_stack
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


KV_HINT = ("count what one block holds: for every layer and every one of its block_size tokens, a key and a "
           "value for each KV head, each head-size numbers of config.torch_dtype (compare with the worked "
           "examples' table: Llama-3.1-8B in bf16 is 131072 bytes per token)")
KV_RAISE_HINT = ("not every config has every field: Qwen2's has no head_dim attribute at all (then the head size "
                 "follows from hidden_size and the query heads); config.torch_dtype is the torch dtype "
                 "(config.dtype is its name, a string)")


def _kv_hint(expected: int, got: Any, model_config: Any, block_size: int, element_size: int) -> str:
    """Name the factor that is off (K and V, KV heads, head size, block size, layers, element size): every slip
    whose value matches, then what a block holds."""
    if isinstance(got, bool) or not isinstance(got, (int, float)) or not got:
        return KV_HINT
    heads = model_config.num_attention_heads
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    head_dim = getattr(model_config, "head_dim", None)
    default_head = model_config.hidden_size // heads
    layers = model_config.num_hidden_layers
    slips = [
        (expected / 2, "half the bytes: a block stores a key AND a value per token, head and layer (the factor 2)"),
        (expected * heads / kv_heads if kv_heads != heads else None,
         ("the cache stores the KV heads (num_key_value_heads), not the query heads: grouped-query attention "
          "(and without head_dim a head's size divides hidden_size among the QUERY heads)")),
        (expected * default_head / head_dim if head_dim and head_dim != default_head else None,
         "the head size is hf_config.head_dim when the config sets it (Qwen3 does), not hidden_size // heads"),
        (expected / block_size if block_size != 1 else None,
         "that is one token's bytes: a block holds block_size tokens"),
        (expected / layers if layers != 1 else None, "that is one layer's bytes: a block spans every layer"),
        *((expected * assumed / element_size,
           (f"that counts {assumed} bytes per number, but this case's dtype takes {element_size}: the element "
            "size comes from config.torch_dtype")) for assumed in (1, 2, 4, 8) if assumed != element_size),
    ]
    matches = [hint for value, hint in slips if value is not None and got == value]
    return f"{' or '.join(matches)}. {KV_HINT}" if matches else KV_HINT


def _expect_int(inputs: dict[str, Any], expected: int, got: Any) -> None:
    """Bytes are a Python int: the engine divides its memory by them to count blocks."""
    import numbers

    if isinstance(got, numbers.Integral) and not isinstance(got, bool):
        return
    raise AssertionError(counterexample(
        "kv_bytes_per_block", inputs, f"{expected} (int)", f"{got!r} ({type(got).__name__})",
        "the right number, of the wrong type: return a Python int (bytes). A true division (/) gives a float, "
        "torch arithmetic a tensor; the engine divides its memory by this number to count whole blocks"))


def _same_number(expected: int, got: Any) -> bool:
    """`got == expected` as a plain bool (a tensor's `==` is a tensor; anything odd is simply unequal)."""
    try:
        return bool(got == expected)
    except Exception:  # noqa: BLE001 - a learner's odd return value is a wrong answer, not a crash
        return False


@graded
def check_kv_bytes_per_block(kv_bytes_per_block: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = _kv_cases(seeds)
    for engine_fields, model_fields in cases:
        config = EngineConfig(**engine_fields)
        model_config = hf_config(**model_fields)
        inputs = {"config": engine_fields, "hf_config": model_fields}
        expected = LLMEngine.kv_bytes_per_block(config, model_config)
        element_size = torch.empty((), dtype=config.torch_dtype).element_size()
        with calling("kv_bytes_per_block", inputs, expected=expected, hint=KV_RAISE_HINT):
            got = kv_bytes_per_block(config, model_config)
        expect_equal("kv_bytes_per_block", inputs, expected, got,
                     _kv_hint(expected, got, model_config, engine_fields["block_size"], element_size),
                     equal=_same_number)
        _expect_int(inputs, expected, got)
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


class _CallRecorder:
    """Records, at each forward call of the model, how many token ids it is given, whether a cache came with
    them and how many positions that cache already held (one dict per call)."""

    def __init__(self, model: Any) -> None:
        self.calls: list[dict[str, Any]] = []
        self._handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: Any, args: tuple, kwargs: dict) -> None:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is not None:
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            cached = cache.get_seq_length() if hasattr(cache, "get_seq_length") else 0
            self.calls.append({"token ids fed": int(input_ids.shape[-1]), "cache passed": cache is not None,
                               "positions in the cache": int(cached)})

    def remove(self) -> None:
        self._handle.remove()


def _loop_cases(seeds: Iterable[int]) -> list[tuple[list[int], int]]:
    cases = [([5, 17, 42], 6), ([1], 1)]
    for seed in seeds:
        rng = random.Random(seed)
        cases.append(([rng.randrange(97) for _ in range(rng.randint(1, 12))], rng.randint(1, 10)))
    return cases


def _expected_calls(cached: bool, prompt_len: int, max_new_tokens: int) -> list[dict[str, Any]]:
    """The reference's model calls: call k produces new token k."""
    if not cached:
        return [{"token ids fed": prompt_len + k, "cache passed": False, "positions in the cache": 0}
                for k in range(max_new_tokens)]
    return [{"token ids fed": prompt_len, "cache passed": False, "positions in the cache": 0}] + [
        {"token ids fed": 1, "cache passed": True, "positions in the cache": prompt_len + k - 1}
        for k in range(1, max_new_tokens)]


CALLS_HINT = {  # (cached loop?, what is off) -> the concept to revisit
    (False, "fed"): "without a cache every step runs the model on the WHOLE sequence so far (prompt + every "
                    "new token): the model has no memory of earlier calls",
    (True, "fed"): "prefill the prompt once, then feed ONLY the newest token: the cache already holds the keys "
                   "and values of every earlier position",
    (True, "cache"): "every call after the prefill must pass the `cache` the previous call returned: without it "
                     "the model sees only the newest token, at position 0",
    (True, "positions"): "the cache passed at call k must already hold the keys and values of every earlier "
                         "position (the prompt, then new tokens 0..k-2), so that the token you feed lands at the "
                         "next position: pass the cache the previous call returned, not a new or trimmed one",
    (False, "positions"): "the naive loop passes no cache: each call starts from nothing",
    (False, "cache"): "the naive loop passes no cache (use_cache=False): each call starts from nothing",
    (True, "too many"): "one call per token: call k produces new token k, so the last new token needs no call "
                        "after it (stopping rule: max_new_tokens calls in all)",
    (False, "too many"): "one call per token: call k produces new token k (stopping rule: max_new_tokens calls)",
    (True, "too few"): "stopping rule: exactly max_new_tokens new tokens, one model call each",
    (False, "too few"): "stopping rule: exactly max_new_tokens new tokens, one model call each",
}


def _check_calls(name: str, cached: bool, inputs: dict[str, Any], expected: list[dict], got: list[dict]) -> None:
    __tracebackhide__ = True
    step = next((k for k, (e, g) in enumerate(zip(expected, got, strict=False)) if e != g), None)
    if step is not None:
        e, g = expected[step], got[step]
        kind = ("cache" if e["cache passed"] != g["cache passed"] else "fed" if e["token ids fed"] != g["token ids fed"]
                else "positions")
    elif len(got) != len(expected):
        step, kind = min(len(got), len(expected)), "too many" if len(got) > len(expected) else "too few"
    else:
        return
    names = [f"call {k} ({'prefill' if k == 0 and cached else 'decode' if cached else 'full sequence'})"
             for k in range(max(len(expected), len(got)))]
    where = f"prompt_token_ids={inputs['prompt_token_ids']}, max_new_tokens={inputs['max_new_tokens']}"
    try:
        expect_same_steps(f"{name} ({where}): what you fed the model at each call", expected, got,
                          hint=CALLS_HINT[cached, kind], step_names=names)
    except AssertionError as failure:
        body, _, hint = str(failure).rpartition("\n  hint: ")
        raise AssertionError(f"{body}\n  first differing model call: call {step} (the reference makes "
                             f"{len(expected)} calls, yours made {len(got)})\n  hint: {hint}") from None


def _token_hint(cached: bool, prompt: list[int], expected: list[int], got: Any, step: int | None) -> str:
    if isinstance(got, list) and got[: len(prompt)] == prompt and len(got) == len(prompt) + len(expected):
        return "return ONLY the new token ids (a list, not the prompt)"
    if not isinstance(got, list) or step is None:
        return ("return a list of exactly max_new_tokens ints (stopping rule: no more, no fewer; this model has "
                "no EOS), each the argmax of the last position's logits")
    if step == 0:
        return ("new token 0 is the argmax of the logits at the LAST position of the prompt's call "
                "(logits[0, -1]), not of another position")
    if cached:
        return (f"tokens 0..{step - 1} agree, so the prefill is right: at call {step} feed the token generated at "
                f"step {step - 1}, with the cache of every earlier position (the KV cache's positions must be "
                "0..n-1 in order, each token once)")
    return (f"tokens 0..{step - 1} agree: before call {step} append new token {step - 1} to the sequence, and take "
            "the argmax of the LAST position's logits each time")


def _check_tokens(name: str, cached: bool, inputs: dict[str, Any], expected: list[int], got: Any) -> None:
    __tracebackhide__ = True
    if got == expected:
        return
    prompt = inputs["prompt_token_ids"]
    step = None
    if isinstance(got, list):
        step = next((k for k, (e, g) in enumerate(zip(expected, got, strict=False)) if e != g), None)
    hint = _token_hint(cached, prompt, expected, got, step)
    lines = [f"{name}: wrong tokens for prompt_token_ids={prompt}, max_new_tokens={inputs['max_new_tokens']}"]
    if step is not None:
        agreed = f"tokens 0..{step - 1} agree: {expected[:step]}" if step else "the very first new token"
        lines += [f"  first differing token: step {step} ({agreed})",
                  f"  expected from step {step}: {expected[step:step + 8]}",
                  f"  got from step {step}:      {got[step:step + 8]}"]
    elif isinstance(got, list):
        lines.append(f"  length: expected {len(expected)} new tokens, got {len(got)} "
                     f"(the first {min(len(expected), len(got))} agree)")
    lines += [f"  expected: {expected}", f"  got:      {got!r}"[:400], f"  hint: {hint}"]
    raise AssertionError("\n".join(lines))


LOOP_RAISE_HINT = ("the model takes input_ids of shape [1, n] (a batch of one sequence of n token ids) and returns "
                   "logits of shape [1, n, vocab]; a new token id is the argmax over the vocabulary of ONE position's "
                   "row (an argmax over the whole tensor is a flat index, not a token id)")


def _check_prompt_unchanged(name: str, inputs: dict[str, Any], prompt: list[int], given: Any) -> None:
    """The caller's list must come back as it was: the engine (and the plug cell) reuse the prompt."""
    __tracebackhide__ = True
    if given != prompt:
        raise AssertionError(
            f"{name} changed the list it was given: prompt_token_ids was {prompt}, after your call it is "
            f"{given!r}"[:400] + "\n  hint: the tokens are right, but the caller's prompt_token_ids must come back "
            "unchanged (the caller reuses it: the plug cell runs the engine on the same list). Append the new "
            "tokens to a copy of the prompt, not to the list you were given")


def _check_loop(name: str, loop: Callable, seeds: Iterable[int], cached: bool) -> int:
    model = tiny_llama()
    cases = _loop_cases(seeds)
    for prompt, max_new_tokens in cases:
        inputs = {"prompt_token_ids": prompt, "max_new_tokens": max_new_tokens}
        expected = reference_greedy(model, prompt, max_new_tokens)
        recorder = _CallRecorder(model)
        given = list(prompt)
        try:
            with calling(name, inputs, expected=expected, hint=LOOP_RAISE_HINT), torch.no_grad():
                got = loop(model, given, max_new_tokens)
        finally:
            recorder.remove()
        got = got.tolist() if isinstance(got, torch.Tensor) else got
        got = list(got) if isinstance(got, tuple) else got
        _check_calls(name, cached, inputs, _expected_calls(cached, len(prompt), max_new_tokens), recorder.calls)
        _check_tokens(name, cached, inputs, expected, got)
        _check_prompt_unchanged(name, inputs, prompt, given)
    return len(cases)


@graded
def check_generate_naive(generate_naive: Callable, seeds: Iterable[int] = range(6)) -> None:
    """The tokens of transformers' greedy `generate`, and at call k the whole sequence (prompt + k tokens)
    with no cache; a failure names the prompt and the first call or token (step) that differs."""
    passed("check_generate_naive", _check_loop("generate_naive", generate_naive, seeds, cached=False))


@graded
def check_generate_with_kv_cache(generate_with_kv_cache: Callable, seeds: Iterable[int] = range(6)) -> None:
    """The same tokens, with the prompt fed once (no cache) then one token per call with the returned cache;
    a failure names the prompt and the first call or token (step) that differs."""
    passed("check_generate_with_kv_cache",
           _check_loop("generate_with_kv_cache", generate_with_kv_cache, seeds, cached=True))


# Built once in the grading process before it forks a child per check (labs/checks/grading.py).
WARM_UP = (tiny_llama, import_engine_stack)

PHASE = Phase("00_autoregressive_loop", (
    Exercise("kv_bytes_per_block", check_kv_bytes_per_block, points=2, grade_id="test-kv-bytes"),
    Exercise("generate_naive", check_generate_naive, points=2, grade_id="test-generate-naive"),
    Exercise("generate_with_kv_cache", check_generate_with_kv_cache, points=4, grade_id="test-generate-with-kv-cache",
             design="the cached loop's call schedule (what each call is fed, with which cache, when to stop) from "
                    "two rules: no position computed twice, no call whose result goes unused"),
))
