"""Checks for phase 17 (the capstone), against the helpers of labs/assemble.py.

    check_first_divergence(first_divergence)                 vs labs.assemble.first_divergence
    check_find_breaking_component(find_breaking_component)   vs labs.assemble.find_breaking_component
    check_phase_scores(phase_scores)                         vs labs.assemble.phase_scores

The capstone's exercises write no part of an engine role: they are the tools that judge an assembled engine
(where two runs part, which component breaks exactness, what the report card adds up to).

The bisection's `is_exact` stops a search at its first call over the budget (raised inside the learner's
code), so a loop that never ends fails at once, naming a repeated or empty question, instead of recording
calls until the grading process runs out of memory.

vLLM counterparts: none of the three is a function of vLLM's. The nearest, `check_outputs_equal` and
`check_logprobs_close` in vLLM's tests/models/utils.py, assert where two runs part rather than return it.
"""

from __future__ import annotations

import copy
import functools
import math
import random
from collections.abc import Callable, Iterable
from typing import Any

from labs.assemble import CheckResult, find_breaking_component, first_divergence, phase_scores
from labs.checks.common import calling, counterexample, expect_equal, passed
from labs.checks.grading import graded, import_engine_stack
from labs.manifest import Exercise, Phase

# ---------------------------------------------------------------- first_divergence
FIXED_DIVERGENCES = [
    ([[5, 6, 7], [8, 9]], [[5, 6, 7], [8, 9]]),          # identical
    ([[5, 6, 7], [8, 9, 10]], [[5, 6, 7], [8, 4, 10]]),  # the second prompt, at its second token
    ([[5, 6, 7], [8, 9]], [[5, 1, 7], [2, 9]]),           # two differences: the first prompt's counts
    ([[5, 6, 7]], [[5, 6]]),                               # got stopped early: where the shorter one ends
    ([[5, 6]], [[5, 6, 7]]),                               # got ran on
    ([[5, 6, 7, 8]], [[5, 9]]),                            # lengths differ, but a token differs first
    ([[], [3]], [[], [4]]),                                # an empty output is equal to an empty output
    ([], []),                                              # no prompts at all
]


def _divergence_cases(rng: random.Random) -> list[tuple[list[list[int]], list[list[int]]]]:
    cases = []
    for _ in range(4):
        expected = [[rng.randrange(50) for _ in range(rng.randint(0, 8))] for _ in range(rng.randint(1, 5))]
        got = copy.deepcopy(expected)
        change = rng.choice(["none", "token", "shorter", "longer", "token"])
        index = rng.randrange(len(got))
        if change == "token" and got[index]:
            position = rng.randrange(len(got[index]))
            got[index][position] = (got[index][position] + rng.randint(1, 49)) % 50
        elif change == "shorter" and got[index]:
            del got[index][rng.randrange(len(got[index])):]
        elif change == "longer":
            got[index] += [rng.randrange(50) for _ in range(rng.randint(1, 3))]
        cases.append((expected, got))
    return cases


FIRST_DIVERGENCE_RULE = ("None when every prompt's tokens are equal; else (prompt index, token position) of the first "
                         "difference, prompts in order; when one sequence is a prefix of the other, the position is "
                         "the length of the shorter one")


def _differences(expected_tokens: list[list[int]], got_tokens: list[list[int]]) -> list[tuple[int, int]]:
    """Every (prompt, position) where the two runs differ: each differing token, and where a shorter one ends."""
    found = []
    for index, (want, have) in enumerate(zip(expected_tokens, got_tokens, strict=False)):
        found += [(index, position) for position, (a, b) in enumerate(zip(want, have, strict=False)) if a != b]
        if len(want) != len(have):
            found.append((index, min(len(want), len(have))))
    return found


def _divergence_hint(expected_tokens: list[list[int]], got_tokens: list[list[int]], answer: Any, result: Any) -> str:
    """The rule the failing case exercises, named (never the answer)."""
    if answer is None:
        return ("the two runs are identical, prompt by prompt (an empty output equals an empty output): "
                "return None. " + FIRST_DIVERGENCE_RULE)
    index, position = answer
    want, have = expected_tokens[index], got_tokens[index]
    shorter = min(len(want), len(have))
    prefix_case = position == shorter and len(want) != len(have)
    pair = tuple(result) if isinstance(result, (tuple, list)) and len(result) == 2 else None
    if result is None:
        if prefix_case:
            return (f"prompt {index}: one run stopped earlier, so a prefix is NOT equal: the position is the length "
                    f"of the shorter one. " + FIRST_DIVERGENCE_RULE)
        return f"prompt {index} differs at a token: look at every prompt, token by token. " + FIRST_DIVERGENCE_RULE
    if pair is not None and pair in _differences(expected_tokens, got_tokens):
        if pair[0] == index and pair[1] == shorter and len(want) != len(have):
            return (f"prompt {index}: a token differs at position {position}, before the shorter sequence ends (at "
                    f"{shorter}): the first token position where the two lists differ comes first. "
                    + FIRST_DIVERGENCE_RULE)
        return (f"{pair} is a LATER difference: the runs first part at {answer}; stop at the first. "
                + FIRST_DIVERGENCE_RULE)
    if pair == (position, index) and index != position:
        return "the order of the pair: (prompt index, token position). " + FIRST_DIVERGENCE_RULE
    if pair is not None and pair[0] != index:
        return (f"the FIRST prompt that differs is prompt {index}: scan the prompts in order and stop at the first "
                f"difference. " + FIRST_DIVERGENCE_RULE)
    if prefix_case:
        return (f"prompt {index}: one sequence is a prefix of the other (lengths {len(want)} and {len(have)}): "
                f"the position is the length of the shorter one. " + FIRST_DIVERGENCE_RULE)
    if pair is not None and pair[1] == position + 1:
        return (f"prompt {index}: token positions count from 0, as list indices do (you are one past). "
                + FIRST_DIVERGENCE_RULE)
    return f"prompt {index}: the first token position where the two lists differ. " + FIRST_DIVERGENCE_RULE


@graded
def check_first_divergence(first_divergence_fn: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = list(FIXED_DIVERGENCES)
    for seed in seeds:
        cases += _divergence_cases(random.Random(seed))
    for expected_tokens, got_tokens in cases:
        inputs = {"expected": expected_tokens, "got": got_tokens}
        answer = first_divergence(expected_tokens, got_tokens)
        arguments = copy.deepcopy((expected_tokens, got_tokens))
        with calling("first_divergence", inputs, expected=answer, hint=FIRST_DIVERGENCE_RULE):
            result = first_divergence_fn(*arguments)
        if isinstance(result, list) and len(result) == 2:   # a pair as a list reads the same: accept it
            result = tuple(result)
        if result != answer and answer is not None:
            index = answer[0]
            inputs[f"prompt {index} (where they part)"] = (
                f"expected {expected_tokens[index]}, got {got_tokens[index]}")
        expect_equal("first_divergence(expected, got)", inputs, answer, result,
                     _divergence_hint(expected_tokens, got_tokens, answer, result))
        expect_equal("the arguments after the call", inputs, [expected_tokens, got_tokens], list(arguments),
                     "only read the two runs' outputs, do not change them")
    passed("check_first_divergence", len(cases))


# ---------------------------------------------------------------- find_breaking_component
BISECT_EXAMPLE = ["compute_positions", "compute_slot_mapping", "rms_norm", "apply_rotary",
                  "build_attention_metadata", "apply_temperature", "hash_block_tokens", "check_stop"]


class _OverBudget(AssertionError):
    """is_exact was called past the budget: raised inside the learner's search, so a loop that never ends
    fails at once instead of running (and recording calls) until the machine runs out of memory."""


class _Oracle:
    """is_exact for a set in which `broken` (or nothing) breaks exactness; counts and vets its calls, and stops
    the search with a message once it asks more than the budget allows."""

    def __init__(self, components: list[str], broken: str | None,
                 run: Callable[[list[str]], bool] | None = None) -> None:
        self.components, self.broken, self.run = components, broken, run
        self.calls: list[list[str]] = []
        self.budget = _max_calls(len(components))
        self.over_budget: str | None = None

    def __call__(self, subset: Iterable[str]) -> bool:
        if isinstance(subset, str):  # an AssertionError passes `calling` unchanged: the learner reads this text
            raise AssertionError(  # noqa: TRY004
                f"is_exact was asked about the string {subset!r}: pass a LIST of component names "
                f"(a sub-list of components), e.g. a list of one name")
        subset = list(subset)
        strangers = [name for name in subset if name not in self.components]
        if strangers:
            raise AssertionError(f"is_exact was asked about {strangers}, which are not in `components` "
                                 f"({self.components}): pass sub-lists of components")
        self.calls.append(subset)
        if len(self.calls) > self.budget:
            repeated = subset in self.calls[:-1] or not subset
            self.over_budget = (
                f"is_exact was called a {len(self.calls)}th time, over the budget of 1 + ceil(log2("
                f"{len(self.components)})) = {self.budget} calls for {len(self.components)} components, and the "
                f"search was stopped there"
                + (f"; this call asked about {subset}, " + ("an empty list (nothing plugged is always exact)" if not
                   subset else "a subset it had already asked about") + ": the suspects stopped shrinking (does "
                   "the loop end once one suspect is left?)" if repeated else "")
                + ". Each call runs the engine: halve the suspects with every call instead of trying them one by "
                  "one, and ask no question whose answer you already know")
            raise _OverBudget(self.over_budget)
        if self.run is not None:
            return self.run(subset)
        return self.broken not in subset


def _max_calls(num_components: int) -> int:
    return 1 + math.ceil(math.log2(num_components)) if num_components > 1 else 1


def _bisect_hint(components: list[str], oracle: _Oracle, result: Any) -> str:
    """The rule the failing case exercises, named (never the answer)."""
    whole = "first ask about the whole set: is_exact(components) True means nothing breaks (return None)"
    halve = ("keep the half that is still not exact: when is_exact(half) is False the culprit is in that half, "
             "else it is in the other one")
    if oracle.broken is None:
        return f"the whole set is exact here. {whole}; {halve}"
    if result is None:
        return f"is_exact(components) is False here, so one of them breaks: find it. {whole}; {halve}"
    if result not in components:
        return f"return one of `components` (you returned {result!r}). {halve}"
    return f"{halve}; {whole}"


def _judge_bisect(candidate: Callable, components: list[str], oracle: _Oracle, label: str) -> None:
    inputs: dict[str, Any] = {"components": components,
                              "broken": oracle.broken if oracle.broken else "none of them"}
    if label:
        inputs["engine"] = label
    try:
        with calling("find_breaking_component", inputs, expected=oracle.broken,
                     hint="ask is_exact only about sub-lists of components; each call runs the engine"):
            result = candidate(list(components), oracle)
    except _OverBudget:
        result = None
    if oracle.over_budget is not None:   # also when the search swallowed the error and went on
        raise AssertionError(counterexample(
            "number of is_exact calls", {**inputs, "your calls": _describe_calls(oracle)},
            f"at most {oracle.budget}", f"more than {oracle.budget}", oracle.over_budget)) from None
    if result != oracle.broken:
        inputs["your calls"] = _describe_calls(oracle)
    expect_equal("find_breaking_component(components, is_exact)", inputs, oracle.broken, result,
                 _bisect_hint(components, oracle, result))


def _describe_calls(oracle: _Oracle) -> list[str] | str:
    return [f"is_exact({subset}) -> {'exact' if oracle.broken not in subset else 'NOT exact'}"
            for subset in oracle.calls[:12]] + (["..."] if len(oracle.calls) > 12 else []) or "none"


def _engine_case() -> tuple[list[str], _Oracle]:
    """Real engine components (the reference's code) plus one deliberately broken one, on the shipped model."""
    components, run = _engine_fixture()
    return components, _Oracle(components, "compute_positions", run)


@functools.cache
def _engine_fixture() -> tuple[list[str], Callable[[list[str]], bool]]:
    """The components and a memoized `run(subset)` (an engine per subset, each built once per process: the
    reference's search and the learner's ask about the same subsets)."""
    from labs.plugging import plug
    from mini import LLM, SamplingParams, roles

    components = ["compute_query_start_loc", "compute_slot_mapping", "rms_norm", "apply_rotary",
                  "compute_positions", "apply_temperature", "check_stop"]
    parts = {name: roles.reference(name) for name in components}
    reference_positions = parts["compute_positions"]

    def positions_from_zero(num_computed_tokens, num_scheduled_tokens):  # the slip: forgets the cached tokens
        return reference_positions([0] * len(list(num_computed_tokens)), num_scheduled_tokens)

    parts["compute_positions"] = positions_from_zero
    prompts = [{"prompt_token_ids": [1, 2, 3, 4, 5]}, {"prompt_token_ids": [1, 6, 5, 7, 8, 9, 10]}]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)

    def tokens() -> list[list[int]]:   # an engine built now chooses the parts plugged now
        llm = LLM(skip_tokenizer_init=True, block_size=4, num_gpu_blocks_override=32, max_model_len=64)
        return [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params, use_tqdm=False)]

    expected = tokens()

    answers: dict[frozenset[str], bool] = {}

    def run(subset: list[str]) -> bool:
        key = frozenset(subset)
        if key not in answers:
            with plug(**{name: parts[name] for name in subset}):
                answers[key] = tokens() == expected
        return answers[key]

    if run(["compute_positions"]):  # the fixture itself must break exactness, or the case proves nothing
        raise RuntimeError("check_find_breaking_component: the broken compute_positions no longer changes "
                           "the shipped model's greedy tokens; pick another slip")
    return components, run


@graded
def check_find_breaking_component(find_breaking_component_fn: Callable, seeds: Iterable[int] = range(20)) -> None:
    num_cases = 0
    fixed = [(BISECT_EXAMPLE, "apply_rotary"), (BISECT_EXAMPLE, None), (BISECT_EXAMPLE, "compute_positions"),
             (BISECT_EXAMPLE, "check_stop"), (["rms_norm"], "rms_norm"), (["rms_norm"], None), ([], None),
             (["a", "b", "c"], "c")]
    for components, broken in fixed:
        _judge_bisect(find_breaking_component_fn, components, _Oracle(components, broken), "")
        num_cases += 1
    for seed in seeds:
        rng = random.Random(seed)
        components = [f"part_{index}" for index in range(rng.randint(1, 40))]
        rng.shuffle(components)
        broken = rng.choice(components + [None])
        assert find_breaking_component(components, _Oracle(components, broken)) == broken  # the reference agrees
        _judge_bisect(find_breaking_component_fn, components, _Oracle(components, broken), "")
        num_cases += 1
    components, oracle = _engine_case()
    _judge_bisect(find_breaking_component_fn, components, oracle,
                  "the shipped model, greedy; is_exact plugs the subset and compares the tokens")
    passed("check_find_breaking_component", num_cases + 1)


# ---------------------------------------------------------------- phase_scores
OUTCOMES = ("passed", "failed", "not implemented", "skipped")
EXAMPLE_CARD = [
    CheckResult("01_paged_kv", "FreeKVCacheBlockQueue", 4, "passed"),
    CheckResult("01_paged_kv", "get_new_blocks", 2, "failed", "get_new_blocks(...): wrong result on this case"),
    CheckResult("07_attention_kernel", "online_softmax_update", 2, "passed"),
    CheckResult("07_attention_kernel", "_store_kv_kernel", 2, "skipped", "needs Triton"),
    CheckResult("13_serving", "merge_delta_outputs", 2, "not implemented"),
]


def _card_cases(rng: random.Random) -> list[list[CheckResult]]:
    phases = ["00_autoregressive_loop", "05_scheduler", "07_attention_kernel", "10_prefix_caching"]
    cards = []
    for _ in range(3):
        card = []
        for index in range(rng.randint(0, 10)):
            outcome = rng.choice(OUTCOMES)
            card.append(CheckResult(rng.choice(phases), f"exercise_{index}", rng.randint(1, 5), outcome))
        cards.append(card)
    cards.append([CheckResult("07_attention_kernel", "k", 2, "skipped"),
                  CheckResult("07_attention_kernel", "w", 1, "skipped")])
    return cards


def _describe(card: list[CheckResult]) -> list[tuple[str, int, str]]:
    return [(r.phase, r.points, r.outcome) for r in card]


PHASE_SCORES_RULE = ("{phase: (earned, possible)} with phases in order of first appearance; passed earns its "
                     "points, other outcomes 0; skipped counts toward neither (a phase of skips is (0, 0))")


def _scores_hint(card: list[CheckResult], expected: dict, got: Any) -> tuple[str, str | None]:
    """(the rule the failing case exercises, the first phase whose score differs, with its results)."""
    if not isinstance(got, dict):
        return f"return a dict, not a {type(got).__name__}. " + PHASE_SCORES_RULE, None
    if set(got) != set(expected):
        missing = [phase for phase in expected if phase not in got]
        extra = [phase for phase in got if phase not in expected]
        where = (f"missing phases {missing}" if missing else "") + (f" unexpected phases {extra}" if extra else "")
        if missing and all(expected[phase] == (0, 0) for phase in missing):
            return ("every phase that appears gets an entry, even one whose results are all skipped: (0, 0). "
                    + PHASE_SCORES_RULE), where.strip()
        return PHASE_SCORES_RULE, where.strip()
    for phase, score in expected.items():
        have = tuple(got[phase]) if isinstance(got[phase], (list, tuple)) else got[phase]
        if have == score:
            continue
        rows = [(r.exercise, r.points, r.outcome) for r in card if r.phase == phase]
        where = f"phase {phase!r}: expected {score}, got {have}; its results (exercise, points, outcome): {rows}"
        if not isinstance(have, tuple) or len(have) != 2:
            return "each score is a pair (earned, possible). " + PHASE_SCORES_RULE, where
        counted = (sum(r[2] == "passed" for r in rows), sum(r[2] != "skipped" for r in rows))
        if have == counted and counted != score:
            return ("each result counts its POINTS, not 1: you counted results. " + PHASE_SCORES_RULE), where
        if have[1] != score[1] and any(r[2] == "skipped" for r in rows):
            return ("possible points: skipped counts toward neither (it is not held against you). "
                    + PHASE_SCORES_RULE), where
        if have[0] != score[0]:
            return "earned points: passed earns its points, other outcomes 0. " + PHASE_SCORES_RULE, where
        return "possible points: every outcome but skipped counts. " + PHASE_SCORES_RULE, where
    return ("the phases' order: dicts keep insertion order, and the card wants phases in order of first "
            "appearance. " + PHASE_SCORES_RULE), f"expected order {list(expected)}, got {list(got)}"


@graded
def check_phase_scores(phase_scores_fn: Callable, seeds: Iterable[int] = range(20)) -> None:
    cards = [EXAMPLE_CARD]
    for seed in seeds:
        cards += _card_cases(random.Random(seed))
    for card in cards:
        inputs: dict[str, Any] = {"results (phase, points, outcome)": _describe(card)}
        expected_dict = phase_scores(card)
        expected = list(expected_dict.items())
        with calling("phase_scores", inputs, expected=expected_dict, hint=PHASE_SCORES_RULE):
            got = phase_scores_fn(list(card))
        got_items = list(got.items()) if isinstance(got, dict) else got
        if isinstance(got_items, list):
            got_items = [(item[0], tuple(item[1])) if isinstance(item, tuple) and len(item) == 2
                         and isinstance(item[1], list) else item for item in got_items]
        if got_items != expected:
            hint, where = _scores_hint(card, expected_dict, got)
            if where:
                inputs["where they differ"] = where
            expect_equal("phase_scores(results), in order", inputs, expected, got_items, hint)
    passed("check_phase_scores", len(cards))


# Imported once in the grading process before it forks a child per check (labs/checks/grading.py).
WARM_UP = (import_engine_stack,)


PHASE = Phase("17_capstone", (
    Exercise("first_divergence", check_first_divergence, points=2, grade_id="test-first-divergence"),
    Exercise("find_breaking_component", check_find_breaking_component, points=3,
             grade_id="test-find-breaking-component",
             design="the search: which subsets to ask is_exact about, so one culprit among n components is always "
                    "found within 1 + ceil(log2 n) engine runs"),
    Exercise("phase_scores", check_phase_scores, points=2, grade_id="test-phase-scores"),
))
