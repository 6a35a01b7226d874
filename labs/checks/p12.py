"""Checks for phase 12 (speculative decoding), against the engine's reference parts (mini/roles.py).

    check_propose_ngram(propose_ngram)                    vs mini.spec_decode.ngram_proposer.propose_ngram
    check_compute_residual_probs(compute_residual_probs)  vs mini.sample.rejection_sampler.compute_residual_probs
    check_rejection_sample(rejection_sample)              vs mini.sample.rejection_sampler.rejection_sample
    check_prepare_eagle_inputs(prepare_eagle_inputs)      vs mini.spec_decode.eagle.prepare_eagle_inputs
    check_compute_draft_slots(compute_draft_slots)        vs mini.spec_decode.model_proposer.compute_draft_slots

The first case of each is the phase's worked example. The rejection sampler is random: greedy rows must
match the reference exactly; random rows must be well formed (accepted drafts, then one recovered or bonus
token, then -1), reproducible with the same generators, independent of the other rows of the batch when
seeded, and, over thousands of rows, the first token out must follow the target distribution p (a
chi-square bound), whatever the draft distribution q was.

vLLM counterparts: `propose_ngram` is `_find_longest_matched_ngram_and_propose_tokens`
(vllm/v1/spec_decode/ngram_proposer.py; numba-jitted, but plain Python inside), which passes this check
(tests/course/vllm_answers/test_p12.py). vLLM's rejection sampler exists only as Triton kernels
(vllm/v1/sample/rejection_sampler.py: `rejection_greedy_sample_kernel`, `rejection_random_sample_kernel`,
`sample_recovered_tokens_kernel`, driven by `rejection_sample`); run under Triton's interpreter, it passes
`check_rejection_sample`. `compute_residual_probs` has no counterpart (the kernel never normalises the
residual). `prepare_eagle_inputs` is what `SpecDecodeBaseProposer.prepare_inputs` (drop the rejected drafts)
and `set_inputs_first_pass` (shift the ids, the next token last) do together
(vllm/v1/spec_decode/llm_base_proposer.py): vLLM's path with `disable_padded_drafter_batch=True`, mini's only
one; vLLM's default (`prepare_inputs_padded`) keeps the rejected rows as padding, a different output the
engine's first pass does not take. `compute_draft_slots` is `eagle_step_slot_mapping_metadata_kernel`
(vllm/v1/spec_decode/utils.py) over the k - 1 further passes. The check accepts two rules for the passes after
one past max_model_len: mini's (padded too) and vLLM's (its loop feeds the kernel its own clamped output, so the
positions restart at 1, 2, ...); neither engine uses those passes. The rollback of the rejected drafts (the
scheduler's `rollback_spec_tokens`) is no exercise of its own: `prepare_eagle_inputs` counts the rejected
drafts the same way.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

import torch

from labs.checks.common import calling, expect_equal, passed
from labs.checks.grading import graded
from labs.manifest import Exercise, Phase
from mini import roles

PLACEHOLDER_TOKEN_ID = -1
PADDING_SLOT_ID = -1       # mini.spec_decode.model_proposer's (and vLLM's) "write this K/V nowhere"
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


@graded
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
        as_ints = _int_list(got)
        got = as_ints if as_ints is not None else got
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


def _residual_slips(target: torch.Tensor, draft: torch.Tensor | None, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """What a few plausible slips return on this case, to name the one a wrong answer made (float64)."""
    p = target.to(torch.float64)
    rows = torch.arange(p.shape[0])
    one_hot = torch.zeros_like(p)
    one_hot[rows, tokens] = 1.0
    q = one_hot if draft is None else draft.to(torch.float64)
    residual = (p - q).clamp_min(0.0)

    def normalised(values: torch.Tensor) -> torch.Tensor:
        return values / values.sum(dim=-1, keepdim=True)

    only_at_draft = p.clone()
    only_at_draft[rows, tokens] = (p[rows, tokens] - q[rows, tokens]).clamp_min(0.0)
    slips = {
        "the rows were not normalised (divide each by its own sum)": residual,
        "the whole tensor was normalised at once: each ROW must sum to 1": residual / residual.sum(),
        "p - q was not clamped at 0: a token the proposer over-rated gets no probability, never a negative one":
            normalised(p - q),
        "q was subtracted at the draft token only: q is a whole distribution, subtract it at every token":
            normalised(only_at_draft),
    }
    if draft is None:
        slips["draft_probs None was read as q = 0 (the residual came out as p): the guess was certain, so q is "
              "one-hot at draft_token_ids[row]"] = normalised(p)
    else:
        slips["draft_probs was ignored (q taken one-hot at the draft): when it is given, it is q"] = normalised(
            (p - one_hot).clamp_min(0.0))
    return slips


@graded
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
        got_float = got.detach().to(torch.float64)
        close = torch.isclose(got_float, expected.to(torch.float64), atol=1e-5, rtol=1e-4)
        if not bool(close.all()):
            row, token = (int(i) for i in (~close).nonzero()[0])
            slips = [name for name, value in _residual_slips(target, draft, tokens).items()
                     if value.shape == got_float.shape and bool(torch.allclose(
                         got_float, value, atol=1e-5, rtol=1e-4, equal_nan=True))]
            slip = "".join(f"{'Either ' if len(slips) > 1 and not i else 'or ' if i else ''}{name}. "
                           for i, name in enumerate(slips))
            expect_equal(f"compute_residual_probs(...) row {row}, token {token} (expected "
                         f"{float(expected[row, token]):.4f}, got {float(got_float[row, token]):.4f}), the first wrong "
                         "entry", inputs, _short_tensor(expected), _short_tensor(got_float), slip + RESIDUAL_HINT,
                         equal=lambda _a, _b: False)
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
        t, draft = start + num_drafts - 1, drafts[-1] if drafts else None
        rejectable = draft is not None and float(target[t, draft]) < (
            1.0 if draft_probs is None else float(draft_probs[t, draft]))
        expect_equal(f"{what}: the token after {num_drafts} accepted drafts", inputs, bonus, row[accepted],
                     RESIDUAL_NOT_DRAFT_HINT if rejectable and row[accepted] == PLACEHOLDER_TOKEN_ID
                     else "when every draft is accepted, the row's bonus token follows them")
        tail = row[accepted + 1:]
    expect_equal(f"{what}: the padding after the last token", inputs, [PLACEHOLDER_TOKEN_ID] * len(tail), tail,
                 "everything after the recovered or bonus token is -1 (PLACEHOLDER_TOKEN_ID)")


RESIDUAL_NOT_DRAFT_HINT = (
    "the row ends with its last draft and no token after it: either that draft was accepted and the bonus token "
    "is missing, or it was REJECTED and the token you emitted in its place repeated it. After a rejection, "
    "sample the residual max(0, p - q) normalised: it gives the rejected draft probability 0")


def _check_recovered_from_residual(rejection_sample: Callable) -> int:
    """One draft per row, n-gram style (q one-hot), p(draft) = 0.5: accepted half the time (then [d, bonus]),
    rejected otherwise (then [r, -1] with r != d, since the residual is p without d). A row [d, -1] next to
    rows [d, bonus] means the bonus logic works and the recovered token repeated the draft."""
    __tracebackhide__ = True
    num_rows = 400
    target = torch.tensor([[0.5, 0.2, 0.2, 0.1]]).repeat(num_rows, 1)
    case = {"draft_token_ids": torch.zeros(num_rows, dtype=torch.int64), "num_draft_tokens": [1] * num_rows,
            "draft_probs": None, "target_probs": target, "bonus_token_ids": torch.full((num_rows,), 3),
            "is_greedy": torch.zeros(num_rows, dtype=torch.bool), "seeds": {}}
    inputs = {"rows": num_rows, "each row": "draft [0] with q one-hot (draft_probs None), p = [0.5, 0.2, 0.2, 0.1], "
              "bonus 3, random (not greedy)"}
    torch.manual_seed(0)
    with calling("rejection_sample", inputs, hint=REJECTION_HINT):
        got = _call(rejection_sample, case, {})
    rows = _rows("rejection_sample", got, inputs, (num_rows, 2))
    with_bonus = sum(row == [0, 3] for row in rows)
    repeated = [index for index, row in enumerate(rows) if row == [0, PLACEHOLDER_TOKEN_ID]]
    if with_bonus and repeated:
        expect_equal(f"rejection_sample: row {repeated[0]} (and {len(repeated) - 1} more) emitted the rejected "
                     "draft 0 as its recovered token", inputs,
                     "accepted rows [0, 3] (draft, bonus); rejected rows [r, -1] with r in {1, 2, 3}",
                     f"{with_bonus} rows [0, 3] and {len(repeated)} rows [0, -1]",
                     "after a rejection, sample the residual max(0, p - q) normalised (q one-hot at the draft: p "
                     "without the draft's own probability), never p itself: the residual gives the rejected draft "
                     "probability 0", equal=lambda _a, _b: False)
    return 1


def _greedy_story(case: dict[str, Any], row: int) -> str:
    """What a greedy row should do, told draft by draft: which drafts the argmax keeps, what comes after."""
    start = sum(case["num_draft_tokens"][:row])
    drafts = case["draft_token_ids"][start:start + case["num_draft_tokens"][row]].tolist()
    steps = []
    for offset, draft in enumerate(drafts):
        best = int(case["target_probs"][start + offset].argmax())
        if draft != best:
            steps.append(f"draft {draft} rejected (argmax {best}) -> the recovered token {best}, then -1")
            break
        steps.append(f"draft {draft} accepted (argmax {best})")
    else:
        steps.append(f"{'all drafts accepted' if drafts else 'no drafts'} -> the bonus token "
                     f"{int(case['bonus_token_ids'][row])}, then -1")
    return "; ".join(steps)


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
    return sum((c - total * q) ** 2 / (total * q) for c, q in zip(counts, probs, strict=False) if q > 0)


def _expect_distribution(what: str, inputs: dict[str, Any], tokens: list[int], probs: list[float], hint: str) -> None:
    __tracebackhide__ = True
    counts = [0] * len(probs)
    outside = [t for t in tokens if not 0 <= t < len(probs)]
    for token in tokens:
        if 0 <= token < len(probs):
            counts[token] += 1
    statistic = _chi_square(counts, probs)
    impossible = sum(count for count, q in zip(counts, probs, strict=False) if q == 0) + len(outside)
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
        second = [row[1] for row, draft in zip(rows, drafts, strict=False) if row[0] == draft[0]]
        _expect_distribution(
            f"rejection_sample: the second token out where draft 1 was accepted, {label}", inputs, second,
            DIST_P[1], "after an accepted draft, the next position is judged against its own p and q, the same way")
        bonus = case["bonus_token_ids"].tolist()
        wrong_bonus = [index for index, (row, draft) in enumerate(zip(rows, drafts, strict=False))
                       if row[:2] == draft and row[2] != bonus[index]]
        expect_equal(f"rejection_sample: rows with both drafts accepted, {label}", inputs, "the bonus token third",
                     f"{len(wrong_bonus)} rows without it (first: row {wrong_bonus[:1]})",
                     "after k accepted drafts comes the row's bonus token", equal=lambda _a, _b, ok=not wrong_bonus: ok)
        num_cases += 1
    return num_cases


@graded
def check_rejection_sample(rejection_sample: Callable, seeds: Iterable[int] = range(20)) -> None:
    reference = _reference("rejection_sample")
    num_cases = 0
    cases = [_worked_rejection_case()] + [_rejection_case(seed) for seed in seeds]
    for case_number, case in enumerate(cases):
        if case_number == 1:    # after the greedy worked example, before any random row
            num_cases += _check_recovered_from_residual(rejection_sample)
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
                                 "emits the argmax at the first mismatch, the bonus token if none; then -1. Here: "
                                 + _greedy_story(case, index))
                else:
                    _check_row_shape(index, rows[index], case, inputs)
        for index in case["seeds"]:
            expect_equal(f"rejection_sample(...) seeded row {index}: two calls with the same seed", inputs,
                         runs[0][index], runs[1][index],
                         "a seeded row draws every random number from its own generator, generators[row]: same seed, "
                         "same tokens")
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


# ---------------------------------------------------------------- prepare_eagle_inputs
EAGLE_SHIFT_HINT = ("the head reads, at kept row r, the id of the NEXT kept row of the same request (the ids shift "
                    "left by one inside each request); a request's last input reads next_token_ids[b] instead")
EAGLE_KEEP_HINT = ("keep each request's rows in order, minus its rejected drafts (its last rows): a request that "
                   "verified d > 0 drafts and emitted s tokens accepted s - 1 of them; a request without drafts "
                   "rejects nothing, also mid-prefill where it emitted s = 0 tokens")
EAGLE_LAST_HINT = ("last_indices[b] counts among the head's N inputs (the kept rows, packed), not among the "
                   "target's T rows")
EAGLE_OUTPUTS = ("input_ids", "positions", "hidden_indices", "last_indices")
EAGLE_HIDDEN_HINT = ("hidden_indices[i] is a row number among the target's T rows (where the head reads the target's "
                     "hidden state), not a count of the kept rows: " + EAGLE_KEEP_HINT)
EAGLE_POSITIONS_HINT = ("positions[i] is the position of the target row hidden_indices[i] itself: only the ids move "
                        "one place (the hidden states and positions stay where they were)")
EAGLE_HINTS = {"input_ids": EAGLE_SHIFT_HINT, "positions": EAGLE_POSITIONS_HINT, "hidden_indices": EAGLE_HIDDEN_HINT,
               "last_indices": EAGLE_LAST_HINT}


def _worked_eagle_case() -> dict[str, Any]:
    """The phase's worked example: request 0 decodes without drafts, request 1 verified drafts [22, 23] and
    emitted [22, 25] (22 accepted, 23 rejected, 25 recovered), request 2 is mid-prefill (next prompt token 33)."""
    return {"target_token_ids": [11, 21, 22, 23, 31, 32], "target_positions": [7, 4, 5, 6, 0, 1],
            "query_start_loc": [0, 1, 4, 6], "num_draft_tokens": [0, 2, 0], "num_sampled_tokens": [1, 2, 0],
            "next_token_ids": [12, 25, 33]}


def _random_eagle_case(rng: random.Random) -> dict[str, Any]:
    """Requests of four kinds: a plain decode, a decode that verified d drafts, a prefill chunk (mid-prompt,
    emits nothing) and a last prefill chunk (emits one token)."""
    ids, positions, starts, drafts, sampled, next_ids = [], [], [0], [], [], []
    for _ in range(rng.randint(1, 5)):
        kind = rng.choice(("decode", "spec", "spec", "chunk", "last_chunk"))
        computed = rng.randint(0, 40)
        if kind == "decode":
            count, d, s = 1, 0, 1
        elif kind == "spec":
            d = rng.randint(1, 5)
            count, s = d + 1, rng.randint(1, d + 1)
        else:
            count, d, s = rng.randint(1, 6), 0, (0 if kind == "chunk" else 1)
        ids += [rng.randrange(100, 1000) for _ in range(count)]
        positions += list(range(computed, computed + count))
        starts.append(starts[-1] + count)
        drafts.append(d)
        sampled.append(s)
        next_ids.append(rng.randrange(100, 1000))
    return {"target_token_ids": ids, "target_positions": positions, "query_start_loc": starts,
            "num_draft_tokens": drafts, "num_sampled_tokens": sampled, "next_token_ids": next_ids}


def _eagle_call(function: Callable, case: dict[str, Any]) -> Any:
    return function(torch.tensor(case["target_token_ids"], dtype=torch.int64),
                    torch.tensor(case["target_positions"], dtype=torch.int64),
                    torch.tensor(case["query_start_loc"], dtype=torch.int32), list(case["num_draft_tokens"]),
                    list(case["num_sampled_tokens"]), torch.tensor(case["next_token_ids"], dtype=torch.int64))


def _int_list(value: Any) -> list[int] | None:
    """`value` (a 1-D tensor, array or list) as a list of ints; None when it is not one."""
    values = _as_list(value)
    if not isinstance(values, list):
        return None
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError):
        return None


def _first_difference(expected: list, got: list) -> int:
    for index, (want, have) in enumerate(zip(expected, got, strict=False)):
        if want != have:
            return index
    return min(len(expected), len(got))


def _window(values: list, index: int, radius: int = 3) -> str:
    lo = max(0, index - radius)
    shown = ", ".join(f"[{i}]={values[i]}" for i in range(lo, min(len(values), index + radius + 1)))
    return ("... " if lo else "") + shown + (" ..." if index + radius + 1 < len(values) else "")


def _owner_of_kept_row(case_expected_last: list[int], index: int) -> int:
    for request, last in enumerate(case_expected_last):
        if index <= last:
            return request
    return len(case_expected_last) - 1


@graded
def check_prepare_eagle_inputs(prepare_eagle_inputs: Callable, seeds: Iterable[int] = range(30)) -> None:
    reference = _reference("prepare_eagle_inputs")
    cases = [_worked_eagle_case()]
    for seed in seeds:
        rng = random.Random(seed)
        cases += [_random_eagle_case(rng) for _ in range(2)]
    for case in cases:
        expected = [_as_list(value) for value in _eagle_call(reference, case)]
        inputs = dict(case)
        with calling("prepare_eagle_inputs", inputs, expected=dict(zip(EAGLE_OUTPUTS, expected, strict=False)),
                     hint=EAGLE_SHIFT_HINT):
            got = _eagle_call(prepare_eagle_inputs, case)
        if not isinstance(got, (tuple, list)) or len(got) != 4:
            expect_equal("prepare_eagle_inputs(...)", inputs, "a tuple of 4 int64 tensors (input_ids, positions, "
                         "hidden_indices, last_indices)", type(got).__name__, EAGLE_SHIFT_HINT)
        got_lists = [_int_list(value) for value in got]
        for name, values, value in zip(EAGLE_OUTPUTS, got_lists, got, strict=False):
            if values is None:
                expect_equal(f"prepare_eagle_inputs(...): {name}", inputs, "a 1-D int64 tensor",
                             f"{type(value).__name__} {getattr(value, 'shape', '')}".strip(), EAGLE_SHIFT_HINT)
        # The kept rows first (they decide every other output), then the ids read there, then the rest.
        for name in ("hidden_indices", "positions", "input_ids", "last_indices"):
            want, have = expected[EAGLE_OUTPUTS.index(name)], got_lists[EAGLE_OUTPUTS.index(name)]
            if want == have:
                continue
            index = _first_difference(want, have)
            last = expected[3]
            where = (f"{name}[{index}] (request {_owner_of_kept_row(last, index)})" if name != "last_indices"
                     else f"last_indices[{index}] (request {index})")
            expect_equal(f"prepare_eagle_inputs(...): {where}, the first wrong entry", inputs,
                         f"{name} = {want}   (around it: {_window(want, index)})",
                         f"{name} = {have}   (around it: {_window(have, index)})", EAGLE_HINTS[name])
    passed("check_prepare_eagle_inputs", len(cases))


# ---------------------------------------------------------------- compute_draft_slots
DRAFT_SLOT_HINT = ("pass j (0-based) feeds the request's newest draft one position after the input before it (pass 0: "
                   "last_positions[b] + 1); its K/V goes to that position's slot, found through the request's row of "
                   "block_table as the target's slot mapping is (phase 02): block_table[b, position // block_size] * "
                   "block_size + position % block_size")
DRAFT_PAD_HINT = ("a position >= max_model_len has no slot: that pass gets position 0 and slot PADDING_SLOT_ID (-1). "
                  "The passes after it: mini's rule pads them too (their positions last + 1 + j are past the end as "
                  "well); vLLM's kernel chains its own clamped output, so they restart at position 1, 2, ... with "
                  "real slots. Either rule is accepted, for the whole table, not a mix of the two")
DRAFT_CLAMP_HINT = ("never read past the block table's last column: a block number past it is clamped to "
                    "block_table.shape[1] - 1, as vLLM's kernel does")
DRAFT_SHAPE_HINT = "one row per request, one column per further pass (num_steps), both int64"


def _worked_slots_case() -> dict[str, Any]:
    """block_size 4; request 0's last input at position 6, request 1's at 9; 3 more passes; max_model_len 12."""
    return {"last_positions": [6, 9], "block_table": [[3, 7, 4], [5, 2, 9]], "block_size": 4, "num_steps": 3,
            "max_model_len": 12}


def _random_slots_case(rng: random.Random) -> dict[str, Any]:
    block_size = rng.choice((1, 2, 4, 8, 16))
    batch, width = rng.randint(1, 5), rng.randint(1, 5)
    num_blocks = rng.randint(width + 1, 40)
    table = [[rng.randrange(1, num_blocks) for _ in range(width)] for _ in range(batch)]
    capacity = width * block_size
    num_steps = rng.randint(0, 5)
    last = [rng.randrange(0, capacity) for _ in range(batch)]
    # max_model_len: often within reach of the passes (padding), sometimes past the table (block clamp).
    max_model_len = rng.choice((capacity, capacity + block_size, max(last) + rng.randint(1, 4), 10**6))
    return {"last_positions": last, "block_table": table, "block_size": block_size, "num_steps": num_steps,
            "max_model_len": max_model_len}


def _slots_call(function: Callable, case: dict[str, Any]) -> Any:
    return function(torch.tensor(case["last_positions"], dtype=torch.int64),
                    torch.tensor(case["block_table"], dtype=torch.int32), case["block_size"], case["num_steps"],
                    case["max_model_len"])


def _chained_draft_slots(case: dict[str, Any]) -> tuple[list[list[int]], list[list[int]]]:
    """vLLM's rule: each pass steps one past the previous pass's CLAMPED position (its kernel's own output,
    fed back by `_update_positions_dependent_metadata`), so after a pass past max_model_len (position 0, no
    slot) the next ones restart at 1, 2, ... with real slots. Written here from the kernel's description."""
    block_size, max_model_len = case["block_size"], case["max_model_len"]
    positions, slots = [], []
    for last, row in zip(case["last_positions"], case["block_table"], strict=False):
        position, row_positions, row_slots = last, [], []
        for _ in range(case["num_steps"]):
            position += 1
            if position >= max_model_len:
                position, slot = 0, PADDING_SLOT_ID
            else:
                slot = row[min(position // block_size, len(row) - 1)] * block_size + position % block_size
            row_positions.append(position)
            row_slots.append(slot)
        positions.append(row_positions)
        slots.append(row_slots)
    return positions, slots


def _first_wrong_entry(want: list[list[int]], have: Any) -> tuple[int, int] | None:
    for b, row in enumerate(want):
        for j, value in enumerate(row):
            if have[b][j] != value:
                return b, j
    return None


def _as_int_table(value: Any, shape: list[int]) -> list[list[int]] | None:
    """`value` as a list of int rows of `shape`, or None when it is not a table of that shape."""
    try:
        table = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    if list(table.shape) != shape or table.is_floating_point() or table.is_complex():
        return None
    return [[int(v) for v in row] for row in table.reshape(shape).tolist()]


def _reach(want: list[list[list[int]]], tables: list[list[list[int]]]) -> tuple[int, int, int]:
    """How far `tables` (positions, slots) follow `want`: the first wrong entry, row-major, positions first."""
    for index, (want_table, have_table) in enumerate(zip(want, tables, strict=False)):
        wrong = _first_wrong_entry(want_table, have_table)
        if wrong is not None:
            return (wrong[0], wrong[1], -index)
    return (10**9, 0, 0)


@graded
def check_compute_draft_slots(compute_draft_slots: Callable, seeds: Iterable[int] = range(40)) -> None:
    reference = _reference("compute_draft_slots")
    cases = [_worked_slots_case()] + [_random_slots_case(random.Random(seed)) for seed in seeds]
    for case in cases:
        rules = {"mini's rule": [_as_list(value) for value in _slots_call(reference, case)],
                 "vLLM's chained rule": list(_chained_draft_slots(case))}
        inputs = dict(case)
        want_positions, want_slots = rules["mini's rule"]
        with calling("compute_draft_slots", inputs, expected={"positions": want_positions, "slots": want_slots},
                     hint="an index out of bounds? " + DRAFT_CLAMP_HINT):
            got = _slots_call(compute_draft_slots, case)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            expect_equal("compute_draft_slots(...)", inputs, "a tuple (positions, slot_mapping) of int64 "
                         "[B, num_steps] tensors", type(got).__name__, DRAFT_SHAPE_HINT)
        shape = [len(case["last_positions"]), case["num_steps"]]
        tables = []
        for name, value in zip(("positions", "slot_mapping"), got, strict=False):
            table = _as_int_table(value, shape)
            if table is None:
                try:
                    described = list(torch.as_tensor(value).shape), str(torch.as_tensor(value).dtype)
                except (TypeError, ValueError, RuntimeError):
                    described = type(value).__name__
                expect_equal(f"compute_draft_slots(...) {name}: shape and dtype", inputs, (shape, "an integer dtype"),
                             described, DRAFT_SHAPE_HINT)
            tables.append(table)
        if any(tables == want for want in rules.values()):
            continue
        # Neither rule: report against the one the answer follows further (the later first wrong entry; on a
        # tie, mini's rule).
        rule = max(rules, key=lambda name: _reach(rules[name], tables))
        for name, want, have in zip(("positions", "slot_mapping"), rules[rule], tables, strict=False):
            wrong = _first_wrong_entry(want, have)
            if wrong is None:
                continue
            b, j = wrong
            last = case["last_positions"][b]
            before = last + j if rule == "mini's rule" or j == 0 else rules[rule][0][b][j - 1]
            position = before + 1     # where this pass's draft goes before any clamping
            if position >= case["max_model_len"]:
                hint = DRAFT_PAD_HINT
            elif position // case["block_size"] >= len(case["block_table"][b]):
                hint = DRAFT_CLAMP_HINT
            else:
                hint = DRAFT_SLOT_HINT
            feed = (f"the draft fed right after last_positions[{b}] = {last}" if j == 0 else
                    f"the draft fed one position after pass {j - 1}'s, at {position}")
            expect_equal(f"compute_draft_slots(...) {name}[{b}][{j}] (request {b}, pass {j}: {feed}; "
                         f"max_model_len {case['max_model_len']}), the first wrong entry, compared with {rule}",
                         inputs, f"{name}[{b}] = {want[b]}", f"{name}[{b}] = {have[b]}", hint)
    passed("check_compute_draft_slots", len(cases))


# ---------------------------------------------------------------- "Plug it in" comparisons
def expect_same_outputs(label: str, prompts: list, expected: list[list[int]], got: list[list[int]]) -> None:
    """The plug's verdict: the first request and token where the learner's engine differs from the reference."""
    __tracebackhide__ = True
    for request, (want, have) in enumerate(zip(expected, got, strict=False)):
        if want != have:
            index = _first_difference(want, have)
            raise AssertionError(
                f"{label}: request {request} differs from the reference engine at output token {index}\n"
                f"  prompt:   {str(prompts[request])[:80]!r}\n  expected: {want}\n  got:      {have}\n"
                "  hint: greedy speculation must give exactly the tokens of plain decoding; check the rejection "
                "sampler's greedy rows (accept a draft iff it is the argmax) and the bonus token, then the checks "
                "of the functions plugged in")
    if len(expected) != len(got):
        raise AssertionError(f"{label}: expected {len(expected)} outputs, got {len(got)}")


def expect_same_drafting(label: str, expected: Any, got: Any) -> None:
    """Two engines' drafting counters (SpecDecodingStats): the same drafts, accepted at the same positions."""
    __tracebackhide__ = True
    fields = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")

    def counters(stats: Any) -> dict[str, Any]:   # SpecDecodingStats, or a recording's `engine_counters` dict
        return {name: _as_list(stats[name] if isinstance(stats, dict) else getattr(stats, name)) for name in fields}

    want, have = counters(expected), counters(got)
    if want != have:
        first = next(name for name in fields if want[name] != have[name])
        raise AssertionError(
            f"{label}: the drafter proposed differently from the reference drafter (first differing counter: "
            f"{first})\n  expected: {want}\n  got:      {have}\n  hint: the output tokens can still match "
            "(speculation never changes them), but wrong drafter inputs make worse guesses: run the checks of "
            "prepare_eagle_inputs and compute_draft_slots")


PHASE = Phase("12_spec_decode", (
    Exercise("propose_ngram", check_propose_ngram, points=2, grade_id="test-propose-ngram", part="propose_ngram"),
    Exercise("compute_residual_probs", check_compute_residual_probs, points=2, grade_id="test-residual-probs",
             part="compute_residual_probs",
             design="the recovered token's distribution after a rejection, derived from the requirement that every "
                    "emitted token follows p whatever q was (the notebook gives the acceptance rule, not the "
                    "residual)"),
    Exercise("rejection_sample", check_rejection_sample, points=5, grade_id="test-rejection-sample",
             part="rejection_sample"),
    Exercise("prepare_eagle_inputs", check_prepare_eagle_inputs, points=5, grade_id="test-prepare-eagle-inputs",
             part="prepare_eagle_inputs"),
    Exercise("compute_draft_slots", check_compute_draft_slots, points=3, grade_id="test-compute-draft-slots",
             part="compute_draft_slots"),
))
