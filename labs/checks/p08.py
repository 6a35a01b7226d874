"""Checks for phase 08 (the vectorized sampler), against mini.sample.

    check_apply_temperature(apply_temperature)   vs mini.sample.sampler.apply_temperature
    check_apply_top_k_top_p(apply_top_k_top_p)   vs mini.sample.ops.topk_topp.apply_top_k_top_p
    check_random_sample(random_sample)           vs mini.sample.ops.topk_topp_sampler.random_sample
    check_gather_logprobs(gather_logprobs)       vs mini.sample.logprobs.gather_logprobs

The first case of each is the phase's worked example: three rows over a 5-token vocabulary with
probabilities [0.05, 0.40, 0.10, 0.30, 0.15]. Top-k / top-p are also checked for being branch-free:
the number of torch calls must not grow with the number of rows (no Python loop over rows).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from typing import Any

import torch

from labs.checks.common import CountTorchCalls, calling, expect_equal, passed
from labs.manifest import Exercise, Phase
from mini.sample.logprobs import gather_logprobs as reference_gather_logprobs
from mini.sample.ops.topk_topp import apply_top_k_top_p as reference_top_k_top_p
from mini.sample.ops.topk_topp_sampler import random_sample as reference_random_sample
from mini.sample.sampler import apply_temperature as reference_apply_temperature

WORKED_PROBS = [0.05, 0.40, 0.10, 0.30, 0.15]


def worked_logits() -> torch.Tensor:
    """The phase's example: three copies of log([0.05, 0.40, 0.10, 0.30, 0.15])."""
    return torch.tensor(WORKED_PROBS).log().repeat(3, 1)


def _short_tensor(values: torch.Tensor) -> list:
    return [[round(float(x), 4) for x in row] for row in values] if values.dim() == 2 else values.tolist()


def _expect_tensor(what: str, inputs: dict, expected: torch.Tensor, got: Any, hint: str) -> None:
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
        expect_equal(
            what, inputs, _short_tensor(expected), _short_tensor(got), hint, equal=lambda a, b: False
        )


# ---------------------------------------------------------------- temperature
def check_apply_temperature(apply_temperature: Callable, seeds: Iterable[int] = range(20)) -> None:
    cases = [
        (worked_logits(), torch.tensor([1.0, 0.5, 0.0]), False),
        (worked_logits(), torch.tensor([2.0, 0.5, 0.7]), True),
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
        with calling("apply_temperature", inputs, expected=expected):
            got = apply_temperature(logits.clone(), temperature.clone(), all_random)
        _expect_tensor(
            "apply_temperature",
            inputs,
            expected,
            got,
            "divide each row by its own temperature; a greedy row (temperature < SAMPLING_EPS) "
            "is divided by 1, never by 0",
        )
    passed("check_apply_temperature", len(cases))


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


def check_apply_top_k_top_p(apply_top_k_top_p: Callable, seeds: Iterable[int] = range(30)) -> None:
    cases = _top_k_top_p_cases(seeds)
    for logits, k, p in cases:
        inputs = _inputs(logits, k, p)
        expected = reference_top_k_top_p(logits.clone(), _clone(k), _clone(p))
        with calling("apply_top_k_top_p", inputs, expected=expected):
            got = apply_top_k_top_p(logits.clone(), _clone(k), _clone(p))
        _expect_tensor(
            "apply_top_k_top_p",
            inputs,
            expected,
            got,
            "kept tokens keep their exact logit, the others become -inf. Top-k keeps every token "
            ">= the k-th largest (k <= 0 or >= vocab: off); top-p (on the top-k survivors) sorts "
            "ascending, drops a token while the cumulative probability up to it is <= 1 - p "
            "(<=, not <), and always keeps the most likely token; p = 1 is off: it drops nothing, "
            "not even a token whose probability underflows to 0",
        )
    with calling("apply_top_k_top_p", {"note": "16 and 128 rows of 50 logits, to count torch calls"}):
        few, many = _count_calls(apply_top_k_top_p, 16), _count_calls(apply_top_k_top_p, 128)
    expect_equal(
        "apply_top_k_top_p is branch-free",
        {"torch calls with 16 rows": few},
        f"<= {few + 8} calls with 128 rows",
        f"{many} calls with 128 rows",
        "no Python loop over rows: one sort, per-row "
        "thresholds with gather, one masked_fill and one scatter serve the whole batch",
        equal=lambda expected, got: many <= few + 8,
    )
    passed("check_apply_top_k_top_p", len(cases) + 1)


# ---------------------------------------------------------------- the exponential race
def _generators(seeds_by_row: dict[int, int]) -> dict[int, torch.Generator]:
    return {row: torch.Generator().manual_seed(seed) for row, seed in seeds_by_row.items()}


def _chi_square(counts: list[int], probs: list[float]) -> float:
    total = sum(counts)
    return sum((c - total * q) ** 2 / (total * q) for c, q in zip(counts, probs) if q > 0)


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


def check_random_sample(random_sample: Callable, seeds: Iterable[int] = range(20)) -> None:
    hint = (
        "race[row] ~ Exp(1) per token, drawn for a seeded row with exponentials_(race[row], generator) "
        "(all V values, in token order, once per call; vLLM's `race[row].exponential_(generator=...)` "
        "is accepted too); the token is argmax(probs / race) per row"
    )
    num_cases = 0
    worked = torch.tensor(WORKED_PROBS).repeat(3, 1)
    cases = [(worked, {0: 0, 1: 1, 2: 2})]
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
        for call in ("first call", "second call (same generators)"):
            expected = reference_random_sample(probs.clone(), expected_gens).tolist()
            expected_vllm = _race_with_tensor_exponential(probs.clone(), vllm_gens).tolist()
            with calling("random_sample", inputs, expected=expected):
                got = random_sample(probs.clone(), got_gens)
            got = got.tolist() if isinstance(got, torch.Tensor) else got
            expect_equal(
                f"random_sample ({call}) length",
                inputs,
                len(expected),
                len(got) if isinstance(got, list) else got,
                "one token id per row",
            )
            for row, token in enumerate(got):
                valid = 0 <= int(token) < probs.shape[1] and bool(probs[row, int(token)] > 0)
                expect_equal(
                    f"random_sample ({call}) token of row {row}",
                    inputs,
                    "a token with probability > 0",
                    token if valid else f"{token} (probability 0)",
                    "a row never samples a token of probability 0",
                    equal=lambda _a, _b, ok=valid: ok,
                )
            got_seeded = {row: got[row] for row in seeded_rows}
            if got_seeded != {row: expected_vllm[row] for row in seeded_rows}:
                expect_equal(
                    f"random_sample ({call}) seeded rows",
                    inputs,
                    {row: expected[row] for row in seeded_rows},
                    got_seeded,
                    hint,
                )
            num_cases += 1
        # batch independence: each seeded row alone gives the same token as in the batch
        batch = random_sample(probs.clone(), _generators(seeded_rows)).tolist()
        for row, seed in seeded_rows.items():
            with calling("random_sample", inputs):
                alone = random_sample(
                    probs[row : row + 1].clone(), {0: torch.Generator().manual_seed(seed)}
                ).tolist()
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
        counts = torch.bincount(torch.as_tensor(tokens), minlength=len(probs)).tolist()
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
        for name, hint in (
            (
                "logprob_token_ids",
                (
                    "column 0: the sampled token; columns 1..N: the top-N token ids, best first "
                    "(N = vocab_size when num_logprobs is -1)"
                ),
            ),
            ("logprobs", "the logprobs of those same tokens, read from the input (no recomputation)"),
            (
                "selected_token_ranks",
                "1-based rank of the sampled token: how many tokens have a logprob >= its",
            ),
        ):
            _expect_tensor(
                f"gather_logprobs(...).{name}",
                inputs,
                getattr(expected, name),
                getattr(got, name, None),
                hint,
            )
    passed("check_gather_logprobs", len(cases))


PHASE = Phase("08_sampler", (
    Exercise("apply_temperature", check_apply_temperature, points=2, grade_id="test-temperature", part="apply_temperature"),
    Exercise("apply_top_k_top_p", check_apply_top_k_top_p, points=4, grade_id="test-top-k-top-p", part="apply_top_k_top_p"),
    Exercise("random_sample", check_random_sample, points=3, grade_id="test-random-sample", part="random_sample"),
    Exercise("gather_logprobs", check_gather_logprobs, points=3, grade_id="test-gather-logprobs", part="gather_logprobs"),
))
