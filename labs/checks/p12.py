"""Checks for phase 12 (speculative decoding), against the engine's reference parts (mini/roles.py).

    check_propose_ngram(propose_ngram)                    vs mini.spec_decode.ngram_proposer.propose_ngram
    check_compute_residual_probs(compute_residual_probs)  vs mini.sample.rejection_sampler.compute_residual_probs
    check_rejection_sample(rejection_sample)              vs mini.sample.rejection_sampler.rejection_sample
    check_rollback_spec_tokens(rollback_spec_tokens)      vs mini.core.sched.scheduler.rollback_spec_tokens

The first case of each is the phase's worked example. The rejection sampler is random: greedy rows must
match the reference exactly; random rows must be well formed (accepted drafts, then one recovered or bonus
token, then -1), reproducible with the same generators, independent of the other rows of the batch when
seeded, and, over thousands of rows, the first token out must follow the target distribution p (a
chi-square bound), whatever the draft distribution q was.

vLLM counterparts: `propose_ngram` is `_find_longest_matched_ngram_and_propose_tokens`
(vllm/v1/spec_decode/ngram_proposer.py; numba-jitted, but plain Python inside), which passes this check
(tests/test_course_vllm_answers_p12.py). vLLM's rejection sampler exists only as Triton kernels
(vllm/v1/sample/rejection_sampler.py: `rejection_greedy_sample_kernel`, `rejection_random_sample_kernel`,
`sample_recovered_tokens_kernel`, driven by `rejection_sample`); run under Triton's interpreter, it passes
`check_rejection_sample`. `compute_residual_probs` has no counterpart (the kernel never normalises the
residual), nor has `rollback_spec_tokens` (inline code in `Scheduler.update_from_output`,
vllm/v1/core/sched/scheduler.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

import torch

from labs.checks.common import calling, expect_equal, passed
from labs.manifest import Exercise, Phase
from mini import roles

PLACEHOLDER_TOKEN_ID = -1
# Chi-square bound for 4 degrees of freedom (5 tokens): a correct sampler exceeds it with probability ~2e-6.
CHI_SQUARE_BOUND = 30.0


def _reference(name: str) -> Callable:
    """The engine's own implementation of part `name` (its module is imported on first use)."""
    return roles.reference(name)


def _short_tensor(values: torch.Tensor) -> list:
    if values.dim() == 2:
        return [[round(float(x), 4) for x in row] for row in values]
    return [round(float(x), 4) for x in values] if values.is_floating_point() else values.tolist()


def _as_list(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if hasattr(value, "tolist"):       # numpy
        return value.tolist()
    return list(value) if isinstance(value, (list, tuple)) else value


# ---------------------------------------------------------------- propose_ngram
NGRAM_HINT = ("try n = max_n, max_n - 1, ..., min_n: look for the last n tokens earlier in token_ids (a match "
              "must start before the suffix itself; it may overlap it); at the first n that matches, return up "
              "to k tokens that follow its EARLIEST match; [] if no n matches; never propose past max_model_len")


NGRAM_WORKED = [
    {"token_ids": [1, 2, 3, 4, 1, 2, 3], "min_n": 2, "max_n": 2, "k": 3, "max_model_len": None},
    {"token_ids": [1, 2, 3, 4, 1, 2, 3], "min_n": 2, "max_n": 4, "k": 3, "max_model_len": None},
    {"token_ids": [1, 2, 3, 4, 5], "min_n": 1, "max_n": 3, "k": 2, "max_model_len": None},      # no match
    {"token_ids": [7, 8, 9, 7, 8], "min_n": 2, "max_n": 3, "k": 5, "max_model_len": None},      # fewer than k
    {"token_ids": [5, 5, 5, 5], "min_n": 2, "max_n": 3, "k": 4, "max_model_len": None},         # overlapping
    {"token_ids": [1, 2, 3, 9, 2, 3, 7, 1, 2, 3], "min_n": 2, "max_n": 3, "k": 2, "max_model_len": None},
    {"token_ids": [3, 1, 2, 3, 1, 2, 3, 4, 2, 3], "min_n": 1, "max_n": 4, "k": 3, "max_model_len": None},
    {"token_ids": [1, 2, 3, 4, 1, 2, 3], "min_n": 2, "max_n": 3, "k": 3, "max_model_len": 9},   # capped at 2
    {"token_ids": [1, 2, 3, 4, 1, 2, 3], "min_n": 2, "max_n": 3, "k": 3, "max_model_len": 7},   # no room
    {"token_ids": [4], "min_n": 1, "max_n": 2, "k": 2, "max_model_len": None},
]


def _random_ngram_case(rng: random.Random) -> dict[str, Any]:
    vocab = rng.randint(2, 5)
    tokens = [rng.randrange(vocab) for _ in range(rng.randint(1, 24))]
    min_n = rng.randint(1, 3)
    return {"token_ids": tokens, "min_n": min_n, "max_n": rng.randint(min_n, 5), "k": rng.randint(1, 5),
            "max_model_len": rng.choice([None, None, len(tokens) + rng.randint(0, 3)])}


def check_propose_ngram(propose_ngram: Callable, seeds: Iterable[int] = range(30)) -> None:
    reference = _reference("propose_ngram")
    cases = list(NGRAM_WORKED)
    for seed in seeds:
        rng = random.Random(seed)
        cases += [_random_ngram_case(rng) for _ in range(3)]
    for case in cases:
        expected = [int(t) for t in reference(list(case["token_ids"]), case["min_n"], case["max_n"], case["k"],
                                              case["max_model_len"])]
        token_ids = list(case["token_ids"])
        with calling("propose_ngram", case, expected=expected, hint=NGRAM_HINT):
            got = propose_ngram(token_ids, case["min_n"], case["max_n"], case["k"], case["max_model_len"])
        got = _as_list(got)
        got = [int(t) for t in got] if isinstance(got, list) else got
        expect_equal("propose_ngram(...)", case, expected, got, NGRAM_HINT)
        expect_equal("token_ids after the call", case, case["token_ids"], token_ids,
                     "propose_ngram must not change token_ids")
    passed("check_propose_ngram", len(cases))


# ---------------------------------------------------------------- compute_residual_probs
RESIDUAL_HINT = ("residual = max(0, p - q) row by row, divided by its row sum; when draft_probs is None, q is "
                 "one-hot at the row's draft token (an n-gram draft is certain), so the draft's own "
                 "probability is removed from p")

WORKED_TARGET = [[0.5, 0.3, 0.2, 0.0], [0.1, 0.6, 0.2, 0.1]]
WORKED_DRAFT = [[0.2, 0.5, 0.2, 0.1], [0.7, 0.1, 0.1, 0.1]]
WORKED_DRAFT_TOKENS = [1, 0]


def _random_probs(generator: torch.Generator, num_rows: int, vocab_size: int, scale: float = 2.0) -> torch.Tensor:
    logits = torch.randn(num_rows, vocab_size, generator=generator) * scale
    return logits.softmax(dim=-1)


def _residual_cases(seed: int) -> list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    num_rows, vocab_size = rng.randint(1, 6), rng.randint(2, 24)
    target = _random_probs(generator, num_rows, vocab_size)
    draft = _random_probs(generator, num_rows, vocab_size)
    tokens = torch.randint(vocab_size, (num_rows,), generator=generator)
    return [(target, draft, tokens), (target, None, tokens)]


def check_compute_residual_probs(compute_residual_probs: Callable, seeds: Iterable[int] = range(20)) -> None:
    reference = _reference("compute_residual_probs")
    cases = [(torch.tensor(WORKED_TARGET), torch.tensor(WORKED_DRAFT), torch.tensor(WORKED_DRAFT_TOKENS)),
             (torch.tensor(WORKED_TARGET), None, torch.tensor(WORKED_DRAFT_TOKENS))]
    for seed in seeds:
        cases += _residual_cases(seed)
    for target, draft, tokens in cases:
        inputs = {"target_probs": _short_tensor(target),
                  "draft_probs": None if draft is None else _short_tensor(draft),
                  "draft_token_ids": tokens.tolist()}
        expected = reference(target.clone(), None if draft is None else draft.clone(), tokens.clone())
        target_in, draft_in, tokens_in = target.clone(), None if draft is None else draft.clone(), tokens.clone()
        with calling("compute_residual_probs", inputs, expected=_short_tensor(expected), hint=RESIDUAL_HINT):
            got = compute_residual_probs(target_in, draft_in, tokens_in)
        if not isinstance(got, torch.Tensor):
            expect_equal("compute_residual_probs(...) type", inputs, "a torch.Tensor [N, V]",
                         type(got).__name__, RESIDUAL_HINT)
        expect_equal("compute_residual_probs(...) shape", inputs, tuple(expected.shape), tuple(got.shape),
                     "one row per draft token, one column per vocabulary entry")
        same = bool(torch.allclose(got.to(expected.dtype), expected, atol=1e-5, rtol=1e-4))
        expect_equal("compute_residual_probs(...)", inputs, _short_tensor(expected), _short_tensor(got),
                     RESIDUAL_HINT, equal=lambda _a, _b, ok=same: ok)
        unchanged = torch.equal(target_in, target) and (draft is None or torch.equal(draft_in, draft))
        expect_equal("the inputs after the call", inputs, "unchanged", "unchanged" if unchanged else "changed",
                     "compute a new tensor: the target (and draft) probabilities are used again afterwards",
                     equal=lambda _a, _b, ok=unchanged: ok)
    passed("check_compute_residual_probs", len(cases))


# ---------------------------------------------------------------- rejection_sample
REJECTION_HINT = (
    "walk each row's drafts in order: a greedy row accepts a draft iff it equals argmax(target_probs) and "
    "otherwise emits that argmax; a random row accepts with probability min(1, p(draft) / q(draft)) (q = 1 "
    "without draft_probs) and otherwise emits a sample of the residual max(0, p - q); stop at the first "
    "rejection; if every draft was accepted, append the row's bonus token; pad with -1 to [B, max_k + 1]"
)


def _generators(seeds_by_row: dict[int, int]) -> dict[int, torch.Generator]:
    return {row: torch.Generator().manual_seed(seed) for row, seed in seeds_by_row.items()}


def _rejection_case(seed: int) -> dict[str, Any]:
    """A small random batch: rows with 0..k drafts, greedy and random rows, some seeded, q or no q."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(1000 + seed)
    batch_size, vocab_size = rng.randint(1, 5), rng.randint(3, 12)
    max_k = rng.randint(1, 5)
    num_draft_tokens = [rng.randint(0, max_k) for _ in range(batch_size)]
    num_tokens = sum(num_draft_tokens)
    target = _random_probs(generator, num_tokens, vocab_size, scale=rng.choice([1.0, 3.0]))
    if num_tokens and rng.random() < 0.4:     # some tokens the target rules out (p = 0)
        target[torch.rand(target.shape, generator=generator) < 0.3] = 0.0
        target[torch.arange(num_tokens), torch.randint(vocab_size, (num_tokens,), generator=generator)] += 0.2
        target = target / target.sum(dim=-1, keepdim=True)
    draft = _random_probs(generator, num_tokens, vocab_size) if rng.random() < 0.5 else None
    draft_tokens = []
    for t in range(num_tokens):
        if rng.random() < 0.5:
            draft_tokens.append(int(target[t].argmax()))
        elif draft is not None:
            draft_tokens.append(int(torch.multinomial(draft[t], 1, generator=generator)))
        else:
            draft_tokens.append(rng.randrange(vocab_size))
    is_greedy = [rng.random() < 0.5 for _ in range(batch_size)]
    seeds = {row: rng.randrange(10**6) for row in range(batch_size) if not is_greedy[row] and rng.random() < 0.6}
    return {
        "draft_token_ids": torch.tensor(draft_tokens, dtype=torch.int64),
        "num_draft_tokens": num_draft_tokens,
        "draft_probs": draft,
        "target_probs": target,
        "bonus_token_ids": torch.randint(vocab_size, (batch_size,), generator=generator),
        "is_greedy": torch.tensor(is_greedy, dtype=torch.bool),
        "seeds": seeds,
    }


def _worked_rejection_case() -> dict[str, Any]:
    """Two greedy rows over 4 tokens: row 0 drafts [1, 0] (draft 1 agrees with the argmax, draft 2 does
    not); row 1 drafts [2] (agrees): all accepted, so its bonus token follows."""
    target = torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.2, 0.1, 0.6, 0.1], [0.1, 0.1, 0.7, 0.1]])
    return {
        "draft_token_ids": torch.tensor([1, 0, 2]), "num_draft_tokens": [2, 1], "draft_probs": None,
        "target_probs": target, "bonus_token_ids": torch.tensor([3, 0]),
        "is_greedy": torch.tensor([True, True]), "seeds": {},
    }


def _case_inputs(case: dict[str, Any]) -> dict[str, Any]:
    return {
        "draft_token_ids": case["draft_token_ids"].tolist(),
        "num_draft_tokens": case["num_draft_tokens"],
        "draft_probs": None if case["draft_probs"] is None else _short_tensor(case["draft_probs"]),
        "target_probs": _short_tensor(case["target_probs"]),
        "bonus_token_ids": case["bonus_token_ids"].tolist(),
        "is_greedy": case["is_greedy"].tolist(),
        "generators (row: seed)": case["seeds"],
    }


def _call(function: Callable, case: dict[str, Any], generators: dict[int, torch.Generator]) -> Any:
    return function(
        case["draft_token_ids"].clone(), list(case["num_draft_tokens"]),
        None if case["draft_probs"] is None else case["draft_probs"].clone(), case["target_probs"].clone(),
        case["bonus_token_ids"].clone(), case["is_greedy"].clone(), generators,
    )


def _rows(name: str, got: Any, inputs: dict[str, Any], shape: tuple[int, int]) -> list[list[int]]:
    __tracebackhide__ = True
    if not isinstance(got, torch.Tensor):
        expect_equal(f"{name}(...) type", inputs, f"an int64 torch.Tensor of shape {list(shape)}",
                     type(got).__name__, REJECTION_HINT)
    expect_equal(f"{name}(...) shape", inputs, shape, tuple(got.shape),
                 "one row per request, max(num_draft_tokens) + 1 columns (room for every draft and the bonus)")
    return [[int(t) for t in row] for row in got.tolist()]


def _check_row_shape(row_index: int, row: list[int], case: dict[str, Any], inputs: dict[str, Any]) -> None:
    """A random row: accepted drafts, then one recovered (residual > 0) or the bonus token, then -1."""
    __tracebackhide__ = True
    start = sum(case["num_draft_tokens"][:row_index])
    num_drafts = case["num_draft_tokens"][row_index]
    drafts = case["draft_token_ids"][start:start + num_drafts].tolist()
    target, draft_probs = case["target_probs"], case["draft_probs"]
    what = f"rejection_sample(...) row {row_index} (a random row; drafts {drafts})"
    accepted = 0
    while accepted < num_drafts and row[accepted] == drafts[accepted]:
        t = start + accepted
        expect_equal(what, inputs, f"draft {drafts[accepted]} at position {accepted} rejected (p = 0 there)", row,
                     "a draft the target gives probability 0 is always rejected",
                     equal=lambda _a, _b, ok=bool(target[t, drafts[accepted]] > 0): ok)
        accepted += 1
    if accepted < num_drafts:
        t, token = start + accepted, row[accepted]
        draft = drafts[accepted]
        p_draft = float(target[t, draft])
        q_draft = 1.0 if draft_probs is None else float(draft_probs[t, draft])
        expect_equal(what, inputs, f"draft {draft} at position {accepted} accepted (p = {p_draft:.3f} >= "
                     f"q = {q_draft:.3f})", row,
                     "min(1, p / q) = 1 when p >= q: such a draft is always accepted",
                     equal=lambda _a, _b, ok=p_draft < q_draft: ok)
        valid = 0 <= token < target.shape[1]
        if valid:
            q_token = float(token == draft) if draft_probs is None else float(draft_probs[t, token])
            valid = float(target[t, token]) > q_token
        expect_equal(what, inputs, f"position {accepted}: a token with max(0, p - q) > 0", row,
                     "after a rejection, sample the residual max(0, p - q) (normalised): never the rejected "
                     "draft, never a token with p <= q", equal=lambda _a, _b, ok=valid: ok)
        tail = row[accepted + 1:]
    else:
        bonus = int(case["bonus_token_ids"][row_index])
        expect_equal(f"{what}: the token after {num_drafts} accepted drafts", inputs, bonus, row[accepted],
                     "when every draft is accepted, the row's bonus token follows them; if the draft was in fact "
                     "rejected, the token you emitted in its place repeated it: after a rejection, sample the "
                     "residual max(0, p - q), which never gives the rejected draft")
        tail = row[accepted + 1:]
    expect_equal(f"{what}: the padding after the last token", inputs, [PLACEHOLDER_TOKEN_ID] * len(tail), tail,
                 "everything after the recovered or bonus token is -1 (PLACEHOLDER_TOKEN_ID)")


def _slice_row(case: dict[str, Any], row: int) -> dict[str, Any]:
    start = sum(case["num_draft_tokens"][:row])
    end = start + case["num_draft_tokens"][row]
    return {
        "draft_token_ids": case["draft_token_ids"][start:end], "num_draft_tokens": [case["num_draft_tokens"][row]],
        "draft_probs": None if case["draft_probs"] is None else case["draft_probs"][start:end],
        "target_probs": case["target_probs"][start:end], "bonus_token_ids": case["bonus_token_ids"][row:row + 1],
        "is_greedy": case["is_greedy"][row:row + 1], "seeds": {0: case["seeds"][row]} if row in case["seeds"] else {},
    }


def _chi_square(counts: list[int], probs: list[float]) -> float:
    total = sum(counts)
    return sum((c - total * q) ** 2 / (total * q) for c, q in zip(counts, probs) if q > 0)


def _expect_distribution(what: str, inputs: dict[str, Any], tokens: list[int], probs: list[float], hint: str) -> None:
    __tracebackhide__ = True
    counts = [0] * len(probs)
    outside = [t for t in tokens if not 0 <= t < len(probs)]
    for token in tokens:
        if 0 <= token < len(probs):
            counts[token] += 1
    statistic = _chi_square(counts, probs)
    impossible = sum(count for count, q in zip(counts, probs) if q == 0) + len(outside)
    ok = statistic < CHI_SQUARE_BOUND and impossible == 0
    expect_equal(what, inputs,
                 f"counts close to {[round(len(tokens) * q) for q in probs]} (chi-square < {CHI_SQUARE_BOUND:.0f}, "
                 "none where p = 0)",
                 f"counts {counts}{f' and {len(outside)} out of range' if outside else ''}, "
                 f"chi-square {statistic:.1f}", hint, equal=lambda _a, _b, ok=ok: ok)


# The distribution test: 5 tokens, 2 drafts per row. p = the target's distributions at the two positions, q
# = the draft model's (q2 is the same whatever draft 1 was: a draft model that ignores its context is
# still a valid draft model). Sum of min(p, q) = 0.6 at both positions.
DIST_P = [[0.35, 0.25, 0.20, 0.15, 0.05], [0.00, 0.50, 0.10, 0.30, 0.10]]
DIST_Q = [[0.10, 0.40, 0.30, 0.00, 0.20], [0.20, 0.20, 0.20, 0.20, 0.20]]
DIST_BONUS = [0.10, 0.20, 0.30, 0.20, 0.20]


def _distribution_batch(num_rows: int, with_draft_probs: bool, seed: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    p, q = torch.tensor(DIST_P), torch.tensor(DIST_Q)
    if with_draft_probs:
        drafts = torch.stack([torch.multinomial(q[pos], num_rows, replacement=True, generator=generator)
                              for pos in range(2)], dim=1)
    else:   # n-gram style: fixed drafts, certain (q one-hot): draft 1 cycles over tokens 0..4, draft 2 is 1
        drafts = torch.stack([torch.arange(num_rows) % 5, torch.ones(num_rows, dtype=torch.int64)], dim=1)
    bonus = torch.multinomial(torch.tensor(DIST_BONUS), num_rows, replacement=True, generator=generator)
    return {
        "draft_token_ids": drafts.reshape(-1).to(torch.int64), "num_draft_tokens": [2] * num_rows,
        "draft_probs": q.repeat(num_rows, 1) if with_draft_probs else None, "target_probs": p.repeat(num_rows, 1),
        "bonus_token_ids": bonus, "is_greedy": torch.zeros(num_rows, dtype=torch.bool), "seeds": {},
    }


def _check_distributions(rejection_sample: Callable) -> int:
    __tracebackhide__ = True
    num_cases = 0
    for label, with_q, num_rows, seeded in (("draft-model drafts (q given)", True, 3000, False),
                                            ("n-gram drafts (q = None)", False, 3000, False),
                                            ("draft-model drafts, every row seeded", True, 1000, True)):
        case = _distribution_batch(num_rows, with_q, seed=7)
        generators = _generators({row: 10_000 + row for row in range(num_rows)}) if seeded else {}
        inputs = {"rows": num_rows, "drafts": label, "p (per position)": DIST_P,
                  "q (per position)": DIST_Q if with_q else "one-hot at the draft"}
        torch.manual_seed(0)
        with calling("rejection_sample", inputs, hint=REJECTION_HINT):
            got = _call(rejection_sample, case, generators)
        rows = _rows("rejection_sample", got, inputs, (num_rows, 3))
        drafts = case["draft_token_ids"].view(num_rows, 2).tolist()
        _expect_distribution(
            f"rejection_sample: the first token out, {label}", inputs, [row[0] for row in rows], DIST_P[0],
            "the first token out must be distributed as p whatever q is: accept the draft with probability "
            "min(1, p/q), else sample max(0, p - q) normalised (with q one-hot when draft_probs is None)")
        second = [row[1] for row, draft in zip(rows, drafts) if row[0] == draft[0]]
        _expect_distribution(
            f"rejection_sample: the second token out where draft 1 was accepted, {label}", inputs, second,
            DIST_P[1], "after an accepted draft, the next position is judged against its own p and q, the same way")
        bonus = case["bonus_token_ids"].tolist()
        wrong_bonus = [index for index, (row, draft) in enumerate(zip(rows, drafts))
                       if row[:2] == draft and row[2] != bonus[index]]
        expect_equal(f"rejection_sample: rows with both drafts accepted, {label}", inputs, "the bonus token third",
                     f"{len(wrong_bonus)} rows without it (first: row {wrong_bonus[:1]})",
                     "after k accepted drafts comes the row's bonus token", equal=lambda _a, _b, ok=not wrong_bonus: ok)
        num_cases += 1
    return num_cases


def check_rejection_sample(rejection_sample: Callable, seeds: Iterable[int] = range(20)) -> None:
    reference = _reference("rejection_sample")
    num_cases = 0
    cases = [_worked_rejection_case()] + [_rejection_case(seed) for seed in seeds]
    for case in cases:
        inputs = _case_inputs(case)
        batch_size = len(case["num_draft_tokens"])
        shape = (batch_size, max(case["num_draft_tokens"], default=0) + 1)
        expected = [[int(t) for t in row] for row in _call(reference, case, _generators(case["seeds"])).tolist()]
        runs = []
        for call in ("first call", "second call, same generator seeds"):
            with calling("rejection_sample", inputs, expected=expected, hint=REJECTION_HINT):
                got = _call(rejection_sample, case, _generators(case["seeds"]))
            rows = _rows("rejection_sample", got, inputs, shape)
            runs.append(rows)
            for index, greedy in enumerate(case["is_greedy"].tolist()):
                if greedy:
                    expect_equal(f"rejection_sample(...) row {index} (a greedy row, {call})", inputs, expected[index],
                                 rows[index], "a greedy row accepts a draft iff it is the argmax of target_probs, "
                                 "emits the argmax at the first mismatch, the bonus token if none; then -1")
                else:
                    _check_row_shape(index, rows[index], case, inputs)
        for index in case["seeds"]:
            expect_equal(f"rejection_sample(...) seeded row {index}: two calls with the same seed", inputs,
                         runs[0][index], runs[1][index],
                         "a seeded row draws every random number from generators[row]: same seed, same tokens")
            alone = _slice_row(case, index)
            with calling("rejection_sample", _case_inputs(alone), hint=REJECTION_HINT):
                got_alone = _call(rejection_sample, alone, _generators(alone["seeds"]))
            alone_rows = _rows("rejection_sample", got_alone, _case_inputs(alone),
                               (1, alone["num_draft_tokens"][0] + 1))
            width = len(alone_rows[0])
            expect_equal(f"rejection_sample(...) seeded row {index}, alone vs in the batch", inputs,
                         runs[0][index][:width], alone_rows[0],
                         "a seeded row must draw from its own generator only, whatever else is in the batch")
        num_cases += 1
    num_cases += _check_distributions(rejection_sample)
    passed("check_rejection_sample", num_cases)


# ---------------------------------------------------------------- rollback_spec_tokens
ROLLBACK_HINT = ("the step generated g tokens: g - 1 accepted drafts and one recovered or bonus token; the "
                 "k - (g - 1) rejected drafts had been counted in num_computed_tokens at schedule time, so "
                 "subtract them; return (the new num_computed_tokens, the number of accepted drafts)")


def check_rollback_spec_tokens(rollback_spec_tokens: Callable, seeds: Iterable[int] = range(20)) -> None:
    reference = _reference("rollback_spec_tokens")
    cases = [(14, 3, 2), (14, 3, 4), (14, 3, 1), (9, 1, 1), (9, 1, 2), (40, 5, 3)]
    for seed in seeds:
        rng = random.Random(seed)
        k = rng.randint(1, 8)
        cases.append((rng.randint(k + 2, 200), k, rng.randint(1, k + 1)))
    for num_computed, k, generated in cases:
        inputs = {"num_computed_tokens": num_computed, "num_scheduled_spec_tokens": k, "num_generated_tokens": generated}
        expected = tuple(int(v) for v in reference(num_computed, k, generated))
        with calling("rollback_spec_tokens", inputs, expected=expected, hint=ROLLBACK_HINT):
            got = rollback_spec_tokens(num_computed, k, generated)
        got = tuple(int(v) for v in got) if isinstance(got, (tuple, list)) else got
        expect_equal("rollback_spec_tokens(...)", inputs, expected, got, ROLLBACK_HINT)
    passed("check_rollback_spec_tokens", len(cases))


PHASE = Phase("12_spec_decode", (
    Exercise("propose_ngram", check_propose_ngram, points=2, grade_id="test-propose-ngram", part="propose_ngram"),
    Exercise("compute_residual_probs", check_compute_residual_probs, points=2, grade_id="test-residual-probs",
             part="compute_residual_probs"),
    Exercise("rejection_sample", check_rejection_sample, points=4, grade_id="test-rejection-sample",
             part="rejection_sample"),
    Exercise("rollback_spec_tokens", check_rollback_spec_tokens, points=2, grade_id="test-rollback-spec-tokens",
             part="rollback_spec_tokens"),
))
