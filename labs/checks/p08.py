"""Checks for phase 08 (the vectorized sampler), against mini.sample.

    check_apply_temperature(apply_temperature)   vs mini.sample.sampler.apply_temperature
    check_apply_bad_words(apply_bad_words)       vs mini.sample.ops.bad_words.apply_bad_words
    check_apply_top_k_top_p(apply_top_k_top_p)   vs mini.sample.ops.topk_topp.apply_top_k_top_p
    check_random_sample(random_sample)           vs mini.sample.ops.topk_topp_sampler.random_sample
    check_gather_logprobs(gather_logprobs)       vs mini.sample.logprobs.gather_logprobs

The first case of each is the phase's worked example: three rows over a 5-token vocabulary with
probabilities [0.05, 0.40, 0.10, 0.30, 0.15]. Top-k / top-p are also checked for being branch-free:
the number of torch calls must not grow with the number of rows (no Python loop over rows).

`expect_same_generations` compares a plugged engine's outputs with the reference engine's, request by
request and step by step (the notebooks' "Plug it in" cells of phases 08 and 09 use it).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from typing import Any

import torch

from labs.checks.common import (
    CountTorchCalls,
    calling,
    counterexample,
    expect_equal,
    first_differing_entry,
    passed,
)
from labs.checks.grading import graded
from labs.manifest import Exercise, Phase
from mini.sample.logprobs import gather_logprobs as reference_gather_logprobs
from mini.sample.ops.bad_words import apply_bad_words as reference_apply_bad_words
from mini.sample.ops.topk_topp import apply_top_k_top_p as reference_top_k_top_p
from mini.sample.ops.topk_topp_sampler import exponentials_
from mini.sample.ops.topk_topp_sampler import random_sample as reference_random_sample
from mini.sample.sampler import apply_temperature as reference_apply_temperature
from mini.sampling_params import SAMPLING_EPS

WORKED_PROBS = [0.05, 0.40, 0.10, 0.30, 0.15]


def worked_logits() -> torch.Tensor:
    """The phase's example: three copies of log([0.05, 0.40, 0.10, 0.30, 0.15])."""
    return torch.tensor(WORKED_PROBS).log().repeat(3, 1)


def _short_tensor(values: torch.Tensor) -> list:
    if values.dim() != 2:
        return values.tolist()
    if not values.is_floating_point():
        return values.tolist()
    return [[round(float(x), 4) for x in row] for row in values]


def _expect_tensor(what: str, inputs: dict, expected: torch.Tensor, got: Any, hint: str,
                   locate: Callable[[int, int], str] | None = None) -> None:
    """`got` vs `expected` (-inf == -inf, no NaN allowed); `locate(row, column)` names the first wrong entry."""
    __tracebackhide__ = True
    if not isinstance(got, torch.Tensor):
        raise AssertionError(  # noqa: TRY004 - a failed check, not a caller's type error
            f"{what}: expected a torch.Tensor, got {type(got).__name__}\n  inputs: {inputs}"
        )
    expect_equal(f"{what} shape", inputs, tuple(expected.shape), tuple(got.shape), hint)
    expect_equal(
        f"{what} NaN",
        inputs,
        False,
        bool(torch.isnan(got).any()),
        "no NaN may appear, even in rows that are entirely -inf",
    )
    same_inf = torch.equal(torch.isinf(expected), torch.isinf(got))
    finite = torch.isfinite(expected)
    same = same_inf and torch.equal(expected[finite], got.to(expected.dtype)[finite])
    if not same:
        where = first_differing_entry(expected, got.to(expected.dtype)) if expected.dim() == 2 else None
        if locate is not None and where is not None:
            inputs = {**inputs, "first wrong entry": locate(*where)}
        expect_equal(
            what, inputs, _short_tensor(expected), _short_tensor(got), hint, equal=lambda a, b: False
        )


# ---------------------------------------------------------------- temperature
def _expect_temperature(inputs: dict, logits: torch.Tensor, temperature: torch.Tensor, all_random: bool,
                        expected: torch.Tensor, got: Any) -> None:
    """The learner's tempered logits vs the reference's, located: the first wrong (row, token), the row's
    temperature, and what that row must become (divided by its temperature, or by 1 when it is greedy)."""
    __tracebackhide__ = True
    if not isinstance(got, torch.Tensor):
        expect_equal("apply_temperature", inputs, f"the [N, V] logits tensor (shape {tuple(expected.shape)})",
                     f"{type(got).__name__}", "return the logits (dividing them in place is fine, as vLLM "
                     "does; then return that same tensor)", equal=lambda a, b: False)
    expect_equal("apply_temperature shape", inputs, tuple(expected.shape), tuple(got.shape),
                 "return the [N, V] logits, each row divided by its own temperature")
    where = first_differing_entry(expected, got.to(expected.dtype))
    if where is None:
        return
    row, token = where
    value = float(temperature[row])
    before, after = float(logits[row, token]), float(got[row, token])
    divisor = f" (you divided it by {before / after:.4g})" if after not in (0.0, math.inf, -math.inf) else ""
    if value < SAMPLING_EPS and not all_random:
        exactly = "" if value == 0 else ", as any temperature below SAMPLING_EPS is, not only exactly 0"
        hint = (f"row {row} is greedy (its temperature is {value:g}{exactly}): its token was already taken by "
                "argmax, so divide it by 1, never by 0 or by its tiny temperature: it must stay finite and unchanged")
    else:
        hint = (f"divide each row by its own temperature: row {row} by {value:g}, so its logit {before:.4g} becomes "
                f"{before / value:.4g}{divisor}")
    expect_equal(
        f"apply_temperature: row {row}, token {token}",
        {**inputs, "row": row, "its temperature": value,
         "its logits before": _short_tensor(logits[row:row + 1])[0],
         "expected row": _short_tensor(expected[row:row + 1])[0], "got row": _short_tensor(got[row:row + 1])[0]},
        float(expected[row, token]), float(got[row, token]), hint)


@graded
def check_apply_temperature(apply_temperature: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = [
        (worked_logits(), torch.tensor([1.0, 0.5, 0.0]), False),
        (worked_logits(), torch.tensor([2.0, 0.5, 0.7]), True),
        # greedy is "below SAMPLING_EPS", not only exactly 0
        (worked_logits(), torch.tensor([1e-6, 0.25, 3.0]), False),
    ]
    for seed in seeds:
        rng = torch.Generator().manual_seed(seed)
        num_rows, vocab_size = (
            int(torch.randint(1, 6, (), generator=rng)),
            int(torch.randint(2, 40, (), generator=rng)),
        )
        temperature = torch.rand(num_rows, generator=rng) * 2 + 0.05
        all_random = bool(seed % 2)
        if not all_random:
            temperature[torch.rand(num_rows, generator=rng) < 0.4] = 0.0
        cases.append((torch.randn(num_rows, vocab_size, generator=rng) * 3, temperature, all_random))
    for logits, temperature, all_random in cases:
        inputs = {
            "logits": _short_tensor(logits),
            "temperature": temperature.tolist(),
            "all_random": all_random,
        }
        expected = reference_apply_temperature(logits.clone(), temperature.clone(), all_random)
        given_temperature = temperature.clone()
        with calling("apply_temperature", inputs, expected=expected):
            got = apply_temperature(logits.clone(), given_temperature, all_random)
        _expect_temperature(inputs, logits, temperature, all_random, expected, got)
        expect_equal(
            "apply_temperature: the `temperature` tensor after your call",
            inputs,
            temperature.tolist(),
            given_temperature.tolist(),
            "do not change `temperature` in place: the sampler reads it again after you, to tell greedy rows "
            "from random ones when it merges the two (a greedy row whose temperature you set to 1 would then "
            "be sampled at random)",
        )
    passed("check_apply_temperature", len(cases))


# ---------------------------------------------------------------- bad words
# The phase's worked example: vocabulary of 8, five rows.
WORKED_BAD_WORDS: dict[int, list[list[int]]] = {
    0: [[5], [2, 3, 4]],   # output ends with 2, 3: both 5 (a one-token word) and 4 are banned
    2: [[2, 3, 4]],        # output ends with 3, 2: the prefix [2, 3] is not at the end: nothing banned
    3: [[6, 7]],           # no output yet: the prefix [6] cannot match: nothing banned
    4: [[1, 6, 7], [1, 5]],  # output is exactly [1, 6]: 7 is banned; [1, 5] needs a 1 LAST: 5 stays
}
WORKED_BAD_WORDS_OUTPUTS = [[7, 2, 3], [2, 3], [2, 3, 3, 2], [], [1, 6]]


def worked_bad_words_logits() -> torch.Tensor:
    return torch.arange(40, dtype=torch.float32).view(5, 8) / 10


def _bad_words_cases(seeds: Iterable[int]) -> list[tuple[torch.Tensor, dict[int, list[list[int]]], list[list[int]]]]:
    cases = [(worked_bad_words_logits(), WORKED_BAD_WORDS, WORKED_BAD_WORDS_OUTPUTS)]
    for seed in seeds:
        rng = random.Random(3000 + seed)
        num_rows, vocab_size = rng.randint(1, 6), rng.randint(5, 16)
        hot = rng.sample(range(vocab_size), 4)  # few distinct tokens: prefixes match often
        outputs = [[rng.choice(hot) for _ in range(rng.randint(0, 7))] for _ in range(num_rows)]
        bad_words: dict[int, list[list[int]]] = {}
        for row in range(num_rows):
            if rng.random() < 0.25:
                continue
            words = []
            for _ in range(rng.randint(1, 3)):
                length = rng.randint(1, 4)
                past = outputs[row]
                kind = rng.random()
                if kind < 0.4 and len(past) >= length - 1:       # the output ends with its prefix: banned
                    prefix = past[len(past) - (length - 1):] if length > 1 else []
                elif kind < 0.6 and len(past) >= length:         # the prefix, one token too early
                    prefix = past[len(past) - length:-1]
                elif kind < 0.7:                                 # the prefix is the whole output and more
                    prefix = [rng.choice(hot)] + list(past)
                else:
                    prefix = [rng.choice(hot) for _ in range(length - 1)]
                words.append(list(prefix) + [rng.randrange(vocab_size)])
            bad_words[row] = words
        logits = torch.randn(num_rows, vocab_size, generator=torch.Generator().manual_seed(seed))
        cases.append((logits, bad_words, outputs))
    return cases


@graded
def check_apply_bad_words(apply_bad_words: Callable, seeds: Iterable[int] = range(40)) -> None:
    cases = _bad_words_cases(seeds)
    for logits, bad_words, outputs in cases:
        inputs = {"logits": _short_tensor(logits), "bad_words_token_ids": bad_words, "output_token_ids": outputs}
        expected = reference_apply_bad_words(logits.clone(), bad_words, [list(o) for o in outputs])
        got_logits = logits.clone()
        with calling("apply_bad_words", inputs, expected=expected):
            got = apply_bad_words(got_logits, {r: [list(w) for w in ws] for r, ws in bad_words.items()},
                                  [list(o) for o in outputs])
        got = got_logits if got is None else got   # vLLM's edits in place and returns None
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            expect_equal("apply_bad_words", inputs, f"a tensor of shape {tuple(expected.shape)}",
                         got if not isinstance(got, torch.Tensor) else f"shape {tuple(got.shape)}",
                         "return the [N, V] logits (edited in place)", equal=lambda a, b: False)
        where = first_differing_entry(expected, got)
        if where is None:
            continue
        row, token = where
        banned_expected = bool(expected[row, token] == -math.inf)
        words, past = bad_words.get(row, []), outputs[row]
        if banned_expected:
            word = next(w for w in words if w[-1] == token and len(w) - 1 <= len(past)
                        and past[len(past) - (len(w) - 1):] == w[:-1])
            if len(word) == 1:
                hint = (f"token {token} is the one-token bad word {word} of row {row}: its prefix is empty, and "
                        "every output ends with an empty prefix, so it is always banned: it must become -inf")
            else:
                whole = ("; here the prefix is the whole output, which counts too" if len(word) - 1 == len(past)
                         else "")
                hint = (f"token {token} ends the bad word {word} of row {row}, and the output so far ENDS with "
                        f"{word[:-1]} (its last {len(word) - 1} tokens{whole}): it must become -inf")
        elif token in [t for w in words for t in w[:-1]] and not any(w[-1] == token for w in words):
            hint = ("ban only the LAST token of a bad word: the tokens before it were already generated, "
                    "they are the prefix the output must end with")
        else:
            ending = [w for w in words if w[-1] == token]
            if not ending:
                hint = (f"token {token} ends none of row {row}'s bad words ({words or 'it has none'}): leave it "
                        "exactly as it was")
            else:
                word = ending[0]
                prefix = word[:-1]
                if len(prefix) > len(past):
                    why = (f"the output {past} is shorter than the prefix {prefix}: it cannot end with it "
                           "(nothing before the output counts)")
                else:
                    tail = past[len(past) - len(prefix):]
                    why = f"the output {past} does not END with {prefix}: its last {len(prefix)} tokens are {tail}"
                    if any(past[i:i + len(prefix)] == prefix for i in range(len(past) - len(prefix) + 1)):
                        why += f" ({prefix} occurs earlier in it, but only the end counts)"
                    elif past[:len(prefix)] == prefix:
                        why += f" (it STARTS with {prefix}, but only the end counts)"
                hint = (f"token {token} ends the bad word {word} of row {row}, but {why}: it would not complete "
                        "the word, so it stays exactly as it was")
        expect_equal(
            f"apply_bad_words: row {row}, token {token}",
            {"row": row, "its bad words": words, "its output so far": past,
             "its logits": _short_tensor(logits[row:row + 1])[0]},
            float(expected[row, token]),
            float(got[row, token]),
            hint,
        )
    passed("check_apply_bad_words", len(cases))


# ---------------------------------------------------------------- plug it in
def _non_default(params: Any) -> dict[str, Any]:
    import dataclasses

    from mini.sampling_params import SamplingParams

    default = SamplingParams()
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)
            if f.init and not f.name.startswith("_") and getattr(params, f.name) != getattr(default, f.name)}


def expect_same_generations(prompts: list, params: list, expected: list, got: list) -> None:
    """The plugged engine's outputs vs the reference engine's, request by request, step by step: raises
    an AssertionError naming the first request and step whose token (or logprobs) differ."""
    __tracebackhide__ = True
    for index, (prompt, sampling, want, have) in enumerate(zip(prompts, params, expected, got, strict=False)):
        want_ids, have_ids = list(want.outputs[0].token_ids), list(have.outputs[0].token_ids)
        request = {"request": index, "prompt": prompt, "params (non-default)": _non_default(sampling)}
        if want_ids != have_ids:
            step = next((i for i, (a, b) in enumerate(zip(want_ids, have_ids, strict=False)) if a != b),
                        min(len(want_ids), len(have_ids)))
            raise AssertionError(counterexample(
                f"Plug it in: request {index} differs at step {step} (its token number {step})",
                {**request, "tokens both engines agree on": want_ids[:step],
                 "reference tokens": want_ids, "your engine's tokens": have_ids},
                want_ids[step] if step < len(want_ids) else "(finished)",
                have_ids[step] if step < len(have_ids) else "(finished)",
                "this request's knobs are the ones your parts handle: run your exercise's check, then "
                "compare your function with the reference on the step shown"))
        want_lp, have_lp = want.outputs[0].logprobs, have.outputs[0].logprobs
        if want_lp != have_lp:
            step = next((i for i, (a, b) in enumerate(zip(want_lp or [], have_lp or [], strict=False)) if a != b), 0)
            raise AssertionError(counterexample(
                f"Plug it in: request {index}'s logprobs differ at step {step}", request,
                (want_lp or [None])[step] if want_lp else None, (have_lp or [None])[step] if have_lp else None,
                "the logprobs come from gather_logprobs: column 0 the sampled token, then the top-N"))
    print(f"ok: the plugged engine gives the same tokens as the reference on all {len(prompts)} requests")


# ---------------------------------------------------------------- top-k / top-p
def _top_k_top_p_cases(
    seeds: Iterable[int],
) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]:
    inf = float("inf")
    cases: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = [
        # the worked example: k=2 | p=0.5 (the boundary token 0.30 is kept) | k=3 and p=0.6
        (worked_logits(), torch.tensor([2, 0, 3]), torch.tensor([1.0, 0.5, 0.6])),
        (worked_logits(), torch.tensor([1, 5, 2]), None),
        (worked_logits(), None, torch.tensor([0.3, 0.75, 1.0])),
        (worked_logits(), None, None),  # both off: bit-identical
        (torch.randn(4, 9, generator=torch.Generator().manual_seed(7)), None, torch.ones(4)),  # p = 1
        (
            torch.randn(3, 9, generator=torch.Generator().manual_seed(8)),
            torch.tensor([0, -1, 9]),
            torch.ones(3),
        ),
        # a grammar mask: one row entirely -inf, one with a single allowed token
        (
            torch.tensor([[-inf] * 6, [-inf, -inf, 1.5, -inf, -inf, -inf], [0.1, 0.2, -inf, 0.3, -inf, 0.0]]),
            torch.tensor([2, 2, 2]),
            torch.tensor([0.5, 0.9, 0.8]),
        ),
        # the boundary rule is `<=`: probabilities [0.25, 0.25, 0.5] and p = 0.5 keep only the 0.5 token
        # (the cumulative sum 0.25 + 0.25 reaches 1 - p exactly), in either order of the vocabulary
        (torch.tensor([[0.25, 0.25, 0.5], [0.5, 0.25, 0.25]]).log(), None, torch.tensor([0.5, 0.5])),
        # p = 1 must keep a token whose probability underflows to exactly 0 (exp(-200) in float32):
        # 1 - p = 0, and a cumulative sum of 0 is <= 0, so "p = 1" needs its own "drop nothing" rule
        (torch.tensor([[0.0, -200.0, 1.0, -150.0]]), None, torch.tensor([1.0])),
        (torch.tensor([[0.0, -200.0, 1.0, -150.0], [-300.0, 2.0, 0.5, 0.0]]), torch.tensor([0, 4]),
         torch.tensor([1.0, 1.0])),
        # a tiny p: 1 - p rounds to 1.0 in float32, so every cumulative sum is <= it; the most likely
        # token must still be kept
        (torch.tensor([[0.3, 1.2, -0.4, 0.9], [2.0, 2.0, 0.0, -1.0]]), None, torch.tensor([1e-8, 1e-8])),
        # ties at the k-th value are kept
        (torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.5, 2.0]]), torch.tensor([2]), None),
        (torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.5, 2.0]]), torch.tensor([2]), torch.tensor([0.99])),
    ]
    for seed in seeds:
        rng = torch.Generator().manual_seed(1000 + seed)
        num_rows = int(torch.randint(1, 9, (), generator=rng))
        vocab_size = int(torch.randint(2, 65, (), generator=rng))
        logits = torch.randn(num_rows, vocab_size, generator=rng) * float(
            torch.rand((), generator=rng) * 4 + 0.5
        )
        if seed % 3 == 0:  # a grammar-like mask on some rows
            mask = torch.rand(num_rows, vocab_size, generator=rng) < 0.7
            logits[mask & (torch.rand(num_rows, 1, generator=rng) < 0.5)] = -inf
        k = None
        if seed % 4 != 1:
            k = torch.randint(-1, vocab_size + 2, (num_rows,), generator=rng)
        p = None
        if seed % 4 != 2:
            p = torch.rand(num_rows, generator=rng) * 0.95 + 0.05
            p[torch.rand(num_rows, generator=rng) < 0.25] = 1.0
        cases.append((logits, k, p))
    return cases


def _inputs(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> dict:
    return {
        "logits": _short_tensor(logits),
        "k": None if k is None else k.tolist(),
        "p": None if p is None else [round(float(x), 4) for x in p],
    }


def _clone(value: torch.Tensor | None) -> torch.Tensor | None:
    return None if value is None else value.clone()


def _count_calls(apply_top_k_top_p: Callable, num_rows: int) -> int:
    rng = torch.Generator().manual_seed(num_rows)
    logits = torch.randn(num_rows, 50, generator=rng)
    k = torch.randint(1, 50, (num_rows,), generator=rng)
    p = torch.rand(num_rows, generator=rng) * 0.9 + 0.05
    with CountTorchCalls() as counter:
        apply_top_k_top_p(logits, k, p)
    return counter.count


def _ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def _top_k_top_p_hint(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None, row: int, token: int,
                      expected: torch.Tensor, got: torch.Tensor) -> tuple[str, str]:
    """(what, hint) for the first wrong entry: which cut the token is inside or outside of, with the numbers."""
    values = logits[row]
    vocab_size = values.shape[0]
    k_value = None if k is None else int(k[row])
    p_value = None if p is None else float(p[row])
    k_on = k_value is not None and 0 < k_value < vocab_size
    p_on = p_value is not None and p_value < 1.0
    logit = float(values[token])
    rank = int((values > values[token]).sum()) + 1
    knobs = (f"k={k_value if k_on else 'off'}" + (f" ({k_value})" if k_value is not None and not k_on else "")
             + f", p={p_value if p_on else 'off'}" + (f" ({p_value})" if p_value is not None and not p_on else ""))
    what = f"apply_top_k_top_p: row {row} ({knobs}), token {token}"
    want_kept = bool(torch.isfinite(expected[row, token]))
    got_value = float(got[row, token])
    if torch.equal(expected[row].sort().values, got[row].sort().values):
        return what, (f"row {row} holds the right values in the wrong places: give the result in vocabulary order "
                      "(each logit at its own token id, as it came in), not in sorted order")
    if want_kept and math.isfinite(got_value):
        return what, (f"token {token} is kept, so it keeps its exact logit {logit:.6g} (you wrote {got_value:.6g}): "
                      "write -inf into the dropped tokens only, nothing else, and give the result in vocabulary "
                      "order (each logit at its own token id, not in sorted order)")
    if not want_kept and not math.isfinite(logit):
        return what, (f"token {token} was already -inf in the input (a grammar mask, say): it must stay -inf")
    finite = torch.isfinite(values)
    kth = float(values.sort(descending=True).values[k_value - 1]) if k_on else None
    survivors = values.masked_fill(values < kth, -math.inf) if k_on else values
    probs = survivors.softmax(dim=-1) if bool(torch.isfinite(survivors).any()) else torch.zeros_like(values)
    above = float(probs[survivors > values[token]].sum())
    full_above = float(values.softmax(dim=-1)[values > values[token]].sum()) if bool(finite.any()) else 0.0
    tied_top = bool(values[token] == values.max())
    if want_kept:   # the reference keeps it, you dropped it
        if not k_on and not p_on:
            return what, ("this row has no cut (k off and p = 1 is off): it must come out bit-identical, every token "
                          "kept, even one whose probability underflows to 0 (a cumulative probability of 0 must not "
                          "drop anything when p = 1)")
        if tied_top:
            return what, (f"token {token} is the row's most likely token (logit {logit:.6g}): it is always kept, "
                          "whatever p (even when p is so small that 1 - p rounds to 1 in float32)")
        if k_on and kth is not None and logit == kth:
            return what, (f"token {token} ties with the {_ordinal(k_value)} largest logit ({kth:.6g}): ties with the "
                          f"k-th largest value are kept (top-k keeps every token whose logit is >= it)")
        return what, (f"token {token} is inside the nucleus: the tokens more likely than it hold {above:.6g} of the "
                      f"probability (renormalized over the top-k survivors), less than p = {p_value:.4g}; a token is "
                      "dropped only once the more likely ones already reach p, so the one that crosses p stays")
    if k_on and kth is not None and logit < kth:
        return what, (f"token {token} is outside the top-{k_value}: it is the {_ordinal(rank)} largest, its logit "
                      f"{logit:.6g} is below the {_ordinal(k_value)} largest ({kth:.6g}) of its own row: it must "
                      "be -inf (each row has its own k)")
    note = ""
    if math.isclose(above, p_value or 0.0, rel_tol=1e-5, abs_tol=1e-7):
        note = (" exactly: the mass above it reaching p is enough to drop it (the cumulative rule is <=, not <, "
                "from the least likely end)")
    elif k_on and full_above < (p_value or 0.0):
        note = (f". Over the whole row (before top-k) they would hold only {full_above:.6g}: top-p acts on the "
                "top-k survivors, renormalized")
    return what, (f"token {token} is outside the nucleus: the tokens more likely than it already hold {above:.6g} "
                  f"of the probability (renormalized over the top-k survivors), >= p = {p_value:.4g}{note}")


def _expect_top_k_top_p(inputs: dict, logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None,
                        expected: torch.Tensor, got: Any) -> None:
    __tracebackhide__ = True
    general = ("kept tokens keep their exact logit, the others become -inf; each row has its own k and p "
               "(k <= 0 or >= V: no top-k; p >= 1: no top-p)")
    if not isinstance(got, torch.Tensor):
        expect_equal("apply_top_k_top_p", inputs, f"a tensor of shape {tuple(expected.shape)}",
                     type(got).__name__, "return the [N, V] logits with the dropped tokens set to -inf",
                     equal=lambda a, b: False)
    expect_equal("apply_top_k_top_p shape", inputs, tuple(expected.shape), tuple(got.shape), general)
    expect_equal("apply_top_k_top_p NaN", inputs, False, bool(torch.isnan(got).any()),
                 "no NaN may appear, even in rows that are entirely -inf (a grammar mask can leave a row "
                 "with no finite logit)")
    where = first_differing_entry(expected, got.to(expected.dtype))
    if where is None:
        return
    row, token = where
    what, hint = _top_k_top_p_hint(logits, k, p, row, token, expected, got.to(expected.dtype))
    expect_equal(
        what,
        {**inputs, f"row {row}'s logits": _short_tensor(logits[row:row + 1])[0],
         f"row {row} expected": _short_tensor(expected[row:row + 1])[0],
         f"row {row} got": _short_tensor(got[row:row + 1])[0]},
        float(expected[row, token]),
        float(got[row, token]),
        hint,
    )


@graded
def check_apply_top_k_top_p(apply_top_k_top_p: Callable, seeds: Iterable[int] = range(30)) -> None:
    cases = _top_k_top_p_cases(seeds)
    for logits, k, p in cases:
        inputs = _inputs(logits, k, p)
        expected = reference_top_k_top_p(logits.clone(), _clone(k), _clone(p))
        with calling("apply_top_k_top_p", inputs, expected=expected,
                     hint="k <= 0 or k >= the vocabulary size means no top-k for that row, p >= 1 no top-p; "
                          "k and p may each be None (no row uses it)"):
            got = apply_top_k_top_p(logits.clone(), _clone(k), _clone(p))
        _expect_top_k_top_p(inputs, logits, k, p, expected, got)
    with calling("apply_top_k_top_p", {"note": "16 and 128 rows of 50 logits, to count torch calls"}):
        few, many = _count_calls(apply_top_k_top_p, 16), _count_calls(apply_top_k_top_p, 128)
    expect_equal(
        "apply_top_k_top_p is branch-free",
        {"torch calls with 16 rows": few},
        f"<= {few + 8} calls with 128 rows",
        f"{many} calls with 128 rows",
        "no Python loop over rows: a few whole-batch operations must serve every row, each with its own "
        "k and p held as per-row tensors",
        equal=lambda expected, got: many <= few + 8,
    )
    passed("check_apply_top_k_top_p", len(cases) + 1)


# ---------------------------------------------------------------- the exponential race
def _generators(seeds_by_row: dict[int, int]) -> dict[int, torch.Generator]:
    return {row: torch.Generator().manual_seed(seed) for row, seed in seeds_by_row.items()}


def _chi_square(counts: list[int], probs: list[float]) -> float:
    total = sum(counts)
    return sum((c - total * q) ** 2 / (total * q) for c, q in zip(counts, probs, strict=False) if q > 0)


def _race_with_tensor_exponential(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """vLLM's draw (`random_sample` in vllm/v1/sample/ops/topk_topp_sampler.py): `Tensor.exponential_`.

    mini's reference draws the same Exp(1) distribution as -log(U) (`exponentials_`, faster on CPU), which
    gives other numbers for the same seed; the check accepts a seeded row drawn either way."""
    noise = torch.empty_like(probs)
    if len(generators) != probs.shape[0]:
        noise.exponential_()
    for row, generator in generators.items():
        noise[row].exponential_(generator=generator)
    return probs.div_(noise).argmax(dim=-1).view(-1)


def _token_ids(what: str, inputs: dict, got: Any, num_rows: int) -> list[int]:
    """The learner's sampled tokens as a list of ints, after checking they are an int tensor of shape [N]."""
    __tracebackhide__ = True
    hint = "return an integer tensor of shape [N]: one token id per row (not [N, 1], not the probabilities)"
    if not isinstance(got, torch.Tensor):
        expect_equal(what, inputs, f"a torch.Tensor of shape ({num_rows},)", type(got).__name__, hint,
                     equal=lambda a, b: False)
    expect_equal(f"{what} shape", inputs, (num_rows,), tuple(got.shape), hint)
    expect_equal(f"{what} dtype", inputs, "an integer dtype (int64, as argmax gives)", str(got.dtype), hint,
                 equal=lambda _a, _b: not got.is_floating_point() and not got.is_complex()
                 and got.dtype != torch.bool)
    return [int(token) for token in got.tolist()]


def _race_explanation(probs: torch.Tensor, seeds_by_row: dict[int, int], got: list[int], row: int,
                      call: int = 0) -> str:
    """Row `row`'s race as its own generator runs it; when every seeded row's token matches a known wrong race
    (probs / Uniform, probs x E, the smallest ratio), say which."""
    vocab_size = probs.shape[1]

    def draw(seed: int, uniform: bool = False) -> torch.Tensor:
        """This call's V draws of a generator seeded `seed` (a second call goes on from the first one's)."""
        generator = torch.Generator().manual_seed(seed)
        values = torch.empty(call + 1, vocab_size)
        for index in range(call + 1):
            if uniform:
                values[index].uniform_(generator=generator)
            else:
                exponentials_(values[index], generator)
        return values[call]

    def races(seed: int) -> dict[str, int]:
        draws, uniform = draw(seed), draw(seed, uniform=True)
        ratio = probs[seeded] / draws
        return {"winner": int(ratio.argmax()), "smallest": int(ratio.argmin()),
                "times": int((probs[seeded] * draws).argmax()), "uniform": int((probs[seeded] / uniform).argmax())}

    by_row = {}
    for seeded, seed in seeds_by_row.items():
        by_row[seeded] = races(seed)
    draws = draw(seeds_by_row[row])
    ratio = probs[row] / draws
    which = (f"the first {vocab_size} draws" if call == 0 else
             f"draws {vocab_size + 1}..{2 * vocab_size} (the second call goes on from the first)")
    text = (f"its E are {which} of its own generator (seed {seeds_by_row[row]}): "
            f"E = {[round(float(x), 3) for x in draws]}, probs / E = {[round(float(x), 3) for x in ratio]}: "
            f"token {by_row[row]['winner']} wins the race; you returned {got[row]}")
    if len(seeds_by_row) < 2:
        return text

    def every_row(rule: str) -> bool:
        return all(got[r] == races_of[rule] for r, races_of in by_row.items())

    if every_row("uniform") or every_row("times"):
        text += (" (every seeded row's token is the winner of probs / U with Uniform draws U, or of probs x E: "
                 "the race divides probs by Exp(1) draws)")
    elif every_row("smallest"):
        text += " (every seeded row's token has the SMALLEST probs / E: the largest wins)"
    return text


@graded
def check_random_sample(random_sample: Callable, seeds: Iterable[int] = range(20)) -> None:
    hint = (
        "a seeded row draws its V values of Exp(1) noise from its OWN generator (the row's key in `generators`), "
        "in token order, once per call, with exponentials_ on that row (vLLM's `Tensor.exponential_(generator=...)` "
        "is accepted too); the other rows use the global generator; the token is the race's winner"
    )
    num_cases = 0
    worked = torch.tensor(WORKED_PROBS).repeat(3, 1)
    cases = [(worked, {0: 0, 1: 1, 2: 2}), (worked, {1: 7})]
    for seed in seeds:
        rng = random.Random(seed)
        num_rows, vocab_size = rng.randint(1, 6), rng.randint(2, 50)
        logits = torch.randn(num_rows, vocab_size, generator=torch.Generator().manual_seed(seed)) * 2
        logits[
            torch.rand(num_rows, vocab_size, generator=torch.Generator().manual_seed(seed + 1)) < 0.3
        ] = -math.inf
        logits[:, rng.randrange(vocab_size)] = 0.0  # every row keeps a token
        seeded_rows = {row: rng.randrange(10**6) for row in range(num_rows) if rng.random() < 0.6}
        cases.append((logits.softmax(dim=-1), seeded_rows))
    for probs, seeded_rows in cases:
        inputs = {"probs": _short_tensor(probs), "seeds of the seeded rows": seeded_rows}
        expected_gens, got_gens = _generators(seeded_rows), _generators(seeded_rows)
        vllm_gens = _generators(seeded_rows)
        for call_index, call in enumerate(("first call", "second call (same generators)")):
            expected = reference_random_sample(probs.clone(), expected_gens).tolist()
            expected_vllm = _race_with_tensor_exponential(probs.clone(), vllm_gens).tolist()
            with calling("random_sample", inputs, expected=expected):
                got = random_sample(probs.clone(), got_gens)
            got = _token_ids(f"random_sample ({call})", inputs, got, probs.shape[0])
            for row, token in enumerate(got):
                valid = 0 <= token < probs.shape[1] and bool(probs[row, token] > 0)
                expect_equal(
                    f"random_sample ({call}) token of row {row}",
                    inputs,
                    "a token with probability > 0",
                    token if valid else f"{token} (probability 0)",
                    "a row never samples a token of probability 0 (nor an id outside the vocabulary)",
                    equal=lambda _a, _b, ok=valid: ok,
                )
            got_seeded = {row: got[row] for row in seeded_rows}
            expected_seeded = {row: expected[row] for row in seeded_rows}
            if got_seeded not in (expected_seeded, {row: expected_vllm[row] for row in seeded_rows}):
                wrong_row = next(row for row in seeded_rows if got[row] != expected[row])
                race = _race_explanation(probs, seeded_rows, got, wrong_row, call_index)
                expect_equal(
                    f"random_sample ({call}) seeded rows: row {wrong_row}",
                    inputs,
                    expected_seeded,
                    got_seeded,
                    f"row {wrong_row}: {race}.\n  In general: {hint}",
                )
            num_cases += 1
        # batch independence: each seeded row alone gives the same token as in the batch
        with calling("random_sample", inputs):
            batch = random_sample(probs.clone(), _generators(seeded_rows))
        batch = _token_ids("random_sample", inputs, batch, probs.shape[0])
        for row, seed in seeded_rows.items():
            with calling("random_sample", inputs):
                alone = random_sample(
                    probs[row : row + 1].clone(), {0: torch.Generator().manual_seed(seed)}
                )
            alone = _token_ids("random_sample (one row)", inputs, alone, 1)
            expect_equal(
                f"random_sample: seeded row {row} alone vs in the batch",
                inputs,
                batch[row],
                alone[0],
                "a seeded row must draw from its own generator only, whatever else is in the batch",
            )
            num_cases += 1

    # the distribution: 4000 unseeded rows, then 500 seeded rows, of the worked example
    probs = torch.tensor(WORKED_PROBS + [0.0])
    for what, generators in (
        ("unseeded", {}),
        ("seeded", {row: torch.Generator().manual_seed(row) for row in range(500)}),
    ):
        num_rows = 4000 if not generators else 500
        torch.manual_seed(0)
        with calling("random_sample", {"probs": probs.tolist(), "rows": num_rows, "rows seeded": what}):
            tokens = random_sample(probs.repeat(num_rows, 1), generators)
        tokens = _token_ids("random_sample", {"probs": probs.tolist(), "rows": num_rows}, tokens, num_rows)
        outside = [token for token in tokens if not 0 <= token < len(probs)]
        expect_equal(f"random_sample ({what} rows): token ids", {"probs": probs.tolist(), "rows": num_rows},
                     f"ids in 0..{len(probs) - 1}", f"{outside[:5]} among them", "one token id per row, in the "
                     "vocabulary", equal=lambda _a, _b, ok=not outside: ok)
        counts = torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=len(probs)).tolist()
        statistic = _chi_square(counts, probs.tolist())
        expect_equal(
            f"random_sample frequencies ({what} rows)",
            {"probs": probs.tolist(), "rows": num_rows},
            f"counts close to {[round(num_rows * q) for q in probs.tolist()]} (chi-square < 25)",
            f"counts {counts}, chi-square {statistic:.1f}",
            "token j must win the race with probability probs[j]: divide by Exp(1) noise, not uniform",
            equal=lambda _a, _b, ok=statistic < 25 and counts[-1] == 0: ok,
        )
        num_cases += 1
    passed("check_random_sample", num_cases)


# ---------------------------------------------------------------- logprobs
def _rank_hint(logprobs: torch.Tensor, token_ids: torch.Tensor, expected: torch.Tensor, got: Any, hint: str) -> str:
    """The general hint, preceded by the first wrong row's count when `got` is a same-shaped tensor."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return hint
    wrong = (expected != got.to(expected.dtype)).nonzero().flatten().tolist()
    if not wrong:
        return hint
    row = wrong[0]
    token = int(token_ids[row])
    at_least = (logprobs[row] >= logprobs[row, token]).nonzero().flatten().tolist()
    return (f"row {row}: the sampled token {token} has logprob {float(logprobs[row, token]):.4f}; the tokens whose "
            f"logprob is >= it are {at_least[:12]}{' ...' if len(at_least) > 12 else ''}: rank {len(at_least)}, "
            f"you gave {int(got[row])}. In general: {hint}")


def _locate_logprobs(row: int, column: int) -> str:
    return (f"row {row}, column {column}: " + ("the sampled token" if column == 0 else "the most likely token"
            if column == 1 else f"the {_ordinal(column)} most likely token"))


@graded
def check_gather_logprobs(gather_logprobs: Callable, seeds: Iterable[int] = range(20)) -> None:
    worked = torch.tensor(WORKED_PROBS).log().repeat(3, 1).log_softmax(dim=-1)
    cases = [
        (worked, 2, torch.tensor([1, 4, 0])),
        (worked, 0, torch.tensor([3, 3, 2])),
        (worked, -1, torch.tensor([2, 1, 0])),
        # ties: the rank counts every token at least as likely (ties share the worse rank)
        (torch.tensor([[0.0, 0.0, -1.0, 0.0]]).log_softmax(dim=-1), 0, torch.tensor([1])),
    ]
    for seed in seeds:
        rng = torch.Generator().manual_seed(2000 + seed)
        num_rows, vocab_size = (
            int(torch.randint(1, 7, (), generator=rng)),
            int(torch.randint(2, 60, (), generator=rng)),
        )
        logprobs = (torch.randn(num_rows, vocab_size, generator=rng) * 3).log_softmax(dim=-1)
        num_logprobs = [0, 1, 3, 5, -1][seed % 5]
        num_logprobs = min(num_logprobs, vocab_size)
        cases.append((logprobs, num_logprobs, torch.randint(0, vocab_size, (num_rows,), generator=rng)))
    for logprobs, num_logprobs, token_ids in cases:
        inputs = {
            "logprobs": _short_tensor(logprobs),
            "num_logprobs": num_logprobs,
            "token_ids": token_ids.tolist(),
        }
        expected = reference_gather_logprobs(logprobs.clone(), num_logprobs, token_ids.clone())
        with calling("gather_logprobs", inputs, expected=expected):
            got = gather_logprobs(logprobs.clone(), num_logprobs, token_ids.clone())
        missing = [name for name in ("logprob_token_ids", "logprobs", "selected_token_ranks") if not hasattr(got, name)]
        expect_equal("gather_logprobs: what it returns", inputs, "LogprobsTensors(logprob_token_ids, logprobs, "
                     "selected_token_ranks)", type(got).__name__ + (f" without {missing}" if missing else ""),
                     "return LogprobsTensors(...) with its three fields", equal=lambda _a, _b, ok=not missing: ok)
        width = logprobs.shape[1] if num_logprobs == -1 else num_logprobs
        for name, hint in (
            (
                "logprob_token_ids",
                (
                    f"[N, 1 + {width}]: column 0 the sampled token; columns 1..{width} the top-{width} token ids, "
                    "most likely first (num_logprobs = -1 means the whole vocabulary)"
                ),
            ),
            ("logprobs", ("the logprobs of those same tokens, column for column, read from the input (no "
                          "recomputation)")),
            (
                "selected_token_ranks",
                ("[N]: the sampled token's 1-based rank, the number of tokens whose logprob is >= its own (so "
                 "tied tokens share the worse rank)"),
            ),
        ):
            if name == "selected_token_ranks":
                hint = _rank_hint(logprobs, token_ids, expected.selected_token_ranks, got.selected_token_ranks, hint)
            _expect_tensor(
                f"gather_logprobs(...).{name}",
                inputs,
                getattr(expected, name),
                getattr(got, name),
                hint,
                locate=_locate_logprobs if name != "selected_token_ranks" else None,
            )
    passed("check_gather_logprobs", len(cases))


PHASE = Phase("08_sampler", (
    Exercise("apply_temperature", check_apply_temperature, points=1, grade_id="test-temperature",
             part="apply_temperature"),
    Exercise("apply_bad_words", check_apply_bad_words, points=4, grade_id="test-bad-words", part="apply_bad_words"),
    Exercise("apply_top_k_top_p", check_apply_top_k_top_p, points=5, grade_id="test-top-k-top-p",
             part="apply_top_k_top_p",
             design="the branch-free algorithm: how a few batched operations give every row its own top-k and "
                    "top-p cut (ties, the boundary token, p = 1 bit-identical, fully masked rows), from the contract "
                    "of what is kept"),
    Exercise("random_sample", check_random_sample, points=3, grade_id="test-random-sample", part="random_sample"),
    Exercise("gather_logprobs", check_gather_logprobs, points=3, grade_id="test-gather-logprobs",
             part="gather_logprobs"),
))
