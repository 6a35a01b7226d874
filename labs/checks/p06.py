"""Checks for phase 06 (the engine loop and I/O), against mini.engine and mini.core.sched.utils.

    check_detokenize_incrementally(detokenize_incrementally)
    check_check_stop_strings(check_stop_strings)
    check_check_stop(check_stop)
    check_step(step)
    check_parent_request(ParentRequest)          # n > 1: the fan-out into children and the gather
    check_beam_search_step(beam_search_step)     # one step of beam search on logprob tables

The detokenizer cases use the shipped tokenizer (mini/assets/tiny-llama, byte-level BPE): an emoji is
4 byte tokens, a CJK character 3, so most prefixes of a stream end inside a character; and a small
Llama-style (SentencePiece, byte fallback) tokenizer, where decoding a token without its context loses
the word's leading space. `check_step`
runs each workload on one small engine (shipped model) twice, stepped by the reference
`LLMEngine.step` and then by the candidate, and compares every step's outputs.
"""

from __future__ import annotations

import functools
import random
import types
from collections.abc import Callable, Iterable
from typing import Any

from labs.checks.common import calling, expect_equal, passed
from labs.checks.grading import graded, import_engine_stack
from labs.manifest import Exercise, Phase
from mini.config import SHIPPED_MODEL_DIR
from mini.core.request import Request, RequestStatus
from mini.core.sched import utils as sched_utils
from mini.engine import detokenizer as reference
from mini.sampling_params import RequestOutputKind, SamplingParams

# The phase's worked example: a prompt, then an output with an accent, an emoji and two CJK characters.
WORKED_PROMPT = "The cat"
WORKED_TEXT = " sat, café 🙂 世界!"
TEXTS = [WORKED_TEXT, " 🙂🙂", "世界 and 🍕 pizza", " naïve ünïcödé", "a\nb\tc", " 日本語のテキスト"]


@functools.lru_cache(maxsize=1)
def shipped_tokenizer() -> Any:
    """The shipped model's tokenizer (loaded once per process)."""
    from mini.tokenizer import load_tokenizer

    return load_tokenizer(SHIPPED_MODEL_DIR)


@functools.lru_cache(maxsize=1)
def llama_style_tokenizer() -> Any:
    """A small SentencePiece-style (Llama 2) tokenizer trained in memory: a word's leading space is part of
    its token ("\u2581world") and the decoder strips the space at the start of a decoded string, so a token
    decoded without the tokens before it loses its space (why the prefix is decoded as context).
    Byte fallback (<0xF0> ...) spells characters the vocabulary lacks."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0),
    ])
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=specials, show_progress=False, limit_alphabet=60)
    tokenizer.train_from_iterator(["Hello world! The quick brown fox.", "caf\u00e9 d\u00e9j\u00e0 vu", "stop END"] * 3,
                                  trainer)
    spec = json.loads(tokenizer.to_str())
    trained = sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])
    ordered = specials + [f"<0x{b:02X}>" for b in range(256)] + [t for t, _ in trained if t not in specials]
    spec["model"]["vocab"] = {token: index for index, token in enumerate(ordered)}
    for added in spec["added_tokens"]:
        added["id"] = ordered.index(added["content"])
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")


LLAMA_STYLE_TEXTS = [("Hello", " world! The quick brown fox"), ("The", " caf\u00e9 \U0001f642 d\u00e9j\u00e0 vu")]


def stream_tokens(tokenizer: Any, prompt_ids: list[int], output_ids: list[int]) -> Iterable[dict[str, Any]]:
    """The (tokens, prefix_offset, read_offset) inputs the detokenizer sees, one per output token.

    Driven by the reference, exactly as OffsetIncrementalDetokenizer does: the token window is primed
    with the last prompt tokens, then each output token's string is appended before the call.
    """
    context = prompt_ids[-(reference.INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET + 2) :]
    tokens = list(tokenizer.convert_ids_to_tokens(context))
    read_offset = len(tokens)
    prefix_offset = max(read_offset - reference.INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET, 0)
    for token_id in output_ids:
        tokens = tokens + tokenizer.convert_ids_to_tokens([token_id])
        yield {"tokens": list(tokens), "prefix_offset": prefix_offset, "read_offset": read_offset}
        _, prefix_offset, read_offset = reference.detokenize_incrementally(
            tokenizer, tokens, prefix_offset, read_offset
        )


def _detok_streams(tokenizer: Any, seeds: Iterable[int]) -> list[tuple[list[int], list[int]]]:
    encode = functools.partial(tokenizer.encode, add_special_tokens=False)
    streams = [(encode(WORKED_PROMPT), encode(text)) for text in TEXTS]
    for seed in seeds:
        rng = random.Random(seed)
        prompt = encode(rng.choice(["The cat", "Once upon a time", "世界", "x"]))
        if rng.random() < 0.5:  # a mix of text pieces, so multi-byte characters are common
            pieces = rng.choices(
                ["🙂", "世", "界", " the", "é", "!", " ", "🍕", "ü", "\n", "abc"], k=rng.randint(1, 8)
            )
            output = encode("".join(pieces))
        else:  # arbitrary token ids: byte tokens that never form a valid character included
            output = [rng.randrange(3, tokenizer.vocab_size) for _ in range(rng.randint(1, 10))]
        streams.append((prompt, output))
    return streams


class CountingTokenizer:
    """The tokenizer the check hands to `detokenize_incrementally`: the real one, recording the most tokens one
    decode call was given (`convert_tokens_to_string`, `decode`), so a detokenizer that decodes the whole output
    at every step (right, but quadratic) is caught."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.longest_decode = 0

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        self.longest_decode = max(self.longest_decode, len(tokens))
        return self._tokenizer.convert_tokens_to_string(tokens)

    def decode(self, token_ids: Any, *args: Any, **kwargs: Any) -> str:
        self.longest_decode = max(self.longest_decode, len(token_ids))
        return self._tokenizer.decode(token_ids, *args, **kwargs)

    def __len__(self) -> int:
        return len(self._tokenizer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


@graded
def check_detokenize_incrementally(
    detokenize_incrementally: Callable, seeds: Iterable[int] = range(12)
) -> None:
    shipped = shipped_tokenizer()
    llama_style = llama_style_tokenizer()
    streams = [(shipped, prompt_ids, output_ids) for prompt_ids, output_ids in _detok_streams(shipped, seeds)]
    for prompt, text in LLAMA_STYLE_TEXTS:  # a word's leading space comes from its token: context matters
        prompt_ids = llama_style.encode(prompt, add_special_tokens=False)
        streams.append((llama_style, prompt_ids,
                        llama_style.encode(prompt + text, add_special_tokens=False)[len(prompt_ids):]))
    num_cases = 0
    for tokenizer, prompt_ids, output_ids in streams:
        for inputs in stream_tokens(tokenizer, prompt_ids, output_ids):
            expected = reference.detokenize_incrementally(
                tokenizer, list(inputs["tokens"]), inputs["prefix_offset"], inputs["read_offset"]
            )
            counting = CountingTokenizer(tokenizer)
            with calling("detokenize_incrementally", inputs, expected=expected):
                got = detokenize_incrementally(
                    counting, list(inputs["tokens"]), inputs["prefix_offset"], inputs["read_offset"]
                )
            got = tuple(got) if isinstance(got, (tuple, list)) else got
            expect_equal(
                "detokenize_incrementally",
                inputs,
                expected,
                got,
                "decode tokens[prefix_offset:read_offset] and tokens[prefix_offset:]; the new text is "
                "the difference (the prefix is context: a Llama-style tokenizer drops a word's leading "
                "space when its token is decoded alone). If it ends in '\\ufffd' (an unfinished character) or adds "
                "nothing, "
                "return '' and the SAME offsets; else (text, read_offset, len(tokens))",
            )
            window = len(inputs["tokens"]) - inputs["prefix_offset"]
            if counting.longest_decode > window:
                expect_equal(
                    "detokenize_incrementally: the most tokens one decode call was given",
                    inputs,
                    f"at most {window} (the tokens from prefix_offset on)",
                    f"{counting.longest_decode} (the tokens before prefix_offset too)",
                    "decode only the window from prefix_offset: the tokens before it are released and no longer "
                    "change the text. Re-decoding the whole output gives the right text but costs a quadratic "
                    "amount of work (1,000 output tokens: about 500,000 tokens decoded, for every request)",
                )
            num_cases += 1
    passed("check_detokenize_incrementally", num_cases)


def _stop_string_cases(seeds: Iterable[int]) -> list[dict[str, Any]]:
    cases = [
        # the worked example: "STOP" arrives split over two steps ("ST" then "OP!")
        {"output_text": "Hello ST", "new_char_count": 2, "stop": ["STOP"], "include_in_output": False},
        {"output_text": "Hello STOP!", "new_char_count": 3, "stop": ["STOP"], "include_in_output": False},
        {"output_text": "Hello STOP!", "new_char_count": 3, "stop": ["STOP"], "include_in_output": True},
        {"output_text": "Hello STOP", "new_char_count": 2, "stop": ["STOP"], "include_in_output": True},
        {"output_text": "a b c", "new_char_count": 0, "stop": ["b"], "include_in_output": False},
        {"output_text": "a b c", "new_char_count": 5, "stop": [], "include_in_output": False},
        {"output_text": "xx\n\nyy", "new_char_count": 4, "stop": ["yy", "\n\n"], "include_in_output": False},
        # several matches in one step (speculative decoding appends several tokens): the one that ENDS
        # earliest wins, as if the tokens had come one at a time, though "abcd" STARTS earlier
        {"output_text": "abcd", "new_char_count": 4, "stop": ["abcd", "bc"], "include_in_output": False},
        {"output_text": "abcd!", "new_char_count": 5, "stop": ["abcd", "bc"], "include_in_output": True},
        # two matches end at the same character: the first in the stop list wins
        {"output_text": "xabc", "new_char_count": 4, "stop": ["abc", "bc"], "include_in_output": False},
        {"output_text": "xabc", "new_char_count": 4, "stop": ["bc", "abc"], "include_in_output": False},
        {"output_text": "xabcy", "new_char_count": 3, "stop": ["c", "bc", "abc"], "include_in_output": True},
        {"output_text": "xabcy", "new_char_count": 3, "stop": ["abc", "bc", "c"], "include_in_output": True},
    ]
    for seed in seeds:
        rng = random.Random(seed)
        text = "".join(rng.choices("ab c\n", k=rng.randint(0, 14)))
        stop = ["".join(rng.choices("ab c\n", k=rng.randint(1, 3))) for _ in range(rng.randint(0, 3))]
        cases.append(
            {
                "output_text": text,
                "new_char_count": rng.randint(0, len(text)),
                "stop": stop,
                "include_in_output": rng.random() < 0.5,
            }
        )
    return cases


@graded
def check_check_stop_strings(check_stop_strings: Callable, seeds: Iterable[int] = range(40)) -> None:
    cases = _stop_string_cases(seeds)
    for case in cases:
        expected = reference.check_stop_strings(**case)
        with calling("check_stop_strings", case, expected=expected):
            got = check_stop_strings(
                case["output_text"], case["new_char_count"], list(case["stop"]), case["include_in_output"]
            )
        got = tuple(got) if isinstance(got, list) else got
        expect_equal(
            "check_stop_strings",
            case,
            expected,
            got,
            "search from len(text) - new_char_count - len(stop) + 1 (a stop string may straddle old "
            "and new text); of several matches, the one that ENDS earliest wins (what one token at a "
            "time would have found first), and on equal ends the one listed first in `stop`; cut "
            "before it, or after it when included (-1 if that is the very end); None when nothing "
            "matches or nothing is new",
        )
    passed("check_check_stop_strings", len(cases))


def _request_case(rng: random.Random | None, fixed: dict[str, Any] | None = None) -> dict[str, Any]:
    if fixed is not None:
        return fixed
    assert rng is not None
    prompt_len = rng.randint(1, 6)
    outputs = [rng.randrange(0, 8) for _ in range(rng.randint(1, 6))]
    max_tokens = rng.choice([None, rng.randint(1, 8)])
    params: dict[str, Any] = {"max_tokens": max_tokens}
    if rng.random() < 0.4:
        params["stop_token_ids"] = rng.sample(range(8), rng.randint(1, 3))
    if rng.random() < 0.3:
        params["ignore_eos"] = True
    if rng.random() < 0.3:
        params["min_tokens"] = rng.randint(0, 5 if max_tokens is None else min(5, max_tokens))
    return {
        "prompt_len": prompt_len,
        "output_token_ids": outputs,
        "eos_token_id": rng.choice([None, 0, 1, 2]),
        "params": params,
        "max_model_len": rng.randint(prompt_len + 1, prompt_len + 10),
    }


FIXED_REQUESTS = [
    # EOS (id 2) ends it; with ignore_eos it does not; stop_token_ids; max_tokens; max_model_len
    {
        "prompt_len": 3,
        "output_token_ids": [5, 2],
        "eos_token_id": 2,
        "params": {"max_tokens": 16},
        "max_model_len": 64,
    },
    {
        "prompt_len": 3,
        "output_token_ids": [5, 2],
        "eos_token_id": 2,
        "params": {"max_tokens": 16, "ignore_eos": True},
        "max_model_len": 64,
    },
    {
        "prompt_len": 3,
        "output_token_ids": [5, 7],
        "eos_token_id": 2,
        "params": {"max_tokens": 16, "stop_token_ids": [7]},
        "max_model_len": 64,
    },
    {
        "prompt_len": 3,
        "output_token_ids": [5, 6, 4],
        "eos_token_id": 2,
        "params": {"max_tokens": 3},
        "max_model_len": 64,
    },
    {
        "prompt_len": 3,
        "output_token_ids": [5, 6],
        "eos_token_id": 2,
        "params": {"max_tokens": 16},
        "max_model_len": 5,
    },
    {  # EOS below min_tokens still stops: min_tokens is the sampler's job (MinTokensLogitsProcessor)
        "prompt_len": 3,
        "output_token_ids": [2],
        "eos_token_id": 2,
        "params": {"max_tokens": 16, "min_tokens": 2},
        "max_model_len": 64,
    },
    {  # a stop token id below min_tokens stops too, with its stop_reason
        "prompt_len": 3,
        "output_token_ids": [5, 7],
        "eos_token_id": 2,
        "params": {"max_tokens": 16, "min_tokens": 3, "stop_token_ids": [7]},
        "max_model_len": 64,
    },
    {  # EOS on the last allowed token: EOS is checked before the length limits
        "prompt_len": 3,
        "output_token_ids": [5, 2],
        "eos_token_id": 2,
        "params": {"max_tokens": 2, "min_tokens": 2},
        "max_model_len": 64,
    },
    {  # a stop token id that fills max_model_len: stopped, not length-capped
        "prompt_len": 3,
        "output_token_ids": [5, 7],
        "eos_token_id": 2,
        "params": {"max_tokens": 16, "stop_token_ids": [7]},
        "max_model_len": 5,
    },
    {  # ignore_eos ignores EOS, not the stop token ids (even when EOS is one of them)
        "prompt_len": 3,
        "output_token_ids": [2],
        "eos_token_id": 2,
        "params": {"max_tokens": 16, "ignore_eos": True, "stop_token_ids": [2]},
        "max_model_len": 64,
    },
    {
        "prompt_len": 3,
        "output_token_ids": [5],
        "eos_token_id": 2,
        "params": {"max_tokens": 16},
        "max_model_len": 64,
    },
]


def make_request(case: dict[str, Any]) -> Request:
    """The request as the engine builds it: the input processor hands the EOS id to both the request and its
    params (`SamplingParams.update_from_eos`: the params' EOS id stays None under ignore_eos, as vLLM's)."""
    params = SamplingParams(**case["params"])
    params.update_from_eos(case["eos_token_id"])
    request = Request(
        "req",
        list(range(10, 10 + case["prompt_len"])),
        params,
        eos_token_id=case["eos_token_id"],
        arrival_time=0.0,
    )
    request.status = RequestStatus.RUNNING
    request.append_output_token_ids(list(case["output_token_ids"]))
    return request


@graded
def check_check_stop(check_stop: Callable, seeds: Iterable[int] = range(60)) -> None:
    cases = [*FIXED_REQUESTS, *(_request_case(random.Random(seed)) for seed in seeds)]
    for case in cases:
        expected_request = make_request(case)
        expected = sched_utils.check_stop(expected_request, case["max_model_len"])
        request = make_request(case)
        inputs = {
            "prompt_token_ids": request.prompt_token_ids,
            "output_token_ids": request.output_token_ids,
            "eos_token_id": case["eos_token_id"],
            "sampling_params": case["params"],
            "max_model_len": case["max_model_len"],
        }
        with calling("check_stop", inputs):
            got = check_stop(request, case["max_model_len"])
        hint = (
            "vLLM's order: the EOS token (request.sampling_params.eos_token_id, None under ignore_eos) -> "
            "FINISHED_STOPPED, no stop_reason; a stop_token_ids token (even under ignore_eos) -> FINISHED_STOPPED "
            "with stop_reason = that id; only then num_tokens >= max_model_len or num_output_tokens >= max_tokens "
            "(None: no limit) -> FINISHED_LENGTH_CAPPED. min_tokens plays no part here: the "
            "MinTokensLogitsProcessor keeps EOS and stop ids from being sampled"
        )
        expect_equal("check_stop return value", inputs, expected, got, hint)
        expect_equal(
            "check_stop: request.status afterwards",
            inputs,
            expected_request.status.name,
            request.status.name,
            hint,
        )
        expect_equal(
            "check_stop: request.stop_reason afterwards",
            inputs,
            expected_request.stop_reason,
            request.stop_reason,
            hint,
        )
    passed("check_check_stop", len(cases))


# ---------------------------------------------------------------------------------------- the loop
@functools.lru_cache(maxsize=1)
def _engine() -> Any:
    """A small engine on the shipped model (built once per process: loading takes a few seconds).

    The reference and the candidate `step` run the same workload on it one after the other (greedy
    decoding: the same tokens whatever block ids the pool hands out).
    """
    from mini.entrypoints.llm import LLM

    return LLM(
        block_size=4, num_gpu_blocks_override=24, max_model_len=64, max_num_seqs=3, max_num_batched_tokens=16
    ).llm_engine


def _loop_workload(seed: int) -> list[dict[str, Any]]:
    """Requests to add at given steps; one case is one short run (some with an abort)."""
    rng = random.Random(seed)
    kinds = [RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY]
    prompts = ["The cat", "Once upon a time", "世界 🙂", "Hello", "a b c d e f g h i j"]
    workload = []
    for index in range(rng.randint(1, 4)):
        params: dict[str, Any] = {
            "temperature": 0.0,
            "max_tokens": rng.randint(1, 4),
            "output_kind": rng.choice(kinds),
        }
        if rng.random() < 0.3:
            params["stop"] = [rng.choice([" the", "\n", "#", "t"])]
        if rng.random() < 0.3:
            params["stop_token_ids"] = [rng.choice([289, 199, 3])]
        workload.append(
            {
                "request_id": f"r{index}",
                "prompt": rng.choice(prompts),
                "at_step": rng.randint(0, 3),
                "params": params,
            }
        )
    if rng.random() < 0.3:
        workload.append({"abort": f"r{rng.randrange(len(workload))}", "at_step": rng.randint(1, 3)})
    return workload


def _summary(outputs: Any) -> list[tuple]:
    return [
        (
            o.request_id,
            [(c.index, c.text, list(c.token_ids), c.finish_reason, c.stop_reason) for c in o.outputs],
            o.finished,
        )
        for o in outputs
    ]


def _reset(engine: Any) -> None:
    """Abort whatever a previous (maybe failed) run left behind, so each workload starts clean."""
    leftover = list(engine.scheduler.requests) + list(engine.output_processor.request_states)
    if leftover:
        engine.abort_request(sorted(set(leftover)))
    engine._pending_outputs = []


class _CountForwardPasses:
    """`with _CountForwardPasses(engine) as passes:` counts the model runner's forward passes (`passes.count`)."""

    def __init__(self, engine: Any) -> None:
        self.runner = engine.model_runner
        self.count = 0

    def __enter__(self) -> _CountForwardPasses:  # noqa: PYI034 - a plain class, never subclassed
        execute_model = self.runner.execute_model

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return execute_model(*args, **kwargs)

        self.runner.execute_model = counted
        return self

    def __exit__(self, *exc_info: object) -> None:
        del self.runner.execute_model


def _run(engine: Any, step: Callable[[], Any], workload: list[dict[str, Any]], max_steps: int = 20) -> list:
    _reset(engine)
    log = []
    for step_index in range(max_steps):
        for item in workload:
            if item["at_step"] != step_index:
                continue
            if "abort" in item:
                engine.abort_request(item["abort"])
            else:
                engine.add_request(item["request_id"], item["prompt"], SamplingParams(**item["params"]))
        pending = any(item["at_step"] > step_index for item in workload)
        if not engine.has_unfinished_requests() and not pending:
            break
        log.append(_summary(step()))
    return log


def _step_hint(want: Any, have: Any, earlier: list) -> str:
    """What a step's outputs say about the bug, from the reference's and the candidate's outputs of that step."""
    if not isinstance(want, list):
        return ("your engine still had requests to run after the reference's run had ended: a request that a stop "
                "string ended must be finished in the scheduler in the same iteration (finish_requests(..., "
                "FINISHED_STOPPED)), since the scheduler never sees text and keeps it running")
    if not isinstance(have, list):
        return ("your run ended before the reference's: every request the scheduler still holds needs more "
                "iterations, and outputs left pending by abort_request are returned by the next one")
    reported = [o for step in earlier for o in step if o[2]]
    if sorted(want, key=repr) == sorted(have, key=repr):
        return "the outputs left pending by abort_request come first, then this iteration's new ones"
    if any(o in reported for o in have if o not in want):
        return ("an output left pending by abort_request is returned by one iteration, then gone: take them out "
                "of self._pending_outputs when you return them")
    aborted = [o for o in want if o[1] and o[1][0][3] == "abort"]
    if any(o not in have for o in aborted):
        return ("abort_request leaves the aborted request's final output in self._pending_outputs: the next "
                "iteration returns it, before its new outputs")
    return ("an iteration reports one RequestOutput per request that progressed in it: the output processor turns "
            "the scheduler's token-level outputs of this step's forward pass into them")


@graded
def check_step(step: Callable, seeds: Iterable[int] = range(2)) -> None:
    """Run the same workloads through LLMEngine.step and through `step(engine)`; compare each step."""
    engine = _engine()
    workloads = [
        # the worked example: streamed (DELTA) requests, stop strings, an abort
        [
            {
                "request_id": "r0",
                "prompt": "Once upon a time",
                "at_step": 0,
                "params": {"temperature": 0.0, "max_tokens": 6, "output_kind": RequestOutputKind.DELTA},
            },
            {
                "request_id": "r1",
                "prompt": "The cat",
                "at_step": 1,
                "params": {"temperature": 0.0, "max_tokens": 6, "stop": [" t", "e", "\n"]},
            },
            {
                "request_id": "r2",
                "prompt": "Hello",
                "at_step": 0,
                "params": {"temperature": 0.0, "max_tokens": 6, "output_kind": RequestOutputKind.DELTA},
            },
            {"abort": "r2", "at_step": 2},
        ],
        # the only request is aborted: the next iteration has its final output to return, and nothing to run
        [
            {
                "request_id": "r0",
                "prompt": "The cat",
                "at_step": 0,
                "params": {"temperature": 0.0, "max_tokens": 8, "output_kind": RequestOutputKind.DELTA},
            },
            {"abort": "r0", "at_step": 2},
        ],
        *(_loop_workload(seed) for seed in seeds),
    ]
    for workload in workloads:
        inputs = {"workload": workload}
        with _CountForwardPasses(engine) as reference_passes:
            expected = _run(engine, engine.step, workload)
        expected_state = (
            engine.scheduler.get_num_unfinished_requests(),
            engine.kv_cache_manager.block_pool.get_num_free_blocks(),
        )
        with calling("step", inputs, expected=expected), _CountForwardPasses(engine) as passes:
            got = _run(engine, types.MethodType(step, engine), workload)
        for index in range(max(len(expected), len(got))):
            want = expected[index] if index < len(expected) else "(no step: the run had ended)"
            have = got[index] if index < len(got) else "(no step: your run ended early)"
            expect_equal(
                f"step {index}: outputs (request_id, [(index, text, token_ids, finish_reason, "
                "stop_reason)], finished)",
                inputs,
                want,
                have,
                _step_hint(want, have, expected[:index]),
            )
        hint = ("after the output processor names the requests a stop string ended, finish them in the scheduler "
                "(finish_requests(..., FINISHED_STOPPED)): it never sees text and would keep them running")
        expect_equal(
            "after the run: unfinished requests in the scheduler",
            inputs,
            expected_state[0],
            engine.scheduler.get_num_unfinished_requests(),
            hint,
        )
        expect_equal(
            "after the run: free KV blocks",
            inputs,
            expected_state[1],
            engine.kv_cache_manager.block_pool.get_num_free_blocks(),
            "a request stopped by a stop string must be finished in the scheduler too, or its "
            "blocks are never freed",
        )
        expect_equal(
            "the run's forward passes (model_runner.execute_model calls)",
            inputs,
            reference_passes.count,
            passes.count,
            "an iteration with nothing left in the scheduler (only outputs left pending by abort_request) "
            "returns those outputs and runs no forward pass" if passes.count > reference_passes.count else
            "each iteration with requests in the scheduler runs exactly one forward pass",
        )
    passed("check_step", len(workloads))


# ------------------------------------------------------------------------------- parallel sampling (n > 1)
def _core_request(request_id: str, params: SamplingParams) -> Any:
    from mini.engine import EngineCoreRequest

    return EngineCoreRequest(request_id=request_id, prompt="The cat", prompt_token_ids=[10, 11, 12],
                             sampling_params=params, eos_token_id=2, arrival_time=0.0)


def _params_fields(params: SamplingParams) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}


def _first_difference(expected: dict[str, Any], got: dict[str, Any]) -> str | None:
    return next((name for name, value in expected.items() if name not in got or got[name] != value), None)


def _completion(index: int, text: str, finish_reason: str | None) -> Any:
    from mini.outputs import CompletionOutput

    token_ids = [100 + ord(c) % 50 for c in text]
    return CompletionOutput(index=index, text=text, token_ids=token_ids, cumulative_logprob=None, logprobs=None,
                            finish_reason=finish_reason)


def _shown(outputs: Any) -> Any:
    """A CompletionOutput list as (index, text, finish_reason) tuples (what the check compares)."""
    if not isinstance(outputs, (list, tuple)):
        return outputs
    return [(o.index, o.text, list(o.token_ids), o.finish_reason) if hasattr(o, "index") else o for o in outputs]


_KINDS = (RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY)
_GATHER_HINTS = {
    RequestOutputKind.FINAL_ONLY: "FINAL_ONLY: show nothing until the LAST child finishes, then all n outputs in "
                                  "index order (keep each child's latest output by its index)",
    RequestOutputKind.DELTA: "DELTA: show just the output that arrived, except from a child that had already "
                             "finished and been reported (then nothing)",
    RequestOutputKind.CUMULATIVE: "CUMULATIVE: like DELTA, just the output that arrived (it already holds that "
                                  "child's whole text so far), except from a child that had already finished and "
                                  "been reported (then nothing); the other children are not repeated",
}


def _parallel_case(seed: int | None) -> dict[str, Any]:
    """One parent request and the children's outputs in the order the output processor hands them over."""
    if seed is None:  # the worked example
        return {"n": 3, "seed": 7, "output_kind": RequestOutputKind.FINAL_ONLY,
                "events": [(0, "Hi", None), (2, "Ok", None), (2, "Ok!", "stop"), (1, "Yo", None),
                           (0, "Hi there", "length"), (1, "Yo yo", "stop")]}
    rng = random.Random(seed)
    n = rng.randint(2, 4)
    kind = _KINDS[seed % 3]
    alive = {index: "" for index in range(n)}
    events = []
    while alive:
        index = rng.choice(sorted(alive))
        alive[index] += rng.choice("abc")
        finished = rng.random() < 0.35
        events.append((index, alive[index], rng.choice(["stop", "length"]) if finished else None))
        if finished:
            done = alive.pop(index)
            if rng.random() < 0.25:  # reported again after it finished (an abort that raced the finish)
                events.append((index, done, "abort"))
    return {"n": n, "seed": rng.choice([None, rng.randint(0, 1000)]), "output_kind": kind, "events": events,
            "temperature": rng.choice([0.5, 1.0]), "max_tokens": rng.randint(1, 9)}


@graded
def check_parent_request(ParentRequest: Callable, seeds: Iterable[int] = range(24),
                         output_kinds: Iterable[RequestOutputKind] = _KINDS) -> None:
    """Fan a parent out into its n children, then feed the children's outputs back, call by call."""
    from mini.engine import parallel_sampling as ps

    kinds = set(output_kinds)
    cases = [case for case in (_parallel_case(None), *(_parallel_case(s) for s in seeds))
             if case["output_kind"] in kinds]
    num_calls = 0
    for case in cases:
        params = SamplingParams(n=case["n"], seed=case["seed"], output_kind=case["output_kind"],
                                temperature=case.get("temperature", 0.8), max_tokens=case.get("max_tokens", 8))
        parent_params = _params_fields(params)
        request_id = f"p{num_calls % 7}"
        inputs: dict[str, Any] = {"request_id": request_id, "n": case["n"], "seed": case["seed"],
                                  "output_kind": case["output_kind"].name}
        expected_parent = ps.ParentRequest(_core_request(request_id, params.clone()))
        with calling("ParentRequest(request)", inputs):
            parent = ParentRequest(_core_request(request_id, params))
        _expect_n(parent, case["n"], inputs, "right after ParentRequest(request)")
        # --- fan-out: one child per index
        for index in range(case["n"]):
            expected_id, expected_params = expected_parent.get_child_info(index)
            with calling(f"get_child_info({index})", inputs, expected=expected_id):
                got = parent.get_child_info(index)
            expect_equal(f"get_child_info({index}) must return (child_request_id, child_params)", inputs,
                         "a tuple of 2", f"{type(got).__name__} {got!r}"[:200] if not (
                             isinstance(got, tuple) and len(got) == 2) else "a tuple of 2",
                         "return the child's request id and its own SamplingParams")
            child_id, child_params = got
            expect_equal(f"the parent's own SamplingParams after get_child_info({index})", inputs, parent_params,
                         _params_fields(parent.sampling_params) if hasattr(parent, "sampling_params") else None,
                         "change a COPY for each child: the parent keeps n and seed (its params are the user's)")
            expect_equal(f"child {index}: its request id", inputs, expected_id, child_id,
                         "a child's id is derived from its index and the parent's id, as vLLM's "
                         "ParentRequest.get_child_info spells it: f\"{index}_{parent_id}\"")
            expect_equal(f"child {index}: its params must be a SamplingParams", inputs, "SamplingParams",
                         type(child_params).__name__, "copy the parent's SamplingParams (clone())")
            want, have = _params_fields(expected_params), _params_fields(child_params)
            field_name = _first_difference(want, have)
            if field_name is not None:
                expect_equal(f"child {index} (id {expected_id!r}): its SamplingParams.{field_name}", inputs,
                             want[field_name], have[field_name],
                             "each child samples ONE sequence (n=1) and, when the parent is seeded, with its own "
                             "seed: the parent's seed + the child's index (None stays None); every other field is "
                             "the parent's")
        expect_equal("child_requests after the fan-out (the children not finished yet)", inputs,
                     sorted(expected_parent.child_requests), sorted(getattr(parent, "child_requests", ()) or ()),
                     "get_child_info registers each child id in `child_requests`")
        # --- the gather: the children's outputs, one call at a time
        history: list[str] = []
        for call, (index, text, finish_reason) in enumerate(case["events"]):
            child_id = ps.child_request_id(index, request_id)
            expected = expected_parent.get_outputs(child_id, _completion(index, text, finish_reason))
            expected = (_shown(expected[0]), expected[1])
            what = (f"get_outputs call {call}: child {child_id!r} (index {index}) reports "
                    f"{text!r}, finish_reason={finish_reason!r}")
            call_inputs = {**inputs, "calls so far": history or "(none)"}
            with calling("get_outputs", call_inputs, expected=expected):
                got = parent.get_outputs(child_id, _completion(index, text, finish_reason))
            got = (_shown(got[0]), got[1]) if isinstance(got, tuple) and len(got) == 2 else got
            hint = _GATHER_HINTS[case["output_kind"]]
            if isinstance(got, tuple) and expected[0] == got[0] and expected[1] != got[1]:
                hint = ("the parent is finished when its LAST child has finished (no child left in "
                        "child_requests), and not before")
            elif finish_reason == "abort" and index not in [i for i, _, r in case["events"][call + 1:] if r]:
                hint += "; this child had already finished: it is no longer in child_requests"
            expect_equal(f"{what} -> (outputs to show now as (index, text, token_ids, finish_reason), "
                         "parent finished?)", call_inputs, expected, got, hint)
            history.append(f"{child_id} {text!r} {finish_reason}")
            num_calls += 1
        _expect_n(parent, case["n"], inputs, "after every child reported")
    passed("check_parent_request", num_calls)


def _expect_n(parent: Any, n: int, inputs: dict[str, Any], when: str) -> None:
    with calling("ParentRequest.n", inputs, expected=n):
        got = parent.n
    expect_equal(f"ParentRequest.n {when}", inputs, n, got,
                 "n is how many samples the parent asks for (its sampling_params.n), whatever its children do: "
                 "the engine fans out that many children")


# ---------------------------------------------------------------------------------------- beam search
def _logprob(value: float) -> Any:
    from mini.outputs import Logprob

    return Logprob(logprob=value)


def _beam(tokens: list[int], generated: int, cum_logprob: float) -> Any:
    from mini.beam_search import BeamSearchSequence

    past = [{token: _logprob(-1.0)} for token in tokens[len(tokens) - generated:]]
    return BeamSearchSequence(orig_prompt={"prompt_token_ids": tokens[:len(tokens) - generated]},
                              tokens=list(tokens), logprobs=past, cum_logprob=cum_logprob)


# The worked example: vocabulary {0: "a", 1: "b", 2: EOS}, beam_width 2, step 2 of the search from the prompt
# [5]: the live beams are [5, a] (-0.5) and [5, b] (-1.0); [5, EOS] (-2.0) completed at step 1.
WORKED_BEAMS = {"beams": [([5, 0], 1, -0.5), ([5, 1], 1, -1.0)], "completed": [([5, 2], 1, -2.0)],
                "beam_logprobs": [{1: -0.75, 2: -1.0, 0: -1.5}, {0: -0.25, 2: -0.5, 1: -2.0}],
                "beam_width": 2, "length_penalty": 1.0, "eos_token_id": 2}


def _beam_case(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    vocab = rng.randint(3, 6)
    beam_width = rng.randint(1, 3)
    prompt = [10 + t for t in range(rng.randint(1, 3))]
    realistic = rng.random() < 0.6     # every live beam as long as the others (a real step)
    generated = rng.randint(0, 3)
    beams = []
    for _ in range(rng.randint(1, beam_width)):
        length = generated if realistic else rng.randint(0, 4)
        tokens = prompt + [rng.randrange(3, vocab + 3) for _ in range(length)]
        beams.append((tokens, length, -0.25 * rng.randint(0, 4 * length + 1) if length else 0.0))
    quarter = [-0.25 * k for k in range(1, 9)]   # exact in binary: equal sums are exact ties
    tables = []
    for _ in beams:
        if rng.random() < 0.1:
            tables.append(None)  # nothing came back for this beam
            continue
        ids = rng.sample(range(vocab), min(vocab, 2 * beam_width))
        values = sorted((rng.choice(quarter) for _ in ids), reverse=True)
        table = dict(zip(ids, values, strict=False))
        if rng.random() < 0.3:  # a sampled token outside the top 2 * beam_width comes first in the dict
            extra = rng.randrange(vocab, vocab + 3)
            table = {extra: -3.0, **table}
        tables.append(table)
    completed = [(prompt + [0], 1, -1.5)] if rng.random() < 0.3 else []
    return {"beams": beams, "completed": completed, "beam_logprobs": tables, "beam_width": beam_width,
            "length_penalty": rng.choice([0.0, 0.5, 1.0, 2.0]), "eos_token_id": rng.choice([0, 1, None])}


def _build_instance(case: dict[str, Any]) -> tuple[Any, list[Any]]:
    from mini.beam_search import BeamSearchInstance

    instance = BeamSearchInstance({"prompt_token_ids": [5]}, [5])
    instance.beams = [_beam(*beam) for beam in case["beams"]]
    instance.completed = [_beam(*beam) for beam in case["completed"]]
    tables = [None if t is None else {tok: _logprob(v) for tok, v in t.items()} for t in case["beam_logprobs"]]
    return instance, tables


def _beam_row(beam: Any, length_penalty: float) -> str:
    from mini.beam_search import get_beam_search_score

    try:
        score = get_beam_search_score(len(beam.logprobs), beam.cum_logprob, length_penalty)
        return (f"tokens={list(beam.tokens)} cum_logprob={beam.cum_logprob:g} generated={len(beam.logprobs)} "
                f"score={score:.4g}")
    except Exception:  # noqa: BLE001 - a learner's object of the wrong shape
        return repr(beam)[:200]


@graded
def check_beam_search_step(beam_search_step: Callable, seeds: Iterable[int] = range(60)) -> None:
    """One step on fixed and seeded random logprob tables (quarter values, so ties are common)."""
    from mini import beam_search as reference_beam

    cases = [WORKED_BEAMS, *(_beam_case(seed) for seed in seeds)]
    for case in cases:
        lp = case["length_penalty"]
        inputs = {
            "instance.beams (tokens, generated, cum_logprob)": case["beams"],
            "instance.completed": case["completed"],
            "beam_logprobs ((token, logprob) pairs, in the engine's order)": [
                None if t is None else list(t.items()) for t in case["beam_logprobs"]],
            "beam_width": case["beam_width"], "length_penalty": lp, "eos_token_id": case["eos_token_id"],
        }
        expected_instance, tables = _build_instance(case)
        reference_beam.beam_search_step(expected_instance, tables, case["beam_width"], lp, case["eos_token_id"])
        expected = {name: [_beam_row(b, lp) for b in getattr(expected_instance, name)]
                    for name in ("beams", "completed")}
        instance, tables = _build_instance(case)
        with calling("beam_search_step", inputs, expected=expected):
            beam_search_step(instance, tables, case["beam_width"], lp, case["eos_token_id"])
        for name in ("beams", "completed"):
            want = expected[name]
            have = [_beam_row(b, lp) for b in getattr(instance, name)]
            if want == have:
                continue
            position = next((k for k, (w, h) in enumerate(zip(want, have, strict=False)) if w != h),
                            min(len(want), len(have)))
            hint = ("every (live beam, token of its logprobs dict) pair is a candidate, with cum_logprob + that "
                    "logprob; rank by score = cum_logprob / max(generated, 1) ** length_penalty (generated: the "
                    "beam's generated tokens, a final EOS included, NOT the prompt) and keep the best "
                    "beam_width")
            if name == "completed":
                hint = ("every (live beam, token of its logprobs dict) pair is a candidate; one that ends in "
                        "eos_token_id is appended to instance.completed (after the ones already there, in "
                        "candidate order) and never stays live; eos_token_id=None: nothing completes")
            elif position < min(len(want), len(have)):
                got_beam = getattr(instance, name)[position]
                if sorted(want) == sorted(have) and \
                        want[position].split("score=")[-1] == have[position].split("score=")[-1]:
                    hint = ("ties: on equal scores the candidate that came first (earlier live beam, then the "
                            "dict's order) stays first, as a stable sort by score, best first, keeps them")
                elif case["eos_token_id"] is not None and list(got_beam.tokens)[-1:] == [case["eos_token_id"]]:
                    hint = "a candidate ending in EOS completes; it never stays live"
            elif len(have) > len(want):
                hint = ("keep at most beam_width live beams, EOS candidates excluded"
                        if len(want) == case["beam_width"]
                        else "an EOS candidate leaves the live beams; a beam with no logprobs (None) has no "
                             "candidates")
            shown = slice(max(0, position - 1), position + 2)
            expect_equal(f"beam_search_step: instance.{name}[{position}] is the first wrong beam ({len(want)} "
                         f"expected, {len(have)} got; shown from index {shown.start})", inputs,
                         want[shown], have[shown], hint)
        for position, beam in enumerate(instance.beams + instance.completed):
            step_table = expected_instance.beams + expected_instance.completed
            expect_equal(f"beam_search_step: the logprobs list of new beam {position} ({list(beam.tokens)})",
                         inputs, len(step_table[position].logprobs), len(beam.logprobs),
                         "a new beam's logprobs is its parent's list + the whole dict of this step "
                         "(one entry per generated token: the score counts them); never change the parent's")
            expect_equal(f"beam_search_step: new beam {position} ({list(beam.tokens)}): its last logprobs entry",
                         inputs, sorted(step_table[position].logprobs[-1]), sorted(beam.logprobs[-1]),
                         "append the WHOLE logprobs dict the engine returned for the parent beam, as vLLM does")
    passed("check_beam_search_step", len(cases))


# Built once in the grading process before it forks a child per check (labs/checks/grading.py).
WARM_UP = (shipped_tokenizer, llama_style_tokenizer, import_engine_stack)


PHASE = Phase("06_engine_loop", (
    Exercise("detokenize_incrementally", check_detokenize_incrementally, points=3, grade_id="test-detokenize",
             part="detokenize_incrementally"),
    Exercise("check_stop_strings", check_check_stop_strings, points=3, grade_id="test-stop-strings",
             handle_name="stop_strings",
             part="check_stop_strings"),
    Exercise("check_stop", check_check_stop, points=2, grade_id="test-check-stop", part="check_stop"),
    Exercise("step", check_step, points=2, grade_id="test-step",
             design="the order of one engine iteration (schedule, forward, update, detokenize, finish what a stop "
                    "string ended), derived from what each piece needs and from the invariants"),
    Exercise("ParentRequest", check_parent_request, points=3, grade_id="test-parent-request"),
    Exercise("beam_search_step", check_beam_search_step, points=4, grade_id="test-beam-search-step"),
))
