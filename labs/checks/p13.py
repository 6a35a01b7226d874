"""Checks for phase 13 (serving), against mini's engine/async_llm, entrypoints/openai and engine/startup.

    check_merge_delta_outputs(merge_delta_outputs)            vs mini.engine.async_llm.merge_delta_outputs
    check_completion_stream_choices(completion_stream_choices)
                                      vs mini.entrypoints.openai.serving_completion.completion_stream_choices
    check_num_blocks_for_budget(num_blocks_for_budget)        vs mini.engine.startup.num_blocks_for_budget

vLLM counterparts: `num_blocks_for_budget` is the block count in `get_kv_cache_config_from_groups`
(vllm/v1/core/kv_cache_planning.py), which passes this check (tests/test_course_vllm_answers_p13.py).
`merge_delta_outputs` mirrors the merge inside `RequestOutputCollector.put` (vllm/v1/engine/output_processor.py,
which calls `RequestOutput.add` of vllm/outputs.py on vLLM's own output types, so it is not run here) and
`completion_stream_choices` the choice building inline in `OpenAIServingCompletion.completion_stream_generator`
(vllm/entrypoints/openai/completion/serving.py): neither is a function of its own in vLLM.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable
from typing import Any

from labs.checks.common import calling, expect_equal, passed
from labs.manifest import Exercise, Phase
from mini.engine.async_llm import merge_delta_outputs as reference_merge
from mini.engine.startup import num_blocks_for_budget as reference_num_blocks
from mini.outputs import CompletionOutput, Logprob, RequestOutput

WORDS = ["the", " cat", " sat", ",", " on", " a", " mat", ".", "\n", " dog"]


def _delta(rng: random.Random, indices: list[int], finished: bool, with_logprobs: bool) -> RequestOutput:
    outputs = []
    for index in indices:
        num_tokens = rng.randint(0, 3)
        token_ids = [rng.randrange(100) for _ in range(num_tokens)]
        logprobs = ([{t: Logprob(-rng.random(), 1, None)} for t in token_ids] if with_logprobs else None)
        reason = rng.choice(["stop", "length", "abort"]) if finished else None
        outputs.append(CompletionOutput(index, "".join(rng.choice(WORDS) for _ in token_ids), token_ids,
                                        -rng.random() if with_logprobs else None, logprobs, reason,
                                        "." if reason == "stop" else None))
    return RequestOutput("req-0", "prompt", [1, 2, 3], None, outputs, finished)


def _summary(output: RequestOutput) -> dict[str, Any]:
    return {"finished": output.finished, "request_id": output.request_id, "outputs": [
        {"index": c.index, "text": c.text, "token_ids": list(c.token_ids), "finish_reason": c.finish_reason,
         "stop_reason": c.stop_reason,
         "logprobs": None if c.logprobs is None else [{t: lp.logprob for t, lp in d.items()} for d in c.logprobs]}
        for c in output.outputs]}


# ---------------------------------------------------------------- merge_delta_outputs
MERGE_HINT = ("per sample index: texts and token ids (and logprobs) appended, finish_reason, stop_reason and "
              "cumulative_logprob from the new output; a sample only in one of them is kept (in any order)")


def _by_index(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with its outputs in index order: the order of `outputs` is not graded (vLLM appends)."""
    return {**summary, "outputs": sorted(summary["outputs"], key=lambda c: c["index"])}


def check_merge_delta_outputs(candidate: Callable, seeds: Iterable[int] = range(30)) -> None:
    num_cases = 0
    for seed in seeds:
        rng = random.Random(seed)
        n = rng.choice([1, 1, 2, 3])
        with_logprobs = rng.random() < 0.4
        pending = _delta(rng, sorted(rng.sample(range(n), rng.randint(1, n))), False, with_logprobs)
        for _ in range(rng.randint(1, 4)):   # a slow reader: several deltas fold into the unread one
            new = _delta(rng, sorted(rng.sample(range(n), rng.randint(1, n))), rng.random() < 0.3, with_logprobs)
            if rng.random() < 0.3:           # a sample new to the collector arrives first in the list
                new = dataclasses.replace(new, outputs=list(reversed(new.outputs)))
            inputs = {"pending": _summary(pending), "new": _summary(new)}
            expected = reference_merge(pending, new)
            with calling("merge_delta_outputs", inputs):
                got = candidate(pending, new)
            expect_equal("merge_delta_outputs(pending, new)", inputs, _by_index(_summary(expected)),
                         _by_index(_summary(got)), MERGE_HINT)
            expect_equal("pending and new after the call", inputs, inputs, {"pending": _summary(pending),
                         "new": _summary(new)}, "build a new output (dataclasses.replace): do not change pending's "
                         "or new's texts, token lists or logprobs in place")
            pending = expected
            num_cases += 1
            if new.finished:                 # the request's last output: nothing follows it
                break
    passed("check_merge_delta_outputs", num_cases)


# ---------------------------------------------------------------- completion_stream_choices
def check_completion_stream_choices(candidate: Callable, seeds: Iterable[int] = range(30)) -> None:
    from mini.entrypoints.openai.serving_completion import completion_stream_choices as reference

    num_cases = 0
    for seed in seeds:
        rng = random.Random(seed)
        n = rng.choice([1, 2, 3])
        output = _delta(rng, sorted(rng.sample(range(n), rng.randint(1, n))), rng.random() < 0.3, False)
        if seed == 0:   # an empty delta of an unfinished sample sends nothing
            output = RequestOutput("req-0", "p", [1], None, [CompletionOutput(0, "", [], None, None)], False)
        prompt_index = rng.randint(0, 2)
        inputs = {"output": _summary(output), "prompt_index": prompt_index, "n": n}
        expected = [c.model_dump() for c in reference(output, prompt_index, n)]
        with calling("completion_stream_choices", inputs):
            got = [c.model_dump() for c in candidate(output, prompt_index, n)]
        expect_equal("completion_stream_choices(output, prompt_index, n)", inputs, expected, got,
                     "choice index = prompt_index * n + sample index; skip a sample with no text, no tokens and "
                     "no finish_reason; copy text, finish_reason and stop_reason")
        num_cases += 1
    passed("check_completion_stream_choices", num_cases)


# ---------------------------------------------------------------- num_blocks_for_budget
BLOCKS_HINT = ("whole blocks the budget buys, rounded down (a partial block buys nothing), as an int; the null "
               "block 0 is one of them (vLLM: num_blocks = available_memory // bytes_per_block, and the block pool "
               "takes block 0 from that count), so nothing is added or taken away for it")


def _blocks_hint(budget: int, per_block: int, expected: int, got: Any) -> str:
    """Name the likely slip (the null block on top, or taken away; rounding up), then the rule."""
    if got == expected + 1 and budget % per_block == 0:
        return "one block too many: do not add the null block on top, it is one of the blocks bought. " + BLOCKS_HINT
    if got == expected + 1:
        return ("one block too many: either the null block was added on top or a partial block was rounded up. "
                + BLOCKS_HINT)
    if got == expected - 1:
        return "one block too few: do not subtract the null block, the count already holds it. " + BLOCKS_HINT
    return BLOCKS_HINT


def check_num_blocks_for_budget(candidate: Callable, seeds: Iterable[int] = range(30)) -> None:
    cases = [(10 * 4096, 4096), (10 * 4096 + 4095, 4096), (4095, 4096), (0, 100), (4096, 4096),
             (512 * 2**20, 49152), (3 * 2**20, 49152)]
    for seed in seeds:
        rng = random.Random(seed)
        per_block = rng.choice([64, 1000, 4096, 49152])
        cases.append((rng.randint(0, 50 * per_block), per_block))
    for budget, per_block in cases:
        inputs = {"budget_bytes": budget, "bytes_per_block": per_block}
        expected = reference_num_blocks(budget, per_block)
        with calling("num_blocks_for_budget", inputs, expected=expected, hint=BLOCKS_HINT):
            got = candidate(budget, per_block)
        is_int = isinstance(got, int) and not isinstance(got, bool)
        expect_equal("num_blocks_for_budget(...) type", inputs, "int", type(got).__name__,
                     "a number of blocks is an int: use floor division (//), not /",
                     equal=lambda _a, _b, ok=is_int: ok)
        expect_equal("num_blocks_for_budget(...)", inputs, expected, got,
                     _blocks_hint(budget, per_block, expected, got))
    passed("check_num_blocks_for_budget", len(cases))


PHASE = Phase("13_serving", (
    Exercise("merge_delta_outputs", check_merge_delta_outputs, points=3, grade_id="test-merge-delta-outputs"),
    Exercise("completion_stream_choices", check_completion_stream_choices, points=2,
             grade_id="test-completion-stream-choices"),
    Exercise("num_blocks_for_budget", check_num_blocks_for_budget, points=2, grade_id="test-num-blocks-for-budget"),
))
