"""Checks for phase 09 (penalties and logits processors), against mini.sample and mini.worker.input_batch.

    check_apply_all_penalties(apply_all_penalties)       vs mini.sample.ops.penalties.apply_all_penalties
    check_process_dict_updates(process_dict_updates)     vs mini.sample.logits_processor.builtin.process_dict_updates
    check_min_p_processor(MinPLogitsProcessor)           vs mini.sample.logits_processor.builtin.MinPLogitsProcessor
    check_logit_bias_processor(LogitBiasLogitsProcessor) vs
    mini.sample.logits_processor.builtin.LogitBiasLogitsProcessor
    check_min_tokens_processor(MinTokensLogitsProcessor) vs
    mini.sample.logits_processor.builtin.MinTokensLogitsProcessor check_condense(condense)
    the invariants of a condensed batch (a design exercise)

The processors are checked under a fuzz of BatchUpdates built by the persistent batch's rules (new
requests fill the lowest holes, extra new ones append, extra removals are condensed by moving the
highest row into the lowest hole, then optional swaps), with output lists growing by reference; on even
seeds `removed` is built as vLLM's code builds it (a hole the condense fills leaves `removed`), on odd
seeds as mini's builder and vLLM's design document do (it stays). Most requests know an EOS (token 0),
which min_tokens must hold back. Each wrong entry is explained: the row's request, what the entry must
be, and why.

`condense` is graded by what any valid design must satisfy, not by one order of moves: rows 0..n-1
occupied and nothing after them, requests already inside stay put (one move per hole), req_ids /
requests / req_id_to_index agree, the recorded one-way moves replay to the new rows, and `removed` is
either left alone (mini) or stripped of the filled holes (vLLM's `pop_removed`).
"""

from __future__ import annotations

import math
import random
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from labs.checks.common import CountTorchCalls, calling, expect_equal, first_differing_entry, passed
from labs.checks.grading import graded
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


def _expect_logits(what: str, inputs: dict, expected: torch.Tensor, got: Any, hint: str,
                   explain: Callable[[int, int, float, float], str] | None = None) -> None:
    """`got` vs `expected` (atol/rtol 1e-5, -inf == -inf, no NaN); on a mismatch, the first wrong (row, token)
    with both rows, and `explain(row, token, expected, got)` (what that entry must be, and why) before `hint`."""
    __tracebackhide__ = True
    if not isinstance(got, torch.Tensor):
        expect_equal(what, inputs, f"a torch.Tensor of shape {tuple(expected.shape)} (the logits)",
                     type(got).__name__, "return the logits tensor (edited in place is fine)",
                     equal=lambda a, b: False)
    expect_equal(f"{what} shape", inputs, tuple(expected.shape), tuple(got.shape), hint)
    same_inf = torch.equal(torch.isinf(expected), torch.isinf(got)) and not bool(torch.isnan(got).any())
    finite = torch.isfinite(expected)
    same = same_inf and torch.allclose(expected[finite], got.to(expected.dtype)[finite], rtol=1e-5, atol=1e-5)
    if not same:
        close = torch.isclose(expected, got.to(expected.dtype), rtol=1e-5, atol=1e-5) | (expected == got)
        row, token = first_differing_entry(torch.zeros_like(expected), (~close).to(expected.dtype)) or (0, 0)
        located = {**inputs, f"row {row} expected": _round(expected[row:row + 1])[0],
                   f"row {row} got": _round(got[row:row + 1])[0]}
        if explain is not None:
            reason = explain(row, token, float(expected[row, token]), float(got[row, token])).rstrip(".")
            hint = f"{reason}.\n  In general: {hint}"
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


def _explain_penalty(case: dict[str, Any]) -> Callable[[int, int, float, float], str]:
    """What one (row, token) of a penalties case must become, from its histories and the row's penalties."""
    def explain(row: int, token: int, expected: float, got: float) -> str:
        vocab_size = len(case["logits"][row])
        prompt, output = case["prompt_token_ids"][row], case["output_token_ids"][row]
        in_prompt, in_output = prompt.count(token), output.count(token)
        r = case["repetition_penalties"][row]
        f, q = case["frequency_penalties"][row], case["presence_penalties"][row]
        logit = case["logits"][row][token]
        text = (f"token {token} of row {row}: logit {logit}, {in_prompt}x in the prompt, {in_output}x in the output; "
                f"repetition {r}, frequency {f}, presence {q}: it must become {expected:.6g}, you gave {got:.6g}. ")
        if in_prompt == 0 and in_output == 0:
            return text + (f"It is in neither history, so it stays as it was (the padding id {vocab_size} is not a "
                           "token: it must never count as one, nor land on a real token)")
        sign = ""
        if logit <= 0 and r != 1:
            sign = (" Its logit is not positive: the repetition penalty MULTIPLIES it by r (dividing would move it "
                    "the other way)")
        if in_output == 0:
            return text + ("It is in the PROMPT only: the repetition penalty applies (prompt OR output); frequency "
                           "and presence read the OUTPUT only." + sign)
        return text + (f"It is in the output: the repetition penalty once (not once per history it appears in), "
                       f"then frequency x {in_output} (its count in the output) and presence once, subtracted after "
                       "the repetition penalty." + sign)
    return explain


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
            explain=_explain_penalty(case),
        )
    with calling("apply_all_penalties", {"note": "16 and 128 rows of 50 logits, to count torch calls"}):
        few, many = _count_penalty_calls(apply_all_penalties, 16), _count_penalty_calls(apply_all_penalties, 128)
    expect_equal(
        "apply_all_penalties is vectorized",
        {"torch calls with 16 rows": few},
        f"<= {few + 8} calls with 128 rows",
        f"{many} calls with 128 rows",
        "no Python loop over rows: count every row's ragged history at once (the padding id is there so "
        "that the rows have one width), and apply each row's penalties by broadcasting [N, 1] columns",
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
        explain=_explain_penalty(WORKED_PENALTIES),
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
                            logit_bias=logit_bias, temperature=1.0, ignore_eos=rng.random() < 0.15)
    params.update_from_eos(rng.choice([FUZZ_EOS, FUZZ_EOS, FUZZ_EOS, None]))  # None: a model without an EOS
    outputs = [rng.randrange(vocab_size) for _ in range(rng.choice([0, 0, 0, 2]))]  # some resume with outputs
    return FakeRequest(
        number, params, [number] + [rng.randrange(vocab_size) for _ in range(rng.randint(0, 4))], outputs
    )


FUZZ_EOS = 0  # the fuzz's model has EOS = token 0 (most requests know it; min_tokens must hold it back)


def batch_update_fuzz(
    seed: int, num_steps: int = 60, vocab_size: int = 12, max_rows: int = 8, vllm_removed: bool | None = None
) -> list[FuzzStep]:
    """Random steps of a persistent batch, with the BatchUpdate each one produces (None: no change)."""
    return list(iter_batch_update_fuzz(seed, num_steps, vocab_size, max_rows, vllm_removed))


def iter_batch_update_fuzz(
    seed: int, num_steps: int = 60, vocab_size: int = 12, max_rows: int = 8, vllm_removed: bool | None = None
) -> Iterator[FuzzStep]:
    """The same steps, one at a time: each running request's output list grows by one token only AFTER
    its step is handed out, so a consumer sees the lengths of that step (min_tokens counts them).

    `vllm_removed` (default: even seeds): build `removed` as vLLM's code does, where condense takes every hole
    it fills out of `removed` (`InputBatch.condense` calls `pop_removed`, vllm/v1/worker/gpu_input_batch.py),
    so that a one-way move onto such a row must itself discard the row's old entry. Otherwise as mini's
    `BatchUpdateBuilder` does (and vLLM's design document shows): `removed` keeps every hole that no add
    refilled."""
    vllm_removed = seed % 2 == 0 if vllm_removed is None else vllm_removed
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
            if vllm_removed:
                removed.remove(hole)
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
            f"req(min_tokens={params.min_tokens}, stop={sorted(params.stop_token_ids)}, "
            + f"with EOS={sorted(params.all_stop_token_ids)}, "
            + f"min_p={params.min_p}, logit_bias={params.logit_bias}, prompt={prompt}, output={output})",
        )
        for row, params, prompt, output in update.added
    ]
    moved = [(a, b, direction.name) for a, b, direction in update.moved]
    return f"BatchUpdate(batch_size={update.batch_size}, removed={list(update.removed)}, added={added}, moved={moved})"


def _dict_update_new_state(params: SamplingParams, prompt_ids: list[int], output_ids: list[int]) -> Any:
    """The check's processor state: (the request's first prompt id, its min_tokens), None when min_tokens is 0."""
    return (prompt_ids[0], params.min_tokens) if params.min_tokens > 0 else None


def _worked_dict_updates() -> list[BatchUpdate | None]:
    """The phase's documented steps. States are (request's first prompt id, min_tokens): A=100 .. I=108."""
    def req(number: int, min_tokens: int) -> tuple[SamplingParams, list[int], list[int]]:
        return SamplingParams(min_tokens=min_tokens), [100 + number], []

    a, b, c, d, e, f, g, h, i = (req(n, m) for n, m in enumerate((1, 2, 3, 0, 9, 0, 4, 5, 6)))
    return [
        # rows [A, B, C, D] (D has no entry: its min_tokens is 0)
        BatchUpdate(4, [], [(0, *a), (1, *b), (2, *c), (3, *d)], []),
        # vLLM's documented step, as vLLM's code builds it: A and C finish, E takes row 0, D (no entry) moves
        # 3 -> 2 onto C's old row, then the backend swaps rows 0 and 1. The condense took row 2 out of
        # `removed`: C's entry must go with the one-way move. Rows: [B, E, D]
        BatchUpdate(3, [], [(0, *e)], [(3, 2, UNI), (0, 1, SWAP)]),
        BatchUpdate(3, [], [], [(0, 1, SWAP)]),               # rows [E, B, D]
        None,                                                  # nothing changed
        BatchUpdate(3, [], [(1, *f)], []),                     # F replaces B in row 1 (an add only): [E, F, D]
        BatchUpdate(5, [], [(3, *g), (4, *h)], []),            # G, H appended: [E, F, D, G, H]
        # E and G finish, I takes row 0; mini's builder (and vLLM's design document) keep row 3 in
        # `removed`, then H moves 4 -> 3: [I, F, D, H]
        BatchUpdate(4, [3], [(0, *i)], [(4, 3, UNI)]),
    ]


def _apply_in_order(before: dict[int, Any], update: BatchUpdate, order: tuple[str, ...]) -> dict[int, Any]:
    """`update` applied to a copy of `before` with its three lists in `order` (each as the reference does it)."""
    entries = dict(before)
    for part in order:
        single = BatchUpdate(update.batch_size, update.removed if part == "removed" else [],
                             update.added if part == "added" else [], update.moved if part == "moved" else [])
        reference_process_dict_updates(entries, single, _dict_update_new_state)
    return entries


def _explain_entries(update: BatchUpdate, before: dict[int, Any], expected: dict[int, Any],
                     got: dict[Any, Any]) -> str:
    """The first row whose entry differs, what this step did to it, and what it must hold."""
    missing = object()
    keys = sorted({*expected, *got}, key=lambda key: (not isinstance(key, int), repr(key)))
    row = next((key for key in keys if expected.get(key, missing) != got.get(key, missing)), None)
    if row is None:
        return "the entries must be exactly those of the reference"

    def show(value: Any) -> str:
        return "no entry" if value is missing else repr(value)

    if not isinstance(row, int):
        return f"your dict has a key {row!r}: the keys are row indices"
    events = []
    if row in update.removed:
        events.append(f"row {row} is in removed")
    for added_row, params, prompt_ids, output_ids in update.added:
        if added_row == row:
            events.append(f"a request is added at row {row}, new_state(...) = "
                          f"{_dict_update_new_state(params, prompt_ids, output_ids)!r}")
    for a, b, direction in update.moved:
        if row in (a, b):
            events.append(f"move ({a}, {b}, {direction.name})")
    want, have = expected.get(row, missing), got.get(row, missing)
    text = (f"row {row}: before this step {show(before.get(row, missing))}; this step: "
            f"{'; '.join(events) or 'nothing touches row ' + str(row)}; it must end with {show(want)}, "
            f"yours has {show(have)}")
    if have is None:
        return text + ". Store no entry when new_state returns None (a request the processor ignores has no row)"
    one_way_onto = [(a, b) for a, b, direction in update.moved if b == row and direction is UNI]
    if one_way_onto and want is missing:
        a, b = one_way_onto[-1]
        return text + (f". The one-way move ({a}, {b}) leaves row {b} holding what row {a} held, and row {a} "
                       f"held nothing: row {b}'s old entry belongs to a request that has left it (vLLM's condense "
                       "does not list a row it refills in `removed`), so it is discarded")
    if any(added_row == row for added_row, *_ in update.added) and want is missing:
        return text + (f". The request added at row {row} replaces the one that was there, and new_state gave "
                       "None for it: the old request's entry goes")
    for order in (("removed", "moved", "added"), ("moved", "removed", "added"), ("added", "removed", "moved"),
                  ("added", "moved", "removed"), ("moved", "added", "removed")):
        if _apply_in_order(before, update, order) == got:
            return text + (f". Your entries are what {' -> '.join(order)} gives: apply the removes, then the adds, "
                           "then the moves (an add's row is the row at the time it was added, before any move)")
    swaps = [(a, b) for a, b, direction in update.moved if row in (a, b) and direction is SWAP]
    if swaps:
        return text + ". A SWAP exchanges the two rows' entries (either may be absent), in the order of `moved`"
    return text + ". Apply removes, then adds, then moves, each list in its order"


@graded
def check_process_dict_updates(process_dict_updates: Callable, seeds: Iterable[int] = range(6)) -> None:
    num_cases = 0
    sequences = [_worked_dict_updates()] + [[step.update for step in batch_update_fuzz(seed)] for seed in seeds]
    for updates in sequences:
        expected_entries: dict[int, Any] = {}
        got_entries: dict[int, Any] = {}
        history: list[str] = []
        for update in updates:
            history.append(_describe(update))
            before = dict(expected_entries)
            inputs = {
                "updates so far (the last one is this step's)": history[-3:],
                "entries before": dict(got_entries),
            }
            expected_changed = reference_process_dict_updates(expected_entries, update, _dict_update_new_state)
            with calling("process_dict_updates", inputs, expected=expected_changed):
                got_changed = process_dict_updates(got_entries, update, _dict_update_new_state)
            hint = ("removes, then adds (new_state(params, prompt, output); None drops a replaced row's "
                    "entry), then moves in order: UNIDIRECTIONAL a->b moves a's entry to b (b's old entry is "
                    "discarded), SWAP exchanges them")
            if got_entries != expected_entries and update is not None:
                hint = f"{_explain_entries(update, before, expected_entries, got_entries)}.\n  In general: {hint}"
            expect_equal("process_dict_updates: the entries", inputs, expected_entries, got_entries, hint)
            expect_equal(
                "process_dict_updates: the returned 'changed'",
                inputs,
                expected_changed,
                got_changed,
                "return True exactly when the dict changed (an entry added, replaced, dropped or moved; False "
                "for None): the processors rebuild their tensors only then",
            )
            num_cases += 1
    passed("check_process_dict_updates", num_cases)


# explain(requests by row, row, token, the logits given [N, V], the learner's result [N, V], expected, got)
RowExplainer = Callable[[list[FakeRequest], int, int, torch.Tensor, torch.Tensor, float, float], str]


def _run_processor_fuzz(processor_class: type, reference_class: type, *, argmax_invariant: bool,
                        invariance_hint: str, describe_row: Callable[[FakeRequest], str],
                        make_logits: Callable[[int, int, torch.Generator], torch.Tensor], hint: str,
                        seeds: Iterable[int], explain: RowExplainer | None = None) -> int:
    """Drive the learner's processor and the reference through the same fuzz of BatchUpdates; after each
    update_state, both apply to the same logits. Returns the number of steps compared. `explain` (a
    RowExplainer) says what the first wrong entry must be, and why."""
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
                           hint, explain=None if explain is None else (
                               lambda row, token, want, have, rows=step.rows, logits=logits, got=got:
                               explain(rows, row, token, logits, got, want, have)))
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


def _explain_min_p(requests: list[FakeRequest], row: int, token: int, logits: torch.Tensor, got: torch.Tensor,
                   want: float, have: float) -> str:
    min_p, logits_row = requests[row].params.min_p, logits[row]
    if min_p <= 0:
        return (f"row {row}'s request does not use min-p (min_p = 0): its row stays exactly as it was (an entry "
                "left behind by a request that finished, or that moved away from this row?)")
    probs = logits_row.softmax(dim=-1)
    top, prob = float(probs.max()), float(probs[token])
    threshold = min_p * top
    finite_rows = [r for r in range(logits.shape[0]) if bool(torch.isfinite(logits[r]).any())]
    batch_top = max(float(logits[r].softmax(dim=-1).max()) for r in finite_rows) if finite_rows else top
    own = (f" (its OWN top, not the batch's, {batch_top:.4g}: each row has its own threshold)"
           if not math.isclose(batch_top, top, rel_tol=1e-6) else "")
    where = (f"row {row} (min_p {min_p}): token {token} has probability {prob:.4g}; the row's top probability is "
             f"{top:.4g}{own}, so the threshold is {min_p} x {top:.4g} = {threshold:.4g}")
    if math.isinf(want) and not math.isinf(have):
        return f"{where}: it is below, so it must be -inf"
    if math.isinf(have) and not math.isinf(want):
        tie = " (it ties with the threshold: only a probability strictly below it goes)" if prob >= threshold and \
            math.isclose(prob, threshold, rel_tol=1e-5) else ""
        return f"{where}: it is not below, so it stays{tie}"
    return f"{where}: a kept logit stays exactly as it was"


@graded
def check_min_p_processor(processor_class: type, seeds: Iterable[int] = range(5)) -> None:
    name = processor_class.__name__
    params = [SamplingParams(temperature=1.0, min_p=m) for m in WORKED_MIN_P]
    inputs = {"min_p by row": WORKED_MIN_P, "probs by row": [[0.05, 0.40, 0.10, 0.30, 0.15]] * 2
              + [[0.10, 0.35, 0.35, 0.15, 0.05]], "logits": "their log"}
    expected = _apply_once(ReferenceMinP, params, worked_min_p_logits())
    with calling(f"{name} (the worked example)", inputs, expected=_round(expected)):
        got = _apply_once(processor_class, params, worked_min_p_logits())
    requests = [FakeRequest(row, p, [row]) for row, p in enumerate(params)]
    logits = worked_min_p_logits()
    _expect_logits(f"{name} (the worked example)", inputs, expected, got, MIN_P_HINT,
                   explain=lambda row, token, want, have: _explain_min_p(requests, row, token, logits, got,
                                                                         want, have))
    num_cases = 1 + _run_processor_fuzz(
        processor_class, ReferenceMinP, argmax_invariant=True,
        invariance_hint="min-p never drops a row's most likely token, so it cannot change a greedy row's "
                        "token: it is argmax-invariant (it runs after temperature and is skipped when "
                        "every row is greedy)",
        describe_row=lambda r: f"min_p={r.params.min_p}", make_logits=_min_p_logits, hint=MIN_P_HINT, seeds=seeds,
        explain=_explain_min_p)
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


def _explain_logit_bias(requests: list[FakeRequest], row: int, token: int, logits: torch.Tensor, got: torch.Tensor,
                        want: float, have: float) -> str:
    biases = requests[row].params.logit_bias or {}
    logit = float(logits[row, token])
    if token not in biases:
        return (f"row {row}'s request has no bias on token {token} (its logit_bias: {biases or None}): the logit "
                f"stays {logit:.4g}, yours is {have:.4g} (a bias left behind by a request that finished, or that "
                "moved away from this row? or one applied to the wrong row?)")
    bias = biases[token]
    text = (f"row {row}'s request has logit_bias {{{token}: {bias}}}: its logit {logit:.4g} must become "
            f"{want:.4g}, yours is {have:.4g}")
    if math.isclose(have, bias, rel_tol=1e-5, abs_tol=1e-6):
        text += " (you SET it to the bias: add it)"
    return text


@graded
def check_logit_bias_processor(processor_class: type, seeds: Iterable[int] = range(5)) -> None:
    name = processor_class.__name__
    params = [SamplingParams(logit_bias=bias) for bias in WORKED_LOGIT_BIAS]
    logits = torch.arange(15, dtype=torch.float32).view(3, 5) / 4
    inputs = {"logit_bias by row": WORKED_LOGIT_BIAS, "logits": _round(logits)}
    expected = _apply_once(ReferenceLogitBias, params, logits.clone())
    with calling(f"{name} (the worked example)", inputs, expected=_round(expected)):
        got = _apply_once(processor_class, params, logits.clone())
    requests = [FakeRequest(row, p, [row]) for row, p in enumerate(params)]
    _expect_logits(f"{name} (the worked example)", inputs, expected, got, LOGIT_BIAS_HINT,
                   explain=lambda row, token, want, have: _explain_logit_bias(requests, row, token, logits, got,
                                                                              want, have))
    num_cases = 1 + _run_processor_fuzz(
        processor_class, ReferenceLogitBias, argmax_invariant=False,
        invariance_hint="a bias can lift a token above a greedy row's argmax: logit bias is NOT "
                        "argmax-invariant (it runs before greedy rows pick their token)",
        describe_row=lambda r: f"logit_bias={r.params.logit_bias}", make_logits=_bias_logits,
        hint=LOGIT_BIAS_HINT, seeds=seeds, explain=_explain_logit_bias)
    _expect_vectorized(processor_class, lambda row: SamplingParams(logit_bias={row % 50: 1.0, (row + 7) % 50: -2.0}),
                       "no Python loop over rows in apply: keep (row ids, token ids) and the biases as flat "
                       "tensors, rebuilt in update_state only when the rows changed, and add them with one "
                       "indexed add")
    passed("check_logit_bias_processor", num_cases + 1)


# ---------------------------------------------------------------- min tokens
MIN_TOKENS_HINT = ("a row whose request has fewer than min_tokens output tokens gets -inf on each of its stop "
                   "tokens: stop_token_ids plus EOS (stop_token_ids_of(params)); every other logit is left "
                   "bit-identical. Follow the rows through removes -> adds -> moves, and remember the output lists "
                   "grow by reference")


def _explain_min_tokens(requests: list[FakeRequest], row: int, token: int, logits: torch.Tensor,
                        got: torch.Tensor, want: float, have: float) -> str:
    params = requests[row].params
    min_tokens, generated = params.min_tokens, len(requests[row].output_token_ids)
    stops = sorted(params.all_stop_token_ids)
    if math.isinf(want) and not math.isinf(have):
        def masked(r: int, t: int) -> bool:
            return math.isinf(float(got[r, t]))

        held = [r for r, request in enumerate(requests) if request.params.min_tokens > len(request.output_token_ids)]
        eos_of = {r: set(requests[r].params.all_stop_token_ids) - set(requests[r].params.stop_token_ids) for r in held}
        forgot_eos = any(requests[r].params.stop_token_ids
                         and all(masked(r, t) for t in requests[r].params.stop_token_ids)
                         and not all(masked(r, t) for t in eos_of[r]) for r in held)
        knows_eos = any(eos_of[r] and all(masked(r, t) for t in eos_of[r]) for r in held)
        explicit = list(params.stop_token_ids)
        is_eos = token not in explicit
        masks_none = not any(masked(row, t) for t in stops)
        untracked = (f"row {row}'s request has {generated} output tokens, fewer than its min_tokens = {min_tokens}, "
                     f"so all its stop tokens (with EOS: {stops}) must be -inf, and your row masks none of them: is "
                     "the row tracked at all? (min_tokens counts OUTPUT tokens only, and a request may arrive with "
                     "some already)")
        if is_eos and params.ignore_eos and not (explicit and masks_none):
            return (f"token {token} is the EOS of row {row}'s request, which sets ignore_eos: EOS then does not stop "
                    "the request, but it is still one of its stop tokens for min_tokens (stop_token_ids_of(params); "
                    "vLLM adds EOS to all_stop_token_ids either way, so EOS counts even with ignore_eos), and the "
                    f"request has {generated} < min_tokens = {min_tokens} output tokens: it must be -inf")
        eos_text = (f"token {token} is the EOS of row {row}'s request: EOS is one of its stop tokens too "
                    f"(stop_token_ids_of(params) = stop_token_ids {sorted(explicit)} plus EOS; EOS counts even "
                    f"with ignore_eos), and the request has {generated} < min_tokens = {min_tokens} output tokens: "
                    "it must be -inf, or the request could end right away")
        if is_eos and explicit and not masks_none:
            return eos_text
        if is_eos and not explicit and (forgot_eos or not knows_eos):
            return eos_text if forgot_eos else f"{eos_text} (or is the row not tracked at all?)"
        if masks_none:
            return untracked
        return (f"row {row}'s request has {generated} output tokens, fewer than its min_tokens = {min_tokens}: its "
                f"stop token {token} must be -inf")
    if math.isinf(have) and not math.isinf(want):
        if token in stops and min_tokens > 0 and generated >= min_tokens:
            return (f"row {row}'s request already has {generated} >= min_tokens = {min_tokens} output tokens (its "
                    "output list grew by reference since it was added; update_state is called every step, with "
                    "None when no row changed): its stop tokens are free again")
        if min_tokens == 0:
            return (f"row {row}'s request does not use min_tokens: its row stays exactly as it was (state left "
                    "by a request that finished, or that moved away from this row?)")
        return (f"token {token} is not a stop token of row {row}'s request (its stop tokens with EOS: {stops}): a "
                "-inf here is state left by a request that was in this row before")
    return f"row {row}, token {token}: a logit that is not masked stays bit-identical"


def _worked_min_tokens() -> list[SamplingParams]:
    """The phase's example: EOS = 0, min_tokens 2 | 3 with stop id 5 | off | resumed | ignore_eos."""
    def params(**kwargs: Any) -> SamplingParams:
        made = SamplingParams(max_tokens=10, **kwargs)
        made.update_from_eos(FUZZ_EOS)
        return made

    return [params(min_tokens=2), params(min_tokens=3, stop_token_ids=[5]), params(min_tokens=0, stop_token_ids=[5]),
            params(min_tokens=2), params(min_tokens=3, ignore_eos=True)]


WORKED_MIN_TOKENS_OUTPUTS = [[], [], [], [7, 7], []]  # row 3 resumes with two tokens already generated


def _check_min_tokens_worked(processor_class: type) -> int:
    """Four steps of the worked example (every output grows by one token per step; updates are None)."""
    name = processor_class.__name__
    params = _worked_min_tokens()
    vocab_size = 8
    config = LogitsProcessorConfig(vocab_size=vocab_size)
    requests = [FakeRequest(row, p, [row], list(WORKED_MIN_TOKENS_OUTPUTS[row])) for row, p in enumerate(params)]
    got_requests = [FakeRequest(row, p, [row], list(WORKED_MIN_TOKENS_OUTPUTS[row])) for row, p in enumerate(params)]
    reference = ReferenceMinTokens(config, torch.device("cpu"), False)
    table = [f"row {row}: min_tokens={p.min_tokens}, stop_token_ids={list(p.stop_token_ids)}, EOS=0"
             + (", ignore_eos" if p.ignore_eos else "") for row, p in enumerate(params)]
    with calling(name, {"vllm_config": config, "device": "cpu", "is_pin_memory": False}):
        processor = processor_class(config, torch.device("cpu"), False)
    logits = torch.arange(vocab_size * len(params), dtype=torch.float32).view(len(params), vocab_size) / 8
    for step in range(4):
        update = (BatchUpdate(len(params), [], [(row, r.params, r.prompt_token_ids, r.output_token_ids)
                                                for row, r in enumerate(requests)], []) if step == 0 else None)
        got_update = (BatchUpdate(len(params), [], [(row, r.params, r.prompt_token_ids, r.output_token_ids)
                                                    for row, r in enumerate(got_requests)], []) if step == 0 else None)
        inputs = {"the worked example's rows": table, "step": step,
                  "output lengths now": [len(r.output_token_ids) for r in got_requests],
                  "this step's update": "every row added" if step == 0 else "None (no row changed)"}
        reference.update_state(update)
        with calling(f"{name}.update_state", inputs):
            processor.update_state(got_update)
        expected = reference.apply(logits.clone())
        with calling(f"{name}.apply", inputs, expected=_round(expected)):
            got = processor.apply(logits.clone())
        _expect_logits(f"{name} (the worked example, step {step})", inputs, expected, got, MIN_TOKENS_HINT,
                       explain=lambda row, token, want, have, got=got: _explain_min_tokens(
                           got_requests, row, token, logits, got, want, have))
        for request in (*requests, *got_requests):   # every row generates one token (by reference)
            request.output_token_ids.append(7)
    return 4


@graded
def check_min_tokens_processor(processor_class: type, seeds: Iterable[int] = range(5)) -> None:
    num_cases = _check_min_tokens_worked(processor_class)
    num_cases += _run_processor_fuzz(
        processor_class, ReferenceMinTokens, argmax_invariant=False,
        invariance_hint="masking stop tokens can change the argmax: the processor must run before greedy sampling",
        describe_row=lambda r: (f"min_tokens={r.params.min_tokens}, stop={sorted(r.params.stop_token_ids)}, "
                                f"with EOS={sorted(r.params.all_stop_token_ids)}, "
                                f"{len(r.output_token_ids)} output tokens"),
        make_logits=lambda rows, vocab, generator: torch.randn(rows, vocab, generator=generator),
        hint=MIN_TOKENS_HINT, seeds=seeds, explain=_explain_min_tokens)
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


def _names(values: Any) -> list[Any]:
    """Row contents as request ids (a CachedRequestState by its req_id; a hole as None), whatever they hold."""
    return [None if value is None else getattr(value, "req_id", value) for value in list(values)]


def _replay_condense_moves(before: list[Any], moves: list[Any]) -> tuple[list[Any] | None, str | None]:
    """`before` (rows with holes) after the recorded `moves`, trailing holes dropped; or (None, what is wrong)."""
    rows = list(before)
    for move in moves:
        if not (isinstance(move, tuple) and len(move) == 3):
            return None, f"the recorded move {move!r} is not a (from_row, to_row, MoveDirectionality) triple"
        a, b, direction = move
        name = getattr(direction, "name", repr(direction))
        if name != "UNIDIRECTIONAL":
            return None, (f"your move ({a}, {b}, {name}) is not one-way: a condensing move is "
                          f"MoveDirectionality.UNIDIRECTIONAL (a SWAP would tell the processors that row {b}'s old "
                          f"content went to row {a})")
        if not all(isinstance(x, int) and 0 <= x < len(rows) for x in (a, b)):
            return None, f"your move ({a}, {b}) names a row outside 0..{len(rows) - 1}"
        if rows[a] is None:
            return None, (f"your move ({a}, {b}) moves row {a}, which is a hole at that point: a move is "
                          "(from_row, to_row, ...), from an occupied row into a hole")
        if rows[b] is not None:
            return None, (f"your move ({a}, {b}) moves onto row {b}, which still holds {rows[b]!r}: a condensing "
                          "move fills a hole")
        rows[b], rows[a] = rows[a], None
    while rows and rows[-1] is None:
        rows.pop()
    return rows, None


def _reference_condense(before_ids: list[Any], before_requests: list[Any], before_map: dict, removed: list[int]
                        ) -> tuple[list[Any], list[tuple[int, int, str]]]:
    """What the reference (vLLM's rule: the highest row into the lowest hole) does with the same rows."""
    batch = InputBatch(max_num_reqs=max(32, len(before_ids)))
    batch.req_ids, batch.requests, batch.req_id_to_index = list(before_ids), list(before_requests), dict(before_map)
    for row in removed:
        batch.batch_update_builder.removed_append(row)
    InputBatch.condense(batch)
    return list(batch.req_ids), [(a, b, d.name) for a, b, d in batch.batch_update_builder.moved]


def _check_condensed(batch: InputBatch, inputs: dict[str, Any], before: list[Any], removed_before: list[int],
                     added_rows: list[int], num_moves_before: int) -> None:
    """The invariants of a condensed batch (any order of moves that keeps them passes), then its BatchUpdate."""
    __tracebackhide__ = True
    live = [req_id for req_id in before if req_id is not None]
    size = len(live)
    holes_inside = [row for row in range(size) if before[row] is None]
    rows = _names(batch.req_ids)
    general = ("rows 0..num_reqs-1 all occupied and nothing after them; a request already inside rows "
               "0..num_reqs-1 stays put (one move per hole, each copying a row of every per-request tensor); "
               "req_ids, requests and req_id_to_index agree; every move recorded, in order, with "
               "self.batch_update_builder.moved_append((from_row, to_row, MoveDirectionality.UNIDIRECTIONAL))")
    if len(rows) > size and all(row is None for row in rows[size:]) and None not in rows[:size]:
        expect_equal("condense: the rows", inputs, live, rows, f"your rows end with holes: the batch has {size} "
                     f"rows after condense, so drop the trailing None (the next step appends after row {size - 1})",
                     equal=lambda a, b: False)
    if None in rows:
        hole = rows.index(None)
        expect_equal("condense: the rows", inputs, f"{size} occupied rows", rows,
                     f"row {hole} is still a hole: rows 0..{size - 1} must all be occupied (the last row may itself "
                     "be a hole: it has nothing to move)", equal=lambda a, b: False)
    if sorted(map(repr, rows)) != sorted(map(repr, live)):
        lost = [r for r in live if r not in rows]
        extra = [r for r in rows if r not in live or rows.count(r) > 1]
        expect_equal("condense: the requests in the batch", inputs, sorted(map(repr, live)), sorted(map(repr, rows)),
                     f"condense only moves requests: missing {lost}, unexpected or twice {extra}",
                     equal=lambda a, b: False)
    for row in range(size):
        if before[row] is not None and rows[row] != before[row]:
            expect_equal(f"condense: row {row}", inputs, before[row], rows[row],
                         f"row {row} held {before[row]!r}, inside the condensed batch (rows 0..{size - 1}): it must "
                         "stay put; only the requests beyond the new end move, one move per hole", )
    states = _names(batch.requests)
    if states != rows:
        row = next((i for i, (a, b) in enumerate(zip(rows, states, strict=False)) if a != b),
                   min(len(rows), len(states)))
        expect_equal(f"condense: self.requests at row {row}", inputs, rows, states,
                     f"row {row}: req_ids says {rows[row] if row < len(rows) else 'nothing'!r} but requests holds "
                     f"{states[row] if row < len(states) else 'nothing'!r}: move both lists together (and drop "
                     "the same trailing holes from both)", equal=lambda a, b: False)
    mapping = dict(batch.req_id_to_index)
    want_mapping = {req_id: row for row, req_id in enumerate(rows)}
    if mapping != want_mapping:
        wrong = sorted((key for key in {*mapping, *want_mapping} if mapping.get(key) != want_mapping.get(key)),
                       key=repr)
        key = wrong[0]
        reason = ("a hole has no request id: a None key means a hole was moved as if it were a request"
                  if key is None else f"request {key!r} is in row {want_mapping.get(key)}")
        expect_equal("condense: req_id_to_index", inputs,
                     dict(sorted(want_mapping.items(), key=lambda kv: repr(kv[0]))),
                     dict(sorted(mapping.items(), key=lambda kv: repr(kv[0]))),
                     f"req_id_to_index[{key!r}] is {mapping.get(key, 'missing')!r}: {reason}; every moved request's "
                     "entry must name its new row", equal=lambda a, b: False)
    moves = list(batch.batch_update_builder.moved)[num_moves_before:]
    replayed, problem = _replay_condense_moves(before, moves)
    if problem is not None:
        expect_equal("condense: the recorded moves", inputs, "one-way moves from occupied rows into holes",
                     moves, problem, equal=lambda a, b: False)
    if replayed != rows:
        expect_equal("condense: the recorded moves", {**inputs, "your recorded moves": moves}, rows, replayed,
                     "your recorded moves, replayed on the rows before condense (what every logits processor "
                     "does), must give your rows: record every move you make, from_row then to_row, in order",
                     equal=lambda a, b: False)
    if len(moves) != len(holes_inside):
        expect_equal("condense: the number of moves", {**inputs, "your recorded moves": moves}, len(holes_inside),
                     len(moves), f"one move per hole inside rows 0..{size - 1} (holes {holes_inside}): each move "
                     "copies a row of every per-request tensor", equal=lambda a, b: False)
    update = batch.get_batch_update()
    got_update = None if update is None else {
        "batch_size": update.batch_size, "added": [row for row, *_ in update.added],
        "moved": [(a, b, getattr(d, "name", d)) for a, b, d in update.moved], "removed": list(update.removed)}
    destinations = {b for _, b, _ in moves}
    allowed = [removed_before, [row for row in removed_before if row not in destinations]]
    changed = bool(removed_before or added_rows or moves)
    want_update = None if not changed else {
        "batch_size": size, "added": added_rows, "moved": [(a, b, getattr(d, "name", d)) for a, b, d in moves],
        "removed": removed_before}
    removed_hint = ("the BatchUpdate the processors get: `removed` lists the finished rows that no add refilled "
                    f"({removed_before}), or those minus the holes your moves filled ({allowed[1]}; vLLM's condense "
                    "takes each hole it fills out of `removed` with pop_removed)")
    if want_update is None or got_update is None:
        expect_equal("condense: the step's BatchUpdate", inputs, want_update, got_update, removed_hint)
        return
    if got_update["removed"] not in allowed:
        expect_equal("condense: the step's BatchUpdate, removed", inputs, " or ".join(map(str, allowed)),
                     got_update["removed"], removed_hint, equal=lambda a, b: False)
    want_update["removed"] = got_update["removed"]
    expect_equal("condense: the step's BatchUpdate", inputs, want_update, got_update, general)


def _condense_cases(seeds: Iterable[int]) -> list[list[tuple[list[str], list[str]]]]:
    """Each case: steps of (finished request ids, new request ids)."""
    cases = [
        [([], ["A", "B", "C", "D"]), (["A", "C"], ["E"])],  # the worked example (vLLM's documented step)
        [([], ["A", "B", "C", "D"]), (["B"], [])],          # C stays put, D fills the hole
        [([], ["A", "B", "C", "D", "E"]), (["B", "C", "E"], [])],
        [([], ["A", "B", "C", "D", "E", "F"]), (["B", "D", "F"], [])],  # the last row is itself a hole
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


def _unreadable(error: Exception, inputs: dict[str, Any]) -> AssertionError:
    """The failure for a batch the learner's condense left in a shape the engine (or the check) cannot use."""
    return AssertionError(
        f"condense: the batch your condense left cannot be used ({type(error).__name__}: {error})\n"
        f"  inputs: {inputs}\n  hint: keep self.req_ids and self.requests lists (row -> id / state, None for a "
        "hole), self.req_id_to_index a dict from request id to row, and record the moves with "
        "self.batch_update_builder.moved_append: the engine goes on adding and removing requests in that batch")


@graded
def check_condense(condense: Callable, seeds: Iterable[int] = range(30)) -> None:
    cases = _condense_cases(seeds)
    for steps in cases:
        batch = InputBatch(max_num_reqs=32)
        last_rows: list[Any] = []
        for index, (finished, new) in enumerate(steps):
            inputs: dict[str, Any] = {"steps (finished, new)": steps[: index + 1],
                                      "rows after your last condense": last_rows}
            try:
                for req_id in finished:
                    batch.remove_request(req_id)
                for req_id in new:
                    batch.add_request(_state(req_id))
                before = list(batch.req_ids)
                before_requests, before_map = list(batch.requests), dict(batch.req_id_to_index)
                removed_before = list(batch.batch_update_builder.removed)
                added_rows = [row for row, *_ in batch.batch_update_builder.added]
                num_moves_before = len(batch.batch_update_builder.moved)
                reference_rows, reference_moves = _reference_condense(before, before_requests, before_map,
                                                                      removed_before)
            except Exception as error:  # noqa: BLE001 - the learner's previous condense broke the batch
                raise _unreadable(error, inputs) from None
            inputs = {
                "steps (finished, new)": steps[: index + 1],
                "rows before condense (None = hole)": before,
                "removed before condense": removed_before,
                "the reference (vLLM's rule) gives": f"rows {reference_rows}, moves {reference_moves}",
            }
            with calling("condense", inputs):
                types.MethodType(condense, batch)()
            try:
                inputs["rows after your condense"] = _names(batch.req_ids)
                _check_condensed(batch, inputs, before, removed_before, added_rows, num_moves_before)
            except AssertionError:
                raise
            except Exception as error:  # noqa: BLE001 - the learner left a batch the check cannot read
                raise _unreadable(error, inputs) from None
            last_rows = inputs["rows after your condense"]
    passed("check_condense", len(cases))


PHASE = Phase("09_logits_processors", (
    Exercise("apply_all_penalties", check_apply_all_penalties, points=4, grade_id="test-penalties",
             part="apply_all_penalties"),
    Exercise("process_dict_updates", check_process_dict_updates, points=3, grade_id="test-dict-updates",
             part="process_dict_updates"),
    Exercise("MinPLogitsProcessor", check_min_p_processor, points=3, grade_id="test-min-p", part="MinPLogitsProcessor"),
    Exercise("LogitBiasLogitsProcessor", check_logit_bias_processor, points=3, grade_id="test-logit-bias",
             part="LogitBiasLogitsProcessor"),
    Exercise("MinTokensLogitsProcessor", check_min_tokens_processor, points=4, grade_id="test-min-tokens",
             part="MinTokensLogitsProcessor"),
    Exercise("condense", check_condense, points=3, grade_id="test-condense", part="condense",
             design="how to condense the persistent batch: which row fills which hole, from the invariants (dense "
                    "rows, requests inside the new size stay put, one recorded one-way move per hole)"),
))
