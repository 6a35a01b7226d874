"""Checks for phase 09 (penalties and logits processors), against mini.sample and mini.worker.input_batch.

    check_apply_all_penalties(apply_all_penalties)       vs mini.sample.ops.penalties.apply_all_penalties
    check_process_dict_updates(process_dict_updates)     vs mini.sample.logits_processor.builtin.process_dict_updates
    check_min_p_processor(MinPLogitsProcessor)           vs mini.sample.logits_processor.builtin.MinPLogitsProcessor
    check_logit_bias_processor(LogitBiasLogitsProcessor) vs mini.sample.logits_processor.builtin.LogitBiasLogitsProcessor
    check_min_tokens_processor(MinTokensLogitsProcessor) vs mini.sample.logits_processor.builtin.MinTokensLogitsProcessor
    check_condense(condense)                             vs mini.worker.input_batch.InputBatch.condense

The processors are checked under a fuzz of BatchUpdates built by the persistent batch's rules (new
requests fill the lowest holes, extra new ones append, extra removals are condensed by moving the
highest row into the lowest hole, then optional swaps), with output lists growing by reference.
"""

from __future__ import annotations

import random
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from labs.checks.common import CountTorchCalls, calling, expect_equal, passed
from labs.checks.grading import graded
from labs.checks.p08 import first_difference
from labs.manifest import Exercise, Phase
from mini.sample.logits_processor.builtin import LogitBiasLogitsProcessor as ReferenceLogitBias
from mini.sample.logits_processor.builtin import MinPLogitsProcessor as ReferenceMinP
from mini.sample.logits_processor.builtin import MinTokensLogitsProcessor as ReferenceMinTokens
from mini.sample.logits_processor.builtin import process_dict_updates as reference_process_dict_updates
from mini.sample.logits_processor.interface import BatchUpdate, LogitsProcessorConfig, MoveDirectionality
from mini.sample.ops.penalties import apply_all_penalties as reference_apply_all_penalties
from mini.sampling_params import SamplingParams
from mini.worker.input_batch import CachedRequestState, InputBatch

UNI, SWAP = MoveDirectionality.UNIDIRECTIONAL, MoveDirectionality.SWAP

# The phase's worked example: vocabulary of 6, prompt [0, 1], output so far [3, 3, 4].
WORKED_PENALTIES = {
    "logits": [[2.0, -1.0, 0.5, 3.0, -0.5, 1.0]],
    "prompt_token_ids": [[0, 1]],
    "output_token_ids": [[3, 3, 4]],
    "presence_penalties": [1.0],
    "frequency_penalties": [0.5],
    "repetition_penalties": [2.0],
}
WORKED_PENALIZED = [[1.0, -2.0, 0.5, -0.5, -2.5, 1.0]]


def _round(values: torch.Tensor) -> list:
    return [[round(float(x), 4) for x in row] for row in values]


def _expect_logits(what: str, inputs: dict, expected: torch.Tensor, got: Any, hint: str) -> None:
    __tracebackhide__ = True
    if not isinstance(got, torch.Tensor):
        raise AssertionError(  # noqa: TRY004 - a failed check, not a caller's type error
            f"{what}: expected a torch.Tensor, got {type(got).__name__}\n  inputs: {inputs}"
        )
    expect_equal(f"{what} shape", inputs, tuple(expected.shape), tuple(got.shape), hint)
    same_inf = torch.equal(torch.isinf(expected), torch.isinf(got)) and not bool(torch.isnan(got).any())
    finite = torch.isfinite(expected)
    same = same_inf and torch.allclose(expected[finite], got.to(expected.dtype)[finite], rtol=1e-5, atol=1e-5)
    if not same:
        close = torch.isclose(expected, got.to(expected.dtype), rtol=1e-5, atol=1e-5) | (expected == got)
        row, token = first_difference(torch.zeros_like(expected), (~close).to(expected.dtype)) or (0, 0)
        located = {**inputs, f"row {row} expected": _round(expected[row:row + 1])[0],
                   f"row {row} got": _round(got[row:row + 1])[0]}
        expect_equal(f"{what}: first wrong entry at row {row}, token {token}", located,
                     float(expected[row, token]), float(got[row, token]), hint)


# ---------------------------------------------------------------- penalties
def _padded(rows: list[list[int]], pad: int) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0) or 1
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.int64)


def _values(rng: random.Random, num_rows: int, neutral: float, low: float, high: float) -> list[float]:
    return [neutral if rng.random() < 0.3 else round(rng.uniform(low, high), 3) for _ in range(num_rows)]


def _penalty_args(case: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    logits = torch.tensor(case["logits"], dtype=torch.float32)
    vocab_size = logits.shape[1]
    return (
        logits,
        _padded(case["prompt_token_ids"], vocab_size),
        _padded(case["output_token_ids"], vocab_size),
        torch.tensor(case["presence_penalties"]),
        torch.tensor(case["frequency_penalties"]),
        torch.tensor(case["repetition_penalties"]),
    )


def _penalty_cases(seeds: Iterable[int]) -> list[dict[str, Any]]:
    cases = [
        dict(WORKED_PENALTIES),
        {**WORKED_PENALTIES, "repetition_penalties": [0.5]},  # < 1 encourages repeats
        {**WORKED_PENALTIES, "prompt_token_ids": [[]], "output_token_ids": [[]]},
    ]  # no history: untouched
    for seed in seeds:
        rng = random.Random(seed)
        num_rows, vocab_size = rng.randint(1, 6), rng.randint(4, 50)
        logits = [[round(rng.gauss(0, 2), 3) for _ in range(vocab_size)] for _ in range(num_rows)]
        if seed % 4 == 0:
            logits[0][rng.randrange(vocab_size)] = float("-inf")
        hot = rng.sample(range(vocab_size), min(vocab_size, 6))  # repeats are likely
        prompts = [[rng.choice(hot) for _ in range(rng.randint(0, 8))] for _ in range(num_rows)]
        outputs = [[rng.choice(hot) for _ in range(rng.randint(0, 10))] for _ in range(num_rows)]

        cases.append(
            {
                "logits": logits,
                "prompt_token_ids": prompts,
                "output_token_ids": outputs,
                "presence_penalties": _values(rng, num_rows, 0.0, -1.0, 2.0),
                "frequency_penalties": _values(rng, num_rows, 0.0, -1.0, 2.0),
                "repetition_penalties": _values(rng, num_rows, 1.0, 0.5, 2.0),
            }
        )
    return cases


def _count_penalty_calls(apply_all_penalties: Callable, num_rows: int) -> int:
    rng = torch.Generator().manual_seed(num_rows)
    vocab_size = 50
    args = (
        torch.randn(num_rows, vocab_size, generator=rng),
        torch.randint(0, vocab_size + 1, (num_rows, 6), generator=rng),
        torch.randint(0, vocab_size + 1, (num_rows, 5), generator=rng),
        torch.rand(num_rows, generator=rng),
        torch.rand(num_rows, generator=rng),
        torch.rand(num_rows, generator=rng) + 0.5,
    )
    with CountTorchCalls() as counter:
        apply_all_penalties(*args)
    return counter.count


@graded
def check_apply_all_penalties(apply_all_penalties: Callable, seeds: Iterable[int] = range(30)) -> None:
    cases = _penalty_cases(seeds)
    for case in cases:
        inputs = {**case, "(ids are padded with vocab_size)": len(case["logits"][0])}
        expected = reference_apply_all_penalties(*_penalty_args(case))
        with calling("apply_all_penalties", inputs, expected=expected):
            got = apply_all_penalties(*_penalty_args(case))
        _expect_logits(
            "apply_all_penalties",
            inputs,
            expected,
            got,
            "repetition r: a token in the prompt OR the output has its logit divided by r if > 0, "
            "multiplied by r otherwise; then subtract frequency * (count in the OUTPUT) and "
            "presence * (1 if in the OUTPUT); padding ids (== vocab_size) are not tokens",
        )
    with calling("apply_all_penalties", {"note": "16 and 128 rows of 50 logits, to count torch calls"}):
        few, many = _count_penalty_calls(apply_all_penalties, 16), _count_penalty_calls(apply_all_penalties, 128)
    expect_equal(
        "apply_all_penalties is vectorized",
        {"torch calls with 16 rows": few},
        f"<= {few + 8} calls with 128 rows",
        f"{many} calls with 128 rows",
        "no Python loop over rows: one scatter_add_ counts every row's tokens into a [N, V + 1] table, "
        "and torch.where / broadcasting apply each row's penalties at once",
        equal=lambda expected, got: many <= few + 8,
    )
    worked = [torch.tensor(WORKED_PENALTIES[name]) for name in WORKED_PENALTIES]
    with calling("apply_all_penalties", WORKED_PENALTIES):
        got = apply_all_penalties(*worked)
    _expect_logits(
        "apply_all_penalties (the worked example)",
        WORKED_PENALTIES,
        torch.tensor(WORKED_PENALIZED),
        got,
        "see the table of the worked example",
    )
    passed("check_apply_all_penalties", len(cases) + 2)


# ---------------------------------------------------------------- a BatchUpdate fuzz
@dataclass(slots=True)
class FakeRequest:
    """A request as the processors see it: params, prompt ids and the LIVE output list."""

    number: int
    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class FuzzStep:
    update: BatchUpdate | None
    rows: list[FakeRequest]  # the request in each row after the update


def _new_request(rng: random.Random, number: int, vocab_size: int) -> FakeRequest:
    min_tokens = rng.choice([0, 0, 1, 2, 3, 5])
    stop = rng.sample(range(vocab_size), rng.randint(0, 3))
    min_p = rng.choice([0.0, 0.0, 0.05, 0.2, 0.5, 1.0])
    logit_bias = ({token: round(rng.uniform(-4, 4), 2) for token in rng.sample(range(vocab_size), rng.randint(1, 3))}
                  if rng.random() < 0.5 else None)
    params = SamplingParams(min_tokens=min_tokens, stop_token_ids=stop, max_tokens=20, min_p=min_p,
                            logit_bias=logit_bias, temperature=1.0)
    outputs = [rng.randrange(vocab_size) for _ in range(rng.choice([0, 0, 0, 2]))]  # some resume with outputs
    return FakeRequest(
        number, params, [number] + [rng.randrange(vocab_size) for _ in range(rng.randint(0, 4))], outputs
    )


def batch_update_fuzz(
    seed: int, num_steps: int = 60, vocab_size: int = 12, max_rows: int = 8
) -> list[FuzzStep]:
    """Random steps of a persistent batch, with the BatchUpdate each one produces (None: no change)."""
    return list(iter_batch_update_fuzz(seed, num_steps, vocab_size, max_rows))


def iter_batch_update_fuzz(
    seed: int, num_steps: int = 60, vocab_size: int = 12, max_rows: int = 8
) -> Iterator[FuzzStep]:
    """The same steps, one at a time: each running request's output list grows by one token only AFTER
    its step is handed out, so a consumer sees the lengths of that step (min_tokens counts them)."""
    rng = random.Random(seed)
    rows: list[FakeRequest | None] = []
    counter = 0
    for _ in range(num_steps):
        removed: list[int] = []
        added, moved = [], []
        for row, request in enumerate(rows):
            if request is not None and rng.random() < 0.25:
                rows[row] = None
                removed.append(row)
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            if sum(r is not None for r in rows) >= max_rows:
                break
            counter += 1
            request = _new_request(rng, counter, vocab_size)
            hole = next((row for row, r in enumerate(rows) if r is None), None)
            if hole is None:
                hole = len(rows)
                rows.append(None)
            else:
                removed.remove(hole)  # refilled: reported as an add only
            rows[hole] = request
            added.append((hole, request.params, request.prompt_token_ids, request.output_token_ids))
        while rows and rows[-1] is None:
            rows.pop()
        while None in rows:
            hole, last = rows.index(None), len(rows) - 1
            rows[hole], rows[last] = rows[last], None
            moved.append((last, hole, UNI))
            while rows and rows[-1] is None:
                rows.pop()
        if len(rows) >= 2 and rng.random() < 0.3:
            a, b = rng.sample(range(len(rows)), 2)
            rows[a], rows[b] = rows[b], rows[a]
            moved.append((a, b, SWAP))
        update = (
            BatchUpdate(len(rows), sorted(removed), added, moved) if (removed or added or moved) else None
        )
        yield FuzzStep(update, list(rows))
        for request in rows:  # every running request generates one token
            request.output_token_ids.append(rng.randrange(vocab_size))


def _describe(update: BatchUpdate | None) -> str:
    if update is None:
        return "None (no change)"
    added = [
        (
            row,
            f"req(min_tokens={params.min_tokens}, stop={sorted(params.stop_token_ids)}, min_p={params.min_p}, "
            + f"logit_bias={params.logit_bias}, prompt={prompt}, output={output})",
        )
        for row, params, prompt, output in update.added
    ]
    moved = [(a, b, direction.name) for a, b, direction in update.moved]
    return f"BatchUpdate(batch_size={update.batch_size}, removed={list(update.removed)}, added={added}, moved={moved})"


@graded
def check_process_dict_updates(process_dict_updates: Callable, seeds: Iterable[int] = range(5)) -> None:
    def new_state(params, prompt_ids, output_ids):
        return (prompt_ids[0], params.min_tokens) if params.min_tokens > 0 else None

    num_cases = 0
    worked = [
        BatchUpdate(
            4, [], [(row, SamplingParams(min_tokens=row + 1), [100 + row], []) for row in range(4)], []
        ),
        BatchUpdate(3, [2], [(0, SamplingParams(min_tokens=9), [104], [])], [(3, 2, UNI)]),
        BatchUpdate(3, [], [], [(0, 2, SWAP)]),
        None,
        BatchUpdate(3, [], [(1, SamplingParams(), [105], [])], []),
    ]
    sequences = [worked] + [[step.update for step in batch_update_fuzz(seed)] for seed in seeds]
    for updates in sequences:
        expected_entries: dict[int, Any] = {}
        got_entries: dict[int, Any] = {}
        history: list[str] = []
        for update in updates:
            history.append(_describe(update))
            inputs = {
                "updates so far (the last one is this step's)": history[-3:],
                "entries before": dict(got_entries),
            }
            expected_changed = reference_process_dict_updates(expected_entries, update, new_state)
            with calling("process_dict_updates", inputs, expected=expected_changed):
                got_changed = process_dict_updates(got_entries, update, new_state)
            expect_equal(
                "process_dict_updates: the entries",
                inputs,
                expected_entries,
                got_entries,
                "removes, then adds (new_state(params, prompt, output); None drops a replaced row's "
                "entry), then moves in order: UNIDIRECTIONAL a->b moves a's entry to b (b's old entry is "
                "discarded), SWAP exchanges them",
            )
            expect_equal(
                "process_dict_updates: the returned 'changed'",
                inputs,
                expected_changed,
                got_changed,
                "return True exactly when the dict changed (False for None)",
            )
            num_cases += 1
    passed("check_process_dict_updates", num_cases)


def _run_processor_fuzz(processor_class: type, reference_class: type, *, argmax_invariant: bool,
                        invariance_hint: str, describe_row: Callable[[FakeRequest], str],
                        make_logits: Callable[[int, int, torch.Generator], torch.Tensor], hint: str,
                        seeds: Iterable[int]) -> int:
    """Drive the learner's processor and the reference through the same fuzz of BatchUpdates; after each
    update_state, both apply to the same logits. Returns the number of steps compared."""
    vocab_size = 12
    config = LogitsProcessorConfig(vocab_size=vocab_size)
    name = processor_class.__name__
    num_cases = 0
    for seed in seeds:
        steps = iter_batch_update_fuzz(seed, vocab_size=vocab_size)  # lengths as of each step
        reference = reference_class(config, torch.device("cpu"), False)
        with calling(name, {"vllm_config": config, "device": "cpu", "is_pin_memory": False}):
            processor = processor_class(config, torch.device("cpu"), False)
            got_invariant = processor.is_argmax_invariant()
        expect_equal(f"{name}.is_argmax_invariant()", {}, argmax_invariant, got_invariant, invariance_hint)
        generator = torch.Generator().manual_seed(seed)
        history: list[str] = []
        for index, step in enumerate(steps):
            history.append(_describe(step.update))
            rows = [f"row {row}: {describe_row(r)}" for row, r in enumerate(step.rows)]
            inputs = {"seed": seed, "step": index, "this step's update": history[-1], "rows now": rows}
            reference.update_state(step.update)
            with calling(f"{name}.update_state", inputs):
                processor.update_state(step.update)
            logits = make_logits(len(step.rows), vocab_size, generator)
            expected = reference.apply(logits.clone())
            with calling(f"{name}.apply", inputs, expected=expected,
                         hint=f"an IndexError here often means a state entry for a row that left the batch. {hint}"):
                got = processor.apply(logits.clone())
            _expect_logits(f"{name}.apply after update_state", {**inputs, "logits": _round(logits)}, expected, got,
                           hint)
            num_cases += 1
    return num_cases


def _apply_once(processor_class: type, params: list[SamplingParams], logits: torch.Tensor) -> Any:
    """A fresh processor told that every row was just added, applied to `logits` once."""
    processor = processor_class(LogitsProcessorConfig(vocab_size=logits.shape[1]), torch.device("cpu"), False)
    added = [(row, p, [row], []) for row, p in enumerate(params)]
    processor.update_state(BatchUpdate(len(params), [], added, []))
    return processor.apply(logits)


def _count_apply_calls(processor_class: type, num_rows: int, make_params: Callable[[int], SamplingParams]) -> int:
    """torch calls made by one `apply` on `num_rows` rows that all use the processor."""
    vocab_size = 50
    processor = processor_class(LogitsProcessorConfig(vocab_size=vocab_size), torch.device("cpu"), False)
    added = [(row, make_params(row), [row], []) for row in range(num_rows)]
    processor.update_state(BatchUpdate(num_rows, [], added, []))
    logits = torch.randn(num_rows, vocab_size, generator=torch.Generator().manual_seed(num_rows))
    with CountTorchCalls() as counter:
        processor.apply(logits)
    return counter.count


def _expect_vectorized(processor_class: type, make_params: Callable[[int], SamplingParams], hint: str) -> None:
    name = processor_class.__name__
    with calling(f"{name}.apply", {"note": "16 and 128 rows of 50 logits that all use it, to count torch calls"}):
        few = _count_apply_calls(processor_class, 16, make_params)
        many = _count_apply_calls(processor_class, 128, make_params)
    expect_equal(f"{name}.apply is vectorized", {"torch calls with 16 rows": few}, f"<= {few + 8} calls with 128 rows",
                 f"{many} calls with 128 rows", hint, equal=lambda expected, got: many <= few + 8)


# ---------------------------------------------------------------- min-p
# The phase's worked example: the probabilities of phase 08, min_p 0.3 | off | 1.0 on a row with a tie.
WORKED_MIN_P = [0.3, 0.0, 1.0]


def worked_min_p_logits() -> torch.Tensor:
    probs = torch.tensor([[0.05, 0.40, 0.10, 0.30, 0.15], [0.05, 0.40, 0.10, 0.30, 0.15],
                          [0.10, 0.35, 0.35, 0.15, 0.05]])
    return probs.log()


def _min_p_logits(num_rows: int, vocab_size: int, generator: torch.Generator) -> torch.Tensor:
    """Tempered logits: random scales, a grammar-like -inf on some tokens, an occasional tie at the top."""
    scale = torch.rand(num_rows, 1, generator=generator) * 4 + 0.2
    logits = torch.randn(num_rows, vocab_size, generator=generator) * scale
    masked = torch.rand(num_rows, vocab_size, generator=generator) < 0.2
    masked[:, 0] = False
    logits[masked] = -float("inf")
    if num_rows and bool(torch.rand((), generator=generator) < 0.5):
        logits[0, 1] = logits[0, 0] = logits[0].max() + 0.5 if bool(torch.isfinite(logits[0]).any()) else 0.0
    return logits


MIN_P_HINT = ("min-p works on PROBABILITIES of each row (softmax of the tempered logits it is given), not on "
              "logits: a token is dropped (-inf) when its probability is < min_p x the row's OWN largest "
              "probability (strictly less: ties with the top token stay); a row with min_p = 0 and every kept "
              "logit stay exactly as they were. Follow the rows through removes -> adds -> moves")


@graded
def check_min_p_processor(processor_class: type, seeds: Iterable[int] = range(5)) -> None:
    name = processor_class.__name__
    params = [SamplingParams(temperature=1.0, min_p=m) for m in WORKED_MIN_P]
    inputs = {"min_p by row": WORKED_MIN_P, "probs by row": [[0.05, 0.40, 0.10, 0.30, 0.15]] * 2
              + [[0.10, 0.35, 0.35, 0.15, 0.05]], "logits": "their log"}
    expected = _apply_once(ReferenceMinP, params, worked_min_p_logits())
    with calling(f"{name} (the worked example)", inputs, expected=_round(expected)):
        got = _apply_once(processor_class, params, worked_min_p_logits())
    _expect_logits(f"{name} (the worked example)", inputs, expected, got, MIN_P_HINT)
    num_cases = 1 + _run_processor_fuzz(
        processor_class, ReferenceMinP, argmax_invariant=True,
        invariance_hint="min-p never drops a row's most likely token, so it cannot change a greedy row's "
                        "token: it is argmax-invariant (it runs after temperature and is skipped when "
                        "every row is greedy)",
        describe_row=lambda r: f"min_p={r.params.min_p}", make_logits=_min_p_logits, hint=MIN_P_HINT, seeds=seeds)
    _expect_vectorized(processor_class, lambda row: SamplingParams(temperature=1.0, min_p=0.05 + row % 5 / 10),
                       "no Python loop over rows in apply: one softmax, one amax per row and one masked_fill "
                       "serve every row (keep min_p as a [rows, 1] tensor, rebuilt in update_state)")
    passed("check_min_p_processor", num_cases + 1)


# ---------------------------------------------------------------- logit bias
WORKED_LOGIT_BIAS = [{1: -2.0, 4: 1.5}, None, {0: 5.0, 1: 0.25}]


def _bias_logits(num_rows: int, vocab_size: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(num_rows, vocab_size, generator=generator) * 2


LOGIT_BIAS_HINT = ("ADD (not set) logit_bias[token] to that token's logit in the request's own row; rows "
                   "without a bias and the other tokens stay exactly as they were. Follow the rows through "
                   "removes -> adds -> moves: a finished request's bias must leave with it, a moved one "
                   "must follow it")


@graded
def check_logit_bias_processor(processor_class: type, seeds: Iterable[int] = range(5)) -> None:
    name = processor_class.__name__
    params = [SamplingParams(logit_bias=bias) for bias in WORKED_LOGIT_BIAS]
    logits = torch.arange(15, dtype=torch.float32).view(3, 5) / 4
    inputs = {"logit_bias by row": WORKED_LOGIT_BIAS, "logits": _round(logits)}
    expected = _apply_once(ReferenceLogitBias, params, logits.clone())
    with calling(f"{name} (the worked example)", inputs, expected=_round(expected)):
        got = _apply_once(processor_class, params, logits.clone())
    _expect_logits(f"{name} (the worked example)", inputs, expected, got, LOGIT_BIAS_HINT)
    num_cases = 1 + _run_processor_fuzz(
        processor_class, ReferenceLogitBias, argmax_invariant=False,
        invariance_hint="a bias can lift a token above a greedy row's argmax: logit bias is NOT "
                        "argmax-invariant (it runs before greedy rows pick their token)",
        describe_row=lambda r: f"logit_bias={r.params.logit_bias}", make_logits=_bias_logits,
        hint=LOGIT_BIAS_HINT, seeds=seeds)
    _expect_vectorized(processor_class, lambda row: SamplingParams(logit_bias={row % 50: 1.0, (row + 7) % 50: -2.0}),
                       "no Python loop over rows in apply: keep (row ids, token ids) and the biases as flat "
                       "tensors, rebuilt in update_state only when the rows changed, and add them with one "
                       "indexed add")
    passed("check_logit_bias_processor", num_cases + 1)


# ---------------------------------------------------------------- min tokens
@graded
def check_min_tokens_processor(processor_class: type, seeds: Iterable[int] = range(5)) -> None:
    num_cases = _run_processor_fuzz(
        processor_class, ReferenceMinTokens, argmax_invariant=False,
        invariance_hint="masking stop tokens can change the argmax: the processor must run before greedy sampling",
        describe_row=lambda r: (f"min_tokens={r.params.min_tokens}, stop={sorted(r.params.stop_token_ids)}, "
                                f"{len(r.output_token_ids)} output tokens"),
        make_logits=lambda rows, vocab, generator: torch.randn(rows, vocab, generator=generator),
        hint="a row whose request has fewer than min_tokens output tokens gets -inf on each of its "
             "stop tokens; every other logit is left bit-identical. Follow the rows through "
             "removes -> adds -> moves, and remember the output lists grow by reference",
        seeds=seeds)
    passed("check_min_tokens_processor", num_cases)


# ---------------------------------------------------------------- condense
def _state(req_id: str) -> CachedRequestState:
    return CachedRequestState(
        req_id=req_id,
        prompt_token_ids=[1],
        output_token_ids=[],
        sampling_params=SamplingParams(),
        generator=None,
        block_ids=[],
        num_computed_tokens=0,
    )


def _batch_view(batch: InputBatch) -> dict[str, Any]:
    return {
        "req_ids": list(batch.req_ids),
        "requests": [None if s is None else s.req_id for s in batch.requests],
        "req_id_to_index": dict(sorted(batch.req_id_to_index.items())),
    }


def _update_view(update: BatchUpdate | None) -> Any:
    if update is None:
        return None
    return {
        "batch_size": update.batch_size,
        "removed": list(update.removed),
        "added": [row for row, *_ in update.added],
        "moved": [(a, b, direction.name) for a, b, direction in update.moved],
    }


def _condense_cases(seeds: Iterable[int]) -> list[list[tuple[list[str], list[str]]]]:
    """Each case: steps of (finished request ids, new request ids)."""
    cases = [
        [([], ["A", "B", "C", "D"]), (["A", "C"], ["E"])],  # the worked example
        [([], ["A", "B", "C", "D", "E"]), (["B", "C", "E"], [])],
        [([], ["A", "B"]), (["A", "B"], [])],
    ]
    for seed in seeds:
        rng = random.Random(seed)
        live: list[str] = []
        steps = []
        counter = 0
        for _ in range(rng.randint(2, 6)):
            finished = [r for r in live if rng.random() < 0.4]
            new = [f"r{counter + i}" for i in range(rng.randint(0, 3))]
            counter += len(new)
            live = [r for r in live if r not in finished] + new
            steps.append((finished, new))
        cases.append(steps)
    return cases


@graded
def check_condense(condense: Callable, seeds: Iterable[int] = range(30)) -> None:
    cases = _condense_cases(seeds)
    for steps in cases:
        expected_batch, got_batch = InputBatch(max_num_reqs=32), InputBatch(max_num_reqs=32)
        for index, (finished, new) in enumerate(steps):
            for batch in (expected_batch, got_batch):
                for req_id in finished:
                    batch.remove_request(req_id)
                for req_id in new:
                    batch.add_request(_state(req_id))
            inputs = {
                "steps (finished, new)": steps[: index + 1],
                "rows before condense (None = hole)": list(got_batch.req_ids),
            }
            expected_batch.condense()
            with calling("condense", inputs):
                types.MethodType(condense, got_batch)()
            hint = (
                "repeatedly: drop trailing holes, then move the HIGHEST occupied row into the LOWEST hole, "
                "updating req_ids, requests and req_id_to_index, and record each move with "
                "self.batch_update_builder.moved_append((from_row, to_row, MoveDirectionality.UNIDIRECTIONAL))"
            )
            expect_equal(
                "condense: the rows", inputs, _batch_view(expected_batch), _batch_view(got_batch), hint
            )
            expect_equal(
                "condense: the step's BatchUpdate",
                inputs,
                _update_view(expected_batch.get_batch_update()),
                _update_view(got_batch.get_batch_update()),
                hint,
            )
    passed("check_condense", len(cases))


PHASE = Phase("09_logits_processors", (
    Exercise("apply_all_penalties", check_apply_all_penalties, points=4, grade_id="test-penalties", part="apply_all_penalties"),
    Exercise("process_dict_updates", check_process_dict_updates, points=3, grade_id="test-dict-updates", part="process_dict_updates"),
    Exercise("MinPLogitsProcessor", check_min_p_processor, points=3, grade_id="test-min-p", part="MinPLogitsProcessor"),
    Exercise("LogitBiasLogitsProcessor", check_logit_bias_processor, points=3, grade_id="test-logit-bias",
             part="LogitBiasLogitsProcessor"),
    Exercise("MinTokensLogitsProcessor", check_min_tokens_processor, points=4, grade_id="test-min-tokens", part="MinTokensLogitsProcessor"),
    Exercise("condense", check_condense, points=3, grade_id="test-condense", part="condense"),
))
